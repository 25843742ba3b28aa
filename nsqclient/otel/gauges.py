"""The observable instruments, read when the metrics are collected: the conventions' message
counters (``messaging.client.sent.messages``, ``messaging.client.consumed.messages``, counted in
a :class:`Tally`), and what an operator watches: per connection of every Consumer its RDY and
messages in flight, per Consumer its backoff level and connections, per Producer the publishes
waiting for nsqd's answer, and the reconnects of both.

The callbacks read ``Consumer.stats()`` and ``Producer.stats()`` at each collection.  The
Consumers measured are those made while instrumented, and earlier ones from their next
connection on (see :func:`track`); the Producers are all of them (the producer module keeps a
registry).
"""

from __future__ import annotations

import operator
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation

from .. import producer as producer_module
from ..consumer import Consumer
from . import names as n

__all__ = [
    "register",
    "activate",
    "track",
    "count_connect",
    "Tally",
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

_lock = threading.Lock()
#: the Consumers measured
_consumers: weakref.WeakSet[Consumer] = weakref.WeakSet()
#: per Consumer, connections made per subscription key ("host:port" or "host:port#P")
_connects: weakref.WeakKeyDictionary[Consumer, dict[str, int]] = weakref.WeakKeyDictionary()
#: the meter providers instruments were registered with, and their tallies (the SDK keeps an
#: instrument made twice under one name as the first one, callbacks included: register once
#: per provider)
_registered: dict[int, tuple[MeterProvider, Any]] = {}
#: the provider of the current instrumentation; callbacks of the others observe nothing
_active: MeterProvider | None = None


def activate(provider: MeterProvider | None) -> None:
    """Make ``provider``'s callbacks observe (None: none observes: uninstrumented)."""
    global _active
    _active = provider


def track(consumer: Consumer) -> None:
    """Measure ``consumer`` from now on."""
    with _lock:
        if consumer in _consumers:
            return
        _consumers.add(consumer)
        # connected before it was tracked: each of those counts as a first connection
        _connects[consumer] = dict.fromkeys(list(consumer._conns), 1)


def count_connect(consumer: Consumer, key: str) -> None:
    """``consumer`` subscribed to ``key`` (again, when it had been before)."""
    track(consumer)
    with _lock:
        counts = _connects.setdefault(consumer, {})
        counts[key] = counts.get(key, 0) + 1


class Tally:
    """A counter counted on the message path at the cost of a dict update, reported by an
    observable counter when the metrics are collected (the SDK's synchronous Counter costs as
    much as a span here; the data exported is the same monotonic sum)."""

    __slots__ = ("_lock", "_counts")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[tuple[str, Any], ...], int] = {}

    def add(self, amount: int, attributes: dict[str, Any]) -> None:
        """``Counter.add``'s signature."""
        key = tuple(attributes.items())
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + amount

    def read(self) -> Iterator[_Value]:
        with self._lock:
            counts = list(self._counts.items())
        for key, value in counts:
            yield value, dict(key)


#: the message counters of one meter provider (they live as long as it)
Tallies = tuple[Tally, Tally]


def register(meter: Meter, provider: MeterProvider) -> Tallies:
    """Create the observable instruments on ``meter``, once per ``provider``; return its
    ``messaging.client.sent.messages`` and ``messaging.client.consumed.messages`` tallies."""
    with _lock:
        known = _registered.get(id(provider))
        if known is not None:
            return known[1]
        tallies = (Tally(), Tally())
        _registered[id(provider)] = (provider, tallies)

    def observing(
        read: Callable[[], Iterator[_Value]], combine: Callable[[float, float], float]
    ) -> Any:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            if _active is not provider:
                return []
            # Two Consumers of one topic/channel, or two Producers of one nsqd, add up.
            values: dict[tuple[tuple[str, Any], ...], tuple[float, dict[str, Any]]] = {}
            for value, attributes in read():
                key = tuple(sorted(attributes.items()))
                known = values.get(key)
                values[key] = (value if known is None else combine(known[0], value), attributes)
            return [Observation(value, attributes) for value, attributes in values.values()]

        return callback

    sent, consumed = tallies
    readers: dict[str, Callable[[], Iterator[_Value]]] = {
        n.SENT_MESSAGES: sent.read,
        n.CONSUMED_MESSAGES: consumed.read,
        "nsq.consumer.connections": _consumer_connections,
        "nsq.consumer.rdy": lambda: _per_connection("rdy"),
        "nsq.consumer.in_flight": lambda: _per_connection("in_flight"),
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


def _running() -> list[Consumer]:
    with _lock:
        consumers = list(_consumers)
    return [c for c in consumers if c.is_running]


def _consumer_attributes(consumer: Consumer) -> dict[str, Any]:
    return {
        n.SYSTEM: n.SYSTEM_NAME,
        n.DESTINATION: consumer.topic,
        n.CONSUMER_GROUP: consumer.channel,
    }


def _key_attributes(base: dict[str, Any], key: str) -> dict[str, Any]:
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


def _consumer_connections() -> Iterator[_Value]:
    for consumer in _running():
        yield (len(consumer.connections()), _consumer_attributes(consumer))


def _per_connection(field: str) -> Iterator[_Value]:
    for consumer in _running():
        base = _consumer_attributes(consumer)
        for key, stats in consumer.stats()["connections"].items():
            yield (stats[field], _key_attributes(base, key))


def _backoff_levels() -> Iterator[_Value]:
    for consumer in _running():
        yield (consumer.stats()["backoff_level"], _consumer_attributes(consumer))


def _consumer_reconnects() -> Iterator[_Value]:
    with _lock:
        counted = [(c, dict(_connects.get(c, {}))) for c in _consumers]
    for consumer, counts in counted:
        base = _consumer_attributes(consumer)
        for key, connects in counts.items():
            yield (max(connects - 1, 0), _key_attributes(base, key))


def _producers() -> list[Any]:
    return [p for p in list(producer_module._producers) if not p.closed]


def _producer_in_flight() -> Iterator[_Value]:
    for producer in _producers():
        for entry in producer.stats()["nsqd"]:
            connection = entry["connection"]
            pending = connection["pending_requests"] if connection else 0
            yield (pending, _key_attributes({n.SYSTEM: n.SYSTEM_NAME}, entry["address"]))


def _producer_reconnects() -> Iterator[_Value]:
    for producer in _producers():
        for entry in producer.stats()["nsqd"]:
            yield (
                max(entry["connects"] - 1, 0),
                _key_attributes({n.SYSTEM: n.SYSTEM_NAME}, entry["address"]),
            )


# ---------------------------------------------------------------------- wrappers


def wrap_init(original: Callable[..., None]) -> Any:
    """``Consumer.__init__`` tracking every Consumer made while instrumented."""

    def __init__(consumer: Consumer, *args: Any, **kwargs: Any) -> None:
        original(consumer, *args, **kwargs)
        track(consumer)

    return n.wrapping(__init__, original)


def wrap_subscribe(original: Callable[..., None]) -> Any:
    """``Consumer._subscribe`` (on a connect thread) counting the connections it makes."""

    def _subscribe(consumer: Consumer, conn: Any, *args: Any, **kwargs: Any) -> None:
        original(consumer, conn, *args, **kwargs)
        info = consumer._conns.get(conn.key)
        if info is not None and info.conn is conn:
            count_connect(consumer, conn.key)

    return n.wrapping(_subscribe, original)
