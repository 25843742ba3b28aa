"""The HTTP the embedded servers share: a minimal asyncio HTTP/1.1 server (:mod:`.server`), the
replies of nsq's HTTP APIs (:mod:`.replies`) and the GET nsqd makes of auth servers and
nsqlookupd (:mod:`.client`)."""
