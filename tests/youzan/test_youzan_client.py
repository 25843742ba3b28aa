"""Consumer and Producer against the embedded NSQ's youzan mode: partitions found by lookup,
keyed and traced publishing, ordered consumption across a leader move, and every error path
youzan's nsqd has for them."""

from __future__ import annotations

import json
import logging
import threading
from collections import defaultdict

import pytest

from nsqclient import Consumer, Message, Producer
from nsqclient.errors import (
    BadPartitionError,
    ExtNotSupportedError,
    FailedOnNotWritableError,
    InvalidTraceIDError,
    NoRouteError,
    SubOrderIsMustError,
)
from nsqclient.http import LookupdClient
from nsqclient.lookupd._partitions import key_partition
from nsqclient.protocol import DecodedMessage
from nsqclient.testing import EmbeddedNSQ
from nsqclient.testing.waiting import wait_for

TIMEOUT = 10.0
PARTITION_SHIFT = 50  # youzan's internal ids carry the partition in their top bits


@pytest.fixture
def cluster():
    with EmbeddedNSQ(youzan=True, nsqd_count=2, lookupd_count=2) as c:
        yield c


@pytest.fixture
def producers(cluster):
    made: list[Producer] = []

    def make(**options) -> Producer:
        producer = Producer(lookupd_http_addresses=[cluster.lookupd.http_address], **options)
        made.append(producer)
        return producer

    yield make
    for producer in made:
        producer.close()


@pytest.fixture
def youzan_consumers(cluster, consumers):
    """conftest's ``consumers``, finding nsqd through the cluster's lookupd by default."""

    def make(topic, channel, handler, start=True, **kwargs) -> Consumer:
        kwargs.setdefault("lookupd_http_addresses", [cluster.lookupd.http_address])
        kwargs.setdefault("lookupd_poll_interval", 0.5)
        return consumers(topic, channel, handler, start=start, **kwargs)

    return make


def test_keyed_publishes_land_on_one_partition_from_two_producers(cluster, producers):
    cluster.create_topic("yz_keys", partitions=4, replica=1, multi_part=True)
    cluster.create_channel("yz_keys", "c")
    keys = [f"order-{i}" for i in range(24)]
    seen: dict[str, set[int]] = defaultdict(set)
    for producer in (producers(), producers()):  # two instances, one after the other
        for key in keys:
            result = producer.pub("yz_keys", key.encode(), key=key, trace_id=1)
            assert result is not None
            assert result.message_id >> PARTITION_SHIFT == result.partition
            seen[key].add(result.partition)
    for key in keys:
        assert seen[key] == {key_partition(key, 4)}, key
    assert set().union(*seen.values()) == {0, 1, 2, 3}  # the keys spread over every partition


def test_traced_results_follow_the_disk_queue(cluster, producers):
    cluster.create_topic("yz_trace", partitions=2, replica=1)
    cluster.create_channel("yz_trace", "c")
    producer = producers()
    results = [
        producer.pub("yz_trace", b"x" * (10 + i), partition=1, trace_id=1000 + i) for i in range(5)
    ]
    assert [r.trace_id for r in results] == [1000 + i for i in range(5)]
    assert all(r.partition == 1 for r in results)
    for before, after in zip(results, results[1:], strict=False):
        assert after.offset == before.offset + before.raw_size
        assert after.message_id > before.message_id
    assert results[1].raw_size == results[0].raw_size + 1
    leader = cluster.nsqds[cluster.partition_leader("yz_trace", 1)]
    assert results[0].nsqd_address == leader.tcp_address
    batch = producer.mpub("yz_trace", [b"a", b"b", b"c"], partition=1, trace_id=[1, 2, 3])
    assert batch.offset == results[-1].offset + results[-1].raw_size


def test_publishes_go_round_robin_over_the_partitions(cluster, producers):
    cluster.create_topic("yz_rr", partitions=4, replica=1, multi_part=True)
    cluster.create_channel("yz_rr", "c")
    producer = producers(trace=True)
    partitions = [producer.pub("yz_rr", b"m").partition for _ in range(8)]
    assert sorted(partitions) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_tracing_switches_at_run_time_and_logs_the_reply(cluster, producers, caplog):
    cluster.create_topic("yz_sw", partitions=1, replica=1)
    cluster.create_channel("yz_sw", "c")
    producer = producers()
    caplog.set_level(logging.INFO, logger="nsqclient.trace")
    assert producer.pub("yz_sw", b"plain") is None
    producer.set_tracing(True)
    result = producer.pub("yz_sw", b"traced")
    assert result is not None and result.trace_id == 0
    producer.set_tracing(False)
    assert producer.pub("yz_sw", b"plain again") is None
    traced = [r.getMessage() for r in caplog.records if r.name == "nsqclient.trace"]
    assert len(traced) == 1
    for field in ("topic=yz_sw", "partition=0", f"message_id={result.message_id}", "offset="):
        assert field in traced[0]


