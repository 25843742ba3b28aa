"""Observers: what a Consumer or a Producer tells about its work, for telemetry and logs.

An observer is any object with some of :class:`Observer`'s methods (subclass :class:`Observer`
to get every method as a no-op and override what you need).  Register it on one client
(``consumer.add_observer(o)``, ``producer.add_observer(o)``) or on every client, made before or
after (:func:`add_observer`); :func:`remove_observer` / ``client.remove_observer(o)`` detach it.
While no observer is registered a client makes one empty check per event and nothing else.

Events are called on the client's own threads, where the event happens: a publish on the
publishing thread, an asynchronous publish's answer on a connection's reader thread, a handler's
start and end on its worker thread, a FIN/REQ/TOUCH on the thread that answered.  An observer
must be quick, must not block and must not call back into the client it observes; an exception
it raises is logged (``nsqclient.observe``) and the client goes on.  Work that may block (an
exporter) belongs on a thread of the observer's own.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .message import Message

__all__ = [
    "Observer",
    "PublishEvent",
    "ObserverSet",
    "add_observer",
    "remove_observer",
    "global_observers",
]

logger = logging.getLogger("nsqclient.observe")


class PublishEvent:
    """One publish call (``pub``, ``mpub``, ``dpub`` or an ``*_async`` form), from
    :meth:`Observer.publish_started` to :meth:`Observer.publish_ended`.

    Attributes:
        producer: the Producer publishing.
        command: ``"PUB"``, ``"MPUB"`` or ``"DPUB"``.
        asynchronous: True for the ``*_async`` forms.
        topic: the topic (already checked).
        count: how many messages (1, or the MPUB's).
        body_size: bytes of the body (PUB, DPUB; None for MPUB).
        partition: youzan: the partition asked for (``partition=``), None otherwise; at the end,
            the partition it went to when known.
        ext: youzan: the JSON header the publish carries (a dict) or None.  At
            ``publish_started`` an observer may set it (a new dict, or a copy of the one given
            with its own keys added) when :attr:`extendable` is True: the publish then carries
            that header.
        extendable: True when an ext header may be added: a header was given, or the topic's
            route says it takes headers (youzan extend support) and nothing else (a traced
            MPUB) rules one out.
        single_nsqd: the only nsqd this publish can go to (a Producer with one address and no
            lookup), else None.
        started_at: ``time.monotonic()`` at the start.
        started_ns: ``time.time_ns()`` at the start (nanoseconds since the epoch: a span's
            start time).
        ended_at: at the end, ``time.monotonic()`` when nsqd answered or the publish failed
            (None before): ``ended_at - started_at`` is its duration in seconds.
        ended_ns: at the end, ``time.time_ns()`` at that moment (None before): a span's end
            time.
        nsqd_address: at the end, the nsqd it was written to (None if it never was).
        result: at the end, nsqd's answer (``b"OK"`` or a PublishResult) on success.
        error: at the end, the exception it failed with (None on success).
        state: a dict for the observers' own bookkeeping (keyed as they like).
    """

    __slots__ = (
        "producer",
        "command",
        "asynchronous",
        "topic",
        "count",
        "body_size",
        "partition",
        "ext",
        "extendable",
        "single_nsqd",
        "started_at",
        "started_ns",
        "ended_at",
        "ended_ns",
        "nsqd_address",
        "result",
        "error",
        "state",
    )

    def __init__(
        self,
        producer: Any,
        command: str,
        asynchronous: bool,
        topic: str,
        count: int,
        body_size: int | None,
        partition: int | None,
        ext: dict[str, Any] | None,
        extendable: bool,
        single_nsqd: str | None,
    ):
        self.producer = producer
        self.command = command
        self.asynchronous = asynchronous
        self.topic = topic
        self.count = count
        self.body_size = body_size
        self.partition = partition
        self.ext = ext
        self.extendable = extendable
        self.single_nsqd = single_nsqd
        self.started_at = time.monotonic()
        self.started_ns = time.time_ns()
        self.ended_at: float | None = None
        self.ended_ns: int | None = None
        self.nsqd_address: str | None = None
        self.result: Any = None
        self.error: BaseException | None = None
        self.state: dict[Any, Any] = {}

    def __repr__(self) -> str:
        return f"<PublishEvent {self.command} {self.topic} x{self.count}>"


class Observer:
    """Every event a client tells, as no-ops: subclass and override what you need.

    ``client`` is a :class:`~nsqclient.Consumer` or a :class:`~nsqclient.Producer` (pynsq's
    Reader and Writer are built on them); ``consumer`` a Consumer.
    """

    # -- both

    def attached(self, client: Any) -> None:
        """The observer now watches ``client`` (registered on it, or globally while it
        lives)."""

    def detached(self, client: Any) -> None:
        """The observer no longer watches ``client`` (removed, or ``client`` closed/stopped)."""

    # -- Producer

    def publish_started(self, event: PublishEvent) -> None:
        """A publish passed its input checks and is about to be sent (on the caller's
        thread).  May set ``event.ext`` (see :class:`PublishEvent`)."""

    def publish_ended(self, event: PublishEvent) -> None:
        """nsqd answered the publish, or it failed (``event.error``).  For an ``*_async``
        publish this runs where its Future completes, often a connection's reader thread."""

    # -- Consumer

    def connection_made(self, consumer: Any, key: str) -> None:
        """``consumer`` subscribed on a new connection (``key``: ``host:port``, plus
        ``#partition`` on youzan)."""

    def connection_lost(self, consumer: Any, key: str, reason: BaseException | None) -> None:
        """A connection of ``consumer`` closed."""

    def handler_started(self, consumer: Any, message: Message) -> None:
        """A handler is about to run on ``message`` (on its worker thread)."""

    def handler_ended(self, consumer: Any, message: Message, error: BaseException | None) -> None:
        """The handler returned, or raised ``error`` (a :class:`~nsqclient.RequeueMessage`
        included), on the same worker thread.  The message's FIN or REQ, when the Consumer
        sends it for the handler, came before (:meth:`messages_answered`)."""

    def messages_taken(self, consumer: Any, messages: Sequence[Message]) -> None:
        """Pull mode: ``messages`` were taken (``consumer.take()``), on the taking thread."""

    def message_out_of_order(self, consumer: Any, message: Message, last_offset: int) -> None:
        """youzan, ordered: ``message``'s disk queue offset (``message.offset``) is below
        ``last_offset``, the last one seen on its partition (``message.partition``): youzan's
        nsqd sends the partition again from an earlier offset (see docs/youzan.rst).  Told on
        the worker (or taking) thread, before the handler; ``on_out_of_order`` runs next."""

    def message_given_up(self, consumer: Any, message: Message) -> None:
        """``message`` came for more than ``max_tries`` attempts: it is given up on
        (``giving_up`` runs next, then FIN)."""

    def messages_answered(
        self,
        consumer: Any,
        messages: Sequence[Message],
        action: str,
        delay: float | None,
        backoff: bool | None,
    ) -> None:
        """``action`` (``"finish"``, ``"requeue"`` or ``"touch"``) was sent for ``messages``
        (one, or a batch answered at once), on the thread that answered.  ``delay``: the
        requeue delay in seconds; ``backoff``: whether the requeue counts as a failure."""

    def batches_taken(self, consumer: Any, batches: Sequence[Any]) -> None:
        """Columnar pull mode: ``batches`` (:class:`~nsqclient.consumer.MessageBatch`, each
        ``len()`` messages) were taken (``consumer.take_batches()``), on the taking thread."""

    def batches_answered(
        self,
        consumer: Any,
        batches: Sequence[Any],
        action: str,
        delay: float | None,
        backoff: bool | None,
    ) -> None:
        """:meth:`messages_answered` for every message of ``batches`` at once (columnar pull
        mode; a requeue with ``delay`` None used each message's default delay)."""


# ------------------------------------------------------------------------------------------------
# The registry: global observers, and the clients that call them

_lock = threading.RLock()
_global: tuple[Any, ...] = ()
_sets: weakref.WeakSet[ObserverSet] = weakref.WeakSet()


def add_observer(observer: Any) -> None:
    """Have every Consumer and Producer, made before or after, tell ``observer`` (once, even
    if added twice)."""
    global _global
    with _lock:
        if any(o is observer for o in _global):
            return
        _global = (*_global, observer)
        sets = list(_sets)
    for s in sets:
        s._refresh()
        s._tell(observer, "attached")


def remove_observer(observer: Any) -> None:
    """Undo :func:`add_observer` (nothing if it was not added)."""
    global _global
    with _lock:
        if not any(o is observer for o in _global):
            return
        _global = tuple(o for o in _global if o is not observer)
        sets = list(_sets)
    for s in sets:
        s._refresh()
        s._tell(observer, "detached")


def global_observers() -> tuple[Any, ...]:
    """The observers added with :func:`add_observer`."""
    return _global


class ObserverSet:
    """The observers of one client: the global ones and its own.  ``active`` is the tuple a
    client checks before telling anything (empty: nothing to do)."""

    __slots__ = ("_client", "_own", "active", "_closed", "__weakref__")

    def __init__(self, client: Any):
        self._client = weakref.ref(client)
        self._own: tuple[Any, ...] = ()
        self._closed = False
        with _lock:
            self.active: tuple[Any, ...] = _global
            _sets.add(self)
        for observer in self.active:
            self._tell(observer, "attached")

    def add(self, observer: Any) -> None:
        with _lock:
            if any(o is observer for o in self._own):
                return
            self._own = (*self._own, observer)
        self._refresh()
        self._tell(observer, "attached")

    def remove(self, observer: Any) -> None:
        with _lock:
            if not any(o is observer for o in self._own):
                return
            self._own = tuple(o for o in self._own if o is not observer)
        self._refresh()
        self._tell(observer, "detached")

    def close(self) -> None:
        """The client is done: tell every observer ``detached`` and stop telling anything."""
        with _lock:
            if self._closed:
                return
            self._closed = True
            observers = self.active
            self.active = ()
            _sets.discard(self)
        for observer in observers:
            self._tell(observer, "detached")

    def _refresh(self) -> None:
        with _lock:
            if self._closed:
                return
            own = tuple(o for o in self._own if not any(o is g for g in _global))
            self.active = (*_global, *own)

    def _tell(self, observer: Any, event: str) -> None:
        client = self._client()
        if client is None:
            return
        method = getattr(observer, event, None)
        if method is not None:
            try:
                method(client)
            except Exception:
                logger.exception("observer %r failed in %s", observer, event)


def tell(observers: tuple[Any, ...], event: str, *args: Any) -> None:
    """Call ``event(*args)`` on each observer that has it; log what one raises."""
    for observer in observers:
        method = getattr(observer, event, None)
        if method is None:
            continue
        try:
            method(*args)
        except Exception:
            logger.exception("observer %r failed in %s", observer, event)
