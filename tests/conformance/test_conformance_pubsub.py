"""Conformance: publishing and consuming over TCP (PUB/MPUB/DPUB, SUB/RDY/FIN/REQ/TOUCH/CLS)."""

from __future__ import annotations

import re
import time

from rawclient import (
    RawConn,
    assert_alive,
    channel_stats,
    scanned_channels,
    stats,
    topic_stats,
)

from nsqclient import protocol
from nsqclient.protocol import FRAME_TYPE_MESSAGE
from nsqclient.testing.waiting import wait_for

HEX_ID = re.compile(rb"^[0-9a-f]{16}$")


def the_client(node, topic, channel):
    c = channel_stats(node, topic, channel)
    assert c is not None and len(c["clients"]) == 1, c
    return c["clients"][0]


def test_pub_sub_rdy_fin_round_trip(nsqd):
    node = nsqd.nsqd
    with RawConn(node) as producer, RawConn(node) as consumer:
        consumer.identify()
        consumer.sub("t", "c", rdy=1)
        before = time.time_ns()
        producer.pub("t", b"hello")
        after = time.time_ns()
        raw = consumer.read_raw_frame()
        # [size][type=2][8B ts][2B attempts][16B id][body]
        assert raw[:4] == (4 + 26 + 5).to_bytes(4, "big")
        assert raw[4:8] == FRAME_TYPE_MESSAGE.to_bytes(4, "big")
        msg = protocol.decode_message(raw[8:])
        assert msg.body == b"hello"
        assert msg.attempts == 1
        assert HEX_ID.match(msg.id), msg.id
        assert before - 1_000_000_000 <= msg.timestamp <= after + 1_000_000_000
        consumer.fin(msg.id)
        wait_for(
            lambda: the_client(node, "t", "c")["finish_count"] == 1,
            message="FIN was not counted",
        )
        c = channel_stats(node, "t", "c")
        assert c["in_flight_count"] == 0
        assert c["message_count"] == 1
        assert c["depth"] == 0


def test_message_ids_are_unique(nsqd):
    with RawConn(nsqd.nsqd) as conn:
        conn.mpub("t", [b"%d" % i for i in range(20)])
        conn.sub("t", "c", rdy=20)
        ids = [m.id for m in conn.expect_messages(20)]
    assert len(set(ids)) == 20
    assert all(HEX_ID.match(i) for i in ids)


def test_rdy_bounds_messages_in_flight(nsqd):
    node = nsqd.nsqd
    with RawConn(node) as conn:
        conn.mpub("t", [b"1", b"2", b"3"])
        conn.sub("t", "c", rdy=2)
        first = conn.expect_messages(2)
        wait_for(
            lambda: (channel_stats(node, "t", "c") or {}).get("depth") == 1,
            message="the third message should wait in the channel",
        )
        client = the_client(node, "t", "c")
        assert client["ready_count"] == 2
        assert client["in_flight_count"] == 2
        conn.fin(first[0].id)
        third = conn.expect_message()
        assert [m.body for m in first] + [third.body] == [b"1", b"2", b"3"]


def test_mpub_count_and_bodies(nsqd):
    node = nsqd.nsqd
    bodies = [b"a", b"bb", b"\x00\xff binary \n", b"x" * 1000]
    with RawConn(node) as conn:
        conn.mpub("t", bodies)
        assert topic_stats(node, "t")["message_count"] == len(bodies)
        conn.sub("t", "c", rdy=10)
        got = conn.expect_messages(len(bodies))
    assert [m.body for m in got] == bodies
    assert all(m.attempts == 1 for m in got)


def test_dpub_is_delivered_after_its_delay(nsqd):
    node = scanned_channels(nsqd, ("t", "c"))
    with RawConn(node) as conn:
        conn.sub("t", "c", rdy=1)
        start = time.monotonic()
        conn.dpub("t", 400, b"later")
        msg = conn.expect_message(timeout=5)
        elapsed = time.monotonic() - start
    assert msg.body == b"later"
    assert msg.attempts == 1
    assert elapsed >= 0.4, f"a 400 ms DPUB arrived after {elapsed:.3f}s"


