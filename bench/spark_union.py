#!/usr/bin/env python
"""One Spark query reading 1 or several ``nsq`` sources on the same topic and channel, unioned:
rows/s and the CPU of each source's driver-side reader process.

Spark starts one ``python -m pyspark.sql.streaming.python_streaming_source_runner`` process
per source of a query (each ``load()`` is a source of its own): with K sources unioned there
are K readers, each with its own Consumers on the channel, and nsqd spreads the channel's
messages over all of them.  This script measures what that buys, ``source -> noop`` in
``local[2]``:

* the parent owns the broker (as every bench script: real nsqd with ``NSQ_BIN_DIR``, else the
  embedded one, or ``--nsqd``) and fills a fresh topic's channel with N 200-byte messages for
  each run;
* one child process holds the Spark session and runs every case in turn: K sources
  (``spark.readStream.format("nsq")`` K times on that topic/channel, each source with
  ``max_in_flight`` = ``--max-in-flight``, or ``--max-in-flight`` / K with
  ``--split-in-flight``, and its own ``client_id``), ``union``-ed, written to ``noop``;
* the rate is sustained: from the first message FINished on the channel to the N-th (the
  channel's clients' ``finish_count`` in nsqd's ``/stats``, polled every 20 ms);
* at both ends of that window the child reads each reader process's CPU (``/proc/<pid>/stat``
  utime + stime; the readers are the runner processes under the child's Spark JVM) and the
  ``finish_count`` of each of the channel's clients in ``/stats``; a client's remote port
  names the process whose socket it is, so each reader's messages are counted by nsqd;
* afterwards the parent checks the channel: nothing left, in flight, requeued or timed out.

The table gives rows/s, and per reader its messages in the window and its CPU per message
(us/msg); ``all readers`` is their CPU summed over the window's messages.  The load average is
printed at the start and end of each run: other work on the machine moves every figure.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from typing import Any

import _common as common

from nsqclient.spark.source import SPARK_SOURCE_RUNNER

CHANNEL = "bench"
POLL = 0.02


# ------------------------------------------------------------------------------ /proc


def cpu_ticks(pid: int) -> int | None:
    """utime + stime of ``pid`` (all its threads), in clock ticks."""
    stat = common.proc_stat(pid)
    return None if stat is None else stat.cpu


def reader_pids() -> set[int]:
    """The source runners descended from this process (its Spark JVM's children)."""
    mine = common.descendants(common.process_table(), [os.getpid()])
    return {pid for pid in mine if SPARK_SOURCE_RUNNER in common.proc_argv(pid)}


# ------------------------------------------------------------------------------ the child


def finished(http: str, topic: str) -> int:
    """The messages the channel's clients FINished (their ``finish_count``s summed).

    Not ``message_count - depth - in_flight_count``: a message nsqd has taken off the
    channel's queue for a client but not yet put in flight is in none of those counts, so
    that difference moves as soon as delivery starts, before anything is finished."""
    ch = common.channel_stats(http, topic, CHANNEL) or {}
    return sum(int(c.get("finish_count", 0)) for c in ch.get("clients") or [])


class Snapshot:
    """At one moment: each reader's CPU ticks and the messages its connections finished
    (``{pid: (ticks, finished)}``), nsqd's CPU ticks and the channel's finished count."""

    def __init__(self, spec: dict[str, Any], topic: str, readers: set[int]):
        self.at = time.monotonic()
        port = int(spec["nsqd"].rsplit(":", 1)[1])
        owners = common.socket_owners(port)
        ch = common.channel_stats(spec["nsqd_http"], topic, CHANNEL) or {}
        fins: dict[int, int] = {}
        for client in ch.get("clients") or []:
            pid = owners.get(int(str(client["remote_address"]).rsplit(":", 1)[1]), -1)
            fins[pid] = fins.get(pid, 0) + int(client.get("finish_count", 0))
        self.readers = {pid: (cpu_ticks(pid) or 0, fins.get(pid, 0)) for pid in readers}
        self.nsqd = cpu_ticks(spec["nsqd_pid"]) if spec.get("nsqd_pid") else None
        self.finished = sum(fins.values())


def run_case(spark: Any, spec: dict[str, Any], case: dict[str, Any]) -> dict[str, Any]:
    n, http, topic, k = spec["messages"], spec["nsqd_http"], case["topic"], case["readers"]
    frames = [
        spark.readStream.format("nsq")
        .option("topic", topic)
        .option("channel", CHANNEL)
        .option("nsqd_tcp_addresses", spec["nsqd"])
        .option("max_in_flight", str(spec["max_in_flight"] // (k if spec["split"] else 1)))
        .option("numPartitions", str(spec["partitions"]))
        .option("client_id", f"bench-union-{i}")
        .load()
        for i in range(k)
    ]
    frame = frames[0]
    for other in frames[1:]:
        frame = frame.union(other)
    before = reader_pids()  # a stopped query's readers may still be on their way out
    checkpoint = tempfile.mkdtemp(prefix="nsq-bench-union-ck-")
    load = [os.getloadavg()[0]]
    started = time.monotonic()
    query = frame.writeStream.format("noop").option("checkpointLocation", checkpoint).start()
    try:
        readers: set[int] = set()
        deadline = time.monotonic() + 120
        while len(readers) < k and query.isActive and time.monotonic() < deadline:
            readers = reader_pids() - before
            time.sleep(POLL)
        if len(readers) != k:
            return {"error": f"{len(readers)} reader processes, not {k}: {query.exception()}"}
        first = last = None
        deadline = time.monotonic() + max(300.0, n / 200)
        while query.isActive and time.monotonic() < deadline:
            count = finished(http, topic)
            if first is None and count > 0:
                first = Snapshot(spec, topic, readers)
            if count >= n:
                last = Snapshot(spec, topic, readers)
                break
            time.sleep(POLL)
        wall = time.monotonic() - started
        load.append(os.getloadavg()[0])
        if first is None or last is None:
            return {"error": f"not every message finished: {query.exception()}"}
        progress = [p for p in query.recentProgress if p.get("numInputRows")]
    finally:
        query.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)
    seconds = last.at - first.at
    window = last.finished - first.finished
    per_reader = []
    for pid in sorted(readers):
        ticks0, fin0 = first.readers[pid]
        ticks1, fin1 = last.readers[pid]
        per_reader.append(
            {"pid": pid, "cpu": (ticks1 - ticks0) / common.CLK_TCK, "messages": fin1 - fin0}
        )
    nsqd_cpu = (
        (last.nsqd - first.nsqd) / common.CLK_TCK
        if last.nsqd is not None and first.nsqd is not None
        else None
    )
    return {
        "readers": k,
        "rate": window / seconds if seconds > 0 else None,
        "wall": wall,
        "window_messages": window,
        "window_seconds": seconds,
        "per_reader": per_reader,
        "nsqd_cpu": nsqd_cpu,
        "batches": len(progress),
        "rows_per_batch": sum(p["numInputRows"] for p in progress) / max(len(progress), 1),
        "load": load,
    }


def child_main(spec: dict[str, Any]) -> None:
    spark = common.spark_session(spec["master"], "nsqclient-bench-union")
    results = []
    try:
        for case in spec["cases"]:
            result = run_case(spark, spec, case)
            results.append(result)
            print(f"  {case['readers']} reader(s): {describe(result)}", file=sys.stderr)
    finally:
        spark.stop()
    common.emit_result({"results": results})


# ------------------------------------------------------------------------------ the parent


def describe(r: dict[str, Any]) -> str:
    if r.get("error"):
        return f"error: {r['error']}"
    return f"{common.fmt_rate(r['rate'])} rows/s, load {r['load'][0]:.1f} -> {r['load'][1]:.1f}"


def us_per_msg(cpu: float, messages: int) -> str:
    return f"{cpu / messages * 1e6:.1f}" if messages else "-"


def report(rows: list[dict[str, Any]], max_in_flight: int, split: bool) -> None:
    held = (
        f"max_in_flight {max_in_flight:,} split over the sources"
        if split
        else (f"each source max_in_flight {max_in_flight:,}")
    )
    print()
    print(
        f"source -> noop, {held}; rate from the first FIN to the last; per reader: "
        "messages it finished in that window / its CPU us per message"
    )
    print()
    headers = [
        "readers",
        "rows/s",
        "rows/batch",
        "per reader (msgs, us/msg)",
        "all readers us/msg",
        "nsqd us/msg",
        "load",
        "check",
    ]
    table = []
    for r in rows:
        if r.get("error"):
            table.append([str(r["case"]), "-", "-", r["error"][:60], "-", "-", "-", "error"])
            continue
        total = r["window_messages"]
        cells = ", ".join(
            f"{p['messages']:,} / {us_per_msg(p['cpu'], p['messages'])}" for p in r["per_reader"]
        )
        cpu = sum(p["cpu"] for p in r["per_reader"])
        nsqd = us_per_msg(r["nsqd_cpu"], total) if r["nsqd_cpu"] is not None else "-"
        table.append(
            [
                str(r["readers"]),
                common.fmt_rate(r["rate"]),
                f"{r['rows_per_batch']:,.0f}",
                cells,
                us_per_msg(cpu, total),
                nsqd,
                f"{r['load'][0]:.1f}-{r['load'][1]:.1f}",
                "ok" if r["ok"] else r["note"],
            ]
        )
    print(common.markdown_table(headers, table))


def main(argv: list[str]) -> int:
    if common.run_as_child(argv, child_main):
        return 0
    parser = common.argument_parser(__doc__ or "", 300_000, "messages per run (default 300,000)")
    common.add_max_in_flight_argument(parser, help="max_in_flight of EACH source (default 50,000)")
    parser.set_defaults(max_in_flight=50_000)
    parser.add_argument(
        "--readers",
        default="1,2",
        help="sources (= reader processes) per query, one run each, in this order; a number "
        "may come again to interleave repeats (default 1,2)",
    )
    parser.add_argument(
        "--split-in-flight",
        action="store_true",
        help="give each of K sources max_in_flight / K (the same messages held, and the same "
        "batch size, whatever K) instead of max_in_flight each",
    )
    parser.add_argument(
        "--partitions", type=int, default=2, help="each source's numPartitions (default 2)"
    )
    parser.add_argument(
        "--master", default="local[2]", help="Spark master of the child (default local[2])"
    )
    common.add_quick_argument(parser)
    args = parser.parse_args(argv)
    common.apply_quick(args, messages=20_000, max_in_flight=5000)
    counts = [int(k) for k in common.comma_list(args.readers)]
    if not counts or min(counts) < 1:
        parser.error("--readers: positive numbers, comma-separated")
    n = args.messages
    with common.open_broker(args, mem_queue_size=args.mem_queue_size or n + 1000) as broker:
        print(f"broker: {broker.description}; {common.describe_machine()}")
        cases: list[dict[str, Any]] = []
        for k in counts:
            topic = common.fresh_topic("union", f"r{k}")
            common.fill_topic(broker, topic, CHANNEL, n)
            cases.append({"readers": k, "topic": topic})
        spec = {
            "client": "spark",
            "case": "union",
            "master": args.master,
            "nsqd": broker.tcp_address,
            "nsqd_http": broker.http_address,
            "nsqd_pid": broker.pid,
            "messages": n,
            "max_in_flight": args.max_in_flight,
            "split": args.split_in_flight,
            "partitions": args.partitions,
            "cases": cases,
        }
        result = common.run_child(__file__, spec, timeout=max(900.0, n / 50 * len(cases)))
        rows = []
        for case, r in zip(cases, result["results"], strict=True):
            ch = common.channel_stats(broker.http_address, case["topic"], CHANNEL) or {}
            bad = {
                key: ch.get(key)
                for key in ("depth", "in_flight_count", "requeue_count", "timeout_count")
                if ch.get(key)
            }
            note = f"channel not clean: {bad}" if bad else ""
            rows.append(
                {**r, "case": case["readers"], "ok": not note and not r.get("error"), "note": note}
            )
            common.delete_topic(broker.http_address, case["topic"])
    report(rows, args.max_in_flight, args.split_in_flight)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
