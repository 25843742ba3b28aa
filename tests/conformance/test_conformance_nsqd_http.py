"""Conformance: nsqd's HTTP API (/ping, /info, /pub, /mpub, /stats, topic and channel admin)."""

from __future__ import annotations

import json
import socket
import struct
import time

import pytest
from rawclient import RawConn, channel_stats, get, post, stats, topic_stats

from nsqclient.testing.waiting import wait_for

NSQ_CT = "nsq; version=1.0"
JSON_CT = "application/json; charset=utf-8"
U32 = struct.Struct(">I")

STATS_KEYS = ["version", "health", "start_time", "topics", "memory", "producers"]
TOPIC_KEYS = [
    "topic_name",
    "channels",
    "depth",
    "backend_depth",
    "message_count",
    "message_bytes",
    "paused",
    "e2e_processing_latency",
]
CHANNEL_KEYS = [
    "channel_name",
    "depth",
    "backend_depth",
    "in_flight_count",
    "deferred_count",
    "message_count",
    "requeue_count",
    "timeout_count",
    "client_count",
    "clients",
    "paused",
    "e2e_processing_latency",
]
CLIENT_KEYS = [
    "client_id",
    "hostname",
    "version",
    "remote_address",
    "state",
    "ready_count",
    "in_flight_count",
    "message_count",
    "finish_count",
    "requeue_count",
    "connect_ts",
    "sample_rate",
    "deflate",
    "snappy",
    "user_agent",
    "tls",
    "tls_cipher_suite",
    "tls_version",
    "tls_negotiated_protocol",
    "tls_negotiated_protocol_is_mutual",
]
MEMORY_KEYS = [
    "heap_objects",
    "heap_idle_bytes",
    "heap_in_use_bytes",
    "heap_released_bytes",
    "gc_pause_usec_100",
    "gc_pause_usec_99",
    "gc_pause_usec_95",
    "next_gc_bytes",
    "gc_total_runs",
]


def compact(doc: object) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def assert_error(resp, status: int, message: str) -> None:
    assert (resp.status_code, resp.content) == (status, compact({"message": message})), (
        resp.status_code,
        resp.content,
    )
    assert resp.headers.get("X-NSQ-Content-Type") == NSQ_CT
    assert resp.headers.get("Content-Type") == JSON_CT


def assert_ok_empty(resp) -> None:
    assert (resp.status_code, resp.content) == (200, b""), (resp.status_code, resp.content)
    assert resp.headers.get("X-NSQ-Content-Type") == NSQ_CT


def consume(node, topic: str, count: int, channel: str = "c") -> list[bytes]:
    with RawConn(node) as conn:
        conn.sub(topic, channel, rdy=count)
        return [m.body for m in conn.expect_messages(count)]


# ------------------------------------------------------------------------ /ping /info


def test_ping(nsqd):
    resp = get(nsqd.nsqd, "/ping")
    assert (resp.status_code, resp.content) == (200, b"OK")
    assert resp.headers.get("Content-Type") == "text/plain; charset=utf-8"
    assert "X-NSQ-Content-Type" not in resp.headers


def test_info_fields_byte_exact(nsqd):
    node = nsqd.nsqd
    resp = get(node, "/info")
    assert resp.status_code == 200
    assert resp.headers.get("X-NSQ-Content-Type") == NSQ_CT
    assert resp.headers.get("Content-Type") == JSON_CT
    doc = resp.json()
    assert isinstance(doc.get("start_time"), int)
    assert abs(doc["start_time"] - time.time()) < 600
    expected = {
        "version": doc["version"],
        "broadcast_address": "127.0.0.1",
        "hostname": socket.gethostname(),
        "http_port": node.http_port,
        "tcp_port": node.tcp_port,
        "start_time": doc["start_time"],
        "max_heartbeat_interval": 60_000_000_000,  # nanoseconds
        "max_output_buffer_size": 65536,
        "max_output_buffer_timeout": 30_000_000_000,
        "max_deflate_level": 6,
    }
    assert resp.content == compact(expected)


