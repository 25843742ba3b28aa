#!/usr/bin/env python
"""The cost of OpenTelemetry instrumentation: the same publish and consume runs, not
instrumented and instrumented (``NSQInstrumentor`` with the SDK, every span sampled, a no-op
span exporter behind a BatchSpanProcessor and a metric reader collecting at the end), on the
same nsqd, interleaved, best of ``--repeat``.

Each run is a subprocess: ``pub_async`` of N 200-byte messages (all in flight, then waited for),
then a Consumer (``max_in_flight`` 2500, no-op handler) reading them back.  Printed per case:
messages per second and the client's CPU microseconds per message, and the instrumented cost
as the difference per message.

    NSQ_BIN_DIR=/opt/nsq-bin .venv/bin/python bench/otel.py --messages 100000
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import _common as common

MODES = ("off", "on")


def _instrument() -> Any:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    from nsqclient.otel import NSQInstrumentor

    class NoOpExporter(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(NoOpExporter()))
    reader = InMemoryMetricReader()
    instrumentor = NSQInstrumentor()
    instrumentor.instrument(
        tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[reader])
    )
    return tracer_provider, reader


def child_main(spec: dict[str, Any]) -> None:
    from nsqclient import Consumer, Producer

    providers = _instrument() if spec["mode"] == "on" else None
    n, topic, tcp = spec["messages"], spec["topic"], spec["nsqd"]
    body = common.message_body()
    result: dict[str, Any] = {}
    with Producer(tcp) as producer:
        producer.pub(topic, b"warm-up")  # the connection, outside the clock
        cpu, start = common.cpu_seconds(), time.perf_counter()
        futures = [producer.pub_async(topic, body) for _ in range(n)]
        for f in futures:
            f.result(60)
        result["pub_seconds"] = time.perf_counter() - start
        result["pub_cpu"] = common.cpu_seconds() - cpu
    count = 0
    done = threading.Event()
    lock = threading.Lock()

    def handler(message: Any) -> None:
        nonlocal count
        with lock:
            count += 1
            if count == n + 1:
                done.set()

    cpu, start = common.cpu_seconds(), time.perf_counter()
    consumer = Consumer(topic, "bench", handler, nsqd_tcp_addresses=tcp, max_in_flight=2500)
    consumer.start()
    done.wait(300)
    result["sub_seconds"] = time.perf_counter() - start
    result["sub_cpu"] = common.cpu_seconds() - cpu
    consumer.stop()
    if providers is not None:
        providers[0].shutdown()
        providers[1].collect()
    result["consumed"] = count
    common.emit_result(result)


def main(argv: list[str]) -> int:
    if common.run_as_child(argv, child_main):
        return 0
    parser = common.argument_parser(__doc__ or "", 100_000, "messages per run")
    common.add_repeat_argument(parser)
    args = parser.parse_args(argv)
    best: dict[str, dict[str, float]] = {m: {} for m in MODES}
    with common.open_broker(args) as broker:
        print(f"broker: {broker.description}; {common.describe_machine()}")
        for round_ in range(args.repeat):
            for mode in MODES if round_ % 2 == 0 else MODES[::-1]:
                topic = common.fresh_topic("otel", mode)
                common.create_channel(broker.http_address, topic, "bench")
                spec = {"mode": mode, "messages": args.messages, "topic": topic}
                spec["nsqd"] = broker.tcp_address
                r = common.run_child(__file__, spec, timeout=900)
                if r["consumed"] < args.messages:
                    raise SystemExit(f"{mode}: consumed {r['consumed']} of {args.messages}")
                n = args.messages
                for case in ("pub", "sub"):
                    rate = n / r[f"{case}_seconds"]
                    cpu_us = r[f"{case}_cpu"] / n * 1e6
                    cell = best[mode]
                    if rate > cell.get(f"{case}_rate", 0.0):
                        cell[f"{case}_rate"] = rate
                    cell[f"{case}_cpu_us"] = min(cell.get(f"{case}_cpu_us", 1e9), cpu_us)
                common.delete_topic(broker.http_address, topic)
    rows = []
    for case, what in (("pub", "pub_async"), ("sub", "consume")):
        off, on = best["off"], best["on"]
        rows.append(
            [
                what,
                common.fmt_rate(off[f"{case}_rate"]),
                f"{off[f'{case}_cpu_us']:.1f}",
                common.fmt_rate(on[f"{case}_rate"]),
                f"{on[f'{case}_cpu_us']:.1f}",
                common.fmt_x(on[f"{case}_rate"] / off[f"{case}_rate"]),
                f"{on[f'{case}_cpu_us'] - off[f'{case}_cpu_us']:.1f}",
            ]
        )
    headers = ["case", "off msg/s", "off us/msg", "on msg/s", "on us/msg", "on/off", "cost us"]
    common.print_table(headers, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
