"""Batching, two ways.  pynsq's idiom (handler mode): handlers hold messages (enable_async) and
flush when the batch is full or ``is_starved()``; messages waiting for a handler worker never make
it starved.  The pull API (a Consumer without a handler): ``take()`` hands over what has arrived,
``finish_many()`` / ``requeue_many()`` answer a batch at once; messages not taken never make it
starved, and docs/relay.rst's batching relay is built on it."""

from __future__ import annotations

import statistics
import threading
from typing import Any

import pytest

from nsqclient import NSQError, Producer
from nsqclient.message import Message
from nsqclient.testing.helpers import (
    channel_stats,
    free_port,
    message_count,
    publish,
    wait_drained,
)
from nsqclient.testing.waiting import wait_for

TIMEOUT = 30.0


def test_messages_waiting_for_a_handler_do_not_make_it_starved(nsqd, consumers):
    node = nsqd.nsqd
    release = threading.Event()
    seen: list[Message] = []

    def handler(message: Message) -> None:
        seen.append(message)
        release.wait(TIMEOUT)  # the first one blocks the only worker: the rest queue up

    consumer = consumers(
        "b_queued", "ch", handler, nsqd_tcp_addresses=node.tcp_address, max_in_flight=10
    )
    publish(node, "b_queued", [b"q%d" % i for i in range(10)])
    try:
        wait_for(lambda: consumer.stats()["received"] == 10, TIMEOUT)
        (conn,) = consumer.stats()["connections"].values()
        assert (conn["rdy"], conn["in_flight"], conn["queued"]) == (10, 10, 9)
        assert not consumer.is_starved()  # the handler holds 1 of RDY 10
    finally:
        release.set()
    wait_drained(node, "b_queued", "ch")
    assert len(seen) == 10


def test_pynsq_batching_relay_flushes_full_batches(nsqd, consumers):
    """The idiom pynsq documents, relaying topic A to B: gather, and mpub + FIN when 500 are
    held or the consumer is starved; a timer flushes the tail."""
    node = nsqd.nsqd
    total = 6000
    sizes: list[int] = []
    batch: list[Message] = []
    lock = threading.Lock()
    stop = threading.Event()
    producer = Producer(node.tcp_address)
    consumer: Any = None

    def flush() -> None:
        if not batch:
            return
        producer.mpub("b_relay_out", [m.body for m in batch])
        for m in batch:
            m.finish()
        sizes.append(len(batch))
        batch.clear()

    def handler(message: Message) -> None:
        message.enable_async()
        with lock:
            batch.append(message)
            if len(batch) >= 500 or consumer.is_starved():
                flush()

    def flush_on_time() -> None:
        while not stop.wait(0.5):
            with lock:
                flush()

    publish(node, "b_relay_in", [b"m%05d" % i for i in range(total)])
    flusher = threading.Thread(target=flush_on_time, name="test-flusher")
    flusher.start()
    try:
        consumer = consumers(
            "b_relay_in",
            "ch",
            handler,
            nsqd_tcp_addresses=node.tcp_address,
            max_in_flight=2500,
        )
        wait_drained(node, "b_relay_in", "ch")
    finally:
        stop.set()
        flusher.join()
        producer.close()
    assert sum(sizes) == total
    # A fresh connection starts at RDY 1, so the first flush or two may be starved at one
    # message; from the RDY of 2,500 on, 500 held is 20% of it and every batch fills.
    small = [n for n in sizes if n < 500]
    assert len(small) <= 4, sizes
    assert statistics.median(sizes) == 500, sizes


# ------------------------------------------------------------------------------------------------
# the same on the pull API


