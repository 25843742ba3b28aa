"""A Spark Structured Streaming pipeline from one NSQ topic to another.

Reads ``clicks`` (channel ``spark``), keeps the clicks on ``/buy`` pages, upper-cases them and
publishes them to ``purchases``, with a checkpoint so that a restart loses nothing.  Needs the
``spark`` extra and Java 17::

    pip install -e '.[spark]'
    python examples/spark_pipeline.py                    # embedded NSQ, 1,000 sample clicks
    python examples/spark_pipeline.py --nsqd 127.0.0.1:4150 --follow

Without ``--nsqd`` it starts the embedded NSQ, publishes sample clicks, runs the query with
``Trigger.AvailableNow`` (it ends when the topic has been quiet for a second) and counts what
arrived in ``purchases``.  With ``--follow`` the query runs until Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

SOURCE = "clicks"
TARGET = "purchases"


def build_query(spark: Any, nsqd: str, checkpoint: str, follow: bool) -> Any:
    """clicks -> filter /buy -> upper -> purchases."""
    clicks = (
        spark.readStream.format("nsq")
        .option("topic", SOURCE)
        .option("channel", "spark")
        .option("nsqd_tcp_addresses", nsqd)
        .option("max_in_flight", "5000")
        .option("maxMessagesPerBatch", "2000")
        .option("availableNowIdleTimeout", "1.0")
        .load()
    )
    purchases = clicks.selectExpr("cast(body as string) as line", "attempts").where(
        "line like '%/buy%'"
    )
    writer = (
        purchases.selectExpr("upper(line) as body")
        .writeStream.format("nsq")
        .option("topic", TARGET)
        .option("nsqd_tcp_addresses", nsqd)
        .option("checkpointLocation", checkpoint)
    )
    if not follow:
        writer = writer.trigger(availableNow=True)
    return writer.start()


@contextlib.contextmanager
def broker(address: str | None) -> Iterator[str]:
    """The given nsqd, or an embedded one for the length of the example."""
    if address:
        yield address
        return
    from nsqclient.testing import EmbeddedNSQ

    with EmbeddedNSQ(nsqd_count=1, lookupd=False) as cluster:
        yield cluster.nsqd.tcp_address


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nsqd", help="nsqd TCP address (default: start the embedded NSQ)")
    parser.add_argument("--checkpoint", help="checkpoint directory (default: a temporary one)")
    parser.add_argument("--clicks", type=int, default=1000, help="sample clicks to publish")
    parser.add_argument("--follow", action="store_true", help="run until Ctrl-C")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    # Spark's Python workers must run this interpreter (it has nsqclient and pyarrow).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import nsqclient.spark

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("nsq-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    nsqclient.spark.register(spark)
    checkpoint = args.checkpoint or tempfile.mkdtemp(prefix="nsq-pipeline-")
    with broker(args.nsqd) as nsqd:
        pages = ["/home", "/buy/42", "/search?q=nsq", "/buy/7"]
        bodies = [f"user{i % 17} {pages[i % 4]}".encode() for i in range(args.clicks)]
        arrived: list[bytes] = []
        counter = nsqclient.Consumer(
            TARGET, "counter", lambda m: arrived.append(m.body), nsqd_tcp_addresses=nsqd
        )
        counter.start()
        if bodies:
            with nsqclient.Producer(nsqd) as producer:
                for i in range(0, len(bodies), 500):
                    producer.mpub(SOURCE, bodies[i : i + 500])
        print(f"published {len(bodies)} clicks to {SOURCE} on {nsqd}; checkpoint {checkpoint}")
        query = build_query(spark, nsqd, checkpoint, args.follow)
        try:
            query.awaitTermination()
        except KeyboardInterrupt:
            query.stop()
        expected = sum(1 for b in bodies if b"/buy" in b)
        # The last purchases may still be on their way to the counter consumer.
        pause = threading.Event()
        deadline = time.monotonic() + 10
        while len(arrived) < expected and time.monotonic() < deadline:
            pause.wait(0.05)
        counter.stop()
        progress = query.recentProgress
        print(
            f"{sum(p['numInputRows'] for p in progress)} clicks read in "
            f"{sum(1 for p in progress if p['numInputRows'])} micro-batches; "
            f"{len(arrived)} purchases arrived in {TARGET} (expected {expected})"
        )
        if arrived:
            print(f"first: {arrived[0].decode()}")
    spark.stop()
    return 0 if len(arrived) >= expected else 1


if __name__ == "__main__":
    sys.exit(main())
