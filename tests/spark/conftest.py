"""Fixtures for the Spark tests: a local[2] session, a standalone cluster, and NSQ helpers.

Spark starts its Python workers with $PYSPARK_PYTHON (else the first python3 on PATH, which
would not have nsqclient or pyarrow): the session fixtures point it at this interpreter.  One
process has one SparkContext at a time, so each session fixture is module-scoped: a module uses
either the local session or the cluster's.
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


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """A local[2] SparkSession (UI off, 2 shuffle partitions) with the ``nsq`` format.

    Module-scoped: every test that needs Spark lives in test_spark_stream.py and shares one
    session (starting one costs ~6 s), and the JVM is gone before the rest of the suite runs
    (a session-scoped fixture outside a package would keep it until the very end)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    import nsqclient.spark

    session = (
        SparkSession.builder.master("local[2]")
        .appName("nsqclient-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.adaptive.enabled", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    nsqclient.spark.register(session)
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()


@pytest.fixture(scope="module")
def standalone_cluster() -> Iterator[Any]:
    """A Spark standalone master and 2 workers (1 core, 1 GiB each) started from the installed
    pyspark's ``bin/spark-class`` on free ports, executors running this interpreter; stopped
    (with every executor) after the module."""
    from nsqclient.spark.standalone import StandaloneCluster

    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    with StandaloneCluster(workers=2, cores=1, memory="1g", python=sys.executable) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def cluster_spark(standalone_cluster: Any) -> Iterator[Any]:
    """A SparkSession on :func:`standalone_cluster` (client mode: the driver, and so the
    source's reader, run in this process's JVM), one executor of 1 core per worker."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import nsqclient.spark

    session = (
        SparkSession.builder.master(standalone_cluster.url)
        .appName("nsqclient-cluster-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", "2")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.adaptive.enabled", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    nsqclient.spark.register(session)
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()


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
