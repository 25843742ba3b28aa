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
* floor (``--cases floor``, not in the default set): the floor under the source, nsqd
  included.  Two things run at once from the same moment, on a topic filled like the source's:
  the ``floor_spark`` query below, and a drainer that takes the same N messages off the same
  nsqd and FINs them: ``nsq_tail`` (Go, ``--max-in-flight`` 2500, its output to /dev/null)
  when the bin directory has it, else an nsqclient Consumer in pull mode (the script says
  which).  The made-up source offers nothing until the drainer is started, so neither gets a
  head start.  Its rate is N over the time until both are done (each one's own rate is
  printed below the table): Spark's cost plus nsqd's cost to deliver N messages and take
  their FINs, on the same cores.  The drainer is not free: nsq_tail FINs every message in a
  write of its own and writes each one to its output (two more system calls), which costs it,
  and nsqd, more per message than the source's reader (one FIN write per connection and
  batch); see floor_pull.  The "x floor" column is every case's rate against it (same mode),
  and source -> noop's best run is printed as a ratio of the best of each floor.
* floor_pull: the same with the drainer an nsqclient Consumer in pull mode (``take()``,
  ``finish_many()``: one FIN write per batch, as the source does) in a process of its own.
* floor_spark: Spark's own floor for a Python source of this schema.  A Python data source
  with the nsq source's schema and transport (the same InputPartition carrying the same
  thing: nsqd's frames, which the executors' ``read`` turns into rows as the source's does;
  with an older source, Arrow rows made on the driver) whose messages were made up once in
  advance, ``max_in_flight`` per batch -> ``noop``: what Spark itself costs per batch and per
  row, with no nsqd and no reader work at all.

Each Spark session first runs an unreported warm-up (``floor_spark``, 4 batches; not with
``--no-warmup``): a session's first query pays the JVM's JIT and the Python workers' start, a
cost the first case would carry otherwise.  A case may be named more than once in ``--cases``
(``floor,source,floor,source``): its runs interleave, and the ratios use the best run of
each.

"sustained" is the rate from the first message out (finished on the source channel for the
noop case, published to the target otherwise) to the last, from nsqd's ``/stats`` polled every
20 ms; "wall" counts from the query's ``start()`` (so it includes Spark's start).

For each Spark streaming case the script prints a table "where a batch's time goes":

