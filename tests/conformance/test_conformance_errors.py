"""Conformance: every error frame nsqd sends, byte for byte, and whether it closes afterwards.

Fatal errors close the connection; E_FIN_FAILED, E_REQ_FAILED and E_TOUCH_FAILED keep it.
Size limits are checked from the size prefix, before the body is read: the tests send only the
header of an oversized command and expect the error at once.
"""

from __future__ import annotations

import struct

import pytest
from rawclient import RawConn, assert_alive, assert_refused

from nsqclient import protocol

U32 = struct.Struct(">I")
UNKNOWN_ID = b"0123456789abcdef"


def sized(body: bytes) -> bytes:
    return U32.pack(len(body)) + body


def fatal(conn: RawConn, text: str) -> None:
    conn.expect_fatal(text)


def subscribed(node, rdy: int | None = None) -> RawConn:
    conn = RawConn(node)
    conn.sub("t", "c", rdy=rdy)
    return conn


# ------------------------------------------------------------------------ commands


@pytest.mark.parametrize(
    "line, text",
    [
        (b"pub t\n", "E_INVALID invalid command pub"),
        (b"FOO\n", "E_INVALID invalid command FOO"),
        (b"Nop\n", "E_INVALID invalid command Nop"),
        (b"\n", "E_INVALID invalid command "),
    ],
)
def test_unknown_or_lowercase_command_is_invalid(nsqd, line, text):
    assert_refused(RawConn(nsqd.nsqd), line, text)


@pytest.mark.parametrize(
    "line, text",
    [
        (b"RDY 1\n", "E_INVALID cannot RDY in current state"),
        (b"FIN " + UNKNOWN_ID + b"\n", "E_INVALID cannot FIN in current state"),
        (b"REQ " + UNKNOWN_ID + b" 0\n", "E_INVALID cannot REQ in current state"),
        (b"TOUCH " + UNKNOWN_ID + b"\n", "E_INVALID cannot TOUCH in current state"),
        (b"CLS\n", "E_INVALID cannot CLS in current state"),
    ],
)
def test_consumer_commands_before_sub_are_invalid(nsqd, line, text):
    assert_refused(RawConn(nsqd.nsqd), line, text)


def test_sub_twice_is_invalid(nsqd):
    assert_refused(
        subscribed(nsqd.nsqd), protocol.sub("t", "d"), "E_INVALID cannot SUB in current state"
    )


def test_sub_after_cls_is_invalid(nsqd):
    with subscribed(nsqd.nsqd) as conn:
        conn.send(protocol.cls())
        conn.expect_response(protocol.CLOSE_WAIT)
        conn.send(protocol.sub("t", "c"))
        conn.expect_fatal("E_INVALID cannot SUB in current state")


def test_cls_twice_is_invalid(nsqd):
    with subscribed(nsqd.nsqd) as conn:
        conn.send(protocol.cls())
        conn.expect_response(protocol.CLOSE_WAIT)
        conn.send(protocol.cls())
        conn.expect_fatal("E_INVALID cannot CLS in current state")


def test_sub_with_heartbeats_disabled_is_invalid(nsqd):
    with RawConn(nsqd.nsqd) as conn:
        conn.identify(heartbeat_interval=-1)
        conn.send(protocol.sub("t", "c"))
        conn.expect_fatal("E_INVALID cannot SUB with heartbeats disabled")


@pytest.mark.parametrize(
    "line, text",
    [
        (b"SUB t\n", "E_INVALID SUB insufficient number of parameters"),
        (b"SUB\n", "E_INVALID SUB insufficient number of parameters"),
        (b"SUB bad!topic c\n", 'E_BAD_TOPIC SUB topic name "bad!topic" is not valid'),
        (b"SUB " + b"t" * 65 + b" c\n", f'E_BAD_TOPIC SUB topic name "{"t" * 65}" is not valid'),
        (b"SUB t bad!chan\n", 'E_BAD_CHANNEL SUB channel name "bad!chan" is not valid'),
        (b"SUB t c#ephemeralx\n", 'E_BAD_CHANNEL SUB channel name "c#ephemeralx" is not valid'),
    ],
)
def test_sub_bad_arguments(nsqd, line, text):
    assert_refused(RawConn(nsqd.nsqd), line, text)


def test_sub_accepts_64_character_names(nsqd):
    with RawConn(nsqd.nsqd) as conn:
        conn.sub("t" * 64, "c" * 64)
        assert_alive(conn)


# ------------------------------------------------------------------------ RDY


def test_rdy_over_max_rdy_count_is_invalid(nsq_cluster_factory):
    cluster = nsq_cluster_factory(max_rdy_count=2)
    with subscribed(cluster.nsqd) as conn:
        conn.rdy(2)
        conn.rdy(3)
        conn.expect_fatal("E_INVALID RDY count 3 out of range 0-2")


