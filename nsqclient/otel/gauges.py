"""The observable instruments, read when the metrics are collected: the conventions' message
counters (``messaging.client.sent.messages``, ``messaging.client.consumed.messages``, counted in
a :class:`Tally`), and what an operator watches: per connection of every Consumer its RDY and
messages in flight, per Consumer its backoff level and connections, per Producer the publishes
waiting for nsqd's answer, and the reconnects of both.

The clients measured are those the instrumentation's observer is attached to (see
:class:`Watched`): every Consumer and Producer alive while instrumented, made before
``instrument()`` or after, until it stops or closes.  The callbacks read their public
``Consumer.connection_counts()``, ``Consumer.stats()`` and ``Producer.stats()`` at each
collection.
"""

from __future__ import annotations

import operator
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation

from ..consumer import Consumer
from ..producer import Producer
from . import names as n

__all__ = [
    "register",
    "activate",
    "Watched",
    "Tally",
    "ThreadTally",
    "MESSAGE_COUNTERS",
    "CONSUMER_GAUGES",
    "PRODUCER_GAUGES",
]

#: (name, kind, unit, description) of the conventions' message counters
MESSAGE_COUNTERS = (
    (
        n.SENT_MESSAGES,
        "counter",
        "{message}",
        "Number of messages producer attempted to send to the broker.",
    ),
    (
        n.CONSUMED_MESSAGES,
        "counter",
        "{message}",
        "Number of messages that were delivered to the application.",
    ),
)
#: the same for the Consumer's instruments
CONSUMER_GAUGES = (
    ("nsq.consumer.connections", "updown", "{connection}", "nsqd connections subscribed."),
    ("nsq.consumer.rdy", "updown", "{message}", "RDY count last sent, per connection."),
    (
        "nsq.consumer.in_flight",
        "updown",
        "{message}",
        "Messages received and not answered yet, per connection.",
    ),
    ("nsq.consumer.backoff.level", "gauge", "{level}", "Backoff level (0: full speed)."),
    (
        n.OUT_OF_ORDER,
        "counter",
        "{message}",
        "youzan, ordered: messages whose disk queue offset was below the last one seen on"
        " their partition (nsqd sent the partition again from an earlier offset).",
    ),
    (
        "nsq.consumer.reconnects",
        "counter",
        "{connection}",
        "Connections made again to an nsqd (or youzan partition) connected before.",
    ),
)
#: the same for the Producer's
PRODUCER_GAUGES = (
    (
        "nsq.producer.in_flight",
        "updown",
        "{request}",
        "Publishes written to nsqd and not answered yet, per nsqd.",
    ),
    (
        "nsq.producer.reconnects",
        "counter",
        "{connection}",
        "Connections made again to an nsqd connected before.",
    ),
)

#: one observed value and its attributes
_Value = tuple[float, dict[str, Any]]


