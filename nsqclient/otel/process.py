"""Consume spans and metrics, from the Consumer's events (see :mod:`nsqclient.observe`).

Handler mode (a Consumer with a handler, and pynsq's :class:`~nsqclient.Reader` on one): the
CONSUMER span ``process <topic>`` starts at ``handler_started`` and is current on the worker
thread while the handler runs; it ends at ``handler_ended``, which says what the handler raised.
REQ and TOUCH sent before then (``messages_answered``) are events on it (a REQ also sets its
status to ERROR), and so is a give-up (``message_given_up``); a FIN is one only after another
event, or with ``finish_events`` (an event costs a sixth of the SDK's per-message floor, and a
span that ends with status UNSET was finished).  Answers sent later (a handler that called
``message.enable_async()``) are short CLIENT spans of their own, ``finish <topic>``,
``requeue <topic>`` or ``touch <topic>``, linked to the process span.

Pull mode (``Consumer(topic, channel, None)`` and ``consumer.take()``): each batch taken
(``messages_taken``) is one CONSUMER span ``receive <topic>`` (operation type ``receive``,
``messaging.batch.message_count``, a link to each publish context the messages' youzan ext
headers carry), and each answer call (``finish_many``, ``requeue_many``, or one message's
``finish()``...) one CLIENT span ``finish <topic>`` / ``requeue <topic>`` / ``touch <topic>``
(operation type ``settle``, but for TOUCH) linked to the receive spans of its messages.  A
message given up on in ``take()`` gets a ``process`` span of its own, as in handler mode.

The attributes that come from each message (its id, size, attempts) are built only for spans
that record (``is_recording()``): before the span when the previous one recorded (the SDK takes
them cheapest at the start), after it otherwise.  An unsampled message costs the metrics, and
little more.
"""

from __future__ import annotations

import operator
import threading
import time
import weakref
from collections import Counter
from collections.abc import Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.metrics import Histogram
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode

from ..consumer import Consumer, MessageBatch
from ..message import Message, RequeueMessage
from . import names as n
from .gauges import Tally, ThreadTally

__all__ = ["ConsumeTelemetry", "MAX_PENDING"]

#: messages remembered for the link of a later answer's span (taken in pull mode, or taken
#: over with enable_async() in handler mode) and not answered yet; past this, the oldest are
#: forgotten (their answer is then recorded without the link, or in handler mode not at all)
MAX_PENDING = 65536

_EVENTS = {
    "finish": n.EVENT_FINISH,
    "requeue": n.EVENT_REQUEUE,
    "touch": n.EVENT_TOUCH,
    "give_up": n.EVENT_GIVE_UP,
}

_origin = operator.attrgetter("nsqd_address", "partition")
_attach = otel_context.attach
_detach = otel_context.detach
_in_context = trace.set_span_in_context
#: the key of a batch's receive span context in ``MessageBatch.notes``
_RECEIVED = "nsqclient.otel.received"


class _Open:
    """One message's process span, from ``handler_started`` (or a give-up in ``take()``)
    until it ends.  The answers and the give-up it sees are kept as they come and added as
    events when it ends, after the handler's exception (the Consumer answers for a failed
    handler before it tells ``handler_ended``)."""

    __slots__ = ("message", "span", "recording", "attributes", "token", "started", "events")

    def __init__(
        self, message: Message, span: trace.Span, recording: bool, attributes: dict[str, Any]
    ):
        self.message = message
        self.span = span
        self.recording = recording
        #: the metric attributes (later answers' spans start from them too)
        self.attributes = attributes
        self.token: Any = None
        self.started = time.monotonic()
        #: (what, its attributes, time.time_ns()) of each answer and give-up seen while open
        #: (None until the first); what: "finish", "requeue", "touch", "give_up"
        self.events: list[tuple[str, dict[str, Any] | None, int]] | None = None

    def add(self, what: str, attributes: dict[str, Any] | None, when: int) -> None:
        events = self.events
        if events is None:
            self.events = [(what, attributes, when)]
        else:
            events.append((what, attributes, when))


