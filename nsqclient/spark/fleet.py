"""The source's Consumers: enough connections per nsqd to hold ``max_in_flight`` messages.

nsqd caps the RDY of one connection at its ``--max-rdy-count`` (2500 by default), so one
Consumer (one connection per nsqd) can hold at most that many messages per nsqd, whatever its
``max_in_flight``.  A micro-batch holds what the source holds, and every batch costs Spark a
fixed ~150 ms, so the source's rate is about its batch size over that: the cap was the
source's ceiling.  :class:`Fleet` runs ``k = ceil(max_in_flight / max_rdy_count)``
Consumers on the same topic and channel (nsqd spreads a channel's messages over every
connection subscribed to it), each with ``max_in_flight / k``, and adds Consumers when an nsqd
announces a lower ``max_rdy_count`` than the 2500 assumed at the start.

:class:`HoldingConsumer` is a Consumer tuned for a source that holds every message until Spark
commits it:

* no worker thread handles its messages: the reader threads leave them in the Consumer's work
  queue, and the source takes them all at once when it needs them (:meth:`HoldingConsumer.take`:
  no thread wake-up per socket read, no hand-off per message);
* :meth:`HoldingConsumer.finish_all` FINishes many messages of one connection in one write
  (one queue put instead of one per message: ~12 µs less per message under load).

Both reach into the Consumer's internals (its work queue, its counters), which is why they live
in one small class here; the Consumer's public behaviour (RDY, discovery, backoff, stop) is
unchanged.
"""

from __future__ import annotations

import itertools
import logging
import math
import operator
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..conn import Connection
from ..consumer import Consumer
from ..errors import NSQError
from ..message import Message

__all__ = ["Fleet", "HoldingConsumer", "DEFAULT_MAX_RDY_COUNT", "split"]

logger = logging.getLogger("nsqclient.spark.fleet")

_conn_of = operator.attrgetter("_conn")

#: nsqd's default --max-rdy-count: assumed until a connection says otherwise
DEFAULT_MAX_RDY_COUNT = 2500


def split(total: int, parts: int) -> list[int]:
    """``total`` spread over ``parts`` as evenly as integers allow (the first ones get the
    remainder)."""
    share, extra = divmod(total, parts)
    return [share + (1 if i < extra else 0) for i in range(parts)]


class HoldingConsumer(Consumer):
    """A Consumer whose messages are taken in bulk with :meth:`take` (each already taken
    over, as with ``enable_async``), to be answered later with :meth:`finish_all` or
    ``message.requeue()``.

    Its worker runs no handler: the reader threads leave what they receive in the work queue
    (no worker is ever waiting, so none is woken) and :meth:`take` empties it.  With
    ``max_tries``, tracing or youzan's ordered mode, messages go one by one through the
    Consumer's usual handler path (which implements those) to ``hold([message])`` instead."""

    def __init__(
        self, topic: str, channel: str, hold: Callable[[list[Message]], None], **kwargs: Any
    ):
        self._hold = hold
        super().__init__(topic, channel, self._hold_one, **kwargs)
        self.bulk = not (self._tracing or self.ordered or self._max_tries)

    def _hold_one(self, message: Message) -> None:
        message.enable_async()
        self._hold([message])

    def _work_loop(self, index: int) -> None:
        if not self.bulk:
            super()._work_loop(index)
            return
        # Never counted idle, so the reader threads never wake this thread: it only waits
        # for the Consumer to stop.
        with self._work_cond:
            while not self._workers_exit:
                self._work_cond.wait()

    def take(self) -> list[Message]:
        """Every message received and not taken yet, in arrival order (bulk mode; [] else)."""
        if not self.bulk:
            return []
        with self._work_cond:
            if not self._work:
                return []
            batch = list(self._work)
            self._work.clear()
            # Everything queued was taken: no connection has a message waiting any more.
            for conn, _ in itertools.groupby(batch, _conn_of):
                conn.queued = 0
        for message in batch:
            message._async = True
        return batch

    def finish_all(self, conn: Connection, messages: Sequence[Message]) -> None:
        """FIN ``messages`` (all received on ``conn``, none answered yet) in one write."""
        if not messages:
            return
        for message in messages:
            message._responded = True
        ids = [m.id for m in messages]
        try:
            conn.send(b"FIN " + b"\nFIN ".join(ids) + b"\n")
        except NSQError:
            logger.debug(
                "cannot FIN %d messages: connection to %s closed; nsqd will redeliver them",
                len(messages),
                conn.address,
            )
        n = len(messages)
        with self._lock:
            self._stats["finished"] += n
            conn.in_flight = max(conn.in_flight - n, 0)
            if self._backoff.level:
                now = time.monotonic()
                for _ in range(n):
                    self._backoff.record(True, now)
                self._rdy_wake.set()


