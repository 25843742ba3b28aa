"""OpenTelemetry on youzan's partitioned NSQ (the embedded youzan cluster): the W3C trace context
travels in the ext header of extend-support topics, so each process span is the child of its
publish span; partitions, leaders and message ids are on the spans."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is not installed")
pytest.importorskip("opentelemetry.instrumentation", reason="nsqclient[otel] is not installed")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

from nsqclient import Consumer, Message, Producer  # noqa: E402
from nsqclient.otel import NSQInstrumentor  # noqa: E402
from nsqclient.otel import names as n  # noqa: E402
from nsqclient.testing import EmbeddedNSQ  # noqa: E402
from nsqclient.testing.waiting import wait_for  # noqa: E402

TIMEOUT = 10.0


class Spans:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def named(self, name: str, count: int) -> list[ReadableSpan]:
        """Wait until ``count`` spans named ``name`` have ended; return them."""
        return wait_for(
            lambda: (
                len(found := [s for s in self.exporter.get_finished_spans() if s.name == name])
                >= count
                and found
            ),
            TIMEOUT,
            message=lambda: f"{count} spans {name!r}",
        )


@pytest.fixture
def instrumented() -> Iterator[Callable[..., Spans]]:
    """``instrumented(**options) -> Spans``: nsqclient instrumented with those options."""
    made: list[Spans] = []

    def instrument(**options: Any) -> Spans:
        spans = Spans()
        made.append(spans)
        NSQInstrumentor().instrument(tracer_provider=spans.provider, **options)
        return spans

    yield instrument
    if NSQInstrumentor().is_instrumented_by_opentelemetry:
        NSQInstrumentor().uninstrument()
    for spans in made:
        spans.provider.shutdown()


@pytest.fixture
def cluster() -> Iterator[EmbeddedNSQ]:
    with EmbeddedNSQ(youzan=True, nsqd_count=2) as c:
        yield c


@pytest.fixture
def clients(cluster: EmbeddedNSQ, consumers: Any) -> Iterator[Any]:
    """``producer()`` and ``consume(topic, count) -> messages`` through the cluster's lookupd."""
    producers: list[Producer] = []

    class Clients:
        def producer(self) -> Producer:
            producer = Producer(lookupd_http_addresses=[cluster.lookupd.http_address])
            producers.append(producer)
            return producer

        def consume(self, topic: str, count: int) -> list[Message]:
            got: list[Message] = []
            lock = threading.Lock()

            def handle(message: Message) -> None:
                with lock:
                    got.append(message)

            consumer = consumers(
                topic,
                "c",
                handle,
                lookupd_http_addresses=[cluster.lookupd.http_address],
                lookupd_poll_interval=0.5,
                max_in_flight=10,
            )
            wait_for(lambda: len(got) >= count, TIMEOUT, message=lambda: f"got {len(got)}")
            consumer.stop()
            return got

    yield Clients()
    for producer in producers:
        producer.close()


def make_topic(cluster: EmbeddedNSQ, topic: str, ext: bool) -> None:
    cluster.create_topic(topic, partitions=2, replica=1, ext=ext)
    cluster.create_channel(topic, "c")


