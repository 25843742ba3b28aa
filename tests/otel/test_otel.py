"""OpenTelemetry instrumentation (nsqclient.otel) against the broker (embedded NSQ, or real nsqd
with NSQ_BIN_DIR): the spans and metrics of publishing and consuming, read back with the SDK's
in-memory span exporter and metric reader; instrument() adding one observer of the core
(nsqclient.observe) and replacing nothing, uninstrument() removing it.

Providers are always passed to instrument() explicitly: the global ones can be set only once
per process (configure_from_env, which sets them, is tested in subprocesses: otel/test_otel_env.py).
"""

from __future__ import annotations

import ast
import logging
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is not installed")
pytest.importorskip("opentelemetry.instrumentation", reason="nsqclient[otel] is not installed")

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

from nsqclient import Message, Producer, Reader, RequeueMessage, Writer, observe  # noqa: E402
from nsqclient.conn._connection import Connection  # noqa: E402
from nsqclient.consumer._consumer import Consumer  # noqa: E402
from nsqclient.errors import BadMessageError  # noqa: E402
from nsqclient.otel import NSQInstrumentor  # noqa: E402
from nsqclient.otel import names as n  # noqa: E402
from nsqclient.otel.observer import TelemetryObserver  # noqa: E402
from nsqclient.testing.helpers import message_count, publish  # noqa: E402
from nsqclient.testing.waiting import wait_for  # noqa: E402

TIMEOUT = 10.0

#: the classes a user's program holds: instrument() must change none of them (nor their bases)
CLASSES = (Consumer, Producer, Reader, Writer, Connection)


def class_dicts() -> dict[type, dict[str, Any]]:
    """What ``vars()`` of each of CLASSES and of their bases holds now (a copy)."""
    return {
        klass: dict(vars(klass)) for cls in CLASSES for klass in cls.__mro__ if klass is not object
    }


def ours() -> list[Any]:
    """The observers registered globally that are nsqclient.otel's."""
    return [o for o in observe.global_observers() if isinstance(o, TelemetryObserver)]


class ThreadRecorder(SpanProcessor):
    """Remembers the thread each span ended on (where the SDK's span processors run)."""

    def __init__(self) -> None:
        self.threads: dict[int, str] = {}

    def on_end(self, span: ReadableSpan) -> None:
        self.threads[span.context.span_id] = threading.current_thread().name


class Telemetry:
    """An SDK tracer provider and meter provider reading into memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.ended_on = ThreadRecorder()
        self.tracer_provider.add_span_processor(self.ended_on)
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        """Finished spans (named ``name``), in the order they ended."""
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]

    def wait_spans(self, name: str, count: int) -> list[ReadableSpan]:
        """Wait until ``count`` spans named ``name`` have ended; return them."""
        return wait_for(
            lambda: (found := self.spans(name)) and len(found) >= count and found,
            TIMEOUT,
            message=lambda: f"{count} spans {name!r}; ended: {[s.name for s in self.spans()]}",
        )

    def points(self, metric: str) -> list[tuple[dict[str, Any], Any]]:
        """``(attributes, data point)`` of one metric of nsqclient's scope, as collected now."""
        data = self.reader.get_metrics_data()
        found = []
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                if scope.scope.name != "nsqclient":
                    continue
                for m in scope.metrics:
                    if m.name == metric:
                        found += [(dict(p.attributes or {}), p) for p in m.data.data_points]
        return found

    def total(self, metric: str, **where: Any) -> float:
        """The sum (counters, gauges) or count (histograms) of ``metric`` over the points
        whose attributes include ``where`` (``**{n.SERVER_PORT: 4150}``)."""
        total = 0.0
        for attributes, point in self.points(metric):
            if all(attributes.get(k) == v for k, v in where.items()):
                total += point.count if hasattr(point, "count") else point.value
        return total

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    """nsqclient instrumented into a fresh Telemetry; uninstrumented at teardown (request it
    before ``consumers`` so that the consumers stop first)."""
    t = Telemetry()
    NSQInstrumentor().instrument(tracer_provider=t.tracer_provider, meter_provider=t.meter_provider)
    yield t
    NSQInstrumentor().uninstrument()
    t.shutdown()


def subscribed(consumer: Consumer) -> None:
    wait_for(consumer.connections, TIMEOUT, message="the consumer did not subscribe")


def server_of(cluster: Any) -> tuple[str, int]:
    host, _, port = cluster.nsqd.tcp_address.rpartition(":")
    return host, int(port)


