"""Go-style output shared by the embedded nsqd and nsqlookupd: the version they claim, Go's
``%q`` and ``json.Marshal`` and ``time.Duration`` texts.

A leaf: it imports nothing of the embedded servers.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "VERSION",
    "go_quote",
    "go_json",
    "duration_string",
]

#: The nsqd/nsqlookupd release the embedded servers follow (what /info and IDENTIFY report).
VERSION = "1.3.0"


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
