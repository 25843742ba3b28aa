"""Columnar pull mode: ``Consumer(..., None, columnar=True)`` hands out MessageBatch objects
(``take_batches``), answered a batch at a time; against the session's broker (embedded, or
real nsqd with NSQ_BIN_DIR)."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

from nsqclient import Consumer
from nsqclient.consumer._batch import MessageBatch
from nsqclient.testing.helpers import publish, wait_drained
from nsqclient.testing.waiting import wait_for

#: Seconds: the bound of every wait; reached only when something is broken.
TIMEOUT = 10.0


@pytest.fixture
def columnar(pullers: Callable[..., Consumer]) -> Callable[..., Consumer]:
    """``make(topic, channel, **options) -> Consumer``: a columnar puller (started; stopped at
    teardown)."""
    return functools.partial(pullers, columnar=True)


def take_n(consumer: Consumer, n: int, max_messages: int | None = None) -> list[MessageBatch]:
    """Take batches until they hold ``n`` messages (TIMEOUT at most)."""
    taken: list[MessageBatch] = []

    def more() -> bool:
        taken.extend(consumer.take_batches(max_messages, timeout=0.1))
        return sum(map(len, taken)) >= n

    wait_for(more, TIMEOUT, message=lambda: f"took {sum(map(len, taken))} of {n}")
    return taken


def bodies(n: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def flat(batches: list[MessageBatch], field: str) -> list[Any]:
    return [value for batch in batches for value in getattr(batch, field)()]


def test_batches_hold_every_field_and_one_call_finishes_them(nsqd, columnar):
    node = nsqd.nsqd
    published_at = time.time_ns()
    publish(node, "col_basic", bodies(500))
    consumer = columnar("col_basic", "c", nsqd_tcp_addresses=node.tcp_address, max_in_flight=600)
    batches = take_n(consumer, 500)
    assert flat(batches, "bodies") == bodies(500)  # one nsqd: arrival order is publish order
    ids = flat(batches, "ids")
    assert len(set(ids)) == 500 and all(len(i) == 16 for i in ids)
    assert flat(batches, "attempts") == [1] * 500
    assert all(published_at - 5e9 < t < time.time_ns() + 1 for t in flat(batches, "timestamps"))
    decoded = [d for batch in batches for d in batch.decoded()]
    assert [d.body for d in decoded] == bodies(500) and [d.id for d in decoded] == ids
    assert all(b.nsqd_address == node.tcp_address and b.partition is None for b in batches)
    assert all(b.contiguous and not b.has_responded() for b in batches)
    assert sum(c.in_flight for c in consumer.connection_counts()) == 500
    assert consumer.finish_batches(batches) == 500
    assert all(b.has_responded() for b in batches)
    wait_drained(node, "col_basic", "c")
    stats = consumer.stats()
    assert (stats["received"], stats["finished"], stats["requeued"]) == (500, 500, 0)
    assert sum(c.in_flight for c in consumer.connection_counts()) == 0


def test_max_messages_splits_the_last_batch_and_keeps_the_rest_in_order(nsqd, columnar):
    node = nsqd.nsqd
    publish(node, "col_max", bodies(50))
    consumer = columnar("col_max", "c", nsqd_tcp_addresses=node.tcp_address, max_in_flight=50)
    wait_for(lambda: sum(c.queued for c in consumer.connection_counts()) == 50, TIMEOUT)
    first = consumer.take_batches(max_messages=7)
    assert sum(map(len, first)) == 7
    rest = take_n(consumer, 43)
    assert flat(first, "bodies") + flat(rest, "bodies") == bodies(50)
    assert consumer.finish_batches(first + rest) == 50
    wait_drained(node, "col_max", "c")


def test_a_split_batch_is_answered_by_its_parts_and_nothing_twice(nsqd, columnar, caplog):
    node = nsqd.nsqd
    publish(node, "col_split", bodies(20))
    consumer = columnar("col_split", "c", nsqd_tcp_addresses=node.tcp_address, max_in_flight=20)
    batches = take_n(consumer, 20)
    big = max(batches, key=len)  # how many a read holds is up to the network: any size works
    others = [b for b in batches if b is not big]
    cut = max(len(big) // 2, 1)
    head, tail = big.split(cut)
    assert (len(head), len(tail)) == (cut, len(big) - cut)
    assert head.bodies() + tail.bodies() == big.bodies()
    assert head.ids() + tail.ids() == big.ids()
    with caplog.at_level(logging.WARNING, logger="nsqclient.consumer"):
        assert big.finish() == 0  # split: its parts are answered instead
        assert head.finish() == cut
        assert head.finish() == 0
    assert "answered or split already" in caplog.text
    with pytest.raises(ValueError, match="split"):
        big.split(1)
    # An empty part (a split at 0) answers nothing and sends nothing: the connection stays.
    empty, tail = tail.split(0)
    assert len(empty) == 0 and empty.finish() == 0 and empty.has_responded()
    assert consumer.touch_batches([tail, *others]) == 20 - cut
    assert tail.touched_at is not None
    back = consumer.requeue_batches([tail, *others], delay=0, backoff=False)
    assert back == 20 - cut
    again = take_n(consumer, back)
    assert flat(again, "attempts") == [2] * back
    assert sorted(flat(again, "bodies")) == sorted(tail.bodies() + flat(others, "bodies"))
    assert consumer.finish_batches(again) == back
    wait_drained(node, "col_split", "c")
    stats = consumer.stats()
    assert (stats["finished"], stats["requeued"], stats["finish_failed"]) == (20, back, 0)


def test_bodies_of_max_msg_size_and_of_one_byte(nsqd, columnar):
    # nsqd refuses a 0-byte body (PUB and MPUB alike); tests/consumer/test_batch.py reads one
    # from bytes
    node = nsqd.nsqd
    big = bytes(range(256)) * (1024 * 1024 // 256)  # nsqd's default --max-msg-size exactly
    sent = [big, b"x", big[:-1], b"y"]
    for body in sent:
        publish(node, "col_sizes", [body])
    consumer = columnar("col_sizes", "c", nsqd_tcp_addresses=node.tcp_address, max_in_flight=10)
    batches = take_n(consumer, len(sent))
    assert flat(batches, "bodies") == sent
    assert consumer.finish_batches(batches) == len(sent)
    wait_drained(node, "col_sizes", "c")


def test_max_tries_gives_up_in_take_batches_and_leaves_the_rest(nsqd, columnar):
    node = nsqd.nsqd
    publish(node, "col_tries", bodies(4))
    given_up: list[Any] = []
    consumer = columnar(
        "col_tries",
        "c",
        nsqd_tcp_addresses=node.tcp_address,
        max_tries=1,
        max_in_flight=10,
        giving_up=given_up.append,
    )
    first = take_n(consumer, 4)
    head, tail = first[0].split(2) if len(first) == 1 else (first[0], None)
    assert consumer.requeue_batches([head], delay=0, backoff=False) == len(head)
    consumer.finish_batches([b for b in (tail, *first[1:]) if b is not None])
    # the requeued ones come back with attempts 2 > max_tries 1: given up on, never handed out
    wait_for(
        lambda: not consumer.take_batches(timeout=0.05) and len(given_up) == len(head),
        TIMEOUT,
        message=lambda: f"{len(given_up)} given up",
    )
    assert all(m.attempts == 2 and m.has_responded() for m in given_up)
    wait_drained(node, "col_tries", "c")
    assert consumer.stats()["given_up"] == len(head)


def test_a_connection_lost_while_batches_are_held_loses_nothing(nsq_cluster_factory, columnar):
    cluster = nsq_cluster_factory(nsqd_count=1, lookupd=False)
    node = cluster.nsqd
    publish(node, "col_lost", bodies(40))
    consumer = columnar(
        "col_lost", "c", nsqd_tcp_addresses=node.tcp_address, max_in_flight=40, msg_timeout=2.0
    )
    held = take_n(consumer, 40)
    (conn,) = consumer.connections()
    conn.close(1.0)  # the connection goes while the batches are held
    wait_for(lambda: conn.is_closed, TIMEOUT)
    # answered after the connection went: only marked answered; nsqd sends them again
    assert consumer.finish_batches(held) == 40
    assert consumer.finish_batches(held) == 0  # and never twice
    again = take_n(consumer, 40)  # reconnected (a direct address), redelivered
    assert sorted(flat(again, "bodies")) == sorted(bodies(40))
    assert all(a >= 2 for a in flat(again, "attempts"))
    assert consumer.finish_batches(again) == 40
    wait_drained(node, "col_lost", "c")


def test_stop_requeues_untaken_and_held_batches(nsqd, columnar, caplog):
    node = nsqd.nsqd
    publish(node, "col_stop", bodies(30))
    consumer = columnar("col_stop", "c", nsqd_tcp_addresses=node.tcp_address, max_in_flight=30)
    wait_for(lambda: sum(c.queued for c in consumer.connection_counts()) == 30, TIMEOUT)
    held = consumer.take_batches(max_messages=10)
    assert sum(map(len, held)) == 10
    with caplog.at_level(logging.WARNING, logger="nsqclient.consumer"):
        consumer.stop(timeout=0.5)
    assert "10 messages taken were not answered" in caplog.text
    assert all(b.has_responded() for b in held)
    assert consumer.stats()["requeued"] == 30
    again = Consumer("col_stop", "c", None, nsqd_tcp_addresses=node.tcp_address, max_in_flight=30)
    again.start()
    try:
        got: list[Any] = []
        wait_for(lambda: got.extend(again.take(timeout=0.1)) or len(got) >= 30, TIMEOUT)
        assert sorted(m.body for m in got) == sorted(bodies(30))
        again.finish_many(got)
    finally:
        again.stop(5.0)


def test_columnar_is_for_pull_mode_and_each_mode_has_its_take(nsqd, columnar):
    address = nsqd.nsqd.tcp_address
    with pytest.raises(ValueError, match="pull mode"):
        Consumer("col_bad", "c", lambda m: None, nsqd_tcp_addresses=address, columnar=True)
    consumer = columnar("col_bad", "c", nsqd_tcp_addresses=address)
    with pytest.raises(RuntimeError, match="take_batches"):
        consumer.take()
    with pytest.raises(ValueError, match="max_messages"):
        consumer.take_batches(max_messages=0)
    plain = Consumer("col_bad", "c", None, nsqd_tcp_addresses=address)
    with pytest.raises(RuntimeError, match=r"take\(\)"):
        plain.take_batches()
    other = columnar("col_bad2", "c", nsqd_tcp_addresses=address)
    publish(nsqd.nsqd, "col_bad2", [b"a"])
    (batch,) = take_n(other, 1)
    with pytest.raises(ValueError, match="not received by"):
        consumer.finish_batches([batch])
    assert other.finish_batches([batch]) == 1