def test_dpub_waits_as_deferred(nsqd):
    node = nsqd.nsqd
    with RawConn(node) as conn:
        conn.sub("t", "c", rdy=1)
        conn.dpub("t", 60000, b"much later")
        wait_for(
            lambda: (channel_stats(node, "t", "c") or {}).get("deferred_count") == 1,
            message="the DPUB message should be deferred",
        )
        c = channel_stats(node, "t", "c")
        assert c["depth"] == 0
        assert c["in_flight_count"] == 0


def test_dpub_zero_delay_is_immediate(nsqd):
    with RawConn(nsqd.nsqd) as producer, RawConn(nsqd.nsqd) as consumer:
        consumer.sub("t", "c", rdy=1)
        producer.dpub("t", 0, b"now")
        assert consumer.expect_message().body == b"now"


def test_req_with_delay_redelivers_with_attempts_incremented(nsqd):
    node = scanned_channels(nsqd, ("t", "c"))
    with RawConn(node) as conn:
        first = conn.deliver_one(b"again")
        start = time.monotonic()
        conn.req(first.id, 300)
        second = conn.expect_message(timeout=5)
        elapsed = time.monotonic() - start
        assert second.id == first.id
        assert second.body == b"again"
        assert second.timestamp == first.timestamp
        assert (first.attempts, second.attempts) == (1, 2)
        assert elapsed >= 0.3, f"a 300 ms REQ came back after {elapsed:.3f}s"
        conn.fin(second.id)
        wait_for(lambda: the_client(node, "t", "c")["finish_count"] == 1)
        client = the_client(node, "t", "c")
        assert client["requeue_count"] == 1
        assert client["message_count"] == 2
        assert channel_stats(node, "t", "c")["requeue_count"] == 1


def test_req_zero_redelivers_at_once(nsqd):
    with RawConn(nsqd.nsqd) as conn:
        first = conn.deliver_one(b"x")
        conn.req(first.id, 0)
        second = conn.expect_message()
        assert second.id == first.id
        assert second.attempts == 2
        conn.req(second.id, 0)
        assert conn.expect_message().attempts == 3


def test_req_above_max_req_timeout_is_clamped_not_refused(nsq_cluster_factory):
    cluster = nsq_cluster_factory(max_req_timeout=0.5)
    with RawConn(scanned_channels(cluster, ("t", "c"))) as conn:
        first = conn.deliver_one(b"x")
        conn.req(first.id, 3_600_000)  # an hour, clamped to 500 ms
        second = conn.expect_message(timeout=5)
        assert second.id == first.id
        assert second.attempts == 2


def test_touch_extends_the_message_timeout(nsq_cluster_factory):
    cluster = nsq_cluster_factory(msg_timeout=1.0)
    node = scanned_channels(cluster, ("t", "c"))
    with RawConn(node) as conn:
        msg = conn.deliver_one(b"slow")
        start = time.monotonic()
        while time.monotonic() - start < 1.6:  # well past the 1 s timeout
            conn.expect_silence(0.2)  # a redelivery here would mean the message timed out
            conn.touch(msg.id)
        conn.fin(msg.id)
        wait_for(lambda: the_client(node, "t", "c")["finish_count"] == 1)
        c = channel_stats(node, "t", "c")
        assert c["timeout_count"] == 0
        assert c["in_flight_count"] == 0