def test_info_follows_config(nsq_cluster_factory):
    cluster = nsq_cluster_factory(
        max_heartbeat_interval=10, max_output_buffer_timeout=1.5, max_deflate_level=3
    )
    doc = get(cluster.nsqd, "/info").json()
    assert doc["max_heartbeat_interval"] == 10_000_000_000
    assert doc["max_output_buffer_timeout"] == 1_500_000_000
    assert doc["max_deflate_level"] == 3


def test_unknown_path_and_wrong_method(nsqd):
    assert_error(get(nsqd.nsqd, "/nope"), 404, "NOT_FOUND")
    assert_error(get(nsqd.nsqd, "/pub", topic="t"), 405, "METHOD_NOT_ALLOWED")


# ------------------------------------------------------------------------ /pub /mpub


def test_http_pub(nsqd):
    node = nsqd.nsqd
    resp = post(node, "/pub", b"via http", topic="t")
    assert (resp.status_code, resp.content) == (200, b"OK")
    assert resp.headers.get("X-NSQ-Content-Type") == NSQ_CT
    assert consume(node, "t", 1) == [b"via http"]


@pytest.mark.parametrize(
    "body, params, status, message",
    [
        (b"", {"topic": "t"}, 400, "MSG_EMPTY"),
        (b"x", {}, 400, "MISSING_ARG_TOPIC"),
        (b"x", {"topic": "bad!topic"}, 400, "INVALID_TOPIC"),
        (b"x", {"topic": "t", "defer": "soon"}, 400, "INVALID_DEFER"),
        (b"x", {"topic": "t", "defer": "-1"}, 400, "INVALID_DEFER"),
        (b"x", {"topic": "t", "defer": "3600001"}, 400, "INVALID_DEFER"),
    ],
)
def test_http_pub_errors(nsqd, body, params, status, message):
    assert_error(post(nsqd.nsqd, "/pub", body, **params), status, message)


def test_http_pub_too_big(nsq_cluster_factory):
    cluster = nsq_cluster_factory(max_msg_size=100)
    assert post(cluster.nsqd, "/pub", b"x" * 100, topic="t").status_code == 200
    assert_error(post(cluster.nsqd, "/pub", b"x" * 101, topic="t"), 413, "MSG_TOO_BIG")


def test_http_pub_defer(nsqd):
    node = nsqd.nsqd
    assert_ok_empty(post(node, "/topic/create", topic="t"))
    assert_ok_empty(post(node, "/channel/create", topic="t", channel="c"))
    resp = post(node, "/pub", b"later", topic="t", defer="60000")
    assert (resp.status_code, resp.content) == (200, b"OK")
    wait_for(
        lambda: channel_stats(node, "t", "c")["deferred_count"] == 1,
        message="/pub?defer= should defer the message",
    )
    assert channel_stats(node, "t", "c")["depth"] == 0


def test_http_mpub_newline_separated(nsqd):
    node = nsqd.nsqd
    resp = post(node, "/mpub", b"one\ntwo\n\nthree\n", topic="t")
    assert (resp.status_code, resp.content) == (200, b"OK")
    assert topic_stats(node, "t")["message_count"] == 3  # the empty line is dropped
    assert consume(node, "t", 3) == [b"one", b"two", b"three"]


@pytest.mark.parametrize("flag", ["true", "1"])
def test_http_mpub_binary(nsqd, flag):
    node = nsqd.nsqd
    bodies = [b"with\nnewline", b"\x00\x01", b"z"]
    payload = U32.pack(len(bodies)) + b"".join(U32.pack(len(b)) + b for b in bodies)
    resp = post(node, "/mpub", payload, topic="t", binary=flag)
    assert (resp.status_code, resp.content) == (200, b"OK")
    assert consume(node, "t", 3) == bodies