def test_rdy_over_default_max_is_invalid(nsqd):
    with subscribed(nsqd.nsqd) as conn:
        conn.rdy(2501)
        conn.expect_fatal("E_INVALID RDY count 2501 out of range 0-2500")


@pytest.mark.parametrize("count", [b"x", b"-1", b"1.5"])
def test_rdy_unparsable_count_is_invalid(nsqd, count):
    assert_refused(
        subscribed(nsqd.nsqd),
        b"RDY " + count + b"\n",
        f"E_INVALID RDY could not parse count {count.decode()}",
    )


def test_rdy_without_count_means_one(nsqd):
    with subscribed(nsqd.nsqd) as conn:
        conn.pub("t", b"1")
        conn.pub("t", b"2")
        conn.send(b"RDY\n")
        first = conn.expect_message()
        assert first.body == b"1"
        conn.fin(first.id)
        assert conn.expect_message().body == b"2"


# ------------------------------------------------------------------------ FIN / REQ / TOUCH


def test_fin_unknown_id_fails_and_keeps_connection(nsqd):
    with subscribed(nsqd.nsqd) as conn:
        conn.fin(UNKNOWN_ID)
        conn.expect_error("E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight")
        assert_alive(conn)
        conn.fin(UNKNOWN_ID)  # and again: still only an error
        conn.expect_error("E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight")


def test_req_unknown_id_fails_and_keeps_connection(nsqd):
    with subscribed(nsqd.nsqd) as conn:
        conn.req(UNKNOWN_ID, 0)
        conn.expect_error("E_REQ_FAILED REQ 0123456789abcdef failed ID not in flight")
        assert_alive(conn)


def test_touch_unknown_id_fails_and_keeps_connection(nsqd):
    with subscribed(nsqd.nsqd) as conn:
        conn.touch(UNKNOWN_ID)
        conn.expect_error("E_TOUCH_FAILED TOUCH 0123456789abcdef failed ID not in flight")
        assert_alive(conn)


def test_fin_twice_fails_the_second_time(nsqd):
    with RawConn(nsqd.nsqd) as producer:
        producer.pub("t", b"x")
    with subscribed(nsqd.nsqd, rdy=1) as conn:
        msg = conn.expect_message()
        conn.fin(msg.id)
        conn.fin(msg.id)
        conn.expect_error(f"E_FIN_FAILED FIN {msg.id.decode()} failed ID not in flight")
        assert_alive(conn)


@pytest.mark.parametrize(
    "line, text",
    [
        (b"FIN\n", "E_INVALID FIN insufficient number of params"),
        (b"FIN 0123\n", "E_INVALID invalid message ID"),
        (b"REQ " + UNKNOWN_ID + b"\n", "E_INVALID REQ insufficient number of params"),
        (b"REQ 0123 0\n", "E_INVALID invalid message ID"),
        (b"REQ " + UNKNOWN_ID + b" soon\n", "E_INVALID REQ could not parse timeout soon"),
        (b"REQ " + UNKNOWN_ID + b" -1\n", "E_INVALID REQ could not parse timeout -1"),
        (b"TOUCH\n", "E_INVALID TOUCH insufficient number of params"),
        (b"TOUCH 0123\n", "E_INVALID invalid message ID"),
    ],
)
def test_fin_req_touch_bad_arguments_are_fatal(nsqd, line, text):
    assert_refused(subscribed(nsqd.nsqd), line, text)


# ------------------------------------------------------------------------ PUB


@pytest.mark.parametrize(
    "data, text",
    [
        (b"PUB\n", "E_INVALID PUB insufficient number of parameters"),
        (b"PUB bad!topic\n" + sized(b"x"), 'E_BAD_TOPIC PUB topic name "bad!topic" is not valid'),
        (b"PUB t\n" + sized(b""), "E_BAD_MESSAGE PUB invalid message body size 0"),
    ],
)
def test_pub_errors(nsqd, data, text):
    assert_refused(RawConn(nsqd.nsqd), data, text)


def test_pub_oversized_body_is_refused_from_the_size_prefix(nsq_cluster_factory):
    cluster = nsq_cluster_factory(max_msg_size=1024)
    with RawConn(cluster.nsqd) as conn:
        conn.pub("t", b"x" * 1024)  # exactly the limit is fine
        conn.send(b"PUB t\n" + U32.pack(1025))  # the body is never sent
        conn.expect_fatal("E_BAD_MESSAGE PUB message too big 1025 > 1024")


def test_pub_huge_size_prefix_is_refused_at_once(nsqd):
    assert_refused(
        RawConn(nsqd.nsqd),
        b"PUB t\n" + U32.pack(0x7FFFFFFF),
        "E_BAD_MESSAGE PUB message too big 2147483647 > 1048576",
    )


def test_pub_negative_size_prefix(nsqd):
    with RawConn(nsqd.nsqd) as conn:
        conn.send(b"PUB t\n" + U32.pack(0xFFFFFFFF))  # -1 as a signed 32-bit size
        conn.expect_fatal("E_BAD_MESSAGE PUB invalid message body size -1")


