"""Process spans and metrics: the wrappers :class:`~nsqclient.otel.NSQInstrumentor` puts around
the :class:`~nsqclient.Consumer`'s handling of one message (``Consumer._handle``, which runs on
a worker thread and calls the handler, or the ``giving_up`` callback) and around its FIN, REQ and
TOUCH (``Consumer._finish_message``, ``_requeue_message``, ``_touch_message``: every answer goes
through them, the handler's own ``message.finish()`` and the automatic FIN alike).  pynsq's
:class:`~nsqclient.Reader` runs on a Consumer and is covered by the same wrappers.

The CONSUMER span ``process <topic>`` is current while the handler runs; it ends when the
handler returns.  FIN, REQ and TOUCH sent before then are events on it (a REQ also sets its
status to ERROR); those sent later (a handler that called ``message.enable_async()``) are short
CLIENT spans of their own, ``finish <topic>``, ``requeue <topic>`` or ``touch <topic>``, linked
to the process span.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.metrics import Histogram
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from ..consumer import Consumer
from ..message import Message, RequeueMessage
from . import names as n
from .gauges import Tally

__all__ = ["ProcessInstrumentation"]

#: messages taken over with enable_async() and not answered yet that are remembered (for the
#: link of their later finish/requeue span); past this, the oldest are forgotten
MAX_PENDING = 65536

_EVENTS = {"finish": n.EVENT_FINISH, "requeue": n.EVENT_REQUEUE, "touch": n.EVENT_TOUCH}


class _Record:
    """One message's process span, from the handler's start until the message is answered."""

    __slots__ = ("message", "span", "attributes", "ended", "settled", "error")

    def __init__(self, message: Message, span: trace.Span, attributes: dict[str, Any]):
        self.message = message
        self.span = span
        #: the metric attributes, which settle spans start from too
        self.attributes = attributes
        #: the process span has ended (the handler returned)
        self.ended = False
        #: finished or requeued
        self.settled = False
        #: error.type of the processing, if it failed
        self.error: str | None = None


class ProcessInstrumentation:
    """Builds the Consumer's wrapped methods for one :meth:`NSQInstrumentor.instrument`."""

    def __init__(
        self,
        tracer: trace.Tracer,
        consumed: Tally,
        duration: Histogram,
        extract: bool,
    ):
        self.tracer = tracer
        self.consumed = consumed
        self.duration = duration
        self.extract = extract
        self._lock = threading.Lock()
        #: id(message) -> its record, while its span is open or it is held with enable_async()
        self._records: dict[int, _Record] = {}

    # ------------------------------------------------------------------ the handler

    def wrap_handle(self, original: Callable[[Consumer, Message], None]) -> Any:
        tracer = self.tracer
        records = self._records
        lock = self._lock

        def _handle(consumer: Consumer, message: Message) -> None:
            attributes: dict[str, Any] = {
                n.SYSTEM: n.SYSTEM_NAME,
                n.DESTINATION: consumer.topic,
                n.CONSUMER_GROUP: consumer.channel,
                n.OPERATION_NAME: "process",
            }
            n.add_server(attributes, message.nsqd_address)
            if message.partition is not None:
                attributes[n.PARTITION] = str(message.partition)
            span_attributes = dict(attributes)
            span_attributes[n.OPERATION_TYPE] = "process"
            span_attributes[n.MESSAGE_ID] = n.message_id(message.internal_id, message.id)
            span_attributes[n.BODY_SIZE] = len(message.body)
            span_attributes[n.NSQ_ATTEMPTS] = message.attempts
            if message.trace_id:
                span_attributes[n.NSQ_YOUZAN_TRACE_ID] = message.trace_id
            if message.offset is not None:
                span_attributes[n.NSQ_YOUZAN_OFFSET] = message.offset
            parent = self._parent(message)
            span = tracer.start_span(
                f"process {consumer.topic}",
                context=parent,
                kind=SpanKind.CONSUMER,
                attributes=span_attributes,
            )
            self.consumed.add(1, attributes)
            record = _Record(message, span, attributes)
            key = id(message)
            with lock:
                records[key] = record
                if len(records) > MAX_PENDING:
                    del records[next(iter(records))]
            max_tries = consumer._max_tries
            if max_tries and message.attempts > max_tries and not consumer.ordered:
                span.add_event(
                    n.EVENT_GIVE_UP, {n.NSQ_ATTEMPTS: message.attempts, n.NSQ_MAX_TRIES: max_tries}
                )
                record.error = n.ERROR_GIVEN_UP
                span.set_attribute(n.ERROR_TYPE, n.ERROR_GIVEN_UP)
                span.set_status(
                    Status(StatusCode.ERROR, f"gave up after {message.attempts} attempts")
                )
            token = otel_context.attach(trace.set_span_in_context(span, parent))
            started = time.monotonic()
            try:
                original(consumer, message)
            finally:
                elapsed = time.monotonic() - started
                otel_context.detach(token)
                with lock:
                    record.ended = True
                    if record.settled or not message._async:
                        if records.get(key) is record:
                            del records[key]
                span.end()
                if record.error is not None:
                    attributes = {**attributes, n.ERROR_TYPE: record.error}
                self.duration.record(elapsed, attributes)

        return n.wrapping(_handle, original)

    def _parent(self, message: Message) -> otel_context.Context | None:
        """The publisher's context from a youzan message's ext header, or None."""
        ext = message.ext
        if not ext or not self.extract:
            return None
        try:
            return propagate.extract(ext)
        except Exception:  # a header that is not the propagator's (e.g. not a string)
            return None

    # ------------------------------------------------------------------ FIN / REQ / TOUCH

    def wrap_finish(self, original: Callable[[Consumer, Message], None]) -> Any:
        def _finish_message(consumer: Consumer, message: Message) -> None:
            original(consumer, message)
            self._answered(message, "finish", None, None)

        return n.wrapping(_finish_message, original)

    def wrap_requeue(self, original: Callable[..., None]) -> Any:
        def _requeue_message(
            consumer: Consumer, message: Message, *args: Any, **kwargs: Any
        ) -> None:
            original(consumer, message, *args, **kwargs)
            delay = args[0] if args else kwargs.get("delay")
            backoff = args[1] if len(args) > 1 else kwargs.get("backoff")
            event: dict[str, Any] = {}
            if delay is not None:
                event[n.NSQ_REQUEUE_DELAY] = float(delay)
            if backoff is not None:
                event[n.NSQ_REQUEUE_BACKOFF] = bool(backoff)
            # A handler's exception is being handled when the Consumer (or Reader) requeues.
            self._answered(message, "requeue", event, sys.exc_info()[1])

        return n.wrapping(_requeue_message, original)

    def wrap_touch(self, original: Callable[[Consumer, Message], None]) -> Any:
        def _touch_message(consumer: Consumer, message: Message) -> None:
            original(consumer, message)
            self._answered(message, "touch", None, None)

        return n.wrapping(_touch_message, original)

    def _answered(
        self,
        message: Message,
        what: str,
        event: dict[str, Any] | None,
        exc: BaseException | None,
    ) -> None:
        key = id(message)
        with self._lock:
            record = self._records.get(key)
            if record is None or record.message is not message:
                return
            if not record.ended:
                span = record.span
                if what == "requeue":  # the exception (if any) first, then the REQ
                    record.error = _mark_requeued(span, exc)
                span.add_event(_EVENTS[what], event)
                if what != "touch":
                    record.settled = True
                return
            if what != "touch":
                del self._records[key]
            link = Link(record.span.get_span_context())
            base = record.attributes
        # Answered after the handler returned (enable_async): a short span of its own.
        attributes = dict(base)
        attributes[n.OPERATION_NAME] = what
        if what != "touch":
            attributes[n.OPERATION_TYPE] = "settle"
        attributes[n.MESSAGE_ID] = n.message_id(message.internal_id, message.id)
        if event:
            attributes.update(event)
        span = self.tracer.start_span(
            f"{what} {base[n.DESTINATION]}",
            kind=SpanKind.CLIENT,
            links=[link],
            attributes=attributes,
        )
        if what == "requeue":
            _mark_requeued(span, exc)
        span.end()


def _mark_requeued(span: trace.Span, exc: BaseException | None) -> str:
    """Set a requeued message's span to ERROR; return its error.type."""
    if exc is not None and not isinstance(exc, RequeueMessage):
        kind = n.error_type(exc)
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
    else:
        kind = n.ERROR_REQUEUED
        span.set_status(Status(StatusCode.ERROR, "requeued"))
    span.set_attribute(n.ERROR_TYPE, kind)
    return kind
