"""Publish spans and metrics: the wrappers :class:`~nsqclient.otel.NSQInstrumentor` puts around
:class:`~nsqclient.Producer`'s ``pub``, ``mpub``, ``dpub`` and their ``*_async`` forms (and
thereby pynsq's :class:`~nsqclient.Writer`, which publishes through them).

One PRODUCER span ``publish <topic>`` per call, from the call until nsqd's answer (for the
``*_async`` forms, until the Future completes), and on youzan's extend-support topics the trace
context injected into the message's ext header.  Each publish also records
``messaging.client.operation.duration`` and adds its messages to
``messaging.client.sent.messages``.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sized
from concurrent.futures import CancelledError, Future
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.metrics import Histogram
from opentelemetry.trace import SpanKind, Status, StatusCode

from ..producer import Producer, PublishResult
from ..protocol import valid_topic_name
from . import names as n
from .gauges import Tally

__all__ = ["PublishInstrumentation", "INJECT_MODES"]

#: where a publish's trace context goes (see NSQInstrumentor.instrument's ``inject``)
INJECT_MODES = ("extend_topics", "given", "never")

logger = logging.getLogger("nsqclient.otel")

_local = threading.local()


class _Capture:
    """What the Producer's internals tell a publish in progress on this thread: the nsqd it
    was written to and the partition on the wire (see ``PublishInstrumentation.wrap_submit``)."""

    __slots__ = ("address", "partition")

    def __init__(self) -> None:
        self.address: str | None = None
        self.partition: int | None = None


class PublishInstrumentation:
    """Builds the Producer's wrapped methods for one :meth:`NSQInstrumentor.instrument`."""

    def __init__(
        self,
        tracer: trace.Tracer,
        sent: Tally,
        duration: Histogram,
        inject: str,
    ):
        self.tracer = tracer
        self.sent = sent
        self.duration = duration
        self.inject = inject
        self.finisher = Finisher()

    def close(self, timeout: float) -> None:
        """Uninstrumented: end what the finisher holds, and join its thread."""
        self.finisher.stop(timeout)

    # ------------------------------------------------------------------ wrappers

    def wrap(self, original: Callable[..., Any], command: str, asynchronous: bool) -> Any:
        """``original`` (Producer.pub and the like) publishing under a span.  ``command``:
        "PUB", "MPUB" or "DPUB"."""
        batch = command == "MPUB"
        body_key = "bodies" if batch else "body"
        headers = command != "DPUB"  # youzan has no DPUB, and DPUB takes no ext
        start = self._start
        inject = self._inject_into if self.inject != "never" and headers else None

        if asynchronous:

            def publish_async(producer: Producer, *args: Any, **kwargs: Any) -> Future:
                span, attributes, count = start(producer, command, batch, body_key, args, kwargs)
                if inject is not None:
                    inject(producer, span, attributes, batch, False, kwargs)
                capture = _Capture()
                previous = getattr(_local, "capture", None)
                _local.capture = capture
                started = time.monotonic()
                try:
                    future = original(producer, *args, **kwargs)
                except BaseException as exc:
                    self._end(
                        span, attributes, count, time.monotonic() - started, capture, None, exc
                    )
                    raise
                finally:
                    _local.capture = previous
                future.add_done_callback(
                    lambda f: self._answered(f, span, attributes, count, started, capture)
                )
                return future

            return n.wrapping(publish_async, original)

        def publish(producer: Producer, *args: Any, **kwargs: Any) -> Any:
            span, attributes, count = start(producer, command, batch, body_key, args, kwargs)
            # current during the call: a lookup made for it (requests) is its child
            token = otel_context.attach(trace.set_span_in_context(span))
            if inject is not None:
                inject(producer, span, attributes, batch, True, kwargs)
            capture = _Capture()
            previous = getattr(_local, "capture", None)
            _local.capture = capture
            started = time.monotonic()
            try:
                result = original(producer, *args, **kwargs)
            except BaseException as exc:
                self._end(span, attributes, count, time.monotonic() - started, capture, None, exc)
                raise
            finally:
                otel_context.detach(token)
                _local.capture = previous
            self._end(span, attributes, count, time.monotonic() - started, capture, result, None)
            return result

        return n.wrapping(publish, original)

    @staticmethod
    def wrap_submit(original: Callable[..., Any]) -> Any:
        """``Producer._submit_to`` telling the publish in progress on this thread (if any)
        which nsqd its command was written to, and on which partition."""

        def _submit_to(producer: Producer, command: bytes, *args: Any, **kwargs: Any) -> Any:
            future = original(producer, command, *args, **kwargs)
            capture = getattr(_local, "capture", None)
            if capture is not None and future is not None:
                address = getattr(future, "nsqd_address", None)
                if address is None:
                    conn = getattr(future, "conn", None)
                    address = getattr(conn, "address", None)
                if address is not None:
                    capture.address = address
                capture.partition = _wire_partition(command)
            return future

        return n.wrapping(_submit_to, original)

    # ------------------------------------------------------------------ span life

    def _start(
        self,
        producer: Producer,
        command: str,
        batch: bool,
        body_key: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> tuple[trace.Span, dict[str, Any], int]:
        topic = args[0] if args else kwargs.get("topic")
        payload = args[1] if len(args) > 1 else kwargs.get(body_key)
        attributes: dict[str, Any] = {
            n.SYSTEM: n.SYSTEM_NAME,
            n.DESTINATION: str(topic),
            n.OPERATION_TYPE: "send",
            n.OPERATION_NAME: "publish",
        }
        if batch:
            count = len(payload) if isinstance(payload, Sized) else 0
        else:
            count = 1
        # A Producer with one nsqd and no lookup always publishes there.
        if producer._router is None and len(producer._slots) == 1:
            n.add_server(attributes, producer._slots[0].address)
        partition = kwargs.get("partition")
        if isinstance(partition, int):
            attributes[n.PARTITION] = str(partition)
        span_attributes = dict(attributes)
        span_attributes[n.NSQ_COMMAND] = command
        if batch:
            span_attributes[n.BATCH_COUNT] = count
        else:
            size = n.body_size(payload)
            if size is not None:
                span_attributes[n.BODY_SIZE] = size
        span = self.tracer.start_span(
            f"publish {topic}", kind=SpanKind.PRODUCER, attributes=span_attributes
        )
        return span, attributes, count

    def _inject_into(
        self,
        producer: Producer,
        span: trace.Span,
        attributes: dict[str, Any],
        batch: bool,
        blocking: bool,
        kwargs: dict[str, Any],
    ) -> None:
        """Put the span's context into the publish's ext header (youzan): into a copy of the
        one given, or (``inject="extend_topics"``) into a new one when the topic's route says
        it takes headers."""
        ext = kwargs.get("ext")
        if ext is None:
            if self.inject != "extend_topics":
                return
            router = producer._router
            topic = attributes[n.DESTINATION]
            if router is None or not valid_topic_name(topic):
                return
            if batch and (kwargs.get("trace_id") is not None or producer.tracing):
                return  # an MPUB_EXT answers no trace result: keep MPUB_TRACE's
            route = router.cached(topic)
            if route is None and blocking:
                try:
                    route = router.route(topic)  # the publish looks it up anyway
                except Exception:
                    return  # the publish itself raises it
            if route is None or not (route.partitioned and route.extend_support):
                return
            ext = {}
        elif not isinstance(ext, dict):
            return  # the publish raises TypeError
        carrier = dict(ext)
        try:
            propagate.inject(carrier, context=trace.set_span_in_context(span))
        except Exception:
            return
        kwargs["ext"] = carrier

    def _answered(
        self,
        future: Future,
        span: trace.Span,
        attributes: dict[str, Any],
        count: int,
        started: float,
        capture: _Capture,
    ) -> None:
        """An asynchronous publish's Future completed, usually on a connection's reader thread:
        take the time and the outcome here, and leave the span and the metrics (the SDK's span
        processors, which may export there and then) to the finisher's thread."""
        elapsed = time.monotonic() - started
        end_time = time.time_ns()
        # (a publish written on another thread: the Future says where it went)
        if capture.address is None:
            capture.address = getattr(future, "nsqd_address", None)
        if capture.partition is None:
            capture.partition = getattr(future, "partition", None)
        result = None
        exc: BaseException | None
        if future.cancelled():
            exc = CancelledError()
        else:
            exc = future.exception()
            if exc is None:
                result = future.result()
        self.finisher.submit(
            self._end, span, attributes, count, elapsed, capture, result, exc, end_time
        )

    def _end(
        self,
        span: trace.Span,
        attributes: dict[str, Any],
        count: int,
        elapsed: float,
        capture: _Capture,
        result: Any,
        exc: BaseException | None,
        end_time: int | None = None,
    ) -> None:
        address = capture.address
        partition = capture.partition
        if isinstance(result, PublishResult):
            address = result.nsqd_address or address
            if result.partition is not None:
                partition = result.partition
            if count == 1:  # an MPUB's id is its first message's
                span.set_attribute(n.MESSAGE_ID, str(result.message_id))
        if address and n.SERVER_ADDRESS not in attributes:
            n.add_server(attributes, address)
            span.set_attribute(n.SERVER_ADDRESS, attributes[n.SERVER_ADDRESS])
            if n.SERVER_PORT in attributes:
                span.set_attribute(n.SERVER_PORT, attributes[n.SERVER_PORT])
        if partition is not None and n.PARTITION not in attributes:
            attributes[n.PARTITION] = str(partition)
            span.set_attribute(n.PARTITION, attributes[n.PARTITION])
        sent = True
        if exc is not None:
            kind = n.error_type(exc)
            attributes[n.ERROR_TYPE] = kind
            span.set_attribute(n.ERROR_TYPE, kind)
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            # bad input raises before anything is sent: no message was attempted
            sent = not isinstance(exc, ValueError | TypeError)
        span.end(end_time)
        self.duration.record(elapsed, attributes)
        if sent and count:
            self.sent.add(count, attributes)


class Finisher:
    """Ends the spans of asynchronous publishes on a thread of its own (``nsq-otel``).

    Their Futures complete on a connection's reader thread, where nothing but nsqclient's own
    code may run (DESIGN.md, rule 2): a span processor that exports there and then (the SDK's
    SimpleSpanProcessor) would hold up heartbeats for as long as its exporter takes.  The
    thread starts with the first asynchronous publish and is joined by :meth:`stop`; after
    that, spans end where their Future completes.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]] | None] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopped = False
        _finishers.add(self)

    def submit(self, job: Callable[..., None], *args: Any) -> None:
        with self._lock:
            if not self._stopped:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="nsq-otel", daemon=True)
                    self._thread.start()
                self._jobs.put((job, args))
                return
        job(*args)  # uninstrumented meanwhile: here, then

    def stop(self, timeout: float) -> None:
        with self._lock:
            self._stopped = True
            thread, self._thread = self._thread, None
        if thread is not None:
            self._jobs.put(None)
            thread.join(timeout)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._thread = None
        self._jobs = queue.SimpleQueue()

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, args = item
            try:
                job(*args)
            except Exception:
                logger.exception("ending a publish span failed")


_finishers: weakref.WeakSet[Finisher] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for finisher in list(_finishers):
        finisher._after_fork()


os.register_at_fork(after_in_child=_reset_after_fork)


def _wire_partition(command: bytes) -> int | None:
    """The partition a publish command names on its first line (``PUB topic 3``), or None."""
    if command.startswith(b"DPUB"):
        return None
    end = command.find(b"\n", 0, 400)
    if end < 0:
        return None
    parts = command[:end].split(b" ")
    if len(parts) < 3 or not parts[2].isdigit():
        return None
    return int(parts[2])
