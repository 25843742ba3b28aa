"""youzan failover as production sees it: the leader of a partition dies (SIGKILL: replaced only
after its registration expires; SIGTERM: handed over at once) while a Producer publishes keyed
messages and an ordered Consumer reads them.  The Producer waits for the new leader instead of
raising; the Consumer follows it long before its lookupd poll; nothing acknowledged is lost and
no key goes out of order."""

from __future__ import annotations

import threading
from collections import defaultdict

import pytest

from nsqclient import Consumer, Message, Producer
from nsqclient.errors import ConnectionClosedError
from nsqclient.testing import EmbeddedNSQ
from nsqclient.testing.waiting import wait_for

TIMEOUT = 30.0
TOPIC = "yz_failover"
KEYS = 8
#: acknowledged publishes before the leader dies, and in all
BEFORE, TOTAL = 300, 1500


@pytest.fixture
def cluster():
    with EmbeddedNSQ(youzan=True, nsqd_count=3, registration_ttl=1.5) as c:
        # replicator 3: two live copies of three stay a majority, so writes go on
        c.create_topic(TOPIC, partitions=1, replica=3, ordered=True)
        c.create_channel(TOPIC, "ch")
        yield c


@pytest.mark.parametrize("death", ["kill", "terminate"])
def test_producer_and_ordered_consumer_follow_a_dead_leader(cluster, death):
    lookupd = [cluster.lookupd.http_address]
    producer = Producer(lookupd_http_addresses=lookupd, pub_timeout=TIMEOUT)
    lock = threading.Lock()
    acked: set[bytes] = set()
    unknown: list[bytes] = []  # in flight when the connection died: maybe stored
    raised: list[BaseException] = []
    halfway = threading.Event()
    received: dict[int, list[int]] = defaultdict(list)
    bodies: set[bytes] = set()

    def handler(message: Message) -> None:
        key, seq = map(int, message.body.split(b":"))
        with lock:
            received[key].append(seq)
            bodies.add(message.body)

    # The default lookupd_poll_interval (60 s): following the new leader must not wait for it.
    consumer = Consumer(
        TOPIC, "ch", handler, lookupd_http_addresses=lookupd, ordered=True, max_in_flight=50
    )

    def publish() -> None:
        for i in range(TOTAL):
            key, seq = i % KEYS, i // KEYS
            body = b"%d:%d" % (key, seq)
            try:
                producer.pub(TOPIC, body, key=str(key))
            except ConnectionClosedError as exc:
                if not exc.maybe_processed:
                    raised.append(exc)
                    return
                unknown.append(body)
            except BaseException as exc:
                raised.append(exc)
                return
            else:
                acked.add(body)
            if len(acked) == BEFORE:
                halfway.set()

    publisher = threading.Thread(target=publish, name="test-publisher")
    consumer.start()
    try:
        publisher.start()
        assert halfway.wait(TIMEOUT)
        old = cluster.partition_leader(TOPIC, 0)
        getattr(cluster, f"{death}_nsqd")(old)
        new = cluster.wait_leader(TOPIC, 0, not_node=old, timeout=TIMEOUT)
        assert new != old
        publisher.join(TIMEOUT * 2)
        assert not publisher.is_alive()
        # A blocking pub() waited for the new leader: none raised "could not reach any nsqd".
        assert raised == []
        assert len(acked) + len(unknown) == TOTAL
        wait_for(lambda: acked <= bodies, TIMEOUT, message=lambda: f"{len(acked - bodies)} lost")
    finally:
        consumer.stop(TIMEOUT)
        producer.close()
    for key, seqs in received.items():
        collapsed = [s for i, s in enumerate(seqs) if i == 0 or s != seqs[i - 1]]
        assert collapsed == sorted(set(collapsed)), f"key {key} out of order: {collapsed}"


def test_a_pub_to_a_killed_leader_waits_and_says_so_when_its_timeout_runs_out():
    """No successor can be elected (one copy): pub() retries until its timeout, then raises a
    timeout saying nothing was sent."""
    from nsqclient.errors import NSQTimeoutError

    with EmbeddedNSQ(youzan=True, nsqd_count=2, registration_ttl=60.0) as c:
        c.create_topic("yz_alone", partitions=1, replica=1)
        c.create_channel("yz_alone", "ch")
        producer = Producer(lookupd_http_addresses=[c.lookupd.http_address], pub_timeout=1.0)
        try:
            producer.pub("yz_alone", b"before")
            c.kill_nsqd(c.partition_leader("yz_alone", 0))
            # (a publish written before the Producer saw the connection drop would be in
            # doubt, maybe_processed=True: this test is about the ones that come after)
            wait_for(lambda: not any(e["connected"] for e in producer.stats()["nsqd"]), TIMEOUT)
            with pytest.raises(NSQTimeoutError, match="nothing was sent"):
                producer.pub("yz_alone", b"after")
            future = producer.pub_async("yz_alone", b"async")
            assert isinstance(future.exception(TIMEOUT), NSQTimeoutError)
        finally:
            producer.close()
