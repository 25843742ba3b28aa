"""The source's Consumers (nsqclient.spark.fleet) against the test broker, without Spark:
max_in_flight held whatever nsqd's --max-rdy-count, taken and FINished in bulk, max_tries on the
bulk path, requeue on stop."""

from __future__ import annotations

from typing import Any

import pytest
from spark_helpers import channel_stats, publish_numbered

from nsqclient.spark.fleet import Fleet, split
from nsqclient.spark.ledger import Ledger
from nsqclient.testing.waiting import wait_for


def test_split() -> None:
    assert split(10, 3) == [4, 3, 3]
    assert split(2500, 1) == [2500]
    assert sum(split(50_000, 20)) == 50_000


def in_flight(node: Any, topic: str, channel: str) -> int:
    stats = channel_stats(node, topic, channel)
    return 0 if stats is None else int(stats["in_flight_count"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("max_rdy_count", [2500, 1000])
def test_the_fleet_holds_max_in_flight_whatever_nsqds_max_rdy_count(
    nsq_cluster_factory: Any, max_rdy_count: int
) -> None:
    cluster = nsq_cluster_factory(nsqd_count=1, lookupd=False, max_rdy_count=max_rdy_count)
    node = cluster.nsqd
    publish_numbered(node.tcp_address, "f", 7_000)
    ledger = Ledger("s")
    fleet = Fleet("f", "spark", 6_000, nsqd_tcp_addresses=[node.tcp_address])
    fleet.start()
    try:
        # 2500 assumed at first: three Consumers; an nsqd capping RDY at 1000 makes it six.
        wait_for(lambda: fleet.connection_counts(), timeout=10)
        wait_for(
            lambda: fleet.adjust() or len(fleet.consumers) == -(-6_000 // max_rdy_count),
            timeout=10,
            message=lambda: f"{len(fleet.consumers)} consumers",
        )
        assert sum(c.max_in_flight for c in fleet.consumers) == 6_000
        # One connection could hold at most max_rdy_count messages; the fleet holds 6000.
        # They wait in the Consumers until taken (pull mode: no worker thread handles them).
        wait_for(
            lambda: ledger.add_many(fleet.take()) == 6_000,
            timeout=30,
            message=lambda: f"{len(ledger)} held",
        )
        held = ledger.slice({"session": "s", "seq": 0}, {"session": "s", "seq": 6_000})
        assert sum(map(len, held)) == 6_000 and not any(b.has_responded() for b in held)
        wait_for(fleet.saturated, timeout=10)
        assert in_flight(node, "f", "spark") == 6_000
        assert fleet.stats()["received"] == 6_000
        # FIN the first 4000 in one write per connection: nsqd sends the last 1000.
        assert fleet.finish(ledger.release_through(4_000)) == 4_000
        wait_for(
            lambda: ledger.add_many(fleet.take()) == 7_000,
            timeout=30,
            message=lambda: f"{len(ledger)} held",
        )
        assert len(ledger) == 3_000
        assert fleet.stats()["finished"] == 4_000
        wait_for(lambda: in_flight(node, "f", "spark") == 3_000, timeout=10)
        # Paused (RDY 0 everywhere), a requeued message is not sent straight back.
        assert fleet.pause()
        assert fleet.finish(ledger.release_through(5_000)) == 1_000  # splits a batch at 5000
        held = ledger.release_all()
        assert fleet.requeue(held) == 2_000
    finally:
        fleet.stop(timeout=10)
    stats = channel_stats(node, "f", "spark")
    assert stats is not None
    assert stats["in_flight_count"] == 0
    assert stats["depth"] == 2_000  # the requeued ones wait for the next reader
    assert stats["timeout_count"] == 0


def queued(fleet: Fleet) -> int:
    return sum(counts.queued for counts in fleet.connection_counts())


@pytest.mark.timeout(60)
def test_with_max_tries_messages_are_taken_in_bulk_and_given_up_on_there(nsqd: Any) -> None:
    # max_tries (5 by default) used to send every message through a handler, one at a time:
    # the pull API gives up on a message past max_tries on the bulk path itself.
    node = nsqd.nsqd
    publish_numbered(node.tcp_address, "g", 50)
    fleet = Fleet("g", "spark", 100, nsqd_tcp_addresses=[node.tcp_address], max_tries=3)
    fleet.start()
    try:
        for attempt in (1, 2, 3):
            wait_for(lambda: queued(fleet) == 50, timeout=20, message=lambda: f"{queued(fleet)}")
            taken = fleet.take()  # all 50 at once
            assert sum(map(len, taken)) == 50
            assert {a for batch in taken for a in batch.attempts()} == {attempt}
            assert not any(batch.has_responded() for batch in taken)
            assert queued(fleet) == 0
            assert fleet.requeue(taken) == 50
        # The fourth delivery is past max_tries: given up on (FINished) by take(), not taken.
        wait_for(lambda: queued(fleet) == 50, timeout=20, message=lambda: f"{queued(fleet)}")
        assert fleet.take() == []
        stats = fleet.stats()
        assert (stats["received"], stats["requeued"]) == (200, 150)
        assert (stats["given_up"], stats["finished"]) == (50, 50)
    finally:
        fleet.stop(timeout=10)
    wait_for(lambda: in_flight(node, "g", "spark") == 0, timeout=10)
    stats = channel_stats(node, "g", "spark")
    assert stats is not None
    assert stats["depth"] == 0
