"""PUBs of one topic that queue up on a connection go out as one MPUB (``join_publishes``):
nsqd stores each once, in the order of the calls, and every publish gets the one answer.  The
publishes are queued while the test holds the connection's send lock, so that the writer finds
them all at once (a pipelined ``pub_async`` from a busy thread makes the same queue)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from nsqclient import Producer
from nsqclient.conn import Connection
from nsqclient.errors import ConnectionClosedError
from nsqclient.testing.helpers import consume, message_count
from nsqclient.testing.waiting import wait_for

#: Seconds: the bound of every wait; reached only when something is broken.
TIMEOUT = 10.0


def connection_of(producer: Producer) -> Connection:
    """The Producer's connection to its one nsqd (made by a first publish)."""
    conn = producer._slots[0].conn
    assert conn is not None and conn.is_connected
    return conn


def bodies_of(count: int, prefix: bytes = b"") -> list[bytes]:
    return [prefix + b"%05d" % i + b"x" * 195 for i in range(count)]


def test_pub_async_queued_together_is_stored_once_each_in_call_order(nsqd, producers):
    node = nsqd.nsqd
    p = producers(node.tcp_address, pub_timeout=TIMEOUT)
    p.pub("joined", b"first")
    conn = connection_of(p)
    bodies = bodies_of(300)  # 61,200 bytes as MPUB messages: four MPUBs of at most 16 KiB
    with conn._send_lock:
        futures = [p.pub_async("joined", body) for body in bodies]
    assert [f.result(TIMEOUT) for f in futures] == [b"OK"] * 300
    assert p.stats()["nsqd"][0]["pubs_joined"] == 300
    assert message_count(node, "joined") == 301
    assert consume(node, "joined", 301) == [b"first", *bodies]


def test_blocking_pubs_from_many_threads_share_the_joined_answers(nsqd, producers):
    node = nsqd.nsqd
    p = producers(node.tcp_address, pub_timeout=TIMEOUT)
    p.pub("joined_threads", b"first")
    conn = connection_of(p)
    results: list[Any] = []

    def publish(i: int) -> None:
        results.append(p.pub("joined_threads", b"%d" % i))

    threads = [threading.Thread(target=publish, args=(i,)) for i in range(8)]
    with conn._send_lock:
        for t in threads:
            t.start()
        wait_for(lambda: conn.pending_count() == 8, TIMEOUT)  # each waits for its answer
    for t in threads:
        t.join(TIMEOUT)
    assert results == [None] * 8
    assert p.stats()["nsqd"][0]["pubs_joined"] == 8
    assert sorted(consume(node, "joined_threads", 9)) == sorted(
        [b"first", *(b"%d" % i for i in range(8))]
    )


def test_with_join_publishes_off_each_pub_goes_on_its_own(nsqd, producers):
    node = nsqd.nsqd
    p = producers(node.tcp_address, pub_timeout=TIMEOUT, join_publishes=False)
    p.pub("not_joined", b"first")
    conn = connection_of(p)
    bodies = bodies_of(50)
    with conn._send_lock:
        futures = [p.pub_async("not_joined", body) for body in bodies]
    assert [f.result(TIMEOUT) for f in futures] == [b"OK"] * 50
    assert p.stats()["nsqd"][0]["pubs_joined"] == 0
    assert consume(node, "not_joined", 51) == [b"first", *bodies]


def test_a_joined_mpub_never_exceeds_the_max_body_size_the_producer_was_told(
    nsq_cluster_factory, producers
):
    cluster = nsq_cluster_factory(lookupd=False, max_msg_size=1000, max_body_size=2000)
    node = cluster.nsqd
    p = producers(node.tcp_address, pub_timeout=TIMEOUT, max_body_size=2000, max_msg_size=1000)
    p.pub("told", b"first")
    conn = connection_of(p)
    bodies = bodies_of(30)  # 9 messages fit in 2,000 bytes
    with conn._send_lock:
        futures = [p.pub_async("told", body) for body in bodies]
    assert [f.result(TIMEOUT) for f in futures] == [b"OK"] * 30
    assert p.stats()["nsqd"][0]["pubs_joined"] == 30
    assert p.stats()["nsqd"][0]["connects"] == 1  # nothing refused
    assert consume(node, "told", 31) == [b"first", *bodies]


def test_an_nsqd_that_refuses_a_joined_mpub_gets_the_publishes_one_by_one(
    nsq_cluster_factory, producers, caplog
):
    # nsqd's --max-body-size is below what the Producer joins into, and nobody told it: nsqd
    # refuses the MPUB for its size (fatal, nothing stored); the publishes are sent again one
    # by one on a new connection, which joins nothing.
    cluster = nsq_cluster_factory(lookupd=False, max_msg_size=1000, max_body_size=2000)
    node = cluster.nsqd
    p = producers(node.tcp_address, pub_timeout=TIMEOUT)
    caplog.set_level(logging.WARNING, logger="nsqclient")
    p.pub("refused", b"first")
    conn = connection_of(p)
    bodies = bodies_of(30)  # one MPUB body of 6,124 bytes
    with conn._send_lock:
        futures = [p.pub_async("refused", body) for body in bodies]
    outcomes = [f.exception(TIMEOUT) for f in futures]
    assert conn.wait_closed(TIMEOUT)
    if conn.join_refused is None:
        # Real nsqd closes with the MPUB's body unread, so that the kernel may reset the
        # connection and drop the error frame: nobody learns why, and the outcome of what was
        # in flight is unknown (maybe_processed), as after any reset.
        assert cluster.kind != "embedded"
        assert all(isinstance(e, ConnectionClosedError) and e.maybe_processed for e in outcomes)
        return
    assert conn.join_refused.code == "E_BAD_BODY"
    assert outcomes == [None] * 30
    assert message_count(node, "refused") == 31  # each stored once
    assert consume(node, "refused", 31) == [b"first", *bodies]
    stats = p.stats()["nsqd"][0]
    assert stats["connects"] == 2 and stats["pubs_joined"] == 30  # the refused MPUB's
    assert any("no longer joins publishes" in r.getMessage() for r in caplog.records)
    after = p._slots[0].conn
    assert after is not conn and after.join_limit == 0


def test_a_youzan_producer_joins_nothing(producers):
    p = producers("127.0.0.1:1", youzan=True)  # never connected: what its endpoints are given
    assert not p._slots[0].joining
    assert producers("127.0.0.1:1")._slots[0].joining
