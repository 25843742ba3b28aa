"""youzan failover while lookupd fails, as a random-fault soak on youzan's real cluster saw it:
its nsqlookupd hanging on /lookup while a killed leader's registration lingered, refusing
connections while it restarted, and leaders refusing publishes before storing them
(E_PUB_FAILED exiting, pub timeout while pop wait queue).  Against the embedded youzan cluster
and its fault controls (stall_lookupd, stop_lookupd, refuse_publishes): no pub() raises before
its pub_timeout while a leader can still be found, one that cannot be found raises at
pub_timeout naming why, and a Consumer keeps reading the partitions it holds and follows new
leaders once lookupd answers."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nsqclient import Consumer, Message, Producer
from nsqclient.errors import ConnectionClosedError, NSQTimeoutError
from nsqclient.lookupd._partitions import key_partition
from nsqclient.testing import EmbeddedNSQ
from nsqclient.testing.waiting import wait_for

TIMEOUT = 20.0
TOPIC = "yz_lf"
PARTITIONS = 4
#: the producers' options: lookups time out fast, routes age fast (each publish after that
#: asks lookupd again), and a pub_timeout well above what the faults last
FAST_LOOKUPS: dict[str, Any] = {
    "lookupd_request_timeout": 0.3,
    "lookupd_poll_interval": 0.3,
    "pub_timeout": 15.0,
}


def keys_by_partition(per_partition: int = 2) -> dict[int, list[str]]:
    found: dict[int, list[str]] = defaultdict(list)
    i = 0
    while min((len(found[p]) for p in range(PARTITIONS)), default=0) < per_partition:
        key = f"k{i}"
        partition = key_partition(key, PARTITIONS)
        if len(found[partition]) < per_partition:
            found[partition].append(key)
        i += 1
    return dict(found)


@pytest.fixture
def cluster() -> Iterator[EmbeddedNSQ]:
    # replicator 3 on 3 nodes: a dead leader's partitions get a successor after the TTL
    with EmbeddedNSQ(youzan=True, nsqd_count=3, registration_ttl=1.0) as c:
        c.create_topic(TOPIC, partitions=PARTITIONS, replica=3, multi_part=True)
        c.create_channel(TOPIC, "ch")
        yield c


class Publishers:
    """One thread per key publishing ``key:seq`` with ``pub(key=)`` until stopped; every
    outcome recorded with how long the call took."""

    def __init__(self, producer: Producer, keys: dict[int, list[str]]):
        self.producer = producer
        self.keys = keys
        self.lock = threading.Lock()
        self.acked: dict[int, int] = defaultdict(int)  # partition -> publishes acknowledged
        self.bodies: set[bytes] = set()
        self.unknown: list[bytes] = []  # in flight when a connection died: maybe stored
        self.raised: list[tuple[float, BaseException]] = []
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._run, args=(p, k), name=f"test-pub-{k}")
            for p, ks in keys.items()
            for k in ks
        ]

    def _run(self, partition: int, key: str) -> None:
        seq = 0
        while not self.stop.is_set():
            body = f"{key}:{seq}".encode()
            started = time.monotonic()
            try:
                self.producer.pub(TOPIC, body, key=key)
            except ConnectionClosedError as exc:
                if not exc.maybe_processed:
                    self._raised(started, exc)
                    return
                with self.lock:
                    self.unknown.append(body)
            except BaseException as exc:
                self._raised(started, exc)
                return
            else:
                with self.lock:
                    self.acked[partition] += 1
                    self.bodies.add(body)
            seq += 1

    def _raised(self, started: float, exc: BaseException) -> None:
        with self.lock:
            self.raised.append((time.monotonic() - started, exc))

    def start(self) -> Publishers:
        for t in self.threads:
            t.start()
        return self

    def count(self, partitions: Callable[[int], bool] = lambda p: True) -> int:
        with self.lock:
            return sum(n for p, n in self.acked.items() if partitions(p))

    def grows(self, partitions: Callable[[int], bool], by: int, what: str) -> None:
        """Wait until the partitions chosen have ``by`` more publishes acknowledged."""
        mark = self.count(partitions)
        wait_for(
            lambda: self.raised or self.count(partitions) >= mark + by,
            TIMEOUT,
            message=lambda: f"{what}: {self.count(partitions) - mark} of {by}; {self.raised}",
        )
        assert self.raised == []

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(TIMEOUT * 2)
            assert not t.is_alive(), t.name


def test_pub_rides_out_a_hanging_lookupd_and_a_killed_leader(cluster):
    """lookupd hangs while a leader dies: the partitions whose leaders live go on on their
    last known route, the dead leader's wait, and follow its successor once lookupd answers."""
    producer = Producer(lookupd_http_addresses=[cluster.lookupd.http_address], **FAST_LOOKUPS)
    publishers = Publishers(producer, keys_by_partition())
    try:
        publishers.start().grows(lambda p: True, 40, "before the faults")
        dead = cluster.partition_leader(TOPIC, 0)
        orphaned = {p for p in range(PARTITIONS) if cluster.partition_leader(TOPIC, p) == dead}
        cluster.stall_lookupd(0)
        cluster.kill_nsqd(dead)
        publishers.grows(lambda p: p not in orphaned, 40, "live leaders while lookupd hangs")
        for p in orphaned:
            cluster.wait_leader(TOPIC, p, not_node=dead, timeout=TIMEOUT)
        publishers.grows(lambda p: p not in orphaned, 20, "after the election, lookupd hanging")
        cluster.unstall_lookupd(0)
        publishers.grows(lambda p: p in orphaned, 20, "the successors once lookupd answers")
        publishers.join()
    finally:
        publishers.stop.set()
        producer.close()
    assert publishers.raised == []


