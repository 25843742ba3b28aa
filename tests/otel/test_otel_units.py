"""nsqclient.otel's own pieces, without a broker: the Tally behind the message counters (and
its per-thread counts), the Finisher that ends asynchronous publishes' spans on the
``nsq-otel`` thread, and the span an asynchronous publish gets when its answer comes."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is not installed")

from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

from nsqclient.observe import PublishEvent  # noqa: E402
from nsqclient.otel.gauges import Tally  # noqa: E402
from nsqclient.otel.publish import Finisher, PublishTelemetry  # noqa: E402


def test_a_tally_adds_up_by_content_and_by_identity():
    tally = Tally()
    cached = {"a": 1, "b": "x"}
    tally.add(2, cached, interned=True)
    tally.add(3, cached, interned=True)
    tally.add(4, {"a": 1, "b": "x"})  # equal content, another dict
    tally.add(1, {"a": 2})
    assert sorted((v, sorted(a.items())) for v, a in tally.read()) == [
        (1, [("a", 2)]),
        (9, [("a", 1), ("b", "x")]),
    ]
    tally.add(1, cached, interned=True)  # counted on after a read
    assert {v for v, a in tally.read() if a == cached} == {10}


def test_a_tally_folds_what_it_counts_by_identity_past_its_bound():
    tally = Tally()
    many = [{"i": i % 3} for i in range(5000)]  # more dicts than the caches ever hold
    for attributes in many:
        tally.add(1, attributes, interned=True)
    totals = {a["i"]: v for v, a in tally.read()}
    assert totals == {0: 1667, 1: 1667, 2: 1666}


def test_a_tally_reads_the_counts_of_each_thread_while_it_lives_and_after_it_ended():
    tally = Tally()
    cached = {"a": 1}
    tally.add(1, cached, interned=True)  # counted under the lock, by identity
    ready, go = threading.Event(), threading.Event()

    def count(times: int) -> None:
        counts = tally.for_thread()
        for _ in range(times):  # how a worker counts: by identity, no lock
            entry = counts.counts.get(id(cached))
            if entry is not None and entry[0] is cached:
                entry[1] += 1
            else:
                counts.new(1, cached)
        counts.new(5, {"a": 2})
        ready.set()
        go.wait(10)

    thread = threading.Thread(target=count, args=(100,))
    thread.start()
    assert ready.wait(10)
    live = sorted((v, sorted(a.items())) for v, a in tally.read())
    assert live == [(5, [("a", 2)]), (101, [("a", 1)])]
    go.set()
    thread.join(10)
    # the thread ended: its counts are folded into the tally's own, and read once
    assert sorted((v, sorted(a.items())) for v, a in tally.read()) == live
    tally.add(1, cached, interned=True)
    assert {v for v, a in tally.read() if a == cached} == {102}


def test_a_thread_tally_folds_a_dict_whose_id_another_one_had():
    tally = Tally()
    counts = tally.for_thread()
    first = {"a": 1}
    counts.new(3, first)
    # A dict freed, and another made at its address: counted anew, the first one's kept.
    second = {"a": 2}
    counts.counts[id(second)] = counts.counts.pop(id(first))  # (what a reused id looks like)
    counts.new(1, second)
    assert sorted((v, sorted(a.items())) for v, a in tally.read()) == [
        (1, [("a", 2)]),
        (3, [("a", 1)]),
    ]


def test_the_finisher_ends_each_item_once_in_order_on_its_thread_and_flush_waits_for_them():
    ran: list[tuple[int, str]] = []
    lock = threading.Lock()

    def end(i: int) -> None:
        with lock:
            ran.append((i, threading.current_thread().name))
        if i == 3:
            raise RuntimeError("an exporter's bug")  # logged; the next items still end

    finisher = Finisher(end)
    for i in range(100):
        finisher.submit(i)
    assert finisher.flush(10)
    assert [i for i, _ in ran] == list(range(100))
    assert {name for _, name in ran} == {"nsq-otel"}
    finisher.stop(10)
    assert "nsq-otel" not in {t.name for t in threading.enumerate()}
    finisher.submit(100)  # stopped: ended where it is submitted
    assert ran[-1] == (100, threading.current_thread().name)
    assert len(ran) == 101
    assert finisher.flush(10)  # nothing left to wait for


def _answer(telemetry: PublishTelemetry, event: PublishEvent) -> None:
    """nsqd's OK to the publish, as the Producer tells it (its end times, then the event)."""
    event.ended_at = time.monotonic()
    event.ended_ns = time.time_ns()
    event.result = b"OK"
    telemetry.publish_ended(event)


def _async_publish(topic: str) -> PublishEvent:
    """The event of one ``pub_async`` of a 3-byte body (no Producer behind it)."""
    return PublishEvent(None, "PUB", True, topic, 1, 3, None, None, False, "127.0.0.1:4150")


@pytest.mark.parametrize("parent", [False, True])
def test_an_async_publish_span_starts_at_the_call_under_the_callers_span_wherever_it_ends(
    parent: bool,
):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    telemetry = PublishTelemetry(
        tracer, Tally(), meter.create_histogram("duration", unit="s"), "never"
    )
    telemetry.close(10)  # stopped: the span is made where the answer is told, here
    before = time.time_ns()
    if parent:
        with tracer.start_as_current_span("caller") as caller:
            event = _async_publish("t")
            telemetry.publish_started(event)
    else:
        event = _async_publish("t")
        telemetry.publish_started(event)
    after = time.time_ns()
    with tracer.start_as_current_span("where the answer is told"):
        _answer(telemetry, event)
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "publish t"]
    assert before <= span.start_time == event.started_ns <= after
    assert span.end_time == event.ended_ns and span.end_time >= span.start_time
    if parent:
        assert span.parent is not None
        assert span.parent.span_id == caller.get_span_context().span_id
    else:
        assert span.parent is None  # not the span current where it ended
    assert event.state == {}
    (metric,) = [
        m
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    ]
    (point,) = metric.data.data_points
    assert point.count == 1 and point.sum == event.ended_at - event.started_at


def test_an_async_publish_in_flight_keeps_nothing_the_collector_tracks_and_past_the_cache():
    # Thousands of publishes in flight at once: with no caller's span, each keeps in its
    # event's state only the index of its topic's shared attributes, so the state is a dict
    # the garbage collector does not go over.  Past the cache's bound (4096 sets of
    # attributes) a publish keeps its own, and its span and metrics are still right.
    import gc

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    meter = MeterProvider().get_meter("test")
    telemetry = PublishTelemetry(
        provider.get_tracer("test"), Tally(), meter.create_histogram("duration", unit="s"), "never"
    )
    telemetry.close(10)
    topics = [f"t{i}" for i in range(4100)]
    events = [_async_publish(topic) for topic in topics]
    for event in events:
        telemetry.publish_started(event)
    assert not any(gc.is_tracked(event.state) for event in events[:4096])
    assert all(gc.is_tracked(event.state) for event in events[4096:])
    again = _async_publish("t7")
    telemetry.publish_started(again)
    assert not gc.is_tracked(again.state)
    for event in [*events, again]:
        _answer(telemetry, event)
        assert event.state == {}
    spans = exporter.get_finished_spans()
    assert [s.attributes["messaging.destination.name"] for s in spans] == [*topics, "t7"]
