"""The embedded nsqlookupd (1.3.0): the node (:mod:`.node`), the registration database
(:mod:`.db`), the TCP protocol nsqd nodes speak (:mod:`.tcp`) and the HTTP API
(:mod:`.http_api`)."""