def test_pub_rides_out_a_lookupd_restart_and_a_leader_moved_meanwhile(cluster):
    """lookupd refuses connections (restarting): no partition's route is dropped; a leader
    that moves meanwhile answers E_FAILED_ON_NOT_LEADER until lookupd names its successor."""
    producer = Producer(lookupd_http_addresses=[cluster.lookupd.http_address], **FAST_LOOKUPS)
    publishers = Publishers(producer, keys_by_partition())
    try:
        publishers.start().grows(lambda p: True, 40, "before the faults")
        cluster.stop_lookupd(0)
        publishers.grows(lambda p: True, 80, "every partition while lookupd is down")
        old = cluster.partition_leader(TOPIC, 1)
        cluster.move_leader(TOPIC, 1, (old + 1) % 3)
        publishers.grows(lambda p: p != 1, 40, "the partitions that did not move")
        cluster.start_lookupd(0)
        publishers.grows(lambda p: p == 1, 20, "the moved partition once lookupd answers")
        publishers.join()
    finally:
        publishers.stop.set()
        producer.close()
    assert publishers.raised == []


REFUSALS = [
    "E_PUB_FAILED exiting",
    "E_PUB_FAILED pub timeout while pop wait queue",
    "E_FAILED_ON_NOT_LEADER ",
]

#: each publish form, as (name, call(producer, topic, body) -> nsqd's answer)
FORMS: list[tuple[str, Callable[[Producer, str, bytes], Any]]] = [
    ("pub", lambda pr, t, b: pr.pub(t, b, partition=0)),
    ("pub_async", lambda pr, t, b: pr.pub_async(t, b, partition=0).result(TIMEOUT)),
    ("mpub", lambda pr, t, b: pr.mpub(t, [b], partition=0)),
    ("mpub_async", lambda pr, t, b: pr.mpub_async(t, [b], partition=0).result(TIMEOUT)),
    ("traced", lambda pr, t, b: pr.pub(t, b, partition=0, trace_id=5)),
    ("ext", lambda pr, t, b: pr.pub(t, b, partition=0, ext={"k": "v"})),
    ("ext_async", lambda pr, t, b: pr.pub_async(t, b, partition=0, ext={"k": "v"}).result(TIMEOUT)),
]


@pytest.mark.parametrize("refusal", REFUSALS, ids=lambda r: r.split(" ", 1)[-1] or r)
def test_a_leaders_refusals_that_stored_nothing_are_retried_in_every_form(cluster, refusal):
    cluster.create_topic("yz_lf_ext", partitions=1, replica=3, ext=True)
    cluster.create_channel("yz_lf_ext", "ch")
    received: list[bytes] = []
    lock = threading.Lock()

    def handler(message: Message) -> None:
        with lock:
            received.append(message.body)

    lookupd = [cluster.lookupd.http_address]
    producer = Producer(lookupd_http_addresses=lookupd, pub_timeout=TIMEOUT)
    consumers = [
        Consumer(t, "ch", handler, lookupd_http_addresses=lookupd, max_in_flight=10)
        for t in (TOPIC, "yz_lf_ext")
    ]
    sent: list[bytes] = []
    try:
        for c in consumers:
            c.start()
        for name, form in FORMS:
            topic = "yz_lf_ext" if name.startswith("ext") else TOPIC
            cluster.refuse_publishes(cluster.partition_leader(topic, 0), refusal, count=3)
            body = f"{name}:{refusal}".encode()
            form(producer, topic, body)
            sent.append(body)
        wait_for(lambda: len(received) >= len(sent), TIMEOUT, message=lambda: f"{received}")
    finally:
        for c in consumers:
            c.stop(TIMEOUT)
        producer.close()
    assert sorted(received) == sorted(sent)  # each stored once: the refusals stored nothing


