"""Connection against a broker (embedded NSQ, or real nsqd with NSQ_BIN_DIR).

What the server sees of the handshake (/stats), the negotiated values kept, TLS, snappy and
deflate round trips, AUTH, heartbeats, dead-server detection, failure of pending requests,
protocol errors, and the threads being joined on close.  Fault controls (stall, drop, inject)
exist only in the embedded NSQ; those tests are marked embedded_only.
"""

from __future__ import annotations

import os
import socket
import ssl
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import nsqclient
from nsqclient import protocol
from nsqclient.config import Config
from nsqclient.conn._connection import Connection
from nsqclient.errors import (
    AuthFailedError,
    AuthRequiredError,
    BadMessageError,
    BadTopicError,
    ConnectionClosedError,
    FinFailedError,
    IdentifyFailedError,
    NSQError,
    NSQTimeoutError,
    ProtocolError,
    ServerError,
    UnauthorizedError,
)
from nsqclient.testing.helpers import free_port, message_count, nsqd_stats
from nsqclient.testing.waiting import wait_for

CERTS = Path(__file__).parent.parent / "certs"
CERT = str(CERTS / "cert.pem")
KEY = str(CERTS / "key.pem")

#: Seconds: the bound of every wait; reached only when something is broken.
TIMEOUT = 10.0
NOP = b"NOP\n"


# ------------------------------------------------------------------------------------------------
# Helpers


class Collector:
    """A ConnectionDelegate that records what the reader hands it."""

    def __init__(self) -> None:
        self.messages: list[protocol.DecodedMessage] = []
        self.server_errors: list[ServerError] = []
        self.close_reasons: list[BaseException | None] = []
        self.closed = threading.Event()

    def on_message(self, conn: Connection, message: protocol.DecodedMessage) -> None:
        self.messages.append(message)

    def on_server_error(self, conn: Connection, error: ServerError) -> None:
        self.server_errors.append(error)

    def on_close(self, conn: Connection, reason: BaseException | None) -> None:
        self.close_reasons.append(reason)
        self.closed.set()


def producer_clients(node: Any) -> list[dict[str, Any]]:
    """The publishing clients nsqd lists under ``producers`` (a client shows up there once it
    has published)."""
    return nsqd_stats(node).get("producers") or []


def client_named(node: Any, client_id: str) -> dict[str, Any]:
    found = [c for c in producer_clients(node) if c["client_id"] == client_id]
    assert len(found) == 1, f"expected one producer client {client_id!r} in /stats, got {found}"
    return found[0]


