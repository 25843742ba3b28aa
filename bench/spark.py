#!/usr/bin/env python
"""Spark throughput: rows/s through the nsq source, the nsq sink, and a source -> sink pipe, in
local mode and on a standalone cluster, beside Go's nsq_to_nsq and a plain nsqclient relay on
the same nsqd in the same run.

Needs the ``spark`` extra (pyspark >= 4.2, pyarrow) and Java 17.  The parent owns the broker
(nsqd started with its DEFAULT flags: ``--max-rdy-count`` 2500) and runs every client in a
subprocess of its own, one after the other: the plain relay, ``nsq_to_nsq`` (when the bin
directory has it), then one Spark session per mode (``local[2]``; with ``--cluster`` a
standalone master and two workers of 1 core and 1 GiB started from pyspark's own
``bin/spark-class``; with ``--master URL`` a cluster of yours).  Every case gets fresh topics
holding N 200-byte messages (channel created first), and every figure is checked against
nsqd's ``/stats``: the source channel must end with nothing left, in flight, requeued or timed
out, and the target topic must hold N messages.

Cases:

* source: ``readStream.format("nsq")`` -> the ``noop`` sink, until every message is finished.
* sink: ``spark.range(N)`` as 200-byte bodies -> ``write.format("nsq")`` (MPUBs of 500).
* pipe: ``readStream.format("nsq")`` -> ``upper(body)`` -> ``writeStream.format("nsq")``.
* plain relay: Consumer whose handler gathers messages and, every 500 or when
  ``is_starved()``, MPUBs their upper-cased bodies, then FINs them.
* nsq_to_nsq: Go's relay with its defaults (max-in-flight 200).
* floor (``--cases floor``, not in the default set): the floor under the source.  A Python
  data source with the nsq source's schema and transport (the same InputPartition, Arrow IPC)
  whose rows were made up once in advance, ``max_in_flight`` per batch -> ``noop``: what Spark
  itself costs per batch and per row, with no nsqd and no reader work at all.

"sustained" is the rate from the first message out (finished on the source channel for the
noop case, published to the target otherwise) to the last, from nsqd's ``/stats`` polled every
20 ms; "wall" counts from the query's ``start()`` (so it includes Spark's start).  For each
Spark streaming case the script prints Spark's ``durationMs`` per batch (mean over the batches
that had rows): latestOffset (FIN of the previous batch, the wait for nsqd to refill, the cut),
queryPlanning, addBatch (the rows through the sink), walCommit and commitOffsets.

    .venv/bin/python bench/spark.py                       # 200,000 messages per case
    NSQ_BIN_DIR=/opt/nsq-bin .venv/bin/python bench/spark.py -n 1000000 --cluster
    .venv/bin/python bench/spark.py --master spark://host:7077 --modes cluster
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import _common as common

CHANNEL = "bench"
MPUB_SIZE = 500
POLL = 0.02
DURATION_KEYS = (
    "latestOffset",
    "queryPlanning",
    "getBatch",
    "addBatch",
    "walCommit",
    "commitOffsets",
    "triggerExecution",
)


# ------------------------------------------------------------------------------ measuring


class Sustained:
    """Polls ``probe()`` (a count that grows to ``n``) every 20 ms on a thread: the first
    time it is non-zero, and when it reaches ``n``."""

    def __init__(self, probe: Any, n: int):
        self.probe = probe
        self.n = n
        self.first: tuple[float, int] | None = None
        self.last: float | None = None
        self.value = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-poll", daemon=True)

    def __enter__(self) -> Sustained:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                value = int(self.probe())
            except (OSError, ValueError, KeyError, TypeError):
                value = self.value
            now = time.monotonic()
            self.value = value
            if value > 0 and self.first is None:
                self.first = (now, value)
            if value >= self.n and self.last is None:
                self.last = now
                return
            self._stop.wait(POLL)

    def wait(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return self.last is not None

    def rate(self) -> float | None:
        if self.first is None or self.last is None or self.last <= self.first[0]:
            return None
        return (self.n - self.first[1]) / (self.last - self.first[0])


def finished_count(http: str, topic: str) -> int:
    ch = common.channel_stats(http, topic, CHANNEL)
    if not ch:
        return 0
    return int(ch["message_count"]) - int(ch["depth"]) - int(ch["in_flight_count"])


def check_source(http: str, topic: str) -> str:
    ch = common.channel_stats(http, topic, CHANNEL) or {}
    bad = {k: ch.get(k) for k in ("depth", "in_flight_count", "requeue_count", "timeout_count")}
    return "" if not any(bad.values()) else f" (source channel not clean: {bad})"


def check_target(http: str, target: str, n: int) -> str:
    count = common.topic_message_count(http, target)
    return "" if count == n else f" (target has {count} messages, not {n})"


# ------------------------------------------------------------------------------ plain relay


def relay_child(spec: dict[str, Any]) -> None:
    """The plain Consumer -> Producer relay, in its own process."""
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


def relay_case(args: Any, broker: common.Broker, n: int) -> dict[str, Any]:
    source = common.fresh_topic("relay", "nsqclient")
    target = source + "_out"
    common.fill_topic(broker, source, CHANNEL, n)
    spec = {
        "client": "nsqclient",
        "case": "relay",
        "nsqd": broker.tcp_address,
        "source": source,
        "target": target,
        "messages": n,
        "max_in_flight": 2500,
        "timeout": max(120.0, n / 200),
    }
    with Sustained(lambda: common.topic_message_count(broker.http_address, target), n) as s:
        result = common.run_child(__file__, spec, timeout=max(180.0, n / 100))
        s.wait(10)
    return relay_result(
        broker, source, target, n, "plain relay (max_in_flight 2500)", s, n / result["seconds"]
    )


def relay_result(
    broker: common.Broker,
    source: str,
    target: str,
    n: int,
    case: str,
    sustained: Sustained,
    wall: float,
) -> dict[str, Any]:
    """Check a relay's topics on nsqd, delete them; the row of the relay's figures."""
    note = check_source(broker.http_address, source) + check_target(broker.http_address, target, n)
    common.delete_topic(broker.http_address, source)
    common.delete_topic(broker.http_address, target)
    return {
        "case": case,
        "mode": "-",
        "ok": not note,
        "sustained": sustained.rate(),
        "wall": wall,
        "note": note,
    }


def nsq_to_nsq_case(args: Any, broker: common.Broker, n: int) -> dict[str, Any] | None:
    binary = os.path.join(args.bin_dir or "", "nsq_to_nsq")
    if not args.bin_dir or not os.access(binary, os.X_OK):
        return None
    source = common.fresh_topic("relay", "go")
    target = source + "_out"
    common.fill_topic(broker, source, CHANNEL, n)
    argv = [
        binary,
        f"--nsqd-tcp-address={broker.tcp_address}",
        f"--destination-nsqd-tcp-address={broker.tcp_address}",
        f"--topic={source}",
        f"--channel={CHANNEL}",
        f"--destination-topic={target}",
        "--status-every=0",
    ]
    started = time.monotonic()
    with Sustained(lambda: common.topic_message_count(broker.http_address, target), n) as s:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            s.wait(max(120.0, n / 200))
            elapsed = time.monotonic() - started
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    common.wait_for(
        "nsq_to_nsq's FINs",
        lambda: finished_count(broker.http_address, source),
        lambda c: c >= n,
        timeout=10,
    )
    return relay_result(broker, source, target, n, "nsq_to_nsq (Go, defaults)", s, n / elapsed)


# ------------------------------------------------------------------------------ Spark child


def spark_session(spec: dict[str, Any]) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import nsqclient.spark

    builder = (
        SparkSession.builder.master(spec["master"])
        .appName("nsqclient-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.adaptive.enabled", "false")
    )
    if not spec["master"].startswith("local"):
        builder = builder.config("spark.executor.memory", "768m").config("spark.cores.max", "2")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    nsqclient.spark.register(spark)
    return spark


def stream_case(spark: Any, spec: dict[str, Any], case: dict[str, Any]) -> dict[str, Any]:
    n, http, pipe = spec["messages"], spec["nsqd_http"], case["pipe"]
    source, target = case["source"], case["target"]
    frame = (
        spark.readStream.format("nsq")
        .option("topic", source)
        .option("channel", CHANNEL)
        .option("nsqd_tcp_addresses", spec["nsqd"])
        .option("max_in_flight", str(spec["max_in_flight"]))
        .option("numPartitions", str(spec["partitions"]))
        .options(**spec.get("source_options", {}))
        .load()
    )
    checkpoint = tempfile.mkdtemp(prefix="nsq-bench-ck-")
    if pipe:
        writer = (
            frame.selectExpr("upper(cast(body as string)) as body")
            .writeStream.format("nsq")
            .option("topic", target)
            .option("nsqd_tcp_addresses", spec["nsqd"])
        )
        probe = lambda: common.topic_message_count(http, target)  # noqa: E731
    else:
        writer = frame.writeStream.format("noop")
        probe = lambda: finished_count(http, source)  # noqa: E731
    started = time.monotonic()
    with Sustained(probe, n) as s:
        query = writer.option("checkpointLocation", checkpoint).start()
        s.wait(max(120.0, n / 200))
        elapsed = time.monotonic() - started
    # The quiet stream's last batch is finished without a next batch: wait for it.
    common.wait_for(
        "nothing in flight", lambda: finished_count(http, source), lambda c: c >= n, timeout=30
    )
    return stream_result(query, checkpoint, s.rate(), n / elapsed)


def stream_result(query: Any, checkpoint: str, sustained: float | None, wall: float) -> dict:
    """Stop ``query``, remove its checkpoint; the figures of a streaming case."""
    progress = [p for p in query.recentProgress if p.get("numInputRows")]
    query.stop()
    shutil.rmtree(checkpoint, ignore_errors=True)
    return {
        "sustained": sustained,
        "wall": wall,
        "batches": len(progress),
        "rows_per_batch": sum(p["numInputRows"] for p in progress) / max(len(progress), 1),
        "durations": durations_of(progress),
    }


def durations_of(progress: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key in DURATION_KEYS:
        values = [p["durationMs"][key] for p in progress if key in p["durationMs"]]
        if values:
            out[key] = sum(values) / len(values)
    return out


def sink_case(spark: Any, spec: dict[str, Any], case: dict[str, Any]) -> dict[str, Any]:
    n, target = spec["messages"], case["target"]
    body = common.message_body().decode()
    frame = spark.range(n, numPartitions=spec["partitions"]).selectExpr(f"'{body}' as body")
    frame.count()  # plan and warm the workers outside the timing
    started = time.monotonic()
    with Sustained(lambda: common.topic_message_count(spec["nsqd_http"], target), n) as s:
        (
            frame.write.format("nsq")
            .option("topic", target)
            .option("nsqd_tcp_addresses", spec["nsqd"])
            .option("maxMessagesPerMpub", str(MPUB_SIZE))
            .mode("append")
            .save()
        )
        elapsed = time.monotonic() - started
        s.wait(10)
    return {"sustained": s.rate(), "wall": n / elapsed}


def floor_source() -> Any:
    """The ``floor`` case's data source (see the module docstring)."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, ReadAllAvailable

    from nsqclient.spark.rows import SCHEMA_DDL, to_record_batch
    from nsqclient.spark.source import NSQInputPartition

    body = common.message_body()  # a value: the classes below must not refer to _common

    class MadeUp:
        def __init__(self, i: int):
            self.id = b"%016x" % i
            self.body = body
            self.timestamp = 1_700_000_000_000_000_000 + i
            self.attempts = 1
            self.nsqd_address = "127.0.0.1:4150"

    class FloorReader(DataSourceStreamReader):
        def __init__(self, options: dict[str, str]):
            self.total = int(options["rows"])
            self.per_batch = int(options["batch"])
            self.parts = int(options["numPartitions"])
            self.rows: Any = None

        def initialOffset(self) -> dict:  # noqa: N802
            return {"seq": 0}

        def getDefaultReadLimit(self) -> Any:  # noqa: N802
            return ReadAllAvailable()

        def latestOffset(self, start: dict, limit: Any) -> dict:  # noqa: N802
            return {"seq": min(start["seq"] + self.per_batch, self.total)}

        def partitions(self, start: dict, end: dict) -> list[Any]:
            count = end["seq"] - start["seq"]
            if count <= 0:
                return []
            if self.rows is None:
                self.rows = to_record_batch([MadeUp(i) for i in range(self.per_batch)], "t")
            size = -(-count // self.parts)
            return [
                NSQInputPartition(i, self.rows.slice(i * size, min(size, count - i * size)))
                for i in range(self.parts)
                if i * size < count
            ]

        def read(self, partition: Any) -> Any:
            yield partition.batch

        def commit(self, end: dict) -> None:
            pass

    class FloorSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "nsqfloor"

        def schema(self) -> str:
            return SCHEMA_DDL

        def streamReader(self, schema: Any) -> Any:  # noqa: N802
            return FloorReader(self.options)

    return FloorSource


def floor_case(spark: Any, spec: dict[str, Any], case: dict[str, Any]) -> dict[str, Any]:
    n = spec["messages"]
    spark.dataSource.register(floor_source())
    frame = (
        spark.readStream.format("nsqfloor")
        .option("rows", str(n))
        .option("batch", str(spec["max_in_flight"]))
        .option("numPartitions", str(spec["partitions"]))
        .load()
    )
    checkpoint = tempfile.mkdtemp(prefix="nsq-bench-ck-")
    started = time.monotonic()
    query = frame.writeStream.format("noop").option("checkpointLocation", checkpoint).start()
    done = lambda: sum(p.get("numInputRows", 0) for p in query.recentProgress)  # noqa: E731
    with Sustained(done, n) as s:
        s.wait(max(120.0, n / 200))
        elapsed = time.monotonic() - started
    return stream_result(query, checkpoint, s.rate(), n / elapsed)


def spark_child(spec: dict[str, Any]) -> None:
    spark = spark_session(spec)
    results = []
    try:
        for case in spec["cases"]:
            if case["kind"] == "sink":
                results.append(sink_case(spark, spec, case))
            elif case["kind"] == "floor":
                results.append(floor_case(spark, spec, case))
            else:
                results.append(stream_case(spark, spec, case))
    finally:
        spark.stop()
    common.emit_result({"results": results})


def spark_cases(
    args: Any, broker: common.Broker, n: int, mode: str, master: str
) -> list[dict[str, Any]]:
    cases = []
    for kind in args.cases:
        source = common.fresh_topic(kind, mode)
        cases.append(
            {
                "kind": kind,
                "pipe": kind == "pipe",
                "source": source,
                "target": source + "_out",
            }
        )
        if kind in ("source", "pipe"):
            common.fill_topic(broker, source, CHANNEL, n)
    spec = {
        "client": "spark",
        "case": mode,
        "master": master,
        "nsqd": broker.tcp_address,
        "nsqd_http": broker.http_address,
        "messages": n,
        "max_in_flight": args.max_in_flight,
        "partitions": args.partitions,
        "source_options": dict(o.split("=", 1) for o in args.source_option),
        "cases": cases,
    }
    result = common.run_child(__file__, spec, timeout=max(600.0, n / 50))
    names = {
        "source": "source -> noop",
        "sink": "df.write (sink)",
        "pipe": "source -> upper -> sink",
        "floor": "floor: made-up rows -> noop",
    }
    rows = []
    for case, r in zip(cases, result["results"], strict=True):
        note = ""
        if case["kind"] in ("source", "pipe"):
            note += check_source(broker.http_address, case["source"])
            common.delete_topic(broker.http_address, case["source"])
        if case["kind"] in ("sink", "pipe"):
            note += check_target(broker.http_address, case["target"], n)
            common.delete_topic(broker.http_address, case["target"])
        rows.append({"case": names[case["kind"]], "mode": mode, "ok": not note, "note": note, **r})
    return rows


# ------------------------------------------------------------------------------ main


def main(argv: list[str]) -> int:
    if common.run_as_child(
        argv,
        lambda spec: spark_child(spec) if spec["client"] == "spark" else relay_child(spec),
    ):
        return 0
    parser = common.argument_parser(__doc__ or "", 200_000, "messages per case (default 200,000)")
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=50_000,
        help="max_in_flight of the Spark source (default 50,000)",
    )
    parser.add_argument(
        "--partitions", type=int, default=2, help="the source's numPartitions (default 2)"
    )
    parser.add_argument(
        "--source-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="another option of the source (e.g. maxMessagesPerBatch=25000); repeatable",
    )
    parser.add_argument(
        "--max-rdy-count",
        type=int,
        default=None,
        help="nsqd --max-rdy-count for a broker this script starts (default: nsqd's, 2500)",
    )
    parser.add_argument(
        "--cases",
        default="source,sink,pipe",
        help="Spark cases, comma-separated: source, sink, pipe, floor (default: source, "
        "sink, pipe)",
    )
    parser.add_argument(
        "--modes",
        default="local",
        help="where the Spark cases run, comma-separated: local, cluster (default local; "
        "--cluster or --master add cluster)",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="start a standalone cluster (a master, 2 workers of 1 core and 1 GiB) from "
        "pyspark's bin/spark-class and run the Spark cases there too",
    )
    parser.add_argument("--master", help="run the cluster cases on this Spark master URL")
    parser.add_argument(
        "--no-relays", action="store_true", help="skip nsq_to_nsq and the plain relay"
    )
    args = parser.parse_args(argv)
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = set(args.cases) - {"source", "sink", "pipe", "floor"}
    if unknown:
        parser.error(f"unknown case(s): {', '.join(sorted(unknown))}")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if (args.cluster or args.master) and "cluster" not in modes:
        modes.append("cluster")
    n = args.messages
    options: dict[str, Any] = {"mem_queue_size": args.mem_queue_size or n + 1000}
    if args.max_rdy_count:
        options["max_rdy_count"] = args.max_rdy_count
    rows: list[dict[str, Any]] = []
    with common.open_broker(args, **options) as broker:
        print(f"broker: {broker.description}; {common.describe_machine()}")
        print(
            f"{n:,} messages of {common.MESSAGE_SIZE} bytes per case; Spark source "
            f"max_in_flight {args.max_in_flight:,}, numPartitions {args.partitions}"
        )
        if not args.no_relays:
            go = nsq_to_nsq_case(args, broker, n)
            if go is not None:
                rows.append(go)
            rows.append(relay_case(args, broker, n))
        for mode in modes:
            if mode == "local":
                rows += spark_cases(args, broker, n, "local[2]", "local[2]")
            elif args.master:
                rows += spark_cases(args, broker, n, "cluster", args.master)
            else:
                from nsqclient.spark.standalone import StandaloneCluster

                with StandaloneCluster(workers=2, cores=1, memory="1g") as cluster:
                    rows += spark_cases(args, broker, n, "cluster 2x1", cluster.url)
    report(rows)
    return 0 if all(r["ok"] for r in rows) else 1


def report(rows: list[dict[str, Any]]) -> None:
    go = next((r["sustained"] for r in rows if r["case"].startswith("nsq_to_nsq")), None)
    table = []
    for r in rows:
        table.append(
            [
                r["case"],
                r["mode"],
                common.fmt_rate(r.get("sustained")),
                common.fmt_ratio(r.get("sustained"), go),
                common.fmt_rate(r.get("wall")),
                str(r.get("batches", "-")),
                common.fmt_rate(r.get("rows_per_batch")),
                r["note"].strip(),
            ]
        )
    common.print_table(
        [
            "case",
            "where",
            "rows/s sustained",
            "x nsq_to_nsq",
            "rows/s wall",
            "batches",
            "rows/batch",
            "",
        ],
        table,
    )
    print()
    print("Spark durationMs per batch with rows (mean):")
    for r in rows:
        if r.get("durations"):
            parts = ", ".join(f"{k} {v:.0f}" for k, v in r["durations"].items())
            print(f"  {r['case']} [{r['mode']}]: {parts}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
