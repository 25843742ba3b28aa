"""Fixtures for the Spark tests: a local[2] session, a standalone cluster, and NSQ helpers.

Spark starts its Python workers with $PYSPARK_PYTHON (else the first python3 on PATH, which
would not have nsqclient or pyarrow): the session fixtures point it at this interpreter.  One
process has one SparkContext at a time, so each session fixture is module-scoped: a module uses
either the local session or the cluster's.  The standalone cluster itself is shared by the
modules that use it, and stopped after the last of their tests.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from spark_helpers import Collector

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")


def _session(master: str, app: str, **config: str) -> Iterator[Any]:
    """A SparkSession on ``master`` (UI off, 2 shuffle partitions, no adaptive plans, Python
    workers running this interpreter) with the ``nsq`` format; its queries and itself are
    stopped after the yield."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    import nsqclient.spark

    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.adaptive.enabled", "false")
    )
    for key, value in config.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    nsqclient.spark.register(session)
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """A local[2] SparkSession with the ``nsq`` format (see :func:`_session`).

    Module-scoped: every test that needs Spark lives in test_spark_stream.py and shares one
    session (starting one costs ~6 s), and the JVM is gone before the rest of the suite runs
    (a session-scoped fixture outside a package would keep it until the very end)."""
    yield from _session("local[2]", "nsqclient-tests", **{"spark.default.parallelism": "2"})


#: the cluster :func:`standalone_cluster` started (None before it and after its last user)
_cluster: Any = None


@pytest.fixture(scope="session")
def standalone_cluster() -> Iterator[Any]:
    """A Spark standalone master and 2 workers (1 core, 1 GiB each) started from the installed
    pyspark's ``bin/spark-class`` on free ports, executors running this interpreter.

    One for the whole run (starting it costs 40-50 s on a 2-core machine): test_spark_cluster.py
    runs its applications there, and test_spark_docs.py's by-hand worker registers with its
    master.  Stopped (with every executor) right after the last test that uses it
    (:func:`pytest_runtest_teardown`), not at the end of the suite."""
    global _cluster
    from nsqclient.spark.standalone import StandaloneCluster

    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    with StandaloneCluster(workers=2, cores=1, memory="1g", python=sys.executable) as cluster:
        _cluster = cluster
        try:
            yield cluster
        finally:
            _cluster = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Stop the shared :func:`standalone_cluster` once no test left to run uses it (after the
    module-scoped sessions on it are torn down): its three JVMs do not idle through the rest
    of the suite.  The fixture's own teardown, at the end of the session, then finds it
    stopped."""
    result = yield
    if _cluster is not None and "standalone_cluster" in getattr(item, "fixturenames", ()):
        later = item.session.items[item.session.items.index(item) + 1 :]
        if not any("standalone_cluster" in getattr(i, "fixturenames", ()) for i in later):
            _cluster.stop()
    return result


@pytest.fixture(scope="module")
def cluster_spark(standalone_cluster: Any) -> Iterator[Any]:
    """A SparkSession on :func:`standalone_cluster` (client mode: the driver, and so the
    source's reader, run in this process's JVM), one executor of 1 core per worker."""
    yield from _session(
        standalone_cluster.url,
        "nsqclient-cluster-tests",
        **{
            "spark.executor.memory": "512m",
            "spark.executor.cores": "1",
            "spark.cores.max": "2",
        },
    )


@pytest.fixture
def queries() -> Iterator[list[Any]]:
    """Append every streaming query a test starts; those still active are stopped at the end."""
    started: list[Any] = []
    yield started
    for query in started:
        if query.isActive:
            query.stop()


@pytest.fixture
def collect() -> Iterator[Callable[[str, str], Collector]]:
    """``collect(nsqd_tcp_address, topic) -> Collector``; stopped at teardown."""
    made: list[Collector] = []

    def make(address: str, topic: str) -> Collector:
        collector = Collector(address, topic)
        made.append(collector)
        return collector

    yield make
    for collector in made:
        collector.consumer.stop(timeout=5.0)
