"""Pull mode's batch filling (``take(..., fill=True)``, ``take_batches(..., fill=True)``) and
``take()`` on a Consumer never started (an error at once, not ``[]`` forever)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nsqclient import Consumer, Producer
from nsqclient.testing.helpers import publish, wait_drained
from nsqclient.testing.waiting import wait_for

#: Seconds: the bound of every wait; reached only when something is broken.
TIMEOUT = 10.0


def bodies(n: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


@pytest.fixture
def trickle(nsqd: Any) -> Iterator[Callable[[str, list[bytes]], None]]:
    """``trickle(topic, bodies)``: publish ``bodies`` one PUB at a time, each only once nsqd
    stored the previous one, on a thread (joined at teardown)."""
    threads: list[threading.Thread] = []
    producer = Producer(nsqd.nsqd.tcp_address)

    def start(topic: str, items: list[bytes]) -> None:
        def run() -> None:
            for body in items:
                producer.pub(topic, body)

        thread = threading.Thread(target=run, name="test-trickle")
        threads.append(thread)
        thread.start()

    yield start
    for thread in threads:
        thread.join(TIMEOUT)
    producer.close()
    assert not any(t.is_alive() for t in threads)


def queued(consumer: Consumer) -> int:
    return sum(c.queued for c in consumer.connection_counts())


@pytest.mark.parametrize("columnar", [False, True])
def test_take_before_start_raises_at_once_saying_to_start(nsqd, pullers, columnar):
    node = nsqd.nsqd
    publish(node, "fill_unstarted", [b"waiting in nsqd"])
    consumer = pullers(
        "fill_unstarted", "c", start=False, nsqd_tcp_addresses=node.tcp_address, columnar=columnar
    )
    take = consumer.take_batches if columnar else consumer.take
    began = time.monotonic()
    with pytest.raises(RuntimeError, match=r"never started: call consumer\.start\(\) first"):
        take(timeout=TIMEOUT)
    with pytest.raises(RuntimeError, match=r"start\(\)"):
        take(fill=True)
    assert time.monotonic() - began < TIMEOUT / 2  # raised, not waited for
    consumer.start()
    wait_for(lambda: queued(consumer) == 1, TIMEOUT, message="the message arrives once started")
    taken = take(timeout=TIMEOUT)
    assert taken and (taken[0].bodies() if columnar else [taken[0].body]) == [b"waiting in nsqd"]
    assert (consumer.finish_batches(taken) if columnar else consumer.finish_many(taken)) == 1
    wait_drained(node, "fill_unstarted", "c")


@pytest.mark.parametrize("columnar", [False, True])
def test_fill_waits_until_max_messages_are_there(nsqd, pullers, trickle, columnar):
    # One PUB at a time: without fill, take() returns with the first socket read's messages.
    consumer = pullers(
        "fill_full", "c", nsqd_tcp_addresses=nsqd.nsqd.tcp_address, max_in_flight=100,
        columnar=columnar,
    )  # fmt: skip
    wait_for(consumer.connections, TIMEOUT, message="subscribed")
    trickle("fill_full", bodies(40))
    if columnar:
        batches = consumer.take_batches(25, timeout=TIMEOUT, fill=True)
        got = [body for batch in batches for body in batch.bodies()]
        assert consumer.finish_batches(batches) == 25
        rest = consumer.take_batches(15, timeout=TIMEOUT, fill=True)
        got += [body for batch in rest for body in batch.bodies()]
        consumer.finish_batches(rest)
    else:
        messages = consumer.take(25, timeout=TIMEOUT, fill=True)
        got = [m.body for m in messages]
        assert consumer.finish_many(messages) == 25
        rest = consumer.take(15, timeout=TIMEOUT, fill=True)
        got += [m.body for m in rest]
        consumer.finish_many(rest)
    assert got == bodies(40)  # 25 exactly (the first came at RDY 1: no saturation), then 15
    wait_drained(nsqd.nsqd, "fill_full", "c")


def test_fill_returns_what_came_when_the_timeout_passes(nsqd, pullers):
    node = nsqd.nsqd
    publish(node, "fill_timeout", bodies(5))
    consumer = pullers("fill_timeout", "c", nsqd_tcp_addresses=node.tcp_address, max_in_flight=100)
    wait_for(lambda: queued(consumer) == 5, TIMEOUT, message="all 5 received")
    began = time.monotonic()
    taken = consumer.take(100, timeout=0.5, fill=True)
    elapsed = time.monotonic() - began
    assert [m.body for m in taken] == bodies(5)
    assert 0.5 <= elapsed < TIMEOUT  # 5 < 100 and nsqd may send 95 more: it waited it out
    consumer.finish_many(taken)
    # Nothing at all within the timeout: [] as without fill.
    assert consumer.take(100, timeout=0.05, fill=True) == []


def test_fill_stops_waiting_once_saturated(nsqd, pullers):
    node = nsqd.nsqd
    consumer = pullers("fill_saturated", "c", nsqd_tcp_addresses=node.tcp_address, max_in_flight=10)
    publish(node, "fill_saturated", [b"first"])  # the first message raises RDY from 1 to 10
    first = consumer.take(1, timeout=TIMEOUT, fill=True)
    assert [m.body for m in first] == [b"first"]
    consumer.finish_many(first)
    wait_for(lambda: [c.rdy for c in consumer.connection_counts()] == [10], TIMEOUT)
    publish(node, "fill_saturated", bodies(50))
    began = time.monotonic()
    taken = consumer.take(100, timeout=60.0, fill=True)
    elapsed = time.monotonic() - began
    # nsqd sends max_in_flight (10) and nothing more until they are answered: no waiting 60 s
    assert [m.body for m in taken] == bodies(10)
    assert elapsed < TIMEOUT
    assert consumer.is_saturated()
    assert consumer.finish_many(taken) == 10
