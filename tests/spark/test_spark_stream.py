"""The nsq data source in a real local[2] Spark session against the test broker.

The broker runs in this process (or as real nsqd processes with NSQ_BIN_DIR); Spark's Python
workers are other processes that reach it over TCP on 127.0.0.1.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import tempfile
import threading
from typing import Any

import pytest
from spark_helpers import (
    channel_stats,
    committed_batches,
    in_flight,
    pids_connected_to,
    pipeline,
    publish_numbered,
    upper,
)

from nsqclient.testing.waiting import wait_for


@pytest.mark.timeout(300)
def test_pipeline_moves_50000_messages_and_a_quiet_stream_leaves_nothing_in_flight(
    spark: Any, nsqd: Any, tmp_path: Any, queries: list[Any], collect: Any
) -> None:
    address = nsqd.nsqd.tcp_address
    sent = publish_numbered(address, "a", 50_000)
    out = collect(address, "b")
    query = pipeline(spark, address, address, str(tmp_path / "ck"), max_in_flight="10000").start()
    queries.append(query)
    out.wait_count(50_000, timeout=240, query=query)
    assert out.bodies == upper(sent)
    # The stream is quiet now and the query still runs: the last batch must not wait in flight
    # for nsqd's msg_timeout (60 s) or for a next batch that never comes.
    wait_for(lambda: in_flight(nsqd.nsqd) == 0, timeout=15, message="messages left in flight")
    assert query.isActive
    stats = channel_stats(nsqd.nsqd, "a", "spark")
    assert stats is not None
    assert (stats["timeout_count"], stats["requeue_count"]) == (0, 0)


@pytest.mark.timeout(180)
def test_messages_stay_in_flight_until_spark_committed_their_batch(
    spark: Any, nsqd: Any, tmp_path: Any, queries: list[Any]
) -> None:
    address = nsqd.nsqd.tcp_address
    sent = publish_numbered(address, "a", 300)
    checkpoint = str(tmp_path / "ck")
    seen: list[dict[str, Any]] = []

    def sink(frame: Any, batch_id: int) -> None:
        rows = frame.collect()
        seen.append(
            {
                "batch": batch_id,
                "rows": rows,
                "in_flight": in_flight(nsqd.nsqd),
                "committed": committed_batches(checkpoint),
            }
        )

    query = (
        spark.readStream.format("nsq")
        .option("topic", "a")
        .option("channel", "spark")
        .option("nsqd_tcp_addresses", address)
        .option("maxMessagesPerBatch", "100")
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .start()
    )
    queries.append(query)
    wait_for(lambda: sum(len(s["rows"]) for s in seen) >= 300, timeout=120, interval=0.1)
    batches = [s for s in seen if s["rows"]]
    assert len(batches) >= 3
    for s in batches:
        assert len(s["rows"]) <= 100
        # While the sink runs, the batch's messages are still in flight on nsqd, and the batch
        # is not in the commit log yet.
        assert s["in_flight"] >= len(s["rows"]), s["batch"]
        assert s["batch"] not in s["committed"]
    rows = [r for s in batches for r in s["rows"]]
    assert {r["body"] for r in rows} == sent
    first = rows[0]
    assert first["topic"] == "a"
    assert len(first["message_id"]) == 16
    assert first["attempts"] == 1
    assert first["nsqd_address"] == address
    assert (first["partition"], first["offset"], first["trace_id"]) == (None, None, None)
    assert first["timestamp"] is not None
    # A quiet stream: everything is finished soon after the last batch was committed.
    wait_for(lambda: in_flight(nsqd.nsqd) == 0, timeout=15, message="messages left in flight")
    assert batches[-1]["batch"] in committed_batches(checkpoint)
    assert query.isActive


@pytest.mark.timeout(240)
def test_restart_after_the_driver_side_reader_was_killed_loses_nothing(
    spark: Any, nsq_cluster_factory: Any, tmp_path: Any, queries: list[Any], collect: Any
) -> None:
    # The source reads from nsqd 0 and the sink writes to nsqd 1, so that the only other
    # process connected to nsqd 0 is the driver-side reader of the query.
    cluster = nsq_cluster_factory(nsqd_count=2)
    source, target = cluster.nsqds[0], cluster.nsqds[1]
    sent = publish_numbered(source.tcp_address, "a", 20_000)
    out = collect(target.tcp_address, "b")
    checkpoint = str(tmp_path / "ck")
    options = {"maxMessagesPerBatch": "1000", "msg_timeout": "2"}
    first = pipeline(spark, source.tcp_address, target.tcp_address, checkpoint, **options).start()
    queries.append(first)
    out.wait_count(2_000, timeout=120, query=first)
    readers = wait_for(lambda: pids_connected_to(source.tcp_port), timeout=10)
    assert len(readers) == 1, readers
    os.kill(readers.pop(), signal.SIGKILL)
    wait_for(lambda: not first.isActive, timeout=60, message="query still runs")
    assert first.exception() is not None
    assert len(out.bodies) < 20_000
    done = committed_batches(checkpoint)
    second = pipeline(spark, source.tcp_address, target.tcp_address, checkpoint, **options).start()
    queries.append(second)
    out.wait_count(20_000, timeout=180, query=second)
    assert out.bodies == upper(sent)
    # The second run went on from the checkpoint rather than starting over.
    assert min(set(committed_batches(checkpoint)) - set(done)) > max(done)
    wait_for(lambda: in_flight(source) == 0, timeout=15, message="messages left in flight")


@pytest.mark.timeout(240)
def test_restart_after_the_query_was_stopped_mid_run_loses_nothing(
    spark: Any, nsqd: Any, tmp_path: Any, queries: list[Any], collect: Any
) -> None:
    address = nsqd.nsqd.tcp_address
    sent = publish_numbered(address, "a", 20_000)
    out = collect(address, "b")
    checkpoint = str(tmp_path / "ck")
    first = pipeline(spark, address, address, checkpoint, maxMessagesPerBatch="1000").start()
    queries.append(first)
    out.wait_count(2_000, timeout=120, query=first)
    first.stop()
    assert len(out.bodies) < 20_000
    second = pipeline(spark, address, address, checkpoint, maxMessagesPerBatch="1000").start()
    queries.append(second)
    # Well within nsqd's msg_timeout of 60 s: the stopped reader requeued what it held.
    out.wait_count(20_000, timeout=50, query=second)
    assert out.bodies == upper(sent)
    wait_for(lambda: in_flight(nsqd.nsqd) == 0, timeout=15, message="messages left in flight")
    stats = channel_stats(nsqd.nsqd, "a", "spark")
    assert stats is not None and stats["timeout_count"] == 0


@pytest.mark.timeout(180)
def test_trigger_available_now_drains_the_channel_and_ends(
    spark: Any, nsqd: Any, tmp_path: Any, queries: list[Any], collect: Any
) -> None:
    address = nsqd.nsqd.tcp_address
    sent = publish_numbered(address, "a", 2_500)
    out = collect(address, "b")
    checkpoint = str(tmp_path / "ck")
    query = (
        pipeline(
            spark,
            address,
            address,
            checkpoint,
            maxMessagesPerBatch="1000",
            availableNowIdleTimeout="0.5",
        )
        .trigger(availableNow=True)
        .start()
    )
    queries.append(query)
    assert query.awaitTermination(120)
    assert query.exception() is None
    assert len(committed_batches(checkpoint)) >= 3
    out.wait_count(2_500, timeout=30)
    assert out.bodies == upper(sent)
    # The query has ended and nothing stays in flight: the last batch was finished.
    assert in_flight(nsqd.nsqd) == 0


@pytest.mark.timeout(120)
def test_batch_write_publishes_every_row(spark: Any, nsqd: Any, collect: Any) -> None:
    address = nsqd.nsqd.tcp_address
    out = collect(address, "b")
    frame = spark.range(10_000, numPartitions=2).selectExpr("concat('row', id) as value")
    (
        frame.write.format("nsq")
        .option("topic", "b")
        .option("nsqd_tcp_addresses", address)
        .option("maxMessagesPerMpub", "300")
        .mode("append")
        .save()
    )
    out.wait_count(10_000, timeout=30)
    assert out.bodies == {f"row{i}".encode() for i in range(10_000)}
    # A binary body column, found through nsqlookupd (topic b exists now).
    binary = spark.createDataFrame([(bytes([i, 0, 255]),) for i in range(1, 51)], "body binary")
    (
        binary.write.format("nsq")
        .option("topic", "b")
        .option("lookupd_http_addresses", cluster_lookupd(nsqd))
        .mode("append")
        .save()
    )
    out.wait_count(10_050, timeout=30)
    assert {bytes([i, 0, 255]) for i in range(1, 51)} <= out.bodies


def cluster_lookupd(cluster: Any) -> str:
    return str(cluster.lookupd.http_address)


@pytest.mark.timeout(120)
def test_a_failed_publish_fails_the_write(spark: Any, nsqd: Any) -> None:
    frame = spark.range(10).selectExpr("cast(id as string) as body")
    dead = "127.0.0.1:1"  # nothing listens on port 1
    with pytest.raises(Exception, match="ConnectionClosedError|Connection refused"):
        (
            frame.write.format("nsq")
            .option("topic", "b")
            .option("nsqd_tcp_addresses", dead)
            .option("dial_timeout", "0.5")
            .mode("append")
            .save()
        )


def test_a_frame_without_a_body_column_is_refused_before_any_task(spark: Any, nsqd: Any) -> None:
    frame = spark.range(3).selectExpr("id as payload")
    with pytest.raises(Exception, match="'body' or 'value'"):
        (
            frame.write.format("nsq")
            .option("topic", "b")
            .option("nsqd_tcp_addresses", nsqd.nsqd.tcp_address)
            .mode("append")
            .save()
        )


@pytest.mark.timeout(120)
def test_the_sink_publishes_keyed_rows_to_the_keys_partition_and_honours_partition(
    spark: Any,
) -> None:
    from nsqclient import Consumer
    from nsqclient.lookupd._partitions import key_partition
    from nsqclient.testing import EmbeddedNSQ

    with EmbeddedNSQ(youzan=True, nsqd_count=2) as cluster:
        cluster.create_topic("yz_sink", partitions=4, replica=1, multi_part=True)
        cluster.create_channel("yz_sink", "check")
        rows = [(f"k{i}".encode(), f"user{i % 9}", None) for i in range(120)]
        rows += [(f"p{i}".encode(), f"user{i % 9}", 2) for i in range(30)]  # partition wins
        rows += [(f"n{i}".encode(), None, None) for i in range(40)]  # round-robin
        frame = spark.createDataFrame(rows, "body binary, key string, partition int")
        (
            frame.repartition(2)
            .write.format("nsq")
            .option("topic", "yz_sink")
            .option("lookupd_http_addresses", cluster.lookupd.http_address)
            .option("maxMessagesPerMpub", "16")
            .mode("append")
            .save()
        )
        landed: dict[bytes, int] = {}
        lock = threading.Lock()

        def handle(message: Any) -> None:
            with lock:
                landed[message.body] = message.partition

        consumer = Consumer(
            "yz_sink",
            "check",
            handle,
            lookupd_http_addresses=[cluster.lookupd.http_address],
            max_in_flight=200,
        )
        consumer.start()
        try:
            wait_for(lambda: len(landed) >= len(rows), timeout=30, message=lambda: str(len(landed)))
        finally:
            consumer.stop(timeout=5)
    for body, key, partition in rows:
        if partition is not None:
            assert landed[body] == partition, body
        elif key is not None:
            # the partition Producer.pub(key=) picks for this key
            assert landed[body] == key_partition(key, 4), body
    # Rows with neither go round-robin: one partition per MPUB (16 rows), then the next.
    assert len({landed[body] for body, key, _ in rows if key is None}) >= 2


def load_example() -> Any:
    path = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "examples")
    spec = importlib.util.spec_from_file_location(
        "spark_pipeline_example", os.path.join(path, "spark_pipeline.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(180)
def test_the_example_uses_its_own_channel_and_leaves_nothing_behind(
    spark: Any, nsqd: Any, tmp_path: Any, monkeypatch: Any
) -> None:
    from nsqclient import NsqdHTTPClient, Producer

    example = load_example()
    node = nsqd.nsqd
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mkdtemp makes the checkpoint
    # A fresh nsqd: its channel exists before the samples, which all come through.
    said: list[str] = []
    first = example.run(spark, node.tcp_address, node.http_address, clicks=100, say=said.append)
    assert first == {"published": 100, "read": 100, "arrived": 50, "expected": 50}
    checkpoint = said[0].rpartition("checkpoint ")[2]
    assert checkpoint.startswith(str(tmp_path))
    assert not os.path.exists(checkpoint)  # the temporary checkpoint is gone
    # The clicks/spark channel was made for that run only; the counter's was ephemeral.
    assert channel_stats(node, "clicks", "spark") is None
    wait_for(lambda: channel_stats(node, "purchases", example.COUNTER) is None, timeout=10)
    # A topic with a channel of the user's: no sample lands there, nothing of it is touched.
    with NsqdHTTPClient(node.http_address) as http:
        http.create_channel("clicks", "billing")
    with Producer(node.tcp_address) as producer:
        producer.mpub("clicks", [b"user1 /buy/1", b"user2 /home"])
    said.clear()
    second = example.run(spark, node.tcp_address, node.http_address, clicks=100, say=said.append)
    assert second == {"published": 0, "read": 0, "arrived": 0, "expected": 0}
    assert any("not publishing sample clicks" in line and "billing" in line for line in said)
    billing = channel_stats(node, "clicks", "billing")
    assert billing is not None and billing["depth"] == 2
    assert channel_stats(node, "clicks", "spark") is None
    assert not [name for name in os.listdir(tmp_path) if name.startswith("nsq-pipeline-")]