# ------------------------------------------------------------------------------------------
# Publishing


def test_every_publish_method_is_a_producer_span_with_its_metrics(telemetry, nsqd):
    topic = "otel_pub"
    host, port = server_of(nsqd)
    with Producer(nsqd.nsqd.tcp_address) as producer:
        producer.pub(topic, b"a")
        producer.mpub(topic, [b"b", b"c", b"d"])
        producer.dpub(topic, b"e", 0.01)
        producer.pub_async(topic, "f").result(TIMEOUT)
        producer.mpub_async(topic, [b"g", b"h"]).result(TIMEOUT)
        producer.dpub_async(topic, b"i", 0.01).result(TIMEOUT)
    spans = telemetry.wait_spans(f"publish {topic}", 6)
    assert len(spans) == 6
    assert [s.attributes[n.NSQ_COMMAND] for s in spans] == ["PUB", "MPUB", "DPUB"] * 2
    for span in spans:
        assert span.kind is SpanKind.PRODUCER
        assert span.status.status_code is StatusCode.UNSET
        attributes = span.attributes
        assert attributes[n.SYSTEM] == "nsq"
        assert attributes[n.DESTINATION] == topic
        assert attributes[n.OPERATION_TYPE] == "send"
        assert attributes[n.OPERATION_NAME] == "publish"
        assert (attributes[n.SERVER_ADDRESS], attributes[n.SERVER_PORT]) == (host, port)
        assert span.end_time >= span.start_time
    assert [s.attributes.get(n.BATCH_COUNT) for s in spans] == [None, 3, None, None, 2, None]
    # The SDK's span processors never run on a connection's thread (docs/contributing.rst): a
    # blocking publish ends on its caller, an asynchronous one on the instrumentation's thread.
    threads = [telemetry.ended_on.threads[s.context.span_id] for s in spans]
    assert threads == [threading.current_thread().name] * 3 + ["nsq-otel"] * 3
    assert spans[0].attributes[n.BODY_SIZE] == 1
    assert spans[3].attributes[n.BODY_SIZE] == 1  # a str body, counted encoded
    assert message_count(nsqd.nsqd, topic) == 9
    assert telemetry.total(n.SENT_MESSAGES) == 9
    assert telemetry.total(n.OPERATION_DURATION) == 6
    for attributes, _ in telemetry.points(n.SENT_MESSAGES) + telemetry.points(n.OPERATION_DURATION):
        assert attributes == {
            n.SYSTEM: "nsq",
            n.DESTINATION: topic,
            n.OPERATION_TYPE: "send",
            n.OPERATION_NAME: "publish",
            n.SERVER_ADDRESS: host,
            n.SERVER_PORT: port,
        }


def test_a_producer_of_several_nsqd_names_the_one_each_publish_went_to(telemetry, nsq_cluster):
    addresses = [node.tcp_address for node in nsq_cluster.nsqds]
    with Producer(addresses) as producer:
        for _ in range(3):
            producer.pub("otel_rr", b"m")
        producer.pub_async("otel_rr", b"m").result(TIMEOUT)
    spans = telemetry.wait_spans("publish otel_rr", 4)
    used = {f"{s.attributes[n.SERVER_ADDRESS]}:{s.attributes[n.SERVER_PORT]}" for s in spans}
    assert used <= set(addresses)
    assert len(used) == 3  # round robin


def test_a_refused_publish_is_an_error_span(telemetry, nsq_cluster_factory):
    cluster = nsq_cluster_factory(max_msg_size=100)
    with Producer(cluster.nsqd.tcp_address) as producer:
        with pytest.raises(BadMessageError):
            producer.pub("otel_big", b"x" * 101)
        future = producer.pub_async("otel_big", b"y" * 101)
        with pytest.raises(BadMessageError):
            future.result(TIMEOUT)
        with pytest.raises(ValueError):
            producer.pub("not a topic!", b"m")  # bad input: raised before anything is sent
    big = telemetry.wait_spans("publish otel_big", 2)
    for span in big:
        assert span.status.status_code is StatusCode.ERROR
        assert "BadMessageError" in span.status.description
        assert span.attributes[n.ERROR_TYPE] == "nsqclient.errors.BadMessageError"
        (event,) = span.events
        assert event.name == "exception"
        assert event.attributes["exception.type"].endswith("BadMessageError")
    assert telemetry.spans("publish not a topic!") == []  # bad input: not an operation
    refused = {n.ERROR_TYPE: "nsqclient.errors.BadMessageError"}
    assert telemetry.total(n.SENT_MESSAGES, **refused) == 2  # attempted, refused
    assert telemetry.total(n.OPERATION_DURATION, **refused) == 2
    assert telemetry.total(n.OPERATION_DURATION) == 2  # and none for the bad input


