#!/usr/bin/env python
"""Spark throughput: rows/s through the nsq source, the nsq sink, and a source -> sink pipe,
beside a plain nsqclient Consumer -> Producer pipe on the same nsqd.

Needs the ``spark`` extra (pyspark >= 4.2, pyarrow) and Java 17.  One local[2] Spark session
runs in this process; the plain pipe runs in a subprocess of its own.  Every case gets fresh
topics holding N 200-byte messages (published before the case starts, channel created first),
and every figure is checked against nsqd's ``/stats``: the source channel must end with nothing
left, in flight, requeued or timed out, and the target topic must hold N messages (the pipes
and the sink may publish a duplicate after a failure; none is expected here).

Cases:

* source: ``readStream.format("nsq")`` -> the ``noop`` sink, until every message is finished.
* sink: ``spark.range(N)`` as 200-byte bodies -> ``write.format("nsq")`` (MPUBs of 500).
* pipe: ``readStream.format("nsq")`` -> ``upper(body)`` -> ``writeStream.format("nsq")``.
* plain pipe: Consumer (max_in_flight as given) whose handler gathers messages and, every 500
  or when ``is_starved()``, MPUBs their upper-cased bodies, then FINs them.

"wall" rates count from ``start()`` (or ``save()``) to the last message finished or stored, so
they include the query's start (a few seconds); "batches" rates divide the rows by the time
Spark spent in its micro-batches (``triggerExecution`` of every batch that had rows).

    .venv/bin/python bench/spark.py                       # 100,000 messages per case
    .venv/bin/python bench/spark.py -n 50000 --max-in-flight 5000
    NSQ_BIN_DIR=/opt/nsq-bin .venv/bin/python bench/spark.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from typing import Any

import _common as common

CHANNEL = "bench"
MPUB_SIZE = 500


# ------------------------------------------------------------------------------ plain pipe


def child_main(spec: dict[str, Any]) -> None:
    """The plain Consumer -> Producer pipe, in its own process."""
    import nsqclient

    n = spec["messages"]
    done = threading.Event()
    lock = threading.Lock()
    batch: list[Any] = []
    moved = [0]
    producer = nsqclient.Producer(spec["nsqd"])

    def flush() -> None:
        if not batch:
            return
        producer.mpub(spec["target"], [m.body.upper() for m in batch])
        for m in batch:
            m.finish()
        moved[0] += len(batch)
        batch.clear()
        if moved[0] >= n:
            done.set()

    def handle(message: Any) -> None:
        message.enable_async()
        with lock:
            batch.append(message)
            if len(batch) >= MPUB_SIZE or consumer.is_starved():
                flush()

    consumer = nsqclient.Consumer(
        spec["source"],
        CHANNEL,
        handle,
        nsqd_tcp_addresses=spec["nsqd"],
        max_in_flight=spec["max_in_flight"],
    )
    started = time.monotonic()
    consumer.start()
    # A tail smaller than a batch is flushed when the stream goes quiet.
    while not done.wait(0.05):
        with lock:
            if batch and time.monotonic() - batch[-1].received_at > 0.05:
                flush()
        if time.monotonic() - started > spec["timeout"]:
            break
    elapsed = time.monotonic() - started
    consumer.stop()
    producer.close()
    common.emit_result({"moved": moved[0], "seconds": elapsed})


# ------------------------------------------------------------------------------ Spark cases


def spark_session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import nsqclient.spark

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("nsqclient-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.adaptive.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    nsqclient.spark.register(spark)
    return spark


def fill(broker: common.Broker, topic: str, n: int) -> None:
    """Create ``topic``/bench and publish N 200-byte messages to it."""
    import nsqclient

    common.create_channel(broker.http_address, topic, CHANNEL)
    body = common.message_body()
    with nsqclient.Producer(broker.tcp_address) as producer:
        for i in range(0, n, 1000):
            producer.mpub(topic, [body] * min(1000, n - i))


def drained(broker: common.Broker, topic: str, n: int) -> bool:
    ch = common.channel_stats(broker.http_address, topic, CHANNEL)
    return (
        bool(ch) and ch["depth"] == 0 and ch["in_flight_count"] == 0 and (ch["message_count"] >= n)
    )


def check_source(broker: common.Broker, topic: str) -> str:
    ch = common.channel_stats(broker.http_address, topic, CHANNEL) or {}
    bad = {k: ch.get(k) for k in ("depth", "in_flight_count", "requeue_count", "timeout_count")}
    return "" if not any(bad.values()) else f" (source channel not clean: {bad})"


def batch_seconds(query: Any) -> float:
    return sum(
        p["durationMs"].get("triggerExecution", 0) / 1000.0
        for p in query.recentProgress
        if p.get("numInputRows")
    )


def stream_case(
    spark: Any, broker: common.Broker, n: int, max_in_flight: int, pipe: bool
) -> dict[str, Any]:
    source = common.fresh_topic("pipe" if pipe else "source", "spark")
    target = source + "_out"
    fill(broker, source, n)
    frame = (
        spark.readStream.format("nsq")
        .option("topic", source)
        .option("channel", CHANNEL)
        .option("nsqd_tcp_addresses", broker.tcp_address)
        .option("max_in_flight", str(max_in_flight))
        .option("numPartitions", "2")
        .load()
    )
    checkpoint = tempfile.mkdtemp(prefix="nsq-bench-ck-")
    if pipe:
        writer = (
            frame.selectExpr("upper(cast(body as string)) as body")
            .writeStream.format("nsq")
            .option("topic", target)
            .option("nsqd_tcp_addresses", broker.tcp_address)
        )
    else:
        writer = frame.writeStream.format("noop")
    started = time.monotonic()
    query = writer.option("checkpointLocation", checkpoint).start()
    if pipe:
        ok = common.wait_for(
            "the pipe's output",
            lambda: common.topic_message_count(broker.http_address, target),
            lambda count: count >= n,
            timeout=max(120.0, n / 200),
        )
        ok = ok == n
    else:
        ok = common.wait_for(
            "the source channel to drain",
            lambda: drained(broker, source, n),
            bool,
            timeout=max(120.0, n / 200),
        )
    elapsed = time.monotonic() - started
    in_batches = batch_seconds(query)
    batches = sum(1 for p in query.recentProgress if p.get("numInputRows"))
    # The quiet stream's last batch is finished without a next batch: wait for it.
    common.wait_for("nothing in flight", lambda: drained(broker, source, n), bool, timeout=30)
    query.stop()
    note = check_source(broker, source)
    if pipe:
        count = common.topic_message_count(broker.http_address, target)
        if count != n:
            note += f" (target has {count} messages, not {n})"
        common.delete_topic(broker.http_address, target)
    common.delete_topic(broker.http_address, source)
    return {
        "ok": bool(ok) and not note,
        "wall": n / elapsed,
        "batches_rate": n / in_batches if in_batches else None,
        "batches": batches,
        "note": note,
    }


def sink_case(spark: Any, broker: common.Broker, n: int) -> dict[str, Any]:
    target = common.fresh_topic("sink", "spark")
    body = common.message_body().decode()
    frame = spark.range(n, numPartitions=2).selectExpr(f"'{body}' as body")
    frame.count()  # plan and warm the workers outside the timing
    started = time.monotonic()
    (
        frame.write.format("nsq")
        .option("topic", target)
        .option("nsqd_tcp_addresses", broker.tcp_address)
        .option("maxMessagesPerMpub", str(MPUB_SIZE))
        .mode("append")
        .save()
    )
    elapsed = time.monotonic() - started
    count = common.topic_message_count(broker.http_address, target)
    common.delete_topic(broker.http_address, target)
    note = "" if count == n else f" (topic has {count} messages, not {n})"
    return {"ok": not note, "wall": n / elapsed, "note": note}


def plain_case(broker: common.Broker, n: int, max_in_flight: int) -> dict[str, Any]:
    source = common.fresh_topic("plain", "nsqclient")
    target = source + "_out"
    fill(broker, source, n)
    result = common.run_child(
        __file__,
        {
            "client": "nsqclient",
            "case": "plain pipe",
            "nsqd": broker.tcp_address,
            "source": source,
            "target": target,
            "messages": n,
            "max_in_flight": max_in_flight,
            "timeout": max(120.0, n / 200),
        },
        timeout=max(180.0, n / 100),
    )
    note = check_source(broker, source)
    count = common.topic_message_count(broker.http_address, target)
    if count != n:
        note += f" (target has {count} messages, not {n})"
    common.delete_topic(broker.http_address, source)
    common.delete_topic(broker.http_address, target)
    return {"ok": not note, "wall": n / result["seconds"], "note": note}


# ------------------------------------------------------------------------------ main


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--child":
        child_main(json.loads(argv[1]))
        return 0
    parser = common.argument_parser(__doc__ or "", 100_000, "messages per case (default 100,000)")
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=10_000,
        help="max_in_flight of the source and of the plain pipe's Consumer (default 10,000)",
    )
    args = parser.parse_args(argv)
    n = args.messages
    mem_queue = args.mem_queue_size or n + 1000
    with common.open_broker(
        args, mem_queue_size=mem_queue, max_rdy_count=max(2500, args.max_in_flight)
    ) as broker:
        print(f"broker: {broker.description}")
        print(
            f"{n:,} messages of {common.MESSAGE_SIZE} bytes per case, "
            f"max_in_flight {args.max_in_flight:,}, Spark local[2]"
        )
        plain = plain_case(broker, n, args.max_in_flight)
        spark = spark_session()
        try:
            rows = [
                ("source -> noop", stream_case(spark, broker, n, args.max_in_flight, False)),
                ("df.write (sink)", sink_case(spark, broker, n)),
                (
                    "source -> upper -> sink",
                    stream_case(spark, broker, n, args.max_in_flight, True),
                ),
                ("plain Consumer -> Producer", plain),
            ]
        finally:
            spark.stop()
    print(f"{'case':<28} {'rows/s wall':>12} {'rows/s in batches':>18} {'batches':>8}")
    failed = False
    for name, r in rows:
        rate = r.get("batches_rate")
        print(
            f"{name:<28} {r['wall']:>12,.0f} "
            f"{(f'{rate:,.0f}' if rate else '-'):>18} {r.get('batches', '-')!s:>8}{r['note']}"
        )
        failed = failed or not r["ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
