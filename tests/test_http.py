"""Tests of nsqclient.http: NsqdHTTPClient and LookupdClient.

Two halves:

* against the broker fixture (embedded NSQ, or real binaries with NSQ_BIN_DIR): every method
  of both clients, checked through nsqd's /stats and nsqlookupd's replies;
* against a tiny stdlib HTTP server on loopback, started in the test: the reply shapes a 1.3
  broker never sends (pre-1.0 envelope, youzan's lookup and listlookup), broken replies,
  transport failures, and input validation before any request.
"""

from __future__ import annotations

import json
import pickle
import socket
import struct
import threading
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from nsqclient.addresses import producer_address
from nsqclient.errors import HTTPError, NSQError
from nsqclient.http import (
    ACCEPT_V1,
    LookupdClient,
    NsqdHTTPClient,
    TopicNotFoundError,
)
from nsqclient.testing.waiting import wait_for

WAIT = 10.0  # seconds allowed for the broker to reach an expected state


def _name(prefix: str = "t") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


# ============================================================================================
# Broker tests


@pytest.fixture
def nsqd_http(nsqd: Any) -> Iterator[NsqdHTTPClient]:
    with NsqdHTTPClient(nsqd.nsqd.http_address, timeout=5.0) as client:
        yield client


@pytest.fixture
def lookupd_http(nsqd: Any) -> Iterator[LookupdClient]:
    with LookupdClient(nsqd.lookupd.http_url, timeout=5.0) as client:
        yield client


def topic_stats(client: NsqdHTTPClient, topic: str) -> dict[str, Any] | None:
    """The /stats entry of ``topic``, or None when nsqd does not have it."""
    for t in client.stats(topic=topic).get("topics") or []:
        if t["topic_name"] == topic:
            return t
    return None


def channel_stats(client: NsqdHTTPClient, topic: str, channel: str) -> dict[str, Any] | None:
    """The /stats entry of ``topic``/``channel``, or None when nsqd does not have it."""
    t = topic_stats(client, topic)
    for c in (t or {}).get("channels") or []:
        if c["channel_name"] == channel:
            return c
    return None


def wait_topic(client: NsqdHTTPClient, topic: str, check: Callable[[dict], bool]) -> dict:
    def probe() -> dict | None:
        t = topic_stats(client, topic)
        return t if t is not None and check(t) else None

    return wait_for(probe, WAIT, message=lambda: f"topic stats: {topic_stats(client, topic)}")


def wait_channel(
    client: NsqdHTTPClient, topic: str, channel: str, check: Callable[[dict], bool]
) -> dict:
    def probe() -> dict | None:
        c = channel_stats(client, topic, channel)
        return c if c is not None and check(c) else None

    return wait_for(
        probe, WAIT, message=lambda: f"channel stats: {channel_stats(client, topic, channel)}"
    )


def wait_lookup(lookupd: LookupdClient, topic: str, check: Callable[[dict], bool]) -> dict:
    def probe() -> dict | None:
        try:
            result = lookupd.lookup(topic)
        except TopicNotFoundError:
            return None
        return result if check(result) else None

    return wait_for(probe, WAIT, message=f"lookup of {topic!r} never matched")


def test_nsqd_ping_and_info(nsqd: Any, nsqd_http: NsqdHTTPClient) -> None:
    assert nsqd_http.ping() is True
    info = nsqd_http.info()
    assert info["tcp_port"] == nsqd.nsqd.tcp_port
    assert info["http_port"] == nsqd.nsqd.http_port
    assert isinstance(info["version"], str) and info["version"]


def test_pub_then_stats_depth(nsqd_http: NsqdHTTPClient) -> None:
    topic = _name()
    assert nsqd_http.pub(topic, b"hello") == "OK"
    assert nsqd_http.pub(topic, "h\u00e9llo") == "OK"  # str is sent UTF-8 encoded
    # With no channel yet, messages wait in the topic.
    t = wait_topic(nsqd_http, topic, lambda t: t["depth"] == 2)
    assert t["message_count"] == 2
    assert t["channels"] == []


def test_pub_reaches_existing_channel(nsqd_http: NsqdHTTPClient) -> None:
    topic, channel = _name(), _name("c")
    nsqd_http.create_topic(topic)
    nsqd_http.create_channel(topic, channel)
    nsqd_http.pub(topic, b"x" * 1000)
    c = wait_channel(nsqd_http, topic, channel, lambda c: c["depth"] == 1)
    assert c["in_flight_count"] == 0 and c["deferred_count"] == 0


def test_mpub_count_uses_binary_format(nsqd_http: NsqdHTTPClient) -> None:
    topic = _name()
    # A body holding a newline proves the binary format: text mode would split it in two.
    assert nsqd_http.mpub(topic, [b"one", b"two\nlines", "three"]) == "OK"
    t = wait_topic(nsqd_http, topic, lambda t: t["message_count"] == 3)
    assert t["depth"] == 3


