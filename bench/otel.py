#!/usr/bin/env python
"""The cost of OpenTelemetry instrumentation against the SDK's own floor: the same publish and
consume runs not instrumented (``off``) and instrumented (``on``: ``NSQInstrumentor`` with the
SDK, every span sampled, a no-op span exporter behind a BatchSpanProcessor and a metric reader
collecting at the end), and beside them the ``floor``: what the SDK itself costs per message
for the same span (same name, kind and attributes), a counter add and a histogram record, with
the same providers, no NSQ at all.  All on the same nsqd, interleaved, best of ``--repeat``.

Each run is a subprocess: ``pub_async`` of N 200-byte messages (all in flight, then waited for),
then a Consumer (``max_in_flight`` 2500, no-op handler, FIN) reading them back.  Printed per
case: messages per second and the client's CPU microseconds per message (all its threads, the
exporter's and ``nsq-otel`` included: an instrumented window ends once every span has ended and
been exported), the cost (on minus off), the floor, cost / floor (issue 25's target: at most
1.25), and the median over rounds of that ratio within each round (runs close in time, so less
moved by the machine's other work than the best of each).  Each run also prints on stderr the
time spent in the garbage collector.  With ``--unsampled`` two more runs: instrumented with a
sampler that samples nothing, and its floor (the same SDK calls, the span unsampled).  With
``--hooks`` a run with a no-op observer registered shows the clients' own share of the cost
(telling the events); with ``--in-clients`` a run with an observer that makes the floor's own
SDK calls, and nothing of nsqclient.otel, per publish and per handled message shows what those
same calls cost inside the clients' process, beside nsqd and the clients' threads.  The
consume window starts from a collected heap without the publish case's Futures.

    NSQ_BIN_DIR=/opt/nsq-bin .venv/bin/python bench/otel.py --messages 100000
"""

from __future__ import annotations

import gc
import statistics
import sys
import threading
import time
from typing import Any

import _common as common

MODES = ("off", "on", "floor")
UNSAMPLED = ("unsampled", "floor-unsampled")
TARGET = 1.25
HANDLER_CHANNEL = "bench"


