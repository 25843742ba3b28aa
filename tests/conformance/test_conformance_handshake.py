"""Conformance: the magic, IDENTIFY (with and without feature negotiation), NOP."""

from __future__ import annotations

import json

import pytest
import requests
from rawclient import RawConn, assert_alive, assert_refused, frame_bytes

from nsqclient import protocol
from nsqclient.protocol import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE

# The IDENTIFY reply's fields in nsqd's order, with their JSON types.
IDENTIFY_REPLY_FIELDS = [
    ("max_rdy_count", int),
    ("version", str),
    ("max_msg_timeout", int),
    ("msg_timeout", int),
    ("tls_v1", bool),
    ("deflate", bool),
    ("deflate_level", int),
    ("max_deflate_level", int),
    ("snappy", bool),
    ("sample_rate", int),
    ("auth_required", bool),
    ("output_buffer_size", int),
    ("output_buffer_timeout", int),
]


def compact(doc: dict) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def nsqd_version(node) -> str:
    return requests.get(f"{node.http_url}/info", timeout=5).json()["version"]


def test_identify_without_feature_negotiation_answers_ok_frame(nsqd):
    with RawConn(nsqd.nsqd) as conn:
        conn.send(protocol.identify({"client_id": "c", "hostname": "h", "user_agent": "ua/1"}))
        assert conn.read_raw_frame() == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
        assert_alive(conn)


def test_identify_feature_negotiation_defaults_byte_exact(nsqd):
    version = nsqd_version(nsqd.nsqd)
    with RawConn(nsqd.nsqd) as conn:
        conn.send(protocol.identify({"feature_negotiation": True}))
        raw = conn.read_raw_frame()
    expected = {
        "max_rdy_count": 2500,
        "version": version,
        "max_msg_timeout": 900000,
        "msg_timeout": 60000,
        "tls_v1": False,
        "deflate": False,
        "deflate_level": 6,
        "max_deflate_level": 6,
        "snappy": False,
        "sample_rate": 0,
        "auth_required": False,
        "output_buffer_size": 16384,
        "output_buffer_timeout": 250,
    }
    assert raw == frame_bytes(FRAME_TYPE_RESPONSE, compact(expected))


def test_identify_reply_field_names_and_types(nsqd):
    with RawConn(nsqd.nsqd) as conn:
        reply = conn.negotiate()
    assert list(reply) == [name for name, _ in IDENTIFY_REPLY_FIELDS]
    for name, kind in IDENTIFY_REPLY_FIELDS:
        assert type(reply[name]) is kind, (name, reply[name])


def test_real_version_is_1_3_0(nsqd, nsq_broker_kind):
    # The embedded NSQ says which version it emulates; the binaries here are v1.3.0.
    with RawConn(nsqd.nsqd) as conn:
        reply = conn.negotiate()
    assert reply["version"] == nsqd_version(nsqd.nsqd)
    if nsq_broker_kind == "real":
        assert reply["version"] == "1.3.0"


def test_identify_reply_values_follow_config(nsq_cluster_factory):
    cluster = nsq_cluster_factory(
        max_rdy_count=50, max_msg_timeout=120, msg_timeout=30, max_deflate_level=4
    )
    with RawConn(cluster.nsqd) as conn:
        reply = conn.negotiate()
    assert reply["max_rdy_count"] == 50
    assert reply["max_msg_timeout"] == 120000
    assert reply["msg_timeout"] == 30000
    # deflate_level is min(requested or 6, max_deflate_level) even when deflate is off
    assert reply["deflate_level"] == 4
    assert reply["max_deflate_level"] == 4


def test_identify_reply_echoes_client_settings(nsqd):
    with RawConn(nsqd.nsqd) as conn:
        reply = conn.negotiate(
            msg_timeout=5000,
            output_buffer_size=1024,
            output_buffer_timeout=100,
            sample_rate=10,
            heartbeat_interval=2000,
        )
    assert reply["msg_timeout"] == 5000
    assert reply["output_buffer_size"] == 1024
    assert reply["output_buffer_timeout"] == 100
    assert reply["sample_rate"] == 10


def test_identify_output_buffer_size_minus_one_means_unbuffered(nsqd):
    with RawConn(nsqd.nsqd) as conn:
        reply = conn.negotiate(output_buffer_size=-1)
    assert reply["output_buffer_size"] == 1
    assert reply["output_buffer_timeout"] == 0


def test_identify_negotiates_deflate_level(nsqd):
    with RawConn(nsqd.nsqd) as conn:
        reply = conn.negotiate(deflate=True, deflate_level=9)
        assert reply["deflate"] is True
        assert reply["deflate_level"] == 6  # capped by max_deflate_level (6)
        assert_alive(conn)


