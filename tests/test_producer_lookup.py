"""A Producer that learns where to publish from nsqlookupd, on classic NSQ (the broker
fixture: the embedded NSQ, or real nsqd/nsqlookupd with NSQ_BIN_DIR)."""

from __future__ import annotations

import time

import pytest
import requests

from nsqclient import Producer
from nsqclient.errors import HTTPError, NSQTimeoutError
from nsqclient.http import LookupdClient, NsqdHTTPClient
from nsqclient.testing.waiting import wait_for

TIMEOUT = 10.0


def depth(node, topic: str) -> int:
    stats = NsqdHTTPClient(node.http_url, timeout=TIMEOUT).stats(topic=topic)
    return sum(
        t["depth"] + sum(c["depth"] for c in t.get("channels") or [])
        for t in stats.get("topics") or []
    )


def test_a_new_topic_goes_to_an_nsqd_lookupd_knows(nsq_cluster):
    producer = Producer(lookupd_http_addresses=[nsq_cluster.lookupd.http_url])
    try:
        for _ in range(6):
            assert producer.pub("pl_new", b"m") is None
        producer.mpub("pl_new", [b"a", b"b"])
        assert sum(depth(n, "pl_new") for n in nsq_cluster.nsqds) == 8
    finally:
        producer.close()


def test_a_known_topic_goes_to_the_nsqd_that_has_it(nsq_cluster):
    target = nsq_cluster.nsqds[1]
    Producer(target.tcp_address).pub("pl_known", b"first")
    lookupd = nsq_cluster.lookupd.http_url
    # wait until lookupd lists it (nsqd registers the topic asynchronously)
    client = LookupdClient(lookupd, timeout=TIMEOUT)
    wait_for(lambda: _producers(client, "pl_known"), TIMEOUT)
    producer = Producer(lookupd_http_addresses=[lookupd], lookupd_poll_interval=60)
    try:
        for _ in range(5):
            producer.pub("pl_known", b"m")
        producer.dpub("pl_known", b"later", 0.01)  # classic topics keep DPUB
    finally:
        producer.close()
    assert depth(target, "pl_known") >= 6  # the deferred one may still be deferred
    assert all(depth(n, "pl_known") == 0 for n in nsq_cluster.nsqds if n is not target)


def _producers(client, topic):
    try:
        return client.lookup(topic)["producers"]
    except HTTPError:
        return []


def test_partition_or_key_on_a_classic_topic_is_refused(nsqd):
    producer = Producer(lookupd_http_addresses=[nsqd.lookupd.http_url])
    try:
        with pytest.raises(ValueError, match="no partitions"):
            producer.pub("pl_classic", b"m", partition=1)
        with pytest.raises(ValueError, match="no partitions"):
            producer.pub("pl_classic", b"m", key="k")
    finally:
        producer.close()


def test_every_lookupd_down_is_retried_until_the_timeout_which_names_it(nsqd):
    """lookupd restarting refuses connections for a moment: a publish asks again until its
    timeout, then says that no lookupd answered, and why."""
    producer = Producer(lookupd_http_addresses=["127.0.0.1:1"], lookupd_request_timeout=1.0)
    try:
        started = time.monotonic()
        with pytest.raises(NSQTimeoutError, match="no lookupd told where 'pl_down' goes") as info:
            producer.pub("pl_down", b"m", timeout=1.5)
        assert 1.5 - 0.2 <= time.monotonic() - started < 1.5 + 1.0
        assert isinstance(info.value.__cause__, HTTPError)
        assert "127.0.0.1:1" in str(info.value) and "refused" in str(info.value)
        assert not info.value.maybe_processed
    finally:
        producer.close()


def test_producer_needs_somewhere_to_publish():
    with pytest.raises(ValueError, match="nsqd_tcp_addresses or lookupd_http_addresses"):
        Producer()


def test_lookupd_learns_nothing_from_classic_listlookup(nsqd):
    producer = Producer(lookupd_http_addresses=[nsqd.lookupd.http_url])
    try:
        producer.pub("pl_list", b"m")
        assert producer._router.pool.addresses() == [nsqd.lookupd.http_url]
        assert (
            requests.get(nsqd.lookupd.http_url + "/listlookup", timeout=TIMEOUT).status_code == 404
        )
    finally:
        producer.close()