@pytest.mark.embedded_only
def test_an_async_publish_span_ends_when_nsqd_answers(telemetry, nsqd):
    with Producer(nsqd.nsqd.tcp_address) as producer:
        producer.pub("otel_wait", b"connect first")
        nsqd.stall_nsqd(0)
        try:
            future = producer.pub_async("otel_wait", b"waits")
            assert not future.done()
            assert len(telemetry.spans("publish otel_wait")) == 1  # the second is still open
        finally:
            nsqd.unstall_nsqd(0)
        assert future.result(TIMEOUT) == b"OK"
    first, second = telemetry.wait_spans("publish otel_wait", 2)
    assert second.status.status_code is StatusCode.UNSET
    assert second.attributes[n.SERVER_PORT] == server_of(nsqd)[1]


# ------------------------------------------------------------------------------------------
# Consuming


def test_the_process_span_is_current_while_the_handler_runs(telemetry, nsqd, consumers):
    seen: list[Any] = []
    done = threading.Event()
    out = Producer(nsqd.nsqd.tcp_address)

    def handle(message: Message) -> None:
        span = trace.get_current_span()
        seen.append((span.get_span_context(), getattr(span, "name", None)))
        out.pub("otel_out", message.body)  # a relay: its publish span is the process span's child
        done.set()

    consumer = consumers("otel_in", "c", handle, nsqd_tcp_addresses=[nsqd.nsqd.tcp_address])
    subscribed(consumer)
    publish(nsqd.nsqd, "otel_in", [b"relay me"])
    assert done.wait(TIMEOUT)
    (process,) = telemetry.wait_spans("process otel_in", 1)
    out.close()
    (relayed,) = telemetry.wait_spans("publish otel_out", 1)
    ((context, name),) = seen
    assert name == "process otel_in"
    assert context.span_id == process.context.span_id
    assert relayed.parent is not None and relayed.parent.span_id == process.context.span_id
    assert relayed.context.trace_id == process.context.trace_id
    assert process.kind is SpanKind.CONSUMER
    assert process.parent is None  # classic NSQ carries no context: a trace starts here
    assert process.status.status_code is StatusCode.UNSET
    host, port = server_of(nsqd)
    attributes = process.attributes
    assert attributes[n.SYSTEM] == "nsq"
    assert attributes[n.DESTINATION] == "otel_in"
    assert attributes[n.CONSUMER_GROUP] == "c"
    assert attributes[n.OPERATION_TYPE] == "process"
    assert attributes[n.OPERATION_NAME] == "process"
    assert attributes[n.NSQ_ATTEMPTS] == 1
    assert attributes[n.BODY_SIZE] == len(b"relay me")
    assert len(attributes[n.MESSAGE_ID]) == 16  # nsqd's hex id
    assert (attributes[n.SERVER_ADDRESS], attributes[n.SERVER_PORT]) == (host, port)
    assert process.events == ()  # finished: a FIN is no event of its own (see finish_events)
    group = {n.CONSUMER_GROUP: "c", n.DESTINATION: "otel_in"}
    wait_for(lambda: telemetry.total(n.PROCESS_DURATION, **group) == 1, TIMEOUT)
    assert telemetry.total(n.CONSUMED_MESSAGES, **group) == 1
    assert telemetry.total(n.CONSUMED_MESSAGES, **{n.SERVER_PORT: port}) == 1


def test_finish_events_records_each_fin_on_its_process_span(nsqd, consumers):
    t = Telemetry()
    NSQInstrumentor().instrument(
        tracer_provider=t.tracer_provider, meter_provider=t.meter_provider, finish_events=True
    )
    try:
        consumer = consumers(
            "otel_fin_events", "c", lambda m: None, nsqd_tcp_addresses=[nsqd.nsqd.tcp_address]
        )
        subscribed(consumer)
        publish(nsqd.nsqd, "otel_fin_events", [b"a", b"b"])
        for span in t.wait_spans("process otel_fin_events", 2):
            assert [e.name for e in span.events] == [n.EVENT_FINISH]
            assert span.status.status_code is StatusCode.UNSET
    finally:
        NSQInstrumentor().uninstrument()
        t.shutdown()


