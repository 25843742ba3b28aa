"""The embedded nsqd's own behaviour, over raw sockets and plain HTTP.

These tests pin what nsqclient.testing.EmbeddedNSQ does (the bytes nsqd 1.3 sends); the
conformance suite separately runs shared scenarios against embedded and real brokers.
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import zlib
from pathlib import Path

import pytest
import requests
import snappy

from nsqclient import protocol as p
from nsqclient.testing import EmbeddedNSQ
from nsqclient.testing.auth_server import AuthServer
from nsqclient.testing.waiting import wait_for

CERTS = Path(__file__).parent.parent / "certs"
TIMEOUT = 5.0


class Closed(Exception):
    """The server closed the connection."""


_OPEN: list[Raw] = []


@pytest.fixture(autouse=True)
def _close_raw_sockets():
    yield
    while _OPEN:
        _OPEN.pop().close()


class Raw:
    """A raw NSQ client socket that parses frames itself (so it can switch to compression
    mid-stream: bytes already received after the upgrade point get decompressed)."""

    def __init__(self, address: str, magic: bytes = p.MAGIC_V2):
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=TIMEOUT)
        _OPEN.append(self)
        self.buf = b""
        self.inflate = None
        self.deflate = None
        if magic:
            self.sock.sendall(magic)

    def send(self, data: bytes) -> None:
        if self.deflate is not None:
            data = self.deflate(data)
        self.sock.sendall(data)

    def compress_with(self, deflate, inflate) -> None:
        """Switch to a compressed stream; bytes not yet parsed are compressed already."""
        self.deflate, self.inflate = deflate, inflate
        self.buf = inflate(self.buf)

    def _recv(self) -> None:
        data = self.sock.recv(1 << 20)
        if not data:
            raise Closed()
        self.buf += self.inflate(data) if self.inflate is not None else data

    def frame(self, skip_heartbeats: bool = True) -> p.Frame:
        """The next frame (heartbeats skipped unless asked for)."""
        while True:
            while len(self.buf) < 4 or len(self.buf) < 4 + struct.unpack(">I", self.buf[:4])[0]:
                self._recv()
            size = struct.unpack(">I", self.buf[:4])[0]
            frame_type = struct.unpack(">i", self.buf[4:8])[0]
            f = p.Frame(frame_type, self.buf[8 : 4 + size])
            self.buf = self.buf[4 + size :]
            if skip_heartbeats and f == (p.FRAME_TYPE_RESPONSE, p.HEARTBEAT):
                continue
            return f

    def response(self) -> bytes:
        f = self.frame()
        assert f.type == p.FRAME_TYPE_RESPONSE, f
        return f.data

    def error(self) -> bytes:
        f = self.frame()
        assert f.type == p.FRAME_TYPE_ERROR, f
        return f.data

    def message(self) -> p.DecodedMessage:
        f = self.frame()
        assert f.type == p.FRAME_TYPE_MESSAGE, f
        return p.decode_message(f.data)

    def identify(self, **data) -> dict:
        data.setdefault("feature_negotiation", True)
        self.send(p.identify(data))
        return json.loads(self.response())

    def expect_closed(self) -> None:
        with pytest.raises((Closed, ConnectionError)):
            while True:
                self.frame()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def cluster():
    with EmbeddedNSQ(nsqd_count=1, lookupd=False) as c:
        yield c


@pytest.fixture
def conn(cluster):
    c = Raw(cluster.nsqd.tcp_address)
    yield c
    c.close()


def http(cluster, method: str, path: str, **kwargs) -> requests.Response:
    return requests.request(method, cluster.nsqd.http_url + path, timeout=TIMEOUT, **kwargs)


def stats(cluster, topic: str) -> dict:
    data = http(cluster, "GET", f"/stats?format=json&topic={topic}").json()
    return data["topics"][0] if data["topics"] else {}


# --------------------------------------------------------------------------------------------
# TCP protocol


def test_pub_sub_round_trip(cluster):
    pub = Raw(cluster.nsqd.tcp_address)
    pub.send(p.pub("rt", b"hello") + p.mpub("rt", [b"a", b"b"]) + p.dpub("rt", 0, b"c"))
    assert [pub.response() for _ in range(3)] == [b"OK", b"OK", b"OK"]
    sub = Raw(cluster.nsqd.tcp_address)
    sub.send(p.sub("rt", "ch") + p.rdy(10))
    assert sub.response() == b"OK"
    msgs = [sub.message() for _ in range(4)]
    assert sorted(m.body for m in msgs) == [b"a", b"b", b"c", b"hello"]
    for m in msgs:
        assert m.attempts == 1
        assert len(m.id) == 16 and all(c in b"0123456789abcdef" for c in m.id)
        sub.send(p.fin(m.id))
    sub.send(p.nop())
    wait_for(lambda: stats(cluster, "rt")["channels"][0]["in_flight_count"] == 0)
    assert stats(cluster, "rt")["message_count"] == 4
    pub.close()
    sub.close()


def test_identify_reply_is_nsqds(conn):
    conn.send(p.identify({"feature_negotiation": True, "msg_timeout": 5000}))
    raw = conn.response()
    assert raw == (
        b'{"max_rdy_count":2500,"version":"1.3.0","max_msg_timeout":900000,"msg_timeout":5000,'
        b'"tls_v1":false,"deflate":false,"deflate_level":6,"max_deflate_level":6,'
        b'"snappy":false,"sample_rate":0,"auth_required":false,"output_buffer_size":16384,'
        b'"output_buffer_timeout":250}'
    )


def test_identify_without_feature_negotiation_says_ok(conn):
    conn.send(p.identify({"client_id": "x"}))
    assert conn.response() == b"OK"


@pytest.mark.parametrize(
    "field, value, text",
    [
        ("heartbeat_interval", 500, b"IDENTIFY heartbeat interval (500) is invalid"),
        ("output_buffer_size", 10, b"IDENTIFY output buffer size (10) is invalid"),
        ("sample_rate", 100, b"IDENTIFY sample rate (100) is invalid"),
        ("msg_timeout", 999, b"IDENTIFY msg timeout (999) is invalid"),
    ],
)
def test_identify_validation_is_fatal(conn, field, value, text):
    conn.send(p.identify({field: value}))
    assert conn.error() == b"E_BAD_BODY " + text
    conn.expect_closed()


def test_bad_magic_gets_e_bad_protocol_and_close(cluster):
    c = Raw(cluster.nsqd.tcp_address, magic=b"  V1")
    assert c.error() == b"E_BAD_PROTOCOL"
    c.expect_closed()


def test_commands_are_case_sensitive(conn):
    conn.send(b"nop\n")
    assert conn.error() == b"E_INVALID invalid command nop"
    conn.expect_closed()


def test_fin_failure_keeps_the_connection_open(conn):
    conn.send(p.sub("keep", "c") + p.fin(b"0123456789abcdef") + p.pub("keep", b"x"))
    assert conn.response() == b"OK"
    assert conn.error() == b"E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight"
    assert conn.response() == b"OK"


def test_bad_topic_is_fatal(conn):
    conn.send(b"PUB a!b\n" + struct.pack(">I", 1) + b"x")
    assert conn.error() == b'E_BAD_TOPIC PUB topic name "a!b" is not valid'
    conn.expect_closed()


def test_message_size_checked_from_the_prefix(conn):
    # only the size prefix is sent: nsqd refuses without waiting for the body
    conn.send(b"PUB big\n" + struct.pack(">I", 2 * 1024 * 1024))
    assert conn.error() == b"E_BAD_MESSAGE PUB message too big 2097152 > 1048576"
    conn.expect_closed()


def test_mpub_body_size_checked_from_the_prefix(conn):
    conn.send(b"MPUB big\n" + struct.pack(">I", 6 * 1024 * 1024))
    assert conn.error() == b"E_BAD_BODY MPUB body too big 6291456 > 5242880"
    conn.expect_closed()


def test_rdy_above_max_is_fatal(conn):
    conn.send(p.sub("rdy", "c") + p.rdy(2501))
    assert conn.response() == b"OK"
    assert conn.error() == b"E_INVALID RDY count 2501 out of range 0-2500"
    conn.expect_closed()


def test_dpub_above_max_req_timeout_is_refused(conn):
    conn.send(p.dpub("d", 3600001, b"x"))
    assert conn.error() == b"E_INVALID DPUB timeout 3600001 out of range 0-3600000"


def test_req_above_max_is_clamped_not_refused(cluster, conn):
    conn.send(p.pub("reqc", b"x") + p.sub("reqc", "c") + p.rdy(1))
    assert conn.response() == b"OK"
    assert conn.response() == b"OK"
    m = conn.message()
    conn.send(p.req(m.id, 10 * 3600 * 1000) + p.nop())
    wait_for(lambda: stats(cluster, "reqc")["channels"][0]["deferred_count"] == 1)
    ch = stats(cluster, "reqc")["channels"][0]
    assert ch["requeue_count"] == 1 and ch["in_flight_count"] == 0


def test_req_negative_is_a_parse_error(conn):
    conn.send(p.sub("reqn", "c") + b"REQ 0123456789abcdef -1\n")
    assert conn.response() == b"OK"
    assert conn.error() == b"E_INVALID REQ could not parse timeout -1"
    conn.expect_closed()


def test_cls_answers_close_wait_and_keeps_the_connection(conn):
    conn.send(p.pub("cls", b"x") + p.sub("cls", "c") + p.rdy(1))
    assert conn.response() == b"OK"
    assert conn.response() == b"OK"
    m = conn.message()
    conn.send(p.cls())
    assert conn.response() == b"CLOSE_WAIT"
    # still open: FIN works, RDY is ignored, PUB is answered
    conn.send(p.fin(m.id) + p.rdy(5) + p.pub("cls", b"y"))
    assert conn.response() == b"OK"


def test_req_requeues_with_attempts_counting(conn):
    conn.send(p.pub("reqa", b"x") + p.sub("reqa", "c") + p.rdy(1))
    conn.response(), conn.response()
    m = conn.message()
    conn.send(p.req(m.id, 0))
    again = conn.message()
    assert (again.id, again.attempts) == (m.id, 2)


def test_touch_keeps_a_message_in_flight(cluster, conn):
    conn.send(p.identify({"msg_timeout": 1000}) + p.pub("touch", b"x"))
    assert conn.response() == b"OK"
    assert conn.response() == b"OK"
    conn.send(p.sub("touch", "c") + p.rdy(1))
    assert conn.response() == b"OK"
    m = conn.message()
    conn.send(p.touch(m.id))
    conn.send(p.fin(m.id) + p.pub("touch", b"y"))
    assert conn.response() == b"OK"
    assert conn.message().body == b"y"
    assert stats(cluster, "touch")["channels"][0]["timeout_count"] == 0


def test_message_timeout_requeues_with_attempts_2(cluster, conn):
    conn.send(p.identify({"msg_timeout": 1000}) + p.pub("mto", b"x"))
    conn.response(), conn.response()
    conn.send(p.sub("mto", "c") + p.rdy(1))
    assert conn.response() == b"OK"
    first = conn.message()
    second = conn.message()  # arrives after ~1s, without FIN
    assert (first.attempts, second.attempts) == (1, 2)
    assert first.id == second.id
    assert stats(cluster, "mto")["channels"][0]["timeout_count"] == 1


def test_heartbeat_timeout_closes_the_client(conn):
    conn.send(p.identify({"heartbeat_interval": 1000}))
    conn.response()
    assert conn.frame(skip_heartbeats=False) == (p.FRAME_TYPE_RESPONSE, p.HEARTBEAT)
    # no NOP answered: nsqd's read deadline (2x heartbeat) passes and it hangs up
    conn.expect_closed()


def test_deferred_publish_arrives_later(cluster, conn):
    conn.send(p.sub("dpub", "c") + p.rdy(5))
    assert conn.response() == b"OK"
    pub = Raw(cluster.nsqd.tcp_address)
    pub.send(p.dpub("dpub", 300, b"later") + p.pub("dpub", b"now"))
    assert conn.message().body == b"now"
    assert stats(cluster, "dpub")["channels"][0]["deferred_count"] == 1
    assert conn.message().body == b"later"
    pub.close()


def test_messages_published_before_any_channel_go_to_the_first(cluster):
    pub = Raw(cluster.nsqd.tcp_address)
    pub.send(p.mpub("early", [b"1", b"2", b"3"]))
    assert pub.response() == b"OK"
    assert stats(cluster, "early")["depth"] == 3
    a = Raw(cluster.nsqd.tcp_address)
    a.send(p.sub("early", "first") + p.rdy(10))
    a.response()
    assert sorted(a.message().body for _ in range(3)) == [b"1", b"2", b"3"]
    b = Raw(cluster.nsqd.tcp_address)
    b.send(p.sub("early", "second"))
    b.response()
    ch = {c["channel_name"]: c for c in stats(cluster, "early")["channels"]}
    assert ch["second"]["depth"] == 0 and ch["second"]["message_count"] == 0
    for c in (pub, a, b):
        c.close()


def test_every_channel_gets_a_copy_and_clients_share_a_channel(cluster):
    subs = []
    for channel in ("one", "one", "two"):
        c = Raw(cluster.nsqd.tcp_address)
        c.send(p.sub("fan", channel) + p.rdy(1))
        c.response()
        subs.append(c)
    pub = Raw(cluster.nsqd.tcp_address)
    pub.send(p.mpub("fan", [b"a", b"b"]))
    pub.response()
    # channel "one": one message each (RDY 1, no FIN); channel "two": the first only
    got = {subs[0].message().body, subs[1].message().body}
    assert got == {b"a", b"b"}
    assert subs[2].message().body in (b"a", b"b")
    ch = {c["channel_name"]: c for c in stats(cluster, "fan")["channels"]}
    assert ch["two"]["depth"] == 1 and ch["one"]["in_flight_count"] == 2
    for c in subs + [pub]:
        c.close()


def test_ephemeral_channel_vanishes_with_its_last_client(cluster):
    c = Raw(cluster.nsqd.tcp_address)
    c.send(p.sub("eph", "c#ephemeral"))
    assert c.response() == b"OK"
    assert [x["channel_name"] for x in stats(cluster, "eph")["channels"]] == ["c#ephemeral"]
    c.close()
    wait_for(lambda: stats(cluster, "eph")["channels"] == [])


def test_paused_channel_does_not_deliver(cluster, conn):
    conn.send(p.sub("pause", "c") + p.rdy(5))
    conn.response()
    assert http(cluster, "POST", "/channel/pause?topic=pause&channel=c").status_code == 200
    http(cluster, "POST", "/pub?topic=pause", data=b"held")
    assert stats(cluster, "pause")["channels"][0]["depth"] == 1
    http(cluster, "POST", "/channel/unpause?topic=pause&channel=c")
    assert conn.message().body == b"held"


def test_paused_topic_keeps_messages(cluster, conn):
    conn.send(p.sub("tpause", "c") + p.rdy(5))
    conn.response()
    http(cluster, "POST", "/topic/pause?topic=tpause")
    http(cluster, "POST", "/pub?topic=tpause", data=b"held")
    topic = stats(cluster, "tpause")
    assert topic["paused"] and topic["depth"] == 1
    http(cluster, "POST", "/topic/unpause?topic=tpause")
    assert conn.message().body == b"held"


# --------------------------------------------------------------------------------------------
# Compression and TLS


def test_snappy_round_trip(cluster, conn):
    reply = conn.identify(snappy=True)
    assert reply["snappy"] is True and reply["deflate"] is False
    comp, decomp = snappy.StreamCompressor(), snappy.StreamDecompressor()
    conn.compress_with(comp.compress, decomp.decompress)
    # the "OK" after the upgrade is itself compressed
    assert conn.response() == b"OK"
    conn.send(p.pub("snappy", b"s" * 1000) + p.sub("snappy", "c") + p.rdy(1))
    assert conn.response() == b"OK"
    assert conn.response() == b"OK"
    assert conn.message().body == b"s" * 1000


def test_deflate_round_trip(cluster, conn):
    reply = conn.identify(deflate=True, deflate_level=9)
    assert (reply["deflate"], reply["deflate_level"]) == (True, 6)  # capped by max_deflate_level
    comp, decomp = zlib.compressobj(6, zlib.DEFLATED, -15), zlib.decompressobj(-15)
    conn.compress_with(
        lambda d: comp.compress(d) + comp.flush(zlib.Z_SYNC_FLUSH), decomp.decompress
    )
    assert conn.response() == b"OK"
    conn.send(p.pub("deflate", b"d" * 1000) + p.sub("deflate", "c") + p.rdy(1))
    assert conn.response() == b"OK"
    assert conn.response() == b"OK"
    assert conn.message().body == b"d" * 1000


def test_snappy_and_deflate_together_is_refused(conn):
    conn.send(p.identify({"feature_negotiation": True, "snappy": True, "deflate": True}))
    assert conn.error() == b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression"


@pytest.fixture(scope="module")
def tls_cluster():
    with EmbeddedNSQ(
        lookupd=False, tls_cert=str(CERTS / "cert.pem"), tls_key=str(CERTS / "key.pem")
    ) as c:
        yield c


def _tls_wrap(conn: Raw) -> None:
    ctx = ssl.create_default_context(cafile=str(CERTS / "cert.pem"))
    conn.sock = ctx.wrap_socket(conn.sock, server_hostname="127.0.0.1")


@pytest.mark.parametrize("compression", [None, "snappy", "deflate"])
def test_tls_round_trip(tls_cluster, compression):
    conn = Raw(tls_cluster.nsqd.tcp_address)
    features = {"tls_v1": True}
    if compression:
        features[compression] = True
    assert conn.identify(**features)["tls_v1"] is True
    _tls_wrap(conn)
    assert conn.response() == b"OK"  # the first frame over TLS
    if compression == "snappy":
        comp, decomp = snappy.StreamCompressor(), snappy.StreamDecompressor()
        conn.compress_with(comp.compress, decomp.decompress)
        assert conn.response() == b"OK"
    elif compression == "deflate":
        comp, decomp = zlib.compressobj(6, zlib.DEFLATED, -15), zlib.decompressobj(-15)
        conn.compress_with(
            lambda d: comp.compress(d) + comp.flush(zlib.Z_SYNC_FLUSH), decomp.decompress
        )
        assert conn.response() == b"OK"
    topic = f"tls{compression}"
    conn.send(p.pub(topic, b"secret") + p.sub(topic, "c") + p.rdy(1))
    assert conn.response() == b"OK"
    assert conn.response() == b"OK"
    assert conn.message().body == b"secret"
    tls_stats = http(tls_cluster, "GET", f"/stats?format=json&topic={topic}").json()
    client = tls_stats["topics"][0]["channels"][0]["clients"][0]
    assert client["tls"] is True
    conn.close()


def test_tls_required_refuses_plain_commands():
    with EmbeddedNSQ(
        lookupd=False,
        tls_cert=str(CERTS / "cert.pem"),
        tls_key=str(CERTS / "key.pem"),
        tls_required=1,
    ) as c:
        conn = Raw(c.nsqd.tcp_address)
        conn.send(p.pub("t", b"x"))
        assert conn.error() == b"E_INVALID cannot PUB in current state (TLS required)"
        conn.expect_closed()


# --------------------------------------------------------------------------------------------
# Auth


def test_auth_against_an_auth_server():
    grants = {
        "good": {
            "identity": "alice",
            "authorizations": [
                {"topic": "^ok$", "channels": [".*"], "permissions": ["publish", "subscribe"]}
            ],
        }
    }
    with (
        AuthServer(grants) as auth,
        EmbeddedNSQ(lookupd=False, auth_http_address=auth.address) as c,
    ):
        first = Raw(c.nsqd.tcp_address)
        assert first.identify()["auth_required"] is True
        first.send(p.pub("ok", b"x"))
        assert first.error() == b"E_AUTH_FIRST AUTH required before PUB"
        bad = Raw(c.nsqd.tcp_address)
        bad.send(p.auth("wrong"))
        assert bad.error() == b"E_AUTH_FAILED AUTH failed"
        good = Raw(c.nsqd.tcp_address)
        good.send(p.auth("good"))
        assert json.loads(good.response()) == {
            "identity": "alice",
            "identity_url": "",
            "permission_count": 1,
        }
        good.send(p.pub("ok", b"x") + p.pub("other", b"y"))
        assert good.response() == b"OK"
        assert good.error() == b'E_UNAUTHORIZED AUTH failed for PUB on "other" ""'
        assert auth.requests[-1]["secret"] == "good"


# --------------------------------------------------------------------------------------------
# HTTP


def test_http_ping_and_info(cluster):
    r = http(cluster, "GET", "/ping")
    assert (r.status_code, r.text) == (200, "OK")
    assert "X-Nsq-Content-Type" not in r.headers
    info = http(cluster, "GET", "/info")
    assert info.headers["X-Nsq-Content-Type"] == "nsq; version=1.0"
    body = info.json()
    assert body["version"] == "1.3.0"
    assert body["tcp_port"] == cluster.nsqd.tcp_port
    assert body["max_heartbeat_interval"] == 60 * 10**9  # nanoseconds


def test_http_keep_alive_and_expect_continue(cluster):
    with requests.Session() as session:
        for _ in range(3):
            r = session.post(f"{cluster.nsqd.http_url}/pub?topic=ka", data=b"x", timeout=TIMEOUT)
            assert r.text == "OK"
    host, port = cluster.nsqd.host, cluster.nsqd.http_port
    with socket.create_connection((host, port), timeout=TIMEOUT) as s:
        s.sendall(
            b"POST /pub?topic=ka HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
            b"Expect: 100-continue\r\n\r\n"
        )
        assert s.recv(1024) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(b"hi")
        assert s.recv(4096).startswith(b"HTTP/1.1 200 OK\r\n")
    assert stats(cluster, "ka")["message_count"] == 4


def test_http_pub_mpub_and_defer(cluster, conn):
    conn.send(p.sub("hpub", "c") + p.rdy(10))
    conn.response()
    assert http(cluster, "POST", "/pub?topic=hpub", data=b"one").text == "OK"
    assert http(cluster, "POST", "/mpub?topic=hpub", data=b"two\nthree\n").text == "OK"
    binary = struct.pack(">II", 2, 4) + b"four" + struct.pack(">I", 4) + b"five"
    assert http(cluster, "POST", "/mpub?topic=hpub&binary=true", data=binary).text == "OK"
    assert http(cluster, "POST", "/pub?topic=hpub&defer=200", data=b"six").text == "OK"
    bodies = sorted(conn.message().body for _ in range(6))
    assert bodies == sorted([b"one", b"two", b"three", b"four", b"five", b"six"])


@pytest.mark.parametrize(
    "method, path, body, status, message",
    [
        ("POST", "/pub?topic=x", b"", 400, "MSG_EMPTY"),
        ("POST", "/pub", b"x", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/pub?topic=a!", b"x", 400, "INVALID_TOPIC"),
        ("POST", "/pub?topic=x&defer=-1", b"x", 400, "INVALID_DEFER"),
        ("POST", "/mpub?topic=x&binary=true", b"\x00\x00\x00\x00", 413, "BAD_BODY"),
        ("POST", "/topic/delete?topic=nope", b"", 404, "TOPIC_NOT_FOUND"),
        ("POST", "/channel/create?topic=nope&channel=c", b"", 404, "TOPIC_NOT_FOUND"),
        ("POST", "/channel/create?topic=x", b"", 400, "MISSING_ARG_CHANNEL"),
        ("POST", "/channel/delete?topic=x&channel=nope", b"", 404, "CHANNEL_NOT_FOUND"),
        ("GET", "/pub?topic=x", b"", 405, "METHOD_NOT_ALLOWED"),
        ("GET", "/nope", b"", 404, "NOT_FOUND"),
    ],
)
def test_http_errors_are_nsqds(cluster, method, path, body, status, message):
    http(cluster, "POST", "/topic/create?topic=x")
    r = http(cluster, method, path, data=body)
    assert r.status_code == status
    assert r.json() == {"message": message}
    assert r.headers["Content-Type"] == "application/json; charset=utf-8"
    assert r.headers["X-Nsq-Content-Type"] == "nsq; version=1.0"


def test_http_topic_and_channel_lifecycle(cluster):
    assert http(cluster, "POST", "/topic/create?topic=life").status_code == 200
    assert http(cluster, "POST", "/channel/create?topic=life&channel=c").status_code == 200
    http(cluster, "POST", "/pub?topic=life", data=b"x")
    assert stats(cluster, "life")["channels"][0]["depth"] == 1
    assert http(cluster, "POST", "/channel/empty?topic=life&channel=c").status_code == 200
    assert stats(cluster, "life")["channels"][0]["depth"] == 0
    assert http(cluster, "POST", "/channel/delete?topic=life&channel=c").status_code == 200
    assert stats(cluster, "life")["channels"] == []
    http(cluster, "POST", "/pub?topic=life", data=b"x")
    assert http(cluster, "POST", "/topic/empty?topic=life").status_code == 200
    assert stats(cluster, "life")["depth"] == 0
    assert http(cluster, "POST", "/topic/delete?topic=life").status_code == 200
    assert stats(cluster, "life") == {}


def test_stats_shape_and_filters(cluster, conn):
    conn.send(p.identify({"client_id": "cid", "user_agent": "ua/1"}))
    conn.response()
    conn.send(p.pub("st", b"x") + p.sub("st", "c") + p.rdy(1))
    conn.response(), conn.response()
    conn.message()
    data = http(cluster, "GET", "/stats?format=json&topic=st").json()
    assert list(data) == ["version", "health", "start_time", "topics", "memory", "producers"]
    topic = data["topics"][0]
    assert list(topic) == [
        "topic_name", "channels", "depth", "backend_depth", "message_count", "message_bytes",
        "paused", "e2e_processing_latency",
    ]  # fmt: skip
    channel = topic["channels"][0]
    assert channel["in_flight_count"] == 1 and channel["client_count"] == 1
    client = channel["clients"][0]
    assert (client["client_id"], client["user_agent"], client["state"]) == ("cid", "ua/1", 3)
    assert data["producers"][0]["pub_counts"] == [{"topic": "st", "count": 1}]
    assert http(cluster, "GET", "/stats?format=json&topic=zzz").json()["topics"] is None
    none = http(cluster, "GET", "/stats?format=json&topic=st&channel=zzz").json()
    assert none["topics"] == []
    slim = http(cluster, "GET", "/stats?format=json&topic=st&include_mem=false").json()
    assert "memory" not in slim
    text = http(cluster, "GET", "/stats?topic=st").text
    assert "[st             ] depth: 0" in text


# --------------------------------------------------------------------------------------------
# Lifecycle and fault controls


def test_stop_and_start_keep_ports_and_data():
    with EmbeddedNSQ(lookupd=False) as c:
        node = c.nsqd
        ports = (node.tcp_port, node.http_port)
        conn = Raw(node.tcp_address)
        conn.send(p.mpub("keep", [b"a", b"b"]) + p.sub("keep", "c") + p.rdy(1))
        conn.response(), conn.response()
        in_flight = conn.message()
        c.stop_nsqd(0)
        conn.expect_closed()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", ports[0]), timeout=1).close()
        c.start_nsqd(0)
        assert (c.nsqd.tcp_port, c.nsqd.http_port) == ports
        again = Raw(c.nsqd.tcp_address)
        again.send(p.sub("keep", "c") + p.rdy(5))
        again.response()
        got = sorted((m.body, m.attempts) for m in (again.message(), again.message()))
        other = ({b"a", b"b"} - {in_flight.body}).pop()
        # the message that was in flight comes back with its attempt counted
        assert got == sorted([(in_flight.body, 2), (other, 1)])
        again.close()


def test_drop_connections(cluster):
    conn = Raw(cluster.nsqd.tcp_address)
    conn.send(p.identify({}))
    assert conn.response() == b"OK"  # the server has the connection
    cluster.drop_connections(0)
    conn.expect_closed()
    fresh = Raw(cluster.nsqd.tcp_address)
    fresh.send(p.pub("after-drop", b"x"))
    assert fresh.response() == b"OK"
    fresh.close()


def test_stall_and_unstall(cluster):
    conn = Raw(cluster.nsqd.tcp_address)
    cluster.stall_nsqd(0)
    try:
        conn.send(p.pub("stall", b"x"))
        late = Raw(cluster.nsqd.tcp_address)  # accepted...
        late.send(p.pub("stall", b"y"))
        conn.sock.settimeout(0.3)
        with pytest.raises(socket.timeout):  # ...but nothing is answered
            conn.frame()
        with pytest.raises(requests.exceptions.Timeout):
            requests.get(cluster.nsqd.http_url + "/ping", timeout=0.3)
    finally:
        cluster.unstall_nsqd(0)
    conn.sock.settimeout(TIMEOUT)
    assert conn.response() == b"OK"
    assert late.response() == b"OK"
    conn.close()
    late.close()


def test_inject_frame(cluster):
    conn = Raw(cluster.nsqd.tcp_address)
    conn.send(p.identify({}))
    assert conn.response() == b"OK"  # the server has the connection
    cluster.inject_frame(0, p.encode_frame(p.FRAME_TYPE_ERROR, b"E_INJECTED boom"))
    assert conn.error() == b"E_INJECTED boom"
    conn.close()


def test_unknown_option_is_refused():
    with pytest.raises(TypeError, match="no_such_option"):
        EmbeddedNSQ(no_such_option=1)


def test_options_reach_the_wire():
    with EmbeddedNSQ(lookupd=False, max_rdy_count=50, msg_timeout=2.5, snappy=False) as c:
        conn = Raw(c.nsqd.tcp_address)
        reply = conn.identify(snappy=True)
        assert (reply["max_rdy_count"], reply["msg_timeout"], reply["snappy"]) == (50, 2500, False)
        conn.close()
