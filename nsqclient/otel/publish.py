"""Publish spans and metrics, from the Producer's ``publish_started`` and ``publish_ended``
events (see :mod:`nsqclient.observe`), which every ``pub``, ``mpub``, ``dpub`` and their
``*_async`` forms tell (pynsq's :class:`~nsqclient.Writer` publishes through them).

One PRODUCER span ``publish <topic>`` per call, from the call until nsqd's answer (for the
``*_async`` forms, until the Future completes), and on youzan's extend-support topics the trace
context injected into the message's ext header (``event.ext``).  Each publish also records
``messaging.client.operation.duration`` and adds its messages to
``messaging.client.sent.messages``.  A call refused for bad input (ValueError, TypeError) sent
nothing and records nothing: the Producer checks its input before it tells ``publish_started``.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.metrics import Histogram
from opentelemetry.trace import SpanKind, Status, StatusCode

from ..observe import PublishEvent
from ..producer import PublishResult
from . import names as n
from .gauges import Tally
from .spans import SpanStarter

__all__ = ["PublishTelemetry", "Finisher", "INJECT_MODES"]

#: where a publish's trace context goes (see NSQInstrumentor.instrument's ``inject``)
INJECT_MODES = ("extend_topics", "given", "never")

logger = logging.getLogger("nsqclient.otel")

#: seconds the finisher waits, after the spans it found, for more to gather
LINGER = 0.002

#: the key of this instrumentation's bookkeeping in ``PublishEvent.state``
_STATE = "nsqclient.otel"
#: the parent of a span made later for a publish that had none (not the context of the thread
#: that makes it)
_ROOT = otel_context.Context()

_SEND = {
    n.SYSTEM: n.SYSTEM_NAME,
    n.OPERATION_TYPE: "send",
    n.OPERATION_NAME: "publish",
}


class PublishTelemetry:
    """The publish half of the instrumentation's observer, for one
    :meth:`NSQInstrumentor.instrument`."""

    def __init__(self, tracer: trace.Tracer, sent: Tally, duration: Histogram, inject: str):
        self.tracer = tracer
        self.sent = sent
        self.duration = duration
        self.inject = inject
        self.finisher = Finisher(self._end_async)
        #: starts the publish spans (the call's attributes built only when recorded)
        self._spans = SpanStarter(tracer)
        #: the metric attributes known at the start, one dict per (topic, nsqd, partition)
        self._attribute_sets: list[dict[str, Any]] = []
        #: (topic, nsqd, partition) -> its index in _attribute_sets
        self._attribute_index: dict[tuple[str, str | None, int | None], int] = {}

    def close(self, timeout: float) -> None:
        """Uninstrumented: end what the finisher holds, and join its thread."""
        self.finisher.stop(timeout)

    # ------------------------------------------------------------------ events

    def publish_started(self, event: PublishEvent) -> None:
        topic = event.topic
        cache_key = (topic, event.single_nsqd, event.partition)
        index = self._attribute_index.get(cache_key)
        if index is not None:
            attributes = self._attribute_sets[index]
        else:
            attributes = {**_SEND, n.DESTINATION: topic}
            # A Producer with one nsqd and no lookup always publishes there.
            n.add_server(attributes, event.single_nsqd)
            if event.partition is not None:
                attributes[n.PARTITION] = str(event.partition)
            if len(self._attribute_sets) < 4096:
                # (two threads may both add the same: either index is right)
                self._attribute_sets.append(attributes)
                index = self._attribute_index[cache_key] = len(self._attribute_sets) - 1
        inject = (
            event.extendable
            and self.inject != "never"
            and event.command != "DPUB"
            and (event.ext is not None or self.inject == "extend_topics")
        )
        if event.asynchronous and not inject:
            # Nothing needs this span before nsqd answers: it is made then, on the finisher's
            # thread, with the start time and the parent of now.  (A span per publish in
            # flight, all alive at once, is what the garbage collector would otherwise scan;
            # so is anything made per publish here.  Without a parent, only the cached
            # attributes' index is kept: a dict holding just an int is one the collector
            # does not track.)
            context = otel_context.get_current()
            if index is not None and not context:
                event.state[_STATE] = index
            else:
                event.state[_STATE] = (None, attributes, context or _ROOT)
            return
        span = self._start_span(event, attributes, None, None)
        token = None
        if not event.asynchronous:
            # current during the call: a lookup made for it (requests) is its child
            token = otel_context.attach(trace.set_span_in_context(span))
        if inject:
            carrier = dict(event.ext or ())
            try:
                propagate.inject(carrier, context=trace.set_span_in_context(span))
            except Exception:
                logger.debug("cannot inject the trace context", exc_info=True)
            else:
                event.ext = carrier
        event.state[_STATE] = (span, attributes, token)

    def publish_ended(self, event: PublishEvent) -> None:
        if event.asynchronous:
            if _STATE in event.state:  # (else started before instrument())
                # Its Future completed, usually on a connection's reader thread: the event
                # holds the time and the outcome; the span and the metrics (the SDK's span
                # processors, which may export there and then) are left to the finisher's
                # thread.  The event is all that waits there for it.
                self.finisher.submit(event)
            return
        started = event.state.pop(_STATE, None)
        if started is None:
            return
        otel_context.detach(started[2])
        if isinstance(event.error, ValueError | TypeError):
            # Refused for bad input during the call: nothing was sent, so it is no operation.
            # The span, started before (it may be the parent of a lookup made for it), is
            # dropped unended: no span processor ends or exports it.
            return
        self._end(event, started, None)

    def _end_async(self, event: PublishEvent) -> None:
        """An asynchronous publish's span and metrics, once it ended (on the finisher's
        thread)."""
        self._end(event, event.state.pop(_STATE), event.ended_ns)

    def _start_span(
        self,
        event: PublishEvent,
        attributes: dict[str, Any],
        parent: otel_context.Context | None,
        start_time: int | None,
    ) -> trace.Span:
        """The publish span, with the call's attributes (built only when it records)."""
        return self._spans.start(
            f"publish {event.topic}",
            SpanKind.PRODUCER,
            parent,
            attributes,
            _call_attributes,
            event,
            start_time,
        )

    def _end(
        self,
        event: PublishEvent,
        started: tuple[Any, dict[str, Any], Any] | int,
        end_time: int | None,
    ) -> None:
        if isinstance(started, int):  # an asynchronous publish's with no parent (publish_started)
            span, attributes, context = None, self._attribute_sets[started], _ROOT
        else:
            span, attributes, context = started
        # what the answer tells: where it went, and how it ended
        learnt: dict[str, Any] = {}
        if event.nsqd_address and n.SERVER_ADDRESS not in attributes:
            n.add_server(learnt, event.nsqd_address)
        if event.partition is not None and n.PARTITION not in attributes:
            learnt[n.PARTITION] = str(event.partition)
        error = event.error
        if error is not None:
            learnt[n.ERROR_TYPE] = n.error_type(error)
        if learnt:
            attributes = {**attributes, **learnt}
            if span is not None and span.is_recording():
                span.set_attributes(learnt)
        if span is None:  # an asynchronous publish's: made now (see publish_started)
            span = self._start_span(event, attributes, context, event.started_ns)
        if span.is_recording():
            result = event.result
            if isinstance(result, PublishResult) and event.count == 1:
                span.set_attribute(n.MESSAGE_ID, str(result.message_id))  # (an MPUB: its first)
            if error is not None:
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        span.end(end_time)
        # (ended_at is None only before the end is told)
        self.duration.record(event.ended_at - event.started_at, attributes)  # type: ignore[operator]
        # Bad input found after the call (an *_async publish's route, on the backlog thread)
        # fails its Future: nothing was sent, no message was attempted.
        if not isinstance(error, ValueError | TypeError):
            self.sent.add(event.count, attributes, interned=not learnt)  # (else a new dict)