def test_requeued_messages_are_error_spans(telemetry, nsqd, consumers):
    bodies: dict[str, bytes] = {}  # message id -> body
    lock = threading.Lock()

    def handle(message: Message) -> Any:
        with lock:
            bodies[message.id.decode()] = message.body
        if message.attempts > 1:
            return None
        if message.body == b"raise":
            raise RuntimeError("first attempt fails")
        if message.body == b"false":
            return False
        raise RequeueMessage(delay=0, backoff=False)

    consumer = consumers(
        "otel_fail",
        "c",
        handle,
        nsqd_tcp_addresses=[nsqd.nsqd.tcp_address],
        max_in_flight=3,
        default_requeue_delay=0.0,
        max_backoff_duration=0.0,
    )
    subscribed(consumer)
    publish(nsqd.nsqd, "otel_fail", [b"raise", b"false", b"requeue"])
    spans = telemetry.wait_spans("process otel_fail", 6)
    first = {
        bodies[s.attributes[n.MESSAGE_ID]]: s for s in spans if s.attributes[n.NSQ_ATTEMPTS] == 1
    }
    second = [s for s in spans if s.attributes[n.NSQ_ATTEMPTS] == 2]
    raised, returned, asked = first[b"raise"], first[b"false"], first[b"requeue"]
    for span in (raised, returned, asked):
        assert span.status.status_code is StatusCode.ERROR
        assert span.events[-1].name == n.EVENT_REQUEUE
    assert raised.attributes[n.ERROR_TYPE] == "RuntimeError"
    assert [e.name for e in raised.events] == ["exception", n.EVENT_REQUEUE]
    assert raised.events[0].attributes["exception.message"] == "first attempt fails"
    assert raised.events[1].attributes[n.NSQ_REQUEUE_BACKOFF] is True
    assert returned.attributes[n.ERROR_TYPE] == n.ERROR_REQUEUED
    assert [e.name for e in returned.events] == [n.EVENT_REQUEUE]
    assert asked.attributes[n.ERROR_TYPE] == n.ERROR_REQUEUED
    assert asked.events[-1].attributes == {n.NSQ_REQUEUE_DELAY: 0.0, n.NSQ_REQUEUE_BACKOFF: False}
    assert len(second) == 3
    for span in second:
        assert span.status.status_code is StatusCode.UNSET
        assert span.events == ()
    wait_for(lambda: telemetry.total(n.PROCESS_DURATION) == 6, TIMEOUT)
    assert telemetry.total(n.PROCESS_DURATION, **{n.ERROR_TYPE: "RuntimeError"}) == 1
    assert telemetry.total(n.PROCESS_DURATION, **{n.ERROR_TYPE: n.ERROR_REQUEUED}) == 2
    assert telemetry.total(n.CONSUMED_MESSAGES) == 6


def test_answers_after_the_handler_returned_are_spans_linked_to_it(telemetry, nsqd, consumers):
    held: list[Message] = []
    returned = threading.Event()

    def handle(message: Message) -> None:
        if message.attempts > 1:
            return  # the requeued one, back: finished at once
        message.touch()  # while the span is open: an event on it
        message.enable_async()
        held.append(message)
        if len(held) == 2:
            returned.set()

    consumer = consumers(
        "otel_async",
        "c",
        handle,
        nsqd_tcp_addresses=[nsqd.nsqd.tcp_address],
        max_in_flight=2,
        default_requeue_delay=0.0,
        max_backoff_duration=0.0,
    )
    subscribed(consumer)
    publish(nsqd.nsqd, "otel_async", [b"finish me", b"requeue me"])
    assert returned.wait(TIMEOUT)
    processed = telemetry.wait_spans("process otel_async", 2)
    by_id = {s.attributes[n.MESSAGE_ID]: s for s in processed}
    finish, requeue = sorted(held, key=lambda m: m.body)
    finish.touch()
    finish.finish()
    requeue.requeue()
    (touch_span,) = telemetry.wait_spans("touch otel_async", 1)
    (finish_span,) = telemetry.wait_spans("finish otel_async", 1)
    (requeue_span,) = telemetry.wait_spans("requeue otel_async", 1)
    for span, message in ((touch_span, finish), (finish_span, finish), (requeue_span, requeue)):
        assert span.kind is SpanKind.CLIENT
        (link,) = span.links
        process = by_id[message.id.decode()]
        assert link.context.span_id == process.context.span_id
        assert span.attributes[n.MESSAGE_ID] == message.id.decode()
        assert span.attributes[n.CONSUMER_GROUP] == "c"
    assert finish_span.attributes[n.OPERATION_TYPE] == "settle"
    assert finish_span.attributes[n.OPERATION_NAME] == "finish"
    assert finish_span.status.status_code is StatusCode.UNSET
    assert n.OPERATION_TYPE not in touch_span.attributes
    assert requeue_span.attributes[n.OPERATION_NAME] == "requeue"
    assert requeue_span.status.status_code is StatusCode.ERROR
    for process in processed:
        assert process.status.status_code is StatusCode.UNSET  # the handler did not fail
        assert [e.name for e in process.events] == [n.EVENT_TOUCH]
    # the requeued message comes back and is finished by its handler
    (again,) = [s for s in telemetry.wait_spans("process otel_async", 3) if s not in processed]
    assert again.attributes[n.NSQ_ATTEMPTS] == 2


