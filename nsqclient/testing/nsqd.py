"""The embedded nsqd: topics, channels, messages, clients and the ``  V2`` TCP protocol.

Everything here runs on one asyncio event loop (the cluster's thread) and is never touched from
another thread.  The behaviour follows nsqd 1.3.0 (``nsqd/protocol_v2.go``, ``client_v2.go``,
``channel.go``, ``topic.go``): the same commands, states, error codes and texts, the same
fatal/non-fatal split, the same limits, checked in the same order.

Memory only: a node that is stopped and started again (``NSQD.stop()`` / ``NSQD.start()``) keeps
its non-ephemeral topics, channels, pause flags and undelivered messages, as a real nsqd with a
data path would (in-flight and deferred messages go back to their channel's queue on stop).

Performance notes: commands are parsed straight out of one receive buffer; deliveries are
round-robin over a deque of ready clients (O(1) per message); in-flight timeouts live in
insertion-ordered buckets per msg_timeout value (O(1) FIN); output frames are queued per
client and written with one ``transport.write`` per event-loop pass.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import random
import re
import socket
import ssl
import struct
import time
import urllib.parse
import zlib
from collections import OrderedDict, deque
from dataclasses import dataclass, field, fields
from typing import Any

from ..protocol import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    encode_frame,
    valid_channel_name,
    valid_topic_name,
)
from .nodes import Listeners

__all__ = ["NSQDOptions", "NSQD", "Topic", "Channel", "Message", "ClientConn", "VERSION"]

log = logging.getLogger("nsqclient.testing.nsqd")

VERSION = "1.3.0"

# Client states, with nsqd's numbering (they show up in /stats).
STATE_INIT = 0
STATE_SUBSCRIBED = 3
STATE_CLOSING = 4
_STATE_MAGIC = -1

_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_MSG_FRAME_HEAD = struct.Struct(">IiqH")  # size, frame type, timestamp, attempts
_LINE_LIMIT = 16 * 1024  # nsqd's bufio reader size: a longer line is a read error

_OK_FRAME = encode_frame(FRAME_TYPE_RESPONSE, b"OK")
_HEARTBEAT_FRAME = encode_frame(FRAME_TYPE_RESPONSE, b"_heartbeat_")
_CLOSE_WAIT_FRAME = encode_frame(FRAME_TYPE_RESPONSE, b"CLOSE_WAIT")

_NEED_MORE = -1  # a command handler's "not enough bytes yet"
_BLOCKED = -2  # a command handler's "waiting for something asynchronous; run me again"

_TLS_VERSIONS = {
    "ssl3.0": ssl.TLSVersion.SSLv3,
    "tls1.0": ssl.TLSVersion.TLSv1,
    "tls1.1": ssl.TLSVersion.TLSv1_1,
    "tls1.2": ssl.TLSVersion.TLSv1_2,
    "tls1.3": ssl.TLSVersion.TLSv1_3,
}


# --------------------------------------------------------------------------------------------
# Options


@dataclass
class NSQDOptions:
    """nsqd's flags with underscores; durations in seconds (floats), sizes in bytes."""

    msg_timeout: float = 60.0
    max_msg_timeout: float = 900.0
    max_req_timeout: float = 3600.0
    max_msg_size: int = 1024 * 1024
    max_body_size: int = 5 * 1024 * 1024
    max_rdy_count: int = 2500
    max_heartbeat_interval: float = 60.0
    max_output_buffer_size: int = 64 * 1024
    max_output_buffer_timeout: float = 30.0
    min_output_buffer_timeout: float = 0.025
    output_buffer_timeout: float = 0.25
    client_timeout: float = 60.0
    mem_queue_size: int = 10000
    max_channel_consumers: int = 0
    snappy: bool = True
    deflate: bool = True
    max_deflate_level: int = 6
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_root_ca_file: str | None = None
    tls_client_auth_policy: str = ""
    tls_required: int = 0
    tls_min_version: str | None = None
    auth_http_address: str | list[str] | None = None
    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 5.0
    node_id: int | None = None
    broadcast_address: str = "127.0.0.1"
    lookupd_tcp_addresses: list[str] = field(default_factory=list)
    #: How often the node pings each nsqlookupd (nsqd: 15s).
    lookupd_ping_interval: float = 15.0
    #: How soon a lost nsqlookupd connection is retried (nsqd waits for its next ping).
    lookupd_reconnect_interval: float = 1.0
    #: In-flight / deferred scan period (nsqd: 100ms).
    queue_scan_interval: float = 0.05
    data_path: str | None = None  # accepted for compatibility; the embedded nsqd is memory-only

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> NSQDOptions:
        """Build options from nsqd-style keyword arguments; unknown names raise TypeError."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(k for k in kwargs if k not in known and not k.startswith("statsd_"))
        if unknown:
            raise TypeError(f"unknown nsqd option(s): {', '.join(unknown)}")
        opts = cls(**{k: v for k, v in kwargs.items() if k in known})
        if isinstance(opts.auth_http_address, str):
            opts.auth_http_address = [opts.auth_http_address] if opts.auth_http_address else []
        elif opts.auth_http_address is None:
            opts.auth_http_address = []
        if not 1 <= opts.max_deflate_level <= 9:
            raise ValueError("--max-deflate-level must be [1,9]")
        if opts.tls_client_auth_policy and not opts.tls_required:
            opts.tls_required = 2
        if opts.tls_required and not (opts.tls_cert and opts.tls_key):
            raise ValueError("cannot require TLS client connections without TLS key and cert")
        return opts


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


# --------------------------------------------------------------------------------------------
# Small Go-compatibility helpers


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


def _base10(raw: bytes) -> int | None:
    """nsqd's ByteToBase10: digits only (empty is 0), wrapping at 2**64; None when invalid."""
    n = 0
    for b in raw:
        if not 48 <= b <= 57:
            return None
        n = (n * 10 + b - 48) & 0xFFFFFFFFFFFFFFFF
    return n


def _to_int64(n: int) -> int:
    n &= 0xFFFFFFFFFFFFFFFF
    return n - (1 << 64) if n >= 1 << 63 else n


def _ms_to_duration_ns(ms_u64: int) -> int:
    """``time.Duration(ms) * time.Millisecond`` with Go's int64 wrap-around."""
    return _to_int64(_to_int64(ms_u64) * 1_000_000)


class FatalClientError(Exception):
    """An error frame after which nsqd closes the connection."""

    fatal = True

    def __init__(self, code: str, desc: str | bytes):
        super().__init__(code)
        self.code = code
        self.desc = desc

    def frame_body(self) -> bytes:
        desc = self.desc if isinstance(self.desc, bytes) else self.desc.encode("utf-8")
        return self.code.encode() + b" " + desc


class ClientError(FatalClientError):
    """An error frame that leaves the connection open (FIN/REQ/TOUCH failures)."""

    fatal = False


# --------------------------------------------------------------------------------------------
# IDs


_TWEPOCH = 1288834974288


class GUIDFactory:
    """nsqd's snowflake-style ids, as 16 lowercase hex characters (bytes)."""

    __slots__ = ("node_id", "sequence", "last_ts")

    def __init__(self, node_id: int):
        self.node_id = node_id & 0x3FF
        self.sequence = 0
        self.last_ts = 0

    def new(self) -> bytes:
        ts = time.time_ns() >> 20
        if ts < self.last_ts:
            ts = self.last_ts
        if ts == self.last_ts:
            self.sequence = (self.sequence + 1) & 0xFFF
            if self.sequence == 0:
                ts += 1  # borrow the next pseudo-millisecond instead of sleeping
        else:
            self.sequence = 0
        self.last_ts = ts
        value = ((ts - _TWEPOCH) << 22) | (self.node_id << 12) | self.sequence
        return b"%016x" % (value & 0xFFFFFFFFFFFFFFFF)

    def new_many(self, n: int) -> list[bytes]:
        """``n`` ids at once (what ``n`` calls of :meth:`new` would give, minus clock reads)."""
        out = []
        ts = time.time_ns() >> 20
        if ts < self.last_ts:
            ts = self.last_ts
        seq = self.sequence if ts == self.last_ts else -1
        node = self.node_id << 12
        for _ in range(n):
            seq += 1
            if seq > 0xFFF:
                ts += 1
                seq = 0
            out.append(b"%016x" % ((((ts - _TWEPOCH) << 22) | node | seq) & 0xFFFFFFFFFFFFFFFF))
        self.last_ts = ts
        self.sequence = seq
        return out


# --------------------------------------------------------------------------------------------
# Messages, channels, topics