def test_message_timeout_requeues_with_attempts_2(nsq_cluster_factory):
    cluster = nsq_cluster_factory(msg_timeout=0.5)
    node = scanned_channels(cluster, ("t", "c"))
    with RawConn(node) as conn:
        # Timed from before the publish: nsqd's timer starts at its send, which this side
        # sees only a delivery's latency later.
        start = time.monotonic()
        first = conn.deliver_one(b"forgotten")
        second = conn.expect_message(timeout=5)
        elapsed = time.monotonic() - start
        assert second.id == first.id
        assert second.attempts == 2
        assert elapsed >= 0.5, f"a 500 ms timeout fired after {elapsed:.3f}s"
        assert channel_stats(node, "t", "c")["timeout_count"] == 1
        # a FIN of the redelivered message works
        conn.fin(second.id)
        wait_for(lambda: channel_stats(node, "t", "c")["in_flight_count"] == 0)


def test_identify_msg_timeout_applies_to_the_connection(nsqd):
    with RawConn(scanned_channels(nsqd, ("t", "c"))) as conn:
        conn.identify(msg_timeout=1000)
        first = conn.deliver_one(b"x")
        start = time.monotonic()
        second = conn.expect_message(timeout=5)
        assert second.attempts == 2 and second.id == first.id
        # nsqd's timer ran from its send, a little before this side's clock started: allow
        # for the delivery's own latency (what matters: 1 s, not the default 60 s)
        assert time.monotonic() - start >= 0.9


def test_fin_after_timeout_fails_but_keeps_connection(nsq_cluster_factory):
    cluster = nsq_cluster_factory(msg_timeout=0.5)
    node = scanned_channels(cluster, ("t", "c"))
    with RawConn(node) as conn:
        msg = conn.deliver_one(b"x")
        conn.rdy(0)  # do not take the redelivery
        wait_for(
            lambda: channel_stats(node, "t", "c")["timeout_count"] == 1,
            message="the message should time out",
        )
        conn.fin(msg.id)
        conn.expect_error(f"E_FIN_FAILED FIN {msg.id.decode()} failed ID not in flight")
        assert_alive(conn)


def test_cls_answers_close_wait_and_fin_still_works(nsqd):
    node = nsqd.nsqd
    with RawConn(node) as conn:
        conn.pub("t", b"one")
        conn.sub("t", "c", rdy=5)
        msg = conn.expect_message()
        conn.send(protocol.cls())
        conn.expect_response(protocol.CLOSE_WAIT)
        conn.fin(msg.id)
        wait_for(lambda: the_client(node, "t", "c")["finish_count"] == 1)
        client = the_client(node, "t", "c")
        assert client["ready_count"] == 0  # CLS forces RDY 0
        assert client["in_flight_count"] == 0
        conn.rdy(3)  # ignored while closing, no error
        assert_alive(conn)  # the server keeps the connection open
        conn.pub("t", b"two")
        wait_for(lambda: channel_stats(node, "t", "c")["depth"] == 1)
        assert the_client(node, "t", "c")["ready_count"] == 0


def test_req_and_touch_work_after_cls(nsqd):
    with RawConn(nsqd.nsqd) as conn:
        conn.mpub("t", [b"1", b"2"])
        conn.sub("t", "c", rdy=2)
        a, b = conn.expect_messages(2)
        conn.send(protocol.cls())
        conn.expect_response(protocol.CLOSE_WAIT)
        conn.touch(a.id)
        conn.req(a.id, 0)
        conn.fin(b.id)
        assert_alive(conn)


def test_two_channels_each_get_every_message(nsqd):
    with RawConn(nsqd.nsqd) as p, RawConn(nsqd.nsqd) as c1, RawConn(nsqd.nsqd) as c2:
        c1.sub("t", "one", rdy=10)
        c2.sub("t", "two", rdy=10)
        p.mpub("t", [b"a", b"b"])
        p.pub("t", b"c")
        assert [m.body for m in c1.expect_messages(3)] == [b"a", b"b", b"c"]
        assert [m.body for m in c2.expect_messages(3)] == [b"a", b"b", b"c"]


