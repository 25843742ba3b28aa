"""nsqclient.otel's own pieces, without a broker: the Tally behind the message counters (and
its per-thread counts), the Finisher that ends asynchronous publishes' spans on the
``nsq-otel`` thread, and the span an asynchronous publish gets when its answer comes."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is not installed")

from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
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


def test_the_finisher_runs_each_job_once_on_its_thread_and_flush_waits_for_them():
    finisher = Finisher()
    ran: list[tuple[int, str]] = []
    lock = threading.Lock()

    def job(i: int) -> None:
        with lock:
            ran.append((i, threading.current_thread().name))

    for i in range(100):
        finisher.submit(job, i)
    assert finisher.flush(10)
    assert sorted(i for i, _ in ran) == list(range(100))
    assert {name for _, name in ran} == {"nsq-otel"}
    finisher.stop(10)
    assert "nsq-otel" not in {t.name for t in threading.enumerate()}
    finisher.submit(job, 100)  # stopped: run where it is submitted
    assert ran[-1] == (100, threading.current_thread().name)
    assert len(ran) == 101


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
    meter = MeterProvider().get_meter("test")
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
    event.result = b"OK"
    with tracer.start_as_current_span("where the answer is told"):
        telemetry.publish_ended(event)
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "publish t"]
    assert before <= span.start_time == event.started_ns <= after
    assert span.end_time is not None and span.end_time >= span.start_time
    if parent:
        assert span.parent is not None
        assert span.parent.span_id == caller.get_span_context().span_id
    else:
        assert span.parent is None  # not the span current where it ended
    assert event.state == {}
