"""docs/consumer.rst's pull-mode program ("Taking messages in batches") runs as printed."""

from __future__ import annotations

import threading

from _docs_programs import code_block, program_running, wait_drained

from nsqclient import Producer
from nsqclient.testing.waiting import wait_for


def test_taking_messages_in_batches_writes_each_once_and_leaves_nothing_in_flight(nsqd):
    source = code_block("consumer.rst", "Taking messages in batches")
    assert "http://127.0.0.1:4161" in source
    source = source.replace("http://127.0.0.1:4161", nsqd.lookupd.http_url)
    # The failed batch comes back after 0.1 s rather than the default delay (90 s x attempts).
    assert source.count("max_in_flight=2 * BATCH_SIZE,") == 1
    source = source.replace(
        "max_in_flight=2 * BATCH_SIZE,", "max_in_flight=2 * BATCH_SIZE, default_requeue_delay=0.1,"
    )
    batches: list[list[bytes]] = []
    failed_once = threading.Event()
    bodies = [b"click %d" % i for i in range(1250)]

    def write_all(items: list[bytes]) -> None:
        if not failed_once.is_set():
            failed_once.set()  # the first batch fails: requeued, written again later
            raise OSError("the database is away")
        batches.append(list(items))

    namespace = {"__name__": "pull_example", "write_all": write_all}
    with Producer(nsqd.nsqd.tcp_address) as producer:
        producer.mpub("clicks", bodies)
    with program_running(source, "consumer.rst", namespace):
        wait_for(lambda: sum(map(len, batches)) >= len(bodies), 30, 0.02, lambda: str(batches))
        wait_drained(nsqd, "clicks", "bulk-writer", 10)
    assert sorted(b for batch in batches for b in batch) == sorted(bodies)
    assert max(len(b) for b in batches) <= 500
    stats = namespace["consumer"].stats()
    assert stats["finished"] == len(bodies) and stats["requeued"] >= 1


def test_columnar_batches_program_writes_each_once(nsqd):
    source = code_block("consumer.rst", "Columnar batches")
    assert source.count('"127.0.0.1:4150"') == 1
    source = source.replace('"127.0.0.1:4150"', repr(nsqd.nsqd.tcp_address))
    source = source.replace("max_in_flight=5000,", "max_in_flight=5000, default_requeue_delay=0.1,")
    written: list[bytes] = []
    failed_once = threading.Event()
    bodies = [b"click %d" % i for i in range(3000)]

    def write_all(items: list[bytes]) -> None:
        if not failed_once.is_set():
            failed_once.set()  # the first write fails: requeued, written again later
            raise OSError("the database is away")
        written.extend(items)

    namespace = {"__name__": "columnar_example", "write_all": write_all}
    with Producer(nsqd.nsqd.tcp_address) as producer:
        producer.mpub("clicks", bodies)
    with program_running(source, "consumer.rst", namespace):
        wait_for(lambda: len(written) >= len(bodies), 30, 0.02, lambda: f"{len(written)}")
        wait_drained(nsqd, "clicks", "columns", 10)
    assert sorted(written) == sorted(bodies)
    stats = namespace["consumer"].stats()
    assert stats["finished"] == len(bodies) and stats["requeued"] >= 1
