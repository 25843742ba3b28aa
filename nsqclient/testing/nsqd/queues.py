"""Topics and channels: the queues, in-flight and deferred messages, and delivery to clients.

Everything here runs on the node's event loop.  A topic keeps messages while it has no channel
(or is paused) and copies each message to every channel; a channel hands its queue to ready
clients round-robin and tracks in-flight timeouts in insertion-ordered buckets per timeout value
(O(1) FIN), clamped TOUCHes and deferred messages in heaps.  The node and the clients are seen
through the :class:`Broker` and :class:`Subscriber` protocols, so this module imports neither.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import random
import struct
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, Protocol

from ...protocol import FRAME_TYPE_MESSAGE
from .options import NSQDOptions
from .protocol_v2 import STATE_SUBSCRIBED

__all__ = [
    "Broker",
    "Subscriber",
    "Message",
    "Channel",
    "Topic",
    "IRREGULAR",
]

log = logging.getLogger("nsqclient.testing.queues")

_MSG_FRAME_HEAD = struct.Struct(">IiqH")  # size, frame type, timestamp, attempts


class Broker(Protocol):
    """What topics and channels need of their nsqd node."""

    loop: asyncio.AbstractEventLoop
    opts: NSQDOptions

    def mark_dirty(self, channel: Channel) -> None:
        """Pump ``channel`` on the next pass of the loop."""

    def wake_scanner(self) -> None:
        """Run the in-flight/deferred scan soon enough for the nearest deadline."""

    def notify_lookupd(self, obj: Topic | Channel, registering: bool) -> None:
        """Tell every nsqlookupd that ``obj`` appeared (or went away)."""

    def delete_topic(self, name: str) -> bool:
        """Delete the topic ``name``; False when there is none."""


class Subscriber(Protocol):
    """What a channel needs of a subscribed client connection."""

    id: int
    rdy: int
    in_flight_count: int
    message_count: int
    in_ready: bool
    closed: bool
    write_paused: bool

    @property
    def state(self) -> int:
        """The client's protocol state (STATE_SUBSCRIBED while it may receive)."""

    @property
    def sample_rate(self) -> int:
        """Percent of messages sent to the client (0: all)."""

    @property
    def msg_timeout(self) -> float:
        """Seconds a message sent to the client stays in flight."""

    def write_parts(self, a: bytes, b: bytes, c: bytes) -> None:
        """Queue three byte strings to be written as one frame."""

    def close(self) -> None:
        """Flush what is queued and close the connection."""

    def stats(self, topic_filter: str = "") -> dict[str, Any]:
        """The client's entry in nsqd's /stats."""


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
        self.client: Subscriber | None = None
        self.delivery_ts = 0.0
        self.deadline = 0.0
        self.bucket: float | None = None

    def copy(self) -> Message:
        m = Message(self.id, self.body, self.timestamp)
        m.deferred = self.deferred
        return m


IRREGULAR = -1.0  # bucket marker: the message sits in the channel's heap (a clamped TOUCH)


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
        self.clients: dict[int, Subscriber] = {}
        self.ready: deque[Subscriber] = deque()
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

    def start_in_flight(self, msg: Message, client: Subscriber, timeout: float, now: float):
        msg.client = client
        msg.delivery_ts = now
        msg.deadline = now + timeout
        self.in_flight[msg.id] = msg
        bucket = self.buckets.get(timeout)
        if bucket is None:
            bucket = self.buckets[timeout] = OrderedDict()
        bucket[msg.id] = msg
        msg.bucket = timeout

    def _pop_in_flight(self, client: Subscriber, msg_id: bytes) -> Message | str:
        msg = self.in_flight.get(msg_id)
        if msg is None:
            return "ID not in flight"
        if msg.client is not client:
            return "client does not own message"
        del self.in_flight[msg_id]
        self._unbucket(msg)
        return msg

    def _unbucket(self, msg: Message) -> None:
        if msg.bucket is not None and msg.bucket != IRREGULAR:
            bucket = self.buckets.get(msg.bucket)
            if bucket is not None:
                bucket.pop(msg.id, None)
        msg.bucket = None

    def finish(self, client: Subscriber, msg_id: bytes) -> str | None:
        msg = self._pop_in_flight(client, msg_id)
        return msg if isinstance(msg, str) else None

    def requeue(self, client: Subscriber, msg_id: bytes, delay: float) -> str | None:
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

    def touch(self, client: Subscriber, msg_id: bytes, timeout: float) -> str | None:
        msg = self._pop_in_flight(client, msg_id)
        if isinstance(msg, str):
            return msg
        now = self.nsqd.loop.time()
        deadline = now + timeout
        max_timeout = self.nsqd.opts.max_msg_timeout
        self.in_flight[msg.id] = msg
        if deadline - msg.delivery_ts >= max_timeout:
            msg.deadline = msg.delivery_ts + max_timeout
            msg.bucket = IRREGULAR
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
                msg.bucket == IRREGULAR
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

    def add_client(self, client: Subscriber) -> str | None:
        if self.exiting:
            return "exiting"
        if client.id in self.clients:
            return None
        limit = self.nsqd.opts.max_channel_consumers
        if limit and len(self.clients) >= limit:
            return f"consumers for {self.topic.name}:{self.name} exceeds limit of {limit}"
        self.clients[client.id] = client
        return None

    def remove_client(self, client: Subscriber) -> None:
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

    def client_maybe_ready(self, client: Subscriber) -> None:
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
    """A topic: waiting messages (while it has no channel, is paused or is still asking
    nsqlookupd which channels it has) and its channels."""

    def __init__(self, nsqd: Broker, name: str):
        self.nsqd = nsqd
        self.name = name
        self.ephemeral = name.endswith("#ephemeral")
        self.channels: dict[str, Channel] = {}
        self.queue: deque[Message] = deque()
        self.paused = False
        self.exiting = False
        #: True while the node asks nsqlookupd for this topic's channels: messages wait in the
        #: topic until then, so that every channel gets them (nsqd starts the topic's pump late)
        self.loading = False
        self._loaded_callbacks: list[Callable[[], None]] = []
        self.message_count = 0
        self.message_bytes = 0

    def when_loaded(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on the loop) once :attr:`loading` is over."""
        if self.loading:
            self._loaded_callbacks.append(callback)
        else:
            self.nsqd.loop.call_soon(callback)

    def finish_loading(self, channel_names: list[str]) -> None:
        """Create the channels nsqlookupd knows (not ephemeral ones), then let messages flow."""
        if not self.exiting:
            for name in channel_names:
                if not name.endswith("#ephemeral"):
                    self.get_channel(name)
        self.loading = False
        self.drain()
        callbacks, self._loaded_callbacks = self._loaded_callbacks, []
        for callback in callbacks:
            callback()

    def put(self, msg: Message) -> None:
        self.message_count += 1
        self.message_bytes += len(msg.body)
        if self.channels and not self.paused and not self.loading:
            self._distribute(msg)
        else:
            self.queue.append(msg)

    def put_many(self, msgs: list[Message]) -> None:
        """Like put() for each message, with the common cases done in bulk."""
        self.message_count += len(msgs)
        self.message_bytes += sum(len(m.body) for m in msgs)
        channels = self.channels
        if not channels or self.paused or self.loading:
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
        while self.queue and self.channels and not self.paused and not self.loading:
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