def test_dpub_is_deferred(nsqd_http: NsqdHTTPClient) -> None:
    topic, channel = _name(), _name("c")
    nsqd_http.create_topic(topic)
    nsqd_http.create_channel(topic, channel)
    assert nsqd_http.dpub(topic, b"later", delay=60.0) == "OK"
    c = wait_channel(nsqd_http, topic, channel, lambda c: c["deferred_count"] == 1)
    assert c["depth"] == 0


def test_dpub_above_max_req_timeout_is_refused(nsqd_http: NsqdHTTPClient) -> None:
    # nsqd's default --max-req-timeout is 1 h.
    with pytest.raises(HTTPError) as exc_info:
        nsqd_http.dpub(_name(), b"x", delay=2 * 3600.0)
    assert exc_info.value.status == 400
    assert exc_info.value.message == "INVALID_DEFER"


def test_stats_filters_and_include_clients(nsqd_http: NsqdHTTPClient) -> None:
    topic, channel = _name(), _name("c")
    nsqd_http.create_topic(topic)
    nsqd_http.create_channel(topic, channel)
    other = _name()
    nsqd_http.create_topic(other)

    full = nsqd_http.stats()
    assert {topic, other} <= {t["topic_name"] for t in full["topics"]}
    assert full["health"] == "OK"

    only = nsqd_http.stats(topic=topic, channel=channel, include_clients=False)
    assert [t["topic_name"] for t in only["topics"]] == [topic]
    assert [c["channel_name"] for c in only["topics"][0]["channels"]] == [channel]
    assert only["topics"][0]["channels"][0]["clients"] is None  # include_clients=false

    with_clients = nsqd_http.stats(topic=topic)
    assert with_clients["topics"][0]["channels"][0]["clients"] == []

    assert nsqd_http.stats(topic=_name())["topics"] is None  # as nsqd 1.x sends it


def test_topic_lifecycle(nsqd_http: NsqdHTTPClient) -> None:
    topic = _name()
    assert topic_stats(nsqd_http, topic) is None
    assert nsqd_http.create_topic(topic) is None
    assert topic_stats(nsqd_http, topic)["paused"] is False

    nsqd_http.pause_topic(topic)
    assert topic_stats(nsqd_http, topic)["paused"] is True
    nsqd_http.unpause_topic(topic)
    assert topic_stats(nsqd_http, topic)["paused"] is False

    nsqd_http.mpub(topic, [b"a", b"b"])
    wait_topic(nsqd_http, topic, lambda t: t["depth"] == 2)
    nsqd_http.empty_topic(topic)
    assert topic_stats(nsqd_http, topic)["depth"] == 0

    nsqd_http.delete_topic(topic)
    assert topic_stats(nsqd_http, topic) is None
    with pytest.raises(TopicNotFoundError) as exc_info:
        nsqd_http.delete_topic(topic)
    assert exc_info.value.status == 404
    with pytest.raises(TopicNotFoundError):
        nsqd_http.pause_topic(topic)


def test_channel_lifecycle(nsqd_http: NsqdHTTPClient) -> None:
    topic, channel = _name(), _name("c")
    # nsqd 1.x does not create the topic on /channel/create.
    with pytest.raises(TopicNotFoundError):
        nsqd_http.create_channel(topic, channel)

    nsqd_http.create_topic(topic)
    assert nsqd_http.create_channel(topic, channel) is None
    assert channel_stats(nsqd_http, topic, channel)["paused"] is False

    nsqd_http.pause_channel(topic, channel)
    assert channel_stats(nsqd_http, topic, channel)["paused"] is True
    nsqd_http.unpause_channel(topic, channel)
    assert channel_stats(nsqd_http, topic, channel)["paused"] is False

    nsqd_http.pub(topic, b"m")
    wait_channel(nsqd_http, topic, channel, lambda c: c["depth"] == 1)
    nsqd_http.empty_channel(topic, channel)
    assert channel_stats(nsqd_http, topic, channel)["depth"] == 0

    nsqd_http.delete_channel(topic, channel)
    assert channel_stats(nsqd_http, topic, channel) is None
    with pytest.raises(HTTPError) as exc_info:
        nsqd_http.delete_channel(topic, channel)
    assert exc_info.value.status == 404
    assert exc_info.value.message == "CHANNEL_NOT_FOUND"
    assert not isinstance(exc_info.value, TopicNotFoundError)


def test_concurrent_use_from_threads(nsqd_http: NsqdHTTPClient) -> None:
    topic = _name()
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(20):
                nsqd_http.pub(topic, f"{n}-{i}")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,), name=f"pub-{n}") for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    wait_topic(nsqd_http, topic, lambda t: t["message_count"] == 80)


def test_lookupd_ping_and_info(lookupd_http: LookupdClient) -> None:
    assert lookupd_http.ping() is True
    assert isinstance(lookupd_http.info()["version"], str)