class Message:
    """One message copy (each channel owns its own copy, as in nsqd)."""

    __slots__ = (
        "id",
        "body",
        "timestamp",
        "attempts",
        "deferred",
        "client",
        "delivery_ts",
        "deadline",
        "bucket",
    )

    def __init__(self, msg_id: bytes, body: bytes, timestamp: int | None = None):
        self.id = msg_id
        self.body = body
        self.timestamp = time.time_ns() if timestamp is None else timestamp
        self.attempts = 0
        self.deferred = 0.0  # seconds; set on DPUB / pub?defer=
        self.client: ClientConn | None = None
        self.delivery_ts = 0.0
        self.deadline = 0.0
        self.bucket: float | None = None

    def copy(self) -> Message:
        m = Message(self.id, self.body, self.timestamp)
        m.deferred = self.deferred
        return m


_IRREGULAR = -1.0  # bucket marker: the message sits in the channel's heap (a clamped TOUCH)


class Channel:
    """A channel: its queue, in-flight and deferred messages, and its subscribed clients."""

    def __init__(self, topic: Topic, name: str):
        self.topic = topic
        self.nsqd = topic.nsqd
        self.name = name
        self.ephemeral = name.endswith("#ephemeral")
        self.queue: deque[Message] = deque()
        self.in_flight: dict[bytes, Message] = {}
        self.buckets: dict[float, OrderedDict[bytes, Message]] = {}
        self.irregular: list[tuple[float, int, Message]] = []
        self.deferred: dict[bytes, Message] = {}
        self.deferred_pq: list[tuple[float, int, Message]] = []
        self.clients: dict[int, ClientConn] = {}
        self.ready: deque[ClientConn] = deque()
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self._seq = 0

    # -- queueing

    def put(self, msg: Message) -> None:
        self.queue.append(msg)
        if self.ready:
            self.nsqd.mark_dirty(self)

    def put_message(self, msg: Message) -> None:
        """A new message from the topic."""
        self.message_count += 1
        self.put(msg)

    def put_deferred(self, msg: Message, delay: float) -> None:
        self.message_count += 1
        self.start_deferred(msg, delay)

    def start_deferred(self, msg: Message, delay: float) -> str | None:
        if msg.id in self.deferred:
            return "ID already deferred"
        self.deferred[msg.id] = msg
        self._seq += 1
        heapq.heappush(self.deferred_pq, (self.nsqd.loop.time() + delay, self._seq, msg))
        self.nsqd.wake_scanner()
        return None

    def depth(self) -> int:
        return len(self.queue)

    # -- in flight

    def start_in_flight(self, msg: Message, client: ClientConn, timeout: float, now: float):
        msg.client = client
        msg.delivery_ts = now
        msg.deadline = now + timeout
        self.in_flight[msg.id] = msg
        bucket = self.buckets.get(timeout)
        if bucket is None:
            bucket = self.buckets[timeout] = OrderedDict()
        bucket[msg.id] = msg
        msg.bucket = timeout

    def _pop_in_flight(self, client: ClientConn, msg_id: bytes) -> Message | str:
        msg = self.in_flight.get(msg_id)
        if msg is None:
            return "ID not in flight"
        if msg.client is not client:
            return "client does not own message"
        del self.in_flight[msg_id]
        self._unbucket(msg)
        return msg

    def _unbucket(self, msg: Message) -> None:
        if msg.bucket is not None and msg.bucket != _IRREGULAR:
            bucket = self.buckets.get(msg.bucket)
            if bucket is not None:
                bucket.pop(msg.id, None)
        msg.bucket = None

    def finish(self, client: ClientConn, msg_id: bytes) -> str | None:
        msg = self._pop_in_flight(client, msg_id)
        return msg if isinstance(msg, str) else None

    def requeue(self, client: ClientConn, msg_id: bytes, delay: float) -> str | None:
        msg = self._pop_in_flight(client, msg_id)
        if isinstance(msg, str):
            return msg
        self.requeue_count += 1
        if delay <= 0:
            if self.exiting:
                return "exiting"
            self.put(msg)
            return None
        return self.start_deferred(msg, delay)

    def touch(self, client: ClientConn, msg_id: bytes, timeout: float) -> str | None:
        msg = self._pop_in_flight(client, msg_id)
        if isinstance(msg, str):
            return msg
        now = self.nsqd.loop.time()
        deadline = now + timeout
        max_timeout = self.nsqd.opts.max_msg_timeout
        self.in_flight[msg.id] = msg
        if deadline - msg.delivery_ts >= max_timeout:
            msg.deadline = msg.delivery_ts + max_timeout
            msg.bucket = _IRREGULAR
            self._seq += 1
            heapq.heappush(self.irregular, (msg.deadline, self._seq, msg))
        else:
            msg.deadline = deadline
            bucket = self.buckets.get(timeout)
            if bucket is None:
                bucket = self.buckets[timeout] = OrderedDict()
            bucket[msg.id] = msg
            msg.bucket = timeout
        return None

    def scan(self, now: float) -> None:
        """Requeue timed-out in-flight messages and release due deferred ones."""
        if self.exiting:
            return
        for bucket in self.buckets.values():
            while bucket:
                msg = next(iter(bucket.values()))
                if msg.deadline > now:
                    break
                bucket.popitem(last=False)
                msg.bucket = None
                self._time_out(msg)
        heap = self.irregular
        while heap and heap[0][0] <= now:
            deadline, _, msg = heapq.heappop(heap)
            if (
                msg.bucket == _IRREGULAR
                and msg.deadline == deadline
                and self.in_flight.get(msg.id) is msg
            ):
                msg.bucket = None
                self._time_out(msg)
        pq = self.deferred_pq
        while pq and pq[0][0] <= now:
            _, _, msg = heapq.heappop(pq)
            if self.deferred.get(msg.id) is msg:
                del self.deferred[msg.id]
                self.put(msg)

    def next_deadline(self) -> float | None:
        best = None
        for bucket in self.buckets.values():
            if bucket:
                d = next(iter(bucket.values())).deadline
                if best is None or d < best:
                    best = d
        for heap in (self.irregular, self.deferred_pq):
            if heap and (best is None or heap[0][0] < best):
                best = heap[0][0]
        return best

    def _time_out(self, msg: Message) -> None:
        self.in_flight.pop(msg.id, None)
        self.timeout_count += 1
        client = msg.client
        msg.client = None
        if client is not None and self.clients.get(client.id) is client:
            client.in_flight_count -= 1
            self.client_maybe_ready(client)
        self.put(msg)

    # -- clients

    def add_client(self, client: ClientConn) -> str | None:
        if self.exiting:
            return "exiting"
        if client.id in self.clients:
            return None
        limit = self.nsqd.opts.max_channel_consumers
        if limit and len(self.clients) >= limit:
            return f"consumers for {self.topic.name}:{self.name} exceeds limit of {limit}"
        self.clients[client.id] = client
        return None

    def remove_client(self, client: ClientConn) -> None:
        if self.exiting or self.clients.pop(client.id, None) is None:
            return
        if client.in_ready:
            try:
                self.ready.remove(client)
            except ValueError:
                pass
            client.in_ready = False
        if not self.clients and self.ephemeral:
            self.topic.delete_channel(self.name)

    def client_maybe_ready(self, client: ClientConn) -> None:
        if (
            not client.in_ready
            and client.rdy > client.in_flight_count
            and client.state == STATE_SUBSCRIBED
        ):
            client.in_ready = True
            self.ready.append(client)
        if self.queue and client.in_ready:
            self.nsqd.mark_dirty(self)

    def pump(self) -> None:
        """Hand queued messages to ready clients, round-robin, one at a time."""
        if self.paused or self.exiting:
            return
        queue = self.queue
        ready = self.ready
        nsqd = self.nsqd
        if not queue or not ready:
            return
        now = nsqd.loop.time()
        while queue and ready:
            client = ready[0]
            if (
                client.in_flight_count >= client.rdy
                or client.state != STATE_SUBSCRIBED
                or client.closed
                or client.write_paused
            ):
                ready.popleft()
                client.in_ready = False
                continue
            msg = queue.popleft()
            if client.sample_rate > 0 and random.randrange(100) > client.sample_rate:
                continue  # nsqd drops a sampled-out message
            msg.attempts += 1
            self.start_in_flight(msg, client, client.msg_timeout, now)
            client.in_flight_count += 1
            client.message_count += 1
            body = msg.body
            client.write_parts(
                _MSG_FRAME_HEAD.pack(
                    30 + len(body), FRAME_TYPE_MESSAGE, msg.timestamp, msg.attempts & 0xFFFF
                ),
                msg.id,
                body,
            )
            ready.rotate(-1)
        if self.in_flight:
            nsqd.wake_scanner()

    def _drop_messages(self) -> None:
        """Forget every queued, in-flight and deferred message."""
        self.queue.clear()
        self.in_flight.clear()
        self.buckets.clear()
        self.irregular.clear()
        self.deferred.clear()
        self.deferred_pq.clear()

    def empty(self) -> None:
        self._drop_messages()
        for client in list(self.clients.values()):
            client.in_flight_count = 0
            self.client_maybe_ready(client)

    def set_paused(self, paused: bool) -> None:
        self.paused = paused
        if not paused:
            for client in self.clients.values():
                self.client_maybe_ready(client)
            self.nsqd.mark_dirty(self)

    def delete(self) -> None:
        """Delete: close its clients and drop its messages (nsqd's Channel.Delete)."""
        if self.exiting:
            return
        self.exiting = True
        self.nsqd.notify_lookupd(self, registering=False)
        for client in list(self.clients.values()):
            client.close()
        self.clients.clear()
        self.ready.clear()
        self._drop_messages()

    def flush_for_shutdown(self) -> None:
        """nsqd's Channel.flush(): in-flight then deferred messages go back to the queue."""
        for msg in list(self.in_flight.values()):
            msg.client = None
            msg.bucket = None
            self.queue.append(msg)
        for msg in list(self.deferred.values()):
            self.queue.append(msg)
        self.in_flight.clear()
        self.buckets.clear()
        self.irregular.clear()
        self.deferred.clear()
        self.deferred_pq.clear()
        self.clients.clear()
        self.ready.clear()