def test_http_mpub_errors(nsq_cluster_factory):
    cluster = nsq_cluster_factory(lookupd=False, max_msg_size=10, max_body_size=100)
    node = cluster.nsqd
    assert_error(post(node, "/mpub", b"a\nb"), 400, "MISSING_ARG_TOPIC")
    assert_error(post(node, "/mpub", b"a\nb", topic="bad!"), 400, "INVALID_TOPIC")
    assert_error(post(node, "/mpub", b"x" * 101, topic="t"), 413, "BODY_TOO_BIG")
    assert_error(post(node, "/mpub", b"ok\n" + b"x" * 11, topic="t"), 413, "MSG_TOO_BIG")
    binary = {"topic": "t", "binary": "true"}
    assert_error(post(node, "/mpub", U32.pack(0), **binary), 413, "BAD_BODY")
    assert_error(post(node, "/mpub", U32.pack(1) + U32.pack(0), **binary), 413, "BAD_MESSAGE")
    too_big = U32.pack(1) + U32.pack(11) + b"x" * 11
    assert_error(post(node, "/mpub", too_big, **binary), 413, "BAD_MESSAGE")
    assert topic_stats(node, "t")["message_count"] == 0


# ------------------------------------------------------------------------ /stats


def test_stats_shape_with_clients(nsqd):
    node = nsqd.nsqd
    with RawConn(node) as conn:
        conn.identify(client_id="cid", hostname="host.example", user_agent="raw/0.1")
        conn.mpub("t", [b"1", b"2", b"3"])
        conn.sub("t", "c", rdy=2)
        conn.expect_messages(2)
        wait_for(lambda: channel_stats(node, "t", "c")["depth"] == 1)
        doc = stats(node)
        assert list(doc) == STATS_KEYS
        assert doc["health"] == "OK"
        assert isinstance(doc["start_time"], int)
        assert list(doc["memory"]) == MEMORY_KEYS
        [topic] = doc["topics"]
        assert list(topic) == TOPIC_KEYS
        assert topic["topic_name"] == "t"
        assert topic["message_count"] == 3
        assert topic["message_bytes"] == 3
        assert topic["paused"] is False
        assert topic["e2e_processing_latency"] == {"count": 0, "percentiles": None}
        [channel] = topic["channels"]
        assert list(channel) == CHANNEL_KEYS
        assert channel["channel_name"] == "c"
        assert channel["depth"] == 1
        assert channel["in_flight_count"] == 2
        assert channel["message_count"] == 3
        assert channel["client_count"] == 1
        assert channel["e2e_processing_latency"] == {"count": 0, "percentiles": None}
        [client] = channel["clients"]
        # this connection published too, so its pub_counts appear after user_agent
        after = CLIENT_KEYS.index("user_agent") + 1
        assert list(client) == CLIENT_KEYS[:after] + ["pub_counts"] + CLIENT_KEYS[after:]
        assert client["client_id"] == "cid"
        assert client["hostname"] == "host.example"
        assert client["user_agent"] == "raw/0.1"
        assert client["version"] == "V2"
        host, port = conn.sock.getsockname()
        assert client["remote_address"] == f"{host}:{port}"
        assert client["state"] == 3  # subscribed
        assert client["ready_count"] == 2
        assert client["in_flight_count"] == 2
        assert client["message_count"] == 2
        assert client["finish_count"] == 0
        assert client["pub_counts"] == [{"topic": "t", "count": 3}]
        assert doc["producers"][0]["client_id"] == "cid"


def test_stats_client_fields_of_a_pure_consumer(nsqd):
    node = nsqd.nsqd
    with RawConn(node) as conn:
        conn.sub("t", "c", rdy=7)
        wait_for(lambda: channel_stats(node, "t", "c")["clients"][0]["ready_count"] == 7)
        client = channel_stats(node, "t", "c")["clients"][0]
        assert list(client) == CLIENT_KEYS
        # without IDENTIFY, client_id and hostname are the remote IP
        assert client["client_id"] == "127.0.0.1"
        assert client["hostname"] == "127.0.0.1"
        assert client["user_agent"] == ""
        assert client["tls"] is False
        assert client["tls_version"] == ""
        assert stats(node)["producers"] is None