def _call_attributes(event: PublishEvent) -> dict[str, Any]:
    """A publish span's attributes that come from the call: the command, and the batch's
    message count (MPUB) or the body's size."""
    if event.command == "MPUB":
        return {n.NSQ_COMMAND: "MPUB", n.BATCH_COUNT: event.count}
    if event.body_size is None:
        return {n.NSQ_COMMAND: event.command}
    return {n.NSQ_COMMAND: event.command, n.BODY_SIZE: event.body_size}


class Finisher:
    """Ends the spans of asynchronous publishes on a thread of its own (``nsq-otel``): each
    event :meth:`submit` is given goes to ``end``, the function it was made with.

    Their Futures complete on a connection's reader thread, which must never wait (it answers
    the heartbeats: docs/contributing.rst, "The threads"): a span processor that exports there
    and then (the SDK's SimpleSpanProcessor) would hold up heartbeats for as long as its
    exporter takes.  The thread takes what has gathered, then waits :data:`LINGER` for more
    (one wake-up per batch, not per answer; the spans' times were taken when nsqd answered).
    It starts with the first asynchronous publish and is joined by :meth:`stop`; after that,
    spans end where their Future completes.  What waits is the events alone (there may be
    thousands: nothing more per event for the garbage collector to go over).
    """

    def __init__(self, end: Callable[[Any], None]) -> None:
        self._end = end
        #: the events waiting; a _Flushed marks where a flush() waits; None stops the thread
        self._items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopped = False
        _finishers.add(self)

    def submit(self, item: Any) -> None:
        """Give ``item`` to ``end`` on the finisher's thread (here, once stopped)."""
        if self._thread is not None:  # (the common case, without the lock)
            self._items.put(item)
            if self._stopped:  # stopped meanwhile, perhaps done draining: drain here
                self._drain()
            return
        with self._lock:
            if not self._stopped:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="nsq-otel", daemon=True)
                    self._thread.start()
                self._items.put(item)
                return
        self._call(item)  # uninstrumented meanwhile: here, then

    def flush(self, timeout: float) -> bool:
        """Wait until the items submitted so far have been ended (up to ``timeout`` seconds);
        return True if they have."""
        if self._thread is None:
            return True
        mark = _Flushed()
        self.submit(mark)
        return mark.done.wait(timeout)

    def stop(self, timeout: float) -> None:
        with self._lock:
            self._stopped = True
            thread, self._thread = self._thread, None
        if thread is not None:
            self._items.put(None)
            thread.join(timeout)
        self._drain()

    def _drain(self) -> None:
        """End here the items left (submitted while stopping, after the thread's last one)."""
        while True:
            try:
                item = self._items.get_nowait()
            except queue.Empty:
                return
            if item is None:  # the thread's, which has not reached it yet
                self._items.put(None)
                return
            self._call(item)

    def reset_after_fork(self) -> None:
        self._lock = threading.Lock()
        self._thread = None
        self._items = queue.SimpleQueue()

    def _run(self) -> None:
        items = self._items
        while True:
            item = items.get()
            while item is not None:
                self._call(item)
                try:
                    item = items.get_nowait()
                except queue.Empty:
                    break
            else:
                return  # stop()'s None
            # Let the next answers gather: taken one by one, each would wake this thread (and
            # hand the GIL over) once.  Their times were taken when nsqd answered.
            time.sleep(LINGER)

    def _call(self, item: Any) -> None:
        if type(item) is _Flushed:
            item.done.set()
            return
        try:
            self._end(item)
        except Exception:
            logger.exception("ending a publish span failed")


class _Flushed:
    """Where a :meth:`Finisher.flush` waits in the queue: set once every item before it has
    been ended."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


_finishers: weakref.WeakSet[Finisher] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for finisher in list(_finishers):
        finisher.reset_after_fork()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_reset_after_fork)
