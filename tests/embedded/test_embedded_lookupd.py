"""The embedded nsqlookupd: registration by embedded nsqds over the ``  V1`` TCP protocol,
its HTTP API (1.x JSON, or pre-1.0 wrapped JSON on request) and restarts."""

from __future__ import annotations

import json
import socket
import struct

import pytest
import requests

from nsqclient import protocol as p
from nsqclient.testing import EmbeddedNSQ
from nsqclient.testing.waiting import wait_for

TIMEOUT = 5.0


def get(url: str, **kwargs) -> requests.Response:
    return requests.get(url, timeout=TIMEOUT, **kwargs)


def post(url: str, **kwargs) -> requests.Response:
    return requests.post(url, timeout=TIMEOUT, **kwargs)


def lookup(cluster, topic: str) -> dict | None:
    r = get(f"{cluster.lookupd.http_url}/lookup?topic={topic}")
    return r.json() if r.status_code == 200 else None


def producer_ports(cluster, topic: str) -> set[int]:
    data = lookup(cluster, topic)
    return {pr["tcp_port"] for pr in data["producers"]} if data else set()


class Sub:
    """A minimal raw subscriber (enough to make nsqd create a topic and channel)."""

    def __init__(self, node, topic: str, channel: str):
        self.sock = socket.create_connection((node.host, node.tcp_port), timeout=TIMEOUT)
        self.sock.sendall(p.MAGIC_V2 + p.sub(topic, channel))
        reader = p.FrameReader()
        frames: list[p.Frame] = []
        while not frames:
            frames = reader.feed(self.sock.recv(4096))
        assert frames[0] == (p.FRAME_TYPE_RESPONSE, b"OK")

    def close(self) -> None:
        self.sock.close()


def publish(node, topic: str, body: bytes = b"x") -> None:
    r = post(f"{node.http_url}/pub?topic={topic}", data=body)
    assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def cluster():
    with EmbeddedNSQ(nsqd_count=2) as c:
        yield c


def test_nsqd_registers_topics_and_channels(cluster):
    node = cluster.nsqds[0]
    sub = Sub(node, "reg", "c1")
    wait_for(lambda: (lookup(cluster, "reg") or {}).get("channels") == ["c1"])
    data = lookup(cluster, "reg")
    (producer,) = data["producers"]
    assert list(producer) == [
        "remote_address", "hostname", "broadcast_address", "tcp_port", "http_port", "version",
    ]  # fmt: skip
    assert (producer["broadcast_address"], producer["tcp_port"], producer["http_port"]) == (
        "127.0.0.1",
        node.tcp_port,
        node.http_port,
    )
    assert producer["version"] == "1.3.0"
    r = get(f"{cluster.lookupd.http_url}/lookup?topic=reg")
    assert r.headers["X-Nsq-Content-Type"] == "nsq; version=1.0"
    assert "status_code" not in r.json()
    sub.close()


def test_lookup_unknown_topic_is_404_never_wrapped(cluster):
    r = get(f"{cluster.lookupd.http_url}/lookup?topic=never-seen")
    assert r.status_code == 404
    assert r.json() == {"message": "TOPIC_NOT_FOUND"}


def test_topics_channels_nodes(cluster):
    publish(cluster.nsqds[1], "listed")
    wait_for(lambda: "listed" in get(f"{cluster.lookupd.http_url}/topics").json()["topics"])
    assert get(f"{cluster.lookupd.http_url}/channels?topic=listed").json() == {"channels": []}
    nodes = get(f"{cluster.lookupd.http_url}/nodes").json()["producers"]
    assert {n["tcp_port"] for n in nodes} == {n.tcp_port for n in cluster.nsqds}
    node1 = next(n for n in nodes if n["tcp_port"] == cluster.nsqds[1].tcp_port)
    assert "listed" in node1["topics"]
    assert len(node1["tombstones"]) == len(node1["topics"])


def test_deletes_unregister(cluster):
    node = cluster.nsqds[0]
    post(f"{node.http_url}/topic/create?topic=gone")
    post(f"{node.http_url}/channel/create?topic=gone&channel=c")
    wait_for(lambda: lookup(cluster, "gone") and lookup(cluster, "gone")["channels"] == ["c"])
    post(f"{node.http_url}/channel/delete?topic=gone&channel=c")
    post(f"{node.http_url}/topic/delete?topic=gone")
    # nsqlookupd keeps the registration keys but the node no longer produces them
    wait_for(lambda: lookup(cluster, "gone")["producers"] == [])


def test_ephemeral_channel_registration_disappears(cluster):
    sub = Sub(cluster.nsqds[0], "ephreg", "c#ephemeral")
    wait_for(lambda: (lookup(cluster, "ephreg") or {}).get("channels") == ["c#ephemeral"])
    sub.close()
    wait_for(lambda: lookup(cluster, "ephreg")["channels"] == [])


def test_nsqd_precreates_channels_known_to_lookupd(cluster):
    a, b = cluster.nsqds
    sub = Sub(a, "pre", "archive")
    wait_for(lambda: lookup(cluster, "pre"))
    publish(b, "pre")  # node b learns from nsqlookupd that "pre" has channel "archive"
    stats = get(f"{b.http_url}/stats?format=json&topic=pre").json()
    channels = stats["topics"][0]["channels"]
    assert [c["channel_name"] for c in channels] == ["archive"]
    assert channels[0]["depth"] == 1
    sub.close()