class Fleet:
    """``k`` :class:`HoldingConsumer` on one topic/channel, holding ``max_in_flight`` in all.

    Args:
        topic, channel: what to consume.
        hold: ``hold(messages)``, called on a worker thread of one of the Consumers.
        max_in_flight: messages held at most, across every Consumer.
        nsqd_tcp_addresses, lookupd_http_addresses: where (as for a Consumer).
        options: the other Consumer options (``max_in_flight`` among them is ignored).
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        hold: Callable[[list[Message]], None],
        max_in_flight: int,
        nsqd_tcp_addresses: Sequence[str] | None = None,
        lookupd_http_addresses: Sequence[str] | None = None,
        **options: Any,
    ):
        self.topic = topic
        self.channel = channel
        self.max_in_flight = max_in_flight
        self._hold = hold
        self._addresses = list(nsqd_tcp_addresses or []) or None
        self._lookupds = list(lookupd_http_addresses or []) or None
        self._options = {k: v for k, v in options.items() if k != "max_in_flight"}
        self._lock = threading.Lock()
        self._consumers: list[HoldingConsumer] = []
        self._max_rdy_count = DEFAULT_MAX_RDY_COUNT
        self._stopped = False

    @property
    def consumers(self) -> list[HoldingConsumer]:
        with self._lock:
            return list(self._consumers)

    def needed(self, max_rdy_count: int) -> int:
        """Consumers needed to hold ``max_in_flight`` when one connection may hold
        ``max_rdy_count``."""
        return max(1, math.ceil(self.max_in_flight / max(1, max_rdy_count)))

    def start(self) -> None:
        """Start ``ceil(max_in_flight / 2500)`` Consumers (nsqd's default cap)."""
        with self._lock:
            self._grow(self.needed(self._max_rdy_count))

    def _new(self, max_in_flight: int) -> HoldingConsumer:
        return HoldingConsumer(
            self.topic,
            self.channel,
            self._hold,
            nsqd_tcp_addresses=self._addresses,
            lookupd_http_addresses=self._lookupds,
            max_in_flight=max_in_flight,
            **self._options,
        )

    def _grow(self, count: int) -> None:
        """Have ``count`` Consumers, sharing ``max_in_flight`` (caller holds the lock)."""
        if self._stopped or count <= len(self._consumers):
            return
        shares = split(self.max_in_flight, count)
        for consumer, share in zip(self._consumers, shares, strict=False):
            consumer.set_max_in_flight(share)
        for share in shares[len(self._consumers) :]:
            consumer = self._new(share)
            consumer.start()
            self._consumers.append(consumer)

    def adjust(self) -> None:
        """Add Consumers if an nsqd announced a lower ``max_rdy_count`` than assumed."""
        counts = [c.max_rdy_count for c in self.connections()]
        if not counts or min(counts) >= self._max_rdy_count:
            return
        with self._lock:
            lowest = min(counts)
            if lowest >= self._max_rdy_count:
                return
            self._max_rdy_count = lowest
            before = len(self._consumers)
            self._grow(self.needed(lowest))
            if len(self._consumers) > before:
                logger.info(
                    "nsqd's max_rdy_count is %d: %d connections per nsqd hold max_in_flight %d",
                    lowest,
                    len(self._consumers),
                    self.max_in_flight,
                )

    def take(self) -> list[Message]:
        """Every message the Consumers received and nobody took yet."""
        taken: list[Message] = []
        for consumer in self.consumers:
            taken += consumer.take()
        return taken

    def connections(self) -> list[Connection]:
        """Every connection of every Consumer."""
        return [conn for consumer in self.consumers for conn in consumer.connections()]

    def saturated(self) -> bool:
        """True when nsqd will send nothing more until something is answered: every
        connection with a RDY holds that many messages."""
        conns = [c for c in self.connections() if c.rdy > 0]
        return bool(conns) and all(c.in_flight >= c.rdy for c in conns)

    def finish(self, messages: Sequence[Message]) -> None:
        """FIN ``messages`` (received by this fleet, none answered yet), one write per
        connection.  A message whose connection is gone is only marked answered: nsqd gives
        it again."""
        if not messages:
            return
        # Messages come in runs from one connection (one socket read each): group the runs.
        groups: dict[Connection, list[Message]] = {}
        for conn, run in itertools.groupby(messages, _conn_of):
            group = groups.get(conn)
            if group is None:
                groups[conn] = list(run)
            else:
                group.extend(run)
        owners = {conn: consumer for consumer in self.consumers for conn in consumer.connections()}
        for conn, group in groups.items():
            owner = owners.get(conn)
            if owner is None:
                for message in group:
                    message._responded = True
                logger.debug(
                    "cannot FIN %d messages: their connection is gone; nsqd will redeliver them",
                    len(group),
                )
                continue
            owner.finish_all(conn, group)

    def stats(self) -> dict[str, Any]:
        """The Consumers' counters added up, and how many there are."""
        totals: dict[str, Any] = {"consumers": 0, "connections": 0}
        for consumer in self.consumers:
            stats = consumer.stats()
            totals["consumers"] += 1
            totals["connections"] += len(stats.pop("connections", {}))
            for key, value in stats.items():
                if isinstance(value, int) and key not in ("backoff_level", "max_in_flight"):
                    totals[key] = totals.get(key, 0) + value
        return totals

    def pause(self, timeout: float = 2.0) -> bool:
        """RDY 0 on every connection (no Consumer grows back until :meth:`stop`); wait up to
        ``timeout`` seconds for it to be queued on every connection, so that a REQ written
        afterwards is not sent straight back.  True when it was."""
        with self._lock:
            self._stopped = True
            consumers = list(self._consumers)
        for consumer in consumers:
            consumer.set_max_in_flight(0)
        deadline = time.monotonic() + timeout
        pause = threading.Event()
        while any(conn.rdy for conn in self.connections()):
            if time.monotonic() >= deadline:
                return False
            pause.wait(0.005)
        return True

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every Consumer (CLS, then close: what was queued before is written first).
        A message that arrives meanwhile (sent before nsqd read RDY 0 or CLS) is requeued."""
        with self._lock:
            self._stopped = True
            consumers = list(self._consumers)
        deadline = time.monotonic() + timeout
        threads = [
            threading.Thread(
                target=consumer.stop,
                args=(max(deadline - time.monotonic(), 0.1),),
                name=f"nsq-spark-stop-{self.topic}/{self.channel}-{i}",
                daemon=True,
            )
            for i, consumer in enumerate(consumers)
        ]
        for t in threads:
            t.start()
        pause = threading.Event()
        while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
            for message in self.take():
                message.requeue(delay=0, backoff=False)
            pause.wait(0.02)
        for t in threads:
            t.join(max(deadline - time.monotonic(), 0.1))