@pytest.fixture
def silent_server() -> Iterator[str]:
    """``host:port`` of a socket that listens and never accepts: the kernel completes the TCP
    handshake, and then nothing is ever answered (a hung nsqd)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"127.0.0.1:{s.getsockname()[1]}"


def threads_of(conn: Connection) -> list[threading.Thread]:
    names = {f"nsq-reader-{conn.address}", f"nsq-writer-{conn.address}"}
    return [t for t in threading.enumerate() if t.name in names]


def subscribe(
    connect: Any, address: str, topic: str, channel: str, rdy: int, **options: Any
) -> tuple[Connection, Collector]:
    collector = Collector()
    conn = connect(address, delegate=collector, **options)
    assert conn.request(protocol.sub(topic, channel)).result(TIMEOUT) == b"OK"
    conn.send(protocol.rdy(rdy))
    return conn, collector


def receive(conn: Connection, collector: Collector, count: int) -> list[bytes]:
    """Wait for ``count`` messages, FIN them, return their bodies."""
    wait_for(
        lambda: len(collector.messages) >= count,
        TIMEOUT,
        message=lambda: f"got {len(collector.messages)} of {count} messages",
    )
    for message in collector.messages:
        conn.send(protocol.fin(message.id))
    return [m.body for m in collector.messages]


# ------------------------------------------------------------------------------------------------
# Handshake and IDENTIFY


def test_identify_fields_as_the_server_sees_them(nsqd, connect):
    node = nsqd.nsqd
    conn = connect(
        node.tcp_address, client_id="conn-identify", hostname="box.example.test", sample_rate=42
    )
    assert conn.is_connected
    assert conn.request(protocol.pub("conn_identify", b"x")).result(TIMEOUT) == b"OK"
    client = client_named(node, "conn-identify")
    assert client["hostname"] == "box.example.test"
    assert client["user_agent"] == f"nsqclient/{nsqclient.__version__}"
    assert client["sample_rate"] == 42
    assert client["tls"] is False
    assert client["snappy"] is False
    assert client["deflate"] is False


def test_identify_default_names_and_a_custom_user_agent(nsqd, connect):
    node = nsqd.nsqd
    conn = connect(node.tcp_address, user_agent="custom-agent/9")
    assert conn.request(protocol.pub("conn_identify_defaults", b"x")).result(TIMEOUT) == b"OK"
    fqdn = socket.getfqdn()
    [client] = producer_clients(node)
    assert client["client_id"] == fqdn.split(".")[0]
    assert client["hostname"] == fqdn
    assert client["user_agent"] == "custom-agent/9"
    assert client["sample_rate"] == 0


def test_identify_response_is_kept(nsq_cluster_factory, connect):
    cluster = nsq_cluster_factory(lookupd=False, max_rdy_count=77, max_msg_timeout=120.0)
    conn = connect(cluster.nsqd.tcp_address, msg_timeout=30.0)
    resp = conn.identify_response
    assert resp["max_rdy_count"] == 77
    assert resp["max_msg_timeout"] == 120_000
    assert resp["msg_timeout"] == 30_000
    assert resp["auth_required"] is False
    assert isinstance(resp["version"], str) and resp["version"]
    assert conn.max_rdy_count == 77
    assert conn.max_msg_timeout == 120.0
    assert conn.msg_timeout == 30.0
    assert conn.stats()["max_rdy_count"] == 77


def test_heartbeat_interval_nsqd_would_refuse(nsqd):
    # nsqd accepts -1, 0 or 1 s and more; 0.5 s is refused (at Config() or by nsqd).
    with pytest.raises((ValueError, ServerError), match="heartbeat"):
        Connection(nsqd.nsqd.tcp_address, Config(heartbeat_interval=0.5)).connect()


def test_snappy_and_deflate_together_are_refused(nsqd):
    with pytest.raises((ValueError, IdentifyFailedError), match="deflate"):
        Connection(nsqd.nsqd.tcp_address, Config(snappy=True, deflate=True)).connect()


def test_connect_twice_is_refused(nsqd, connect):
    conn = connect(nsqd.nsqd.tcp_address)
    with pytest.raises(NSQError, match="state"):
        conn.connect()
    assert conn.is_connected


# ------------------------------------------------------------------------------------------------
# TLS, snappy, deflate


TRANSPORTS = {
    "plain": {},
    "snappy": {"snappy": True},
    "deflate": {"deflate": True},
    "tls": {"tls_v1": True, "tls_ca_file": CERT},
    "tls+snappy": {"tls_v1": True, "tls_ca_file": CERT, "snappy": True},
    "tls+deflate": {"tls_v1": True, "tls_ca_file": CERT, "deflate": True},
}


@pytest.mark.parametrize("name", list(TRANSPORTS))
def test_round_trip_through_each_transport(name, nsq_cluster_factory, connect):
    options = TRANSPORTS[name]
    cluster = nsq_cluster_factory(lookupd=False, tls_cert=CERT, tls_key=KEY)
    node = cluster.nsqd
    topic = f"conn_rt_{name.replace('+', '_')}"
    bodies = [
        b"small",
        bytes(range(256)) * 4,
        os.urandom(200_000),  # incompressible
        b"\x00" * 300_000,  # very compressible, several snappy chunks
        "unicode ✓".encode(),
    ]
    pub = connect(node.tcp_address, client_id=f"pub-{name}", **options)
    expected_compression = (
        "snappy" if options.get("snappy") else ("deflate" if options.get("deflate") else None)
    )
    assert pub.stats()["compression"] == expected_compression
    if options.get("tls_v1"):
        assert pub.stats()["tls"] in ("TLSv1.2", "TLSv1.3")
    else:
        assert pub.stats()["tls"] is None

    for body in bodies[:3]:
        assert pub.request(protocol.pub(topic, body)).result(TIMEOUT) == b"OK"
    assert pub.request(protocol.mpub(topic, bodies[3:])).result(TIMEOUT) == b"OK"

    client = client_named(node, f"pub-{name}")
    assert client["tls"] is bool(options.get("tls_v1"))
    assert client["snappy"] is bool(options.get("snappy"))
    assert client["deflate"] is bool(options.get("deflate"))

    sub, collector = subscribe(connect, node.tcp_address, topic, "ch", 100, **options)
    assert sorted(receive(sub, collector, len(bodies))) == sorted(bodies)
    assert sub.stats()["compression"] == expected_compression
    assert sub.stats()["bytes_in"] > 0
    assert message_count(node, topic) == len(bodies)


def test_tls_verification_failure_is_a_clear_error(nsq_cluster_factory):
    cluster = nsq_cluster_factory(lookupd=False, tls_cert=CERT, tls_key=KEY)
    # No CA given: the system store does not know our self-signed certificate.
    conn = Connection(cluster.nsqd.tcp_address, Config(tls_v1=True))
    with pytest.raises(ssl.SSLCertVerificationError, match="verification failed") as info:
        conn.connect()
    assert "127.0.0.1" in str(info.value)
    assert conn.is_closed
    assert not threads_of(conn)


def test_tls_host_name_mismatch_is_a_clear_error(nsq_cluster_factory):
    cluster = nsq_cluster_factory(lookupd=False, tls_cert=CERT, tls_key=KEY)
    conn = Connection(
        cluster.nsqd.tcp_address,
        Config(tls_v1=True, tls_ca_file=CERT, tls_server_name="not-this-host.example"),
    )
    with pytest.raises(ssl.SSLCertVerificationError, match="not-this-host.example"):
        conn.connect()
    assert conn.is_closed


def test_tls_unverified_when_asked(nsq_cluster_factory, connect):
    cluster = nsq_cluster_factory(lookupd=False, tls_cert=CERT, tls_key=KEY)
    conn = connect(cluster.nsqd.tcp_address, tls_v1=True, tls_verify=False)
    assert conn.request(protocol.pub("conn_tls_noverify", b"x")).result(TIMEOUT) == b"OK"


def test_tls_requested_from_a_server_without_tls(nsqd):
    conn = Connection(nsqd.nsqd.tcp_address, Config(tls_v1=True, tls_ca_file=CERT))
    with pytest.raises(NSQError, match="does not offer"):
        conn.connect()
    assert conn.is_closed


# ------------------------------------------------------------------------------------------------
# AUTH


def test_auth_round_trip(nsq_cluster_factory, auth_server, connect):
    auth = auth_server({"s3cret": {"identity": "alice", "identity_url": "https://id.example/a"}})
    cluster = nsq_cluster_factory(lookupd=False, auth_http_address=auth.address)
    node = cluster.nsqd
    conn = connect(node.tcp_address, client_id="conn-auth", auth_secret="s3cret")
    assert conn.identify_response["auth_required"] is True
    assert conn.auth_response is not None
    assert conn.auth_response["identity"] == "alice"
    assert conn.auth_response["identity_url"] == "https://id.example/a"
    assert conn.auth_response["permission_count"] == 1  # one authorization (ALLOW_ALL)
    assert conn.request(protocol.pub("conn_auth", b"x")).result(TIMEOUT) == b"OK"
    assert auth.requests and auth.requests[-1]["secret"] == "s3cret"
    client = client_named(node, "conn-auth")
    assert client["authed"] is True
    assert client["auth_identity"] == "alice"


def test_auth_required_and_no_secret(nsq_cluster_factory, auth_server):
    auth = auth_server({"s3cret": {}})
    cluster = nsq_cluster_factory(lookupd=False, auth_http_address=auth.address)
    conn = Connection(cluster.nsqd.tcp_address, Config())
    with pytest.raises(AuthRequiredError, match="auth_secret"):
        conn.connect()
    assert conn.is_closed
    assert not auth.requests


def test_auth_wrong_secret(nsq_cluster_factory, auth_server):
    auth = auth_server({"s3cret": {}})
    cluster = nsq_cluster_factory(lookupd=False, auth_http_address=auth.address)
    conn = Connection(cluster.nsqd.tcp_address, Config(auth_secret="wrong"))
    with pytest.raises(AuthFailedError):
        conn.connect()
    assert conn.is_closed
    assert auth.requests[-1]["secret"] == "wrong"


def test_auth_not_authorized_for_the_topic(nsq_cluster_factory, auth_server, connect):
    grant = {"topic": "^allowed$", "channels": [".*"], "permissions": ["publish"]}
    auth = auth_server({"s3cret": {"authorizations": [grant]}})
    cluster = nsq_cluster_factory(lookupd=False, auth_http_address=auth.address)
    conn = connect(cluster.nsqd.tcp_address, auth_secret="s3cret")
    assert conn.request(protocol.pub("allowed", b"x")).result(TIMEOUT) == b"OK"
    refused = conn.request(protocol.pub("forbidden", b"x"))
    assert isinstance(refused.exception(TIMEOUT), UnauthorizedError)
    assert conn.wait_closed(TIMEOUT)


# ------------------------------------------------------------------------------------------------
# Heartbeats and dead servers


def test_idle_connection_answers_heartbeats_and_stays_connected(nsqd, connect):
    node = nsqd.nsqd
    conn = connect(node.tcp_address, client_id="conn-idle", heartbeat_interval=1.0)
    assert conn.request(protocol.pub("conn_idle", b"x")).result(TIMEOUT) == b"OK"
    first = client_named(node, "conn-idle")
    sent = conn.stats()["bytes_out"]
    # nsqd drops a client silent for 2 heartbeat intervals; three NOPs means the connection
    # outlived that deadline more than once.
    wait_for(
        lambda: conn.stats()["bytes_out"] >= sent + 3 * len(NOP),
        TIMEOUT,
        message=lambda: f"NOPs answered: {(conn.stats()['bytes_out'] - sent) / len(NOP)}",
    )
    assert conn.is_connected
    assert conn.close_reason is None
    still = client_named(node, "conn-idle")
    assert still["remote_address"] == first["remote_address"]
    assert still["connect_ts"] == first["connect_ts"]
    assert conn.request(protocol.pub("conn_idle", b"y")).result(TIMEOUT) == b"OK"


@pytest.mark.embedded_only
def test_stalled_server_is_detected_and_pending_requests_fail(nsqd, connect):
    conn = connect(nsqd.nsqd.tcp_address, heartbeat_interval=1.0)
    assert conn.request(protocol.pub("conn_stall", b"x")).result(TIMEOUT) == b"OK"
    nsqd.stall_nsqd(0)
    try:
        pending = [conn.request(protocol.pub("conn_stall", b"y")) for _ in range(3)]
        assert conn.wait_closed(TIMEOUT), "a silent nsqd was not detected"
        assert isinstance(conn.close_reason, NSQTimeoutError | ConnectionClosedError)
        for future in pending:
            exc = future.exception(timeout=1.0)
            assert isinstance(exc, ConnectionClosedError)
            assert exc.maybe_processed is True
        assert conn.pending_count() == 0
    finally:
        nsqd.unstall_nsqd(0)


@pytest.mark.embedded_only
def test_drop_connections_fails_every_pending_request(nsqd, connect):
    collector = Collector()
    conn = connect(nsqd.nsqd.tcp_address, delegate=collector)
    nsqd.stall_nsqd(0)
    try:
        pending = [conn.request(protocol.pub("conn_drop", b"m%d" % i)) for i in range(20)]
        nsqd.drop_connections(0)
        for future in pending:
            assert isinstance(future.exception(timeout=TIMEOUT), ConnectionClosedError)
    finally:
        nsqd.unstall_nsqd(0)
    assert conn.wait_closed(TIMEOUT)
    # a reset (abort) or an orderly close, depending on timing
    assert isinstance(conn.close_reason, ConnectionClosedError | ConnectionError)
    assert collector.closed.is_set()
    assert conn.pending_count() == 0
    late = conn.request(protocol.pub("conn_drop", b"late"))
    exc = late.exception(timeout=0)
    assert isinstance(exc, ConnectionClosedError) and exc.maybe_processed is False


@pytest.mark.embedded_only
def test_drop_connections_during_a_burst_leaves_nothing_waiting(nsqd, connect):
    node = nsqd.nsqd
    conn = connect(node.tcp_address)
    futures = [conn.request(protocol.pub("conn_burst", b"m%d" % i)) for i in range(3000)]
    nsqd.drop_connections(0)
    oks = 0
    for future in futures:
        exc = future.exception(timeout=TIMEOUT)
        assert exc is None or isinstance(exc, ConnectionClosedError), exc
        oks += exc is None
    assert conn.wait_closed(TIMEOUT)
    assert oks <= message_count(node, "conn_burst")


@pytest.mark.embedded_only
def test_malformed_frame_closes_with_protocol_error(nsqd, connect):
    collector = Collector()
    conn = connect(nsqd.nsqd.tcp_address, delegate=collector)
    assert conn.request(protocol.pub("conn_inject", b"x")).result(TIMEOUT) == b"OK"
    nsqd.inject_frame(0, struct.pack(">Ii", 6, 9) + b"??")  # frame type 9 does not exist
    assert conn.wait_closed(TIMEOUT)
    assert isinstance(conn.close_reason, ProtocolError)
    assert isinstance(collector.close_reasons[0], ProtocolError)
    threads = threads_of(conn)
    conn.close(timeout=TIMEOUT)
    assert not any(t.is_alive() for t in threads)
    assert isinstance(conn.close_reason, ProtocolError)


@pytest.mark.embedded_only
def test_injected_heartbeat_and_unsolicited_error_keep_the_connection(nsqd, connect):
    collector = Collector()
    conn = connect(nsqd.nsqd.tcp_address, delegate=collector)
    sent = conn.stats()["bytes_out"]
    nsqd.inject_frame(0, protocol.encode_frame(protocol.FRAME_TYPE_RESPONSE, b"_heartbeat_"))
    wait_for(lambda: conn.stats()["bytes_out"] >= sent + len(NOP), TIMEOUT)
    nsqd.inject_frame(
        0, protocol.encode_frame(protocol.FRAME_TYPE_ERROR, b"E_FIN_FAILED FIN 0123 failed")
    )
    wait_for(lambda: collector.server_errors, TIMEOUT)
    assert isinstance(collector.server_errors[0], FinFailedError)
    assert conn.request(protocol.pub("conn_inject_ok", b"x")).result(TIMEOUT) == b"OK"
    assert conn.is_connected


# ------------------------------------------------------------------------------------------------
# Fatal errors and pipelining


def test_fatal_error_fails_the_request_and_what_was_queued_behind_it(nsqd, connect):
    node = nsqd.nsqd
    conn = connect(node.tcp_address)
    # Written raw: protocol.pub() would refuse the bad name before sending it.
    bad = conn.request(b"PUB bad*topic\n" + struct.pack(">I", 1) + b"x")
    behind = [conn.request(protocol.pub("conn_behind", b"y")) for _ in range(5)]
    assert isinstance(bad.exception(TIMEOUT), BadTopicError)
    for future in behind:
        exc = future.exception(TIMEOUT)
        assert isinstance(exc, ConnectionClosedError)
        assert exc.maybe_processed is False, "nsqd processes nothing after a fatal error"
    assert conn.wait_closed(TIMEOUT)
    assert isinstance(conn.close_reason, BadTopicError)
    assert message_count(node, "conn_behind") == 0


def test_oversized_body_fails_and_what_was_queued_behind_it_is_not_processed(
    nsq_cluster_factory, connect
):
    # nsqd refuses the size prefix and closes without reading the body: the rest of what we
    # wrote lands on a closed socket, which answers with a reset.  The requests behind the
    # refused one must still be known as "not processed".
    cluster = nsq_cluster_factory(lookupd=False, max_msg_size=1024)
    node = cluster.nsqd
    for attempt in range(5):
        conn = connect(node.tcp_address)
        big = conn.request(protocol.pub("conn_big", b"x" * 200_000))
        behind = [conn.request(protocol.pub("conn_big_behind", b"y")) for _ in range(5)]
        assert isinstance(big.exception(TIMEOUT), BadMessageError), attempt
        for future in behind:
            exc = future.exception(TIMEOUT)
            assert isinstance(exc, ConnectionClosedError)
            assert exc.maybe_processed is False, (attempt, exc, exc.__cause__)
        assert conn.wait_closed(TIMEOUT)
        assert isinstance(conn.close_reason, BadMessageError), conn.close_reason
    assert message_count(node, "conn_big_behind") == 0


def test_pipelined_requests_are_answered_in_order(nsqd, connect):
    node = nsqd.nsqd
    conn = connect(node.tcp_address)
    futures = [conn.request(protocol.pub("conn_pipe", b"%d" % i)) for i in range(2000)]
    assert [f.result(TIMEOUT) for f in futures] == [b"OK"] * 2000
    assert conn.pending_count() == 0
    assert message_count(node, "conn_pipe") == 2000


# ------------------------------------------------------------------------------------------------
# Where there is no nsqd


def test_http_port_is_named_in_the_error(nsqd):
    conn = Connection(nsqd.nsqd.http_address, Config())
    with pytest.raises(ProtocolError, match="HTTP port"):
        conn.connect()
    assert conn.is_closed


def test_closed_port_raises_at_once():
    conn = Connection(f"127.0.0.1:{free_port()}", Config(dial_timeout=30.0))
    with pytest.raises(ConnectionRefusedError):
        conn.connect()
    assert conn.is_closed
    assert isinstance(conn.close_reason, ConnectionRefusedError)
    assert not threads_of(conn)
    exc = conn.request(protocol.pub("t", b"x")).exception(timeout=0)
    assert isinstance(exc, ConnectionClosedError) and exc.maybe_processed is False
    with pytest.raises(ConnectionClosedError):
        conn.send(protocol.nop())


def test_silent_server_handshake_times_out(silent_server):
    conn = Connection(silent_server, Config(handshake_timeout=0.3))
    with pytest.raises(NSQTimeoutError, match="timed out"):
        conn.connect()
    assert conn.is_closed
    assert not threads_of(conn)


def test_server_closing_during_handshake():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(TIMEOUT)
        address = f"127.0.0.1:{listener.getsockname()[1]}"

        def accept_and_close() -> None:
            peer, _ = listener.accept()
            with peer:
                # Read the magic and the whole IDENTIFY first, so that closing sends a FIN
                # (closing with unread bytes would send a reset instead).
                peer.settimeout(TIMEOUT)
                data = b""
                while not data.endswith(b"}"):
                    chunk = peer.recv(4096)
                    if not chunk:
                        break
                    data += chunk

        thread = threading.Thread(target=accept_and_close, name="test-accept-close", daemon=True)
        thread.start()
        conn = Connection(address, Config(handshake_timeout=TIMEOUT))
        with pytest.raises(ConnectionClosedError, match="during handshake"):
            conn.connect()
        thread.join(TIMEOUT)
        assert not thread.is_alive()
    assert conn.is_closed


# ------------------------------------------------------------------------------------------------
# Closing


def test_close_joins_both_threads_and_is_idempotent(nsqd):
    conn = Connection(nsqd.nsqd.tcp_address, Config())
    conn.connect()
    threads = threads_of(conn)
    assert sorted(t.name.split("-")[1] for t in threads) == ["reader", "writer"]
    conn.close(timeout=TIMEOUT)
    assert conn.is_closed
    assert not any(t.is_alive() for t in threads)
    assert not [t for t in threading.enumerate() if t in threads]
    conn.close(timeout=TIMEOUT)
    assert conn.close_reason is None


def test_close_waits_for_pending_requests(nsqd):
    node = nsqd.nsqd
    conn = Connection(node.tcp_address, Config())
    conn.connect()
    futures = [conn.request(protocol.pub("conn_close_pending", b"%d" % i)) for i in range(500)]
    conn.close(timeout=TIMEOUT)
    assert [f.result(0) for f in futures] == [b"OK"] * 500
    assert message_count(node, "conn_close_pending") == 500
    exc = conn.request(protocol.pub("conn_close_pending", b"late")).exception(timeout=0)
    assert isinstance(exc, ConnectionClosedError) and exc.maybe_processed is False


class StateRecorder(Collector):
    """A Collector that also records state changes, and raises from the hook when asked (a
    broken hook must not break the connection)."""

    def __init__(self, raise_in_hook: bool = False) -> None:
        super().__init__()
        self.changes: list[tuple[str, str]] = []
        self.raise_in_hook = raise_in_hook

    def on_state_change(self, conn: Connection, old: Any, new: Any) -> None:
        self.changes.append((old.value, new.value))
        if self.raise_in_hook:
            raise RuntimeError("hook bug")


@pytest.mark.parametrize("raise_in_hook", [False, True], ids=["hook", "broken hook"])
def test_state_changes_are_reported(nsqd, raise_in_hook):
    recorder = StateRecorder(raise_in_hook)
    conn = Connection(nsqd.nsqd.tcp_address, Config(), delegate=recorder)
    conn.connect()
    assert recorder.changes == [("init", "connecting"), ("connecting", "connected")]
    assert conn.request(protocol.pub("conn_states", b"x")).result(TIMEOUT) == b"OK"
    conn.close(timeout=TIMEOUT)
    assert recorder.changes[2:] == [("connected", "closing"), ("closing", "closed")]
    assert recorder.close_reasons == [None]


def test_failed_connect_is_reported():
    recorder = StateRecorder()
    with pytest.raises(OSError):
        Connection(f"127.0.0.1:{free_port()}", Config(), delegate=recorder).connect()
    assert recorder.changes == [("init", "connecting"), ("connecting", "closed")]


def test_stats_count_messages_and_bytes_both_ways(nsqd, connect):
    node = nsqd.nsqd
    pub = connect(node.tcp_address)
    assert pub.request(protocol.pub("conn_counts", b"one"), messages=1).result(TIMEOUT) == b"OK"
    mpub = protocol.mpub("conn_counts", [b"a", b"b", b"c"])
    assert pub.request(mpub, messages=3).result(TIMEOUT) == b"OK"
    stats = pub.stats()
    assert stats["messages_sent"] == 4
    assert stats["bytes_out"] >= len(mpub) and stats["bytes_in"] > 0
    assert stats["pending_requests"] == 0
    sub, collector = subscribe(connect, node.tcp_address, "conn_counts", "ch", 10)
    assert len(receive(sub, collector, 4)) == 4
    stats = sub.stats()
    assert stats["messages_received"] == 4 and stats["messages_sent"] == 0


def test_server_going_away_closes_with_a_reason(nsq_cluster_factory):
    cluster = nsq_cluster_factory(lookupd=False)
    collector = StateRecorder()
    conn = Connection(cluster.nsqd.tcp_address, Config(), delegate=collector)
    conn.connect()
    try:
        cluster.stop_nsqd(0)
        assert collector.closed.wait(TIMEOUT)
        assert isinstance(collector.close_reasons[0], ConnectionClosedError)
        assert conn.is_closed
        assert collector.changes[-1] == ("connected", "closed")
        threads = threads_of(conn)
    finally:
        conn.close(timeout=TIMEOUT)
    assert collector.changes.count(("connected", "closed")) == 1
    assert not any(t.is_alive() for t in threads)
