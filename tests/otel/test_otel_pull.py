"""OpenTelemetry on pull mode (``Consumer(topic, channel, None)`` and ``take()``), on unsampled
spans, and on what only an observer told explicitly can record (the handler's exception from
``handler_ended``), against the broker (embedded NSQ, or real nsqd with NSQ_BIN_DIR; the
youzan case on the embedded youzan cluster)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is not installed")
pytest.importorskip("opentelemetry.instrumentation", reason="nsqclient[otel] is not installed")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF  # noqa: E402
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402
from test_otel import Telemetry, server_of, subscribed  # noqa: E402

from nsqclient import Consumer, Message, Producer  # noqa: E402
from nsqclient.otel import NSQInstrumentor  # noqa: E402
from nsqclient.otel import names as n  # noqa: E402
from nsqclient.testing import EmbeddedNSQ  # noqa: E402
from nsqclient.testing.helpers import publish, wait_drained  # noqa: E402
from nsqclient.testing.waiting import wait_for  # noqa: E402

TIMEOUT = 10.0


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    t = Telemetry()
    NSQInstrumentor().instrument(tracer_provider=t.tracer_provider, meter_provider=t.meter_provider)
    yield t
    NSQInstrumentor().uninstrument()
    t.shutdown()


def take_n(consumer: Consumer, count: int, max_messages: int | None = None) -> list[Message]:
    """Take until ``count`` messages were taken (TIMEOUT at most)."""
    taken: list[Message] = []

    def more() -> bool:
        taken.extend(consumer.take(max_messages, timeout=0.1))
        return len(taken) >= count

    wait_for(more, TIMEOUT, message=lambda: f"took {len(taken)} of {count}")
    return taken


def link_ids(span: ReadableSpan) -> set[int]:
    return {link.context.span_id for link in span.links}


def test_batches_taken_are_receive_spans_and_answers_are_settle_spans(telemetry, nsqd, pullers):
    node = nsqd.nsqd
    consumer = pullers("otel_pull", "c", nsqd_tcp_addresses=node.tcp_address, max_in_flight=50)
    publish(node, "otel_pull", [f"m{i}".encode() for i in range(30)])
    taken = take_n(consumer, 30, max_messages=10)
    host, port = server_of(nsqd)

    received = telemetry.spans("receive otel_pull")
    assert 3 <= len(received) <= 30
    assert sum(s.attributes[n.BATCH_COUNT] for s in received) == 30
    for span in received:
        assert span.kind is SpanKind.CONSUMER
        assert span.attributes[n.OPERATION_TYPE] == "receive"
        assert span.attributes[n.OPERATION_NAME] == "receive"
        assert span.attributes[n.CONSUMER_GROUP] == "c"
        assert span.attributes[n.DESTINATION] == "otel_pull"
        assert 1 <= span.attributes[n.BATCH_COUNT] <= 10
        assert span.links == ()  # classic NSQ carries no publish context
    receive_of = {}  # message -> its receive span's id, by the order of the batches
    for span in received:
        for message in taken[len(receive_of) : len(receive_of) + span.attributes[n.BATCH_COUNT]]:
            receive_of[message] = span.context.span_id
    received_here = {n.OPERATION_NAME: "receive", n.SERVER_PORT: port, n.SERVER_ADDRESS: host}
    assert telemetry.total(n.CONSUMED_MESSAGES, **received_here) == 30
    assert telemetry.total(n.CONSUMED_MESSAGES) == 30

    finished, requeued, alone = taken[:12], taken[12:29], taken[29]
    assert consumer.finish_many(finished) == 12
    assert consumer.requeue_many(requeued, delay=0, backoff=False) == 17
    alone.finish()
    (batch, single) = telemetry.wait_spans("finish otel_pull", 2)
    (requeue,) = telemetry.wait_spans("requeue otel_pull", 1)
    for span, messages in ((batch, finished), (requeue, requeued), (single, [alone])):
        assert span.kind is SpanKind.CLIENT
        assert span.attributes[n.OPERATION_TYPE] == "settle"
        assert span.attributes[n.CONSUMER_GROUP] == "c"
        assert link_ids(span) == {receive_of[m] for m in messages}
    assert batch.attributes[n.OPERATION_NAME] == "finish"
    assert batch.attributes[n.BATCH_COUNT] == 12
    assert batch.status.status_code is StatusCode.UNSET
    assert single.attributes[n.MESSAGE_ID] == alone.id.decode()
    assert n.BATCH_COUNT not in single.attributes
    assert requeue.attributes[n.BATCH_COUNT] == 17
    assert requeue.attributes[n.NSQ_REQUEUE_DELAY] == 0.0
    assert requeue.attributes[n.NSQ_REQUEUE_BACKOFF] is False
    assert requeue.status.status_code is StatusCode.ERROR
    assert requeue.attributes[n.ERROR_TYPE] == n.ERROR_REQUEUED

    # The requeued ones come back (a second attempt) and are counted again.
    again = take_n(consumer, 17)
    assert {m.attempts for m in again} == {2}
    consumer.finish_many(again)
    wait_drained(node, "otel_pull", "c")
    assert telemetry.total(n.CONSUMED_MESSAGES) == 47
    # pull mode has no process span (the application processes) and no handler duration
    assert telemetry.spans("process otel_pull") == []
    assert telemetry.total(n.PROCESS_DURATION) == 0


def test_a_message_given_up_in_take_gets_a_process_span(telemetry, nsqd, pullers):
    given_up: list[Message] = []
    node = nsqd.nsqd
    consumer = pullers(
        "otel_pull_give_up",
        "c",
        nsqd_tcp_addresses=node.tcp_address,
        max_tries=1,
        giving_up=given_up.append,
        max_backoff_duration=0,
    )
    publish(node, "otel_pull_give_up", [b"doomed"])
    (first,) = take_n(consumer, 1)
    consumer.requeue_many([first], delay=0)
    wait_for(lambda: consumer.take(timeout=0.1) == [] and given_up, TIMEOUT)
    wait_drained(node, "otel_pull_give_up", "c")
    (dropped,) = telemetry.wait_spans("process otel_pull_give_up", 1)
    assert dropped.kind is SpanKind.CONSUMER
    assert [e.name for e in dropped.events] == [n.EVENT_GIVE_UP, n.EVENT_FINISH]
    assert dropped.events[0].attributes == {n.NSQ_ATTEMPTS: 2, n.NSQ_MAX_TRIES: 1}
    assert dropped.status.status_code is StatusCode.ERROR
    assert dropped.attributes[n.ERROR_TYPE] == n.ERROR_GIVEN_UP
    assert dropped.attributes[n.NSQ_ATTEMPTS] == 2
    # the give-up's FIN is on its process span, not a settle span of its own
    assert telemetry.spans("finish otel_pull_give_up") == []
    (receive,) = telemetry.spans("receive otel_pull_give_up")  # the first take only
    assert receive.attributes[n.BATCH_COUNT] == 1
    assert telemetry.total(n.CONSUMED_MESSAGES, **{n.OPERATION_NAME: "receive"}) == 1
    assert telemetry.total(n.CONSUMED_MESSAGES, **{n.OPERATION_NAME: "process"}) == 1
    failed = {n.ERROR_TYPE: n.ERROR_GIVEN_UP}
    wait_for(lambda: telemetry.total(n.PROCESS_DURATION, **failed) == 1, TIMEOUT)


def test_a_pull_consumer_and_a_handler_consumer_side_by_side(telemetry, nsqd, pullers):
    # A pull consumer and a handler consumer of one topic, on two channels, side by side.
    node = nsqd.nsqd
    handled = threading.Event()
    puller = pullers("otel_both", "pull", nsqd_tcp_addresses=node.tcp_address)
    pusher = Consumer(
        "otel_both", "push", lambda m: handled.set(), nsqd_tcp_addresses=node.tcp_address
    )
    pusher.start()
    try:
        subscribed(pusher)
        wait_for(puller.connections, TIMEOUT)
        publish(node, "otel_both", [b"one"])
        (message,) = take_n(puller, 1)
        assert handled.wait(TIMEOUT)
        puller.finish_many([message])
        (process,) = telemetry.wait_spans("process otel_both", 1)
        (receive,) = telemetry.wait_spans("receive otel_both", 1)
        (finish,) = telemetry.wait_spans("finish otel_both", 1)
        assert process.attributes[n.CONSUMER_GROUP] == "push"
        assert receive.attributes[n.CONSUMER_GROUP] == "pull"
        assert link_ids(finish) == {receive.context.span_id}
    finally:
        pusher.stop()


def test_youzan_receive_spans_link_to_the_publish_spans(telemetry, consumers):
    with EmbeddedNSQ(youzan=True, nsqd_count=2) as cluster:
        cluster.create_topic("yz_pull", partitions=2, replica=1, ext=True)
        cluster.create_channel("yz_pull", "c")
        with Producer(lookupd_http_addresses=[cluster.lookupd.http_address]) as producer:
            producer.pub("yz_pull", b"alone")
            producer.mpub("yz_pull", [b"batch 1", b"batch 2"], partition=1)
            producer.pub("yz_pull", b"another")
        publishes = telemetry.wait_spans("publish yz_pull", 3)
        consumer = Consumer(
            "yz_pull",
            "c",
            None,
            lookupd_http_addresses=[cluster.lookupd.http_address],
            lookupd_poll_interval=0.5,
            max_in_flight=10,
        )
        consumer.start()
        try:
            taken = take_n(consumer, 4)
            assert all("traceparent" in m.ext for m in taken)
            consumer.finish_many(taken)
        finally:
            consumer.stop()
    received = telemetry.spans("receive yz_pull")
    assert sum(s.attributes[n.BATCH_COUNT] for s in received) == 4
    linked = set().union(*(link_ids(s) for s in received))
    assert linked == {s.context.span_id for s in publishes}  # the MPUB's two: one link
    for span in received:
        for link in span.links:
            assert link.context.is_remote
    partitions = {
        a[n.PARTITION]
        for a, _ in telemetry.points(n.CONSUMED_MESSAGES)
        if a[n.OPERATION_NAME] == "receive"
    }
    assert partitions <= {"0", "1"} and "1" in partitions
    assert telemetry.total(n.CONSUMED_MESSAGES) == 4


# ------------------------------------------------------------------------------------------
# What the explicit events give


def test_a_handler_that_raises_after_finishing_is_an_error_span(telemetry, nsqd, consumers):
    done = threading.Event()

    def handle(message: Message) -> None:
        message.finish()
        done.set()
        raise KeyError("after the FIN")

    consumer = consumers("otel_late", "c", handle, nsqd_tcp_addresses=[nsqd.nsqd.tcp_address])
    subscribed(consumer)
    publish(nsqd.nsqd, "otel_late", [b"m"])
    assert done.wait(TIMEOUT)
    (span,) = telemetry.wait_spans("process otel_late", 1)
    assert [e.name for e in span.events] == ["exception"]
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes[n.ERROR_TYPE] == "KeyError"
    wait_drained(nsqd.nsqd, "otel_late", "c")  # finished, once: no requeue
    wait_for(lambda: telemetry.total(n.PROCESS_DURATION, **{n.ERROR_TYPE: "KeyError"}), TIMEOUT)


def test_answers_from_another_thread_while_the_handler_runs_are_events(telemetry, nsqd, consumers):
    answered = threading.Event()

    def handle(message: Message) -> None:
        message.enable_async()
        worker = threading.Thread(target=lambda: (message.touch(), message.finish()))
        worker.start()
        worker.join(TIMEOUT)
        answered.set()

    consumer = consumers("otel_other", "c", handle, nsqd_tcp_addresses=[nsqd.nsqd.tcp_address])
    subscribed(consumer)
    publish(nsqd.nsqd, "otel_other", [b"m"])
    assert answered.wait(TIMEOUT)
    (span,) = telemetry.wait_spans("process otel_other", 1)
    assert [e.name for e in span.events] == [n.EVENT_TOUCH, n.EVENT_FINISH]
    assert telemetry.spans("finish otel_other") == []


# ------------------------------------------------------------------------------------------
# Unsampled spans


@pytest.fixture
def unsampled() -> Iterator[Telemetry]:
    """Instrumented with a tracer provider that samples nothing: metrics only."""
    t = Telemetry()
    t.tracer_provider = TracerProvider(sampler=ALWAYS_OFF)
    t.tracer_provider.add_span_processor(SimpleSpanProcessor(t.exporter))
    NSQInstrumentor().instrument(tracer_provider=t.tracer_provider, meter_provider=t.meter_provider)
    yield t
    NSQInstrumentor().uninstrument()
    t.shutdown()


def test_unsampled_spans_record_nothing_but_the_metrics(unsampled, nsqd, consumers, pullers):
    node = nsqd.nsqd
    calls: list[int] = []

    def handle(message: Message) -> None:
        calls.append(message.attempts)
        if message.attempts == 1:
            raise RuntimeError("first attempt fails")

    consumer = consumers(
        "otel_unsampled",
        "c",
        handle,
        nsqd_tcp_addresses=[node.tcp_address],
        default_requeue_delay=0,
        max_backoff_duration=0,
    )
    puller = pullers(
        "otel_unsampled", "pull", nsqd_tcp_addresses=node.tcp_address, max_in_flight=10
    )
    subscribed(consumer)
    wait_for(puller.connections, TIMEOUT)
    with Producer(node.tcp_address) as producer:
        producer.pub("otel_unsampled", b"m")
        producer.pub_async("otel_unsampled", b"n").result(TIMEOUT)
    taken = take_n(puller, 2)
    puller.requeue_many(taken[:1], delay=0)
    puller.finish_many(taken[1:])
    puller.finish_many(take_n(puller, 1))
    wait_drained(node, "otel_unsampled", "c")
    wait_drained(node, "otel_unsampled", "pull")
    assert sorted(calls) == [1, 1, 2, 2]
    assert unsampled.spans() == []
    assert unsampled.total(n.SENT_MESSAGES) == 2
    wait_for(lambda: unsampled.total(n.OPERATION_DURATION) == 2, TIMEOUT)
    wait_for(lambda: unsampled.total(n.PROCESS_DURATION) == 4, TIMEOUT)
    assert unsampled.total(n.PROCESS_DURATION, **{n.ERROR_TYPE: "RuntimeError"}) == 2
    assert unsampled.total(n.CONSUMED_MESSAGES, **{n.OPERATION_NAME: "process"}) == 4
    assert unsampled.total(n.CONSUMED_MESSAGES, **{n.OPERATION_NAME: "receive"}) == 3


def test_columnar_batches_are_counted_and_their_split_parts_link_to_the_receive(
    telemetry, nsqd, pullers
):
    node = nsqd.nsqd
    publish(node, "otel_col", [f"m{i}".encode() for i in range(40)])
    consumer = pullers(
        "otel_col", "c", columnar=True, nsqd_tcp_addresses=node.tcp_address, max_in_flight=50
    )
    batches: list[Any] = []
    wait_for(
        lambda: batches.extend(consumer.take_batches(timeout=0.1)) or sum(map(len, batches)) >= 40,
        TIMEOUT,
    )
    received = telemetry.spans("receive otel_col")
    assert sum(s.attributes[n.BATCH_COUNT] for s in received) == 40
    assert telemetry.total(n.CONSUMED_MESSAGES) == 40
    receive_ids = {s.context.span_id for s in received}
    big = max(batches, key=len)
    head, tail = big.split(len(big) // 2)
    others = [b for b in batches if b is not big]
    assert consumer.finish_batches([head]) == len(head)
    assert consumer.finish_batches([tail, *others]) == 40 - len(head)
    spans = telemetry.wait_spans("finish otel_col", 2)
    assert [s.attributes[n.BATCH_COUNT] for s in spans] == [len(head), 40 - len(head)]
    for span in spans:
        assert span.attributes[n.OPERATION_TYPE] == "settle"
        assert link_ids(span) and link_ids(span) <= receive_ids  # the parts keep the link
    # Nothing is kept per batch by the observer: a batch carries its own receive context.
    (observer,) = [o for o in consumer._observers.active if hasattr(o, "consume")]
    assert not observer.consume._taken.get(consumer)
    wait_drained(node, "otel_col", "c")
