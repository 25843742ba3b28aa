"""The nsq data source on a Spark standalone cluster (a master and 2 workers of 1 core, started
from pyspark's own spark-class by the ``standalone_cluster`` fixture): executors in other
processes (other JVMs, other Python workers) read the rows the driver-side reader cut and
publish them; one test kills a worker, executor and all, mid-run.  The cluster is the one
test_spark_docs.py's by-hand worker joins afterwards (a session-scoped fixture).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
from spark_helpers import (
    channel_stats,
    cluster_logs,
    in_flight,
    pipeline,
    publish_numbered,
    upper,
)

from nsqclient.testing.waiting import wait_for


@pytest.fixture
def start_pipe(
    cluster_spark: Any, nsqd: Any, tmp_path: Any, queries: list[Any], collect: Any
) -> Callable[[int, int], tuple[set[bytes], Any, Any]]:
    """``start_pipe(n, per_batch)``: publish ``n`` numbered messages to ``a`` and start ``a``
    -> upper -> ``b`` on the cluster's session (batches of ``per_batch``); the bodies sent,
    the collector of ``b``, the query."""

    def start(n: int, per_batch: int) -> tuple[set[bytes], Any, Any]:
        address = nsqd.nsqd.tcp_address
        sent = publish_numbered(address, "a", n)
        out = collect(address, "b")
        query = pipeline(
            cluster_spark,
            address,
            address,
            str(tmp_path / "ck"),
            maxMessagesPerBatch=str(per_batch),
        ).start()
        queries.append(query)
        return sent, out, query

    return start


# The cluster's start (the session fixture: 3 JVMs, 45 s beside make test's other passes) does
# not count against the test's own time.
@pytest.mark.timeout(240, func_only=True)
def test_a_pipeline_on_a_standalone_cluster_moves_every_message(
    standalone_cluster: Any, nsqd: Any, start_pipe: Any
) -> None:
    assert standalone_cluster.alive_workers(standalone_cluster.state()) == 2
    sent, out, query = start_pipe(10_000, 2_500)
    logs = functools.partial(cluster_logs, standalone_cluster)
    out.wait_count(10_000, 180, query, logs)
    assert out.bodies == upper(sent)
    wait_for(lambda: in_flight(nsqd.nsqd) == 0, timeout=15, message="messages left in flight")
    assert query.isActive
    # The rows were published by executors on both workers (the source cut 2 partitions).
    apps = standalone_cluster.state().get("activeapps") or []
    assert apps and apps[0]["cores"] == 2


@pytest.mark.timeout(300, func_only=True)
def test_a_worker_killed_mid_run_loses_nothing(
    standalone_cluster: Any, nsqd: Any, start_pipe: Any
) -> None:
    sent, out, query = start_pipe(20_000, 1_000)
    logs = functools.partial(cluster_logs, standalone_cluster)
    out.wait_count(2_000, 120, query, logs)
    executors = standalone_cluster.executor_pids(0)
    assert executors, "worker 0 runs no executor"
    standalone_cluster.kill_worker(0)  # SIGKILL to the worker and its executor: a machine gone
    try:
        wait_for(
            lambda: standalone_cluster.alive_workers(standalone_cluster.state()) == 1,
            timeout=90,
            message="the master still lists the killed worker as alive",
        )
        # The tasks it ran are run again on the other worker; the query goes on.
        out.wait_count(20_000, 200, query, logs)
        assert out.bodies == upper(sent)
        assert query.isActive and query.exception() is None
        wait_for(lambda: in_flight(nsqd.nsqd) == 0, timeout=15, message="messages left in flight")
        stats = channel_stats(nsqd.nsqd, "a", "spark")
        assert stats is not None and stats["depth"] == 0
    finally:
        query.stop()
        standalone_cluster.start_worker(0)
