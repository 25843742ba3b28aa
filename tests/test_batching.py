"""pynsq's batching idiom batches: handlers hold messages (enable_async) and flush when the batch
is full or ``is_starved()``; messages waiting for a handler worker never make it starved."""

from __future__ import annotations

import statistics
import threading
from typing import Any

from nsqclient import Producer
from nsqclient.message import Message
from nsqclient.testing.helpers import publish, wait_drained
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