def test_async_publishes_route_too(cluster, producers):
    cluster.create_topic("yz_async", partitions=2, replica=1)
    cluster.create_channel("yz_async", "c")
    producer = producers()
    futures = [producer.pub_async("yz_async", b"m", key="same", trace_id=5) for _ in range(20)]
    results = [f.result(TIMEOUT) for f in futures]
    assert {r.partition for r in results} == {key_partition("same", 2)}
    offsets = [r.offset for r in results]
    assert offsets == sorted(offsets)
    assert producer.mpub_async("yz_async", [b"a", b"b"], partition=0).result(TIMEOUT) == b"OK"


def test_bad_partition_or_key_fails_at_the_call_site(cluster, producers):
    cluster.create_topic("yz_bad", partitions=2, replica=1)
    cluster.create_channel("yz_bad", "c")
    producer = producers()
    with pytest.raises(ValueError, match="has 2 partitions"):
        producer.pub("yz_bad", b"m", partition=2)
    with pytest.raises(ValueError, match="partition"):
        producer.pub("yz_bad", b"m", partition=-1)
    with pytest.raises(TypeError, match="partition key"):
        producer.pub("yz_bad", b"m", key=1.5)
    with pytest.raises(ValueError, match="DPUB"):
        producer.dpub("yz_bad", b"m", 1.0)
    with pytest.raises(ValueError, match="ext"):
        producer.pub("yz_bad", b"m", trace_id=1, ext={"a": "b"})
    direct = Producer(cluster.nsqds[0].tcp_address)
    try:
        with pytest.raises(ValueError, match="lookupd_http_addresses"):
            direct.pub("yz_bad", b"m", key="k")
    finally:
        direct.close()


def test_a_topic_without_a_channel_says_so(cluster, producers):
    cluster.create_topic("yz_nochan", partitions=1, replica=1)
    with pytest.raises(NoRouteError, match="has no channel"):
        producers().pub("yz_nochan", b"m")


def test_a_topic_never_created_says_how_to_create_it(cluster, producers):
    producer = producers()
    with pytest.raises(
        NoRouteError, match=r"knows no topic 'yz_never'.*topic/create\?topic=yz_never"
    ):
        producer.pub("yz_never", b"m")
    future = producer.pub_async("yz_never", b"m")  # the same, in the Future
    assert isinstance(future.exception(10), NoRouteError)


def test_the_topic_create_command_in_the_docs_makes_a_topic(cluster, producers):
    """docs/youzan.rst's curl command, against the embedded cluster's lookupd."""
    import re
    from pathlib import Path

    import requests

    doc = (Path(__file__).parent.parent.parent / "docs" / "youzan.rst").read_text()
    url = re.search(r"curl -X POST '(http://[^']+)'", doc).group(1)  # type: ignore[union-attr]
    url = url.replace("127.0.0.1:4161", cluster.lookupd.http_address).replace("orders", "yz_cli")
    requests.post(url, timeout=10).raise_for_status()
    cluster.create_channel("yz_cli", "ch")
    producer = producers()
    producer.pub("yz_cli", b"m", partition=1)  # two partitions, as the command said
    with pytest.raises(ValueError, match="2 partitions"):
        producer.pub("yz_cli", b"m", partition=2)


def test_ordered_topic_published_without_a_partition_names_the_error(cluster):
    cluster.create_topic("yz_ord_direct", partitions=2, replica=1, ordered=True)
    cluster.create_channel("yz_ord_direct", "c")
    leader = cluster.nsqds[cluster.partition_leader("yz_ord_direct", 0)]
    producer = Producer(leader.tcp_address)
    try:
        with pytest.raises(BadPartitionError):
            producer.pub("yz_ord_direct", b"m")
        producer.pub("yz_ord_direct", b"m", partition=0)  # direct, with its partition: fine
        future = producer.pub_async("yz_ord_direct", b"m", partition=0)  # and asynchronously
        assert future.result(TIMEOUT) == b"OK"
    finally:
        producer.close()