class Watched:
    """The clients the observer is attached to, as it learns of them (``attached``,
    ``detached``, ``connection_made``), and the connections each Consumer made per
    subscription key (``"host:port"``, or ``"host:port#P"`` for youzan's partition P).

    Held weakly: a client nobody else holds is forgotten (its observers are not told then).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._consumers: weakref.WeakKeyDictionary[Consumer, dict[str, int]] = (
            weakref.WeakKeyDictionary()
        )
        self._producers: weakref.WeakSet[Producer] = weakref.WeakSet()

    def attached(self, client: Any) -> None:
        if isinstance(client, Consumer):
            # connected before it was watched: each of those counts as a first connection
            keys = [counts.key for counts in client.connection_counts()]
            with self._lock:
                known = self._consumers.setdefault(client, {})
                for key in keys:
                    known.setdefault(key, 1)
        elif isinstance(client, Producer):
            with self._lock:
                self._producers.add(client)

    def detached(self, client: Any) -> None:
        with self._lock:
            if isinstance(client, Consumer):
                self._consumers.pop(client, None)
            else:
                self._producers.discard(client)

    def connection_made(self, consumer: Any, key: str) -> None:
        with self._lock:
            counts = self._consumers.get(consumer)
            if counts is None:
                return  # detached meanwhile
            counts[key] = counts.get(key, 0) + 1

    def consumers(self) -> list[Consumer]:
        """The Consumers watched that are running."""
        with self._lock:
            consumers = list(self._consumers.keys())
        return [c for c in consumers if c.is_running]

    def connects(self) -> list[tuple[Consumer, dict[str, int]]]:
        with self._lock:
            return [(c, dict(counts)) for c, counts in self._consumers.items()]

    def producers(self) -> list[Producer]:
        with self._lock:
            producers = list(self._producers)
        return [p for p in producers if not p.closed]


class Tally:
    """A counter counted on the message path at the cost of a dict update, reported by an
    observable counter when the metrics are collected (the SDK's synchronous Counter costs a
    fifth of a span here; the data exported is the same monotonic sum)."""

    __slots__ = ("_lock", "_counts", "_interned", "_threads")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[tuple[str, Any], ...], int] = {}
        #: id(attributes) -> [attributes, count], for attribute dicts that are never changed
        #: and live as long as the instrumentation (its caches)
        self._interned: dict[int, list[Any]] = {}
        #: the counts of single threads (:meth:`for_thread`)
        self._threads: list[ThreadTally] = []

    def add(self, amount: int, attributes: dict[str, Any], interned: bool = False) -> None:
        """``Counter.add``'s signature.  ``interned``: ``attributes`` is a dict that nobody
        changes and that lives on (one of the instrumentation's cached dicts): counted by
        identity, without reading its items."""
        if interned:
            key = id(attributes)
            with self._lock:
                entry = self._interned.get(key)
                if entry is not None and entry[0] is attributes:
                    entry[1] += amount
                else:
                    if len(self._interned) >= 4096:  # (more than the caches hold: fold)
                        self._fold()
                    self._interned[key] = [attributes, amount]
            return
        items = tuple(attributes.items())
        with self._lock:
            self._counts[items] = self._counts.get(items, 0) + amount

    def for_thread(self) -> ThreadTally:
        """Counts of the calling thread alone, added to without a lock (see
        :class:`ThreadTally`), read with this tally's own."""
        counts = ThreadTally(self)
        with self._lock:
            self._fold_ended()  # (so that threads coming and going add up to nothing)
            self._threads.append(counts)
        return counts

    def add_new(self, counts: ThreadTally, amount: int, attributes: dict[str, Any]) -> None:
        """:meth:`ThreadTally.new`, on its thread."""
        entries = counts.counts
        with self._lock:  # (against a read, which goes over these counts)
            if id(attributes) in entries or len(entries) >= 4096:  # (more than caches hold)
                self._fold_entries(entries.values())
                entries.clear()
            entries[id(attributes)] = [attributes, amount]

    def _fold(self) -> None:
        """Count what is counted by identity by content instead (under the lock)."""
        self._fold_entries(self._interned.values())
        self._interned.clear()

    def _fold_entries(self, entries: Iterable[list[Any]]) -> None:
        counts = self._counts
        for attributes, count in entries:
            items = tuple(attributes.items())
            counts[items] = counts.get(items, 0) + count

    def _fold_ended(self) -> None:
        """Count what threads that ended counted as this tally's own (under the lock)."""
        live = []
        for thread_counts in self._threads:
            if thread_counts.thread.is_alive():
                live.append(thread_counts)
            else:  # nothing adds to these any more
                self._fold_entries(thread_counts.counts.values())
                thread_counts.counts.clear()
        self._threads = live

    def read(self) -> Iterator[_Value]:
        with self._lock:
            self._fold()
            self._fold_ended()
            counts = dict(self._counts)
            for thread_counts in self._threads:
                # (its thread may add meanwhile: each entry is read once, as it is then)
                for attributes, count in list(thread_counts.counts.values()):
                    items = tuple(attributes.items())
                    counts[items] = counts.get(items, 0) + count
        for key, value in counts.items():
            yield value, dict(key)


class ThreadTally:
    """One thread's counts for a :class:`Tally`, by identity of interned attribute dicts
    (``id(attributes) -> [attributes, count]``): that thread alone adds to them, without the
    lock (``entry = counts.get(id(attributes))``; when ``entry[0] is attributes``,
    ``entry[1] += amount``; else :meth:`new`).  The tally reads them as they are, and folds
    them into its own once the thread has ended."""

    __slots__ = ("tally", "thread", "counts")

    def __init__(self, tally: Tally) -> None:
        self.tally = tally
        self.thread = threading.current_thread()
        self.counts: dict[int, list[Any]] = {}

    def new(self, amount: int, attributes: dict[str, Any]) -> None:
        """Count ``attributes`` (interned) not counted yet here (or whose id was another
        dict's, since freed)."""
        self.tally.add_new(self, amount, attributes)


#: the counters of one meter provider counted as events come (they live as long as it):
#: messages sent, messages consumed, offsets gone backwards
Tallies = tuple[Tally, Tally, Tally]

_lock = threading.Lock()
#: the meter providers instruments were registered with, and their tallies (the SDK keeps an
#: instrument made twice under one name as the first one, callbacks included: register once
#: per provider)
_registered: dict[int, tuple[MeterProvider, Tallies]] = {}
#: the provider of the current instrumentation and the clients it watches; callbacks of the
#: other providers observe nothing
_active: tuple[MeterProvider, Watched] | None = None


def activate(provider: MeterProvider | None, watched: Watched | None = None) -> None:
    """Make ``provider``'s callbacks observe ``watched`` (None: none observes:
    uninstrumented)."""
    global _active
    _active = None if provider is None or watched is None else (provider, watched)


def register(meter: Meter, provider: MeterProvider) -> Tallies:
    """Create the observable instruments on ``meter``, once per ``provider``; return its
    ``messaging.client.sent.messages``, ``messaging.client.consumed.messages`` and
    ``nsq.consumer.out_of_order`` tallies."""
    with _lock:
        known = _registered.get(id(provider))
        if known is not None:
            return known[1]
        tallies = (Tally(), Tally(), Tally())
        _registered[id(provider)] = (provider, tallies)

    def observing(
        read: Callable[[Watched], Iterable[_Value]], combine: Callable[[float, float], float]
    ) -> Any:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            active = _active
            if active is None or active[0] is not provider:
                return []
            # Two Consumers of one topic/channel, or two Producers of one nsqd, add up.
            values: dict[tuple[tuple[str, Any], ...], tuple[float, dict[str, Any]]] = {}
            for value, attributes in read(active[1]):
                key = tuple(sorted(attributes.items()))
                known = values.get(key)
                values[key] = (value if known is None else combine(known[0], value), attributes)
            return [Observation(value, attributes) for value, attributes in values.values()]

        return callback

    sent, consumed, out_of_order = tallies
    readers: dict[str, Callable[[Watched], Iterable[_Value]]] = {
        n.SENT_MESSAGES: lambda watched: sent.read(),
        n.CONSUMED_MESSAGES: lambda watched: consumed.read(),
        n.OUT_OF_ORDER: lambda watched: out_of_order.read(),
        "nsq.consumer.connections": _consumer_connections,
        "nsq.consumer.rdy": lambda watched: _per_connection(watched, "rdy"),
        "nsq.consumer.in_flight": lambda watched: _per_connection(watched, "in_flight"),
        "nsq.consumer.backoff.level": _backoff_levels,
        "nsq.consumer.reconnects": _consumer_reconnects,
        "nsq.producer.in_flight": _producer_in_flight,
        "nsq.producer.reconnects": _producer_reconnects,
    }
    for name, kind, unit, description in (*MESSAGE_COUNTERS, *CONSUMER_GAUGES, *PRODUCER_GAUGES):
        callbacks = [observing(readers[name], max if kind == "gauge" else operator.add)]
        if kind == "gauge":
            meter.create_observable_gauge(name, callbacks, unit, description)
        elif kind == "updown":
            meter.create_observable_up_down_counter(name, callbacks, unit, description)
        else:
            meter.create_observable_counter(name, callbacks, unit, description)
    return tallies


# ---------------------------------------------------------------------- readers


def consumer_attributes(consumer: Consumer) -> dict[str, Any]:
    return {
        n.SYSTEM: n.SYSTEM_NAME,
        n.DESTINATION: consumer.topic,
        n.CONSUMER_GROUP: consumer.channel,
    }


def key_attributes(base: dict[str, Any], key: str) -> dict[str, Any]:
    """``base`` with the nsqd (and youzan partition) of a subscription key: ``"host:port"``,
    or ``"host:port#P"`` for partition P."""
    address, sep, part = key.rpartition("#")
    if not sep or not part.isdigit():
        address, partition = key, None
    else:
        partition = int(part)
    attributes = dict(base)
    n.add_server(attributes, address)
    if partition is not None:
        attributes[n.PARTITION] = str(partition)
    return attributes


def _consumer_connections(watched: Watched) -> Iterator[_Value]:
    for consumer in watched.consumers():
        yield (len(consumer.connection_counts()), consumer_attributes(consumer))


def _per_connection(watched: Watched, field: str) -> Iterator[_Value]:
    for consumer in watched.consumers():
        base = consumer_attributes(consumer)
        for counts in consumer.connection_counts():
            yield (getattr(counts, field), key_attributes(base, counts.key))


def _backoff_levels(watched: Watched) -> Iterator[_Value]:
    for consumer in watched.consumers():
        yield (consumer.stats()["backoff_level"], consumer_attributes(consumer))


def _consumer_reconnects(watched: Watched) -> Iterator[_Value]:
    for consumer, counts in watched.connects():
        base = consumer_attributes(consumer)
        for key, connects in counts.items():
            yield (max(connects - 1, 0), key_attributes(base, key))


def _producer_in_flight(watched: Watched) -> Iterator[_Value]:
    for producer in watched.producers():
        for entry in producer.stats()["nsqd"]:
            connection = entry["connection"]
            pending = connection["pending_requests"] if connection else 0
            yield (pending, key_attributes({n.SYSTEM: n.SYSTEM_NAME}, entry["address"]))


def _producer_reconnects(watched: Watched) -> Iterator[_Value]:
    for producer in watched.producers():
        for entry in producer.stats()["nsqd"]:
            yield (
                max(entry["connects"] - 1, 0),
                key_attributes({n.SYSTEM: n.SYSTEM_NAME}, entry["address"]),
            )