class GcClock:
    """Time spent in the garbage collector (all generations), and full collections, from
    ``gc.callbacks``: part of what instrumentation costs, since the SDK's garbage makes the
    collector run over the process's whole heap more often."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            if info["generation"] == 2:
                self.full += 1
        else:
            self.seconds += time.perf_counter() - self._started

    def read(self) -> tuple[float, int]:
        return self.seconds, self.full


def _providers(sampled: bool = True) -> tuple[Any, Any]:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

    class NoOpExporter(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    tracer_provider = TracerProvider(sampler=ALWAYS_ON if sampled else ALWAYS_OFF)
    tracer_provider.add_span_processor(BatchSpanProcessor(NoOpExporter()))
    return tracer_provider, MeterProvider(metric_readers=[InMemoryMetricReader()])


def _floor_cases(spec: dict[str, Any], tracer: Any, meter: Any) -> dict[str, tuple[Any, ...]]:
    """Per case (``pub``, ``sub``): the span's name, kind and attributes, the metric
    attributes, the counter and the histogram of the floor."""
    from opentelemetry.trace import SpanKind

    from nsqclient.otel import names as n

    host, _, port = spec["nsqd"].rpartition(":")
    topic = spec["topic"]
    cases = {}
    send = {
        n.SYSTEM: "nsq",
        n.DESTINATION: topic,
        n.OPERATION_TYPE: "send",
        n.OPERATION_NAME: "publish",
        n.SERVER_ADDRESS: host,
        n.SERVER_PORT: int(port),
    }
    cases["pub"] = (
        f"publish {topic}",
        SpanKind.PRODUCER,
        {**send, n.NSQ_COMMAND: "PUB", n.BODY_SIZE: common.MESSAGE_SIZE},
        send,
        meter.create_counter(n.SENT_MESSAGES),
        meter.create_histogram(n.OPERATION_DURATION, unit="s"),
    )
    process = {
        n.SYSTEM: "nsq",
        n.DESTINATION: topic,
        n.CONSUMER_GROUP: HANDLER_CHANNEL,
        n.OPERATION_NAME: "process",
        n.SERVER_ADDRESS: host,
        n.SERVER_PORT: int(port),
    }
    cases["sub"] = (
        f"process {topic}",
        SpanKind.CONSUMER,
        {
            **process,
            n.OPERATION_TYPE: "process",
            n.MESSAGE_ID: "0f1e2d3c4b5a6978",
            n.BODY_SIZE: common.MESSAGE_SIZE,
            n.NSQ_ATTEMPTS: 1,
        },
        process,
        meter.create_counter(n.CONSUMED_MESSAGES),
        meter.create_histogram(n.PROCESS_DURATION, unit="s"),
    )
    return cases


def _floor(spec: dict[str, Any], sampled: bool) -> dict[str, Any]:
    """The SDK alone, per message: the span nsqclient.otel makes (same name, kind and
    attributes; sampled or not), a counter add and a histogram record, as the publish and
    the consume side each make them."""
    tracer_provider, meter_provider = _providers(sampled)
    cases = _floor_cases(
        spec, tracer_provider.get_tracer("nsqclient"), meter_provider.get_meter("nsqclient")
    )
    tracer = tracer_provider.get_tracer("nsqclient")
    result: dict[str, Any] = {"consumed": spec["messages"]}
    clock = GcClock()
    for case, (name, kind, span_attributes, attributes, counter, histogram) in cases.items():
        start_span = tracer.start_span
        gc_before = clock.read()
        cpu, start = common.cpu_seconds(), time.perf_counter()
        for _ in range(spec["messages"]):
            start_span(name, kind=kind, attributes=span_attributes).end()
            counter.add(1, attributes)
            histogram.record(0.001, attributes)
        tracer_provider.force_flush()
        result[f"{case}_seconds"] = time.perf_counter() - start
        result[f"{case}_cpu"] = common.cpu_seconds() - cpu
        _gc_result(result, case, gc_before, clock.read())
    tracer_provider.shutdown()
    meter_provider.shutdown()
    return result


def _gc_result(
    result: dict[str, Any], case: str, before: tuple[float, int], after: tuple[float, int]
) -> None:
    result[f"{case}_gc"] = after[0] - before[0]
    result[f"{case}_gc_full"] = after[1] - before[1]


def child_main(spec: dict[str, Any]) -> None:
    from nsqclient import Consumer, Producer

    mode = spec["mode"]
    if mode.startswith("floor"):
        common.emit_result(_floor(spec, sampled=mode == "floor"))
        return
    providers = instrumentor = None
    if mode == "hooks":
        from nsqclient import observe

        observe.add_observer(observe.Observer())  # every event told, to no-ops
    elif mode == "sdk-hooks":
        providers = _providers(sampled=True)
        _add_floor_observer(spec, *providers)
    elif mode != "off":
        from nsqclient.otel import NSQInstrumentor

        providers = _providers(sampled=mode == "on")
        instrumentor = NSQInstrumentor()
        instrumentor.instrument(tracer_provider=providers[0], meter_provider=providers[1])

    def settled() -> None:
        """Inside the timed window: every span ended and exported (off: nothing to do)."""
        if instrumentor is not None:
            instrumentor.observer.flush(60)  # the async publishes' spans, on nsq-otel
        if providers is not None:
            providers[0].force_flush()

    n, topic, tcp = spec["messages"], spec["topic"], spec["nsqd"]
    body = common.message_body()
    result: dict[str, Any] = {}
    clock = GcClock()
    with Producer(tcp) as producer:
        producer.pub(topic, b"warm-up")  # the connection, outside the clock
        gc_before = clock.read()
        cpu, start = common.cpu_seconds(), time.perf_counter()
        futures = [producer.pub_async(topic, body) for _ in range(n)]
        for f in futures:
            f.result(60)
        settled()
        result["pub_seconds"] = time.perf_counter() - start
        result["pub_cpu"] = common.cpu_seconds() - cpu
        _gc_result(result, "pub", gc_before, clock.read())
        # The publish case's Futures are not the consume case's: held on, they would be part
        # of the heap every full collection of the consume window goes over (100,000 Futures
        # and what their done callbacks keep: a million objects instrumented).
        del futures
    gc.collect()  # (outside the clock: the consume window starts from a collected heap)
    count = 0
    done = threading.Event()
    lock = threading.Lock()

    def handler(message: Any) -> None:
        nonlocal count
        with lock:
            count += 1
            if count == n + 1:
                done.set()

    gc_before = clock.read()
    cpu, start = common.cpu_seconds(), time.perf_counter()
    consumer = Consumer(topic, HANDLER_CHANNEL, handler, nsqd_tcp_addresses=tcp, max_in_flight=2500)
    consumer.start()
    done.wait(300)
    settled()
    result["sub_seconds"] = time.perf_counter() - start
    result["sub_cpu"] = common.cpu_seconds() - cpu
    _gc_result(result, "sub", gc_before, clock.read())
    consumer.stop()
    if providers is not None:
        providers[0].shutdown()
        providers[1].shutdown()
    result["consumed"] = count
    common.emit_result(result)


def _add_floor_observer(spec: dict[str, Any], tracer_provider: Any, meter_provider: Any) -> None:
    """``--in-clients``: an observer making the floor's SDK calls (no nsqclient.otel) where
    the clients tell a publish and a handled message: the same calls, made in a client's
    process while nsqd and its threads run."""
    from nsqclient import observe

    cases = _floor_cases(
        spec, tracer_provider.get_tracer("nsqclient"), meter_provider.get_meter("nsqclient")
    )
    start_span = tracer_provider.get_tracer("nsqclient").start_span

    def calls(case: str) -> Any:
        name, kind, span_attributes, attributes, counter, histogram = cases[case]

        def make(*args: Any) -> None:
            start_span(name, kind=kind, attributes=span_attributes).end()
            counter.add(1, attributes)
            histogram.record(0.001, attributes)

        return make

    class FloorObserver(observe.Observer):
        publish_started = calls("pub")
        handler_started = calls("sub")

    observe.add_observer(FloorObserver())


def main(argv: list[str]) -> int:
    if common.run_as_child(argv, child_main):
        return 0
    parser = common.argument_parser(__doc__ or "", 100_000, "messages per run")
    common.add_repeat_argument(parser)
    parser.add_argument(
        "--unsampled",
        action="store_true",
        help="also run instrumented with a sampler that samples nothing, beside its floor",
    )
    parser.add_argument(
        "--hooks",
        action="store_true",
        help="also run with a no-op observer registered: the clients' own share of the cost",
    )
    parser.add_argument(
        "--in-clients",
        action="store_true",
        help="also run with an observer making the floor's SDK calls (no nsqclient.otel) per "
        "publish and handled message: what those calls cost inside the clients' process",
    )
    args = parser.parse_args(argv)
    modes = (
        MODES
        + (UNSAMPLED if args.unsampled else ())
        + (("hooks",) if args.hooks else ())
        + (("sdk-hooks",) if args.in_clients else ())
    )
    best: dict[str, dict[str, float]] = {m: {} for m in modes}
    #: per round, each mode's CPU us/msg per case (for the ratios of one round's runs)
    rounds: list[dict[str, dict[str, float]]] = []
    n = args.messages
    with common.open_broker(args) as broker:
        print(f"broker: {broker.description}; {common.describe_machine()}")
        for round_ in range(args.repeat):
            rounds.append({m: {} for m in modes})
            for mode in modes if round_ % 2 == 0 else modes[::-1]:
                topic = common.fresh_topic("otel", mode.replace("-", "_"))
                spec = {"mode": mode, "messages": n, "topic": topic, "nsqd": broker.tcp_address}
                if not mode.startswith("floor"):
                    common.create_channel(broker.http_address, topic, HANDLER_CHANNEL)
                r = common.run_child(__file__, spec, timeout=900)
                if r["consumed"] < n:
                    raise SystemExit(f"{mode}: consumed {r['consumed']} of {n}")
                cell = best[mode]
                line = []
                for case in ("pub", "sub"):
                    rate = n / r[f"{case}_seconds"]
                    cpu_us = r[f"{case}_cpu"] / n * 1e6
                    cell[f"{case}_rate"] = max(cell.get(f"{case}_rate", 0.0), rate)
                    cell[f"{case}_cpu_us"] = min(cell.get(f"{case}_cpu_us", 1e9), cpu_us)
                    rounds[-1][mode][case] = cpu_us
                    gc_us = r[f"{case}_gc"] / n * 1e6
                    line.append(
                        f"{case} {cpu_us:.1f} us/msg (GC {gc_us:.1f} us/msg,"
                        f" {r[f'{case}_gc_full']} full collections)"
                    )
                print(f"round {round_ + 1} {mode}: {', '.join(line)}", file=sys.stderr)
                if not mode.startswith("floor"):
                    common.delete_topic(broker.http_address, topic)
    rows = []
    pairs = [("on", "floor", "sampled")]
    if args.unsampled:
        pairs.append(("unsampled", "floor-unsampled", "not sampled"))
    for case, what in (("pub", "pub_async"), ("sub", "consume (handler + FIN)")):
        off = best["off"]
        for on_mode, floor_mode, sampling in pairs:
            on, floor = best[on_mode], best[floor_mode]
            cost = on[f"{case}_cpu_us"] - off[f"{case}_cpu_us"]
            ratio = cost / floor[f"{case}_cpu_us"]
            paired = statistics.median(
                (r[on_mode][case] - r["off"][case]) / r[floor_mode][case] for r in rounds
            )
            rows.append(
                [
                    what,
                    sampling,
                    common.fmt_rate(off[f"{case}_rate"]),
                    f"{off[f'{case}_cpu_us']:.1f}",
                    common.fmt_rate(on[f"{case}_rate"]),
                    f"{on[f'{case}_cpu_us']:.1f}",
                    f"{cost:.1f}",
                    f"{floor[f'{case}_cpu_us']:.1f}",
                    f"{ratio:.2f}x",
                    "ok" if ratio <= TARGET else f"over {TARGET}x",
                    f"{paired:.2f}x",
                ]
            )
    headers = [
        "case",
        "spans",
        "off msg/s",
        "off us/msg",
        "on msg/s",
        "on us/msg",
        "cost us/msg",
        "SDK floor us/msg",
        "cost/floor",
        f"target <= {TARGET}x",
        "median of rounds",
    ]
    common.print_table(headers, rows)
    if args.hooks:
        print()
        common.print_table(
            ["case", "off us/msg", "no-op observer us/msg", "the clients' share us/msg"],
            [
                [
                    what,
                    f"{best['off'][f'{case}_cpu_us']:.1f}",
                    f"{best['hooks'][f'{case}_cpu_us']:.1f}",
                    f"{best['hooks'][f'{case}_cpu_us'] - best['off'][f'{case}_cpu_us']:.1f}",
                ]
                for case, what in (("pub", "pub_async"), ("sub", "consume (handler + FIN)"))
            ],
        )
    if args.in_clients:
        print()
        rows = []
        for case, what in (("pub", "pub_async"), ("sub", "consume (handler + FIN)")):
            off = best["off"][f"{case}_cpu_us"]
            inside = best["sdk-hooks"][f"{case}_cpu_us"] - off
            cost = best["on"][f"{case}_cpu_us"] - off
            rows.append(
                [
                    what,
                    f"{best['floor'][f'{case}_cpu_us']:.1f}",
                    f"{inside:.1f}",
                    f"{inside / best['floor'][f'{case}_cpu_us']:.2f}x",
                    f"{cost:.1f}",
                    f"{cost / inside:.2f}x",
                ]
            )
        common.print_table(
            [
                "case",
                "SDK floor us/msg",
                "its calls in the clients us/msg",
                "/ floor",
                "nsqclient.otel cost us/msg",
                "cost / those calls",
            ],
            rows,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