class Answers:
    """An observer counting the Consumer's answers: one call per FIN or REQ write it asks for
    (a batch answered at once is one call)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    def messages_answered(self, consumer, messages, action, delay, backoff) -> None:
        with self._lock:
            self.calls.append((action, len(messages)))


def test_messages_not_taken_do_not_make_it_starved(nsqd, consumers):
    node = nsqd.nsqd
    consumer = consumers(
        "p_queued", "ch", None, nsqd_tcp_addresses=node.tcp_address, max_in_flight=10
    )
    publish(node, "p_queued", [b"q%d" % i for i in range(10)])
    wait_for(lambda: consumer.stats()["received"] == 10, TIMEOUT)
    (counts,) = consumer.connection_counts()
    assert (counts.rdy, counts.in_flight, counts.queued) == (10, 10, 10)
    assert consumer.is_saturated()  # nsqd sends nothing more until something is answered
    assert not consumer.is_starved()  # but nothing is held: all 10 wait for take()
    held = consumer.take(8)
    assert [m.body for m in held] == [b"q%d" % i for i in range(8)]  # arrival order
    assert not consumer.is_starved()  # 8 of RDY 10 held: below 85%
    held += consumer.take(1)
    assert consumer.is_starved()  # 9 of 10
    assert consumer.finish_many(held) == 9
    assert not consumer.is_starved()
    rest = consumer.take(timeout=TIMEOUT)
    assert [m.body for m in rest] == [b"q9"]
    rest[0].finish()
    stats = wait_drained(node, "p_queued", "ch")
    assert stats["message_count"] == 10
    assert (consumer.stats()["finished"], consumer.stats()["requeued"]) == (10, 0)


def test_pull_batching_relay_publishes_full_batches_with_one_fin_call_each(nsqd, consumers):
    """docs/relay.rst's batching relay, relaying topic A to B: take up to 500, mpub them,
    finish_many; with a backlog on A every batch but the first (RDY 1) and the last is full."""
    node = nsqd.nsqd
    total = 6000
    bodies = [b"m%05d" % i for i in range(total)]
    sizes: list[int] = []
    answers = Answers()
    publish(node, "p_relay_in", bodies)
    consumer = consumers(
        "p_relay_in", "ch", None, start=False, nsqd_tcp_addresses=node.tcp_address,
        max_in_flight=2500,
    )  # fmt: skip
    consumer.add_observer(answers)
    relayed: list[bytes] = []
    with Producer(node.tcp_address) as producer:
        consumer.start()
        while len(relayed) < total:
            batch = consumer.take(500, timeout=TIMEOUT)
            assert batch, f"nothing to take after {len(relayed)} of {total}"
            producer.mpub("p_relay_out", [m.body for m in batch])
            assert consumer.finish_many(batch) == len(batch)
            sizes.append(len(batch))
            relayed.extend(m.body for m in batch)
    wait_drained(node, "p_relay_in", "ch")
    assert relayed == bodies  # one nsqd, one connection: arrival order is publish order
    assert message_count(node, "p_relay_out") == total
    assert answers.calls == [("finish", n) for n in sizes]  # one finish_many a batch
    stats = consumer.stats()
    assert (stats["finished"], stats["requeued"], stats["backoff_level"]) == (total, 0, 0)
    small = [n for n in sizes if n < 500]
    assert len(small) <= 4, sizes
    assert statistics.median(sizes) == 500, sizes


def test_pull_batching_relay_requeues_a_batch_it_could_not_publish(nsqd, consumers):
    """A failed mpub: requeue_many gives the whole batch back (one REQ write), counted as a
    failure for backoff, as a handler's requeue is."""
    node = nsqd.nsqd
    publish(node, "p_fail_in", [b"f%d" % i for i in range(20)])
    consumer = consumers(
        "p_fail_in", "ch", None, nsqd_tcp_addresses=node.tcp_address, max_in_flight=50
    )
    answers = Answers()
    consumer.add_observer(answers)
    gone = Producer(f"127.0.0.1:{free_port()}", dial_timeout=0.5, pub_timeout=2.0)  # nobody there
    try:
        batch = wait_for(lambda: consumer.take(50, timeout=1.0), TIMEOUT)
        with pytest.raises(NSQError):
            gone.mpub("p_fail_out", [m.body for m in batch])
        assert consumer.requeue_many(batch, delay=30.0) == len(batch)
    finally:
        gone.close()
    assert answers.calls == [("requeue", len(batch))]
    stats = consumer.stats()
    assert (stats["requeued"], stats["finished"]) == (len(batch), 0)
    assert stats["backoff_level"] == 1
    wait_for(
        lambda: (c := channel_stats(node, "p_fail_in", "ch"))
        and c["requeue_count"] == len(batch) and c["deferred_count"] == len(batch),
        TIMEOUT,
    )  # fmt: skip
    assert all(m.has_responded() for m in batch)
