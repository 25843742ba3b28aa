"""Conformance: nsqlookupd's HTTP API (1.x shapes, never wrapped in status_code/data) and what
nsqd registers with it."""

from __future__ import annotations

import json
import re
import socket

import pytest
import requests
from rawclient import RawConn

from nsqclient.testing.waiting import wait_for

NSQ_CT = "nsq; version=1.0"
JSON_CT = "application/json; charset=utf-8"
PRODUCER_KEYS = [
    "remote_address",
    "hostname",
    "broadcast_address",
    "tcp_port",
    "http_port",
    "version",
]
NODE_KEYS = PRODUCER_KEYS + ["tombstones", "topics"]


def compact(doc: object) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def lget(cluster, path: str, **params: str) -> requests.Response:
    return requests.get(f"{cluster.lookupd.http_url}{path}", params=params, timeout=5)


def lpost(cluster, path: str, **params: str) -> requests.Response:
    return requests.post(f"{cluster.lookupd.http_url}{path}", params=params, timeout=5)


def npost(node, path: str, **params: str) -> requests.Response:
    return requests.post(f"{node.http_url}{path}", params=params, timeout=5)


def assert_error(resp, status: int, message: str) -> None:
    assert (resp.status_code, resp.content) == (status, compact({"message": message})), (
        resp.status_code,
        resp.content,
    )
    assert resp.headers.get("X-NSQ-Content-Type") == NSQ_CT


def assert_ok_empty(resp) -> None:
    assert (resp.status_code, resp.content) == (200, b""), (resp.status_code, resp.content)


def lookup(cluster, topic: str) -> dict | None:
    resp = lget(cluster, "/lookup", topic=topic)
    if resp.status_code == 404:
        return None
    assert resp.status_code == 200, resp.text
    return resp.json()


def producer_ports(cluster, topic: str) -> list[int]:
    doc = lookup(cluster, topic)
    return sorted(p["tcp_port"] for p in (doc or {}).get("producers", []))


def test_ping_and_info(nsqd):
    resp = lget(nsqd, "/ping")
    assert (resp.status_code, resp.content) == (200, b"OK")
    assert "X-NSQ-Content-Type" not in resp.headers
    resp = lget(nsqd, "/info")
    assert resp.status_code == 200
    assert resp.headers.get("X-NSQ-Content-Type") == NSQ_CT
    assert resp.headers.get("Content-Type") == JSON_CT
    doc = resp.json()
    assert list(doc) == ["version"]
    assert resp.content == compact({"version": doc["version"]})
    if nsqd.kind == "real":
        assert doc["version"] == "1.3.0"


def test_lookup_shape(nsqd):
    node = nsqd.nsqd
    with RawConn(node) as conn:
        conn.sub("t", "c")
        wait_for(
            lambda: lookup(nsqd, "t") and lookup(nsqd, "t")["channels"] == ["c"],
            message="nsqd should register topic t and channel c",
        )
    resp = lget(nsqd, "/lookup", topic="t")
    assert resp.headers.get("X-NSQ-Content-Type") == NSQ_CT
    assert resp.headers.get("Content-Type") == JSON_CT
    doc = resp.json()
    assert list(doc) == ["channels", "producers"]  # no status_code/data wrapper in 1.x
    [producer] = doc["producers"]
    assert list(producer) == PRODUCER_KEYS
    assert re.fullmatch(r"127\.0\.0\.1:\d+", producer["remote_address"])
    assert producer["hostname"] == socket.gethostname()
    assert producer["broadcast_address"] == "127.0.0.1"
    assert producer["tcp_port"] == node.tcp_port
    assert producer["http_port"] == node.http_port
    info = requests.get(f"{node.http_url}/info", timeout=5).json()
    assert producer["version"] == info["version"]
    assert resp.content == compact(doc)  # compact JSON, in this key order


def test_lookup_errors(nsqd):
    assert_error(lget(nsqd, "/lookup", topic="unknown"), 404, "TOPIC_NOT_FOUND")
    assert_error(lget(nsqd, "/lookup"), 400, "MISSING_ARG_TOPIC")
    assert_error(lget(nsqd, "/channels"), 400, "MISSING_ARG_TOPIC")
    assert_error(lget(nsqd, "/nope"), 404, "NOT_FOUND")
    assert_error(lpost(nsqd, "/lookup", topic="t"), 405, "METHOD_NOT_ALLOWED")