def test_answers_from_another_thread_while_the_handler_runs_are_events_on_its_span(
    telemetry, nsqd, consumers
):
    def handle(message: Message) -> None:
        if message.attempts > 1:
            return  # the requeued one, back: finished at once
        other = threading.Thread(target=lambda: (message.touch(), message.requeue(0, False)))
        other.start()
        other.join(TIMEOUT)

    consumer = consumers(
        "otel_other_thread", "c", handle, nsqd_tcp_addresses=[nsqd.nsqd.tcp_address]
    )
    subscribed(consumer)
    publish(nsqd.nsqd, "otel_other_thread", [b"answered elsewhere"])
    first, again = telemetry.wait_spans("process otel_other_thread", 2)
    assert [e.name for e in first.events] == [n.EVENT_TOUCH, n.EVENT_REQUEUE]
    assert first.status.status_code is StatusCode.ERROR
    assert first.attributes[n.ERROR_TYPE] == n.ERROR_REQUEUED
    assert again.attributes[n.NSQ_ATTEMPTS] == 2
    assert again.events == () and again.status.status_code is StatusCode.UNSET
    assert telemetry.spans("requeue otel_other_thread") == []  # no span of its own


def test_messages_handled_on_several_workers_are_each_counted_once(telemetry, nsqd, consumers):
    count = 200
    handled: list[bytes] = []
    lock = threading.Lock()

    def handle(message: Message) -> None:
        with lock:
            handled.append(message.body)

    consumer = consumers(
        "otel_workers",
        "c",
        handle,
        nsqd_tcp_addresses=[nsqd.nsqd.tcp_address],
        concurrency=4,
        max_in_flight=50,
    )
    subscribed(consumer)
    publish(nsqd.nsqd, "otel_workers", [b"%d" % i for i in range(count)])
    spans = telemetry.wait_spans("process otel_workers", count)
    assert len({s.context.span_id for s in spans}) == count
    assert sorted(s.attributes[n.MESSAGE_ID] for s in spans) == sorted(
        {s.attributes[n.MESSAGE_ID] for s in spans}
    )
    group = {n.DESTINATION: "otel_workers"}
    wait_for(lambda: telemetry.total(n.PROCESS_DURATION, **group) == count, TIMEOUT)
    assert telemetry.total(n.CONSUMED_MESSAGES, **group) == count
    consumer.stop(timeout=5.0)  # its workers end: what they counted stays counted
    assert telemetry.total(n.CONSUMED_MESSAGES, **group) == count
    assert len(handled) == count


def test_giving_up_is_recorded_on_the_span(telemetry, nsqd, consumers):
    given_up: list[Message] = []
    handled: list[int] = []

    def handle(message: Message) -> None:
        handled.append(message.attempts)
        raise RuntimeError("always fails")

    consumer = consumers(
        "otel_give_up",
        "c",
        handle,
        nsqd_tcp_addresses=[nsqd.nsqd.tcp_address],
        giving_up=given_up.append,
        max_tries=1,
        default_requeue_delay=0.0,
        max_backoff_duration=0.0,
    )
    subscribed(consumer)
    publish(nsqd.nsqd, "otel_give_up", [b"doomed"])
    failed, dropped = telemetry.wait_spans("process otel_give_up", 2)
    assert handled == [1] and len(given_up) == 1
    assert failed.attributes[n.ERROR_TYPE] == "RuntimeError"
    assert dropped.attributes[n.NSQ_ATTEMPTS] == 2
    assert [e.name for e in dropped.events] == [n.EVENT_GIVE_UP, n.EVENT_FINISH]
    assert dropped.events[0].attributes == {n.NSQ_ATTEMPTS: 2, n.NSQ_MAX_TRIES: 1}
    assert dropped.status.status_code is StatusCode.ERROR
    assert dropped.attributes[n.ERROR_TYPE] == n.ERROR_GIVEN_UP


