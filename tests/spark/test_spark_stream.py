"""The nsq data source in a real local[2] Spark session against the test broker.

The broker runs in this process (or as real nsqd processes with NSQ_BIN_DIR); Spark's Python
workers are other processes that reach it over TCP on 127.0.0.1.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
from spark_helpers import (
    channel_stats,
    pids_connected_to,
    publish_numbered,
)

from nsqclient.testing.waiting import wait_for


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


@pytest.mark.timeout(300)
def test_pipeline_moves_50000_messages_and_a_quiet_stream_leaves_nothing_in_flight(
    spark: Any, nsqd: Any, tmp_path: Any, queries: list[Any], collect: Any
) -> None:
    address = nsqd.nsqd.tcp_address
    sent = publish_numbered(address, "a", 50_000)
    out = collect(address, "b")
    query = pipeline(spark, address, address, str(tmp_path / "ck"), max_in_flight="10000").start()
    queries.append(query)
    out.wait_count(50_000, timeout=240)
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
    out.wait_count(2_000, timeout=120)
    readers = wait_for(lambda: pids_connected_to(source.tcp_port), timeout=10)
    assert len(readers) == 1, readers
    os.kill(readers.pop(), signal.SIGKILL)
    wait_for(lambda: not first.isActive, timeout=60, message="query still runs")
    assert first.exception() is not None
    assert len(out.bodies) < 20_000
    done = committed_batches(checkpoint)
    second = pipeline(spark, source.tcp_address, target.tcp_address, checkpoint, **options).start()
    queries.append(second)
    out.wait_count(20_000, timeout=180)
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
    out.wait_count(2_000, timeout=120)
    first.stop()
    assert len(out.bodies) < 20_000
    second = pipeline(spark, address, address, checkpoint, maxMessagesPerBatch="1000").start()
    queries.append(second)
    # Well within nsqd's msg_timeout of 60 s: the stopped reader requeued what it held.
    out.wait_count(20_000, timeout=50)
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
