"""One TCP client of an embedded youzan nsqd (``nsqdserver/protocol_v2.go`` of youzan/nsq):
the classic connection with youzan's protocol (:mod:`.protocol`) and commands run against the
cluster: partitions on SUB and PUB/MPUB, SUB_ORDERED, PUB_TRACE/MPUB_TRACE with their 30-byte
reply, PUB_EXT/MPUB_EXT with JSON headers, raw 16-byte ids in messages and in FIN/REQ/TOUCH,
no DPUB, and the cluster's errors (E_FAILED_ON_NOT_LEADER, E_FAILED_ON_NOT_WRITABLE,
E_TOPIC_NOT_EXIST, E_SUB_ORDER_IS_MUST, E_BAD_PARTITION, E_SUB_EXTEND_FORBIDDON, ...) with
youzan's texts and fatal/non-fatal split.

IDENTIFY, AUTH, heartbeats, RDY, NOP, CLS, TLS and compression are the classic connection's.
The node is seen through :class:`YouzanServer`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from ..nsqd.client import BLOCKED, ClientConn, Server
from ..nsqd.protocol_v2 import NEED_MORE, OK_FRAME, FatalClientError, to_int64
from .meta import Coordinator, PartitionState
from .protocol import (
    YOUZAN_VERSION,
    BodyError,
    YouzanProtocolV2,
    go_id,
    go_params,
    traced_reply,
)
from .queues import YChannel

__all__ = ["YouzanClientConn", "YouzanServer", "YOUZAN_VERSION", "traced_reply"]

log = logging.getLogger("nsqclient.testing.youzan_protocol")

NOT_LEADER = "E_FAILED_ON_NOT_LEADER"
NOT_WRITABLE = "E_FAILED_ON_NOT_WRITABLE"
TOPIC_NOT_EXIST = "E_TOPIC_NOT_EXIST"


class YouzanServer(Server, Protocol):
    """What a youzan connection needs of its node: the classic server plus the cluster."""

    coordinator: Coordinator
    index: int

    def publish_refusal(self, mpub: bool) -> tuple[str, str] | None:
        """The (code, description) a publish is refused with on purpose now, if any."""
        ...


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
    wire_class = YouzanProtocolV2
    wire: YouzanProtocolV2
    nsqd: YouzanServer

    def __init__(self, nsqd: YouzanServer):
        super().__init__(nsqd)
        self.detail = False
        self.subscribed = False
        self.ychannel: YChannel | None = None

    @property
    def extend_support(self) -> bool:
        """The client said ``extend_support`` in IDENTIFY."""
        return self.wire.extend_support

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

    # -- the cluster

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
        wire = self.wire
        topic_name, channel_name = wire.parse_sub(params)
        partition = wire.parse_partition(params[3]) if len(params) == 4 else -1
        if not self._check_auth("SUB", topic_name, channel_name):
            return BLOCKED  # an AUTH refresh is under way; run again
        state = self._partition_state(topic_name, partition)
        data = state.data
        if data.ordered and not ordered:
            raise FatalClientError(
                "E_SUB_ORDER_IS_MUST", "this topic is configured only allow ordered sub"
            )
        if data.ext and not wire.extend_support:
            raise FatalClientError(
                "E_SUB_EXTEND_NEED",
                "this topic is extended and should identify as extend support.",
            )
        if not data.ext and wire.extend_support:
            raise FatalClientError(
                "E_SUB_EXTEND_FORBIDDON",
                "this topic is not extended and should not identify as extend support.",
            )
        if not self._is_leader(state):
            raise FatalClientError(NOT_LEADER, "")
        channel, created = data.get_channel(channel_name)
        if ordered and wire.sample_rate != 0:
            raise FatalClientError(
                "E_INVALID", "order consume is not allowed while sample rate is not 0"
            )
        if ordered:
            channel.ordered = True
        channel.add_client(self)
        wire.subscribed()
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
        self.write(OK_FRAME)
        return end

    def _ysubscribed(self, cmd: str) -> YChannel:
        self.wire.check_subscribed(cmd)
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

    def _succeeded(self, cmd: str, raw_id: bytes, err: str | None) -> bool:
        """True when a FIN/REQ/TOUCH found no error; otherwise answer youzan's non-fatal
        ``E_<cmd>_FAILED`` and False."""
        if err is None:
            return True
        self.send_error(f"E_{cmd}_FAILED {cmd} {go_id(raw_id)} failed {err}".encode())
        return False

    def _cmd_fin(self, params, end):
        wire = self.wire
        wire.check_subscribed("FIN")
        internal_id = wire.parse_internal_id(params, "FIN")
        if to_int64(internal_id) <= 0:
            raise FatalClientError("E_INVALID", wire.invalid_id_text)
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
        self.wire.check_subscribed("REQ")
        internal_id, delay_ns = self.wire.parse_youzan_req(params)
        channel = self._ysubscribed("REQ")
        if channel.ordered and delay_ns > 0:
            # youzan ignores a delayed REQ on an ordered channel (the message stays in flight)
            log.info("[%s] ignore delay for ordered channel %s", self.remote, channel.name)
            return end
        if self._succeeded("REQ", params[1], channel.requeue(self, internal_id, delay_ns / 1e9)):
            self.requeue_count += 1
        return end

    def _cmd_touch(self, params, end):
        wire = self.wire
        wire.check_subscribed("TOUCH")
        internal_id = wire.parse_internal_id(params, "TOUCH")
        channel = self._ysubscribed("TOUCH")
        err = channel.touch(self, internal_id, wire.msg_timeout, self.opts.max_msg_timeout)
        self._succeeded("TOUCH", params[1], err)
        return end

    # -- publishing

    def _prepare_pub(
        self, params: list[bytes], end: int, mpub: bool
    ) -> tuple[int, PartitionState] | int:
        """youzan's preparePub, then the PUB authorisation: (body size, partition), or
        NEED_MORE while the size has not arrived, BLOCKED while AUTH is refreshed."""
        head = self.wire.parse_pub_head(params, end, mpub)
        if head is None:
            return NEED_MORE
        topic_name, given, size = head
        state = self._partition_state(topic_name, given)
        if given == -1 and state.data.ordered:
            raise FatalClientError(
                "E_BAD_PARTITION", "topic partition is not valid for multi partition: -1"
            )
        if not self._check_auth("PUB", state.data.topic, ""):
            return BLOCKED
        return size, state

    def _published(self, topic_name: str, count: int, reply: bytes | None) -> None:
        """Count ``count`` messages published and answer OK (or the traced ``reply``)."""
        self.pub_counts[topic_name] = self.pub_counts.get(topic_name, 0) + count
        if reply is not None:
            self.send_response(reply)
        else:
            self.write(OK_FRAME)

    def _pub(self, params: list[bytes], end: int, trace: bool, ext: bool) -> int:
        prepared = self._prepare_pub(params, end, mpub=False)
        if isinstance(prepared, int):
            return prepared
        size, state = prepared
        topic_name = state.data.topic
        wire = self.wire
        wire.check_pub_size(size, trace, ext)
        body = wire.sized_body(end, size)
        if body is None:
            return NEED_MORE
        after = end + 4 + size
        try:
            (body, trace_id, ext_ver, ext_bytes), traced = wire.split_pub_body(
                body, size, trace, ext
            )
            if ext and not state.data.ext:
                raise BodyError(
                    "E_EXT_NOT_SUPPORT", f"ext content not supported in topic {topic_name}"
                )
            self._check_writable(state, mpub=False)
        except BodyError as err:
            self.send_error(err.body)
            return after
        internal_id, offset, raw_size = state.data.append(body, trace_id, ext_ver, ext_bytes)
        reply = traced_reply(internal_id, trace_id, offset, raw_size) if traced else None
        self._published(topic_name, 1, reply)
        return after

    def _check_writable(self, state: PartitionState, mpub: bool) -> None:
        refusal = self.nsqd.publish_refusal(mpub)  # a test's fault (refuse_publishes)
        if refusal is not None:
            raise BodyError(*refusal)
        if not self._is_leader(state):
            raise BodyError(NOT_LEADER, "")
        if not self.nsqd.coordinator.accepts_writes(state):
            # ErrWriteDisabled / ErrWriteQuorumFailed: cluster errors, so E_FAILED_ON_NOT_WRITABLE
            raise BodyError(NOT_WRITABLE, "")

    def _mpub(self, params: list[bytes], end: int, trace: bool, ext: bool) -> int:
        prepared = self._prepare_pub(params, end, mpub=True)
        if isinstance(prepared, int):
            return prepared
        size, state = prepared
        buf = self.wire.sized_body(end, size)
        if buf is None:
            return NEED_MORE
        after = end + 4 + size
        data = state.data
        try:
            items = self.wire.parse_mpub_body(buf, trace, ext, data.topic, data.ext)
            self._check_writable(state, mpub=True)
        except BodyError as err:
            self.send_error(err.body)
            return after
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

    def _cmd_dpub(self, params, end):
        raise FatalClientError("E_INVALID", f"invalid command {go_params(params)}")

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