def test_stats_unknown_topic_gives_null_topics(nsqd):
    doc = stats(nsqd.nsqd, topic="nope")
    assert doc["topics"] is None
    assert list(doc) == STATS_KEYS


def test_stats_without_topics_gives_empty_list(nsqd):
    assert stats(nsqd.nsqd)["topics"] == []


def test_stats_filters_and_options(nsqd):
    node = nsqd.nsqd
    for topic in ("a", "b"):
        assert_ok_empty(post(node, "/topic/create", topic=topic))
        for channel in ("x", "y"):
            assert_ok_empty(post(node, "/channel/create", topic=topic, channel=channel))
    assert [t["topic_name"] for t in stats(node)["topics"]] == ["a", "b"]  # sorted
    doc = stats(node, topic="b", channel="y")
    assert [t["topic_name"] for t in doc["topics"]] == ["b"]
    assert [c["channel_name"] for c in doc["topics"][0]["channels"]] == ["y"]
    assert "memory" not in stats(node, include_mem="false")
    with RawConn(node) as conn:
        conn.sub("a", "x")
        doc = stats(node, topic="a", channel="x", include_clients="false")
        channel = doc["topics"][0]["channels"][0]
        assert channel["client_count"] == 1
        assert channel["clients"] is None


def test_stats_text_format(nsqd):
    resp = get(nsqd.nsqd, "/stats")
    assert resp.status_code == 200
    assert resp.headers.get("X-NSQ-Content-Type") == NSQ_CT
    assert b"Health: OK" in resp.content


# ------------------------------------------------------------------------ topic admin


def test_topic_create_and_delete(nsqd):
    node = nsqd.nsqd
    assert_ok_empty(post(node, "/topic/create", topic="t"))
    assert topic_stats(node, "t")["channels"] == []
    assert_ok_empty(post(node, "/topic/delete", topic="t"))
    assert stats(node)["topics"] == []
    assert_error(post(node, "/topic/delete", topic="t"), 404, "TOPIC_NOT_FOUND")


@pytest.mark.parametrize(
    "path", ["/topic/create", "/topic/delete", "/topic/empty", "/topic/pause", "/topic/unpause"]
)
def test_topic_admin_needs_a_topic(nsqd, path):
    assert_error(post(nsqd.nsqd, path), 400, "MISSING_ARG_TOPIC")


@pytest.mark.parametrize(
    "path", ["/topic/delete", "/topic/empty", "/topic/pause", "/topic/unpause"]
)
def test_topic_admin_unknown_topic(nsqd, path):
    assert_error(post(nsqd.nsqd, path, topic="nope"), 404, "TOPIC_NOT_FOUND")


def test_topic_create_invalid_name(nsqd):
    assert_error(post(nsqd.nsqd, "/topic/create", topic="bad!"), 400, "INVALID_TOPIC")
    assert_error(post(nsqd.nsqd, "/topic/empty", topic="bad!"), 400, "INVALID_TOPIC")


def test_topic_empty(nsqd):
    node = nsqd.nsqd
    post(node, "/mpub", b"1\n2\n3", topic="t")
    assert topic_stats(node, "t")["depth"] == 3  # no channel yet: they wait in the topic
    assert_ok_empty(post(node, "/topic/empty", topic="t"))
    assert topic_stats(node, "t")["depth"] == 0


def test_topic_pause_holds_messages_in_the_topic(nsqd):
    node = nsqd.nsqd
    assert_ok_empty(post(node, "/topic/create", topic="t"))
    assert_ok_empty(post(node, "/channel/create", topic="t", channel="c"))
    assert_ok_empty(post(node, "/topic/pause", topic="t"))
    assert topic_stats(node, "t")["paused"] is True
    post(node, "/pub", b"held", topic="t")
    assert topic_stats(node, "t")["depth"] == 1
    assert channel_stats(node, "t", "c")["depth"] == 0
    assert_ok_empty(post(node, "/topic/unpause", topic="t"))
    assert topic_stats(node, "t")["paused"] is False
    assert consume(node, "t", 1) == [b"held"]


