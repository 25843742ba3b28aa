"""A Spark Structured Streaming pipeline from one NSQ topic to another.

Reads ``clicks`` (channel ``spark``), keeps the clicks on ``/buy`` pages, upper-cases them and
publishes them to ``purchases``, with a checkpoint so that a restart loses nothing.  Needs the
``spark`` extra and Java 17::

    pip install -e '.[spark]'
    python examples/spark_pipeline.py                    # embedded NSQ, 1,000 sample clicks
    python examples/spark_pipeline.py --nsqd 127.0.0.1:4150 --follow

Without ``--nsqd`` it starts the embedded NSQ.  It creates its channel ``clicks/spark`` first
(nsqd gives a message only to the channels that exist when it is published), publishes sample
clicks, runs the query with ``Trigger.AvailableNow`` (it ends when the topic has been quiet for
a second) and counts what arrived in ``purchases`` on an ephemeral channel of its own.  With
``--follow`` the query runs until Ctrl-C.

Against your nsqd (``--nsqd``) it touches no channel but its own: it publishes the sample
clicks only when neither ``clicks`` nor ``purchases`` has another channel (they would get the
samples too), and otherwise reads what your producers publish.  At the end it removes its
temporary checkpoint and, if it created ``clicks/spark`` for this run, that channel too (with
``--checkpoint DIR`` both stay, so that a restart goes on where the query stopped).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

SOURCE = "clicks"
CHANNEL = "spark"
TARGET = "purchases"
COUNTER = "example-counter#ephemeral"


def build_query(spark: Any, nsqd: str, checkpoint: str, follow: bool) -> Any:
    """clicks -> filter /buy -> upper -> purchases."""
    clicks = (
        spark.readStream.format("nsq")
        .option("topic", SOURCE)
        .option("channel", CHANNEL)
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
def broker(address: str | None, http_address: str | None) -> Iterator[tuple[str, str]]:
    """``(tcp, http)`` of the given nsqd (HTTP: its TCP port + 1 unless given), or of an
    embedded one for the length of the example."""
    if address:
        host, _, port = address.rpartition(":")
        yield address, http_address or f"{host}:{int(port) + 1}"
        return
    from nsqclient.testing import EmbeddedNSQ

    with EmbeddedNSQ(nsqd_count=1, lookupd=False) as cluster:
        yield cluster.nsqd.tcp_address, cluster.nsqd.http_address


def channels(http: Any, topic: str) -> set[str]:
    """The channels ``topic`` has on this nsqd (none when the topic does not exist)."""
    data = http.stats(topic, include_clients=False)
    for entry in data.get("topics") or []:
        if entry.get("topic_name") == topic:
            return {c["channel_name"] for c in entry.get("channels") or []}
    return set()


def sample_clicks(count: int) -> list[bytes]:
    pages = ["/home", "/buy/42", "/search?q=nsq", "/buy/7"]
    return [f"user{i % 17} {pages[i % 4]}".encode() for i in range(count)]


def run(
    spark: Any,
    nsqd: str,
    nsqd_http: str,
    checkpoint: str | None = None,
    clicks: int = 1000,
    follow: bool = False,
    say: Any = print,
) -> dict[str, Any]:
    """Run the pipeline once on ``spark`` (with the ``nsq`` format registered) against
    ``nsqd``; return what happened: ``published``, ``read``, ``arrived``, ``expected``."""
    import nsqclient

    temporary = checkpoint is None
    if checkpoint is None:
        checkpoint = tempfile.mkdtemp(prefix="nsq-pipeline-")
    http = nsqclient.NsqdHTTPClient(nsqd_http)
    created = False
    counter = None
    try:
        theirs = (channels(http, SOURCE) - {CHANNEL}) | (channels(http, TARGET) - {COUNTER})
        if CHANNEL not in channels(http, SOURCE):
            http.create_topic(SOURCE)
            http.create_channel(SOURCE, CHANNEL)  # before any sample: or it would get none
            created = True
        bodies = sample_clicks(clicks)
        if bodies and theirs:
            say(
                f"not publishing sample clicks: {SOURCE}/{TARGET} on {nsqd} have other channels "
                f"({', '.join(sorted(theirs))}) that would get them too; reading what your "
                "producers publish"
            )
            bodies = []
        arrived: list[bytes] = []
        counter = nsqclient.Consumer(
            TARGET, COUNTER, lambda m: arrived.append(m.body), nsqd_tcp_addresses=nsqd
        )
        counter.start()
        # The counter's channel must exist before the first purchase is published.
        deadline = time.monotonic() + 10
        pause = threading.Event()
        while COUNTER not in channels(http, TARGET) and time.monotonic() < deadline:
            pause.wait(0.02)
        if bodies:
            with nsqclient.Producer(nsqd) as producer:
                for i in range(0, len(bodies), 500):
                    producer.mpub(SOURCE, bodies[i : i + 500])
        say(f"published {len(bodies)} clicks to {SOURCE} on {nsqd}; checkpoint {checkpoint}")
        query = build_query(spark, nsqd, checkpoint, follow)
        try:
            query.awaitTermination()
        except KeyboardInterrupt:
            query.stop()
        expected = sum(1 for b in bodies if b"/buy" in b)
        # The last purchases may still be on their way to the counter.
        deadline = time.monotonic() + 10
        while len(arrived) < expected and time.monotonic() < deadline:
            pause.wait(0.05)
        progress = query.recentProgress
        read = sum(p["numInputRows"] for p in progress)
        say(
            f"{read} clicks read in {sum(1 for p in progress if p['numInputRows'])} "
            f"micro-batches; {len(arrived)} purchases arrived in {TARGET} (expected {expected})"
        )
        if arrived:
            say(f"first: {arrived[0].decode()}")
        return {
            "published": len(bodies),
            "read": read,
            "arrived": len(arrived),
            "expected": expected,
        }
    finally:
        if counter is not None:
            counter.stop()  # its channel is ephemeral: nsqd deletes it with its last client
        if temporary:
            shutil.rmtree(checkpoint, ignore_errors=True)
            if created:
                # Created for this run and useless without the checkpoint: leave nothing
                # behind that would pile up every click from now on.
                with contextlib.suppress(nsqclient.NSQError, OSError):
                    http.delete_channel(SOURCE, CHANNEL)
        http.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nsqd", help="nsqd TCP address (default: start the embedded NSQ)")
    parser.add_argument("--nsqd-http", help="its HTTP address (default: TCP port + 1)")
    parser.add_argument(
        "--checkpoint", help="checkpoint directory (default: a temporary one, removed after)"
    )
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
    try:
        nsqclient.spark.register(spark)
        with broker(args.nsqd, args.nsqd_http) as (nsqd, http):
            result = run(spark, nsqd, http, args.checkpoint, args.clicks, args.follow)
    finally:
        spark.stop()
    return 0 if result["arrived"] >= result["expected"] else 1


if __name__ == "__main__":
    sys.exit(main())