def test_a_leader_that_cannot_be_found_raises_at_pub_timeout_naming_why(cluster):
    """lookupd hangs and the leader is dead: nothing can tell where partition 0 is now."""
    producer = Producer(
        lookupd_http_addresses=[cluster.lookupd.http_address],
        lookupd_request_timeout=0.3,
        pub_timeout=2.0,
    )
    try:
        producer.pub(TOPIC, b"before", partition=0)
        cluster.stall_lookupd(0)
        cluster.kill_nsqd(cluster.partition_leader(TOPIC, 0))
        wait_for(lambda: sum(e["connected"] for e in producer.stats()["nsqd"]) == 0, TIMEOUT)
        started = time.monotonic()
        with pytest.raises(NSQTimeoutError) as info:
            producer.pub(TOPIC, b"after", partition=0)
        elapsed = time.monotonic() - started
        future = producer.pub_async(TOPIC, b"async", partition=0)
        assert isinstance(future.exception(TIMEOUT), NSQTimeoutError)
    finally:
        cluster.unstall_lookupd(0)
        producer.close()
    assert 2.0 - 0.2 <= elapsed < 2.0 + 1.0
    text = str(info.value)
    assert "no leader of 'yz_lf' could be reached within 2s" in text
    assert "refused" in text  # the dead leader's port
    assert "lookupd meanwhile" in text and "timed out" in text  # and why lookup could not say
    assert not info.value.maybe_processed


def test_a_partition_lookupd_names_no_leader_for_raises_at_pub_timeout_saying_so():
    with EmbeddedNSQ(youzan=True, nsqd_count=2, registration_ttl=60.0) as c:
        c.create_topic("yz_lf_alone", partitions=2, replica=1)
        c.create_channel("yz_lf_alone", "ch")
        producer = Producer(lookupd_http_addresses=[c.lookupd.http_address], pub_timeout=1.5)
        try:
            producer.pub("yz_lf_alone", b"before", partition=0)
            dead = c.nsqds[c.partition_leader("yz_lf_alone", 0)].tcp_address
            c.kill_nsqd(c.partition_leader("yz_lf_alone", 0))
            # (a publish written before the Producer saw the connection drop would be in
            # doubt, maybe_processed=True: this test is about the ones that come after)
            wait_for(
                lambda: (
                    not any(
                        e["connected"] for e in producer.stats()["nsqd"] if e["address"] == dead
                    )
                ),
                TIMEOUT,
            )
            started = time.monotonic()
            with pytest.raises(NSQTimeoutError, match="lookupd names no leader for partition 0"):
                producer.pub("yz_lf_alone", b"after", partition=0)
            assert time.monotonic() - started >= 1.5 - 0.2
            producer.pub("yz_lf_alone", b"other", partition=1)  # its leader lives
        finally:
            producer.close()


def test_consumer_reads_its_partitions_while_lookupd_hangs_and_follows_new_leaders_after(
    cluster,
):
    """As the Producer's case: lookupd hangs while a leader dies.  The Consumer goes on with
    the partitions it is connected to, and subscribes to the successors once lookupd answers
    (the publishers, on their last known routes, keep the live partitions busy meanwhile)."""
    lookupd = [cluster.lookupd.http_address]
    lock = threading.Lock()
    got: dict[int, int] = defaultdict(int)
    bodies: set[bytes] = set()

    def handler(message: Message) -> None:
        with lock:
            got[message.partition] += 1  # type: ignore[index]
            bodies.add(message.body)

    def received(partitions: Callable[[int], bool]) -> int:
        with lock:
            return sum(n for p, n in got.items() if partitions(p))

    def grows(partitions: Callable[[int], bool], by: int, what: str) -> None:
        mark = received(partitions)
        wait_for(
            lambda: received(partitions) >= mark + by,
            TIMEOUT,
            message=lambda: f"{what}: {received(partitions) - mark} of {by} received",
        )

    consumer = Consumer(
        TOPIC,
        "ch",
        handler,
        lookupd_http_addresses=lookupd,
        max_in_flight=20,
        lookupd_request_timeout=0.3,
        lookupd_poll_interval=0.5,
    )
    producer = Producer(lookupd_http_addresses=lookupd, **FAST_LOOKUPS)
    publishers = Publishers(producer, keys_by_partition())
    consumer.start()
    try:
        wait_for(lambda: len(consumer.connection_counts()) == PARTITIONS, TIMEOUT)
        publishers.start()
        grows(lambda p: True, 40, "before the faults")
        dead = cluster.partition_leader(TOPIC, 0)
        orphaned = {p for p in range(PARTITIONS) if cluster.partition_leader(TOPIC, p) == dead}
        cluster.stall_lookupd(0)
        cluster.kill_nsqd(dead)
        grows(lambda p: p not in orphaned, 40, "the live partitions while lookupd hangs")
        for p in orphaned:
            cluster.wait_leader(TOPIC, p, not_node=dead, timeout=TIMEOUT)
        grows(lambda p: p not in orphaned, 20, "after the election, lookupd hanging")
        cluster.unstall_lookupd(0)
        grows(lambda p: p in orphaned, 20, "the successors once lookupd answers")
        publishers.join()
        assert publishers.raised == []
        wait_for(
            lambda: publishers.bodies <= bodies,
            TIMEOUT,
            message=lambda: f"{len(publishers.bodies - bodies)} acknowledged, not received",
        )
    finally:
        publishers.stop.set()
        consumer.stop(TIMEOUT)
        producer.close()