def test_lookupd_http_create_and_delete(cluster):
    url = cluster.lookupd.http_url
    assert post(f"{url}/topic/create?topic=manual").status_code == 200
    assert post(f"{url}/channel/create?topic=manual&channel=c").status_code == 200
    assert lookup(cluster, "manual") == {"channels": ["c"], "producers": []}
    assert post(f"{url}/channel/delete?topic=manual&channel=c").status_code == 200
    r = post(f"{url}/channel/delete?topic=manual&channel=c")
    assert (r.status_code, r.json()) == (404, {"message": "CHANNEL_NOT_FOUND"})
    assert post(f"{url}/topic/delete?topic=manual").status_code == 200
    assert lookup(cluster, "manual") is None
    r = post(f"{url}/topic/create?topic=bad!")
    assert (r.status_code, r.json()) == (400, {"message": "INVALID_ARG_TOPIC"})


def test_tombstone_hides_a_producer(cluster):
    node = cluster.nsqds[1]
    publish(node, "tomb")
    wait_for(lambda: node.tcp_port in producer_ports(cluster, "tomb"))
    r = post(f"{cluster.lookupd.http_url}/topic/tombstone?topic=tomb&node={node.http_address}")
    assert r.status_code == 200
    assert node.tcp_port not in producer_ports(cluster, "tomb")


def test_stopped_node_is_removed_and_comes_back():
    with EmbeddedNSQ(nsqd_count=2) as c:
        publish(c.nsqds[0], "s")
        publish(c.nsqds[1], "s")
        both = {n.tcp_port for n in c.nsqds}
        wait_for(lambda: producer_ports(c, "s") == both)
        c.stop_nsqd(1)
        wait_for(lambda: producer_ports(c, "s") == {c.nsqds[0].tcp_port})
        c.start_nsqd(1)
        wait_for(lambda: producer_ports(c, "s") == both)


def test_lookupd_restart_forgets_and_nodes_reregister():
    with EmbeddedNSQ(nsqd_count=1) as c:
        publish(c.nsqd, "again")
        wait_for(lambda: lookup(c, "again"))
        ports = (c.lookupd.tcp_port, c.lookupd.http_port)
        c.stop_lookupd()
        with pytest.raises(requests.ConnectionError):
            get(f"{c.lookupd.http_url}/ping")
        c.start_lookupd()
        assert (c.lookupd.tcp_port, c.lookupd.http_port) == ports
        wait_for(lambda: producer_ports(c, "again") == {c.nsqd.tcp_port})


def test_add_nsqd_registers():
    with EmbeddedNSQ(nsqd_count=1) as c:
        node = c.add_nsqd(msg_timeout=5.0)
        assert len(c.nsqds) == 2 and c.nsqds[1] is node
        publish(node, "added")
        wait_for(lambda: producer_ports(c, "added") == {node.tcp_port})


def test_legacy_json_wraps_replies():
    with EmbeddedNSQ(nsqd_count=1, lookupd_legacy_json=True) as c:
        publish(c.nsqd, "old")
        data = wait_for(lambda: get(f"{c.lookupd.http_url}/lookup?topic=old").json()["data"])
        r = get(f"{c.lookupd.http_url}/lookup?topic=old")
        body = r.json()
        assert (body["status_code"], body["status_txt"]) == (200, "OK")
        assert data["producers"][0]["tcp_port"] == c.nsqd.tcp_port
        missing = get(f"{c.lookupd.http_url}/lookup?topic=nope")
        assert missing.status_code == 404
        assert missing.json() == {"status_code": 404, "status_txt": "TOPIC_NOT_FOUND", "data": None}
        assert get(f"{c.lookupd.http_url}/ping").text == "OK"


# --------------------------------------------------------------------------------------------
# The V1 TCP protocol itself


def _v1(cluster):
    sock = socket.create_connection(
        (cluster.lookupd.host, cluster.lookupd.tcp_port), timeout=TIMEOUT
    )
    sock.sendall(b"  V1")
    return sock


def _reply(sock) -> bytes:
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        if not chunk:
            raise ConnectionError("closed")
        head += chunk
    size = struct.unpack(">I", head)[0]
    body = b""
    while len(body) < size:
        body += sock.recv(size - len(body))
    return body


def test_v1_protocol_by_hand(cluster):
    sock = _v1(cluster)
    sock.sendall(b"REGISTER hand\n")
    assert _reply(sock) == b"E_INVALID client must IDENTIFY"
    sock.close()

    sock = _v1(cluster)
    ident = json.dumps(
        {"broadcast_address": "10.0.0.9", "hostname": "h", "tcp_port": 1, "http_port": 2,
         "version": "1.3.0"}
    ).encode()  # fmt: skip
    sock.sendall(b"IDENTIFY\n" + struct.pack(">I", len(ident)) + ident)
    info = json.loads(_reply(sock))
    assert info["tcp_port"] == cluster.lookupd.tcp_port
    assert info["http_port"] == cluster.lookupd.http_port
    assert info["version"] == "1.3.0"
    sock.sendall(b"REGISTER hand ch\nPING\n")
    assert (_reply(sock), _reply(sock)) == (b"OK", b"OK")
    data = lookup(cluster, "hand")
    assert data["channels"] == ["ch"]
    assert any(pr["broadcast_address"] == "10.0.0.9" for pr in data["producers"])
    sock.sendall(b"UNREGISTER hand ch\n")
    assert _reply(sock) == b"OK"
    sock.sendall(b"REGISTER bad! \n")
    assert _reply(sock) == b"E_BAD_TOPIC REGISTER topic name 'bad!' is not valid"
    sock.close()
    wait_for(lambda: not any(pr["tcp_port"] == 1 for pr in lookup(cluster, "hand")["producers"]))


def test_v1_bad_magic(cluster):
    sock = socket.create_connection(
        (cluster.lookupd.host, cluster.lookupd.tcp_port), timeout=TIMEOUT
    )
    sock.sendall(b"  V2")
    assert _reply(sock) == b"E_BAD_PROTOCOL"
    assert sock.recv(10) == b""
    sock.close()