class _Worker(_Open):
    """One thread's handler span, reused message after message (``message`` None between
    handlers: no object made per message); other threads' answers find it through
    ``ConsumeTelemetry._workers``.  It counts the messages consumed on its thread
    (``counts``, its ThreadTally's)."""

    __slots__ = ("tally", "counts", "route", "__weakref__")

    def __init__(self, tally: ThreadTally) -> None:
        self.message = None  # type: ignore[assignment]
        self.events = None
        self.tally = tally
        self.counts = tally.counts
        #: the last message's Consumer, nsqd_address and process attributes (name, metric
        #: attributes, span attributes)
        self.route: tuple[Any, ...] = (None, None, None)


class _Local(threading.local):
    """Per thread: the process span of the handler it runs (``worker``), and of a message
    given up on in take() (``give_up``)."""

    worker: _Worker | None = None
    give_up: _Open | None = None


class ConsumeTelemetry:
    """The Consumer half of the instrumentation's observer, for one
    :meth:`NSQInstrumentor.instrument`."""

    def __init__(
        self,
        tracer: trace.Tracer,
        consumed: Tally,
        duration: Histogram,
        extract: bool,
        finish_events: bool = False,
        out_of_order: Tally | None = None,
    ):
        self.tracer = tracer
        self.consumed = consumed
        #: youzan, ordered: the messages whose offset went backwards on their partition
        self.out_of_order = Tally() if out_of_order is None else out_of_order
        self.duration = duration
        self.extract = extract
        #: record every FIN as an event on its process span (by default only a FIN that
        #: follows another event: a TOUCH, a give-up)
        self.finish_events = finish_events
        self._start_span = tracer.start_span
        #: whether the last process span started recorded (its message attributes then go in
        #: at the start, else only once it records; not locked: a wrong guess costs only time)
        self._recorded = True
        self._local = _Local()
        self._lock = threading.Lock()
        #: every thread's handler span, for answers sent from another thread than the handler's
        self._workers: weakref.WeakSet[_Worker] = weakref.WeakSet()
        #: handler mode, messages held with enable_async() after their handler returned:
        #: the process span's context, the metric attributes and id() of the Consumer
        self._held: dict[Message, tuple[SpanContext, dict[str, Any], int]] = {}
        #: pull mode, per Consumer: the messages taken and not answered yet, and the context
        #: of the receive span each came in
        self._taken: weakref.WeakKeyDictionary[Consumer, dict[Message, SpanContext]] = (
            weakref.WeakKeyDictionary()
        )
        #: (topic, channel, nsqd, partition) -> (span name, metric attributes, span attributes)
        self._process_attributes: dict[tuple[Any, ...], tuple[str, dict, dict]] = {}
        self._record_duration = duration.record

    def detached(self, consumer: Consumer) -> None:
        """``consumer`` stopped (or the observer was removed): forget what it held."""
        key = id(consumer)
        with self._lock:
            self._taken.pop(consumer, None)
            for worker in self._workers:
                if worker.route[0] is consumer:
                    worker.route = (None, None, None)  # (holds no Consumer that stopped)
            for message in [m for m, held in self._held.items() if held[2] == key]:
                del self._held[message]

    # ------------------------------------------------------------------ handler mode

    def handler_started(self, consumer: Consumer, message: Message) -> None:
        worker = self._local.worker
        if worker is None:
            worker = self._local.worker = _Worker(self.consumed.for_thread())
            with self._lock:
                self._workers.add(worker)
        route = worker.route
        if (
            route[0] is consumer
            and route[1] is message.nsqd_address
            and message.partition is None
            and self._recorded
            and not message.ext
            and not message.trace_id
            and message.offset is None
        ):
            # The common case of classic NSQ, _start's first branch: the same Consumer and
            # connection as the last message on this thread, spans recorded, no parent.
            name, attributes, span_attributes = route[2]
            span = self._start_span(
                name,
                None,
                SpanKind.CONSUMER,
                {
                    **span_attributes,
                    n.MESSAGE_ID: _message_id(message),
                    n.BODY_SIZE: len(message.body),
                    n.NSQ_ATTEMPTS: message.attempts,
                },
            )
            worker.recording = recording = span.is_recording()
            if not recording:
                self._recorded = False
        else:
            span, worker.recording, known = self._start(consumer, message)
            attributes = known[1]
            worker.route = (consumer, message.nsqd_address, known)
        # counted on this thread (a Tally.add(1, attributes, interned=True) without the lock)
        entry = worker.counts.get(id(attributes))
        if entry is not None and entry[0] is attributes:
            entry[1] += 1
        else:
            worker.tally.new(1, attributes)
        worker.attributes = attributes
        worker.span = span
        worker.started = time.monotonic()
        worker.token = _attach(_in_context(span))
        worker.message = message  # (last: what other threads look for)

    def handler_ended(
        self, consumer: Consumer, message: Message, error: BaseException | None
    ) -> None:
        worker = self._local.worker
        if worker is None or worker.message is not message:
            return  # started before instrument()
        elapsed = time.monotonic() - worker.started
        _detach(worker.token)
        with self._lock:
            worker.message = None  # type: ignore[assignment]
            events = worker.events
            worker.events = None
        span = worker.span
        if error is None and events is None:
            # the common case: returned, finished, nothing else seen
            self._record_duration(elapsed, worker.attributes)
            span.end()
        else:
            self._end_process(span, worker.recording, worker.attributes, events, error, elapsed)
        if not message.has_responded():
            # taken over with enable_async(): its answer comes later, from anywhere
            self._remember(consumer, message, span, worker.attributes)

    def message_out_of_order(self, consumer: Consumer, message: Message, last_offset: int) -> None:
        attributes = {
            n.SYSTEM: n.SYSTEM_NAME,
            n.DESTINATION: consumer.topic,
            n.CONSUMER_GROUP: consumer.channel,
        }
        if message.partition is not None:
            attributes[n.PARTITION] = str(message.partition)
        n.add_server(attributes, message.nsqd_address)
        self.out_of_order.add(1, attributes)

    def message_given_up(self, consumer: Consumer, message: Message) -> None:
        event = (
            "give_up",
            {n.NSQ_ATTEMPTS: message.attempts, n.NSQ_MAX_TRIES: consumer.config.max_tries},
            time.time_ns(),
        )
        local = self._local
        worker = local.worker
        if worker is not None and worker.message is message:
            with self._lock:  # (another thread may answer it meanwhile)
                worker.add(*event)
            return
        # In take(): a process span of its own, ended by the answer that comes next on this
        # thread (giving_up, then FIN).
        self._end_give_up()
        span, recording, known = self._start(consumer, message)
        open_ = _Open(message, span, recording, known[1])
        self.consumed.add(1, open_.attributes, interned=True)  # (a cached dict)
        open_.add(*event)
        local.give_up = open_

    def messages_answered(
        self,
        consumer: Consumer,
        messages: Sequence[Message],
        action: str,
        delay: float | None,
        backoff: bool | None,
    ) -> None:
        local = self._local
        open_ = local.worker
        if open_ is not None and len(messages) == 1 and messages[0] is open_.message:
            # the common case: the handler's message, on its worker thread
            if action == "requeue" or (
                open_.recording and (action != "finish" or open_.events or self.finish_events)
            ):
                with self._lock:  # (another thread may answer it too)
                    open_.add(action, _answer(action, delay, backoff), time.time_ns())
            return
        given_up = local.give_up
        if given_up is not None and len(messages) == 1 and messages[0] is given_up.message:
            given_up.add(action, _answer(action, delay, backoff), time.time_ns())
            if action != "touch":
                self._end_give_up()
            return
        if consumer.handler is None:
            self._settle(consumer, messages, action, delay, backoff)
        else:
            self._answered_later(messages, action, delay, backoff)

    # ------------------------------------------------------------------ pull mode

    def messages_taken(self, consumer: Consumer, messages: Sequence[Message]) -> None:
        received = self._taken_items(consumer, Counter(map(_origin, messages)), messages)
        with self._lock:
            taken = self._taken.get(consumer)
            if taken is None:
                taken = self._taken[consumer] = {}
            taken.update(dict.fromkeys(messages, received))
            _bound(taken)

    def batches_taken(self, consumer: Consumer, batches: Sequence[MessageBatch]) -> None:
        # A batch's messages are not decoded for their youzan headers: no links to publishers.
        origins: Counter[tuple[str, int | None]] = Counter()
        for batch in batches:
            origins[batch.nsqd_address, batch.partition] += len(batch)
        received = self._taken_items(consumer, origins, ())
        # Kept on the batch (its parts share it, should it be split): nothing to forget here.
        for batch in batches:
            if batch.notes is None:
                batch.notes = {}
            batch.notes[_RECEIVED] = received

    def batches_answered(
        self,
        consumer: Consumer,
        batches: Sequence[MessageBatch],
        action: str,
        delay: float | None,
        backoff: bool | None,
    ) -> None:
        received = [None if b.notes is None else b.notes.get(_RECEIVED) for b in batches]
        count = sum(map(len, batches))
        self._settle(consumer, batches, action, delay, backoff, count, received)

    def _taken_items(
        self,
        consumer: Consumer,
        origins: Counter[tuple[str, int | None]],
        linked: Sequence[Message],
    ) -> SpanContext:
        """One receive span for a take (of messages, or of batches), and the count of what
        was taken per nsqd and partition; the span's context."""
        self._end_give_up()
        topic = consumer.topic
        base = {
            n.SYSTEM: n.SYSTEM_NAME,
            n.DESTINATION: topic,
            n.CONSUMER_GROUP: consumer.channel,
            n.OPERATION_NAME: "receive",
        }
        span = self.tracer.start_span(
            f"receive {topic}",
            kind=SpanKind.CONSUMER,
            attributes={
                **base,
                n.OPERATION_TYPE: "receive",
                n.BATCH_COUNT: sum(origins.values()),
            },
        )
        if span.is_recording() and self.extract:
            seen: set[tuple[int, int]] = set()
            for message in linked:
                if message.ext:
                    context = self._creation_context(message)
                    if context is not None and (context.trace_id, context.span_id) not in seen:
                        seen.add((context.trace_id, context.span_id))
                        span.add_link(context)
        span.end()
        add = self.consumed.add
        for (address, partition), count in origins.items():
            attributes = dict(base)
            n.add_server(attributes, address)
            if partition is not None:
                attributes[n.PARTITION] = str(partition)
            add(count, attributes)
        return span.get_span_context()

    def _settle(
        self,
        consumer: Consumer,
        messages: Sequence[Any],
        action: str,
        delay: float | None,
        backoff: bool | None,
        count: int | None = None,
        received: list[SpanContext | None] | None = None,
    ) -> None:
        """Pull mode: one span for one answer call, linked to the receive spans of its
        messages (or batches: ``count`` messages in all, ``received`` their receive spans)."""
        if received is None:  # messages: their receive spans were noted when taken
            with self._lock:
                taken = self._taken.get(consumer)
                if taken is None:
                    received = []
                elif action == "touch":
                    received = [taken.get(m) for m in messages]
                else:
                    pop = taken.pop
                    received = [pop(m, None) for m in messages]
        attributes: dict[str, Any] = {
            n.SYSTEM: n.SYSTEM_NAME,
            n.DESTINATION: consumer.topic,
            n.CONSUMER_GROUP: consumer.channel,
            n.OPERATION_NAME: action,
        }
        if action != "touch":
            attributes[n.OPERATION_TYPE] = "settle"
        span = self.tracer.start_span(
            f"{action} {consumer.topic}", kind=SpanKind.CLIENT, attributes=attributes
        )
        if span.is_recording():
            if count is None and len(messages) == 1:
                message = messages[0]
                span.set_attribute(n.MESSAGE_ID, n.message_id(message.internal_id, message.id))
            else:
                span.set_attribute(n.BATCH_COUNT, len(messages) if count is None else count)
            extra = _answer(action, delay, backoff)
            if extra:
                span.set_attributes(extra)
            linked: set[int] = set()
            for context in received:
                if context is not None and context.span_id not in linked:
                    linked.add(context.span_id)
                    span.add_link(context)
            if action == "requeue":
                _mark_requeued(span)
        span.end()

    # ------------------------------------------------------------------ the process span

    def _start(
        self, consumer: Consumer, message: Message
    ) -> tuple[trace.Span, bool, tuple[str, dict[str, Any], dict[str, Any]]]:
        """Start a process span: the span, whether it records, and the process attributes
        (span name, metric attributes, span attributes) of its Consumer and nsqd."""
        known = self._process_attributes.get(
            (consumer.topic, consumer.channel, message.nsqd_address, message.partition)
        )
        if known is None:
            known = self._new_process_attributes(consumer, message)
        name, attributes, span_attributes = known
        parent = self._parent(message) if message.ext else None
        if self._recorded:
            # The message's own attributes go in at the start, where the SDK takes them
            # cheapest (see _message_attributes).
            span_attributes = {
                **span_attributes,
                n.MESSAGE_ID: _message_id(message),
                n.BODY_SIZE: len(message.body),
                n.NSQ_ATTEMPTS: message.attempts,
            }
            if message.trace_id:
                span_attributes[n.NSQ_YOUZAN_TRACE_ID] = message.trace_id
            if message.offset is not None:
                span_attributes[n.NSQ_YOUZAN_OFFSET] = message.offset
            span = self._start_span(name, parent, SpanKind.CONSUMER, span_attributes)
            recording = span.is_recording()
            if not recording:
                self._recorded = False
        else:
            span = self._start_span(name, parent, SpanKind.CONSUMER, span_attributes)
            recording = span.is_recording()
            if recording:
                span.set_attributes(_message_attributes(message))
                self._recorded = True
        return span, recording, known

    def _new_process_attributes(
        self, consumer: Consumer, message: Message
    ) -> tuple[str, dict[str, Any], dict[str, Any]]:
        """The span name, metric attributes and span attributes shared by the messages of
        one Consumer from one nsqd (and youzan partition)."""
        attributes: dict[str, Any] = {
            n.SYSTEM: n.SYSTEM_NAME,
            n.DESTINATION: consumer.topic,
            n.CONSUMER_GROUP: consumer.channel,
            n.OPERATION_NAME: "process",
        }
        n.add_server(attributes, message.nsqd_address)
        if message.partition is not None:
            attributes[n.PARTITION] = str(message.partition)
        known = (
            f"process {consumer.topic}",
            attributes,
            {**attributes, n.OPERATION_TYPE: "process"},
        )
        if len(self._process_attributes) < 4096:
            key = (consumer.topic, consumer.channel, message.nsqd_address, message.partition)
            self._process_attributes[key] = known
        return known

    def _end_process(
        self,
        span: trace.Span,
        recording: bool,
        base: dict[str, Any],
        events: list[tuple[str, dict[str, Any] | None, int]] | None,
        error: BaseException | None,
        elapsed: float,
    ) -> None:
        events = events or []
        error_type: str | None = None
        if error is not None and not isinstance(error, RequeueMessage):
            error_type = n.error_type(error)
            if recording:
                # (when the Consumer requeued for it, at the time of its REQ)
                when = next((t for what, _, t in events if what == "requeue"), None)
                span.record_exception(error, timestamp=when)
                span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        for what, attributes, when in events:
            if what == "give_up":
                if error_type is None:
                    error_type = n.ERROR_GIVEN_UP
                    if recording:
                        attempts = (attributes or {}).get(n.NSQ_ATTEMPTS)
                        span.set_status(
                            Status(StatusCode.ERROR, f"gave up after {attempts} attempts")
                        )
            elif what == "requeue" and error_type is None:
                error_type = n.ERROR_REQUEUED
                if recording:
                    span.set_status(Status(StatusCode.ERROR, "requeued"))
            if recording:
                span.add_event(_EVENTS[what], attributes, when)
        if error_type is not None:
            if recording:
                span.set_attribute(n.ERROR_TYPE, error_type)
            self._record_duration(elapsed, {**base, n.ERROR_TYPE: error_type})
        else:
            self._record_duration(elapsed, base)
        span.end()

    def _end_give_up(self) -> None:
        """End the process span of a message this thread gave up on in take() (if any)."""
        local = self._local
        open_ = local.give_up
        if open_ is not None:
            local.give_up = None
            elapsed = time.monotonic() - open_.started
            self._end_process(
                open_.span, open_.recording, open_.attributes, open_.events, None, elapsed
            )

    def _parent(self, message: Message) -> otel_context.Context | None:
        """The publisher's context from a youzan message's ext header, or None."""
        if not self.extract:
            return None
        try:
            return propagate.extract(message.ext)
        except Exception:  # a header that is not the propagator's (e.g. not a string)
            return None

    def _creation_context(self, message: Message) -> SpanContext | None:
        parent = self._parent(message)
        if parent is None:
            return None
        context = trace.get_current_span(parent).get_span_context()
        return context if context.is_valid else None

    # ------------------------------------------------------------------ later answers

    def _remember(
        self, consumer: Consumer, message: Message, span: trace.Span, attributes: dict[str, Any]
    ) -> None:
        entry = (span.get_span_context(), attributes, id(consumer))
        with self._lock:
            self._held[message] = entry
            _bound(self._held)
        if message.has_responded():
            # answered meanwhile, perhaps before it was remembered: forget it
            with self._lock:
                self._held.pop(message, None)

    def _answered_later(
        self,
        messages: Sequence[Message],
        action: str,
        delay: float | None,
        backoff: bool | None,
    ) -> None:
        """Handler mode: an answer from another thread than the handler's, or after it
        returned (enable_async)."""
        later = []
        now = time.time_ns()
        running: dict[Message, _Worker] | None = None
        with self._lock:
            for message in messages:
                if action == "touch":
                    held = self._held.get(message)
                else:
                    held = self._held.pop(message, None)
                if held is not None:  # its handler returned (enable_async)
                    later.append((message, held))
                    continue
                if running is None:  # the handlers running now, by message
                    running = {w.message: w for w in self._workers if w.message is not None}
                open_ = running.get(message)
                if open_ is not None:  # its handler still runs
                    if action != "finish" or open_.events or self.finish_events:
                        open_.add(action, _answer(action, delay, backoff), now)
        for message, (context, base, _) in later:
            attributes = {**base, n.OPERATION_NAME: action}
            if action != "touch":
                attributes[n.OPERATION_TYPE] = "settle"
            span = self.tracer.start_span(
                f"{action} {base[n.DESTINATION]}",
                kind=SpanKind.CLIENT,
                links=[Link(context)],
                attributes=attributes,
            )
            if span.is_recording():
                span.set_attribute(n.MESSAGE_ID, n.message_id(message.internal_id, message.id))
                extra = _answer(action, delay, backoff)
                if extra:
                    span.set_attributes(extra)
                if action == "requeue":
                    _mark_requeued(span)
            span.end()


