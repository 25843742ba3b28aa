"""A Producer that learns where to publish from nsqlookupd, on classic NSQ (the broker
fixture: the embedded NSQ, or real nsqd/nsqlookupd with NSQ_BIN_DIR)."""

from __future__ import annotations

import time

import pytest
import requests

from nsqclient import Producer
from nsqclient.errors import HTTPError, NSQTimeoutError
from nsqclient.http import LookupdClient, NsqdHTTPClient, TopicNotFoundError
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


@pytest.mark.parametrize("fault", ["stop", "stall"])
def test_publishing_by_lookup_goes_on_while_lookupd_is_down_or_hangs(nsqd, fault):
    """A classic topic's route outlives lookupd: while it refuses connections (restarting) or
    hangs, publishes go to the nsqd it named last, and it is asked again once it answers."""
    producer = Producer(
        lookupd_http_addresses=[nsqd.lookupd.http_url],
        lookupd_poll_interval=0.2,
        lookupd_request_timeout=0.3,
        pub_timeout=5.0,
    )
    router = producer._router
    assert router is not None
    try:
        producer.pub("pl_outage", b"before")
        getattr(nsqd, f"{fault}_lookupd")()
        try:
            # the route is old now: each of these publishes asks lookupd first, and fails to
            for i in range(3):
                wait_for(lambda: router.cached("pl_outage") is None, TIMEOUT)
                producer.pub("pl_outage", b"during %d" % i, timeout=5.0)
            assert router.lookup_error("pl_outage") is not None
        finally:
            getattr(nsqd, f"{'start' if fault == 'stop' else 'unstall'}_lookupd")()
        # (a real nsqlookupd restarted knows no nsqd until it registers again, up to 15 s)
        lookupd = LookupdClient(nsqd.lookupd.http_url)

        def listed() -> bool:
            try:
                return bool(lookupd.lookup("pl_outage")["producers"])
            except TopicNotFoundError:
                return False

        wait_for(listed, 30.0)
        wait_for(lambda: router.cached("pl_outage") is None, TIMEOUT)
        producer.pub("pl_outage", b"after")
        assert router.lookup_error("pl_outage") is None
    finally:
        producer.close()
