"""youzan's TCP protocol V2 without I/O (``nsqdserver/protocol_v2.go`` of youzan/nsq): the
classic :class:`~nsqclient.testing.nsqd.protocol_v2.ProtocolV2` with youzan's IDENTIFY fields
(``extend_support``, ``desired_tag``) and version, raw 16-byte ids in FIN/REQ/TOUCH (read past
any newline inside the id, as youzan's nsqd does), and the arguments of youzan's commands:
partitions, internal message ids, the size checks of PUB/MPUB and their _TRACE and _EXT
forms, JSON ext headers, and the 30-byte reply of a traced publish.

The cluster (who leads a partition, whether it takes writes) is the connection's to ask:
:class:`~.client.YouzanClientConn`.
"""

from __future__ import annotations

import json
import re
import struct
from typing import Any

from ..gostyle.text import go_quote
from ..nsqd.options import NSQDOptions
from ..nsqd.protocol_v2 import (
    IDENTIFY_FIELDS,
    FatalClientError,
    ProtocolV2,
    base10,
    ms_to_duration_ns,
)

__all__ = [
    "YouzanProtocolV2",
    "YOUZAN_VERSION",
    "EXT_VER_NONE",
    "EXT_VER_JSON",
    "BodyError",
    "traced_reply",
    "go_id",
    "go_params",
]

#: the youzan nsqd release the embedded youzan mode follows
YOUZAN_VERSION = "0.3.7-HA.1.13.0"

#: message extension versions (youzan's ``internal/ext``)
EXT_VER_NONE = 0
EXT_VER_JSON = 4

_I32 = struct.Struct(">i")
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_TRACED = struct.Struct(">2sQQQI")
_ATOI = re.compile(rb"[+-]?[0-9]+")
_TRACE_ID_KEY = "##trace_id"

#: one message of a publish: body, trace id, ext version, ext header
Item = tuple[bytes, int, int, bytes]


def traced_reply(internal_id: int, trace_id: int, offset: int, raw_size: int) -> bytes:
    """``OK[8B id][8B trace id][8B offset][4B raw size]``: the reply to a traced publish."""
    return _TRACED.pack(b"OK", internal_id, trace_id, offset, raw_size & 0xFFFFFFFF)


def _atoi(raw: bytes) -> int:
    """Go's ``strconv.Atoi``; ValueError with Go's text when it would fail."""
    quoted = go_quote(raw)
    if not _ATOI.fullmatch(raw):
        raise ValueError(f"strconv.Atoi: parsing {quoted}: invalid syntax")
    n = int(raw)
    if not -(2**63) <= n < 2**63:
        raise ValueError(f"strconv.Atoi: parsing {quoted}: value out of range")
    return n


def go_id(raw: bytes) -> str:
    """Go's ``%v`` of a ``[16]byte`` id (how youzan's FIN/REQ/TOUCH errors print it)."""
    return "[" + " ".join(str(b) for b in raw) + "]"


def go_params(params: list[bytes]) -> str:
    """Go's ``%v`` of ``[][]byte`` params (how youzan's "invalid command" prints them)."""
    return "[" + " ".join("[" + " ".join(str(b) for b in p) + "]" for p in params) + "]"


class BodyError(Exception):
    """A non-fatal error answered after a publish body was read (the body is consumed)."""

    def __init__(self, code: str, desc: str):
        super().__init__(code)
        self.body = (code + " " + desc).encode()


