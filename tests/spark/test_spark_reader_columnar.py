"""The source's reader driven as Spark drives it (latestOffset, partitions, pickling to the
executors, read there, commit), without a Spark session: the columnar path from nsqd's frames
to Arrow rows, on classic and youzan nsqd, with the largest bodies nsqd takes and a connection
lost while its messages are held."""

from __future__ import annotations

import pickle
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from nsqclient import Producer
from nsqclient.testing import EmbeddedNSQ
from nsqclient.testing.helpers import channel_stats
from nsqclient.testing.waiting import wait_for

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from pyspark.sql.datasource import ReadAllAvailable  # noqa: E402

from nsqclient.spark.options import SourceOptions  # noqa: E402
from nsqclient.spark.source import NSQStreamReader  # noqa: E402

TIMEOUT = 30.0


@pytest.fixture
def readers() -> Iterator[Any]:
    made: list[NSQStreamReader] = []

    def make(**options: str) -> NSQStreamReader:
        reader = NSQStreamReader(SourceOptions.parse({"channel": "spark", **options}))
        made.append(reader)
        return reader

    yield make
    for reader in made:
        reader.stop()


class Driver:
    """Spark's calls on one reader; ``rows`` is every row the executors' ``read`` made."""

    def __init__(self, reader: NSQStreamReader):
        self.reader = reader
        self.offset = reader.initialOffset()
        self.rows: list[dict[str, Any]] = []

    def batch(self) -> int:
        """Plan, ship and read one micro-batch; how many rows it had."""
        end = self.reader.latestOffset(self.offset, ReadAllAvailable())
        parts = self.reader.partitions(self.offset, end)
        shipped = [pickle.dumps(p) for p in parts]  # what Spark sends to the executors
        count = 0
        for data in shipped:
            for table in self.reader.read(pickle.loads(data)):
                self.rows += table.to_pylist()
                count += table.num_rows
        self.offset = end
        return count

    def until(self, n: int) -> None:
        wait_for(lambda: self.batch() >= 0 and len(self.rows) >= n, TIMEOUT, 0.0,
                 lambda: f"{len(self.rows)} of {n} rows")  # fmt: skip


def test_every_body_size_through_the_columnar_path(nsqd, readers):
    node = nsqd.nsqd
    big = bytes(range(256)) * (1024 * 1024 // 256)  # nsqd's default --max-msg-size exactly
    bodies = [big, b"x", b"m" * 200, big[:-7], b"y"] + [b"n%d" % i for i in range(3000)]
    with Producer(node.tcp_address) as producer:
        for body in bodies[:5]:
            producer.pub("cols", body)
        producer.mpub("cols", bodies[5:])
    reader = readers(
        topic="cols", nsqd_tcp_addresses=node.tcp_address, max_in_flight="500", numPartitions="3"
    )
    driver = Driver(reader)
    driver.until(len(bodies))
    reader.commit(driver.offset)
    assert sorted(r["body"] for r in driver.rows) == sorted(bodies)
    assert all(r["topic"] == "cols" and r["attempts"] == 1 for r in driver.rows)
    assert all(r["nsqd_address"] == node.tcp_address for r in driver.rows)
    assert len({r["message_id"] for r in driver.rows}) == len(bodies)
    assert all(len(r["message_id"]) == 16 and r["partition"] is None for r in driver.rows)
    wait_for(lambda: _drained(node, "cols"), TIMEOUT, message="the channel drains")


@pytest.mark.parametrize("ext", [False, True], ids=["plain", "ext-headers"])
def test_youzan_fields_through_the_columnar_path(readers, ext):
    topic = "yz_cols"
    with EmbeddedNSQ(youzan=True, nsqd_count=2, lookupd_count=1) as cluster:
        cluster.create_topic(topic, partitions=2, replica=1, ext=ext)
        cluster.create_channel(topic, "spark")
        published = {}
        with Producer(lookupd_http_addresses=[cluster.lookupd.http_address]) as producer:
            for i in range(40):
                body = b"p%d-%d" % (i % 2, i)
                trace_id = (1 << 63) + i
                if ext:  # the trace id rides in the JSON header
                    header = {"k": "v" * i, "##trace_id": str(trace_id)}
                    result = producer.pub(topic, body, partition=i % 2, ext=header)
                else:
                    result = producer.pub(topic, body, partition=i % 2, trace_id=trace_id)
                published[body] = (result, trace_id)
        options = {"extend_support": "true"} if ext else {}
        reader = readers(
            topic=topic,
            lookupd_http_addresses=cluster.lookupd.http_address,
            youzan="true",
            max_in_flight="100",
            numPartitions="2",
            **options,
        )
        driver = Driver(reader)
        driver.until(40)
        reader.stop()
    rows = {r["body"]: r for r in driver.rows}
    assert set(rows) == set(published)
    for body, (result, trace_id) in published.items():
        row = rows[body]
        assert row["partition"] == int(body[1:2])
        assert row["trace_id"] == trace_id - (1 << 64)  # a long with the same bits
        assert len(row["message_id"]) == 32  # youzan's raw 16-byte id in hex
        if result is not None:  # a traced PUB says where it went
            assert result.partition == row["partition"]
            assert int(row["message_id"], 16) >> 64 == result.message_id
        assert row["offset"] is None  # offsets come with ordered consumption only


def test_a_connection_lost_while_its_messages_are_held_loses_nothing(nsq_cluster_factory, readers):
    cluster = nsq_cluster_factory(nsqd_count=1, lookupd=False)
    node = cluster.nsqd
    bodies = {b"c%d" % i for i in range(2000)}
    with Producer(node.tcp_address) as producer:
        producer.mpub("lost", sorted(bodies))
    reader = readers(
        topic="lost", nsqd_tcp_addresses=node.tcp_address, max_in_flight="2000", msg_timeout="2"
    )
    driver = Driver(reader)
    driver.until(1)  # a batch planned and read: its messages are held, not yet committed
    # The connections go (closed under the reader, as a network fault would); nsqd sends what
    # they held again after its msg_timeout (2 s here), on the connections made anew.
    fleet = reader._fleet
    assert fleet is not None
    lost = [conn for consumer in fleet.consumers for conn in consumer.connections()]
    for conn in lost:
        conn.close(1.0)
    driver.until(len(bodies))
    wait_for(lambda: driver.batch() >= 0 and _drained(node, "lost"), TIMEOUT,
             message="every message finished")  # fmt: skip
    seen = Counter(r["body"] for r in driver.rows)
    assert set(seen) == bodies  # nothing lost; what was lost with the connection came again
    stats = fleet.stats()
    assert stats["finish_failed"] == 0  # nothing answered twice


def _drained(node: Any, topic: str) -> bool:
    stats = channel_stats(node, topic, "spark")
    return stats is not None and stats["depth"] == 0 and stats["in_flight_count"] == 0
