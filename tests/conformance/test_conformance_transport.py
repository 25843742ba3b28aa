"""Conformance: snappy, deflate and TLS upgrades negotiated by IDENTIFY.

The IDENTIFY reply is sent in the clear; each granted upgrade is then followed by an ``OK``
frame sent through the upgraded stream (TLS first, then compression).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from rawclient import RawConn, assert_alive, assert_refused, channel_stats

from nsqclient import protocol

CERTS = Path(__file__).resolve().parent.parent / "certs"
BIG = b"0123456789abcdef" * 8192  # 128 KiB: several snappy chunks, compressible


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory) -> tuple[str, str]:
    """(cert, key): tests/certs if present, else a throwaway self-signed pair."""
    cert, key = CERTS / "cert.pem", CERTS / "key.pem"
    if cert.is_file() and key.is_file():
        return str(cert), str(key)
    if shutil.which("openssl") is None:
        pytest.skip("no tests/certs and no openssl to make a certificate")
    out = tmp_path_factory.mktemp("certs")
    cert, key = out / "cert.pem", out / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return str(cert), str(key)


def round_trip(node, **features) -> dict:
    """Publish on one upgraded connection and consume on another; return the reply."""
    with RawConn(node) as producer, RawConn(node) as consumer:
        reply = producer.negotiate(**features)
        consumer.negotiate(**features)
        consumer.sub("t", "c", rdy=5)
        producer.pub("t", b"small")
        producer.mpub("t", [BIG, b"tail"])
        got = [m.body for m in consumer.expect_messages(3)]
        assert got == [b"small", BIG, b"tail"]
        client = channel_stats(node, "t", "c")["clients"][0]
        return {"reply": reply, "client": client}


# ------------------------------------------------------------------------ compression


def test_snappy(nsqd):
    result = round_trip(nsqd.nsqd, snappy=True)
    assert result["reply"]["snappy"] is True
    assert result["reply"]["deflate"] is False
    assert result["client"]["snappy"] is True
    assert result["client"]["deflate"] is False


def test_deflate(nsqd):
    result = round_trip(nsqd.nsqd, deflate=True, deflate_level=1)
    assert result["reply"]["deflate"] is True
    assert result["reply"]["deflate_level"] == 1
    assert result["client"]["deflate"] is True


def test_compressed_connection_errors_arrive_compressed(nsqd):
    with RawConn(nsqd.nsqd) as conn:
        conn.negotiate(snappy=True)
        conn.send(b"FOO\n")
        conn.expect_fatal("E_INVALID invalid command FOO")


def test_snappy_disabled_on_the_server(nsq_cluster_factory):
    cluster = nsq_cluster_factory(snappy=False)
    with RawConn(cluster.nsqd) as conn:
        reply = conn.negotiate(snappy=True)
        assert reply["snappy"] is False
        assert_alive(conn)


# ------------------------------------------------------------------------ TLS


def test_tls_not_granted_without_a_certificate(nsqd):
    with RawConn(nsqd.nsqd) as conn:
        reply = conn.negotiate(tls_v1=True)
        assert reply["tls_v1"] is False
        assert_alive(conn)


def test_tls(nsq_cluster_factory, tls_files):
    cert, key = tls_files
    cluster = nsq_cluster_factory(tls_cert=cert, tls_key=key)
    result = round_trip(cluster.nsqd, tls_v1=True)
    assert result["reply"]["tls_v1"] is True
    client = result["client"]
    assert client["tls"] is True
    assert client["tls_version"].startswith("TLS1.")
    assert client["tls_cipher_suite"]


def test_tls_optional_allows_plain_clients(nsq_cluster_factory, tls_files):
    cert, key = tls_files
    cluster = nsq_cluster_factory(tls_cert=cert, tls_key=key)
    with RawConn(cluster.nsqd) as conn:
        reply = conn.negotiate()
        assert reply["tls_v1"] is False
        assert_alive(conn)


@pytest.mark.parametrize("features", [{"snappy": True}, {"deflate": True}])
def test_tls_then_compression(nsq_cluster_factory, tls_files, features):
    cert, key = tls_files
    cluster = nsq_cluster_factory(tls_cert=cert, tls_key=key)
    result = round_trip(cluster.nsqd, tls_v1=True, **features)
    assert result["reply"]["tls_v1"] is True
    assert result["client"]["tls"] is True
    for name in features:
        assert result["reply"][name] is True
        assert result["client"][name] is True


def test_tls_required_refuses_plain_commands(nsq_cluster_factory, tls_files):
    cert, key = tls_files
    cluster = nsq_cluster_factory(tls_cert=cert, tls_key=key, tls_required=2)
    assert_refused(
        RawConn(cluster.nsqd),
        protocol.pub("t", b"x"),
        "E_INVALID cannot PUB in current state (TLS required)",
    )
    with RawConn(cluster.nsqd) as conn:
        conn.identify()  # IDENTIFY itself is allowed in the clear
        conn.send(protocol.sub("t", "c"))
        conn.expect_fatal("E_INVALID cannot SUB in current state (TLS required)")
    with RawConn(cluster.nsqd) as conn:
        conn.negotiate(tls_v1=True)
        assert_alive(conn)