class YouzanProtocolV2(ProtocolV2):
    """One client connection of an embedded youzan nsqd, without I/O."""

    identify_fields = {**IDENTIFY_FIELDS, "extend_support": "bool", "desired_tag": "str"}
    raw_id_lines = True
    invalid_id_text = "Invalid Message ID"

    def __init__(self, opts: NSQDOptions):
        super().__init__(opts)
        #: the client said ``extend_support`` in IDENTIFY
        self.extend_support = False

    @property
    def version(self) -> str:
        return YOUZAN_VERSION

    def apply_identify(self, data: dict[str, Any]) -> None:
        super().apply_identify(data)
        self.extend_support = bool(data.get("extend_support"))

    # -- reading FIN/REQ/TOUCH with raw ids

    def _raw_id_command(self, pos: int) -> tuple[list[bytes], int] | None:
        buf = self.buf
        head = bytes(buf[pos : pos + 5])
        if head[:3] in (b"FIN", b"REQ"):
            nl = buf.find(b"\n", pos)
            if nl < 0:
                return [], -1
            if nl - pos < 20:  # a newline inside the id: the id is the 16 bytes after "FIN "
                nl = buf.find(b"\n", pos + 20)
                if nl < 0:
                    return [], -1
            line = bytes(buf[pos : nl + 1])
            params = [line[:3], line[4:20]]
            if head[:3] == b"REQ" and len(line) >= 22:
                params.append(line[21:-1])
            return params, nl
        if head == b"TOUCH":
            nl = buf.find(b"\n", pos)
            if nl < 0 and len(buf) - pos < 23:
                return [], -1
            if nl < 0 or nl - pos < 22:  # TOUCH reads exactly 23 bytes then
                nl = pos + 22
            line = bytes(buf[pos : nl + 1])
            return [line[:5], line[6:22]], nl
        return None

    # -- arguments

    @staticmethod
    def parse_partition(raw: bytes) -> int:
        """A partition parameter (E_BAD_PARTITION unless Go's Atoi reads it)."""
        try:
            return _atoi(raw)
        except ValueError as exc:
            raise FatalClientError(
                "E_BAD_PARTITION", f"topic partition is not valid: {exc}"
            ) from None

    def parse_internal_id(self, params: list[bytes], cmd: str) -> int:
        """The internal id (the first 8 bytes) of the raw id a FIN/REQ/TOUCH names."""
        return _U64.unpack_from(self.parse_msg_id(params, cmd))[0]

    def parse_youzan_req(self, params: list[bytes]) -> tuple[int, int]:
        """A REQ's internal id and delay in nanoseconds (clamped to 0-``max_req_timeout``)."""
        if len(params) < 3:
            raise FatalClientError("E_INVALID", "REQ insufficient number of params")
        internal_id = self.parse_internal_id(params, "REQ")
        n = base10(params[2])
        if n is None:
            raise FatalClientError(
                "E_INVALID",
                b"REQ could not parse timeout " + params[1] + b", " + params[2],
            )
        max_ns = int(round(self.opts.max_req_timeout * 1e9))
        return internal_id, max(0, min(ms_to_duration_ns(n), max_ns))

    def parse_pub_head(
        self, params: list[bytes], end: int, mpub: bool
    ) -> tuple[str, int, int] | None:
        """The first half of youzan's preparePub: the topic, the partition (-1: none given)
        and the body size of a PUB/MPUB (any form); None while the size has not arrived."""
        if len(params) < 2:
            raise FatalClientError("E_INVALID", "insufficient number of parameters")
        topic_name = params[1].decode("utf-8", "surrogateescape")
        partition = self.parse_partition(params[2]) if len(params) == 3 else -1
        size = self.read_size(end)
        if size is None:
            return None
        if size <= 0:
            raise FatalClientError("E_BAD_BODY", f"invalid body size {size}")
        limit = self.opts.max_body_size if mpub else self.opts.max_msg_size
        if size > limit:
            if mpub:
                raise FatalClientError("E_BAD_BODY", f"body too big {size} > {limit}")
            raise FatalClientError("E_BAD_MESSAGE", f"message too big {size} > {limit}")
        return topic_name, partition, size

    @staticmethod
    def check_pub_size(size: int, trace: bool, ext: bool) -> None:
        """A PUB body too small for its trace id or its ext header length is E_BAD_BODY."""
        if trace and size <= 8:
            raise FatalClientError("E_BAD_BODY", f"invalid body size {size} with trace id enabled")
        if ext and size <= 2:
            raise FatalClientError(
                "E_BAD_BODY", f"invalid body size {size} with ext json header enabled"
            )

    def sized_body(self, end: int, size: int) -> bytes | None:
        """The ``size`` bytes after the size prefix at ``end``; None while incomplete."""
        after = end + 4 + size
        if len(self.buf) < after:
            return None
        return bytes(self.buf[end + 4 : after])

    @staticmethod
    def parse_ext(raw: bytes) -> tuple[int | None, bool]:
        """The trace id in a JSON header (None without one) and whether it holds only
        internal ``##`` keys; BodyError when the header is refused."""
        try:
            header = json.loads(raw.decode("utf-8"))
            if not isinstance(header, dict):
                raise ValueError("the json header is not an object")
        except (ValueError, UnicodeDecodeError) as exc:
            raise BodyError("E_INVALID_JSON_HEADER", f"fail to parse json header:{exc}") from exc
        trace_id = None
        if _TRACE_ID_KEY in header:
            value = header[_TRACE_ID_KEY]
            if not isinstance(value, str):
                raise BodyError("INVALID_TRACE_ID", "passin trace id should be string")
            if not value.isdigit() or int(value) >= 2**64:
                raise BodyError("INVALID_TRACE_ID", "invalid trace id")
            trace_id = int(value)
        internal_only = all(k.startswith("##") or k == "zan_test" for k in header)
        return trace_id, internal_only

    def split_pub_body(self, body: bytes, size: int, trace: bool, ext: bool) -> tuple[Item, bool]:
        """A PUB body as the message it holds and whether its reply is traced: the trace id
        in front (PUB_TRACE) or the ext header in front (PUB_EXT)."""
        trace_id = 0
        traced = False
        ext_ver, ext_bytes = EXT_VER_NONE, b""
        if trace:
            trace_id = _U64.unpack_from(body)[0]
            body = body[8:]
            traced = True
        elif ext:
            jlen = _U16.unpack_from(body)[0]
            if size <= 2 + jlen:
                raise FatalClientError(
                    "E_BAD_BODY", f"invalid body size {size} in ext json header content length"
                )
            ext_bytes = body[2 : 2 + jlen]
            found, _internal_only = self.parse_ext(ext_bytes)
            if found is not None:
                trace_id, traced = found, True
            ext_ver = EXT_VER_JSON
            body = body[2 + jlen :]
        return (body, trace_id, ext_ver, ext_bytes), traced

    def parse_mpub_body(
        self, buf: bytes, trace: bool, ext: bool, topic: str, topic_ext: bool
    ) -> list[Item]:
        """youzan's readMPUBEXT over a complete MPUB body (to ``topic``, an extend topic
        or not)."""
        if len(buf) < 4:
            raise FatalClientError("E_BAD_BODY", "MPUB failed to read message count")
        count = _I32.unpack_from(buf)[0]
        max_messages = (self.opts.max_body_size - 4) // 5
        if count <= 0 or count > max_messages:
            raise FatalClientError("E_BAD_BODY", f"MPUB invalid message count {count}")
        pos = 4
        items = []
        max_msg = self.opts.max_msg_size
        for i in range(count):
            if len(buf) < pos + 4:
                raise FatalClientError(
                    "E_BAD_MESSAGE", f"MPUB failed to read message({i}) body size"
                )
            msize = _I32.unpack_from(buf, pos)[0]
            if msize <= 0:
                raise FatalClientError(
                    "E_BAD_MESSAGE", f"MPUB invalid message({i}) body size {msize}"
                )
            if msize > max_msg:
                raise FatalClientError("E_BAD_MESSAGE", f"MPUB message too big {msize} > {max_msg}")
            if len(buf) < pos + 4 + msize:
                raise FatalClientError("E_BAD_MESSAGE", "MPUB failed to read message body")
            body = buf[pos + 4 : pos + 4 + msize]
            pos += 4 + msize
            trace_id = 0
            ext_ver, ext_bytes = EXT_VER_NONE, b""
            if trace:
                if msize <= 8:
                    raise FatalClientError(
                        "E_BAD_MESSAGE", f"MPUB invalid message({i}) body size {msize} for tracing"
                    )
                trace_id = _U64.unpack_from(body)[0]
                body = body[8:]
            elif ext:
                jlen = _U16.unpack_from(body)[0] if msize >= 2 else 0
                if msize <= 2 + jlen:
                    raise FatalClientError(
                        "E_BAD_BODY", f"invalid body size {msize} in ext json header content length"
                    )
                ext_bytes = body[2 : 2 + jlen]
                if jlen > 0:
                    if not topic_ext:
                        raise BodyError(
                            "E_EXT_NOT_SUPPORT",
                            f"ext content not supported in topic {topic}",
                        )
                    found, _ = self.parse_ext(ext_bytes)
                    trace_id = found or 0
                    ext_ver = EXT_VER_JSON
                body = body[2 + jlen :]
            items.append((body, trace_id, ext_ver, ext_bytes))
        return items