def test_lookup_after_registration(
    nsqd: Any, nsqd_http: NsqdHTTPClient, lookupd_http: LookupdClient
) -> None:
    topic, channel = _name(), _name("c")
    with pytest.raises(TopicNotFoundError) as exc_info:
        lookupd_http.lookup(topic)
    assert exc_info.value.status == 404
    assert isinstance(exc_info.value, HTTPError) and isinstance(exc_info.value, NSQError)

    nsqd_http.create_topic(topic)
    result = wait_lookup(lookupd_http, topic, lambda r: len(r["producers"]) == 1)
    assert set(result) == {"channels", "producers"}  # a classic lookupd: no youzan keys
    assert result["channels"] == []
    producer = result["producers"][0]
    assert producer_address(producer) == nsqd.nsqd.tcp_address
    assert producer["http_port"] == nsqd.nsqd.http_port

    nsqd_http.create_channel(topic, channel)
    wait_lookup(lookupd_http, topic, lambda r: r["channels"] == [channel])
    assert topic in lookupd_http.topics()
    assert lookupd_http.channels(topic) == [channel]
    assert lookupd_http.channels(_name()) == []

    nodes = lookupd_http.nodes()
    ours = [n for n in nodes if n["tcp_port"] == nsqd.nsqd.tcp_port]
    assert len(ours) == 1
    assert producer_address(ours[0]) == nsqd.nsqd.tcp_address
    assert topic in ours[0]["topics"]


def test_lookupd_tombstone(nsqd: Any, nsqd_http: NsqdHTTPClient, lookupd_http: LookupdClient):
    topic = _name()
    nsqd_http.create_topic(topic)
    wait_lookup(lookupd_http, topic, lambda r: len(r["producers"]) == 1)

    assert lookupd_http.tombstone_topic(topic, nsqd.nsqd.http_address) is None
    assert lookupd_http.lookup(topic)["producers"] == []  # tombstoned producers are hidden
    node = next(n for n in lookupd_http.nodes() if n["tcp_port"] == nsqd.nsqd.tcp_port)
    assert dict(zip(node["topics"], node["tombstones"], strict=True))[topic] is True


def test_lookupd_topic_and_channel_admin(lookupd_http: LookupdClient) -> None:
    topic, channel = _name(), _name("c")
    assert lookupd_http.create_topic(topic) is None
    assert topic in lookupd_http.topics()
    # Registered with no nsqd: found, with no producers.
    assert lookupd_http.lookup(topic) == {"channels": [], "producers": []}

    assert lookupd_http.create_channel(topic, channel) is None
    assert lookupd_http.channels(topic) == [channel]
    assert lookupd_http.lookup(topic)["channels"] == [channel]

    assert lookupd_http.delete_channel(topic, channel) is None
    assert lookupd_http.channels(topic) == []
    with pytest.raises(HTTPError) as exc_info:
        lookupd_http.delete_channel(topic, channel)
    assert (exc_info.value.status, exc_info.value.message) == (404, "CHANNEL_NOT_FOUND")

    assert lookupd_http.delete_topic(topic) is None
    assert topic not in lookupd_http.topics()
    with pytest.raises(TopicNotFoundError):
        lookupd_http.lookup(topic)


def test_listlookup_on_classic_lookupd_raises(lookupd_http: LookupdClient) -> None:
    with pytest.raises(HTTPError) as exc_info:
        lookupd_http.listlookup()
    assert exc_info.value.status == 404
    assert exc_info.value.url.endswith("/listlookup")


def test_lookupd_legacy_json(nsq_cluster_factory: Callable[..., Any]) -> None:
    """The embedded lookupd in pre-1.0 mode wraps its JSON; the client reads it the same."""
    cluster = nsq_cluster_factory(lookupd_legacy_json=True)  # skips against real binaries
    topic = _name()
    with (
        NsqdHTTPClient(cluster.nsqd.http_address) as nsqd_http,
        LookupdClient(cluster.lookupd.http_address) as lookupd_http,
    ):
        with pytest.raises(TopicNotFoundError):
            lookupd_http.lookup(topic)
        nsqd_http.create_topic(topic)
        result = wait_lookup(lookupd_http, topic, lambda r: len(r["producers"]) == 1)
        assert producer_address(result["producers"][0]) == cluster.nsqd.tcp_address
        assert topic in lookupd_http.topics()
        assert lookupd_http.ping() is True


# ============================================================================================
# A tiny HTTP server for reply shapes the broker does not produce


class Seen(NamedTuple):
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes


class Reply(NamedTuple):
    status: int
    body: bytes
    content_type: str


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def _serve(self) -> None:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        fake = self.server.fake
        fake.record(Seen(self.command, parts.path, parse_qs(parts.query), dict(self.headers), body))
        reply = fake.routes.get(parts.path, fake.not_found)
        self.send_response(reply.status)
        if reply.content_type:
            self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(reply.body)

    do_GET = do_POST = _serve

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins every handler thread
    fake: FakeServer


class FakeServer:
    """Answers each path with a fixed reply and records every request it got."""

    not_found = Reply(404, b'{"message":"NOT_FOUND"}', "application/json; charset=utf-8")

    def __init__(self) -> None:
        self.routes: dict[str, Reply] = {}
        self._seen: list[Seen] = []
        self._lock = threading.Lock()
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.fake = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-http"
        )

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._httpd.server_address[1]}"

    def route(self, path: str, body: Any = b"", status: int = 200, content_type: str = "") -> None:
        if isinstance(body, dict | list) or body is None:
            body = json.dumps(body).encode()
            content_type = content_type or "application/json; charset=utf-8"
        elif isinstance(body, str):
            body = body.encode()
        self.routes[path] = Reply(status, body, content_type or "text/plain; charset=utf-8")

    def record(self, seen: Seen) -> None:
        with self._lock:
            self._seen.append(seen)

    @property
    def seen(self) -> list[Seen]:
        with self._lock:
            return list(self._seen)

    def start(self) -> FakeServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5.0)


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    server = FakeServer().start()
    yield server
    server.close()