class Topic:
    """A topic: waiting messages (while it has no channel or is paused) and its channels."""

    def __init__(self, nsqd: NSQD, name: str):
        self.nsqd = nsqd
        self.name = name
        self.ephemeral = name.endswith("#ephemeral")
        self.channels: dict[str, Channel] = {}
        self.queue: deque[Message] = deque()
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.message_bytes = 0

    def put(self, msg: Message) -> None:
        self.message_count += 1
        self.message_bytes += len(msg.body)
        if self.channels and not self.paused:
            self._distribute(msg)
        else:
            self.queue.append(msg)

    def put_many(self, msgs: list[Message]) -> None:
        """Like put() for each message, with the common cases done in bulk."""
        self.message_count += len(msgs)
        self.message_bytes += sum(len(m.body) for m in msgs)
        channels = self.channels
        if not channels or self.paused:
            self.queue.extend(msgs)
        elif len(channels) == 1 and not any(m.deferred for m in msgs):
            channel = next(iter(channels.values()))
            channel.message_count += len(msgs)
            channel.queue.extend(msgs)
            if channel.ready:
                self.nsqd.mark_dirty(channel)
        else:
            for msg in msgs:
                self._distribute(msg)

    def _distribute(self, msg: Message) -> None:
        first = True
        for channel in self.channels.values():
            m = msg if first else msg.copy()
            first = False
            if m.deferred:
                channel.put_deferred(m, m.deferred)
            else:
                channel.put_message(m)

    def drain(self) -> None:
        """Move waiting messages into the channels (after a channel appears or an unpause)."""
        while self.queue and self.channels and not self.paused:
            self._distribute(self.queue.popleft())

    def get_channel(self, name: str) -> Channel:
        channel = self.channels.get(name)
        if channel is None:
            channel = Channel(self, name)
            self.channels[name] = channel
            log.debug("TOPIC(%s): new channel(%s)", self.name, name)
            self.nsqd.notify_lookupd(channel, registering=True)
            self.drain()
        return channel

    def delete_channel(self, name: str) -> bool:
        channel = self.channels.get(name)
        if channel is None:
            return False
        channel.delete()
        self.channels.pop(name, None)
        if not self.channels and self.ephemeral:
            self.nsqd.delete_topic(self.name)
        return True

    def set_paused(self, paused: bool) -> None:
        self.paused = paused
        if not paused:
            self.drain()

    def empty(self) -> None:
        self.queue.clear()

    def depth(self) -> int:
        return len(self.queue)


# --------------------------------------------------------------------------------------------
# Auth


class AuthState:
    """The answer of an auth server, as nsqd keeps it per client."""

    def __init__(self, data: dict[str, Any], now: float):
        self.ttl = int(data.get("ttl") or 0)
        self.identity = str(data.get("identity") or "")
        self.identity_url = str(data.get("identity_url") or "")
        self.authorizations: list[tuple[re.Pattern, list[re.Pattern], list[str]]] = []
        for auth in data.get("authorizations") or []:
            perms = list(auth.get("permissions") or [])
            for p in perms:
                if p not in ("subscribe", "publish"):
                    raise ValueError(f"unknown permission {p}")
            try:
                topic_re = re.compile(auth.get("topic") or "")
                chan_res = [re.compile(c) for c in auth.get("channels") or []]
            except re.error as exc:
                raise ValueError(f"unable to compile regex {exc}") from exc
            self.authorizations.append((topic_re, chan_res, perms))
        if self.ttl <= 0:
            raise ValueError(f"invalid TTL {self.ttl} (must be >0)")
        self.expires = now + self.ttl

    def is_allowed(self, topic: str, channel: str) -> bool:
        for topic_re, chan_res, perms in self.authorizations:
            if channel:
                if "subscribe" not in perms:
                    continue
            elif "publish" not in perms:
                continue
            if not topic_re.search(topic):
                continue
            if any(c.search(channel) for c in chan_res):
                return True
        return False


async def _http_get_json(url: str, connect_timeout: float, timeout: float) -> Any:
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
        body = _dechunk(body)
    if status != 200:
        raise ValueError(f"got response {status} {body!r}")
    return json.loads(body)


def _dechunk(data: bytes) -> bytes:
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


# --------------------------------------------------------------------------------------------
# The client connection


_IDENTIFY_FIELDS: dict[str, str] = {
    "client_id": "str",
    "hostname": "str",
    "heartbeat_interval": "int",
    "output_buffer_size": "int",
    "output_buffer_timeout": "int",
    "feature_negotiation": "bool",
    "tls_v1": "bool",
    "deflate": "bool",
    "deflate_level": "int",
    "snappy": "bool",
    "sample_rate": "int32",
    "user_agent": "str",
    "msg_timeout": "int",
}


def _decode_identify(body: bytes) -> dict[str, Any]:
    data = json.loads(body.decode("utf-8", "replace"))
    out: dict[str, Any] = {}
    if data is None:
        return out
    if not isinstance(data, dict):
        raise ValueError("not an object")
    error = None
    for key, value in data.items():
        name = key if key in _IDENTIFY_FIELDS else key.lower()
        kind = _IDENTIFY_FIELDS.get(name)
        if kind is None or value is None:
            continue
        if kind == "str":
            ok = isinstance(value, str)
        elif kind == "bool":
            ok = isinstance(value, bool)
        else:
            ok = isinstance(value, int) and not isinstance(value, bool)
            if ok and kind == "int32":
                ok = -(2**31) <= value < 2**31
            elif ok:
                ok = -(2**63) <= value < 2**63
        if ok:
            out[name] = value
        elif error is None:
            error = ValueError(f"cannot unmarshal {key}")
    if error is not None:
        raise error
    return out