def test_consumers_on_one_channel_share_its_messages(nsqd):
    node = nsqd.nsqd
    with RawConn(node) as p, RawConn(node) as c1, RawConn(node) as c2:
        c1.sub("t", "c", rdy=1)
        c2.sub("t", "c", rdy=1)
        wait_for(lambda: channel_stats(node, "t", "c")["client_count"] == 2)
        p.mpub("t", [b"a", b"b"])
        got = {c1.expect_message().body, c2.expect_message().body}
        assert got == {b"a", b"b"}


def test_fin_of_another_clients_message_fails_and_keeps_connection(nsqd):
    node = nsqd.nsqd
    with RawConn(node) as c1, RawConn(node) as c2:
        c1.pub("t", b"x")
        c1.sub("t", "c", rdy=1)
        c2.sub("t", "c")
        msg = c1.expect_message()
        c2.fin(msg.id)
        c2.expect_error(f"E_FIN_FAILED FIN {msg.id.decode()} failed client does not own message")
        assert_alive(c2)
        c1.fin(msg.id)
        wait_for(lambda: channel_stats(node, "t", "c")["in_flight_count"] == 0)


def test_messages_published_before_any_channel_go_to_the_first_channel(nsqd):
    node = nsqd.nsqd
    with RawConn(node) as p, RawConn(node) as c1, RawConn(node) as c2:
        p.mpub("t", [b"1", b"2", b"3"])
        assert topic_stats(node, "t")["depth"] == 3
        c1.sub("t", "first", rdy=10)
        assert [m.body for m in c1.expect_messages(3)] == [b"1", b"2", b"3"]
        c2.sub("t", "second", rdy=10)
        second = channel_stats(node, "t", "second")
        assert second["depth"] == 0
        assert second["message_count"] == 0
        p.pub("t", b"4")
        assert c1.expect_message().body == b"4"
        assert c2.expect_message().body == b"4"


def test_ephemeral_channel_disappears_after_last_client_leaves(nsqd):
    node = nsqd.nsqd
    with RawConn(node) as c1, RawConn(node) as c2:
        c1.sub("t", "c#ephemeral")
        c2.sub("t", "c#ephemeral")
        assert channel_stats(node, "t", "c#ephemeral") is not None
    wait_for(
        lambda: channel_stats(node, "t", "c#ephemeral") is None,
        message="the ephemeral channel should be deleted",
    )
    assert topic_stats(node, "t") is not None  # the topic stays


def test_ephemeral_channel_survives_while_a_client_remains(nsqd):
    node = nsqd.nsqd
    with RawConn(node) as c1:
        c1.sub("t", "c#ephemeral")
        with RawConn(node) as c2:
            c2.sub("t", "c#ephemeral")
            wait_for(lambda: channel_stats(node, "t", "c#ephemeral")["client_count"] == 2)
        wait_for(lambda: channel_stats(node, "t", "c#ephemeral")["client_count"] == 1)
        c1.pub("t", b"x")
        c1.rdy(1)
        assert c1.expect_message().body == b"x"


def test_ephemeral_topic_disappears_with_its_last_channel(nsqd):
    node = nsqd.nsqd
    with RawConn(node) as c:
        c.sub("t#ephemeral", "c#ephemeral")
        assert topic_stats(node, "t#ephemeral") is not None
    wait_for(
        lambda: topic_stats(node, "t#ephemeral") is None,
        message="the ephemeral topic should be deleted",
    )


def test_stats_count_producers(nsqd):
    node = nsqd.nsqd
    with RawConn(node) as p:
        p.identify(client_id="prod", hostname="h", user_agent="raw/1")
        p.pub("t", b"x")
        p.mpub("t", [b"y", b"z"])
        producers = stats(node)["producers"]
        assert len(producers) == 1
        assert producers[0]["client_id"] == "prod"
        assert producers[0]["user_agent"] == "raw/1"
        assert producers[0]["pub_counts"] == [{"topic": "t", "count": 3}]
