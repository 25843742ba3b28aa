"""The embedded nsqd (1.3.0): the node (:mod:`.node`), one TCP client speaking protocol V2
(:mod:`.client`), topics and channels (:mod:`.queues`), the HTTP API (:mod:`.http_api`), its
options (:mod:`.options`), the auth server's answers (:mod:`.auth`), registering with
nsqlookupd (:mod:`.lookup_peer`), the data path (:mod:`.datapath`), message ids (:mod:`.ids`)
and how bytes leave a connection (:mod:`.writes`)."""
