#!/usr/bin/env python
"""The Spark source's driver-side reader alone: its ceiling and where its CPU goes.

A child process drives :class:`nsqclient.spark.NSQStreamReader` the way Spark's driver-side
Python process does, without Spark: ``latestOffset`` (FIN of the previous batch, the refill
wait, the cut), ``partitions`` and pickling them (what Spark ships to the executors), then the
next ``latestOffset``, until N messages went through, and a last ``commit``.  The parent owns
the broker, fills a fresh topic's channel with N 200-byte messages before the child starts
(so a profile holds the reading only) and checks nsqd's ``/stats`` after it: every message
finished, nothing in flight.

The child's GC thresholds are raised as the source raises them in Spark's own process (``--gc
default`` keeps CPython's). Per ``--max-in-flight`` value it prints rows/s (first
``latestOffset`` to the last batch), the child's CPU per message (all threads) and the mean
time per batch of ``latestOffset`` and of ``partitions`` + pickling.  The executors' share
is measured after that, apart: the CPU of unpickling the partitions and building their Arrow
rows (``read()``), per message, over the first ``--executor-sample`` messages shipped.
``--option KEY=VALUE`` passes one more source option (``--option max_tries=5``: the source's
default is 0).  With ``--profile DIR`` the child runs under py-spy (``--gil``: the thread
holding the GIL) when found, else cProfile in every thread; see bench/README.rst.

    NSQ_BIN_DIR=/opt/nsq-bin .venv/bin/python bench/spark_reader.py -n 500000
    PY_SPY=/tmp/py-spy/bin/py-spy NSQ_BIN_DIR=/opt/nsq-bin \\
        .venv/bin/python bench/spark_reader.py --profile /tmp/prof-reader
"""

from __future__ import annotations

import pickle
import sys
import time
from typing import Any

import _common as common

CHANNEL = "spark"


def child(spec: dict[str, Any]) -> None:
    from pyspark.sql.datasource import ReadAllAvailable

    from nsqclient.spark.options import SourceOptions
    from nsqclient.spark.source import NSQStreamReader, relax_gc

    if spec["gc"] == "relaxed":
        relax_gc()  # as in Spark's own source process (see nsqclient.spark.source)

    options = SourceOptions.parse(
        {
            "topic": spec["topic"],
            "channel": CHANNEL,
            "nsqd_tcp_addresses": spec["nsqd"],
            "max_in_flight": str(spec["max_in_flight"]),
            "numPartitions": str(spec["partitions"]),
            **spec["options"],
        }
    )
    reader = NSQStreamReader(options)
    n = spec["messages"]
    start = reader.initialOffset()
    rows = batches = 0
    cut = ship = 0.0
    sample: list[bytes] = []  # the first partitions shipped: the executors' share, after
    sampled = 0
    with common.maybe_profile(spec):
        began = time.monotonic()
        cpu = common.cpu_seconds()
        while rows < n:
            t0 = time.perf_counter()
            end = reader.latestOffset(start, ReadAllAvailable())
            t1 = time.perf_counter()
            if end == start:
                continue
            parts = reader.partitions(start, end)
            shipped = [pickle.dumps(p) for p in parts]
            t2 = time.perf_counter()
            rows += sum(p.count for p in parts)
            if sampled < spec["executor_sample"]:
                sample += shipped
                sampled += sum(p.count for p in parts)
            batches += 1
            cut += t1 - t0
            ship += t2 - t1
            start = end
            del shipped
        reader.commit(start)
        elapsed = time.monotonic() - began
        cpu = common.cpu_seconds() - cpu
    reader.stop()
    for table in reader.read(pickle.loads(sample.pop(0))):  # imports, as a reused worker has
        sampled -= table.num_rows
    executor_cpu = common.cpu_seconds()
    for data in sample:  # what each executor's read() does with its partition
        for table in reader.read(pickle.loads(data)):
            del table
    executor_cpu = common.cpu_seconds() - executor_cpu
    common.emit_result(
        {
            "rate": rows / elapsed,
            "cpu_us": 1e6 * cpu / rows,
            "executor_us": 1e6 * executor_cpu / max(sampled, 1),
            "batches": batches,
            "latest_ms": 1000 * cut / batches,
            "partitions_ms": 1000 * ship / batches,
        }
    )


def main(argv: list[str]) -> int:
    if common.run_as_child(argv, child):
        return 0
    parser = common.argument_parser(__doc__, 300_000, "messages per run (default 300,000)")
    parser.add_argument(
        "--max-in-flight",
        default="2500,50000",
        help="the source's max_in_flight values to run, comma-separated (default 2500,50000)",
    )
    parser.add_argument("--partitions", type=int, default=2, help="numPartitions (default 2)")
    parser.add_argument(
        "--executor-sample",
        type=int,
        default=100_000,
        help="messages whose partitions are read (decoded into Arrow rows) after the run to "
        "measure the executors' share (default 100,000)",
    )
    parser.add_argument(
        "--gc",
        default="relaxed",
        help="GC thresholds of the child, comma-separated runs: relaxed (what the source sets "
        "in Spark's process), default (CPython's) (default relaxed)",
    )
    parser.add_argument(
        "-o",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one more source option (repeatable), e.g. max_tries=5",
    )
    common.add_profile_arguments(parser)
    args = parser.parse_args(argv)
    options = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            parser.error(f"--option: KEY=VALUE expected, not {item!r}")
        options[key.strip()] = value
    n = args.messages
    rows = []
    with common.open_broker(args, mem_queue_size=n + 1000) as broker:
        print(f"broker: {broker.description}; {common.describe_machine()}", file=sys.stderr)
        if options:
            print(f"source options: {options}", file=sys.stderr)
        runs = [
            (int(v), g)
            for g in args.gc.split(",")
            for v in args.max_in_flight.split(",")
            if v.strip() and g.strip()
        ]
        for value, gc_mode in runs:
            if gc_mode not in ("relaxed", "default"):
                parser.error(f"--gc: unknown {gc_mode!r}")
            topic = common.fresh_topic("reader", str(value))
            common.fill_topic(broker, topic, CHANNEL, n)
            spec = {
                "client": "nsqclient",
                "case": f"spark-reader-{value}-{gc_mode}",
                "gc": gc_mode,
                "nsqd": broker.tcp_address,
                "topic": topic,
                "messages": n,
                "max_in_flight": value,
                "partitions": args.partitions,
                "executor_sample": args.executor_sample,
                "options": options,
                **common.profile_spec(args, "nsqclient"),
            }
            r = common.run_child(__file__, spec, timeout=max(300.0, n / 1000))
            stats = common.channel_stats(broker.http_address, topic, CHANNEL) or {}
            left = stats.get("depth", 0) + stats.get("in_flight_count", 0)
            note = "" if left == 0 else f"{left} messages left on the channel"
            common.delete_topic(broker.http_address, topic)
            rows.append(
                [
                    f"{value:,}",
                    gc_mode,
                    common.fmt_rate(r["rate"]),
                    f"{r['cpu_us']:.2f}",
                    f"{r['executor_us']:.2f}",
                    str(r["batches"]),
                    f"{r['latest_ms']:.0f}",
                    f"{r['partitions_ms']:.0f}",
                    note,
                ]
            )
    common.print_table(
        [
            "max_in_flight",
            "GC",
            "rows/s",
            "CPU us/msg",
            "executors' us/msg",
            "batches",
            "latestOffset ms",
            "partitions+pickle ms",
            "",
        ],
        rows,
    )
    return 0 if all(not row[-1] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
