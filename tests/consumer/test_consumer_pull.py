"""Pull mode: a Consumer without a handler holds what nsqd sends; the caller takes it in
batches (``take``) and answers many at once (``finish_many``, ``requeue_many``)."""

from __future__ import annotations

import logging
import threading

import pytest

from nsqclient import Consumer, Message
from nsqclient.testing.helpers import (
    nsq_threads,
    publish,
    wait_drained,
)
from nsqclient.testing.waiting import wait_for

#: Seconds: the bound of every wait; reached only when something is broken.
TIMEOUT = 10.0


def take_n(consumer: Consumer, n: int, max_messages: int | None = None) -> list[Message]:
    """Take until ``n`` messages were taken (TIMEOUT at most)."""
    taken: list[Message] = []

    def more() -> bool:
        taken.extend(consumer.take(max_messages, timeout=0.1))
        return len(taken) >= n

    wait_for(more, TIMEOUT, message=lambda: f"took {len(taken)} of {n}")
    return taken


def bodies(n: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def test_take_gives_what_arrived_in_order_and_finish_many_answers_it(nsqd, pullers):
    node = nsqd.nsqd
    publish(node, "pull_basic", bodies(300))
    consumer = pullers("pull_basic", "c", nsqd_tcp_addresses=node.tcp_address, max_in_flight=500)
    taken = take_n(consumer, 300)
    assert [m.body for m in taken] == bodies(300)  # one nsqd: arrival order is publish order
    assert all(m.is_async() and not m.has_responded() for m in taken)
    assert consumer.finish_many(taken) == 300
    assert all(m.has_responded() for m in taken)
    wait_drained(node, "pull_basic", "c")
    stats = consumer.stats()
    assert (stats["received"], stats["finished"], stats["requeued"]) == (300, 300, 0)
    assert sum(c.in_flight for c in consumer.connection_counts()) == 0


def test_take_never_blocks_by_default_and_waits_up_to_its_timeout(nsqd, pullers):
    node = nsqd.nsqd
    consumer = pullers("pull_wait", "c", nsqd_tcp_addresses=node.tcp_address)
    assert consumer.take() == []
    got: list[Message] = []
    taker = threading.Thread(target=lambda: got.extend(consumer.take(timeout=TIMEOUT)))
    taker.start()
    publish(node, "pull_wait", [b"late"])
    taker.join(TIMEOUT)
    assert not taker.is_alive()
    assert [m.body for m in got] == [b"late"]
    consumer.finish_many(got)


def test_max_messages_takes_the_oldest_first(nsqd, pullers):
    node = nsqd.nsqd
    publish(node, "pull_max", bodies(50))
    consumer = pullers("pull_max", "c", nsqd_tcp_addresses=node.tcp_address, max_in_flight=100)
    wait_for(
        lambda: sum(c.queued for c in consumer.connection_counts()) == 50,
        TIMEOUT,
        message="50 messages waiting to be taken",
    )
    first = consumer.take(max_messages=20)
    rest = consumer.take()
    assert [m.body for m in first] == bodies(50)[:20]
    assert [m.body for m in rest] == bodies(50)[20:]
    assert consumer.finish_many(first + rest) == 50


def test_rdy_stays_within_max_in_flight_across_several_nsqd(nsq_cluster_factory, pullers):
    cluster = nsq_cluster_factory(nsqd_count=2, lookupd=False)
    nodes = list(cluster.nsqds)
    for node in nodes:
        publish(node, "pull_many", bodies(200, node.tcp_address))
    consumer = pullers(
        "pull_many", "c", nsqd_tcp_addresses=[n.tcp_address for n in nodes], max_in_flight=40
    )
    wait_for(lambda: len(consumer.connections()) == 2, TIMEOUT, message="both connected")
    taken = take_n(consumer, 40)

    def settled() -> bool:
        """Both connections past their first message (RDY split 20/20) and every RDY held."""
        taken.extend(consumer.take())
        return sum(c.rdy for c in consumer.connection_counts()) == 40 and consumer.is_saturated()

    # Held without an answer: nsqd sends nothing more once every RDY is used, and the sum of
    # RDY never exceeds max_in_flight (what a connection held when its RDY was lowered for the
    # other one may briefly exceed it, as in go-nsq).
    wait_for(settled, TIMEOUT, message=lambda: f"counts {consumer.connection_counts()}")
    assert consumer.take(timeout=0.3) == []
    counts = consumer.connection_counts()
    assert sum(c.rdy for c in counts) <= 40
    assert sum(c.in_flight for c in counts) == len(taken)
    assert len(taken) <= 40 + max(c.in_flight - c.rdy for c in counts)
    seen = list(taken)
    while len(seen) < 400:
        assert consumer.finish_many(taken) == len(taken)
        assert sum(c.rdy for c in consumer.connection_counts()) <= 40
        taken = take_n(consumer, 1)
        seen += taken
    consumer.finish_many(taken)
    assert sorted(m.body for m in seen) == sorted(
        b for node in nodes for b in bodies(200, node.tcp_address)
    )
    for node in nodes:
        wait_drained(node, "pull_many", "c")


def test_answers_from_another_thread_and_twice_answered_messages_are_skipped(nsqd, pullers, caplog):
    node = nsqd.nsqd
    publish(node, "pull_thread", bodies(10))
    consumer = pullers("pull_thread", "c", nsqd_tcp_addresses=node.tcp_address, max_in_flight=10)
    taken = take_n(consumer, 10)
    counts: list[int] = []
    answerer = threading.Thread(target=lambda: counts.append(consumer.finish_many(taken[:6])))
    answerer.start()
    answerer.join(TIMEOUT)
    taken[6].finish()
    with caplog.at_level(logging.WARNING, logger="nsqclient.message"):
        assert consumer.finish_many(taken) == 3  # 7 were answered already
    assert counts == [6]
    assert sum("already answered" in r.getMessage() for r in caplog.records) == 7
    wait_drained(node, "pull_thread", "c")
    assert consumer.stats()["finished"] == 10


def test_requeue_many_hands_messages_back_with_their_delay(nsqd, pullers):
    node = nsqd.nsqd
    publish(node, "pull_req", bodies(5))
    consumer = pullers("pull_req", "c", nsqd_tcp_addresses=node.tcp_address, max_in_flight=5)
    first = take_n(consumer, 5)
    assert consumer.requeue_many(first, delay=0, backoff=False) == 5
    again = take_n(consumer, 5)
    assert sorted(m.body for m in again) == bodies(5)
    assert all(m.attempts == 2 for m in again)
    assert consumer.finish_many(again) == 5
    stats = consumer.stats()
    assert (stats["requeued"], stats["finished"], stats["backoff_level"]) == (5, 5, 0)


def test_a_message_of_another_consumer_is_refused_before_anything_is_sent(nsqd, pullers):
    node = nsqd.nsqd
    mine = pullers("pull_foreign", "c", nsqd_tcp_addresses=node.tcp_address)
    other = pullers("pull_foreign", "other", nsqd_tcp_addresses=node.tcp_address)
    for consumer in (mine, other):  # both channels exist before the message: each gets it
        wait_for(consumer.connections, TIMEOUT, message="subscribed")
    publish(node, "pull_foreign", [b"x"])
    taken = take_n(mine, 1)
    with pytest.raises(ValueError, match="was not received by"):
        other.finish_many(taken)
    assert not taken[0].has_responded()
    assert mine.finish_many(taken) == 1


def test_take_is_for_pull_mode_only(nsqd, consumers):
    consumer = consumers("pull_not", "c", lambda m: None, nsqd_tcp_addresses=nsqd.nsqd.tcp_address)
    with pytest.raises(RuntimeError, match="handler=None"):
        consumer.take()


def test_bad_arguments_fail_at_the_call(nsqd, pullers):
    consumer = pullers("pull_args", "c", nsqd_tcp_addresses=nsqd.nsqd.tcp_address)
    with pytest.raises(ValueError, match="max_messages"):
        consumer.take(max_messages=0)
    with pytest.raises(ValueError, match="timeout"):
        consumer.take(timeout=-1)
    with pytest.raises(TypeError, match="timeout"):
        consumer.take(timeout=False)  # nothing to take: refused all the same
    with pytest.raises(ValueError, match="delay"):
        consumer.requeue_many([], delay=-1)


def test_pull_mode_runs_no_worker_thread(nsqd, pullers):
    consumer = pullers("pull_threads", "c", nsqd_tcp_addresses=nsqd.nsqd.tcp_address)
    wait_for(lambda: consumer.connections(), TIMEOUT, message="connected")
    assert not [t for t in nsq_threads() if t.name.startswith("nsq-worker-pull_threads")]


def test_give_up_at_max_tries_happens_in_take(nsqd, pullers):
    node = nsqd.nsqd
    publish(node, "pull_tries", bodies(4))
    given_up: list[Message] = []
    consumer = pullers(
        "pull_tries",
        "c",
        nsqd_tcp_addresses=node.tcp_address,
        max_tries=2,
        max_in_flight=4,
        giving_up=given_up.append,
    )
    for _attempt in range(2):
        batch = take_n(consumer, 4)
        assert consumer.requeue_many(batch, delay=0, backoff=False) == 4
    # Third delivery: attempts 3 > max_tries 2, given up on inside take(), never returned.
    wait_for(
        lambda: consumer.take(timeout=0.05) == [] and len(given_up) == 4,
        TIMEOUT,
        message=lambda: f"{len(given_up)} given up",
    )
    assert sorted(m.body for m in given_up) == bodies(4)
    assert all(m.attempts == 3 and m.has_responded() for m in given_up)
    wait_drained(node, "pull_tries", "c")
    assert consumer.stats()["given_up"] == 4


def test_stop_requeues_untaken_at_once_and_held_ones_at_its_deadline(nsqd, pullers, caplog):
    node = nsqd.nsqd
    publish(node, "pull_stop", bodies(30))
    consumer = pullers("pull_stop", "c", nsqd_tcp_addresses=node.tcp_address, max_in_flight=30)
    wait_for(
        lambda: sum(c.queued for c in consumer.connection_counts()) == 30,
        TIMEOUT,
        message="30 messages waiting to be taken",
    )
    held = consumer.take(max_messages=10)
    consumer.finish_many(held[:4])
    with caplog.at_level(logging.WARNING, logger="nsqclient.consumer"):
        consumer.stop(timeout=0.5)
    assert any("6 messages taken were not answered" in r.getMessage() for r in caplog.records)
    assert all(m.has_responded() for m in held)
    # Nothing lost: the 26 not finished are back in the channel, none in flight.
    wait_drained(node, "pull_stop", "c", depth=26)
    stats = consumer.stats()
    assert stats["finished"] == 4 and stats["requeued"] == 26


def test_stop_waits_for_held_messages_answered_meanwhile(nsqd, pullers):
    node = nsqd.nsqd
    publish(node, "pull_drain", bodies(5))
    consumer = pullers("pull_drain", "c", nsqd_tcp_addresses=node.tcp_address, max_in_flight=5)
    held = take_n(consumer, 5)
    stopping = threading.Thread(target=consumer.stop, args=(TIMEOUT,))
    stopping.start()
    wait_for(lambda: not consumer.is_running or stopping.is_alive(), TIMEOUT)
    assert consumer.finish_many(held) == 5  # answered while stop() waits: all finished
    stopping.join(TIMEOUT)
    assert not stopping.is_alive()
    wait_drained(node, "pull_drain", "c")
    stats = consumer.stats()
    assert (stats["finished"], stats["requeued"]) == (5, 0)


def test_a_take_loop_does_not_spin_while_the_consumer_stops(nsqd, pullers):
    consumer = pullers("pull_spin", "c", nsqd_tcp_addresses=nsqd.nsqd.tcp_address)
    wait_for(consumer.connections, TIMEOUT, message="subscribed")
    calls = 0
    waiting = threading.Event()

    def loop() -> None:
        nonlocal calls
        while consumer.is_running:
            calls += 1
            waiting.set()
            consumer.take(timeout=TIMEOUT)

    taker = threading.Thread(target=loop)
    taker.start()
    assert waiting.wait(TIMEOUT)
    consumer.stop(TIMEOUT)  # wakes the waiting take(), which then waits for the stop to end
    taker.join(TIMEOUT)
    assert not taker.is_alive()
    assert calls <= 2, calls