def test_topics_channels_nodes(nsq_cluster):
    a, b, c = nsq_cluster.nsqds
    assert lget(nsq_cluster, "/topics").json() == {"topics": []}
    assert lget(nsq_cluster, "/channels", topic="x").json() == {"channels": []}
    npost(a, "/topic/create", topic="x")
    npost(c, "/topic/create", topic="x")
    npost(c, "/channel/create", topic="x", channel="ch")
    npost(b, "/topic/create", topic="y")
    wait_for(
        lambda: (
            producer_ports(nsq_cluster, "x") == sorted([a.tcp_port, c.tcp_port])
            and lookup(nsq_cluster, "x")["channels"] == ["ch"]
            and producer_ports(nsq_cluster, "y") == [b.tcp_port]
        )
    )
    resp = lget(nsq_cluster, "/topics")
    assert list(resp.json()) == ["topics"]
    assert sorted(resp.json()["topics"]) == ["x", "y"]
    assert lget(nsq_cluster, "/channels", topic="x").json() == {"channels": ["ch"]}
    nodes = lget(nsq_cluster, "/nodes").json()
    assert list(nodes) == ["producers"]
    by_port = {n["tcp_port"]: n for n in nodes["producers"]}
    assert set(by_port) == {a.tcp_port, b.tcp_port, c.tcp_port}
    for node in (a, b, c):
        entry = by_port[node.tcp_port]
        assert list(entry) == NODE_KEYS
        assert entry["http_port"] == node.http_port
        assert entry["broadcast_address"] == "127.0.0.1"
        assert len(entry["tombstones"]) == len(entry["topics"])
        assert not any(entry["tombstones"])
    assert sorted(by_port[a.tcp_port]["topics"]) == ["x"]
    assert sorted(by_port[b.tcp_port]["topics"]) == ["y"]
    assert sorted(by_port[c.tcp_port]["topics"]) == ["x"]


def test_node_without_topics(nsqd):
    [entry] = lget(nsqd, "/nodes").json()["producers"]
    assert entry["tombstones"] == []
    assert entry["topics"] == []


def test_lookupd_topic_create_and_delete(nsqd):
    assert_ok_empty(lpost(nsqd, "/topic/create", topic="made"))
    assert "made" in lget(nsqd, "/topics").json()["topics"]
    resp = lget(nsqd, "/lookup", topic="made")
    assert (resp.status_code, resp.content) == (200, b'{"channels":[],"producers":[]}')
    assert_ok_empty(lpost(nsqd, "/channel/create", topic="made", channel="ch"))
    assert lget(nsqd, "/channels", topic="made").json() == {"channels": ["ch"]}
    assert_ok_empty(lpost(nsqd, "/channel/delete", topic="made", channel="ch"))
    assert lget(nsqd, "/channels", topic="made").json() == {"channels": []}
    assert_error(
        lpost(nsqd, "/channel/delete", topic="made", channel="ch"), 404, "CHANNEL_NOT_FOUND"
    )
    assert_ok_empty(lpost(nsqd, "/topic/delete", topic="made"))
    assert "made" not in lget(nsqd, "/topics").json()["topics"]
    assert_error(lget(nsqd, "/lookup", topic="made"), 404, "TOPIC_NOT_FOUND")
    assert_ok_empty(lpost(nsqd, "/topic/delete", topic="never"))  # deleting nothing is fine


def test_lookupd_channel_create_creates_the_topic(nsqd):
    assert_ok_empty(lpost(nsqd, "/channel/create", topic="auto", channel="ch"))
    assert lget(nsqd, "/lookup", topic="auto").json() == {"channels": ["ch"], "producers": []}


def test_lookupd_topic_delete_removes_its_channels(nsqd):
    lpost(nsqd, "/channel/create", topic="gone", channel="ch")
    assert_ok_empty(lpost(nsqd, "/topic/delete", topic="gone"))
    assert lget(nsqd, "/channels", topic="gone").json() == {"channels": []}


