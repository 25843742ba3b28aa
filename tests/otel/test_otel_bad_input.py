"""A publish refused at the call for bad input (ValueError or TypeError: an invalid topic name, a
body that is not bytes or str, an empty body, an empty MPUB, a negative delay) sends nothing, so
it is not an operation: nsqclient.otel records no span, no ``messaging.client.operation.duration``
point and no ``messaging.client.sent.messages`` for it.  A good publish right after, on the same
Producer, is recorded (so that these tests can fail).

This is a contract on what the OpenTelemetry SDK receives (its in-memory span exporter and metric
reader), not on how nsqclient.otel is built: it must hold as it is for any implementation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is not installed")
pytest.importorskip("opentelemetry.instrumentation", reason="nsqclient[otel] is not installed")

from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode  # noqa: E402

from nsqclient import Producer  # noqa: E402
from nsqclient.otel import NSQInstrumentor  # noqa: E402
from nsqclient.testing.helpers import message_count  # noqa: E402
from nsqclient.testing.waiting import wait_for  # noqa: E402

TIMEOUT = 10.0
TOPIC = "otel_bad_input"
DURATION = "messaging.client.operation.duration"
SENT = "messaging.client.sent.messages"
ERROR_TYPE = "error.type"


class Recorded:
    """What the SDK received from nsqclient: finished spans and metric points, in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def points(self, metric: str) -> list[tuple[dict[str, Any], Any]]:
        """``(attributes, data point)`` of ``metric``, any instrumentation scope."""
        data = self.reader.get_metrics_data()
        found = []
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for m in scope.metrics:
                    if m.name == metric:
                        found += [(dict(p.attributes or {}), p) for p in m.data.data_points]
        return found

    def total(self, metric: str) -> float:
        """The count (histogram) or sum (counter) of ``metric`` over all its points."""
        return sum(p.count if hasattr(p, "count") else p.value for _, p in self.points(metric))

    def errors(self, metric: str) -> list[dict[str, Any]]:
        """The attributes of the points of ``metric`` that carry ``error.type``."""
        return [a for a, _ in self.points(metric) if ERROR_TYPE in a]


@pytest.fixture
def recorded() -> Iterator[Recorded]:
    r = Recorded()
    NSQInstrumentor().instrument(tracer_provider=r.tracer_provider, meter_provider=r.meter_provider)
    yield r
    NSQInstrumentor().uninstrument()
    r.tracer_provider.shutdown()
    r.meter_provider.shutdown()


def _async(call: Callable[[Producer], Any]) -> Callable[[Producer], Any]:
    """``call`` returns a Future: wait for its result."""
    return lambda p: call(p).result(TIMEOUT)


#: (method, the bad call, the exception it raises, a good call of the same method, messages
#: the good call publishes)
CASES: list[tuple[str, Callable[[Producer], Any], type[Exception], Callable[[Producer], Any], int]]
CASES = [
    ("pub", lambda p: p.pub("not a topic!", b"m"), ValueError, lambda p: p.pub(TOPIC, b"ok"), 1),
    (
        "pub",
        lambda p: p.pub(TOPIC, 42),  # type: ignore[arg-type]
        TypeError,
        lambda p: p.pub(TOPIC, b"ok"),
        1,
    ),
    ("pub", lambda p: p.pub(TOPIC, b""), ValueError, lambda p: p.pub(TOPIC, b"ok"), 1),
    ("mpub", lambda p: p.mpub(TOPIC, []), ValueError, lambda p: p.mpub(TOPIC, [b"a", b"b"]), 2),
    (
        "mpub",
        lambda p: p.mpub(TOPIC, [b"a", None]),  # type: ignore[list-item]
        TypeError,
        lambda p: p.mpub(TOPIC, [b"a", b"b"]),
        2,
    ),
    (
        "mpub",
        lambda p: p.mpub("bad/topic", [b"a"]),
        ValueError,
        lambda p: p.mpub(TOPIC, [b"a", b"b"]),
        2,
    ),
    (
        "dpub",
        lambda p: p.dpub("not a topic!", b"m", 0.01),
        ValueError,
        lambda p: p.dpub(TOPIC, b"ok", 0.01),
        1,
    ),
    (
        "dpub",
        lambda p: p.dpub(TOPIC, {"not": "bytes"}, 0.01),  # type: ignore[arg-type]
        TypeError,
        lambda p: p.dpub(TOPIC, b"ok", 0.01),
        1,
    ),
    (
        "dpub",
        lambda p: p.dpub(TOPIC, b"m", -1),
        ValueError,
        lambda p: p.dpub(TOPIC, b"ok", 0.01),
        1,
    ),
    (
        "pub_async",
        lambda p: p.pub_async("not a topic!", b"m"),
        ValueError,
        _async(lambda p: p.pub_async(TOPIC, b"ok")),
        1,
    ),
    (
        "pub_async",
        lambda p: p.pub_async(TOPIC, None),  # type: ignore[arg-type]
        TypeError,
        _async(lambda p: p.pub_async(TOPIC, b"ok")),
        1,
    ),
    (
        "mpub_async",
        lambda p: p.mpub_async(TOPIC, []),
        ValueError,
        _async(lambda p: p.mpub_async(TOPIC, [b"a", b"b"])),
        2,
    ),
    (
        "mpub_async",
        lambda p: p.mpub_async(TOPIC, b"one body, not a list"),  # type: ignore[arg-type]
        TypeError,
        _async(lambda p: p.mpub_async(TOPIC, [b"a", b"b"])),
        2,
    ),
    (
        "dpub_async",
        lambda p: p.dpub_async("not a topic!", b"m", 0.01),
        ValueError,
        _async(lambda p: p.dpub_async(TOPIC, b"ok", 0.01)),
        1,
    ),
]


@pytest.mark.parametrize(
    "bad, error, good, count",
    [case[1:] for case in CASES],
    ids=[f"{case[0]}-{case[2].__name__}-{i}" for i, case in enumerate(CASES)],
)
def test_bad_input_records_nothing_and_a_good_publish_after_is_recorded(
    recorded, nsqd, bad, error, good, count
):
    with Producer(nsqd.nsqd.tcp_address) as producer:
        with pytest.raises(error):
            bad(producer)
        assert recorded.spans() == []
        assert recorded.total(DURATION) == 0
        assert recorded.total(SENT) == 0
        assert message_count(nsqd.nsqd, TOPIC) == 0  # indeed nothing was sent

        good(producer)
        # An asynchronous publish may be recorded after its Future completed: wait for it.
        wait_for(
            lambda: recorded.spans() and recorded.total(DURATION) and recorded.total(SENT) >= count,
            TIMEOUT,
            message=lambda: f"the good publish was not recorded: {recorded.spans()}",
        )
    assert message_count(nsqd.nsqd, TOPIC) == count
    (span,) = recorded.spans()  # the good publish's, and no other
    assert span.name == f"publish {TOPIC}"
    assert span.status.status_code is StatusCode.UNSET
    assert recorded.total(DURATION) == 1
    assert recorded.total(SENT) == count
    assert recorded.errors(DURATION) == []
    assert recorded.errors(SENT) == []
