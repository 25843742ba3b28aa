"""youzan's partitioned NSQ (0.3.7-HA) on top of the classic embedded servers: the cluster's
metadata (:mod:`.meta`), a partition's message log and channels (:mod:`.queues`), the TCP
protocol without I/O (:mod:`.protocol`) and the client connection around it (:mod:`.client`),
the nsqd node (:mod:`.node`) and the nsqlookupd (:mod:`.lookupd`)."""
