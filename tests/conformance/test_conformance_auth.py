"""Conformance: AUTH against an --auth-http-address server."""

from __future__ import annotations

import json

import pytest
from rawclient import RawConn, assert_alive, assert_refused, channel_stats

from nsqclient import protocol
from nsqclient.testing.nodes import free_ports
from nsqclient.testing.waiting import wait_for

SECRETS = {
    "good": {
        "identity": "alice",
        "identity_url": "https://auth.example/alice",
        "authorizations": [
            {"topic": "^allowed$", "channels": [".*"], "permissions": ["publish", "subscribe"]},
            {"topic": "^readonly$", "channels": ["^ch$"], "permissions": ["subscribe"]},
        ],
    },
    "nothing": {"identity": "nobody", "authorizations": []},
    "short": {"identity": "bob", "ttl": 1},
}


@pytest.fixture
def authed(nsq_cluster_factory, auth_server):
    server = auth_server(SECRETS)
    cluster = nsq_cluster_factory(auth_http_address=server.address)
    return cluster, server


def compact(doc: object) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def authenticated(node, secret: str = "good") -> RawConn:
    conn = RawConn(node)
    conn.send(protocol.auth(secret))
    reply, _ = conn.expect_json()
    assert reply["identity"] == SECRETS[secret]["identity"], reply
    return conn


def test_identify_says_auth_required(authed):
    cluster, _ = authed
    with RawConn(cluster.nsqd) as conn:
        assert conn.negotiate()["auth_required"] is True


def test_auth_reply_is_identity_json(authed):
    cluster, server = authed
    with RawConn(cluster.nsqd) as conn:
        conn.send(protocol.auth("good"))
        _, raw = conn.expect_json()
        assert raw == compact(
            {
                "identity": "alice",
                "identity_url": "https://auth.example/alice",
                "permission_count": 2,
            }
        )
        conn.pub("allowed", b"x")
    [query] = server.requests
    assert query["secret"] == "good"
    assert query["remote_ip"] == "127.0.0.1"
    assert query["tls"] == "false"


@pytest.mark.parametrize(
    "command, text",
    [
        (protocol.pub("allowed", b"x"), "E_AUTH_FIRST AUTH required before PUB"),
        (protocol.mpub("allowed", [b"x"]), "E_AUTH_FIRST AUTH required before MPUB"),
        (protocol.dpub("allowed", 10, b"x"), "E_AUTH_FIRST AUTH required before DPUB"),
        (protocol.sub("allowed", "c"), "E_AUTH_FIRST AUTH required before SUB"),
    ],
)
def test_commands_before_auth_are_refused(authed, command, text):
    cluster, _ = authed
    assert_refused(RawConn(cluster.nsqd), command, text)


def test_auth_with_wrong_secret_fails(authed):
    cluster, _ = authed
    assert_refused(RawConn(cluster.nsqd), protocol.auth("wrong"), "E_AUTH_FAILED AUTH failed")


def test_auth_with_no_authorizations_is_unauthorized(authed):
    cluster, _ = authed
    assert_refused(
        RawConn(cluster.nsqd),
        protocol.auth("nothing"),
        "E_UNAUTHORIZED AUTH no authorizations found",
    )


def test_auth_twice_is_invalid(authed):
    cluster, _ = authed
    assert_refused(authenticated(cluster.nsqd), protocol.auth("good"), "E_INVALID AUTH already set")


@pytest.mark.parametrize(
    "command, text",
    [
        (protocol.pub("other", b"x"), 'E_UNAUTHORIZED AUTH failed for PUB on "other" ""'),
        (protocol.mpub("other", [b"x"]), 'E_UNAUTHORIZED AUTH failed for MPUB on "other" ""'),
        (protocol.dpub("other", 5, b"x"), 'E_UNAUTHORIZED AUTH failed for DPUB on "other" ""'),
        (protocol.pub("readonly", b"x"), 'E_UNAUTHORIZED AUTH failed for PUB on "readonly" ""'),
        (protocol.sub("other", "ch"), 'E_UNAUTHORIZED AUTH failed for SUB on "other" "ch"'),
        (protocol.sub("readonly", "c2"), 'E_UNAUTHORIZED AUTH failed for SUB on "readonly" "c2"'),
    ],
)
def test_unauthorized_commands(authed, command, text):
    cluster, _ = authed
    assert_refused(authenticated(cluster.nsqd), command, text)


def test_authorized_publish_and_subscribe(authed):
    cluster, _ = authed
    node = cluster.nsqd
    with authenticated(node) as producer, authenticated(node) as consumer:
        producer.pub("allowed", b"1")
        producer.mpub("allowed", [b"2"])
        producer.dpub("allowed", 0, b"3")
        consumer.sub("allowed", "any", rdy=3)
        assert [m.body for m in consumer.expect_messages(3)] == [b"1", b"2", b"3"]
        client = channel_stats(node, "allowed", "any")["clients"][0]
        assert client["authed"] is True
        assert client["auth_identity"] == "alice"
        assert client["auth_identity_url"] == "https://auth.example/alice"
    with authenticated(node) as reader:
        reader.sub("readonly", "ch")
        assert_alive(reader, topic="allowed")


def test_expired_authorization_is_fetched_again(authed):
    cluster, server = authed
    with authenticated(cluster.nsqd, "short") as conn:
        assert len(server.requests) == 1

        def published_after_refresh() -> bool:
            conn.pub("anything", b"x")  # each PUB checks, and refetches once the ttl is over
            return len(server.requests) >= 2

        wait_for(
            published_after_refresh,
            timeout=5,
            interval=0.2,
            message="nsqd should ask the auth server again after the 1 s ttl",
        )
        assert server.requests[-1]["secret"] == "short"


def test_unreachable_auth_server_fails_auth(nsq_cluster_factory):
    [dead_port] = free_ports(1)
    cluster = nsq_cluster_factory(auth_http_address=f"127.0.0.1:{dead_port}")
    assert_refused(RawConn(cluster.nsqd), protocol.auth("good"), "E_AUTH_FAILED AUTH failed")