@pytest.fixture
def fake_nsqd(fake: FakeServer) -> Iterator[NsqdHTTPClient]:
    with NsqdHTTPClient(fake.address, timeout=5.0) as client:
        yield client


@pytest.fixture
def fake_lookupd(fake: FakeServer) -> Iterator[LookupdClient]:
    with LookupdClient(f"http://{fake.address}/", timeout=5.0) as client:
        yield client


def wrapped(data: Any, status_code: int = 200, status_txt: str = "OK") -> dict[str, Any]:
    return {"status_code": status_code, "status_txt": status_txt, "data": data}


YZ_PEER = {
    "id": "10.0.0.5:33150",
    "remote_address": "10.0.0.5:33150",
    "hostname": "yz-nsqd-1",
    "broadcast_address": "10.0.0.5",
    "tcp_port": 4150,
    "http_port": 4151,
    "version": "0.3.7-HA.1.9.6",
    "distributed_id": "10.0.0.5:4250:4150:121913",
}
YZ_PEER_2 = {**YZ_PEER, "broadcast_address": "10.0.0.6", "hostname": "yz-nsqd-2"}
YZ_LOOKUP = {
    "channels": ["BaseConsumer"],
    "meta": {
        "partition_num": 2,
        "replica": 2,
        "extend_support": False,
        "ordered": False,
        "multi_part": False,
        "disable_channel_auto_create": False,
    },
    "partitions": {"0": YZ_PEER, "1": YZ_PEER_2},
    "producers": [YZ_PEER, YZ_PEER_2],
}


# -- lookup shapes ---------------------------------------------------------------------------


def test_lookup_pre_1_0_wrapped_shape(fake: FakeServer, fake_lookupd: LookupdClient) -> None:
    # nsqlookupd 0.2.x: wrapped, and "address" instead of "broadcast_address".
    legacy_peer = {"address": "legacy-host", "tcp_port": 4150, "http_port": 4151}
    fake.route("/lookup", wrapped({"channels": ["c1"], "producers": [legacy_peer]}))
    result = fake_lookupd.lookup("clicks")
    assert result == {
        "channels": ["c1"],
        "producers": [{**legacy_peer, "broadcast_address": "legacy-host"}],
    }
    assert producer_address(result["producers"][0]) == "legacy-host:4150"
    (seen,) = fake.seen
    assert (seen.method, seen.path, seen.query) == ("GET", "/lookup", {"topic": ["clicks"]})
    assert seen.headers["Accept"] == ACCEPT_V1


def test_lookup_pre_1_0_topic_not_found(fake: FakeServer, fake_lookupd: LookupdClient) -> None:
    # Pre-1.0 servers turn every error into HTTP 500 with the reason in status_txt.
    fake.route("/lookup", wrapped(None, 500, "TOPIC_NOT_FOUND"), status=500)
    with pytest.raises(TopicNotFoundError) as exc_info:
        fake_lookupd.lookup("clicks")
    assert exc_info.value.status == 500
    assert exc_info.value.message == "TOPIC_NOT_FOUND"
    assert "/lookup?topic=clicks" in exc_info.value.url


def test_lookup_0_2_topic_not_found(fake: FakeServer, fake_lookupd: LookupdClient) -> None:
    # nsqlookupd before 0.2.31 named an unknown topic INVALID_ARG_TOPIC.
    fake.route("/lookup", wrapped(None, 500, "INVALID_ARG_TOPIC"), status=500)
    with pytest.raises(TopicNotFoundError) as exc_info:
        fake_lookupd.lookup("clicks")
    assert (exc_info.value.status, exc_info.value.message) == (500, "INVALID_ARG_TOPIC")


def test_wrapped_error_status_in_a_200(fake: FakeServer, fake_lookupd: LookupdClient) -> None:
    fake.route("/lookup", wrapped(None, 500, "TOPIC_NOT_FOUND"))
    with pytest.raises(TopicNotFoundError) as exc_info:
        fake_lookupd.lookup("clicks")
    assert exc_info.value.status == 500
    fake.route("/topics", wrapped(None, 400, "INVALID_REQUEST"))
    with pytest.raises(HTTPError) as exc_info:
        fake_lookupd.topics()
    assert (exc_info.value.status, exc_info.value.message) == (400, "INVALID_REQUEST")


def test_lookup_1_x_topic_not_found(fake: FakeServer, fake_lookupd: LookupdClient) -> None:
    fake.route("/lookup", {"message": "TOPIC_NOT_FOUND"}, status=404)
    with pytest.raises(TopicNotFoundError) as exc_info:
        fake_lookupd.lookup("clicks")
    assert (exc_info.value.status, exc_info.value.message) == (404, "TOPIC_NOT_FOUND")