def test_process_spans_are_children_of_their_publish_spans(instrumented, cluster, clients):
    spans = instrumented()
    make_topic(cluster, "yz_otel", ext=True)
    producer = clients.producer()
    traced = producer.pub("yz_otel", b"traced", partition=0, trace_id=77)
    producer.pub("yz_otel", b"headers", ext={"k": "v"})
    producer.mpub("yz_otel", [b"batch 1", b"batch 2"], partition=1)
    producer.pub_async("yz_otel", b"async").result(TIMEOUT)
    messages = {m.body: m for m in clients.consume("yz_otel", 5)}
    publishes = spans.named("publish yz_otel", 4)
    processes = spans.named("process yz_otel", 5)

    # every message carries the context of its publish span, beside its own headers
    assert messages[b"headers"].ext["k"] == "v"
    assert messages[b"traced"].ext["##trace_id"] == "77"  # youzan's trace id stays as it was
    assert messages[b"traced"].trace_id == 77
    assert all("traceparent" in m.ext for m in messages.values())
    by_id = {s.context.span_id: s for s in publishes}
    for process in processes:
        assert process.parent is not None and process.parent.is_remote
        parent = by_id[process.parent.span_id]
        assert process.context.trace_id == parent.context.trace_id
        assert process.attributes[n.PARTITION] == parent.attributes[n.PARTITION]
        assert process.attributes[n.SERVER_PORT] == parent.attributes[n.SERVER_PORT]
    body = {str(m.internal_id): m.body for m in messages.values()}  # by messaging.message.id
    batch = [p for p in processes if body[p.attributes[n.MESSAGE_ID]].startswith(b"batch")]
    assert len(batch) == 2 and batch[0].parent.span_id == batch[1].parent.span_id

    # publish spans name the partition, its leader and (traced) the message id
    first = publishes[0]
    assert first.attributes[n.PARTITION] == "0"
    assert first.attributes[n.MESSAGE_ID] == str(traced.message_id)
    leader = cluster.nsqds[cluster.partition_leader("yz_otel", 0)]
    assert f"{first.attributes[n.SERVER_ADDRESS]}:{first.attributes[n.SERVER_PORT]}" == (
        leader.tcp_address
    )
    (received,) = [p for p in processes if body[p.attributes[n.MESSAGE_ID]] == b"traced"]
    assert received.parent.span_id == first.context.span_id
    assert received.attributes[n.NSQ_YOUZAN_TRACE_ID] == 77
    assert publishes[2].attributes[n.BATCH_COUNT] == 2
    assert publishes[2].attributes[n.PARTITION] == "1"
    assert all(n.PARTITION in p.attributes for p in publishes)


def test_topics_without_extend_support_get_no_header(instrumented, cluster, clients):
    spans = instrumented()
    make_topic(cluster, "yz_plain", ext=False)
    clients.producer().pub("yz_plain", b"m")
    (message,) = clients.consume("yz_plain", 1)
    assert message.ext is None
    (publish,) = spans.named("publish yz_plain", 1)
    (process,) = spans.named("process yz_plain", 1)
    assert process.parent is None
    assert process.context.trace_id != publish.context.trace_id


def test_inject_given_adds_no_header_of_its_own(instrumented, cluster, clients):
    spans = instrumented(inject="given")
    make_topic(cluster, "yz_given", ext=True)
    producer = clients.producer()
    producer.pub("yz_given", b"bare")
    producer.pub("yz_given", b"with", ext={"k": "v"})
    messages = {m.body: m for m in clients.consume("yz_given", 2)}
    assert messages[b"bare"].ext is None
    assert set(messages[b"with"].ext) >= {"k", "traceparent"}
    body = {str(m.internal_id): m.body for m in messages.values()}
    parents = {
        body[p.attributes[n.MESSAGE_ID]]: p.parent for p in spans.named("process yz_given", 2)
    }
    assert parents[b"with"] is not None and parents[b"bare"] is None


def test_inject_never_and_extract_off(instrumented, cluster, clients):
    spans = instrumented(inject="never", extract=False)
    make_topic(cluster, "yz_never", ext=True)
    clients.producer().pub("yz_never", b"m", ext={"k": "v"})
    (message,) = clients.consume("yz_never", 1)
    assert message.ext == {"k": "v"}  # untouched
    NSQInstrumentor().uninstrument()
    spans = instrumented(extract=False)
    clients.producer().pub("yz_never", b"m2")
    (message,) = clients.consume("yz_never", 1)
    assert "traceparent" in message.ext
    (process,) = spans.named("process yz_never", 1)
    assert process.parent is None  # the header is there, but not read


def test_a_traced_mpub_keeps_its_trace_result(instrumented, cluster, clients):
    instrumented()
    make_topic(cluster, "yz_mtrace", ext=True)
    producer = clients.producer()
    result = producer.mpub("yz_mtrace", [b"a", b"b"], partition=0, trace_id=5)
    assert result is not None and result.partition == 0  # MPUB_TRACE, not an MPUB_EXT
    messages = clients.consume("yz_mtrace", 2)
    assert all(m.ext is None or "traceparent" not in m.ext for m in messages)