class ClientConn(asyncio.Protocol):
    """One TCP client of nsqd speaking protocol V2."""

    def __init__(self, nsqd: NSQD):
        self.nsqd = nsqd
        self.opts = nsqd.opts
        self.loop = nsqd.loop
        self.id = nsqd.next_client_id()
        self.transport: asyncio.BaseTransport | None = None
        self.raw_transport: asyncio.BaseTransport | None = None
        self.buf = bytearray()
        self.pos = 0
        self.state = _STATE_MAGIC
        self.closed = False
        self.blocked = False
        self.write_paused = False
        self.out: list[bytes] = []
        self.flush_scheduled = False
        self.compress = None
        self.decompress = None
        self.remote = ""
        self.remote_ip = ""
        self.client_id = ""
        self.hostname = ""
        self.user_agent = ""
        self.heartbeat_interval = self.opts.client_timeout / 2
        self.output_buffer_size = 16 * 1024
        self.output_buffer_timeout = self.opts.output_buffer_timeout
        self.msg_timeout = self.opts.msg_timeout
        self.sample_rate = 0
        self.tls = False
        self.snappy = False
        self.deflate = False
        self.rdy = 0
        self.in_flight_count = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts: dict[str, int] = {}
        self.connect_ts = int(time.time())
        self.channel: Channel | None = None
        self.in_ready = False
        self.auth_secret = ""
        self.auth_state: AuthState | None = None
        self._auth_result: AuthState | Exception | None = None
        self.last_cmd = 0.0
        self._hb_timer: asyncio.TimerHandle | None = None
        self._hb_next = 0.0
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._pending_task: asyncio.Task | None = None
        self._mpub_progress: tuple[int, int, int, list[bytes]] | None = None

    # -- asyncio callbacks

    def connection_made(self, transport):
        self.transport = self.raw_transport = transport
        peer = transport.get_extra_info("peername")
        if peer:
            self.remote_ip = peer[0]
            self.remote = f"{peer[0]}:{peer[1]}"
            self.client_id = self.hostname = peer[0]
        self.nsqd.conns.add(self)
        self.last_cmd = self.loop.time()
        if self.nsqd.stalled:
            transport.pause_reading()

    def connection_lost(self, exc):
        self._teardown()

    def pause_writing(self):
        self.write_paused = True

    def resume_writing(self):
        self.write_paused = False
        if self.channel is not None:
            self.channel.client_maybe_ready(self)

    def data_received(self, data):
        if self.closed:
            return
        if self.decompress is not None:
            try:
                data = self.decompress(data)
            except Exception:
                log.info("[%s] failed to decompress input; closing", self.remote)
                self.close()
                return
        self.buf += data
        if not self.blocked and not self.nsqd.stalled:
            self.process()

    def eof_received(self):
        return False

    # -- lifecycle

    def _teardown(self) -> None:
        if self.closed and self.transport is None:
            return
        self.closed = True
        for timer in (self._hb_timer, self._deadline_timer):
            if timer is not None:
                timer.cancel()
        self._hb_timer = self._deadline_timer = None
        if self._pending_task is not None and not self._pending_task.done():
            self._pending_task.cancel()
        self.nsqd.conns.discard(self)
        channel = self.channel
        if channel is not None:
            channel.remove_client(self)
        self.transport = None
        self.out.clear()

    def close(self) -> None:
        """Flush what is queued and close (nsqd closing the connection)."""
        if self.transport is None:
            return
        if self.out and not self.nsqd.stalled:
            self._write_out()
        transport = self.transport
        self.closed = True
        transport.close()
        self._teardown()

    def abort(self) -> None:
        """Drop the connection at once, nothing flushed."""
        transport = self.transport
        if transport is None:
            return
        self.closed = True
        transport.abort()
        self._teardown()

    def resume(self) -> None:
        """Continue after the node is unstalled."""
        if self.transport is None:
            return
        self.last_cmd = self.loop.time()
        if not self.blocked:
            self.transport.resume_reading()
        if self.out:
            self.nsqd.schedule_flush(self)
        if self.state != _STATE_MAGIC:
            self._arm_deadline()
        if not self.blocked:
            self.process()

    # -- output

    def write(self, data: bytes) -> None:
        self.out.append(data)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.nsqd.schedule_flush(self)

    def write_parts(self, a: bytes, b: bytes, c: bytes) -> None:
        out = self.out
        out.append(a)
        out.append(b)
        out.append(c)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.nsqd.schedule_flush(self)

    def flush(self) -> None:
        self.flush_scheduled = False
        if self.transport is None or not self.out or self.nsqd.stalled:
            return
        self._write_out()

    def _write_out(self) -> None:
        data = b"".join(self.out)
        self.out.clear()
        if self.compress is not None:
            data = self.compress(data)
        self.transport.write(data)

    def send_response(self, data: bytes) -> None:
        self.write(encode_frame(FRAME_TYPE_RESPONSE, data))

    def send_error(self, body: bytes) -> None:
        self.write(encode_frame(FRAME_TYPE_ERROR, body))

    # -- timers

    def _start_heartbeats(self) -> None:
        if self._hb_timer is not None:
            self._hb_timer.cancel()
            self._hb_timer = None
        if self.heartbeat_interval > 0:
            # absolute ticks, like Go's time.Ticker (no drift)
            self._hb_next = self.loop.time() + self.heartbeat_interval
            self._hb_timer = self.loop.call_at(self._hb_next, self._heartbeat)

    def _heartbeat(self) -> None:
        self._hb_timer = None
        if self.transport is None:
            return
        if not self.nsqd.stalled:
            self.write(_HEARTBEAT_FRAME)
        now = self.loop.time()
        self._hb_next += self.heartbeat_interval
        if self._hb_next <= now:  # fell behind (e.g. stalled): skip missed ticks
            self._hb_next = now + self.heartbeat_interval
        self._hb_timer = self.loop.call_at(self._hb_next, self._heartbeat)

    def _arm_deadline(self) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        if self.heartbeat_interval > 0 and self.transport is not None:
            self._deadline_timer = self.loop.call_at(
                self.last_cmd + 2 * self.heartbeat_interval, self._check_deadline
            )

    def _check_deadline(self) -> None:
        self._deadline_timer = None
        if self.transport is None or self.heartbeat_interval <= 0:
            return
        if self.nsqd.stalled:
            return  # re-armed on resume
        due = self.last_cmd + 2 * self.heartbeat_interval
        if self.loop.time() >= due - 1e-6:
            log.info(
                "[%s] read deadline passed (no command in %.3fs); closing",
                self.remote,
                2 * self.heartbeat_interval,
            )
            self.close()
            return
        self._deadline_timer = self.loop.call_at(due, self._check_deadline)

    # -- input

    def process(self) -> None:
        """Run every complete command in the buffer."""
        if self.closed or self.blocked:
            return
        buf = self.buf
        pos = self.pos
        if self.state == _STATE_MAGIC:
            if len(buf) - pos < 4:
                return
            magic = bytes(buf[pos : pos + 4])
            if magic != b"  V2":
                log.info("client(%s) bad protocol magic %r", self.remote, magic)
                self.write(encode_frame(FRAME_TYPE_ERROR, b"E_BAD_PROTOCOL"))
                self.close()
                return
            pos += 4
            self.state = STATE_INIT
            self.last_cmd = self.loop.time()
            self._start_heartbeats()
            self._arm_deadline()
        handlers = self._handlers
        tls_required = self.opts.tls_required
        ran = False
        try:
            while not self.closed and not self.blocked:
                nl = buf.find(b"\n", pos)
                if nl < 0:
                    if len(buf) - pos >= _LINE_LIMIT:
                        log.info("[%s] command line too long; closing", self.remote)
                        self.pos = pos
                        self.close()
                        return
                    break
                end = nl
                if end > pos and buf[end - 1] == 13:
                    end -= 1
                params = bytes(buf[pos:end]).split(b" ")
                handler = handlers.get(params[0])
                try:
                    if tls_required and not self.tls and params[0] != b"IDENTIFY":
                        raise FatalClientError(
                            "E_INVALID",
                            b"cannot " + params[0] + b" in current state (TLS required)",
                        )
                    if handler is None:
                        raise FatalClientError("E_INVALID", b"invalid command " + params[0])
                    nxt = handler(self, params, nl + 1)
                except FatalClientError as err:
                    ran = True
                    self.send_error(err.frame_body())
                    if err.fatal:
                        log.info("[%s] fatal error %s", self.remote, err.frame_body()[:200])
                        self.pos = pos
                        self.close()
                        return
                    pos = nl + 1
                    continue
                if nxt < 0:
                    break  # _NEED_MORE or _BLOCKED: run this command again later
                ran = True
                pos = nxt
        finally:
            if self.transport is not None:
                if pos >= len(buf):
                    buf.clear()
                    pos = 0
                elif pos > 65536:
                    del buf[:pos]
                    pos = 0
                self.pos = pos
                if ran:
                    self.last_cmd = self.loop.time()
                    # answer what this chunk asked at once (deliveries follow in _run)
                    if self.out and not self.nsqd.stalled and not self.blocked:
                        self._write_out()

    def _read_size(self, start: int) -> int | None:
        if len(self.buf) < start + 4:
            return None
        return _I32.unpack_from(self.buf, start)[0]

    def _read_body(self, cmd: str, end: int) -> int | None:
        """End offset of the size-prefixed IDENTIFY/AUTH body at ``end``, or None while it is
        incomplete; a size over ``max_body_size`` or not positive is E_BAD_BODY."""
        size = self._read_size(end)
        if size is None:
            return None
        max_body = self.opts.max_body_size
        if size > max_body:
            raise FatalClientError("E_BAD_BODY", f"{cmd} body too big {size} > {max_body}")
        if size <= 0:
            raise FatalClientError("E_BAD_BODY", f"{cmd} invalid body size {size}")
        after = end + 4 + size
        if len(self.buf) < after:
            return None
        return after

    def _read_message_body(self, cmd: str, end: int) -> int | None:
        """End offset of the size-prefixed PUB/DPUB message body at ``end``, or None while it is
        incomplete; a size not positive or over ``max_msg_size`` is E_BAD_MESSAGE."""
        size = self._read_size(end)
        if size is None:
            return None
        if size <= 0:
            raise FatalClientError("E_BAD_MESSAGE", f"{cmd} invalid message body size {size}")
        max_msg = self.opts.max_msg_size
        if size > max_msg:
            raise FatalClientError("E_BAD_MESSAGE", f"{cmd} message too big {size} > {max_msg}")
        after = end + 4 + size
        if len(self.buf) < after:
            return None
        return after

    @staticmethod
    def _publish_topic(cmd: str, params: list, min_params: int, quirk: str = "") -> str:
        """The topic name a PUB/MPUB/DPUB names; ``quirk`` prefixes the E_BAD_TOPIC text (nsqd
        repeats the code in MPUB's)."""
        if len(params) < min_params:
            raise FatalClientError("E_INVALID", f"{cmd} insufficient number of parameters")
        topic_name = params[1].decode("utf-8", "surrogateescape")
        if not valid_topic_name(topic_name):
            raise FatalClientError(
                "E_BAD_TOPIC", f"{quirk}{cmd} topic name {go_quote(params[1])} is not valid"
            )
        return topic_name

    # -- commands

    def _cmd_nop(self, params, end):
        return end

    def _cmd_identify(self, params, end):
        if self.state != STATE_INIT:
            raise FatalClientError("E_INVALID", "cannot IDENTIFY in current state")
        after = self._read_body("IDENTIFY", end)
        if after is None:
            return _NEED_MORE
        body = bytes(self.buf[end + 4 : after])
        try:
            data = _decode_identify(body)
        except ValueError as exc:
            raise FatalClientError("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from exc
        self._apply_identify(data)
        if not data.get("feature_negotiation"):
            self.write(_OK_FRAME)
            return after
        opts = self.opts
        tls_v1 = self.nsqd.ssl_context is not None and bool(data.get("tls_v1"))
        deflate = opts.deflate and bool(data.get("deflate"))
        deflate_level = 6
        if deflate and data.get("deflate_level", 0) > 0:
            deflate_level = data["deflate_level"]
        deflate_level = min(deflate_level, opts.max_deflate_level)
        snappy_on = opts.snappy and bool(data.get("snappy"))
        if deflate and snappy_on:
            raise FatalClientError(
                "E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression"
            )
        reply = {
            "max_rdy_count": opts.max_rdy_count,
            "version": VERSION,
            "max_msg_timeout": _ms(opts.max_msg_timeout),
            "msg_timeout": _ms(self.msg_timeout),
            "tls_v1": tls_v1,
            "deflate": deflate,
            "deflate_level": deflate_level,
            "max_deflate_level": opts.max_deflate_level,
            "snappy": snappy_on,
            "sample_rate": self.sample_rate,
            "auth_required": self.nsqd.auth_enabled,
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": _ms(self.output_buffer_timeout),
        }
        self.write(encode_frame(FRAME_TYPE_RESPONSE, go_json(reply)))
        if not (tls_v1 or deflate or snappy_on):
            return after
        # Upgrade: everything queued goes out in the clear first; bytes already received
        # after the IDENTIFY belong to the upgraded stream.
        self._write_out()
        self.flush_scheduled = False
        rest = bytes(self.buf[after:])
        del self.buf[after:]
        if tls_v1:
            self.blocked = True
            self.transport.pause_reading()
            self._pending_task = self.loop.create_task(
                self._upgrade_tls(rest, snappy_on, deflate, deflate_level)
            )
            return after
        self._upgrade_compression(snappy_on, deflate, deflate_level)
        if rest:
            self.buf += self.decompress(rest)
        return after

    def _apply_identify(self, data: dict[str, Any]) -> None:
        opts = self.opts
        self.client_id = data.get("client_id", "")
        self.hostname = data.get("hostname", "")
        self.user_agent = data.get("user_agent", "")
        hb = data.get("heartbeat_interval", 0)
        if hb == -1:
            self.heartbeat_interval = 0
        elif hb == 0:
            pass
        elif 1000 <= hb <= _ms(opts.max_heartbeat_interval):
            self.heartbeat_interval = hb / 1000
        else:
            raise FatalClientError("E_BAD_BODY", f"IDENTIFY heartbeat interval ({hb}) is invalid")
        obt = data.get("output_buffer_timeout", 0)
        if obt == -1:
            self.output_buffer_timeout = 0
        elif obt == 0:
            pass
        elif _ms(opts.min_output_buffer_timeout) <= obt <= _ms(opts.max_output_buffer_timeout):
            self.output_buffer_timeout = obt / 1000
        else:
            raise FatalClientError(
                "E_BAD_BODY", f"IDENTIFY output buffer timeout ({obt}) is invalid"
            )
        obs = data.get("output_buffer_size", 0)
        if obs == -1:
            self.output_buffer_size = 1
            self.output_buffer_timeout = 0
        elif obs == 0:
            pass
        elif 64 <= obs <= opts.max_output_buffer_size:
            self.output_buffer_size = obs
        else:
            raise FatalClientError("E_BAD_BODY", f"IDENTIFY output buffer size ({obs}) is invalid")
        rate = data.get("sample_rate", 0)
        if rate < 0 or rate > 99:
            raise FatalClientError("E_BAD_BODY", f"IDENTIFY sample rate ({rate}) is invalid")
        self.sample_rate = rate
        mt = data.get("msg_timeout", 0)
        if mt == 0:
            pass
        elif 1000 <= mt <= _ms(opts.max_msg_timeout):
            self.msg_timeout = mt / 1000
        else:
            raise FatalClientError("E_BAD_BODY", f"IDENTIFY msg timeout ({mt}) is invalid")
        # nsqd restarts the heartbeat ticker with the negotiated interval
        self._start_heartbeats()
        self._arm_deadline()

    async def _upgrade_tls(self, rest: bytes, snappy_on: bool, deflate: bool, level: int):
        try:
            if rest:
                raise ConnectionError("client sent data before the TLS handshake")
            transport = await self.loop.start_tls(
                self.transport,
                self,
                self.nsqd.ssl_context,
                server_side=True,
                ssl_handshake_timeout=5.0,
            )
        except (Exception, asyncio.CancelledError) as exc:
            log.info("[%s] TLS upgrade failed: %s", self.remote, exc)
            if self.transport is not None:
                self.abort()
            return
        if self.closed or transport is None:
            return
        self.transport = transport
        self.tls = True
        self.write(_OK_FRAME)
        self._write_out()
        self.flush_scheduled = False
        if snappy_on or deflate:
            self._upgrade_compression(snappy_on, deflate, level)
        self.blocked = False
        self._pending_task = None
        if self.buf and self.decompress is not None and self.pos < len(self.buf):
            # bytes that arrived over TLS while we were upgrading are compressed already
            pending = bytes(self.buf[self.pos :])
            del self.buf[self.pos :]
            self.buf += self.decompress(pending)
        self.process()

    def _upgrade_compression(self, snappy_on: bool, deflate: bool, level: int) -> None:
        if snappy_on:
            import snappy as _snappy  # python-snappy (framed stream)

            comp = _snappy.StreamCompressor()
            decomp = _snappy.StreamDecompressor()
            self.compress = comp.compress
            self.decompress = decomp.decompress
            self.snappy = True
        else:
            comp = zlib.compressobj(level, zlib.DEFLATED, -15)
            decomp = zlib.decompressobj(-15)

            def compress(data: bytes, _c=comp) -> bytes:
                return _c.compress(data) + _c.flush(zlib.Z_SYNC_FLUSH)

            self.compress = compress
            self.decompress = decomp.decompress
            self.deflate = True
        self.write(_OK_FRAME)
        self._write_out()
        self.flush_scheduled = False

    # auth

    def _cmd_auth(self, params, end):
        if self.state != STATE_INIT:
            raise FatalClientError("E_INVALID", "cannot AUTH in current state")
        if len(params) != 1:
            raise FatalClientError("E_INVALID", "AUTH invalid number of parameters")
        after = self._read_body("AUTH", end)
        if after is None:
            return _NEED_MORE
        if self.auth_state is not None and self.auth_state.authorizations:
            raise FatalClientError("E_INVALID", "AUTH already set")
        if not self.nsqd.auth_enabled:
            raise FatalClientError("E_AUTH_DISABLED", "AUTH disabled")
        result = self._auth_result
        if result is None:
            self.auth_secret = bytes(self.buf[end + 4 : after]).decode("utf-8", "replace")
            self._query_auth()
            return _BLOCKED
        self._auth_result = None
        if isinstance(result, Exception):
            log.info("[%s] AUTH failed %s", self.remote, result)
            raise FatalClientError("E_AUTH_FAILED", "AUTH failed")
        self.auth_state = result
        if not result.authorizations:
            raise FatalClientError("E_UNAUTHORIZED", "AUTH no authorizations found")
        self.send_response(
            go_json(
                {
                    "identity": result.identity,
                    "identity_url": result.identity_url,
                    "permission_count": len(result.authorizations),
                }
            )
        )
        return after

    def _query_auth(self) -> None:
        self.blocked = True
        if self.transport is not None:
            self.transport.pause_reading()
        self._pending_task = self.loop.create_task(self._run_auth_query())

    async def _run_auth_query(self) -> None:
        opts = self.opts
        params = urllib.parse.urlencode(
            {
                "common_name": "",
                "remote_ip": self.remote_ip,
                "secret": self.auth_secret,
                "tls": "true" if self.tls else "false",
            }
        )
        addrs = list(opts.auth_http_address or [])
        start = random.randrange(len(addrs)) if addrs else 0
        errors = []
        result: AuthState | Exception | None = None
        for i in range(len(addrs)):
            addr = addrs[(start + i) % len(addrs)]
            url = f"{addr}?{params}" if "://" in addr else f"http://{addr}/auth?{params}"
            try:
                data = await _http_get_json(
                    url, opts.http_client_connect_timeout, opts.http_client_request_timeout
                )
                result = AuthState(data if isinstance(data, dict) else {}, self.loop.time())
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                errors.append(f"failed to auth against {addr} - {exc}")
        if result is None:
            result = ValueError("; ".join(errors) or "no auth server")
        self._auth_result = result
        self._pending_task = None
        if self.transport is None:
            return
        self.blocked = False
        if not self.nsqd.stalled:
            self.transport.resume_reading()
            self.process()

    def _check_auth(self, cmd: str, topic: str, channel: str) -> bool:
        """True when allowed; False when a refresh was started (run the command again)."""
        if not self.nsqd.auth_enabled:
            return True
        state = self.auth_state
        if state is None or not state.authorizations:
            raise FatalClientError("E_AUTH_FIRST", f"AUTH required before {cmd}")
        if state.expires <= self.loop.time():
            result = self._auth_result
            if result is None:
                self._query_auth()
                return False
            self._auth_result = None
            if isinstance(result, Exception):
                log.info("[%s] AUTH failed %s", self.remote, result)
                raise FatalClientError("E_AUTH_FAILED", "AUTH failed")
            self.auth_state = state = result
        if not state.is_allowed(topic, channel):
            raise FatalClientError(
                "E_UNAUTHORIZED",
                f"AUTH failed for {cmd} on {go_quote(topic.encode())} {go_quote(channel.encode())}",
            )
        return True

    # subscribe and flow control

    def _cmd_sub(self, params, end):
        if self.state != STATE_INIT:
            raise FatalClientError("E_INVALID", "cannot SUB in current state")
        if self.heartbeat_interval <= 0:
            raise FatalClientError("E_INVALID", "cannot SUB with heartbeats disabled")
        if len(params) < 3:
            raise FatalClientError("E_INVALID", "SUB insufficient number of parameters")
        topic_name = params[1].decode("utf-8", "surrogateescape")
        if not valid_topic_name(topic_name):
            raise FatalClientError(
                "E_BAD_TOPIC", f"SUB topic name {go_quote(params[1])} is not valid"
            )
        channel_name = params[2].decode("utf-8", "surrogateescape")
        if not valid_channel_name(channel_name):
            raise FatalClientError(
                "E_BAD_CHANNEL", f"SUB channel name {go_quote(params[2])} is not valid"
            )
        if not self._check_auth("SUB", topic_name, channel_name):
            return _BLOCKED
        topic = self.nsqd.get_topic(topic_name)
        channel = topic.get_channel(channel_name)
        err = channel.add_client(self)
        if err is not None:
            raise FatalClientError("E_SUB_FAILED", "SUB failed " + err)
        self.state = STATE_SUBSCRIBED
        self.channel = channel
        self.write(_OK_FRAME)
        return end

    def _cmd_rdy(self, params, end):
        state = self.state
        if state == STATE_CLOSING:
            return end
        if state != STATE_SUBSCRIBED:
            raise FatalClientError("E_INVALID", "cannot RDY in current state")
        count = 1
        if len(params) > 1:
            n = _base10(params[1])
            if n is None:
                raise FatalClientError("E_INVALID", b"RDY could not parse count " + params[1])
            count = _to_int64(n)
        max_rdy = self.opts.max_rdy_count
        if count < 0 or count > max_rdy:
            raise FatalClientError("E_INVALID", f"RDY count {count} out of range 0-{max_rdy}")
        self.rdy = count
        self.channel.client_maybe_ready(self)
        return end

    def _msg_id(self, params, cmd: str) -> bytes:
        if len(params) < 2:
            raise FatalClientError("E_INVALID", f"{cmd} insufficient number of params")
        msg_id = params[1]
        if len(msg_id) != 16:
            raise FatalClientError("E_INVALID", "invalid message ID")
        return msg_id

    def _cmd_fin(self, params, end):
        if self.state != STATE_SUBSCRIBED and self.state != STATE_CLOSING:
            raise FatalClientError("E_INVALID", "cannot FIN in current state")
        msg_id = self._msg_id(params, "FIN")
        channel = self.channel
        # fast path of Channel.finish()
        msg = channel.in_flight.get(msg_id)
        if msg is not None and msg.client is self:
            del channel.in_flight[msg_id]
            bucket = msg.bucket
            if bucket is not None and bucket != _IRREGULAR:
                channel.buckets[bucket].pop(msg_id, None)
            msg.bucket = None
        else:
            err = channel.finish(self, msg_id)
            raise ClientError("E_FIN_FAILED", b"FIN " + msg_id + b" failed " + err.encode())
        self.finish_count += 1
        self.in_flight_count -= 1
        if not self.in_ready:
            channel.client_maybe_ready(self)
        elif channel.queue:
            self.nsqd.mark_dirty(channel)
        return end

    def _cmd_req(self, params, end):
        if self.state != STATE_SUBSCRIBED and self.state != STATE_CLOSING:
            raise FatalClientError("E_INVALID", "cannot REQ in current state")
        if len(params) < 3:
            raise FatalClientError("E_INVALID", "REQ insufficient number of params")
        msg_id = params[1]
        if len(msg_id) != 16:
            raise FatalClientError("E_INVALID", "invalid message ID")
        n = _base10(params[2])
        if n is None:
            raise FatalClientError("E_INVALID", b"REQ could not parse timeout " + params[2])
        delay_ns = _ms_to_duration_ns(n)
        max_ns = int(round(self.opts.max_req_timeout * 1e9))
        if delay_ns < 0:
            delay_ns = 0
        elif delay_ns > max_ns:
            log.info(
                "[%s] REQ timeout %d out of range 0-%d. Setting to %d",
                self.remote,
                delay_ns,
                max_ns,
                max_ns,
            )
            delay_ns = max_ns
        err = self.channel.requeue(self, msg_id, delay_ns / 1e9)
        if err is not None:
            raise ClientError("E_REQ_FAILED", b"REQ " + msg_id + b" failed " + err.encode())
        self.requeue_count += 1
        self.in_flight_count -= 1
        self.channel.client_maybe_ready(self)
        return end

    def _cmd_touch(self, params, end):
        if self.state != STATE_SUBSCRIBED and self.state != STATE_CLOSING:
            raise FatalClientError("E_INVALID", "cannot TOUCH in current state")
        msg_id = self._msg_id(params, "TOUCH")
        err = self.channel.touch(self, msg_id, self.msg_timeout)
        if err is not None:
            raise ClientError("E_TOUCH_FAILED", b"TOUCH " + msg_id + b" failed " + err.encode())
        return end

    def _cmd_cls(self, params, end):
        if self.state != STATE_SUBSCRIBED:
            raise FatalClientError("E_INVALID", "cannot CLS in current state")
        self.rdy = 0
        self.state = STATE_CLOSING
        self.write(_CLOSE_WAIT_FRAME)
        return end

    # publishing

    def _cmd_pub(self, params, end):
        topic_name = self._publish_topic("PUB", params, 2)
        after = self._read_message_body("PUB", end)
        if after is None:
            return _NEED_MORE
        if not self._check_auth("PUB", topic_name, ""):
            return _BLOCKED
        nsqd = self.nsqd
        topic = nsqd.get_topic(topic_name)
        topic.put(Message(nsqd.guid.new(), bytes(self.buf[end + 4 : after])))
        self.pub_counts[topic_name] = self.pub_counts.get(topic_name, 0) + 1
        self.write(_OK_FRAME)
        return after

    def _cmd_mpub(self, params, end):
        topic_name = self._publish_topic("MPUB", params, 2, quirk="E_BAD_TOPIC ")
        if not self._check_auth("MPUB", topic_name, ""):
            return _BLOCKED
        nsqd = self.nsqd
        topic = nsqd.get_topic(topic_name)
        buf = self.buf
        size = self._read_size(end)
        if size is None:
            return _NEED_MORE
        if size <= 0:
            raise FatalClientError("E_BAD_BODY", f"MPUB invalid body size {size}")
        max_body = self.opts.max_body_size
        if size > max_body:
            raise FatalClientError("E_BAD_BODY", f"MPUB body too big {size} > {max_body}")
        count = self._read_size(end + 4)
        if count is None:
            return _NEED_MORE
        max_messages = (max_body - 4) // 5
        if count <= 0 or count > max_messages:
            raise FatalClientError("E_BAD_BODY", f"MPUB invalid message count {count}")
        progress = self._mpub_progress
        if progress is not None and progress[0] == end:
            _, pos, i, bodies = progress
        else:
            pos, i, bodies = end + 8, 0, []
        max_msg = self.opts.max_msg_size
        n = len(buf)
        while i < count:
            if n < pos + 4:
                self._mpub_progress = (end, pos, i, bodies)
                return _NEED_MORE
            msize = _I32.unpack_from(buf, pos)[0]
            if msize <= 0:
                self._mpub_progress = None
                raise FatalClientError(
                    "E_BAD_MESSAGE", f"MPUB invalid message({i}) body size {msize}"
                )
            if msize > max_msg:
                self._mpub_progress = None
                raise FatalClientError("E_BAD_MESSAGE", f"MPUB message too big {msize} > {max_msg}")
            if n < pos + 4 + msize:
                self._mpub_progress = (end, pos, i, bodies)
                return _NEED_MORE
            bodies.append(bytes(buf[pos + 4 : pos + 4 + msize]))
            pos += 4 + msize
            i += 1
        self._mpub_progress = None
        ts = time.time_ns()
        topic.put_many(
            [
                Message(i, b, ts)
                for i, b in zip(nsqd.guid.new_many(len(bodies)), bodies, strict=True)
            ]
        )
        self.pub_counts[topic_name] = self.pub_counts.get(topic_name, 0) + len(bodies)
        self.write(_OK_FRAME)
        return pos

    def _cmd_dpub(self, params, end):
        topic_name = self._publish_topic("DPUB", params, 3)
        n = _base10(params[2])
        if n is None:
            raise FatalClientError("E_INVALID", b"DPUB could not parse timeout " + params[2])
        delay_ns = _ms_to_duration_ns(n)
        max_ns = int(round(self.opts.max_req_timeout * 1e9))
        if delay_ns < 0 or delay_ns > max_ns:
            raise FatalClientError(
                "E_INVALID", f"DPUB timeout {n} out of range 0-{max_ns // 1_000_000}"
            )
        after = self._read_message_body("DPUB", end)
        if after is None:
            return _NEED_MORE
        if not self._check_auth("DPUB", topic_name, ""):
            return _BLOCKED
        topic = self.nsqd.get_topic(topic_name)
        msg = Message(self.nsqd.guid.new(), bytes(self.buf[end + 4 : after]))
        msg.deferred = delay_ns / 1e9
        topic.put(msg)
        self.pub_counts[topic_name] = self.pub_counts.get(topic_name, 0) + 1
        self.write(_OK_FRAME)
        return after

    _handlers = {
        b"IDENTIFY": _cmd_identify,
        b"FIN": _cmd_fin,
        b"RDY": _cmd_rdy,
        b"REQ": _cmd_req,
        b"PUB": _cmd_pub,
        b"MPUB": _cmd_mpub,
        b"DPUB": _cmd_dpub,
        b"NOP": _cmd_nop,
        b"TOUCH": _cmd_touch,
        b"SUB": _cmd_sub,
        b"CLS": _cmd_cls,
        b"AUTH": _cmd_auth,
    }

    # -- stats

    def stats(self, topic_filter: str = "") -> dict[str, Any]:
        pub_counts = []
        for topic, count in self.pub_counts.items():
            if topic_filter and topic != topic_filter:
                continue
            pub_counts.append({"topic": topic, "count": count})
            break  # nsqd 1.3 reports only one (a `break` in client_v2.go)
        out: dict[str, Any] = {
            "client_id": self.client_id,
            "hostname": self.hostname,
            "version": "V2",
            "remote_address": self.remote,
            "state": self.state if self.state >= 0 else STATE_INIT,
            "ready_count": self.rdy,
            "in_flight_count": self.in_flight_count,
            "message_count": self.message_count,
            "finish_count": self.finish_count,
            "requeue_count": self.requeue_count,
            "connect_ts": self.connect_ts,
            "sample_rate": self.sample_rate,
            "deflate": self.deflate,
            "snappy": self.snappy,
            "user_agent": self.user_agent,
        }
        state = self.auth_state
        if state is not None and state.authorizations:
            out["authed"] = True
        if state is not None and state.identity:
            out["auth_identity"] = state.identity
        if state is not None and state.identity_url:
            out["auth_identity_url"] = state.identity_url
        if pub_counts:
            out["pub_counts"] = pub_counts
        cipher = version = ""
        if self.tls and self.transport is not None:
            ssl_obj = self.transport.get_extra_info("ssl_object")
            if ssl_obj is not None:
                c = ssl_obj.cipher()
                cipher = c[0] if c else ""
                version = {
                    "TLSv1": "TLS1.0",
                    "TLSv1.1": "TLS1.1",
                    "TLSv1.2": "TLS1.2",
                    "TLSv1.3": "TLS1.3",
                }.get(ssl_obj.version() or "", "")
        out["tls"] = self.tls
        out["tls_cipher_suite"] = cipher
        out["tls_version"] = version
        out["tls_negotiated_protocol"] = ""
        out["tls_negotiated_protocol_is_mutual"] = False
        return out


# --------------------------------------------------------------------------------------------
# The node


class NSQD(Listeners):
    """One embedded nsqd node: state plus (while started) its TCP and HTTP listeners."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        opts: NSQDOptions,
        host: str = "127.0.0.1",
        tcp_port: int = 0,
        http_port: int = 0,
        lookupd_registry: dict | None = None,
    ):
        self.loop = loop
        self.opts = opts
        self.host = host
        self.tcp_port = tcp_port
        self.http_port = http_port
        node_id = opts.node_id if opts.node_id is not None else random.randrange(1024)
        self.guid = GUIDFactory(node_id)
        self.topics: dict[str, Topic] = {}
        self.conns: set[ClientConn] = set()
        self.http_conns: set = set()
        self.stalled = False
        self.running = False
        self.start_time = int(time.time())
        self.hostname = socket.gethostname()
        self.auth_enabled = bool(opts.auth_http_address)
        self.ssl_context = self._build_ssl_context()
        self.lookupd_registry = lookupd_registry if lookupd_registry is not None else {}
        self.lookup_peers: list = []
        self._client_seq = 0
        self._tcp_server: asyncio.AbstractServer | None = None
        self._http_server: asyncio.AbstractServer | None = None
        self._dirty: dict[Channel, None] = {}
        self._flush_q: list[ClientConn] = []
        self._kicked = False
        self._scan_handle: asyncio.TimerHandle | None = None
        self._scan_at = 0.0
        from .nsqd_http import NSQDHTTP

        self.http = NSQDHTTP(self)
        self.router = self.http.router

    # -- setup

    def _build_ssl_context(self) -> ssl.SSLContext | None:
        opts = self.opts
        if not (opts.tls_cert and opts.tls_key):
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(opts.tls_cert, opts.tls_key)
        if opts.tls_min_version:
            version = _TLS_VERSIONS.get(opts.tls_min_version.lower())
            if version is None:
                raise ValueError(f"unknown tls_min_version {opts.tls_min_version!r}")
            try:
                ctx.minimum_version = version
            except (ValueError, ssl.SSLError):
                pass
        policy = opts.tls_client_auth_policy
        if opts.tls_root_ca_file:
            ctx.load_verify_locations(opts.tls_root_ca_file)
        if policy == "require-verify":
            ctx.verify_mode = ssl.CERT_REQUIRED
        elif policy == "require":
            # Go's RequireAnyClientCert (no verification) has no exact ssl-module twin.
            ctx.verify_mode = ssl.CERT_REQUIRED if opts.tls_root_ca_file else ssl.CERT_OPTIONAL
        else:
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def next_client_id(self) -> int:
        self._client_seq += 1
        return self._client_seq

    async def start(self) -> None:
        """Listen (on the remembered ports after a restart) and connect to nsqlookupd."""
        from .httpserver import HTTPServerProtocol
        from .lookupd import LookupPeer

        if self.running:
            return
        self._tcp_server = await self.loop.create_server(
            lambda: ClientConn(self), self.host, self.tcp_port, reuse_address=True
        )
        self.tcp_port = self._tcp_server.sockets[0].getsockname()[1]
        try:
            self._http_server = await self.loop.create_server(
                lambda: HTTPServerProtocol(self), self.host, self.http_port, reuse_address=True
            )
        except BaseException:
            self._tcp_server.close()
            raise
        self.http_port = self._http_server.sockets[0].getsockname()[1]
        self.start_time = int(time.time())
        self.running = True
        self.stalled = False
        log.info("nsqd TCP: listening on %s", self.tcp_address)
        log.info("nsqd HTTP: listening on %s", self.http_address)
        self.lookup_peers = [LookupPeer(self, addr) for addr in self.opts.lookupd_tcp_addresses]
        for peer in self.lookup_peers:
            peer.start()
        self.wake_scanner()

    async def stop(self) -> None:
        """Close listeners and every connection; keep (non-ephemeral) data for a restart."""
        if not self.running:
            return
        self.running = False
        self.stalled = False
        for server in (self._tcp_server, self._http_server):
            if server is not None:
                server.close()
        for conn in list(self.conns):
            conn.abort()
        for conn in list(self.http_conns):
            conn.close()
        for peer in self.lookup_peers:
            await peer.stop()
        self.lookup_peers = []
        for server in (self._tcp_server, self._http_server):
            if server is not None:
                try:
                    await asyncio.wait_for(server.wait_closed(), 2.0)
                except (TimeoutError, Exception):
                    pass
        self._tcp_server = self._http_server = None
        if self._scan_handle is not None:
            self._scan_handle.cancel()
            self._scan_handle = None
        # like nsqd's Exit(): ephemeral topics/channels are not persisted; in-flight and
        # deferred messages are written back to their channel's queue.
        for name, topic in list(self.topics.items()):
            if topic.ephemeral:
                del self.topics[name]
                continue
            for cname, channel in list(topic.channels.items()):
                if channel.ephemeral:
                    del topic.channels[cname]
                    continue
                channel.flush_for_shutdown()
        self._dirty.clear()
        self._flush_q.clear()

    def set_lookupd_addresses(self, addresses: list[str]) -> None:
        """nsqd's PUT /config/nsqlookupd_tcp_addresses: connect to new peers, drop old ones."""
        from .lookupd import LookupPeer

        self.opts.lookupd_tcp_addresses = list(addresses)
        keep = []
        for peer in self.lookup_peers:
            if peer.address in addresses:
                keep.append(peer)
            else:
                self.loop.create_task(peer.stop())
        known = {p.address for p in keep}
        for addr in addresses:
            if addr not in known:
                peer = LookupPeer(self, addr)
                if self.running:
                    peer.start()
                keep.append(peer)
                known.add(addr)
        self.lookup_peers = keep

    # -- fault controls

    def drop_connections(self) -> None:
        for conn in list(self.conns):
            conn.abort()

    def stall(self) -> None:
        self.stalled = True
        for conn in list(self.conns):
            if conn.transport is not None:
                conn.transport.pause_reading()
        for conn in list(self.http_conns):
            if conn.transport is not None and not conn.closed:
                conn.transport.pause_reading()

    def unstall(self) -> None:
        if not self.stalled:
            return
        self.stalled = False
        for conn in list(self.conns):
            conn.resume()
        for conn in list(self.http_conns):
            conn.resume()
        self._kick()
        self.wake_scanner()

    def inject(self, raw: bytes) -> None:
        for conn in list(self.conns):
            if conn.transport is not None and conn.state != _STATE_MAGIC:
                conn.write(raw)

    # -- topics

    def get_topic(self, name: str) -> Topic:
        topic = self.topics.get(name)
        if topic is not None:
            return topic
        topic = Topic(self, name)
        self.topics[name] = topic
        log.debug("TOPIC(%s): created", name)
        self.notify_lookupd(topic, registering=True)
        # nsqd asks nsqlookupd which channels the topic has elsewhere and pre-creates them
        for channel_name in self._lookupd_channels(name):
            if not channel_name.endswith("#ephemeral"):
                topic.get_channel(channel_name)
        return topic

    def _lookupd_channels(self, topic: str) -> list[str]:
        names: list[str] = []
        for peer in self.lookup_peers:
            info = peer.info
            if not info or not info.get("broadcast_address"):
                continue
            key = f"{info['broadcast_address']}:{info.get('http_port')}"
            lookupd = self.lookupd_registry.get(key)
            if lookupd is None or not lookupd.running:
                continue
            for name in lookupd.db.channels_of(topic):
                if name not in names:
                    names.append(name)
        return names

    def delete_topic(self, name: str) -> bool:
        topic = self.topics.get(name)
        if topic is None:
            return False
        topic.exiting = True
        for cname in list(topic.channels):
            channel = topic.channels.pop(cname)
            channel.delete()
        topic.queue.clear()
        self.notify_lookupd(topic, registering=False)
        self.topics.pop(name, None)
        return True

    def notify_lookupd(self, obj: Topic | Channel, registering: bool) -> None:
        if not self.lookup_peers:
            return
        verb = b"REGISTER " if registering else b"UNREGISTER "
        if isinstance(obj, Channel):
            cmd = verb + obj.topic.name.encode() + b" " + obj.name.encode() + b"\n"
        else:
            cmd = verb + obj.name.encode() + b"\n"
        for peer in self.lookup_peers:
            peer.send(cmd)

    def registrations(self) -> list[bytes]:
        """The REGISTER commands nsqd sends after (re)connecting to an nsqlookupd."""
        cmds = []
        for topic in self.topics.values():
            if not topic.channels:
                cmds.append(b"REGISTER " + topic.name.encode() + b"\n")
            for channel in topic.channels.values():
                cmds.append(
                    b"REGISTER " + topic.name.encode() + b" " + channel.name.encode() + b"\n"
                )
        return cmds

    # -- scheduling

    def mark_dirty(self, channel: Channel) -> None:
        self._dirty[channel] = None
        if not self._kicked:
            self._kicked = True
            self.loop.call_soon(self._run)

    def schedule_flush(self, conn: ClientConn) -> None:
        self._flush_q.append(conn)
        if not self._kicked:
            self._kicked = True
            self.loop.call_soon(self._run)

    def _kick(self) -> None:
        if not self._kicked:
            self._kicked = True
            self.loop.call_soon(self._run)

    def _run(self) -> None:
        try:
            while (self._dirty or self._flush_q) and not self.stalled:
                dirty = self._dirty
                while dirty:
                    channel = next(iter(dirty))
                    del dirty[channel]
                    channel.pump()
                queue = self._flush_q
                self._flush_q = []
                for conn in queue:
                    if conn.flush_scheduled:
                        conn.flush()
        finally:
            self._kicked = False

    def wake_scanner(self) -> None:
        """Make sure the in-flight/deferred scan runs soon enough for the nearest deadline."""
        if not self.running:
            return
        now = self.loop.time()
        at = now + self.opts.queue_scan_interval
        handle = self._scan_handle
        if handle is not None:
            if self._scan_at <= at:
                return
            handle.cancel()
        self._scan_at = at
        self._scan_handle = self.loop.call_at(at, self._scan)

    def _scan(self) -> None:
        self._scan_handle = None
        if not self.running:
            return
        if self.stalled:
            return  # resumed by unstall()
        now = self.loop.time()
        nearest = None
        for topic in list(self.topics.values()):
            for channel in list(topic.channels.values()):
                channel.scan(now)
                d = channel.next_deadline()
                if d is not None and (nearest is None or d < nearest):
                    nearest = d
        if nearest is not None:
            at = max(nearest, now + self.opts.queue_scan_interval)
            self._scan_at = at
            self._scan_handle = self.loop.call_at(at, self._scan)

    # -- stats

    def producers(self) -> list[ClientConn]:
        return [c for c in self.conns if c.pub_counts]
