"""Go-style output shared by the embedded nsqd and nsqlookupd: the version they claim, Go's
``%q`` and ``json.Marshal`` and ``time.Duration`` texts, and the HTTP API's reply helpers and
headers (``internal/http_api``'s RespondV1).

A leaf: it imports nothing of the embedded servers but the HTTP ``Response`` type.
"""

from __future__ import annotations

import json
from typing import Any

from ..http.server import Response

__all__ = [
    "VERSION",
    "JSON_CONTENT_TYPE",
    "NSQ_V1",
    "go_quote",
    "go_json",
    "duration_string",
    "v1_response",
    "v1_error",
]

#: The nsqd/nsqlookupd release the embedded servers follow (what /info and IDENTIFY report).
VERSION = "1.3.0"
#: Content-Type of every JSON reply.
JSON_CONTENT_TYPE = "application/json; charset=utf-8"
#: Value of the ``X-Nsq-Content-Type`` header on every API reply but ``/ping``.
NSQ_V1 = "nsq; version=1.0"


def go_quote(raw: bytes) -> str:
    """Go's ``%q`` of a string holding ``raw``."""
    escapes = {
        "\a": "\\a",
        "\b": "\\b",
        "\f": "\\f",
        "\n": "\\n",
        "\r": "\\r",
        "\t": "\\t",
        "\v": "\\v",
        '"': '\\"',
        "\\": "\\\\",
    }
    out = ['"']
    for ch in raw.decode("utf-8", "surrogateescape"):
        cp = ord(ch)
        if 0xDC80 <= cp <= 0xDCFF:  # an undecodable byte
            out.append(f"\\x{cp - 0xDC00:02x}")
        elif ch in escapes:
            out.append(escapes[ch])
        elif ch.isprintable():
            out.append(ch)
        elif cp < 0x80:
            out.append(f"\\x{cp:02x}")
        elif cp < 0x10000:
            out.append(f"\\u{cp:04x}")
        else:
            out.append(f"\\U{cp:08x}")
    out.append('"')
    return "".join(out)


def go_json(value: Any) -> bytes:
    """``json.Marshal`` output: compact, UTF-8, with Go's HTML-safe escapes."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if "<" in text or ">" in text or "&" in text or "\u2028" in text or "\u2029" in text:
        text = (
            text.replace("<", "\\u003c")
            .replace(">", "\\u003e")
            .replace("&", "\\u0026")
            .replace("\u2028", "\\u2028")
            .replace("\u2029", "\\u2029")
        )
    return text.encode("utf-8")


def v1_response(data: Any = None) -> Response:
    """nsqd's RespondV1 for a 200."""
    headers = {"X-Nsq-Content-Type": NSQ_V1}
    if data is None:
        body = b""
    elif isinstance(data, bytes):
        body = data
    elif isinstance(data, str):
        body = data.encode("utf-8")
    else:
        headers["Content-Type"] = JSON_CONTENT_TYPE
        body = go_json(data)
    return Response(200, body, headers)


def v1_error(status: int, text: str, extra: dict[str, str] | None = None) -> Response:
    """nsqd's RespondV1 for an error: ``{"message": text}``."""
    headers = {"Content-Type": JSON_CONTENT_TYPE, "X-Nsq-Content-Type": NSQ_V1}
    if extra:
        headers.update(extra)
    return Response(status, go_json({"message": text}), headers)


def duration_string(seconds: float) -> str:
    """Go's ``time.Duration.String()`` for a positive duration (``90.5`` -> ``"1m30.5s"``)."""
    ns = int(seconds * 1e9)
    if ns == 0:
        return "0s"
    if ns < 1000:
        return f"{ns}ns"
    if ns < 1_000_000:
        return _trim(f"{ns / 1e3:.3f}") + "µs"
    if ns < 1_000_000_000:
        return _trim(f"{ns / 1e6:.6f}") + "ms"
    hours, rem = divmod(ns, 3600 * 10**9)
    minutes, rem = divmod(rem, 60 * 10**9)
    secs = _trim(f"{rem / 1e9:.9f}") + "s"
    if hours:
        return f"{hours}h{minutes}m{secs}"
    if minutes:
        return f"{minutes}m{secs}"
    return secs


def _trim(text: str) -> str:
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text
