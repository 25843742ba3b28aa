#!/usr/bin/env python
"""nsqclient traced and measured with OpenTelemetry, spans and metrics printed to the console.

Start an nsqd (the embedded one will do), then run this against it::

    python -m nsqclient.testing --tcp-address 127.0.0.1:4150 --http-address 127.0.0.1:4151 &
    pip install 'nsqclient[otel]' opentelemetry-sdk
    python examples/otel_console.py --nsqd-tcp-address 127.0.0.1:4150

It subscribes to a topic, publishes four messages to it (``pub``, ``mpub`` of two,
``pub_async``), and handles them with a handler that fails the first message once, so that one
process span is an ERROR and the message comes back with ``attempts=2``.  Then it prints every
span (``publish <topic>``, ``process <topic>``) and the metrics as JSON on stdout, and exits.
"""

from __future__ import annotations

import argparse
import sys
import threading

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

import nsqclient
from nsqclient.otel import NSQInstrumentor


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nsqd-tcp-address", default="127.0.0.1:4150", metavar="HOST:PORT")
    parser.add_argument("--topic", default="otel_demo")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds (default 30)")
    args = parser.parse_args(argv)

    # The SDK's set-up is the application's: spans batched to the console, metrics exported
    # once, at shutdown (a service would export every minute or so, with OTLP).
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    metric_reader = PeriodicExportingMetricReader(
        ConsoleMetricExporter(), export_interval_millis=3_600_000
    )
    meter_provider = MeterProvider(metric_readers=[metric_reader])
    NSQInstrumentor().instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)

    expected = {b"one", b"two", b"three", b"four"}
    handled: set[bytes] = set()
    failed_once: set[bytes] = set()
    lock = threading.Lock()
    done = threading.Event()

    def handle(message: nsqclient.Message) -> None:
        # runs inside the "process <topic>" span
        with lock:
            if message.body == b"one" and message.body not in failed_once:
                failed_once.add(message.body)
                raise RuntimeError("the first attempt at 'one' fails")  # ERROR, requeued
            handled.add(message.body)
            if handled >= expected:
                done.set()

    subscribed = threading.Event()
    consumer = nsqclient.Consumer(
        args.topic,
        "console#ephemeral",
        handle,
        nsqd_tcp_addresses=[args.nsqd_tcp_address],
        on_connect=lambda address: subscribed.set(),
        max_in_flight=10,
        default_requeue_delay=0.0,  # the failed message comes back at once
        max_backoff_duration=0.0,  # and without a backoff pause
    )
    consumer.start()
    try:
        if not subscribed.wait(args.timeout):
            print(f"could not subscribe to {args.nsqd_tcp_address}", file=sys.stderr)
            return 1
        with nsqclient.Producer(args.nsqd_tcp_address) as producer:
            producer.pub(args.topic, b"one")
            producer.mpub(args.topic, [b"two", b"three"])
            producer.pub_async(args.topic, b"four").result(args.timeout)
        if not done.wait(args.timeout):
            print(f"handled only {sorted(handled)} in {args.timeout}s", file=sys.stderr)
            return 1
    finally:
        consumer.stop()

    # pub_async's span ends on a thread of its own just after its Future completed: wait for
    # it, or the provider, shut down first, would drop it.
    observer = NSQInstrumentor().observer
    assert observer is not None  # instrumented above
    observer.flush(timeout=5.0)
    tracer_provider.shutdown()  # prints the spans still in the batch
    meter_provider.shutdown()  # prints the metrics
    NSQInstrumentor().uninstrument()
    return 0


if __name__ == "__main__":
    sys.exit(main())
