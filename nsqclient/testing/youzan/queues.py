"""youzan's partitioned NSQ: one topic partition's message log and its channels.

A partition is an append-only log: every message gets the next internal id (the partition in the
top bits, ``partition << 50``, then a counter), its disk-queue offset and its raw size (the
4-byte length prefix plus the message as youzan's nsqd writes it to disk), so that offsets
increase by raw size.  A channel is a cursor on that log: it sees the messages published after
it was created (youzan's channels start at the log's end), hands them to its clients and takes
them back on REQ or timeout.  An *ordered* channel (SUB_ORDERED, or any channel of an ordered
topic) has at most one message in flight, whatever the clients' RDY, and a message that comes
back is the next one delivered.

The partition data belongs to the cluster, not to a node: replicas share it, and the node that
leads the partition is the one that serves it.  Clients are seen through :class:`YSubscriber`.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections import deque
from typing import Protocol

from ...protocol import FRAME_TYPE_MESSAGE
from .protocol import EXT_VER_NONE

__all__ = [
    "YSubscriber",
    "YMessage",
    "YChannel",
    "PartitionData",
    "ID_PARTITION_SHIFT",
]

log = logging.getLogger("nsqclient.testing.youzan_queues")

#: internal message ids carry the partition in their top bits
ID_PARTITION_SHIFT = 50
#: youzan caps a message's attempts at this value
MAX_ATTEMPTS = 4000

_HEAD = struct.Struct(">IiqHQQ")  # frame size, frame type, timestamp, attempts, id, trace id
_DETAIL = struct.Struct(">QI")  # disk queue offset, raw size
_U16 = struct.Struct(">H")
#: bytes of a message on disk before its extension and body: length prefix, timestamp,
#: attempts, internal id, trace id
_DISK_HEAD = 4 + 8 + 2 + 8 + 8


class YSubscriber(Protocol):
    """What a channel needs of a subscribed connection."""

    id: int
    rdy: int
    in_flight_count: int
    message_count: int
    closed: bool
    write_paused: bool
    subscribed: bool
    #: the connection subscribed with SUB_ORDERED (messages carry offset and raw size)
    detail: bool

    @property
    def msg_timeout(self) -> float:
        """Seconds a message sent to the client stays in flight."""

    @property
    def extend_support(self) -> bool:
        """The client said ``extend_support`` in IDENTIFY."""

    def write(self, data: bytes) -> None:
        """Queue bytes for the client."""

    def close(self) -> None:
        """Close the connection (after flushing what is queued)."""


class YMessage:
    """One message of a channel (each channel has its own copy: attempts are per channel)."""

    __slots__ = (
        "internal_id",
        "trace_id",
        "body",
        "timestamp",
        "ext_ver",
        "ext",
        "offset",
        "raw_size",
        "attempts",
        "client",
        "timer",
        "delivery_ts",
    )

    def __init__(
        self,
        internal_id: int,
        trace_id: int,
        body: bytes,
        timestamp: int,
        ext_ver: int,
        ext: bytes,
        offset: int,
        raw_size: int,
    ):
        self.internal_id = internal_id
        self.trace_id = trace_id
        self.body = body
        self.timestamp = timestamp
        self.ext_ver = ext_ver
        self.ext = ext
        self.offset = offset
        self.raw_size = raw_size
        self.attempts = 0
        self.client: YSubscriber | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.delivery_ts = 0.0

    def copy(self) -> YMessage:
        return YMessage(
            self.internal_id,
            self.trace_id,
            self.body,
            self.timestamp,
            self.ext_ver,
            self.ext,
            self.offset,
            self.raw_size,
        )

    def frame(self, with_ext: bool, with_detail: bool) -> bytes:
        """The message frame as youzan's nsqd writes it to a client."""
        ext = b""
        if with_ext:
            ext = bytes((self.ext_ver,))
            if self.ext_ver != EXT_VER_NONE:
                ext += _U16.pack(len(self.ext)) + self.ext
        detail = _DETAIL.pack(self.offset, self.raw_size) if with_detail else b""
        size = 4 + 8 + 2 + 16 + len(ext) + len(detail) + len(self.body)
        head = _HEAD.pack(
            size,
            FRAME_TYPE_MESSAGE,
            self.timestamp,
            min(self.attempts, MAX_ATTEMPTS),
            self.internal_id,
            self.trace_id,
        )
        return head + ext + detail + self.body