@pytest.mark.parametrize("wrap", [False, True], ids=["v1", "wrapped"])
def test_lookup_youzan_shape(fake: FakeServer, fake_lookupd: LookupdClient, wrap: bool) -> None:
    fake.route("/lookup", wrapped(YZ_LOOKUP) if wrap else YZ_LOOKUP)
    result = fake_lookupd.lookup("orders", access="w", metainfo=True)
    assert result["channels"] == ["BaseConsumer"]
    assert result["meta"]["partition_num"] == 2 and result["meta"]["replica"] == 2
    assert sorted(result["partitions"]) == ["0", "1"]
    assert producer_address(result["partitions"]["1"]) == "10.0.0.6:4150"
    assert result["partitions"]["0"]["distributed_id"] == YZ_PEER["distributed_id"]
    assert [producer_address(p) for p in result["producers"]] == ["10.0.0.5:4150", "10.0.0.6:4150"]
    (seen,) = fake.seen
    assert seen.query == {"topic": ["orders"], "access": ["w"], "metainfo": ["true"]}


def test_lookup_youzan_odd_values(fake: FakeServer, fake_lookupd: LookupdClient) -> None:
    # Ports as strings, integer-looking partition keys, null producers and no meta: a write
    # lookup while cluster writes are disabled.
    peer = {**YZ_PEER, "tcp_port": "4150", "http_port": "4151"}
    fake.route("/lookup", {"channels": None, "partitions": {"3": peer}, "producers": None})
    result = fake_lookupd.lookup("orders", access="r")
    assert result == {
        "channels": [],
        "producers": [],
        "partitions": {"3": {**YZ_PEER, "tcp_port": 4150, "http_port": 4151}},
    }
    fake.route("/lookup", {"channels": [], "partitions": None, "producers": None})
    assert fake_lookupd.lookup("orders") == {"channels": [], "producers": [], "partitions": {}}


def test_lookup_youzan_unescaped_error_message(
    fake: FakeServer, fake_lookupd: LookupdClient
) -> None:
    # youzan builds V1 error bodies with Sprintf: not always valid JSON.
    fake.route(
        "/lookup",
        b'{"message":"Topic has no channel, should "init" one"}',
        status=404,
        content_type="application/json",
    )
    with pytest.raises(HTTPError) as exc_info:
        fake_lookupd.lookup("orders", access="w")
    assert exc_info.value.message == 'Topic has no channel, should "init" one'
    assert not isinstance(exc_info.value, TopicNotFoundError)


def test_lookup_rejects_bad_access(fake: FakeServer, fake_lookupd: LookupdClient) -> None:
    with pytest.raises(ValueError, match="access"):
        fake_lookupd.lookup("orders", access="rw")
    assert fake.seen == []


# -- listlookup --------------------------------------------------------------------------------


def _yz_lookupd_node(ip: str, http_port: str) -> dict[str, Any]:
    return {
        "ID": f"{ip}:{http_port}",
        "NodeIP": ip,
        "TcpPort": "4160",
        "HttpPort": http_port,
        "RpcPort": "4260",
        "Epoch": 7,
    }


@pytest.mark.parametrize("wrap", [False, True], ids=["v1", "wrapped"])
def test_listlookup_capitalised_keys(
    fake: FakeServer, fake_lookupd: LookupdClient, wrap: bool
) -> None:
    nodes = [_yz_lookupd_node("10.0.0.1", "4161"), _yz_lookupd_node("10.0.0.2", "4171")]
    reply = {"lookupdleader": nodes[0], "lookupdnodes": nodes}
    fake.route("/listlookup", wrapped(reply) if wrap else reply)
    assert fake_lookupd.listlookup() == ["10.0.0.1:4161", "10.0.0.2:4171"]


def test_listlookup_without_cluster_raises(fake: FakeServer, fake_lookupd: LookupdClient) -> None:
    # youzan's lookupd without a coordinator: 200 with an empty body (V1) or data null.
    fake.route("/listlookup", b"", content_type="application/json")
    with pytest.raises(HTTPError, match="listlookup"):
        fake_lookupd.listlookup()
    fake.route("/listlookup", wrapped(None))
    with pytest.raises(HTTPError, match="listlookup"):
        fake_lookupd.listlookup()
    del fake.routes["/listlookup"]
    with pytest.raises(HTTPError) as exc_info:
        fake_lookupd.listlookup()
    assert (exc_info.value.status, exc_info.value.message) == (404, "NOT_FOUND")


# -- other lookupd replies ---------------------------------------------------------------------


def test_lookupd_lists_wrapped(fake: FakeServer, fake_lookupd: LookupdClient) -> None:
    fake.route("/topics", wrapped({"topics": ["a", "b"]}))
    fake.route("/channels", wrapped({"channels": ["c"]}))
    fake.route("/nodes", wrapped({"producers": [{**YZ_PEER, "tcp_port": "4150"}]}))
    fake.route("/info", wrapped({"version": "0.3.8"}))
    assert fake_lookupd.topics() == ["a", "b"]
    assert fake_lookupd.channels("a") == ["c"]
    assert [producer_address(n) for n in fake_lookupd.nodes()] == ["10.0.0.5:4150"]
    assert fake_lookupd.info() == {"version": "0.3.8"}
    assert [s.path for s in fake.seen] == ["/topics", "/channels", "/nodes", "/info"]
    assert fake.seen[1].query == {"topic": ["a"]}


