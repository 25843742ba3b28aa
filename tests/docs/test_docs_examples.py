"""Code in the guides runs as printed: consumer.rst's batching program against the broker."""

from __future__ import annotations

import pytest
import requests
from _docs_programs import code_block, program_running, wait_drained

from nsqclient import Producer
from nsqclient.testing.helpers import message_count, publish
from nsqclient.testing.waiting import wait_for


def test_batching_with_is_starved_flushes_on_time_and_leaves_nothing_in_flight(nsqd):
    source = code_block("consumer.rst", "Batching with is_starved")
    assert "http://127.0.0.1:4161" in source
    source = source.replace("http://127.0.0.1:4161", nsqd.lookupd.http_url)
    batches: list[list[bytes]] = []
    bodies = [b"click %d" % i for i in range(250)]

    def write_all(items):
        batches.append(list(items))

    namespace = {"__name__": "batching_example", "write_all": write_all}
    requests.post(
        f"{nsqd.nsqd.http_url}/channel/create",
        params={"topic": "clicks", "channel": "batcher"},
        timeout=5,
    )
    with Producer(nsqd.nsqd.tcp_address) as producer:
        producer.mpub("clicks", bodies)
    with program_running(source, "consumer.rst", namespace):
        # 250 messages, batches of 100 with 200 in flight: the last 50 neither fill a batch nor
        # starve a connection; only the timed flush writes them.
        wait_for(lambda: sum(map(len, batches)) >= len(bodies), 15, 0.02, lambda: str(batches))
        wait_drained(nsqd, "clicks", "batcher", 10)
    assert sorted(b for batch in batches for b in batch) == sorted(bodies)
    sizes = [len(b) for b in batches]
    # Each connection starts at RDY 1, so the first batches are small (starved at once); then
    # full batches of 100; the rest only the timed flush can write (neither full nor starved).
    assert sizes.count(100) >= 2, sizes
    assert len(sizes) <= len(bodies) // 4, sizes
    stats = namespace["consumer"].stats()
    assert stats["finished"] == len(bodies) and stats["requeued"] == 0


# docs/relay.rst's two relays run as printed, topic clicks -> clicks-copy on the broker.

RELAY_TIMEOUT = 20.0


@pytest.mark.parametrize("section", ["The pub_async relay", "The batching relay"])
def test_relay_recipe_moves_every_message_once(nsqd, section):
    node = nsqd.nsqd
    source = code_block("relay.rst", section)
    source = source.replace("http://127.0.0.1:4161", nsqd.lookupd.http_url)
    source = source.replace('"127.0.0.1:4150"', repr(node.tcp_address))
    total = 3000
    publish(node, "clicks", [b"c%04d" % i for i in range(total)])
    namespace: dict = {"__name__": "relay_example"}
    with program_running(source, "relay.rst", namespace, RELAY_TIMEOUT, RELAY_TIMEOUT):
        wait_for(lambda: message_count(node, "clicks-copy") >= total, RELAY_TIMEOUT)
        wait_drained(nsqd, "clicks", "relay", RELAY_TIMEOUT)
    assert message_count(node, "clicks-copy") == total
    stats = namespace["consumer"].stats()
    assert (stats["finished"], stats["requeued"]) == (total, 0)
