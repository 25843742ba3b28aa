"""Two ``nsq`` sources on the same topic and channel, unioned in one query.

Spark makes one ``MicroBatchStream`` per streaming relation of the plan (each ``load()`` is its
own relation), and each Python ``MicroBatchStream`` starts its own
``python_streaming_source_runner`` process (``PythonStreamingSourceRunner.init``): so each
source has its own driver-side reader, its own Consumers and its own connections to nsqd, and
nsqd spreads the channel's messages over both, as over any two consumers of a channel.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
from spark_helpers import channel_stats, publish_numbered, socket_owners

from nsqclient.spark.source import SPARK_SOURCE_RUNNER
from nsqclient.testing.waiting import wait_for

MESSAGES = 20_000
TOPIC, CHANNEL = "u", "spark"
#: the client_id each source's Consumers send in IDENTIFY (a Consumer option, so a source option)
CLIENT_IDS = {"a": "union-a", "b": "union-b"}
#: Spark's error when a runner did not connect back within its 10 s (PythonWorkerFactory)
CONNECT_BACK_FAILED = "Python worker failed to connect back"
CONNECT_BACK_ATTEMPTS = 3


class QueryEnded(AssertionError):
    """The query stopped while the test waited for it."""


def _proc_ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return int(f.read().rpartition(")")[2].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _proc_argv(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def source_runners() -> dict[int, int]:
    """``{pid: parent pid}`` of the Spark source runners descended from this process (its
    Spark JVM's ``python -m pyspark.sql.streaming.python_streaming_source_runner``)."""
    parents = {int(e): _proc_ppid(int(e)) for e in os.listdir("/proc") if e.isdigit()}
    mine = {os.getpid()}
    grew = True
    while grew:  # the descendants of this process
        more = {pid for pid, ppid in parents.items() if ppid in mine} - mine
        grew = bool(more)
        mine |= more
    return {
        pid: parents[pid]  # type: ignore[misc]
        for pid in mine
        if SPARK_SOURCE_RUNNER in _proc_argv(pid)
    }


def channel_clients(node: Any) -> list[dict[str, Any]]:
    """nsqd's /stats ``clients`` of ``TOPIC``/``CHANNEL``."""
    stats = channel_stats(node, TOPIC, CHANNEL)
    return list((stats or {}).get("clients") or [])


def pids_by_client_id(node: Any) -> dict[str, set[int]]:
    """``{client_id: pids}`` of the channel's clients: each connection nsqd lists, by the
    client_id it IDENTIFYed with, mapped to the process whose socket has its remote port."""
    clients = channel_clients(node)
    # After the listing: a connection nsqd lists is already in /proc (read first, one made
    # between the two reads would have no owner)
    owners = socket_owners(node.tcp_port)
    out: dict[str, set[int]] = {}
    for client in clients:
        port = int(str(client["remote_address"]).rsplit(":", 1)[1])
        out.setdefault(client["client_id"], set()).add(owners.get(port, -1))
    return out


@pytest.mark.timeout(300)
def test_two_unioned_sources_on_one_channel_run_one_reader_process_each(
    spark: Any, nsqd: Any, tmp_path: Any, queries: list[Any]
) -> None:
    from pyspark.sql.functions import lit

    node = nsqd.nsqd
    address = node.tcp_address
    sent = publish_numbered(address, TOPIC, MESSAGES)
    frames = [
        spark.readStream.format("nsq")
        .option("topic", TOPIC)
        .option("channel", CHANNEL)
        .option("nsqd_tcp_addresses", address)
        .option("max_in_flight", "2500")
        .option("client_id", client_id)
        .load()
        .select(lit(tag).alias("source"), "body")
        for tag, client_id in CLIENT_IDS.items()
    ]
    rows: list[tuple[str, bytes]] = []
    lock = threading.Lock()

    def sink(frame: Any, batch_id: int) -> None:
        got = [(r["source"], bytes(r["body"])) for r in frame.collect()]
        with lock:
            rows.extend(got)

    # While the query runs: two runner processes, children of the one Spark JVM, and each
    # source's connections to nsqd come from its own one of them.
    stale: set[int] = set()

    def alive() -> None:
        if not queries[-1].isActive:
            raise QueryEnded(str(queries[-1].exception()))

    def readers() -> tuple[dict[int, int], dict[str, set[int]]] | None:
        alive()
        runners = {p: pp for p, pp in source_runners().items() if p not in stale}
        clients = pids_by_client_id(node)
        # -1: a listed connection with no owner in /proc (closed between the two reads)
        settled = all(-1 not in pids for pids in clients.values())
        if len(runners) == 2 and set(clients) == set(CLIENT_IDS.values()) and settled:
            return runners, clients
        return None

    for attempt in range(1, CONNECT_BACK_ATTEMPTS + 1):
        query = (
            frames[0]
            .union(frames[1])
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .start()
        )
        queries.append(query)
        try:
            runners, clients = wait_for(
                readers,
                timeout=60,
                interval=0.1,
                message=lambda: f"runners {source_runners()}, clients {pids_by_client_id(node)}",
            )
            break
        except QueryEnded as exc:
            # Spark gives a runner 10 s (hard-coded) to start and connect back; on a starved
            # machine compiling pyspark.zip's modules takes longer.  Nothing was read yet.
            if CONNECT_BACK_FAILED not in str(exc) or attempt == CONNECT_BACK_ATTEMPTS:
                raise
            assert not rows
            stale |= set(source_runners())  # a runner already made may be left behind
    assert len(set(runners.values())) == 1, runners  # one parent: the driver's JVM
    (jvm,) = set(runners.values())
    assert "java" in os.path.basename((_proc_argv(jvm) or [""])[0]), _proc_argv(jvm)
    a, b = (clients[CLIENT_IDS[tag]] for tag in ("a", "b"))
    assert len(a) == 1 and len(b) == 1, clients
    assert a | b == set(runners), (clients, runners)
    assert query.isActive

    def arrived() -> bool:
        alive()
        return len(rows) >= MESSAGES

    wait_for(
        arrived,
        timeout=150,
        interval=0.1,
        message=lambda: f"{len(rows)} of {MESSAGES} rows arrived",
    )
    # Exactly once: no row twice, none missing; and both sources got a share of the channel.
    with lock:
        got = list(rows)
    assert len(got) == MESSAGES
    assert {body for _, body in got} == sent
    per_source = {tag: sum(1 for s, _ in got if s == tag) for tag in CLIENT_IDS}
    assert all(per_source.values()), per_source
    print(f"query attempts {attempt}, left-behind runners {stale}, rows by source {per_source}")

    def drained() -> dict[str, Any] | None:
        stats = channel_stats(node, TOPIC, CHANNEL)
        if stats and (stats["depth"], stats["in_flight_count"]) == (0, 0):
            return stats
        return None

    stats = wait_for(
        drained,
        timeout=30,
        interval=0.1,
        message=lambda: f"channel not drained: {channel_stats(node, TOPIC, CHANNEL)}",
    )
    assert (stats["requeue_count"], stats["timeout_count"], stats["deferred_count"]) == (0, 0, 0)
    assert query.isActive
    assert set(source_runners()) - stale == set(runners)  # the same two readers throughout

    # Stopping the query ends both readers; nothing was left held.
    query.stop()
    wait_for(
        lambda: not set(source_runners()) & set(runners),
        timeout=30,
        interval=0.1,
        message=lambda: f"source runners still alive: {source_runners()}",
    )
    assert len(rows) == MESSAGES
    after = channel_stats(node, TOPIC, CHANNEL)
    assert after is not None
    assert (after["depth"], after["in_flight_count"], after["requeue_count"]) == (0, 0, 0)