def test_lookupd_admin_requests(fake: FakeServer, fake_lookupd: LookupdClient) -> None:
    for path in ("/topic/create", "/topic/delete", "/topic/tombstone"):
        fake.route(path)
    fake.route("/channel/create", wrapped(None))  # pre-1.0 success
    fake.route("/channel/delete", wrapped(None))
    fake_lookupd.create_topic("t")
    fake_lookupd.delete_topic("t")
    fake_lookupd.tombstone_topic("t", "10.0.0.5:4151")
    fake_lookupd.create_channel("t", "c")
    fake_lookupd.delete_channel("t", "c")
    assert [(s.method, s.path, s.query) for s in fake.seen] == [
        ("POST", "/topic/create", {"topic": ["t"]}),
        ("POST", "/topic/delete", {"topic": ["t"]}),
        ("POST", "/topic/tombstone", {"topic": ["t"], "node": ["10.0.0.5:4151"]}),
        ("POST", "/channel/create", {"topic": ["t"], "channel": ["c"]}),
        ("POST", "/channel/delete", {"topic": ["t"], "channel": ["c"]}),
    ]
    with pytest.raises(ValueError, match="node"):
        fake_lookupd.tombstone_topic("t", "no-port")
    assert len(fake.seen) == 5


# -- nsqd requests and replies -----------------------------------------------------------------


def test_nsqd_publish_requests(fake: FakeServer, fake_nsqd: NsqdHTTPClient) -> None:
    fake.route("/pub", "OK")
    fake.route("/mpub", "OK")
    assert fake_nsqd.pub("t", b"\x00body\n") == "OK"
    assert fake_nsqd.mpub("t", [b"a", "b\n", bytearray(b"")]) == "OK"
    assert fake_nsqd.dpub("t", "later", delay=1.5) == "OK"
    assert fake_nsqd.dpub("t", b"now", delay=0) == "OK"
    pub, mpub, dpub, dpub0 = fake.seen
    assert (pub.method, pub.path, pub.query, pub.body) == (
        "POST",
        "/pub",
        {"topic": ["t"]},
        b"\x00body\n",
    )
    assert mpub.query == {"topic": ["t"], "binary": ["true"]}
    expected = struct.pack(">I", 3) + b"".join(
        struct.pack(">I", len(b)) + b for b in (b"a", b"b\n", b"")
    )
    assert mpub.body == expected
    assert (dpub.path, dpub.query, dpub.body) == (
        "/pub",
        {"topic": ["t"], "defer": ["1500"]},
        b"later",
    )
    assert dpub0.query == {"topic": ["t"], "defer": ["0"]}
    assert all(s.headers["Accept"] == ACCEPT_V1 for s in fake.seen)


def test_nsqd_stats_wrapped_and_plain(fake: FakeServer, fake_nsqd: NsqdHTTPClient) -> None:
    body = {"version": "0.3.8", "health": "OK", "topics": [{"topic_name": "t", "depth": 4}]}
    fake.route("/stats", wrapped(body))
    assert fake_nsqd.stats(topic="t", channel="c", include_clients=False) == body
    fake.route("/stats", body)
    assert fake_nsqd.stats() == body
    first, second = fake.seen
    assert first.query == {
        "format": ["json"],
        "topic": ["t"],
        "channel": ["c"],
        "include_clients": ["false"],
    }
    assert second.query == {"format": ["json"], "include_clients": ["true"]}


def test_nsqd_admin_requests(fake: FakeServer, fake_nsqd: NsqdHTTPClient) -> None:
    ops = ("create", "delete", "empty", "pause", "unpause")
    for op in ops:
        fake.route(f"/topic/{op}")
        fake.route(f"/channel/{op}")
        getattr(fake_nsqd, f"{op}_topic")("t")
        getattr(fake_nsqd, f"{op}_channel")("t", "c#ephemeral")
    assert [(s.method, s.path, s.query) for s in fake.seen] == [
        call
        for op in ops
        for call in (
            ("POST", f"/topic/{op}", {"topic": ["t"]}),
            ("POST", f"/channel/{op}", {"topic": ["t"], "channel": ["c#ephemeral"]}),
        )
    ]


def test_garbage_json(fake: FakeServer, fake_nsqd: NsqdHTTPClient) -> None:
    fake.route("/stats", b"{not json", content_type="application/json")
    fake.route("/info", b"<html>proxy</html>", content_type="text/html")
    with pytest.raises(HTTPError) as exc_info:
        fake_nsqd.stats()
    assert exc_info.value.status == 200
    assert exc_info.value.message.startswith("invalid JSON")
    assert isinstance(exc_info.value.__cause__, ValueError)
    with pytest.raises(HTTPError, match="invalid JSON"):
        fake_nsqd.info()


