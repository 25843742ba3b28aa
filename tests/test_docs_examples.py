"""Code in the guides runs as printed: consumer.rst's batching program against the broker."""

from __future__ import annotations

import os
import re
import threading

import pytest
import requests

from nsqclient import Producer
from nsqclient.testing.helpers import message_count, publish
from nsqclient.testing.waiting import wait_for

DOCS = os.path.join(os.path.dirname(__file__), os.pardir, "docs")


def code_block(page: str, section: str) -> str:
    """The first ``.. code-block:: python`` under the heading ``section`` of ``page``."""
    with open(os.path.join(DOCS, page), encoding="utf-8") as f:
        text = f.read()
    start = text.index(section + "\n")
    match = re.search(r"\.\. code-block:: python\n\n((?:    .*\n|\n)+)", text[start:])
    assert match, f"no python code block under {section!r} in {page}"
    lines = match.group(1).splitlines()
    return "\n".join(line[4:] for line in lines) + "\n"


def channel_stats(cluster, topic: str, channel: str) -> dict | None:
    reply = requests.get(
        f"{cluster.nsqd.http_url}/stats", params={"format": "json", "topic": topic}, timeout=5
    )
    reply.raise_for_status()
    data = reply.json()
    data = data.get("data", data)
    for t in data.get("topics") or []:
        for c in t.get("channels") or []:
            if t["topic_name"] == topic and c["channel_name"] == channel:
                return c
    return None


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
    errors: list[BaseException] = []

    def run_example():
        try:
            exec(compile(source, "consumer.rst", "exec"), namespace)
        except BaseException as exc:
            errors.append(exc)

    program = threading.Thread(target=run_example, name="batching-example")
    program.start()
    try:
        # 250 messages, batches of 100 with 200 in flight: the last 50 neither fill a batch nor
        # starve a connection; only the timed flush writes them.
        wait_for(lambda: sum(map(len, batches)) >= len(bodies), 15, 0.02, lambda: str(batches))
        wait_for(
            lambda: (
                (c := channel_stats(nsqd, "clicks", "batcher")) is not None
                and c["in_flight_count"] == 0
                and c["depth"] == 0
            ),
            10,
            0.05,
            lambda: f"left on nsqd: {channel_stats(nsqd, 'clicks', 'batcher')}",
        )
    finally:
        wait_for(lambda: "consumer" in namespace, 10)
        namespace["consumer"].stop(timeout=10)
        program.join(15)
    assert not program.is_alive() and errors == []
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
    errors: list[BaseException] = []

    def run() -> None:
        try:
            exec(compile(source, "relay.rst", "exec"), namespace)
        except BaseException as exc:
            errors.append(exc)

    program = threading.Thread(target=run, name="relay-example")
    program.start()
    try:
        wait_for(lambda: message_count(node, "clicks-copy") >= total, RELAY_TIMEOUT)

        def drained() -> bool:
            c = channel_stats(nsqd, "clicks", "relay")
            return c is not None and c["depth"] == 0 and c["in_flight_count"] == 0

        wait_for(drained, RELAY_TIMEOUT)
    finally:
        wait_for(lambda: "consumer" in namespace, RELAY_TIMEOUT)
        namespace["consumer"].stop(timeout=RELAY_TIMEOUT)
        program.join(RELAY_TIMEOUT)
    assert not program.is_alive() and errors == []
    assert message_count(node, "clicks-copy") == total
    stats = namespace["consumer"].stats()
    assert (stats["finished"], stats["requeued"]) == (total, 0)