class YChannel:
    """A channel of one topic partition: pending messages, in flight ones, its clients."""

    def __init__(self, partition: PartitionData, name: str):
        self.partition = partition
        self.loop = partition.loop
        self.name = name
        self.ordered = partition.ordered
        self.pending: deque[YMessage] = deque()
        self.in_flight: dict[int, YMessage] = {}
        self.deferred: dict[int, tuple[YMessage, asyncio.TimerHandle]] = {}
        self.clients: dict[int, YSubscriber] = {}
        self._rr = 0
        self._scheduled = False
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0

    # -- clients

    def add_client(self, client: YSubscriber) -> None:
        self.clients[client.id] = client

    def remove_client(self, client: YSubscriber) -> None:
        """Forget ``client``; its in-flight messages go back (youzan requeues them at once)."""
        if self.clients.pop(client.id, None) is None:
            return
        back = [m for m in self.in_flight.values() if m.client is client]
        for msg in back:
            self._take_back(msg)
        if back:
            self._restore_order()
            self.schedule()

    def disable(self) -> None:
        """The partition's leader moved away: close every client, take every message back."""
        for client in list(self.clients.values()):
            client.close()
        self.clients.clear()
        for msg in list(self.in_flight.values()):
            self._take_back(msg)
        for msg, handle in list(self.deferred.values()):
            handle.cancel()
            self.pending.append(msg)
        self.deferred.clear()
        self._restore_order()

    def _take_back(self, msg: YMessage) -> None:
        self.in_flight.pop(msg.internal_id, None)
        if msg.timer is not None:
            msg.timer.cancel()
            msg.timer = None
        client = msg.client
        msg.client = None
        if client is not None:
            client.in_flight_count -= 1
        self.pending.appendleft(msg)

    def _restore_order(self) -> None:
        if self.ordered:
            self.pending = deque(sorted(self.pending, key=lambda m: m.offset))

    # -- queueing

    def put(self, msg: YMessage) -> None:
        self.message_count += 1
        self.pending.append(msg)
        self.schedule()

    def schedule(self) -> None:
        """Pump on the next pass of the loop (once, however often this is called)."""
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self.pump)

    def _ready_client(self) -> YSubscriber | None:
        clients = list(self.clients.values())
        n = len(clients)
        for i in range(n):
            client = clients[(self._rr + i) % n]
            if (
                client.subscribed
                and not client.closed
                and not client.write_paused
                and client.rdy > 0
                and client.in_flight_count < client.rdy
            ):
                self._rr = (self._rr + i + 1) % n
                return client
        return None

    def pump(self) -> None:
        """Hand pending messages to ready clients (one in flight in all when ordered)."""
        self._scheduled = False
        pending = self.pending
        ext = self.partition.ext
        while pending and self.clients:
            if self.ordered and self.in_flight:
                return
            client = self._ready_client()
            if client is None:
                return
            msg = pending.popleft()
            msg.attempts += 1
            msg.client = client
            now = self.loop.time()
            msg.delivery_ts = now
            msg.timer = self.loop.call_at(now + client.msg_timeout, self._time_out, msg)
            self.in_flight[msg.internal_id] = msg
            client.in_flight_count += 1
            client.message_count += 1
            client.write(msg.frame(ext and client.extend_support, client.detail))

    def _time_out(self, msg: YMessage) -> None:
        msg.timer = None
        if self.in_flight.get(msg.internal_id) is not msg:
            return
        self.timeout_count += 1
        log.debug("channel %s: message %d timed out", self.name, msg.internal_id)
        self._take_back(msg)
        self._restore_order()
        self.schedule()

    def _pop(self, client: YSubscriber, internal_id: int) -> YMessage | str:
        msg = self.in_flight.get(internal_id)
        if msg is None:
            return "Message ID not in flight"
        if msg.client is not client:
            other = msg.client.id if msg.client is not None else 0
            return f"client does not own message : {other} vs {client.id}"
        del self.in_flight[internal_id]
        if msg.timer is not None:
            msg.timer.cancel()
            msg.timer = None
        msg.client = None
        client.in_flight_count -= 1
        return msg

    def finish(self, client: YSubscriber, internal_id: int) -> str | None:
        msg = self._pop(client, internal_id)
        if isinstance(msg, str):
            return msg
        self.schedule()
        return None

    def requeue(self, client: YSubscriber, internal_id: int, delay: float) -> str | None:
        msg = self._pop(client, internal_id)
        if isinstance(msg, str):
            return msg
        self.requeue_count += 1
        if delay <= 0 or self.ordered:
            self.pending.appendleft(msg)
            self.schedule()
            return None
        handle = self.loop.call_later(delay, self._undefer, internal_id)
        self.deferred[internal_id] = (msg, handle)
        return None

    def _undefer(self, internal_id: int) -> None:
        entry = self.deferred.pop(internal_id, None)
        if entry is not None:
            self.pending.appendleft(entry[0])
            self.schedule()

    def touch(self, client: YSubscriber, internal_id: int, timeout: float, max_timeout: float):
        msg = self.in_flight.get(internal_id)
        if msg is None:
            return "Message ID not in flight"
        if msg.client is not client:
            return (
                f"client does not own message : {msg.client.id if msg.client else 0} vs {client.id}"
            )
        if msg.timer is not None:
            msg.timer.cancel()
        deadline = min(self.loop.time() + timeout, msg.delivery_ts + max_timeout)
        msg.timer = self.loop.call_at(deadline, self._time_out, msg)
        return None

    def depth(self) -> int:
        return len(self.pending) + len(self.deferred)