def test_error_messages(fake: FakeServer, fake_nsqd: NsqdHTTPClient) -> None:
    fake.route("/pub", {"message": "INTERNAL_ERROR"}, status=500)
    with pytest.raises(HTTPError) as exc_info:
        fake_nsqd.pub("t", b"x")
    err = exc_info.value
    assert (err.status, err.message) == (500, "INTERNAL_ERROR")
    assert err.url.endswith("/pub?topic=t")
    assert "HTTP 500" in str(err) and "INTERNAL_ERROR" in str(err)
    assert pickle.loads(pickle.dumps(err)).message == "INTERNAL_ERROR"

    fake.route("/mpub", wrapped(None, 500, "MPUB_FAILED"), status=500)
    with pytest.raises(HTTPError) as exc_info:
        fake_nsqd.mpub("t", [b"x"])
    assert (exc_info.value.status, exc_info.value.message) == (500, "MPUB_FAILED")

    fake.route("/ping", "NOK - disk full", status=500)
    with pytest.raises(HTTPError) as exc_info:
        fake_nsqd.ping()
    assert (exc_info.value.status, exc_info.value.message) == (500, "NOK - disk full")

    fake.route("/ping", "NOPE")
    with pytest.raises(HTTPError, match="NOPE"):
        fake_nsqd.ping()

    fake.route("/topic/delete", {"message": "TOPIC_NOT_FOUND"}, status=404)
    with pytest.raises(TopicNotFoundError):
        fake_nsqd.delete_topic("t")
    restored = pickle.loads(pickle.dumps(TopicNotFoundError(404, "TOPIC_NOT_FOUND", "u")))
    assert type(restored) is TopicNotFoundError and restored.status == 404


# -- transport failures ------------------------------------------------------------------------


def test_connection_refused_is_status_0() -> None:
    # A bound socket that does not listen: connecting to it is refused, and no other process
    # can take the port meanwhile.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        for client in (NsqdHTTPClient(f"127.0.0.1:{port}"), LookupdClient(f"127.0.0.1:{port}")):
            with client, pytest.raises(HTTPError) as exc_info:
                client.ping()
            assert exc_info.value.status == 0
            assert isinstance(exc_info.value.__cause__, requests.ConnectionError)
            assert exc_info.value.url == f"http://127.0.0.1:{port}/ping"


def test_timeout_is_status_0() -> None:
    # A listening socket that never accepts: the kernel completes the handshake, nobody answers.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        address = f"127.0.0.1:{sock.getsockname()[1]}"
        with NsqdHTTPClient(address, timeout=0.2) as client, pytest.raises(HTTPError) as exc_info:
            client.stats(topic="t")
        assert exc_info.value.status == 0
        assert isinstance(exc_info.value.__cause__, requests.Timeout)
        assert "timed out" in exc_info.value.message
        assert "topic=t" in exc_info.value.url
        # The per-call timeout overrides the default.
        with LookupdClient(address, timeout=60.0) as client, pytest.raises(HTTPError) as exc_info:
            client.lookup("t", timeout=0.2)
        assert exc_info.value.status == 0
        assert isinstance(exc_info.value.__cause__, requests.Timeout)


def test_no_reply_says_connection_refused_with_the_address() -> None:
    # issue 8: this read "HTTP 0 from http://127.0.0.1:P/ping: request failed: HTTPConnectionPool(
    # host='127.0.0.1', port=P): Max retries exceeded with url: /ping (Caused by ...)".
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))  # bound, not listening: connecting is refused
        port = sock.getsockname()[1]
        with LookupdClient(f"127.0.0.1:{port}") as client, pytest.raises(HTTPError) as exc_info:
            client.lookup("t")
    err = exc_info.value
    assert err.message == (
        f"connection refused by 127.0.0.1:{port} (is nsqd or nsqlookupd listening on that port?)"
    )
    assert str(err) == f"no reply from http://127.0.0.1:{port}/lookup?topic=t: {err.message}"
    assert "HTTP 0" not in str(err)


def test_no_reply_says_timed_out_waiting_for_the_answer() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)  # the kernel completes the connection; nobody ever answers
        address = f"127.0.0.1:{sock.getsockname()[1]}"
        with NsqdHTTPClient(address, timeout=0.2) as client, pytest.raises(HTTPError) as exc_info:
            client.ping()
    assert exc_info.value.message == (
        f"timed out after 0.2 s waiting for {address} to answer (it accepted the connection)"
    )
    assert str(exc_info.value).startswith(f"no reply from http://{address}/ping: timed out")


def test_no_reply_says_the_host_name_did_not_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    # The resolver is replaced so that the test does not depend on this machine's DNS.
    def no_such_name(host: str, *args: Any, **kwargs: Any) -> Any:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_name)
    with LookupdClient("nsqlookupd.invalid:4161") as client, pytest.raises(HTTPError) as exc_info:
        client.ping()
    assert exc_info.value.status == 0
    assert exc_info.value.message == "cannot resolve the host name 'nsqlookupd.invalid' (port 4161)"
    assert isinstance(exc_info.value.__cause__, requests.ConnectionError)