# ------------------------------------------------------------------------ MPUB


@pytest.mark.parametrize(
    "data, text",
    [
        (b"MPUB\n", "E_INVALID MPUB insufficient number of parameters"),
        # nsqd really sends the code twice for this one
        (
            b"MPUB bad!topic\n" + sized(U32.pack(1) + sized(b"x")),
            'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "bad!topic" is not valid',
        ),
        (b"MPUB t\n" + sized(b""), "E_BAD_BODY MPUB invalid body size 0"),
        (b"MPUB t\n" + sized(U32.pack(0)), "E_BAD_BODY MPUB invalid message count 0"),
        (
            b"MPUB t\n" + sized(U32.pack(1) + sized(b"")),
            "E_BAD_MESSAGE MPUB invalid message(0) body size 0",
        ),
        (
            b"MPUB t\n" + sized(U32.pack(2) + sized(b"ok") + sized(b"")),
            "E_BAD_MESSAGE MPUB invalid message(1) body size 0",
        ),
    ],
)
def test_mpub_errors(nsqd, data, text):
    assert_refused(RawConn(nsqd.nsqd), data, text)


def test_mpub_message_count_above_what_the_body_size_allows(nsqd):
    # at most (max_body_size - 4) / 5 messages fit: each needs a size and one byte
    limit = (5 * 1024 * 1024 - 4) // 5
    assert_refused(
        RawConn(nsqd.nsqd),
        b"MPUB t\n" + U32.pack(8) + U32.pack(limit + 1),
        f"E_BAD_BODY MPUB invalid message count {limit + 1}",
    )


def test_mpub_oversized_body_is_refused_from_the_size_prefix(nsq_cluster_factory):
    cluster = nsq_cluster_factory(lookupd=False, max_body_size=100, max_msg_size=50)
    with RawConn(cluster.nsqd) as conn:
        conn.send(b"MPUB t\n" + U32.pack(101))  # the body is never sent
        conn.expect_fatal("E_BAD_BODY MPUB body too big 101 > 100")


def test_mpub_oversized_message_is_refused(nsq_cluster_factory):
    cluster = nsq_cluster_factory(lookupd=False, max_body_size=100, max_msg_size=50)
    with RawConn(cluster.nsqd) as conn:
        conn.mpub("t", [b"x" * 50])  # exactly the limit is fine
        # the first message's size prefix is enough to refuse
        conn.send(b"MPUB t\n" + U32.pack(60) + U32.pack(1) + U32.pack(51))
        conn.expect_fatal("E_BAD_MESSAGE MPUB message too big 51 > 50")


# ------------------------------------------------------------------------ DPUB


@pytest.mark.parametrize(
    "data, text",
    [
        (b"DPUB t\n", "E_INVALID DPUB insufficient number of parameters"),
        (
            b"DPUB bad!topic 0\n" + sized(b"x"),
            'E_BAD_TOPIC DPUB topic name "bad!topic" is not valid',
        ),
        (b"DPUB t soon\n" + sized(b"x"), "E_INVALID DPUB could not parse timeout soon"),
        (b"DPUB t -5\n" + sized(b"x"), "E_INVALID DPUB could not parse timeout -5"),
        (
            b"DPUB t 3600001\n" + sized(b"x"),
            "E_INVALID DPUB timeout 3600001 out of range 0-3600000",
        ),
        (b"DPUB t 10\n" + sized(b""), "E_BAD_MESSAGE DPUB invalid message body size 0"),
        (
            b"DPUB t 10\n" + U32.pack(1048577),
            "E_BAD_MESSAGE DPUB message too big 1048577 > 1048576",
        ),
    ],
)
def test_dpub_errors(nsqd, data, text):
    assert_refused(RawConn(nsqd.nsqd), data, text)


def test_dpub_range_follows_max_req_timeout(nsq_cluster_factory):
    cluster = nsq_cluster_factory(max_req_timeout=10)
    with RawConn(cluster.nsqd) as conn:
        conn.dpub("t", 10000, b"ok")
        conn.send(protocol.dpub("t", 10001, b"x"))
        conn.expect_fatal("E_INVALID DPUB timeout 10001 out of range 0-10000")


# ------------------------------------------------------------------------ AUTH without auth


def test_auth_when_disabled(nsqd):
    assert_refused(RawConn(nsqd.nsqd), protocol.auth("secret"), "E_AUTH_DISABLED AUTH disabled")


def test_auth_with_empty_body(nsqd):
    assert_refused(
        RawConn(nsqd.nsqd), b"AUTH\n" + U32.pack(0), "E_BAD_BODY AUTH invalid body size 0"
    )


def test_auth_after_sub_is_invalid(nsqd):
    assert_refused(
        subscribed(nsqd.nsqd), protocol.auth("secret"), "E_INVALID cannot AUTH in current state"
    )