# ------------------------------------------------------------------------------------------
# What an operator watches


def test_gauges_show_rdy_in_flight_backoff_and_connections(telemetry, nsqd, consumers):
    release = threading.Event()
    started = threading.Event()

    def handle(message: Message) -> None:
        started.set()
        release.wait(TIMEOUT)  # the load: a slow handler

    consumer = consumers(
        "otel_gauges", "c", handle, nsqd_tcp_addresses=[nsqd.nsqd.tcp_address], max_in_flight=4
    )
    subscribed(consumer)
    host, port = server_of(nsqd)
    connection = {n.DESTINATION: "otel_gauges", n.CONSUMER_GROUP: "c", n.SERVER_PORT: port}
    try:
        publish(nsqd.nsqd, "otel_gauges", [b"slow"])
        assert started.wait(TIMEOUT)
        assert telemetry.total("nsq.consumer.in_flight", **connection) == 1
        # RDY 1 until the first message, then max_in_flight (the RDY thread raises it)
        wait_for(lambda: telemetry.total("nsq.consumer.rdy", **connection) == 4, TIMEOUT)
        assert telemetry.total("nsq.consumer.connections", **{n.DESTINATION: "otel_gauges"}) == 1
        assert telemetry.total("nsq.consumer.backoff.level", **{n.CONSUMER_GROUP: "c"}) == 0
        (point,) = telemetry.points("nsq.consumer.rdy")
        assert point[0] == {
            n.SYSTEM: "nsq",
            n.DESTINATION: "otel_gauges",
            n.CONSUMER_GROUP: "c",
            n.SERVER_ADDRESS: host,
            n.SERVER_PORT: port,
        }
    finally:
        release.set()
    wait_for(lambda: telemetry.total("nsq.consumer.in_flight", **connection) == 0, TIMEOUT)
    with Producer(nsqd.nsqd.tcp_address) as producer:
        producer.pub("otel_gauges", b"m")
        assert telemetry.total("nsq.producer.in_flight", **{n.SERVER_PORT: port}) == 0
        assert telemetry.total("nsq.producer.reconnects", **{n.SERVER_PORT: port}) == 0
    consumer.stop()
    assert telemetry.points("nsq.consumer.connections") == []  # a stopped consumer is not seen


@pytest.mark.embedded_only
def test_reconnects_are_counted(telemetry, nsqd, consumers):
    consumer = consumers(
        "otel_reconnect",
        "c",
        lambda m: None,
        nsqd_tcp_addresses=[nsqd.nsqd.tcp_address],
        reconnect_interval=0.05,
    )
    subscribed(consumer)
    port = server_of(nsqd)[1]
    with Producer(nsqd.nsqd.tcp_address) as producer:
        producer.pub("otel_reconnect", b"m")
        assert telemetry.total("nsq.consumer.reconnects", **{n.SERVER_PORT: port}) == 0
        nsqd.drop_connections(0)
        wait_for(
            lambda: telemetry.total("nsq.consumer.reconnects", **{n.SERVER_PORT: port}) == 1,
            TIMEOUT,
        )
        wait_for(lambda: not producer.stats()["nsqd"][0]["connected"], TIMEOUT)
        producer.pub("otel_reconnect", b"m")  # connects again
        assert telemetry.total("nsq.producer.reconnects", **{n.SERVER_PORT: port}) == 1


# ------------------------------------------------------------------------------------------
# pynsq's Reader and Writer


