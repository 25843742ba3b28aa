"""Helpers of the Spark tests: a collecting consumer, nsqd stats, publishing, pids."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nsqclient import Consumer, Producer
from nsqclient.testing.helpers import channel_stats as channel_stats  # the Spark tests' import
from nsqclient.testing.waiting import wait_for


class Collector:
    """Consumes ``topic`` on channel ``check`` and keeps every body (and how many arrived)."""

    def __init__(self, address: str, topic: str):
        self.bodies: set[bytes] = set()
        self.received = 0
        self.consumer = Consumer(
            topic, "check", self._handle, nsqd_tcp_addresses=address, max_in_flight=2000
        )
        self.consumer.start()

    def _handle(self, message: Any) -> None:
        self.bodies.add(message.body)
        self.received += 1

    def wait_count(
        self,
        count: int,
        timeout: float,
        query: Any = None,
        context: Callable[[], str] | None = None,
    ) -> None:
        """Wait until ``count`` distinct bodies arrived.  With the streaming ``query`` that
        publishes them, fail at once if it ended (with its exception), and say on a timeout
        what it was doing; ``context()`` adds to what a failure says."""

        def arrived() -> bool:
            if len(self.bodies) >= count:
                return True
            if query is not None and not query.isActive:
                raise AssertionError(f"the query ended ({query.exception()}): {state()}")
            return False

        def state() -> str:
            text = f"{len(self.bodies)} of {count} messages arrived"
            if query is not None:
                progress = query.lastProgress or {}
                text += (
                    f"; the query: {query.status}, last batch "
                    f"{progress.get('batchId')} at {progress.get('timestamp')} "
                    f"({progress.get('numInputRows')} rows)"
                )
            return text + (context() if context else "")

        wait_for(arrived, timeout=timeout, interval=0.1, message=state)


def cluster_logs(cluster: Any, lines: int = 15) -> str:
    """The last ``lines`` lines of each log of a :class:`~nsqclient.spark.standalone.
    StandaloneCluster`: the master's, the workers' and every executor's stderr."""
    work = Path(cluster.work_dir)
    paths = sorted(work.glob("logs/*.log")) + sorted(work.glob("work/*/app-*/*/stderr"))
    parts = []
    for path in paths:
        try:
            tail = path.read_text(errors="replace").splitlines()[-lines:]
        except OSError as exc:
            tail = [f"(unreadable: {exc})"]
        parts.append(f"\n--- {path.relative_to(work)}\n" + "\n".join(tail))
    return "".join(parts)


def publish_numbered(address: str, topic: str, count: int, prefix: str = "m") -> set[bytes]:
    """Publish ``prefix0`` ... ``prefix{count-1}`` to ``topic`` in MPUBs of 1000; return them."""
    bodies = [f"{prefix}{i}".encode() for i in range(count)]
    with Producer(address) as producer:
        for i in range(0, count, 1000):
            producer.mpub(topic, bodies[i : i + 1000])
    return set(bodies)


def socket_owners(remote_port: int) -> dict[int, int]:
    """``{local port: pid}`` of the other processes' established TCP connections to
    127.0.0.1:``remote_port`` (Linux /proc)."""
    by_inode: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == remote_port:
                by_inode[inode] = int(local.rsplit(":", 1)[1], 16)
    owners: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{entry}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in by_inode:
                owners[by_inode[target[8:-1]]] = int(entry)
    return owners


def pids_connected_to(port: int) -> set[int]:
    """Other processes with an established TCP connection to 127.0.0.1:``port`` (Linux)."""
    return set(socket_owners(port).values())


def pipeline(
    spark: Any, source_address: str, sink_address: str, checkpoint: str, **options: str
) -> Any:
    """A query reading topic ``a`` (channel ``spark``), upper-casing the bodies and
    publishing them to topic ``b``."""
    reader = (
        spark.readStream.format("nsq")
        .option("topic", "a")
        .option("channel", "spark")
        .option("nsqd_tcp_addresses", source_address)
        .option("numPartitions", "2")
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return (
        reader.load()
        .selectExpr("upper(cast(body as string)) as body")
        .writeStream.format("nsq")
        .option("topic", "b")
        .option("nsqd_tcp_addresses", sink_address)
        .option("checkpointLocation", checkpoint)
    )


def upper(bodies: set[bytes]) -> set[bytes]:
    return {b.upper() for b in bodies}


def committed_batches(checkpoint: str) -> list[int]:
    """Batch ids in the checkpoint's commit log."""
    path = os.path.join(checkpoint, "commits")
    if not os.path.isdir(path):
        return []
    return sorted(int(name) for name in os.listdir(path) if name.isdigit())


def in_flight(node: Any, topic: str = "a", channel: str = "spark") -> int:
    stats = channel_stats(node, topic, channel)
    assert stats is not None, f"no channel {topic}/{channel} on {node}"
    return int(stats["in_flight_count"])