def test_not_writable_is_retried_after_a_fresh_lookup(cluster, producers, caplog):
    cluster.create_topic("yz_ro", partitions=2, replica=1)
    cluster.create_channel("yz_ro", "c")
    impatient = producers(leader_retries=0)
    impatient.pub("yz_ro", b"m", partition=1)  # its route is now cached
    cluster.set_writable("yz_ro", 1, False)
    with pytest.raises(FailedOnNotWritableError):
        impatient.pub("yz_ro", b"m", partition=1)

    patient = producers(leader_retries=8)
    patient.pub("yz_ro", b"m", partition=0)
    caplog.set_level(logging.INFO, logger="nsqclient.producer")
    outcome: list[object] = []
    thread = threading.Thread(
        target=lambda: outcome.append(
            patient.pub("yz_ro", b"late", partition=1, trace_id=9, timeout=TIMEOUT * 2)
        )
    )
    thread.start()
    wait_for(
        lambda: any("looking it up again" in r.getMessage() for r in caplog.records),
        TIMEOUT,
        message="the producer never retried",
    )
    cluster.set_writable("yz_ro", 1, True)
    thread.join(TIMEOUT * 2)
    assert outcome and outcome[0].partition == 1


@pytest.mark.parametrize("replica", [2, 1], ids=["not-leader", "topic-not-exist"])
def test_a_moved_leader_is_followed_by_the_producer(cluster, producers, replica):
    topic = f"yz_move_{replica}"
    cluster.create_topic(topic, partitions=2, replica=replica, multi_part=True)
    cluster.create_channel(topic, "c")
    producer = producers()
    first = producer.pub(topic, b"before", partition=0, trace_id=1)
    old = cluster.partition_leader(topic, 0)
    cluster.move_leader(topic, 0, 1 - old)
    after = producer.pub(topic, b"after", partition=0, trace_id=2)
    assert first.nsqd_address == cluster.nsqds[old].tcp_address
    assert after.nsqd_address == cluster.nsqds[1 - old].tcp_address


def test_message_fields_of_an_extended_traced_topic(cluster, producers, youzan_consumers):
    cluster.create_topic("yz_ext", partitions=2, replica=1, ext=True)
    cluster.create_channel("yz_ext", "c")
    producer = producers()
    header = {"##client_dispatch_tag": "blue", "k": "v"}
    producer.pub("yz_ext", b"with headers", partition=1, ext=header)
    producer.pub("yz_ext", b"traced", partition=0, trace_id=4242)
    got: dict[bytes, Message] = {}
    youzan_consumers("yz_ext", "c", lambda m: got.setdefault(m.body, m), max_in_flight=4)
    wait_for(lambda: len(got) == 2, TIMEOUT, message=lambda: f"got {list(got)}")
    headers, traced = got[b"with headers"], got[b"traced"]
    assert headers.ext == header and headers.tag == "blue"
    assert json.loads(headers.ext_raw) == header
    assert traced.ext is None and traced.tag is None
    assert headers.partition == 1 and headers.internal_id >> PARTITION_SHIFT == 1
    assert traced.trace_id == 4242 and traced.partition == 0
    assert traced.offset is None  # only SUB_ORDERED messages carry their offset


def test_one_partition_only(cluster, producers, youzan_consumers):
    cluster.create_topic("yz_one", partitions=3, replica=1, multi_part=True)
    cluster.create_channel("yz_one", "c")
    producer = producers()
    for p in range(3):
        producer.pub("yz_one", b"p%d" % p, partition=p)
    got: list[Message] = []
    consumer = youzan_consumers("yz_one", "c", got.append, partition=2, max_in_flight=3)
    wait_for(lambda: got, TIMEOUT)
    assert [m.body for m in got] == [b"p2"]
    assert list(consumer.stats()["connections"]) == [
        f"{cluster.nsqds[cluster.partition_leader('yz_one', 2)].tcp_address}#2"
    ]


def test_an_ordered_topic_subscribed_plainly_stops_with_a_clear_error(cluster, producers):
    cluster.create_topic("yz_must", partitions=2, replica=1, ordered=True)
    cluster.create_channel("yz_must", "c")
    consumer = Consumer(
        "yz_must",
        "c",
        lambda m: None,
        lookupd_http_addresses=[cluster.lookupd.http_address],
        lookupd_poll_interval=0.1,
    )
    with pytest.raises(SubOrderIsMustError, match="ordered=True"):
        consumer.run()  # returns (raising) by itself: no endless reconnect loop
    assert isinstance(consumer.error, SubOrderIsMustError)
    assert not consumer.is_running


