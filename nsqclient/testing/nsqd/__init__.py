"""The embedded nsqd (1.3.0): the node (:mod:`.node`), the TCP protocol V2 without I/O
(:mod:`.protocol_v2`) and one TCP client around it (:mod:`.client`), topics and channels
(:mod:`.queues`), the HTTP API (:mod:`.http_api`), its options (:mod:`.options`), the auth
server's answers (:mod:`.auth`), registering with nsqlookupd (:mod:`.lookup_peer`), the data
path (:mod:`.datapath`), message ids (:mod:`.ids`) and how bytes leave a connection
(:mod:`.writes`)."""