def test_pynsq_reader_and_writer_are_traced_through_consumer_and_producer(telemetry, nsqd):
    answers: list[Any] = []
    handled = threading.Event()
    writer = Writer(nsqd.nsqd.tcp_address)
    reader = None
    try:
        writer.pub("otel_compat", b"hello", lambda conn, data: answers.append(data))
        writer.mpub("otel_compat", [b"a", b"b"]).result(TIMEOUT)

        def handler(message: Message) -> bool:
            if message.attempts == 1 and message.body == b"a":
                return False  # pynsq's requeue
            if len(telemetry.spans("process otel_compat")) >= 3:
                handled.set()
            return True

        reader = Reader(
            topic="otel_compat",
            channel="c",
            message_handler=handler,
            nsqd_tcp_addresses=[nsqd.nsqd.tcp_address],
            max_in_flight=3,
            requeue_delay=0,
            max_backoff_duration=0,
        )
        reader.start()
        spans = telemetry.wait_spans("process otel_compat", 4)
    finally:
        if reader is not None:
            reader.close()
        writer.close()
    publishes = telemetry.wait_spans("publish otel_compat", 2)
    assert [s.attributes[n.NSQ_COMMAND] for s in publishes] == ["PUB", "MPUB"]
    assert answers == [b"OK"]
    errors = [s for s in spans if s.status.status_code is StatusCode.ERROR]
    assert len(errors) == 1 and errors[0].attributes[n.ERROR_TYPE] == n.ERROR_REQUEUED
    assert all(s.attributes[n.CONSUMER_GROUP] == "c" for s in spans)


# ------------------------------------------------------------------------------------------
# instrument() and uninstrument()


def test_instrument_replaces_nothing_and_uninstrument_records_nothing_after(nsqd, consumers):
    before = class_dicts()
    t = Telemetry()
    NSQInstrumentor().instrument(tracer_provider=t.tracer_provider, meter_provider=t.meter_provider)
    try:
        # one observer of the core, and not one attribute of a class replaced
        assert class_dicts() == before
        assert len(ours()) == 1
        got = threading.Event()
        consumer = consumers(
            "otel_un", "c", lambda m: got.set(), nsqd_tcp_addresses=[nsqd.nsqd.tcp_address]
        )
        subscribed(consumer)
        with Producer(nsqd.nsqd.tcp_address) as producer:
            producer.pub_async("otel_un", b"while instrumented").result(TIMEOUT)
            assert got.wait(TIMEOUT)
            assert "nsq-otel" in {t.name for t in threading.enumerate()}
            t.wait_spans("process otel_un", 1)
            t.wait_spans("publish otel_un", 1)
            assert t.points("nsq.consumer.connections")
            assert t.total(n.SENT_MESSAGES) == 1
            wait_for(lambda: t.total(n.PROCESS_DURATION) == 1, TIMEOUT)
        durations = t.total(n.OPERATION_DURATION), t.total(n.PROCESS_DURATION)
        NSQInstrumentor().uninstrument()
        assert "nsq-otel" not in {t.name for t in threading.enumerate()}  # joined
        assert class_dicts() == before
        assert ours() == []
        ended = len(t.spans())
        got.clear()
        with Producer(nsqd.nsqd.tcp_address) as producer:
            producer.pub("otel_un", b"after")
            producer.pub_async("otel_un", b"after").result(TIMEOUT)
            assert got.wait(TIMEOUT)
        consumer.stop()
        assert len(t.spans()) == ended
        assert (t.total(n.OPERATION_DURATION), t.total(n.PROCESS_DURATION)) == durations
        for name in (
            n.SENT_MESSAGES,
            n.CONSUMED_MESSAGES,
            "nsq.consumer.connections",
            "nsq.producer.in_flight",
            "nsq.consumer.rdy",
        ):
            assert t.points(name) == [], name  # observed no more
    finally:
        if NSQInstrumentor().is_instrumented_by_opentelemetry:
            NSQInstrumentor().uninstrument()
        t.shutdown()


