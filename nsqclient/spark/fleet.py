"""The source's Consumers: enough connections per nsqd to hold ``max_in_flight`` messages.

nsqd caps the RDY of one connection at its ``--max-rdy-count`` (2500 by default), so one
Consumer (one connection per nsqd) can hold at most that many messages per nsqd, whatever its
``max_in_flight``.  A micro-batch holds what the source holds, and every batch costs Spark a
fixed ~150 ms, so the source's rate is about its batch size over that: the cap was the
source's ceiling.  :class:`Fleet` runs ``k = ceil(max_in_flight / max_rdy_count)``
Consumers on the same topic and channel (nsqd spreads a channel's messages over every
connection subscribed to it), each with ``max_in_flight / k``, and adds Consumers when an nsqd
announces a lower ``max_rdy_count`` than the 2500 assumed at the start.

Every Consumer is in columnar pull mode (made without a handler and with ``columnar=True``:
no worker thread, no Python object per message), and the fleet uses its public API only (see
docs/consumer.rst, "Taking messages in batches"):

* :meth:`Fleet.take` takes what every Consumer received, all at once
  (``consumer.take_batches()``: one :class:`~nsqclient.consumer.MessageBatch` per socket read),
  already through the give-up at ``max_tries``, youzan's ordered-offset check and tracing;
* :meth:`Fleet.finish`, :meth:`Fleet.requeue` and :meth:`Fleet.touch` answer many batches
  with one write per connection (``finish_batches()`` / ``requeue_batches()`` /
  ``touch_batches()`` on the Consumer that received them: ``batch.consumer``), with the
  Consumer's own claim, counters, RDY refill and backoff.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from ..consumer import ConnectionCounts, Consumer, MessageBatch

__all__ = ["Fleet", "DEFAULT_MAX_RDY_COUNT", "split"]

logger = logging.getLogger("nsqclient.spark.fleet")

#: nsqd's default --max-rdy-count: assumed until a connection says otherwise
DEFAULT_MAX_RDY_COUNT = 2500


def split(total: int, parts: int) -> list[int]:
    """``total`` spread over ``parts`` as evenly as integers allow (the first ones get the
    remainder)."""
    share, extra = divmod(total, parts)
    return [share + (1 if i < extra else 0) for i in range(parts)]


class Fleet:
    """``k`` pull-mode Consumers on one topic/channel, holding ``max_in_flight`` in all.

    Messages are taken with :meth:`take` and answered with :meth:`finish` / :meth:`requeue`
    (or each on its own: ``message.touch()``, ``message.requeue()``).

    Args:
        topic, channel: what to consume.
        max_in_flight: messages held at most, across every Consumer.
        nsqd_tcp_addresses, lookupd_http_addresses: where (as for a Consumer).
        options: the other Consumer options (``max_in_flight`` among them is ignored).
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        max_in_flight: int,
        nsqd_tcp_addresses: Sequence[str] | None = None,
        lookupd_http_addresses: Sequence[str] | None = None,
        **options: Any,
    ):
        self.topic = topic
        self.channel = channel
        self.max_in_flight = max_in_flight
        self._addresses = list(nsqd_tcp_addresses or []) or None
        self._lookupds = list(lookupd_http_addresses or []) or None
        self._options = {k: v for k, v in options.items() if k != "max_in_flight"}
        self._lock = threading.Lock()
        self._consumers: list[Consumer] = []
        self._max_rdy_count = DEFAULT_MAX_RDY_COUNT
        self._stopped = False

    @property
    def consumers(self) -> list[Consumer]:
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

    def _new(self, max_in_flight: int) -> Consumer:
        return Consumer(
            self.topic,
            self.channel,
            None,  # pull mode
            columnar=True,
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
        """Add Consumers if an nsqd announced a lower ``max_rdy_count`` than assumed.

        Raises:
            NSQError: a Consumer stopped for good (say, nsqd refused its subscription): the
                error it stopped with, rather than what its stopping leaves behind.
        """
        for consumer in self.consumers:
            if consumer.error is not None:
                raise consumer.error
        counts = [c.max_rdy_count for c in self.connection_counts()]
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

    def take(self) -> list[MessageBatch]:
        """Every batch of messages the Consumers received and nobody took yet (each
        Consumer's in arrival order); never blocks.  Each is the caller's to answer."""
        taken: list[MessageBatch] = []
        for consumer in self.consumers:
            taken += consumer.take_batches()
        return taken

    def connection_counts(self) -> list[ConnectionCounts]:
        """Every connection's counts (RDY, ``max_rdy_count``, in flight, queued), of every
        Consumer."""
        return [counts for consumer in self.consumers for counts in consumer.connection_counts()]

    def msg_timeouts(self) -> dict[str, float]:
        """nsqd's ``msg_timeout`` (seconds) per nsqd address the fleet is connected to."""
        return {counts.address: counts.msg_timeout for counts in self.connection_counts()}

    def saturated(self) -> bool:
        """True when nsqd will send nothing more until something is answered: every
        connection with a RDY holds that many messages (and one has a RDY)."""
        seen = False
        for consumer in self.consumers:
            if consumer.is_saturated():
                seen = True
            elif any(counts.rdy > 0 for counts in consumer.connection_counts()):
                return False  # a connection nsqd may still send on
        return seen

    def finish(self, batches: Iterable[MessageBatch]) -> int:
        """FIN ``batches`` (taken from this fleet), one write per connection; return how many
        messages were finished.  A message whose connection is gone is only marked answered:
        nsqd gives it again."""
        return sum(c.finish_batches(group) for c, group in _by_consumer(batches).items())

    def requeue(
        self, batches: Iterable[MessageBatch], delay: float | None = 0.0, backoff: bool = False
    ) -> int:
        """REQ ``batches`` (taken from this fleet), one write per connection (by default with
        no delay and no backoff: what the source hands back was not processed, it did not
        fail); return how many messages were requeued."""
        return sum(
            c.requeue_batches(group, delay=delay, backoff=backoff)
            for c, group in _by_consumer(batches).items()
        )

    def touch(self, batches: Iterable[MessageBatch]) -> int:
        """TOUCH every message of ``batches`` not answered yet, one write per connection;
        return how many."""
        return sum(c.touch_batches(group) for c, group in _by_consumer(batches).items())

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
        afterwards (it follows RDY 0 on the connection) is not sent straight back.  True when
        it was."""
        with self._lock:
            self._stopped = True
            consumers = list(self._consumers)
        for consumer in consumers:
            consumer.set_max_in_flight(0)
        deadline = time.monotonic() + timeout
        pause = threading.Event()
        while any(counts.rdy for counts in self.connection_counts()):
            if time.monotonic() >= deadline:
                return False
            pause.wait(0.005)
        return True

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every Consumer, in parallel (CLS, then close: what was queued before is
        written first).  Each requeues at once what it received and nobody took (a message
        that arrives meanwhile, sent before nsqd read RDY 0 or CLS, among them), and what was
        taken and is still unanswered at the deadline."""
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
        for t in threads:
            t.join(max(deadline - time.monotonic(), 0.1))


def _by_consumer(batches: Iterable[MessageBatch]) -> dict[Consumer, list[MessageBatch]]:
    """``batches`` grouped by the Consumer that received them."""
    groups: dict[Consumer, list[MessageBatch]] = {}
    for batch in batches:
        groups.setdefault(batch.consumer, []).append(batch)
    return groups
