"""The HTTP the embedded servers share: a minimal asyncio HTTP/1.1 server (:mod:`.server`) and
the GET nsqd makes of auth servers and nsqlookupd (:mod:`.client`)."""