def test_the_instrumentation_uses_only_the_public_surface_of_the_core():
    """nsqclient.otel reads no private name of another module (docs/contributing.rst, "The
    layers": where an add-on needs one, the core gets a public call) and imports no conn or
    transport."""
    import nsqclient.otel

    found = []
    for path in sorted(Path(nsqclient.otel.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            where = f"{path.name}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Attribute) and _private(node.attr):
                if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                    found.append(f"{where} .{node.attr}")
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level < 2 and not module.startswith("nsqclient"):
                    continue  # opentelemetry, the standard library, or nsqclient.otel itself
                parts = module.split(".")
                names = [a.name for a in node.names]
                if any(_private(p) or p in ("conn", "transport") for p in parts) or any(
                    _private(name) for name in names
                ):
                    found.append(f"{where} from {'.' * node.level}{module} import {names}")
    assert found == []


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_clients_made_before_instrument_are_traced_and_measured(nsqd, consumers):
    got = threading.Event()
    consumer = consumers(
        "otel_before", "c", lambda m: got.set(), nsqd_tcp_addresses=[nsqd.nsqd.tcp_address]
    )
    subscribed(consumer)
    producer = Producer(nsqd.nsqd.tcp_address)
    try:
        producer.pub("otel_before", b"before")  # connected before instrument()
        assert got.wait(TIMEOUT)
        got.clear()
        t = Telemetry()
        NSQInstrumentor().instrument(
            tracer_provider=t.tracer_provider, meter_provider=t.meter_provider
        )
        try:
            port = server_of(nsqd)[1]
            assert t.total("nsq.consumer.connections", **{n.DESTINATION: "otel_before"}) == 1
            assert t.total("nsq.consumer.reconnects", **{n.SERVER_PORT: port}) == 0
            assert t.total("nsq.producer.reconnects", **{n.SERVER_PORT: port}) == 0
            producer.pub("otel_before", b"after")
            assert got.wait(TIMEOUT)
            (publish,) = t.wait_spans("publish otel_before", 1)
            (process,) = t.wait_spans("process otel_before", 1)
            assert publish.attributes[n.SERVER_PORT] == port
            assert process.attributes[n.NSQ_ATTEMPTS] == 1
            assert t.total(n.SENT_MESSAGES) == 1
        finally:
            NSQInstrumentor().uninstrument()
            t.shutdown()
    finally:
        producer.close()


def test_instrumenting_twice_is_harmless(telemetry, nsqd, caplog):
    other = Telemetry()
    try:
        with caplog.at_level(logging.WARNING):
            NSQInstrumentor().instrument(
                tracer_provider=other.tracer_provider, meter_provider=other.meter_provider
            )
        assert "already instrumented" in caplog.text
        assert len(ours()) == 1  # one observer, not two
        with Producer(nsqd.nsqd.tcp_address) as producer:
            producer.pub("otel_twice", b"m")
        assert len(telemetry.wait_spans("publish otel_twice", 1)) == 1
        assert other.spans() == []
    finally:
        other.shutdown()
    assert NSQInstrumentor() is NSQInstrumentor()


def test_instrument_refuses_an_unknown_inject_mode():
    with pytest.raises(ValueError, match="inject"):
        NSQInstrumentor().instrument(inject="sometimes")
    assert not NSQInstrumentor().is_instrumented_by_opentelemetry
    assert ours() == []


def test_nothing_of_opentelemetry_is_loaded_until_instrumented():
    code = textwrap.dedent(
        """
        import sys
        import nsqclient
        import nsqclient.otel
        from nsqclient.otel import configure_from_env
        assert configure_from_env(environ={}) is False
        assert nsqclient.observe.global_observers() == ()
        print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
        from nsqclient.otel import NSQInstrumentor
        print(NSQInstrumentor.__name__)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.splitlines() == ["[]", "NSQInstrumentor"]


def test_the_names_are_the_semantic_conventions():
    semconv = pytest.importorskip(
        "opentelemetry.semconv._incubating.attributes.messaging_attributes"
    )
    semconv_metrics = pytest.importorskip(
        "opentelemetry.semconv._incubating.metrics.messaging_metrics"
    )
    assert n.SYSTEM == semconv.MESSAGING_SYSTEM
    assert n.DESTINATION == semconv.MESSAGING_DESTINATION_NAME
    assert n.CONSUMER_GROUP == semconv.MESSAGING_CONSUMER_GROUP_NAME
    assert n.PARTITION == semconv.MESSAGING_DESTINATION_PARTITION_ID
    assert n.OPERATION_TYPE == semconv.MESSAGING_OPERATION_TYPE
    assert n.OPERATION_NAME == semconv.MESSAGING_OPERATION_NAME
    assert n.MESSAGE_ID == semconv.MESSAGING_MESSAGE_ID
    assert n.BODY_SIZE == semconv.MESSAGING_MESSAGE_BODY_SIZE
    assert n.BATCH_COUNT == semconv.MESSAGING_BATCH_MESSAGE_COUNT
    values = semconv.MessagingOperationTypeValues
    assert {"send", "process", "settle"} <= {v.value for v in values}
    assert n.SENT_MESSAGES == semconv_metrics.MESSAGING_CLIENT_SENT_MESSAGES
    assert n.CONSUMED_MESSAGES == semconv_metrics.MESSAGING_CLIENT_CONSUMED_MESSAGES
    assert n.OPERATION_DURATION == semconv_metrics.MESSAGING_CLIENT_OPERATION_DURATION
    assert n.PROCESS_DURATION == semconv_metrics.MESSAGING_PROCESS_DURATION