@pytest.mark.parametrize(
    "path, params, message",
    [
        ("/topic/create", {}, "MISSING_ARG_TOPIC"),
        ("/topic/create", {"topic": "bad!"}, "INVALID_ARG_TOPIC"),
        ("/topic/delete", {}, "MISSING_ARG_TOPIC"),
        ("/channel/create", {"topic": "t"}, "MISSING_ARG_CHANNEL"),
        ("/channel/create", {"topic": "t", "channel": "bad!"}, "INVALID_ARG_CHANNEL"),
        ("/channel/delete", {"channel": "c"}, "MISSING_ARG_TOPIC"),
        ("/topic/tombstone", {"node": "127.0.0.1:1"}, "MISSING_ARG_TOPIC"),
        ("/topic/tombstone", {"topic": "t"}, "MISSING_ARG_NODE"),
    ],
)
def test_lookupd_admin_bad_arguments(nsqd, path, params, message):
    assert_error(lpost(nsqd, path, **params), 400, message)


def test_tombstone_hides_the_producer(nsq_cluster):
    a, b, _ = nsq_cluster.nsqds
    npost(a, "/topic/create", topic="t")
    npost(b, "/topic/create", topic="t")
    wait_for(lambda: producer_ports(nsq_cluster, "t") == sorted([a.tcp_port, b.tcp_port]))
    assert_ok_empty(lpost(nsq_cluster, "/topic/tombstone", topic="t", node=a.http_address))
    assert producer_ports(nsq_cluster, "t") == [b.tcp_port]
    nodes = {n["tcp_port"]: n for n in lget(nsq_cluster, "/nodes").json()["producers"]}
    assert nodes[a.tcp_port]["topics"] == ["t"]  # /nodes does not filter tombstoned ones
    assert nodes[a.tcp_port]["tombstones"] == [True]
    assert nodes[b.tcp_port]["tombstones"] == [False]


def test_nsqd_registers_topics_and_channels(nsqd):
    node = nsqd.nsqd
    npost(node, "/topic/create", topic="t")
    wait_for(
        lambda: producer_ports(nsqd, "t") == [node.tcp_port],
        message="nsqd should register the topic",
    )
    npost(node, "/channel/create", topic="t", channel="c")
    wait_for(
        lambda: lookup(nsqd, "t")["channels"] == ["c"], message="nsqd should register the channel"
    )


def test_nsqd_unregisters_a_deleted_topic(nsqd):
    node = nsqd.nsqd
    npost(node, "/topic/create", topic="t")
    npost(node, "/channel/create", topic="t", channel="c")
    wait_for(lambda: lookup(nsqd, "t") and lookup(nsqd, "t")["channels"] == ["c"])
    assert_ok_empty(npost(node, "/topic/delete", topic="t"))
    # the producer goes; nsqlookupd 1.3 keeps the (now producer-less) registrations
    wait_for(
        lambda: lookup(nsqd, "t") == {"channels": ["c"], "producers": []},
        message=lambda: f"nsqd should unregister t, lookup is {lookup(nsqd, 't')}",
    )


def test_ephemeral_channel_is_unregistered(nsqd):
    node = nsqd.nsqd
    with RawConn(node) as conn:
        conn.sub("t", "e#ephemeral")
        wait_for(lambda: (lookup(nsqd, "t") or {}).get("channels") == ["e#ephemeral"])
    wait_for(
        lambda: lookup(nsqd, "t")["channels"] == [],
        message="the ephemeral channel should leave nsqlookupd",
    )


def test_stopped_nsqd_leaves_and_restarted_one_returns(nsq_cluster):
    a, b, _ = nsq_cluster.nsqds
    npost(a, "/topic/create", topic="t")
    npost(b, "/topic/create", topic="t")
    wait_for(lambda: producer_ports(nsq_cluster, "t") == sorted([a.tcp_port, b.tcp_port]))
    nsq_cluster.stop_nsqd(0)
    wait_for(
        lambda: producer_ports(nsq_cluster, "t") == [b.tcp_port],
        message="a stopped nsqd should leave nsqlookupd",
    )
    nsq_cluster.start_nsqd(0)
    wait_for(
        lambda: producer_ports(nsq_cluster, "t") == sorted([a.tcp_port, b.tcp_port]),
        message="a restarted nsqd should register its topics again",
    )
    assert nsq_cluster.nsqds[0].tcp_port == a.tcp_port