def test_no_reply_says_connect_timed_out() -> None:
    # A connect timeout needs a network that drops SYNs, which a test cannot count on: the
    # wording is checked on the exception requests raises then.
    from nsqclient.http import _no_reply

    exc = requests.ConnectTimeout("HTTPConnectionPool(host='10.1.2.3', port=4161): timed out")
    text = _no_reply(exc, "http://10.1.2.3:4161/ping", 2.0)
    assert text == "connecting to 10.1.2.3:4161 timed out after 2 s"


# -- validation before any request -------------------------------------------------------------

BAD_NAMES = ["bad topic", "", "x" * 65, "a/b", None, 42]


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_invalid_names_send_nothing(
    fake: FakeServer, fake_nsqd: NsqdHTTPClient, fake_lookupd: LookupdClient, bad: Any
) -> None:
    topic_calls: list[Callable[[Any], Any]] = [
        lambda t: fake_nsqd.pub(t, b"x"),
        lambda t: fake_nsqd.mpub(t, [b"x"]),
        lambda t: fake_nsqd.dpub(t, b"x", 1.0),
        fake_nsqd.create_topic,
        fake_nsqd.delete_topic,
        fake_nsqd.empty_topic,
        fake_nsqd.pause_topic,
        fake_nsqd.unpause_topic,
        fake_lookupd.lookup,
        fake_lookupd.channels,
        fake_lookupd.create_topic,
        fake_lookupd.delete_topic,
        lambda t: fake_lookupd.tombstone_topic(t, "127.0.0.1:4151"),
    ]
    if bad is not None:  # None is stats()' "no filter"
        topic_calls.append(lambda t: fake_nsqd.stats(topic=t))
        topic_calls.append(lambda c: fake_nsqd.stats(topic="ok", channel=c))
    for op in ("create", "delete", "empty", "pause", "unpause"):
        method = getattr(fake_nsqd, f"{op}_channel")
        topic_calls.append(lambda t, m=method: m(t, "ok"))
        topic_calls.append(lambda c, m=method: m("ok", c))
    for method in (fake_lookupd.create_channel, fake_lookupd.delete_channel):
        topic_calls.append(lambda t, m=method: m(t, "ok"))
        topic_calls.append(lambda c, m=method: m("ok", c))
    for call in topic_calls:
        with pytest.raises(ValueError, match="invalid (topic|channel) name"):
            call(bad)
    assert fake.seen == []
    fake.route("/ping", "OK")
    assert fake_nsqd.ping() is True  # the server records requests: it saw just this one
    assert len(fake.seen) == 1


def test_invalid_bodies_send_nothing(fake: FakeServer, fake_nsqd: NsqdHTTPClient) -> None:
    for body in (None, 42, {"a": 1}):
        with pytest.raises(TypeError):
            fake_nsqd.pub("t", body)
        with pytest.raises(TypeError):
            fake_nsqd.dpub("t", body, 1.0)
        with pytest.raises(TypeError):
            fake_nsqd.mpub("t", [b"ok", body])
    with pytest.raises(TypeError, match="list"):
        fake_nsqd.mpub("t", b"single body")
    with pytest.raises(ValueError, match="at least one"):
        fake_nsqd.mpub("t", [])
    with pytest.raises(ValueError, match="at least one"):
        fake_nsqd.mpub("t", iter([]))
    for delay in (-1, float("nan"), float("inf"), "5", True):
        with pytest.raises(ValueError, match="delay"):
            fake_nsqd.dpub("t", b"x", delay)
    with pytest.raises(ValueError, match="timeout"):
        fake_nsqd.pub("t", b"x", timeout=0)
    with pytest.raises(ValueError, match="needs a topic"):
        fake_nsqd.stats(channel="c")
    assert fake.seen == []


# -- addresses and producer entries ------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "base"),
    [
        ("127.0.0.1:4151", "http://127.0.0.1:4151"),
        ("http://127.0.0.1:4151", "http://127.0.0.1:4151"),
        ("http://127.0.0.1:4151/", "http://127.0.0.1:4151"),
        ("https://nsq.example:4152", "https://nsq.example:4152"),
        ("  localhost:4161 ", "http://localhost:4161"),
        ("[::1]:4161", "http://[::1]:4161"),
    ],
)
def test_addresses(address: str, base: str) -> None:
    with NsqdHTTPClient(address) as a, LookupdClient(address) as b:
        assert a.base_url == b.base_url == base
        assert a.timeout == 5.0


@pytest.mark.parametrize("address", ["", "ftp://h:1", "http://", "h:port", None])
def test_bad_addresses(address: Any) -> None:
    with pytest.raises(ValueError):
        NsqdHTTPClient(address)


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), "5", None])
def test_bad_default_timeout(timeout: Any) -> None:
    with pytest.raises(ValueError, match="timeout"):
        LookupdClient("127.0.0.1:4161", timeout=timeout)


def test_shared_session_is_used_and_not_closed(fake: FakeServer) -> None:
    fake.route("/ping", "OK")
    closed = threading.Event()

    class Session(requests.Session):
        def close(self) -> None:
            closed.set()
            super().close()

    session = Session()
    with NsqdHTTPClient(fake.address, session=session) as client:
        assert client.session is session
        assert client.ping() is True
    assert not closed.is_set()
    session.close()