class PartitionData:
    """One topic partition: its log counters and its channels (shared by its replicas)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        topic: str,
        partition: int,
        ordered: bool,
        ext: bool,
    ):
        self.loop = loop
        self.topic = topic
        self.partition = partition
        self.ordered = ordered
        self.ext = ext
        self.channels: dict[str, YChannel] = {}
        self.next_id = (partition << ID_PARTITION_SHIFT) + 2  # as youzan's commit log starts
        self.end_offset = 0
        self.message_count = 0

    def get_channel(self, name: str) -> tuple[YChannel, bool]:
        """The channel ``name`` and whether it was created now (at the log's end)."""
        channel = self.channels.get(name)
        if channel is not None:
            return channel, False
        channel = self.channels[name] = YChannel(self, name)
        log.debug("TOPIC(%s-%d): new channel(%s)", self.topic, self.partition, name)
        return channel, True

    def raw_size(self, body: bytes, ext_ver: int, ext: bytes) -> int:
        """Bytes the message takes in the disk queue (what offsets advance by)."""
        size = _DISK_HEAD + len(body)
        if self.ext:
            size += 1
            if ext_ver != EXT_VER_NONE:
                size += 2 + len(ext)
        return size

    def append(
        self, body: bytes, trace_id: int = 0, ext_ver: int = EXT_VER_NONE, ext: bytes = b""
    ) -> tuple[int, int, int]:
        """Write one message; return its internal id, offset and raw size."""
        if not self.ext:
            ext_ver, ext = EXT_VER_NONE, b""
        internal_id = self.next_id
        self.next_id += 1
        offset = self.end_offset
        raw_size = self.raw_size(body, ext_ver, ext)
        self.end_offset += raw_size
        self.message_count += 1
        msg = YMessage(internal_id, trace_id, body, time.time_ns(), ext_ver, ext, offset, raw_size)
        first = True
        for channel in self.channels.values():
            channel.put(msg if first else msg.copy())
            first = False
        return internal_id, offset, raw_size