def test_an_async_publish_before_the_route_is_known_still_traces(instrumented, cluster, clients):
    spans = instrumented()
    make_topic(cluster, "yz_cold", ext=True)
    producer = clients.producer()
    producer.pub_async("yz_cold", b"first").result(TIMEOUT)  # looked up on the backlog thread
    producer.pub_async("yz_cold", b"second").result(TIMEOUT)  # the route is cached now
    messages = {m.body: m for m in clients.consume("yz_cold", 2)}
    assert messages[b"first"].ext is None  # the route was not known at the call: no header
    assert "traceparent" in messages[b"second"].ext
    published = spans.named("publish yz_cold", 2)
    assert all(s.status.is_ok for s in published)
    processes = spans.named("process yz_cold", 2)
    assert sum(p.parent is not None for p in processes) == 1


def test_an_async_publish_looked_up_on_the_backlog_names_its_nsqd(instrumented, cluster, clients):
    spans = instrumented()
    make_topic(cluster, "yz_cold2", ext=False)
    producer = clients.producer()
    producer.pub_async("yz_cold2", b"first", partition=1).result(TIMEOUT)
    producer.pub_async("yz_cold2", b"again").result(TIMEOUT)  # no partition given, cold or not
    leader = cluster.nsqds[cluster.partition_leader("yz_cold2", 1)]
    first, again = spans.named("publish yz_cold2", 2)
    address = f"{first.attributes[n.SERVER_ADDRESS]}:{first.attributes[n.SERVER_PORT]}"
    assert address == leader.tcp_address
    assert again.attributes[n.PARTITION] in ("0", "1")


def test_consumers_made_before_instrumenting_are_traced(cluster, clients, instrumented):
    make_topic(cluster, "yz_before", ext=True)
    got = threading.Event()
    consumer = Consumer(
        "yz_before",
        "c",
        lambda m: got.set(),
        lookupd_http_addresses=[cluster.lookupd.http_address],
        lookupd_poll_interval=0.5,
        max_in_flight=2,  # RDY on both partitions
    )
    consumer.start()
    try:
        spans = instrumented()
        clients.producer().pub("yz_before", b"m")
        assert got.wait(TIMEOUT)
        (process,) = spans.named("process yz_before", 1)
        (publish,) = spans.named("publish yz_before", 1)
        assert process.parent is not None and process.parent.span_id == publish.context.span_id
    finally:
        consumer.stop()


def test_an_offset_going_back_is_counted_per_partition():
    """youzan's nsqd sending an ordered partition from an earlier offset (a leader back with a
    shorter queue than it acknowledged) is a counter, ``nsq.consumer.out_of_order``."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from nsqclient.protocol import DecodedMessage

    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    NSQInstrumentor().instrument(meter_provider=meters)
    consumer = Consumer(
        "yz_back", "c", lambda m: None, lookupd_http_addresses=["127.0.0.1:4161"], ordered=True
    )
    try:
        for partition, offset in [(0, 10), (0, 20), (0, 5), (1, 7), (1, 3), (0, 2)]:
            decoded = DecodedMessage(0, 1, b"\0" * 16, b"m", 1, 0, offset, 10)
            message = Message(decoded, partition=partition)
            message.nsqd_address = "127.0.0.1:4150"
            consumer._check_offset(message)
        data = reader.get_metrics_data()
        points = [
            (dict(p.attributes or {}), p.value)
            for r in data.resource_metrics
            for s in r.scope_metrics
            for m in s.metrics
            if m.name == n.OUT_OF_ORDER
            for p in m.data.data_points
        ]
    finally:
        NSQInstrumentor().uninstrument()
        meters.shutdown()
    by_partition = {a[n.PARTITION]: v for a, v in points}
    assert by_partition == {"0": 2, "1": 1}
    assert all(
        a[n.DESTINATION] == "yz_back" and a[n.CONSUMER_GROUP] == "c" and a[n.SERVER_PORT] == 4150
        for a, _ in points
    )