# ------------------------------------------------------------------------ channel admin


def test_channel_create_and_delete(nsqd):
    node = nsqd.nsqd
    assert_error(post(node, "/channel/create", topic="t", channel="c"), 404, "TOPIC_NOT_FOUND")
    assert_ok_empty(post(node, "/topic/create", topic="t"))
    assert_ok_empty(post(node, "/channel/create", topic="t", channel="c"))
    assert channel_stats(node, "t", "c") is not None
    assert_ok_empty(post(node, "/channel/delete", topic="t", channel="c"))
    assert channel_stats(node, "t", "c") is None
    assert_error(post(node, "/channel/delete", topic="t", channel="c"), 404, "CHANNEL_NOT_FOUND")


@pytest.mark.parametrize(
    "params, message",
    [
        ({}, "MISSING_ARG_TOPIC"),
        ({"topic": "bad!"}, "INVALID_ARG_TOPIC"),
        ({"topic": "t"}, "MISSING_ARG_CHANNEL"),
        ({"topic": "t", "channel": "bad!"}, "INVALID_ARG_CHANNEL"),
    ],
)
@pytest.mark.parametrize(
    "path",
    ["/channel/create", "/channel/delete", "/channel/empty", "/channel/pause", "/channel/unpause"],
)
def test_channel_admin_bad_arguments(nsqd, path, params, message):
    assert_error(post(nsqd.nsqd, path, **params), 400, message)


@pytest.mark.parametrize("path", ["/channel/empty", "/channel/pause", "/channel/unpause"])
def test_channel_admin_unknown_channel(nsqd, path):
    node = nsqd.nsqd
    assert_error(post(node, path, topic="t", channel="c"), 404, "TOPIC_NOT_FOUND")
    assert_ok_empty(post(node, "/topic/create", topic="t"))
    assert_error(post(node, path, topic="t", channel="c"), 404, "CHANNEL_NOT_FOUND")


def test_channel_empty(nsqd):
    node = nsqd.nsqd
    assert_ok_empty(post(node, "/topic/create", topic="t"))
    assert_ok_empty(post(node, "/channel/create", topic="t", channel="c"))
    post(node, "/mpub", b"1\n2", topic="t")
    wait_for(lambda: channel_stats(node, "t", "c")["depth"] == 2)
    assert_ok_empty(post(node, "/channel/empty", topic="t", channel="c"))
    assert channel_stats(node, "t", "c")["depth"] == 0


def test_channel_empty_drops_in_flight_messages(nsqd):
    node = nsqd.nsqd
    with RawConn(node) as conn:
        msg = conn.deliver_one(b"x")
        assert_ok_empty(post(node, "/channel/empty", topic="t", channel="c"))
        c = channel_stats(node, "t", "c")
        assert c["in_flight_count"] == 0
        assert c["clients"][0]["in_flight_count"] == 0
        conn.fin(msg.id)
        conn.expect_error(f"E_FIN_FAILED FIN {msg.id.decode()} failed ID not in flight")


def test_channel_pause_stops_delivery_until_unpause(nsqd):
    node = nsqd.nsqd
    with RawConn(node) as conn:
        conn.sub("t", "c", rdy=1)
        assert_ok_empty(post(node, "/channel/pause", topic="t", channel="c"))
        assert channel_stats(node, "t", "c")["paused"] is True
        conn.pub("t", b"held")
        wait_for(lambda: channel_stats(node, "t", "c")["depth"] == 1)
        conn.expect_silence(0.3)
        assert_ok_empty(post(node, "/channel/unpause", topic="t", channel="c"))
        assert channel_stats(node, "t", "c")["paused"] is False
        assert conn.expect_message().body == b"held"
