"""A tiny asyncio HTTP GET for the embedded nsqd's own requests (auth servers, nsqlookupd's
``/channels``): one request per connection, ``Connection: close``, JSON answers."""

from __future__ import annotations

import asyncio
import json
import ssl
import urllib.parse
from typing import Any

__all__ = ["http_get_json", "dechunk"]


async def http_get_json(url: str, connect_timeout: float, timeout: float) -> Any:
    """GET ``url`` (timeouts in seconds) and decode its JSON body; ValueError unless 200."""
    parsed = urllib.parse.urlsplit(url)
    host = parsed.hostname or "127.0.0.1"
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    ctx = ssl.create_default_context() if parsed.scheme == "https" else None
    async with asyncio.timeout(connect_timeout):
        reader, writer = await asyncio.open_connection(host, port, ssl=ctx)
    try:
        target = parsed.path or "/"
        if parsed.query:
            target += "?" + parsed.query
        writer.write(
            (
                f"GET {target} HTTP/1.1\r\nHost: {parsed.netloc}\r\n"
                "Accept: application/vnd.nsq; version=1.0\r\nConnection: close\r\n\r\n"
            ).encode("latin-1")
        )
        async with asyncio.timeout(timeout):
            raw = await reader.read()
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split(b" ")
    status = int(status_line[1]) if len(status_line) > 1 else 0
    if b"transfer-encoding: chunked" in head.lower():
        body = dechunk(body)
    if status != 200:
        raise ValueError(f"got response {status} {body!r}")
    return json.loads(body)


def dechunk(data: bytes) -> bytes:
    """The body of an HTTP/1.1 chunked transfer encoding."""
    out = []
    pos = 0
    while True:
        nl = data.find(b"\r\n", pos)
        if nl < 0:
            break
        size = int(data[pos:nl].split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out.append(data[nl + 2 : nl + 2 + size])
        pos = nl + 2 + size + 2
    return b"".join(out)
