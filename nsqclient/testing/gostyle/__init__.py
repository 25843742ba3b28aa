"""Go-style text shared by the embedded servers (:mod:`.text`: ``%q``, ``json.Marshal``,
``time.Duration``, the HTTP API's replies)."""
