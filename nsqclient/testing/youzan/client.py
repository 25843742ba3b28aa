"""youzan's TCP protocol V2 on top of the classic one (``nsqdserver/protocol_v2.go`` of
youzan/nsq): partitions on SUB and PUB/MPUB, SUB_ORDERED, PUB_TRACE/MPUB_TRACE with their
30-byte reply, PUB_EXT/MPUB_EXT with JSON headers, raw 16-byte ids in messages and in
FIN/REQ/TOUCH (read past any newline inside the id, as youzan's nsqd does), no DPUB, and the
cluster's errors (E_FAILED_ON_NOT_LEADER, E_FAILED_ON_NOT_WRITABLE, E_TOPIC_NOT_EXIST,
E_SUB_ORDER_IS_MUST, E_BAD_PARTITION, E_SUB_EXTEND_FORBIDDON, ...) with youzan's texts and
fatal/non-fatal split.

IDENTIFY, AUTH, heartbeats, RDY, NOP, CLS, TLS and compression are the classic connection's.
The node is seen through :class:`YouzanServer`.
"""

from __future__ import annotations

import json
import logging
import re
import struct
from collections.abc import Callable
from typing import Any, Protocol

from ..gostyle.text import go_quote
from ..nsqd.client import (
    _BLOCKED,
    _IDENTIFY_FIELDS,
    _NEED_MORE,
    _OK_FRAME,
    ClientConn,
    FatalClientError,
    Server,
    _base10,
    _ms_to_duration_ns,
    _to_int64,
)
from ..nsqd.queues import STATE_SUBSCRIBED
from .meta import Coordinator, PartitionState
from .queues import EXT_VER_JSON, EXT_VER_NONE, YChannel

__all__ = ["YouzanClientConn", "YouzanServer", "YOUZAN_VERSION", "traced_reply"]

log = logging.getLogger("nsqclient.testing.youzan_protocol")

#: the youzan nsqd release the embedded youzan mode follows
YOUZAN_VERSION = "0.3.7-HA.1.13.0"

_I32 = struct.Struct(">i")
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_TRACED = struct.Struct(">2sQQQI")
_ATOI = re.compile(rb"[+-]?[0-9]+")
_TRACE_ID_KEY = "##trace_id"

NOT_LEADER = "E_FAILED_ON_NOT_LEADER"
NOT_WRITABLE = "E_FAILED_ON_NOT_WRITABLE"
TOPIC_NOT_EXIST = "E_TOPIC_NOT_EXIST"


class YouzanServer(Server, Protocol):
    """What a youzan connection needs of its node: the classic server plus the cluster."""

    coordinator: Coordinator
    index: int


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


def _go_id(raw: bytes) -> str:
    """Go's ``%v`` of a ``[16]byte`` id (how youzan's FIN/REQ/TOUCH errors print it)."""
    return "[" + " ".join(str(b) for b in raw) + "]"


class _BodyError(Exception):
    """A non-fatal error answered after a publish body was read (the body is consumed)."""

    def __init__(self, code: str, desc: str):
        super().__init__(code)
        self.body = (code + " " + desc).encode()


def _publish_handler(mpub: bool, trace: bool = False, ext: bool = False) -> Callable[..., int]:
    """The handler of one of youzan's six publish commands (PUB, MPUB and their _TRACE and
    _EXT forms)."""

    def handler(conn: YouzanClientConn, params: list[bytes], end: int) -> int:
        publish = conn._mpub if mpub else conn._pub
        return publish(params, end, trace=trace, ext=ext)

    return handler