def _message_id(message: Message) -> str:
    """``messaging.message.id`` of a received message (see :func:`names.message_id`)."""
    internal_id = message.internal_id
    if internal_id is not None:
        return str(internal_id)
    try:
        return message.id.decode("ascii")
    except UnicodeDecodeError:
        return message.id.hex()


def _message_attributes(message: Message) -> dict[str, Any]:
    """A process span's attributes that come from its message (at the start of a span that
    records, :meth:`ConsumeTelemetry._start_process` builds the same in one dict)."""
    attributes: dict[str, Any] = {
        n.MESSAGE_ID: _message_id(message),
        n.BODY_SIZE: len(message.body),
        n.NSQ_ATTEMPTS: message.attempts,
    }
    if message.trace_id:
        attributes[n.NSQ_YOUZAN_TRACE_ID] = message.trace_id
    if message.offset is not None:
        attributes[n.NSQ_YOUZAN_OFFSET] = message.offset
    return attributes


def _answer(action: str, delay: float | None, backoff: bool | None) -> dict[str, Any] | None:
    """The attributes of an answer's event (a REQ's delay and backoff)."""
    if action != "requeue":
        return None
    attributes: dict[str, Any] = {}
    if delay is not None:
        attributes[n.NSQ_REQUEUE_DELAY] = float(delay)
    if backoff is not None:
        attributes[n.NSQ_REQUEUE_BACKOFF] = bool(backoff)
    return attributes


def _mark_requeued(span: trace.Span) -> None:
    """A requeue span: status ERROR, ``error.type`` requeued."""
    span.set_status(Status(StatusCode.ERROR, "requeued"))
    span.set_attribute(n.ERROR_TYPE, n.ERROR_REQUEUED)


def _bound(pending: dict[Any, Any]) -> None:
    """Forget the oldest entries past MAX_PENDING (under the caller's lock)."""
    while len(pending) > MAX_PENDING:
        del pending[next(iter(pending))]