def test_identify_twice_before_sub_is_accepted(nsqd):
    # nsqd only refuses IDENTIFY once the connection has subscribed
    with RawConn(nsqd.nsqd) as conn:
        conn.identify()
        conn.identify()
        assert_alive(conn)


def test_identify_after_sub_is_invalid_and_closes(nsqd):
    with RawConn(nsqd.nsqd) as conn:
        conn.sub("t", "c")
        conn.send(protocol.identify({}))
        conn.expect_fatal("E_INVALID cannot IDENTIFY in current state")


@pytest.mark.parametrize(
    "data, text",
    [
        (
            b"IDENTIFY\n" + len(b"{nope").to_bytes(4, "big") + b"{nope",
            "E_BAD_BODY IDENTIFY failed to decode JSON body",
        ),
        (b"IDENTIFY\n\x00\x00\x00\x00", "E_BAD_BODY IDENTIFY invalid body size 0"),
        (
            protocol.identify({"heartbeat_interval": 500}),
            "E_BAD_BODY IDENTIFY heartbeat interval (500) is invalid",
        ),
        (
            protocol.identify({"msg_timeout": 999}),
            "E_BAD_BODY IDENTIFY msg timeout (999) is invalid",
        ),
        (
            protocol.identify({"sample_rate": 100}),
            "E_BAD_BODY IDENTIFY sample rate (100) is invalid",
        ),
        (
            protocol.identify({"output_buffer_size": 10}),
            "E_BAD_BODY IDENTIFY output buffer size (10) is invalid",
        ),
        (
            protocol.identify({"output_buffer_timeout": 1}),
            "E_BAD_BODY IDENTIFY output buffer timeout (1) is invalid",
        ),
        (
            protocol.identify({"feature_negotiation": True, "snappy": True, "deflate": True}),
            "E_IDENTIFY_FAILED cannot enable both deflate and snappy compression",
        ),
    ],
    ids=[
        "bad_json",
        "empty_body",
        "heartbeat_interval",
        "msg_timeout",
        "sample_rate",
        "output_buffer_size",
        "output_buffer_timeout",
        "snappy_and_deflate",
    ],
)
def test_identify_refused_closes(nsqd, data, text):
    assert_refused(RawConn(nsqd.nsqd), data, text)


def test_identify_body_over_max_body_size_closes(nsq_cluster_factory):
    cluster = nsq_cluster_factory(lookupd=False, max_body_size=100)  # lookupd IDENTIFY > 100 B
    with RawConn(cluster.nsqd) as conn:
        conn.send(b"IDENTIFY\n" + (101).to_bytes(4, "big"))  # no body: checked from the size
        conn.expect_fatal("E_BAD_BODY IDENTIFY body too big 101 > 100")


def test_identify_heartbeat_interval_above_max(nsq_cluster_factory):
    cluster = nsq_cluster_factory(max_heartbeat_interval=10)
    assert_refused(
        RawConn(cluster.nsqd),
        protocol.identify({"heartbeat_interval": 10001}),
        "E_BAD_BODY IDENTIFY heartbeat interval (10001) is invalid",
    )


def test_compression_not_granted_when_disabled(nsq_cluster_factory):
    cluster = nsq_cluster_factory(snappy=False, deflate=False)
    with RawConn(cluster.nsqd) as conn:
        reply = conn.negotiate(snappy=True)
        assert reply["snappy"] is False
        assert reply["deflate"] is False
        assert_alive(conn)  # still plain


def test_commands_work_without_identify(nsqd):
    with RawConn(nsqd.nsqd) as conn:
        assert conn.deliver_one(b"x").body == b"x"


def test_bad_magic_gets_e_bad_protocol_and_close(nsqd):
    with RawConn(nsqd.nsqd, magic=False) as conn:
        conn.send(b"  V1")
        assert conn.read_raw_frame() == frame_bytes(FRAME_TYPE_ERROR, b"E_BAD_PROTOCOL")
        conn.expect_closed()


def test_nop_has_no_reply(nsqd):
    with RawConn(nsqd.nsqd) as conn:
        conn.send(protocol.nop())
        conn.send(protocol.nop())
        # the next frame is the reply to the PUB, not anything caused by the NOPs
        conn.pub("t", b"x")


def test_crlf_line_endings_are_accepted(nsqd):
    with RawConn(nsqd.nsqd) as conn:
        conn.send(b"NOP\r\n")
        conn.send(b"PUB t\r\n\x00\x00\x00\x01x")
        conn.expect_response()