class YouzanClientConn(ClientConn):
    """One TCP client of an embedded youzan nsqd."""

    read_deadline_factor = 3  # youzan's read deadline: three heartbeat intervals
    identify_fields = {**_IDENTIFY_FIELDS, "extend_support": "bool", "desired_tag": "str"}
    raw_id_lines = True
    nsqd: YouzanServer

    def __init__(self, nsqd: YouzanServer):
        super().__init__(nsqd)
        self.extend_support = False
        self.detail = False
        self.subscribed = False
        self.ychannel: YChannel | None = None

    @property
    def server_version(self) -> str:
        return YOUZAN_VERSION

    def _apply_identify(self, data: dict[str, Any]) -> None:
        super()._apply_identify(data)
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

    # -- lifecycle

    def _teardown(self) -> None:
        channel = self.ychannel
        super()._teardown()
        if channel is not None:
            self.ychannel = None
            channel.remove_client(self)

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.ychannel is not None:
            self.ychannel.schedule()

    # -- helpers

    def _partition_param(self, raw: bytes) -> int:
        try:
            return _atoi(raw)
        except ValueError as exc:
            raise FatalClientError(
                "E_BAD_PARTITION", f"topic partition is not valid: {exc}"
            ) from None

    def _partition_state(self, topic_name: str, partition: int) -> PartitionState:
        """The partition a SUB or PUB names (-1: this node's default one), as held on this
        node; E_TOPIC_NOT_EXIST when this node holds no copy of it."""
        coordinator = self.nsqd.coordinator
        if partition == -1:
            partition = coordinator.default_partition(self.nsqd.index, topic_name)
        state = coordinator.copy_on(self.nsqd.index, topic_name, partition)
        if state is None:
            raise FatalClientError(TOPIC_NOT_EXIST, "")
        return state

    def _is_leader(self, state: PartitionState) -> bool:
        return state.leader == self.nsqd.index

    # -- subscribing

    def _cmd_sub(self, params, end):
        return self._subscribe(params, end, ordered=False)

    def _cmd_sub_ordered(self, params, end):
        return self._subscribe(params, end, ordered=True)

    def _subscribe(self, params: list[bytes], end: int, ordered: bool) -> int:
        topic_name, channel_name = self._sub_names(params)
        partition = self._partition_param(params[3]) if len(params) == 4 else -1
        if not self._check_auth("SUB", topic_name, channel_name):
            return _BLOCKED  # an AUTH refresh is under way; run again
        state = self._partition_state(topic_name, partition)
        data = state.data
        if data.ordered and not ordered:
            raise FatalClientError(
                "E_SUB_ORDER_IS_MUST", "this topic is configured only allow ordered sub"
            )
        if data.ext and not self.extend_support:
            raise FatalClientError(
                "E_SUB_EXTEND_NEED",
                "this topic is extended and should identify as extend support.",
            )
        if not data.ext and self.extend_support:
            raise FatalClientError(
                "E_SUB_EXTEND_FORBIDDON",
                "this topic is not extended and should not identify as extend support.",
            )
        if not self._is_leader(state):
            raise FatalClientError(NOT_LEADER, "")
        channel, created = data.get_channel(channel_name)
        if ordered and self.sample_rate != 0:
            raise FatalClientError(
                "E_INVALID", "order consume is not allowed while sample rate is not 0"
            )
        if ordered:
            channel.ordered = True
        channel.add_client(self)
        self.state = STATE_SUBSCRIBED
        self.subscribed = True
        self.detail = ordered
        self.ychannel = channel
        log.debug(
            "client %s sub to topic %s-%d channel %s (ordered=%s, new=%s)",
            self.remote,
            topic_name,
            data.partition,
            channel_name,
            ordered,
            created,
        )
        self.write(_OK_FRAME)
        return end

    def _ysubscribed(self, cmd: str) -> YChannel:
        self._check_subscribed(cmd)
        channel = self.ychannel
        if channel is None:
            raise FatalClientError("E_INVALID", "No channel")
        return channel

    def _rdy_changed(self) -> None:
        if self.ychannel is not None:
            self.ychannel.schedule()

    def _cmd_cls(self, params, end):
        nxt = super()._cmd_cls(params, end)
        self.subscribed = False
        return nxt

    invalid_id_text = "Invalid Message ID"

    def _message_id(self, params: list[bytes], cmd: str) -> int:
        """The internal id (the first 8 bytes) of the raw id a FIN/REQ/TOUCH names."""
        return _U64.unpack_from(self._msg_id(params, cmd))[0]

    def _succeeded(self, cmd: str, raw_id: bytes, err: str | None) -> bool:
        """True when a FIN/REQ/TOUCH found no error; otherwise answer youzan's non-fatal
        ``E_<cmd>_FAILED`` and False."""
        if err is None:
            return True
        self.send_error(f"E_{cmd}_FAILED {cmd} {_go_id(raw_id)} failed {err}".encode())
        return False

    def _cmd_fin(self, params, end):
        self._check_subscribed("FIN")
        internal_id = self._message_id(params, "FIN")
        if _to_int64(internal_id) <= 0:
            raise FatalClientError("E_INVALID", self.invalid_id_text)
        channel = self._ysubscribed("FIN")
        state = self.nsqd.coordinator.partition(
            channel.partition.topic, channel.partition.partition
        )
        if state is None or not self._is_leader(state):
            raise FatalClientError(NOT_LEADER, "")
        if self._succeeded("FIN", params[1], channel.finish(self, internal_id)):
            self.finish_count += 1
        return end

    def _cmd_req(self, params, end):
        self._check_subscribed("REQ")
        if len(params) < 3:
            raise FatalClientError("E_INVALID", "REQ insufficient number of params")
        internal_id = self._message_id(params, "REQ")
        n = _base10(params[2])
        if n is None:
            raise FatalClientError(
                "E_INVALID",
                b"REQ could not parse timeout " + params[1] + b", " + params[2],
            )
        delay_ns = max(0, min(_ms_to_duration_ns(n), int(round(self.opts.max_req_timeout * 1e9))))
        channel = self._ysubscribed("REQ")
        if channel.ordered and delay_ns > 0:
            # youzan ignores a delayed REQ on an ordered channel (the message stays in flight)
            log.info("[%s] ignore delay for ordered channel %s", self.remote, channel.name)
            return end
        if self._succeeded("REQ", params[1], channel.requeue(self, internal_id, delay_ns / 1e9)):
            self.requeue_count += 1
        return end

    def _cmd_touch(self, params, end):
        self._check_subscribed("TOUCH")
        internal_id = self._message_id(params, "TOUCH")
        channel = self._ysubscribed("TOUCH")
        err = channel.touch(self, internal_id, self.msg_timeout, self.opts.max_msg_timeout)
        self._succeeded("TOUCH", params[1], err)
        return end

    # -- publishing

    def _prepare_pub(
        self, params: list[bytes], end: int, mpub: bool
    ) -> tuple[int, PartitionState] | int:
        """youzan's preparePub, then the PUB authorisation: (body size, partition), or
        _NEED_MORE while the size has not arrived, _BLOCKED while AUTH is refreshed."""
        if len(params) < 2:
            raise FatalClientError("E_INVALID", "insufficient number of parameters")
        topic_name = params[1].decode("utf-8", "surrogateescape")
        partition = self._partition_param(params[2]) if len(params) == 3 else -1
        given = partition
        size = self._read_size(end)
        if size is None:
            return _NEED_MORE
        if size <= 0:
            raise FatalClientError("E_BAD_BODY", f"invalid body size {size}")
        limit = self.opts.max_body_size if mpub else self.opts.max_msg_size
        if size > limit:
            if mpub:
                raise FatalClientError("E_BAD_BODY", f"body too big {size} > {limit}")
            raise FatalClientError("E_BAD_MESSAGE", f"message too big {size} > {limit}")
        state = self._partition_state(topic_name, partition)
        if given == -1 and state.data.ordered:
            raise FatalClientError(
                "E_BAD_PARTITION", "topic partition is not valid for multi partition: -1"
            )
        if not self._check_auth("PUB", state.data.topic, ""):
            return _BLOCKED
        return size, state

    def _body(self, end: int, size: int) -> bytes | None:
        """The ``size`` bytes after the size prefix at ``end``; None while incomplete."""
        after = end + 4 + size
        if len(self.buf) < after:
            return None
        return bytes(self.buf[end + 4 : after])

    def _published(self, topic_name: str, count: int, reply: bytes | None) -> None:
        """Count ``count`` messages published and answer OK (or the traced ``reply``)."""
        self.pub_counts[topic_name] = self.pub_counts.get(topic_name, 0) + count
        if reply is not None:
            self.send_response(reply)
        else:
            self.write(_OK_FRAME)

    def _parse_ext(self, raw: bytes) -> tuple[int | None, bool]:
        """The trace id in a JSON header (None without one) and whether it holds only
        internal ``##`` keys; _BodyError when the header is refused."""
        try:
            header = json.loads(raw.decode("utf-8"))
            if not isinstance(header, dict):
                raise ValueError("the json header is not an object")
        except (ValueError, UnicodeDecodeError) as exc:
            raise _BodyError("E_INVALID_JSON_HEADER", f"fail to parse json header:{exc}") from exc
        trace_id = None
        if _TRACE_ID_KEY in header:
            value = header[_TRACE_ID_KEY]
            if not isinstance(value, str):
                raise _BodyError("INVALID_TRACE_ID", "passin trace id should be string")
            if not value.isdigit() or int(value) >= 2**64:
                raise _BodyError("INVALID_TRACE_ID", "invalid trace id")
            trace_id = int(value)
        internal_only = all(k.startswith("##") or k == "zan_test" for k in header)
        return trace_id, internal_only

    def _pub(self, params: list[bytes], end: int, trace: bool, ext: bool) -> int:
        prepared = self._prepare_pub(params, end, mpub=False)
        if isinstance(prepared, int):
            return prepared
        size, state = prepared
        topic_name = state.data.topic
        if trace and size <= 8:
            raise FatalClientError("E_BAD_BODY", f"invalid body size {size} with trace id enabled")
        if ext and size <= 2:
            raise FatalClientError(
                "E_BAD_BODY", f"invalid body size {size} with ext json header enabled"
            )
        body = self._body(end, size)
        if body is None:
            return _NEED_MORE
        after = end + 4 + size
        trace_id = 0
        traced = False
        ext_ver, ext_bytes = EXT_VER_NONE, b""
        try:
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
                found, internal_only = self._parse_ext(ext_bytes)
                if found is not None:
                    trace_id, traced = found, True
                ext_ver = EXT_VER_JSON
                body = body[2 + jlen :]
                if not state.data.ext:
                    raise _BodyError(
                        "E_EXT_NOT_SUPPORT", f"ext content not supported in topic {topic_name}"
                    )
            self._check_writable(state)
        except _BodyError as err:
            self.send_error(err.body)
            return after
        internal_id, offset, raw_size = state.data.append(body, trace_id, ext_ver, ext_bytes)
        reply = traced_reply(internal_id, trace_id, offset, raw_size) if traced else None
        self._published(topic_name, 1, reply)
        return after

    def _check_writable(self, state: PartitionState) -> None:
        if not self._is_leader(state):
            raise _BodyError(NOT_LEADER, "")
        if not self.nsqd.coordinator.accepts_writes(state):
            # ErrWriteDisabled / ErrWriteQuorumFailed: cluster errors, so E_FAILED_ON_NOT_WRITABLE
            raise _BodyError(NOT_WRITABLE, "")

    def _mpub(self, params: list[bytes], end: int, trace: bool, ext: bool) -> int:
        prepared = self._prepare_pub(params, end, mpub=True)
        if isinstance(prepared, int):
            return prepared
        size, state = prepared
        buf = self._body(end, size)
        if buf is None:
            return _NEED_MORE
        after = end + 4 + size
        try:
            items = self._read_mpub(buf, trace, ext, state)
            self._check_writable(state)
        except _BodyError as err:
            self.send_error(err.body)
            return after
        data = state.data
        first_id = first_offset = -1
        total = 0
        for body, trace_id, ext_ver, ext_bytes in items:
            internal_id, offset, raw_size = data.append(body, trace_id, ext_ver, ext_bytes)
            if first_id < 0:
                first_id, first_offset = internal_id, offset
            total += raw_size
        reply = traced_reply(first_id, 0, first_offset, total) if trace else None
        self._published(data.topic, len(items), reply)
        return after

    def _read_mpub(
        self, buf: bytes, trace: bool, ext: bool, state: PartitionState
    ) -> list[tuple[bytes, int, int, bytes]]:
        """youzan's readMPUBEXT over a complete MPUB body."""
        if len(buf) < 4:
            raise FatalClientError("E_BAD_BODY", "MPUB failed to read message count")
        count = _I32.unpack_from(buf)[0]
        max_messages = (self.opts.max_body_size - 4) // 5
        if count <= 0 or count > max_messages:
            raise FatalClientError("E_BAD_BODY", f"MPUB invalid message count {count}")
        pos = 4
        items = []
        max_msg = self.opts.max_msg_size
        topic_ext = state.data.ext
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
                        raise _BodyError(
                            "E_EXT_NOT_SUPPORT",
                            f"ext content not supported in topic {state.data.topic}",
                        )
                    found, _ = self._parse_ext(ext_bytes)
                    trace_id = found or 0
                    ext_ver = EXT_VER_JSON
                body = body[2 + jlen :]
            items.append((body, trace_id, ext_ver, ext_bytes))
        return items

    def _cmd_dpub(self, params, end):
        raise FatalClientError("E_INVALID", f"invalid command {_go_params(params)}")

    _handlers: dict[bytes, Any] = {
        **ClientConn._handlers,
        b"SUB": _cmd_sub,
        b"SUB_ORDERED": _cmd_sub_ordered,
        b"CLS": _cmd_cls,
        b"FIN": _cmd_fin,
        b"REQ": _cmd_req,
        b"TOUCH": _cmd_touch,
        b"PUB": _publish_handler(mpub=False),
        b"PUB_TRACE": _publish_handler(mpub=False, trace=True),
        b"PUB_EXT": _publish_handler(mpub=False, ext=True),
        b"MPUB": _publish_handler(mpub=True),
        b"MPUB_TRACE": _publish_handler(mpub=True, trace=True),
        b"MPUB_EXT": _publish_handler(mpub=True, ext=True),
        b"DPUB": _cmd_dpub,
    }


def _go_params(params: list[bytes]) -> str:
    """Go's ``%v`` of ``[][]byte`` params (how youzan's "invalid command" prints them)."""
    return "[" + " ".join("[" + " ".join(str(b) for b in p) + "]" for p in params) + "]"