* Spark's ``durationMs`` per batch (mean over the batches that had rows): latestOffset (for
  the nsq source: FIN of the previous batch, the wait for nsqd to refill, the cut),
  queryPlanning, getBatch, addBatch (the rows through the sink: the executors' work),
  walCommit, commitOffsets and triggerExecution (the whole batch);
* the CPU per message, over the sustained window, of each kind of process of the run, from
  ``/proc/<pid>/stat`` (utime + stime, sampled every 0.5 s, so that a process that starts or
  ends in the window counts too): the source reader (Spark's driver-side Python process
  ``pyspark.sql.streaming.python_streaming_source_runner``), nsqd, the driver JVM (in
  ``local[2]`` the executors are its threads), the executor JVMs, the Python workers
  (``pyspark.daemon``/``pyspark.worker``: the executors' ``read`` and the sink's writes),
  other Python (Spark's other driver-side Python helpers, e.g. the streaming sink's commit
  runner, named below the table), the bench driver (this script's Spark child: py4j and the
  20 ms polls), the floor's drainer and the standalone master/workers; then the sum, the wall
  time per message and the cores kept busy (CPU over wall).  The processes are the
  descendants of the script (and a ``--nsqd`` given), so other work on the machine is not
  counted, but it does take cores: the load average is printed at the start and the end.

To measure another checkout's package (a worktree of an older commit, say), put it first on
``PYTHONPATH``: the Spark children, the source runner and the local workers inherit it, and
the script passes it to the executors (``spark.executorEnv.PYTHONPATH``).

    .venv/bin/python bench/spark.py                       # 200,000 messages per case
    NSQ_BIN_DIR=/opt/nsq-bin .venv/bin/python bench/spark.py -n 1000000 --cluster
    NSQ_BIN_DIR=/opt/nsq-bin .venv/bin/python bench/spark.py -n 1000000 --no-relays \
        --cases floor,floor_pull,source,floor_spark,floor_spark,source,floor_pull,floor
    .venv/bin/python bench/spark.py --master spark://host:7077 --modes cluster
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import Any

import _common as common

from nsqclient.spark.source import SPARK_SOURCE_RUNNER

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

    def __init__(
        self,
        probe: Any,
        n: int,
        on_first: Any = None,
        on_last: Any = None,
    ):
        self.probe = probe
        self.n = n
        self.on_first = on_first  # called on the poll thread when the count first moves
        self.on_last = on_last  # ... and when it reaches n
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
                if self.on_first is not None:
                    self.on_first()
            if value >= self.n and self.last is None:
                self.last = now
                if self.on_last is not None:
                    self.on_last()
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


# ------------------------------------------------------------------------------ CPU by process

#: the process kinds of the CPU table, in its order
CPU_KINDS = (
    "source reader",
    "nsqd",
    "driver JVM",
    "executor JVMs",
    "Python workers",
    "other Python",
    "bench driver",
    "drainer",
    "cluster daemons",
)


def process_kind(pid: int, argv: list[str], bench_pid: int) -> tuple[str, str]:
    """The kind of a process of the run (one of :data:`CPU_KINDS`, or ``""``: not counted) and
    a short name of what it runs."""
    if pid == bench_pid:
        return "bench driver", "bench/spark.py child (Spark's driver-side Python, py4j)"
    if not argv:
        return "", ""
    exe = os.path.basename(argv[0])
    if exe == "nsqd":
        return "nsqd", "nsqd"
    if exe == "nsq_tail" or '"client": "drain"' in argv[-1]:
        return "drainer", "nsq_tail" if exe == "nsq_tail" else "nsqclient pull Consumer"
    if SPARK_SOURCE_RUNNER in argv:
        return "source reader", SPARK_SOURCE_RUNNER
    if exe == "java":
        text = " ".join(argv)
        if "org.apache.spark.deploy.SparkSubmit" in text:
            return "driver JVM", "SparkSubmit"
        if "CoarseGrainedExecutorBackend" in text:
            return "executor JVMs", "CoarseGrainedExecutorBackend"
        if "deploy.master.Master" in text or "deploy.worker.Worker" in text:
            return "cluster daemons", "Master/Worker"
        return "", ""
    # "python -m pyspark.daemon pyspark.worker": the daemon that forks the workers of a module
    modules = [a for a in argv if a.startswith("pyspark.")]
    if modules:
        if modules[-1] in ("pyspark.daemon", "pyspark.worker"):
            return "Python workers", modules[-1]
        return "other Python", modules[-1]
    return "", ""


class ProcessCpu:
    """CPU time of the processes of a run by kind (:data:`CPU_KINDS`), between :meth:`mark`
    ``("start")`` and ``("end")``, from ``/proc/<pid>/stat`` (utime + stime).

    The processes are the descendants of ``root`` (the bench parent: nsqd, the standalone
    cluster and its executors, the Spark child, its JVM, the JVM's Python processes) and
    ``extra`` (an nsqd the run did not start).  A thread samples them every ``interval``
    seconds, so that a process that ends in the window counts up to its last sample and one
    that starts in it counts from zero.  ``unseen`` is the CPU of reaped children (cutime) not
    seen alive: a check that short-lived processes did not escape the sampling."""

    def __init__(self, root: int, extra: list[int | None], interval: float = 0.5):
        self.root = root
        self.extra = [p for p in extra if p]
        self.bench_pid = os.getpid()
        self.interval = interval
        self.marks: dict[str, dict[int, tuple[int, int]]] = {}
        self.last: dict[int, tuple[str, str, int]] = {}  # pid -> (kind, name, own ticks)
        self.before: set[int] = set()  # the pids seen up to the start of the window
        self._kinds: dict[int, tuple[str, str]] = {}
        self.window = (0.0, 0.0)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-cpu", daemon=True)

    def __enter__(self) -> ProcessCpu:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _pids(self) -> dict[int, tuple[int, int]]:
        table = common.process_table()
        extra = [p for p in self.extra if p in table]
        pids = common.descendants(table, [self.root, *extra]) | set(extra)
        return {pid: (table[pid].cpu, table[pid].children_cpu) for pid in pids}

    def sample(self) -> dict[int, tuple[int, int]]:
        found = self._pids()
        with self._lock:
            for pid, (own, _) in found.items():
                kind_name = self._kinds.get(pid)
                if kind_name is None and pid in self.extra:
                    kind_name = ("nsqd", "nsqd (given by pid: an embedded one is the parent)")
                if kind_name is None:
                    kind_name = process_kind(pid, common.proc_argv(pid), self.bench_pid)
                    if kind_name[0]:  # known for good (a shell may still exec java)
                        self._kinds[pid] = kind_name
                self.last[pid] = (*kind_name, own)
        return found

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def mark(self, name: str) -> None:
        """Snapshot the processes now (``"start"`` / ``"end"`` of the window)."""
        now = time.monotonic()
        self.marks[name] = self.sample()
        if name == "start":
            with self._lock:
                self.before = set(self.last)
            self.window = (now, now)
        else:
            self.window = (self.window[0], now)

    def result(self, messages: int) -> dict[str, Any]:
        """CPU seconds by kind in the window, the processes counted, the window's seconds."""
        start, end = self.marks.get("start", {}), self.marks.get("end", {})
        cpu: dict[str, float] = {}
        names: dict[str, set[str]] = {}
        gone_own = 0
        with self._lock:
            for pid, (kind, name, own) in self.last.items():
                if not kind:
                    continue
                if pid in self.before and pid not in start:
                    continue  # ended before the window
                base = start[pid][0] if pid in start else 0
                cpu[kind] = cpu.get(kind, 0.0) + (own - base) / common.CLK_TCK
                names.setdefault(kind, set()).add(name)
                if pid not in end:
                    gone_own += own - base
        reaped = sum(end[p][1] - start[p][1] for p in end if p in start)
        return {
            "cpu": cpu,
            "cpu_names": {k: sorted(v) for k, v in names.items()},
            "cpu_messages": messages,
            "cpu_seconds": self.window[1] - self.window[0],
            "cpu_unseen": max(0, reaped - gone_own) / common.CLK_TCK,
        }


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
            common.stop_process(proc)
    common.wait_for(
        "nsq_to_nsq's FINs",
        lambda: finished_count(broker.http_address, source),
        lambda c: c >= n,
        timeout=10,
    )
    return relay_result(broker, source, target, n, "nsq_to_nsq (Go, defaults)", s, n / elapsed)


# ------------------------------------------------------------------------------ Spark child


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
    with process_cpu(spec) as cpu, cpu_window(Sustained(probe, n), cpu) as s:
        query = writer.option("checkpointLocation", checkpoint).start()
        s.wait(max(120.0, n / 200))
        elapsed = time.monotonic() - started
    # The quiet stream's last batch is finished without a next batch: wait for it.
    common.wait_for(
        "nothing in flight", lambda: finished_count(http, source), lambda c: c >= n, timeout=30
    )
    return stream_result(query, checkpoint, s.rate(), n / elapsed, cpu.result(window_rows(s)))


def process_cpu(spec: dict[str, Any]) -> ProcessCpu:
    return ProcessCpu(spec["root_pid"], [spec.get("nsqd_pid")])


def cpu_window(sustained: Sustained, cpu: ProcessCpu) -> Sustained:
    """``sustained`` marking ``cpu``'s window: its first message out to its last."""
    sustained.on_first = lambda: cpu.mark("start")
    sustained.on_last = lambda: cpu.mark("end")
    return sustained


def window_rows(s: Sustained) -> int:
    """The messages of a :class:`Sustained` window (from the first count seen to n)."""
    return s.n - (s.first[1] if s.first else 0)


def stream_result(
    query: Any,
    checkpoint: str,
    sustained: float | None,
    wall: float,
    cpu: dict[str, Any] | None = None,
) -> dict:
    """Stop ``query``, remove its checkpoint; the figures of a streaming case."""
    progress = [p for p in query.recentProgress if p.get("numInputRows")]
    query.stop()
    shutil.rmtree(checkpoint, ignore_errors=True)
    return {
        **(cpu or {}),
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
    """The data source of the ``floor`` and ``floor_spark`` cases (see the module docstring).

    With the options ``go`` and ``ready`` (two paths), ``latestOffset`` offers nothing until
    the file ``go`` exists, and creates ``ready`` when first asked: the ``floor`` case starts
    its drainer and the made-up rows at the same moment, once the query runs."""
    import array

    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, ReadAllAvailable

    from nsqclient.protocol import FRAME_TYPE_MESSAGE, encode_frame, encode_message
    from nsqclient.spark.rows import SCHEMA_DDL, to_record_batch
    from nsqclient.spark.source import NSQInputPartition

    try:  # the source ships nsqd's frames and the executors make the rows
        from nsqclient.spark.frames import Frames, Piece, to_rows
    except ImportError:  # an older source ships Arrow rows made on the driver
        Frames = Piece = to_rows = None  # noqa: N806

    body = common.message_body()  # a value: the classes below must not refer to _common

    class MadeUp:
        def __init__(self, i: int):
            self.id = b"%016x" % i
            self.body = body
            self.timestamp = 1_700_000_000_000_000_000 + i
            self.attempts = 1
            self.nsqd_address = "127.0.0.1:4150"

    def framed(count: int) -> tuple[bytes, list[int]]:
        """``count`` messages framed as nsqd sends them, and where each message starts."""
        frames = [
            encode_frame(FRAME_TYPE_MESSAGE, encode_message(m.timestamp, m.attempts, m.id, body))
            for m in map(MadeUp, range(count))
        ]
        size = len(frames[0]) if frames else 0
        return b"".join(frames), [i * size + 8 for i in range(count)]

    class FloorReader(DataSourceStreamReader):
        def __init__(self, options: Mapping[str, str]):
            self.total = int(options["rows"])
            self.per_batch = int(options["batch"])
            self.parts = int(options["numPartitions"])
            self.go = options.get("go")
            self.ready = options.get("ready")
            self.rows: Any = None

        def initialOffset(self) -> dict:  # noqa: N802
            return {"seq": 0}

        def getDefaultReadLimit(self) -> Any:  # noqa: N802
            return ReadAllAvailable()

        def latestOffset(self, start: dict, limit: Any) -> dict:  # noqa: N802
            import os

            if self.go:
                if not os.path.exists(self.go):
                    if self.ready and not os.path.exists(self.ready):
                        open(self.ready, "w").close()  # noqa: SIM115
                    return start
                self.go = None  # once started, never again
            return {"seq": min(start["seq"] + self.per_batch, self.total)}

        def partitions(self, start: dict, end: dict) -> list[Any]:
            count = end["seq"] - start["seq"]
            if count <= 0:
                return []
            size = -(-count // self.parts)
            spans = [
                (i, i * size, min(count, (i + 1) * size))
                for i in range(self.parts)
                if i * size < count
            ]
            if Frames is None:
                if self.rows is None:
                    self.rows = to_record_batch([MadeUp(i) for i in range(self.per_batch)], "t")
                return [NSQInputPartition(i, self.rows.slice(lo, hi - lo)) for i, lo, hi in spans]
            if self.rows is None:
                self.rows = framed(self.per_batch)
            buffer, starts = self.rows
            return [
                NSQInputPartition(
                    i,
                    Frames(
                        [
                            Piece(
                                buffer,
                                starts[lo] - 8,
                                starts[hi - 1] + 26 + len(body),
                                array.array("q", starts[lo:hi]).tobytes(),
                                "127.0.0.1:4150",
                                None,
                            )
                        ],
                        False,
                        False,
                        False,
                    ),
                )
                for i, lo, hi in spans
            ]

        def read(self, partition: Any) -> Any:
            if Frames is None:
                yield partition.batch
            else:
                yield to_rows(partition.frames, "t")

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
    """``floor_spark``: the made-up rows -> noop.  ``floor``: the same while a drainer takes
    the case's N messages off nsqd (and FINs them), both from the same moment; its rate is N
    over the time until both are done."""
    n, http = spec["messages"], spec["nsqd_http"]
    drain = case["kind"] in ("floor", "floor_pull")
    spark.dataSource.register(floor_source())
    handshake = tempfile.mkdtemp(prefix="nsq-bench-floor-")
    go, ready = os.path.join(handshake, "go"), os.path.join(handshake, "ready")
    reader = (
        spark.readStream.format("nsqfloor")
        .option("rows", str(n))
        .option("batch", str(spec["max_in_flight"]))
        .option("numPartitions", str(spec["partitions"]))
    )
    if drain:
        reader = reader.option("go", go).option("ready", ready)
    checkpoint = tempfile.mkdtemp(prefix="nsq-bench-ck-")
    started = time.monotonic()
    query = reader.load().writeStream.format("noop").option("checkpointLocation", checkpoint)
    query = query.start()
    done = lambda: sum(p.get("numInputRows", 0) for p in query.recentProgress)  # noqa: E731
    timeout = max(120.0, n / 200)
    if not drain:
        with process_cpu(spec) as cpu, cpu_window(Sustained(done, n), cpu) as s:
            s.wait(timeout)
            elapsed = time.monotonic() - started
        shutil.rmtree(handshake, ignore_errors=True)
        return stream_result(query, checkpoint, s.rate(), n / elapsed, cpu.result(window_rows(s)))
    common.wait_for("the floor query", lambda: os.path.exists(ready), bool, timeout=120)
    pending = [2]

    def one_done() -> None:
        pending[0] -= 1
        if not pending[0]:
            cpu.mark("end")

    with process_cpu(spec) as cpu:
        cpu.mark("start")
        t0 = time.monotonic()
        drainer, what = start_drainer(spec, case, pull=case["kind"] == "floor_pull")
        open(go, "w").close()  # noqa: SIM115
        fins = Sustained(lambda: finished_count(http, case["source"]), n, on_last=one_done)
        rows = Sustained(done, n, on_last=one_done)
        with fins, rows:
            rows.wait(timeout)
            fins.wait(timeout)
        common.stop_process(drainer)
    now = time.monotonic()
    end = max(rows.last or now, fins.last or now)
    result = stream_result(query, checkpoint, n / (end - t0), n / (end - started), cpu.result(n))
    shutil.rmtree(handshake, ignore_errors=True)
    result["floor_parts"] = {
        "drainer": what,
        "rows": n / ((rows.last or now) - t0),
        "drain": n / ((fins.last or now) - t0),
    }
    return result


def start_drainer(spec: dict[str, Any], case: dict[str, Any], pull: bool) -> tuple[Any, str]:
    """The ``floor`` case's consumer of the case's topic: ``nsq_tail`` (output to /dev/null)
    when the bin directory has it and not ``pull``, else an nsqclient Consumer in pull mode
    (``take()``, ``finish_many()``) in a process of its own.  The process and what it is."""
    binary = os.path.join(spec.get("bin_dir") or "", "nsq_tail")
    mif = spec["drain_max_in_flight"]
    if not pull and spec.get("bin_dir") and os.access(binary, os.X_OK):
        argv = [
            binary,
            f"--nsqd-tcp-address={spec['nsqd']}",
            f"--topic={case['source']}",
            f"--channel={CHANNEL}",
            f"--max-in-flight={mif}",
        ]
        what = f"nsq_tail (Go, max-in-flight {mif})"
    else:
        child = {
            "client": "drain",
            "nsqd": spec["nsqd"],
            "source": case["source"],
            "messages": spec["messages"],
            "max_in_flight": mif,
        }
        argv = [sys.executable, __file__, "--child", json.dumps(child)]
        what = f"nsqclient pull Consumer (max_in_flight {mif})"
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, what


def drain_child(spec: dict[str, Any]) -> None:
    """The ``floor`` case's drainer when there is no nsq_tail: take and FIN N messages."""
    import nsqclient

    consumer = nsqclient.Consumer(
        spec["source"],
        CHANNEL,
        None,
        nsqd_tcp_addresses=spec["nsqd"],
        max_in_flight=spec["max_in_flight"],
    )
    consumer.start()
    done = 0
    deadline = time.monotonic() + max(120.0, spec["messages"] / 200)
    while done < spec["messages"] and time.monotonic() < deadline:
        batch = consumer.take(timeout=0.5)
        if batch:
            consumer.finish_many(batch)
            done += len(batch)
    consumer.stop()
    common.emit_result({"drained": done})


def spark_child(spec: dict[str, Any]) -> None:
    spark = common.spark_session(spec["master"], "nsqclient-bench")
    results = []
    try:
        if spec.get("warmup"):
            # The session's first query pays the JVM's JIT and the Python workers' start.
            rows = min(spec["messages"], 4 * spec["max_in_flight"])
            floor_case(spark, {**spec, "messages": rows}, {"kind": "floor_spark"})
        for case in spec["cases"]:
            if case["kind"] == "sink":
                results.append(sink_case(spark, spec, case))
            elif case["kind"] in ("floor", "floor_pull", "floor_spark"):
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
        if kind in ("source", "pipe", "floor", "floor_pull"):
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
        "root_pid": os.getpid(),
        "nsqd_pid": broker.pid,
        "bin_dir": args.bin_dir,
        "drain_max_in_flight": args.drain_max_in_flight,
        "warmup": not args.no_warmup,
    }
    result = common.run_child(__file__, spec, timeout=max(600.0, n / 50))
    names = {
        "source": "source -> noop",
        "sink": "df.write (sink)",
        "pipe": "source -> upper -> sink",
        "floor": "floor: made-up rows -> noop + drain",
        "floor_pull": "floor_pull: made-up rows -> noop + pull drain",
        "floor_spark": "floor_spark: made-up rows -> noop",
    }
    rows = []
    for case, r in zip(cases, result["results"], strict=True):
        note = ""
        if case["kind"] in ("source", "pipe", "floor", "floor_pull"):
            note += check_source(broker.http_address, case["source"])
            common.delete_topic(broker.http_address, case["source"])
        if case["kind"] in ("sink", "pipe"):
            note += check_target(broker.http_address, case["target"], n)
            common.delete_topic(broker.http_address, case["target"])
        rows.append(
            {
                "case": names[case["kind"]],
                "kind": case["kind"],
                "mode": mode,
                "ok": not note,
                "note": note,
                **r,
            }
        )
    return rows


# ------------------------------------------------------------------------------ main


def main(argv: list[str]) -> int:
    if common.run_as_child(
        argv,
        lambda spec: {"spark": spark_child, "drain": drain_child}.get(spec["client"], relay_child)(
            spec
        ),
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
        help="Spark cases, comma-separated, each run in this order (one may come again): "
        "source, sink, pipe, floor, floor_pull, floor_spark (default: source, sink, pipe)",
    )
    parser.add_argument(
        "--no-warmup",
        action="store_true",
        help="no warm-up query (by default each Spark session first runs made-up rows -> "
        "noop, 4 batches, not reported: the first query pays the JIT and the workers' start)",
    )
    parser.add_argument(
        "--drain-max-in-flight",
        type=int,
        default=2500,
        help="max-in-flight of the floor case's drainer (default 2500: nsqd's max-rdy-count)",
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
    unknown = set(args.cases) - {"source", "sink", "pipe", "floor", "floor_pull", "floor_spark"}
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
    floors = best_by_mode(rows, "floor")
    table = []
    for r in rows:
        table.append(
            [
                r["case"],
                r["mode"],
                common.fmt_rate(r.get("sustained")),
                common.fmt_ratio(r.get("sustained"), go),
                common.fmt_ratio(r.get("sustained"), floors.get(r["mode"])),
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
            "x floor",
            "rows/s wall",
            "batches",
            "rows/batch",
            "",
        ],
        table,
    )
    for r in rows:
        parts = r.get("floor_parts")
        if parts:
            print(
                f"  floor [{r['mode']}]: made-up rows done at {parts['rows']:,.0f} rows/s, "
                f"the drainer ({parts['drainer']}) at {parts['drain']:,.0f} msg/s, from the "
                "same start"
            )
    print_floor_ratios(rows)
    print_batch_time(rows)
    print(f"\n({common.load_average()} at the end)")


def best_by_mode(rows: list[dict[str, Any]], kind: str) -> dict[str, float]:
    """The best sustained rate of the ``kind`` rows, by mode."""
    best: dict[str, float] = {}
    for r in rows:
        if r.get("kind") == kind and r.get("sustained"):
            best[r["mode"]] = max(best.get(r["mode"], 0.0), r["sustained"])
    return best


def print_floor_ratios(rows: list[dict[str, Any]]) -> None:
    """source -> noop (best run) against the floor and floor_spark (best runs), by mode."""
    sources = best_by_mode(rows, "source")
    floors = {k: best_by_mode(rows, k) for k in ("floor", "floor_pull", "floor_spark")}
    for mode, rate in sources.items():
        parts = [
            f"{rate / best[mode]:.2f}x {kind} ({best[mode]:,.0f} rows/s)"
            for kind, best in floors.items()
            if mode in best
        ]
        if parts:
            print(f"source -> noop [{mode}], best {rate:,.0f} rows/s: " + "; ".join(parts))


def print_batch_time(rows: list[dict[str, Any]]) -> None:
    """The table "where a batch's time goes": Spark's durationMs per phase (mean ms per batch
    with rows) and the CPU per message of each kind of process, over the sustained window."""
    streams = [r for r in rows if r.get("durations") or r.get("cpu")]
    if not streams:
        return
    print()
    print("Where a batch's time goes: Spark's durationMs, mean ms per batch with rows")
    phases = [k for k in DURATION_KEYS if any(k in r.get("durations", {}) for r in streams)]
    common.print_table(
        ["case", "where", "batches", "rows/batch", *phases],
        [
            [
                r["case"],
                r["mode"],
                str(r.get("batches", "-")),
                common.fmt_rate(r.get("rows_per_batch")),
                *(fmt_ms(r.get("durations", {}).get(k)) for k in phases),
            ]
            for r in streams
        ],
    )
    print()
    print(
        "... and CPU us per message by process (over the sustained window; local[2]: the "
        "executors are threads of the driver JVM)"
    )
    kinds = [k for k in CPU_KINDS if any(k in r.get("cpu", {}) for r in streams)]
    table = []
    for r in streams:
        cpu, msgs, secs = r.get("cpu", {}), r.get("cpu_messages") or 0, r.get("cpu_seconds")
        total = sum(cpu.values())
        table.append(
            [
                r["case"],
                r["mode"],
                *(fmt_us(cpu.get(k), msgs) for k in kinds),
                fmt_us(total, msgs),
                fmt_us(secs, msgs),
                f"{total / secs:.2f}" if secs and msgs else "-",
            ]
        )
    common.print_table(
        ["case", "where", *kinds, "all", "wall us/msg", "cores busy"],
        table,
    )
    for r in streams:
        others = r.get("cpu_names", {}).get("other Python")
        if others:
            print(f"  other Python [{r['case']}, {r['mode']}]: {', '.join(others)}")
        if r.get("cpu_unseen") and r.get("cpu_messages"):
            unseen = r["cpu_unseen"] / r["cpu_messages"] * 1e6
            if unseen >= 0.1:
                print(
                    f"  [{r['case']}, {r['mode']}]: {unseen:.1f} us/msg of CPU in processes "
                    "that ended unseen (reaped children) not counted above"
                )


def fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def fmt_us(seconds: float | None, messages: int) -> str:
    if seconds is None or not messages:
        return "-"
    return f"{seconds / messages * 1e6:.1f}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