def test_ordered_direct_needs_a_partition(cluster):
    with pytest.raises(ValueError, match="partition="):
        Consumer("t", "c", lambda m: None, nsqd_tcp_addresses=["127.0.0.1:4150"], ordered=True)


def test_a_lookupd_learns_the_others_of_its_cluster(cluster, producers):
    cluster.create_topic("yz_members", partitions=1, replica=1)
    cluster.create_channel("yz_members", "c")
    producer = producers()
    producer.pub("yz_members", b"m")
    members = producer._router.pool.addresses()
    assert members == [cluster.lookupd.http_address, cluster.lookupds[1].http_address]


def test_ordered_consumption_of_10000_messages_across_a_leader_move(
    cluster, producers, youzan_consumers
):
    """10,000 messages, 40 keys, 4 partitions: every key's messages are handled in the order
    they were published, and every partition's offsets only go up, while partition 0's leader
    moves to the other node mid-run (publishing and consuming both follow it)."""
    topic, total, nkeys = "yz_ordered", 10_000, 40
    cluster.create_topic(topic, partitions=4, replica=2, ordered=True)
    cluster.create_channel(topic, "c")
    lock = threading.Lock()
    per_key: dict[str, list[int]] = defaultdict(list)
    offsets: dict[int, list[int]] = defaultdict(list)
    out_of_order: list[tuple[Message, int]] = []
    seen = set()

    def handle(message: Message) -> None:
        key, seq = message.body.decode().split(":")
        with lock:
            per_key[key].append(int(seq))
            offsets[message.partition].append(message.offset)
            seen.add(message.body)

    youzan_consumers(
        topic,
        "c",
        handle,
        ordered=True,
        max_in_flight=16,
        concurrency=4,
        on_out_of_order=lambda m, last: out_of_order.append((m, last)),
    )
    producer = producers()
    published = threading.Event()

    def publish() -> None:
        for seq in range(total // nkeys):
            for k in range(nkeys):
                key = f"k{k}"
                producer.pub(topic, f"{key}:{seq}".encode(), key=key, timeout=TIMEOUT)
        published.set()

    publisher = threading.Thread(target=publish, name="test-publisher")
    publisher.start()
    wait_for(lambda: len(seen) >= total // 3, TIMEOUT * 3, message="consumption never started")
    old = cluster.partition_leader(topic, 0)
    cluster.move_leader(topic, 0, 1 - old)
    publisher.join(TIMEOUT * 6)
    assert published.is_set()
    wait_for(
        lambda: len(seen) == total,
        TIMEOUT * 3,
        message=lambda: f"{total - len(seen)} of {total} messages never arrived",
    )
    for key, seqs in per_key.items():
        # a message in flight when its leader moved is delivered again: drop repeats in a row
        collapsed = [s for i, s in enumerate(seqs) if i == 0 or s != seqs[i - 1]]
        assert collapsed == list(range(total // nkeys)), key
    for partition, offs in offsets.items():
        assert offs == sorted(offs), partition
    assert out_of_order == []
    assert cluster.partition_leader(topic, 0) == 1 - old


def test_consumer_tracing_logs_each_message(cluster, producers, youzan_consumers, caplog):
    cluster.create_topic("yz_ctrace", partitions=1, replica=1)
    cluster.create_channel("yz_ctrace", "c")
    producers().pub("yz_ctrace", b"m", trace_id=77)
    caplog.set_level(logging.INFO, logger="nsqclient.trace")
    got: list[Message] = []
    consumer = youzan_consumers("yz_ctrace", "c", got.append, start=False)
    consumer.set_tracing(True)
    consumer.start()
    wait_for(lambda: got, TIMEOUT)
    lines = [r.getMessage() for r in caplog.records if r.name == "nsqclient.trace"]
    assert len(lines) == 1 and "trace_id=77" in lines[0] and "partition=0" in lines[0]


def test_offsets_going_down_on_a_partition_run_the_hook():
    calls: list[tuple[bytes, int]] = []
    consumer = Consumer(
        "t",
        "c",
        lambda m: None,
        lookupd_http_addresses=["127.0.0.1:4161"],
        ordered=True,
        on_out_of_order=lambda m, last: calls.append((m.body, last)),
    )

    def message(body: bytes, partition: int, offset: int) -> Message:
        decoded = DecodedMessage(0, 1, b"\0" * 16, body, 1, 0, offset, 10)
        return Message(decoded, partition=partition)

    for m in [message(b"a", 0, 0), message(b"b", 0, 10), message(b"b", 0, 10)]:
        consumer._check_offset(m)  # a redelivery repeats its offset: fine
    consumer._check_offset(message(b"other partition", 1, 0))
    assert calls == []
    consumer._check_offset(message(b"back", 0, 5))
    assert calls == [(b"back", 10)]
    assert consumer.stats()["out_of_order"] == 1


def test_trace_id_with_ext_headers_goes_in_the_header(cluster, producers, youzan_consumers):
    cluster.create_topic("yz_ext_trace", partitions=1, replica=1, ext=True)
    cluster.create_channel("yz_ext_trace", "c")
    producer = producers()
    result = producer.pub("yz_ext_trace", b"m", ext={"k": "v"}, trace_id=31)
    assert result.trace_id == 31 and result.partition == 0
    producer.mpub("yz_ext_trace", [b"a", b"b"], ext={"k": "w"}, trace_id=32)
    got: list[Message] = []
    youzan_consumers("yz_ext_trace", "c", got.append, max_in_flight=3)
    wait_for(lambda: len(got) == 3, TIMEOUT)
    first = next(m for m in got if m.body == b"m")
    assert first.ext == {"k": "v", "##trace_id": "31"} and first.trace_id == 31


def test_ext_headers_on_a_topic_without_extend_support_are_refused(cluster, producers):
    cluster.create_topic("yz_no_ext", partitions=1, replica=1)
    cluster.create_channel("yz_no_ext", "c")
    with pytest.raises(ValueError, match="extend support"):
        producers().pub("yz_no_ext", b"m", ext={"k": "v"})


def test_a_key_needs_the_partition_count(cluster, producers, monkeypatch):
    cluster.create_topic("yz_nometa", partitions=2, replica=1)
    cluster.create_channel("yz_nometa", "c")
    producer = producers()
    real_lookup = LookupdClient.lookup

    def without_meta(self, topic, access=None, metainfo=False, **kwargs):
        result = real_lookup(self, topic, access, False, **kwargs)
        result.pop("meta", None)
        return result

    monkeypatch.setattr(LookupdClient, "lookup", without_meta)
    with pytest.raises(NoRouteError, match="how many partitions"):
        producer.pub("yz_nometa", b"m", key="k")
    assert producer.pub("yz_nometa", b"m", partition=1) is None  # a partition needs no count


def test_a_refused_mpub_ext_closes_its_connection(cluster, producers):
    """youzan's nsqd refuses an MPUB_EXT before reading all of it: the Producer closes that
    connection and publishes the next message on a new one."""
    cluster.create_topic("yz_replace", partitions=1, replica=1, ext=True)
    cluster.create_channel("yz_replace", "c")
    producer = producers()
    producer.pub("yz_replace", b"ok", partition=0)
    slot = next(iter(producer._pool.values()))
    first = slot.conn
    with pytest.raises(InvalidTraceIDError):
        producer.mpub("yz_replace", [b"m", b"n"], partition=0, ext={"##trace_id": "x"})
    producer.pub("yz_replace", b"again", partition=0)
    assert slot.conn is not first
    wait_for(lambda: first.is_closed, TIMEOUT, message="the old connection was left open")


def test_a_connection_left_open_after_a_fatal_error_is_closed_when_replaced(cluster):
    """youzan keeps the connection open after E_EXT_NOT_SUPPORT, which classic rules call
    fatal: the Producer closes it when it makes a new one, instead of leaking its threads."""
    cluster.create_topic("yz_leak", partitions=1, replica=1)
    cluster.create_channel("yz_leak", "c")
    leader = cluster.nsqds[cluster.partition_leader("yz_leak", 0)]
    producer = Producer(leader.tcp_address)
    try:
        producer.pub("yz_leak", b"ok", partition=0)
        first = producer._slots[0].conn
        with pytest.raises(ExtNotSupportedError):
            producer.pub("yz_leak", b"m", partition=0, ext={"k": "v"})
        producer.pub("yz_leak", b"again", partition=0)
        assert producer._slots[0].conn is not first
        wait_for(lambda: first.is_closed, TIMEOUT, message="the old connection was left open")
    finally:
        producer.close()
