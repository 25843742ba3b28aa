"""The embedded NSQ's youzan mode over raw sockets, with the client's own encoders and decoders
(nsqclient.protocol) on the client side and nsqclient.http for lookups: partitions and their
leaders, SUB/SUB_ORDERED/PUB/MPUB per partition, traced and extended publishing, raw ids, every
error path youzan's nsqd has for them, leader moves, and youzan's lookupd replies.
"""

from __future__ import annotations

import json
import socket
import struct

import pytest
import requests

from nsqclient import protocol as p
from nsqclient.http import LookupdClient
from nsqclient.testing import EmbeddedNSQ
from nsqclient.testing.youzan.protocol import YOUZAN_VERSION

TIMEOUT = 5.0
V1 = {"Accept": "application/vnd.nsq; version=1.0"}


class Closed(Exception):
    """The server closed the connection."""


class Raw:
    """A raw protocol V2 connection: send bytes, read frames."""

    def __init__(self, address: str, identify: dict | None = None):
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=TIMEOUT)
        self.reader = p.FrameReader()
        self.frames: list[p.Frame] = []
        self.sock.sendall(p.MAGIC_V2)
        body = {"heartbeat_interval": 30000, "feature_negotiation": False}
        body.update(identify or {})
        self.sock.sendall(p.identify(body))
        assert self.read() == (p.FRAME_TYPE_RESPONSE, b"OK")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self) -> p.Frame:
        while not self.frames:
            data = self.sock.recv(65536)
            if not data:
                raise Closed()
            self.frames.extend(f for f in self.reader.feed(data) if f.data != b"_heartbeat_")
        return self.frames.pop(0)

    def call(self, data: bytes) -> p.Frame:
        self.send(data)
        return self.read()

    def closed(self) -> bool:
        """True when the server closes the connection next (nothing else arrives first)."""
        try:
            frame = self.read()
        except (Closed, ConnectionResetError):
            return True
        raise AssertionError(f"expected the connection to close, got {frame!r}")

    def message(self, ordered: bool = False, extended: bool = False) -> p.DecodedMessage:
        frame = self.read()
        assert frame.type == p.FRAME_TYPE_MESSAGE, frame
        return p.decode_message(frame.data, youzan=True, ordered=ordered, extended=extended)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def cluster():
    with EmbeddedNSQ(youzan=True, nsqd_count=2, lookupd_count=2) as c:
        yield c


@pytest.fixture
def raws():
    opened: list[Raw] = []

    def connect(cluster, node: int, identify: dict | None = None) -> Raw:
        raw = Raw(cluster.nsqds[node].tcp_address, identify)
        opened.append(raw)
        return raw

    yield connect
    for raw in opened:
        raw.close()


def ok(frame: p.Frame) -> None:
    assert frame == (p.FRAME_TYPE_RESPONSE, b"OK"), frame


def error(frame: p.Frame) -> bytes:
    assert frame.type == p.FRAME_TYPE_ERROR, frame
    return frame.data


# -- partitions and leaders


def test_partitions_spread_over_nodes_with_one_leader_each(cluster):
    cluster.create_topic("spread", partitions=4, replica=2, ordered=True)
    leaders = [cluster.partition_leader("spread", i) for i in range(4)]
    assert leaders == [0, 1, 0, 1]
    assert cluster.partition_replicas("spread", 1) == [1, 0]
    lookup = LookupdClient(cluster.lookupd.http_address).lookup("spread", access="r")
    ports = {k: v["tcp_port"] for k, v in lookup["partitions"].items()}
    assert ports == {str(i): cluster.nsqds[leaders[i]].tcp_port for i in range(4)}
    assert sorted(pr["tcp_port"] for pr in lookup["producers"]) == sorted(
        n.tcp_port for n in cluster.nsqds
    )


def test_unordered_topic_needs_as_many_nodes_as_partitions(cluster):
    with pytest.raises(ValueError, match="No node is available for topic"):
        cluster.create_topic("toomany", partitions=3)
    cluster.create_topic("multi", partitions=3, multi_part=True)
    assert cluster.partition_leader("multi", 2) == 0


def test_sub_and_pub_per_partition(cluster, raws):
    cluster.create_topic("pp", partitions=2)
    subs = []
    for part in range(2):
        sub = raws(cluster, cluster.partition_leader("pp", part))
        ok(sub.call(p.sub("pp", "ch", part)))
        sub.send(p.rdy(10))
        subs.append(sub)
    for part in range(2):
        pub = raws(cluster, cluster.partition_leader("pp", part))
        ok(pub.call(p.pub("pp", b"to %d" % part, partition=part)))
        ok(pub.call(p.mpub("pp", [b"m1", b"m2"], partition=part)))
    for part, sub in enumerate(subs):
        bodies = []
        for _ in range(3):
            msg = sub.message()
            assert msg.internal_id >> 50 == part
            assert msg.trace_id == 0 and msg.offset is None
            bodies.append(msg.body)
            sub.send(p.fin(msg.id))
        assert bodies == [b"to %d" % part, b"m1", b"m2"]


def test_pub_without_partition_goes_to_a_partition_the_node_leads(cluster, raws):
    cluster.create_topic("dflt", partitions=2)
    sub = raws(cluster, 1)
    ok(sub.call(p.sub("dflt", "ch")))  # no partition: node 1's default is partition 1
    sub.send(p.rdy(1))
    ok(raws(cluster, 1).call(p.pub("dflt", b"x")))
    assert sub.message().internal_id >> 50 == 1


def test_ids_are_raw_and_fin_req_touch_take_them_even_with_a_newline_inside(cluster, raws):
    cluster.create_topic("nl", partitions=1)
    sub = raws(cluster, 0)
    ok(sub.call(p.sub("nl", "ch", 0)))
    sub.send(p.rdy(1))
    pub = raws(cluster, 0)
    for i in range(12):  # ids 2..13: the id 10 holds a newline byte
        ok(pub.call(p.pub("nl", b"m%d" % i, partition=0)))
    seen = []
    for _ in range(12):
        msg = sub.message()
        seen.append(msg.internal_id)
        if msg.id.endswith(b"\n") and len(seen) == 9:
            sub.send(p.touch(msg.id))
            sub.send(p.req(msg.id, 0))  # back at once, delivered again next
            again = sub.message()
            assert again.id == msg.id and again.attempts == 2
            msg = again
        sub.send(p.fin(msg.id))
    assert seen == list(range(2, 14))
    assert struct.pack(">Q", seen[8]).endswith(b"\n")
    sub.send(p.nop())
    sub.send(p.fin(b"\x00\x00\x00\x00\x00\x00\x00\x0a" + b"\x00" * 8))
    assert error(sub.read()).startswith(b"E_FIN_FAILED FIN [0 0 0 0 0 0 0 10 ")


# -- ordered consumption


def test_sub_ordered_one_in_flight_offsets_increase_by_raw_size(cluster, raws):
    cluster.create_topic("ord", partitions=2, ordered=True)
    leader = cluster.partition_leader("ord", 1)
    sub = raws(cluster, leader)
    ok(sub.call(p.sub_ordered("ord", "ch", 1)))
    sub.send(p.rdy(100))
    pub = raws(cluster, leader)
    bodies = [b"a", b"bb" * 10, b"ccc" * 100]
    ok(pub.call(p.mpub("ord", bodies, partition=1)))
    first = sub.message(ordered=True)
    assert first.offset == 0 and first.raw_size == 4 + 26 + 1
    sub.send(p.req(first.id, 5000))  # a delayed REQ on an ordered channel is ignored
    sub.send(p.touch(first.id))  # so the message is still in flight
    bogus = struct.pack(">QQ", first.internal_id + 100, 0)
    # the reply to a bogus FIN comes before any other message: one in flight at a time
    assert error(sub.call(p.fin(bogus))).startswith(b"E_FIN_FAILED ")
    sub.send(p.fin(first.id))
    prev = first
    got = [first.body]
    for _ in range(2):
        msg = sub.message(ordered=True)
        assert msg.offset == prev.offset + prev.raw_size
        assert msg.raw_size == 30 + len(msg.body)
        assert msg.internal_id == prev.internal_id + 1
        got.append(msg.body)
        prev = msg
        sub.send(p.fin(msg.id))
    assert got == bodies


def test_ordered_channel_redelivers_a_requeued_message_before_the_next(cluster, raws):
    cluster.create_topic("ordreq", partitions=1, ordered=True)
    sub = raws(cluster, 0)
    ok(sub.call(p.sub_ordered("ordreq", "ch", 0)))
    sub.send(p.rdy(5))
    ok(raws(cluster, 0).call(p.mpub("ordreq", [b"1", b"2"], partition=0)))
    msg = sub.message(ordered=True)
    sub.send(p.req(msg.id, 0))
    again = sub.message(ordered=True)
    assert (again.body, again.offset, again.attempts) == (b"1", msg.offset, 2)
    sub.send(p.fin(again.id))
    assert sub.message(ordered=True).body == b"2"


def test_plain_sub_on_ordered_topic_is_refused(cluster, raws):
    cluster.create_topic("mustord", partitions=1, ordered=True)
    sub = raws(cluster, 0)
    assert (
        error(sub.call(p.sub("mustord", "ch", 0)))
        == b"E_SUB_ORDER_IS_MUST this topic is configured only allow ordered sub"
    )
    assert sub.closed()


def test_ordered_topic_pub_needs_a_partition(cluster, raws):
    cluster.create_topic("needpart", partitions=2, ordered=True)
    pub = raws(cluster, 0)
    assert error(pub.call(p.pub("needpart", b"x"))) == (
        b"E_BAD_PARTITION topic partition is not valid for multi partition: -1"
    )
    assert pub.closed()
    pub = raws(cluster, 0)
    assert error(pub.call(b"PUB needpart x\n" + struct.pack(">I", 1) + b"x")) == (
        b'E_BAD_PARTITION topic partition is not valid: strconv.Atoi: parsing "x": invalid syntax'
    )
    assert pub.closed()


# -- traced and extended publishing


def test_traced_publish_replies_30_bytes(cluster, raws):
    cluster.create_topic("tr", partitions=1)
    cluster.create_channel("tr", "ch")
    pub = raws(cluster, 0)
    frame = pub.call(p.pub_trace("tr", b"hello", 77, partition=0))
    assert frame.type == p.FRAME_TYPE_RESPONSE and len(frame.data) == 30
    one = p.decode_trace_reply(frame.data)
    assert (one.internal_id, one.trace_id, one.offset, one.raw_size) == (2, 77, 0, 30 + 5)
    two = p.decode_trace_reply(pub.call(p.pub_trace("tr", b"again!", 78, partition=0)).data)
    assert two.offset == one.offset + one.raw_size and two.internal_id == 3
    batch = p.decode_trace_reply(
        pub.call(p.mpub_trace("tr", [b"x", b"yy"], [5, 6], partition=0)).data
    )
    assert (batch.internal_id, batch.trace_id) == (4, 0)
    assert batch.offset == two.offset + two.raw_size and batch.raw_size == 31 + 32
    sub = raws(cluster, 0)
    ok(sub.call(p.sub("tr", "ch", 0)))
    sub.send(p.rdy(10))
    traces = [sub.message().trace_id for _ in range(4)]
    assert traces == [77, 78, 5, 6]
    short = b"PUB_TRACE tr 0\n" + struct.pack(">I", 8) + b"12345678"
    assert error(pub.call(short)) == b"E_BAD_BODY invalid body size 8 with trace id enabled"
    assert pub.closed()


def test_ext_headers_on_an_extend_topic(cluster, raws):
    cluster.create_topic("ext", partitions=1, ext=True)
    sub = raws(cluster, 0, {"extend_support": True})
    ok(sub.call(p.sub("ext", "ch", 0)))
    sub.send(p.rdy(10))
    pub = raws(cluster, 0)
    header = {"k": "v", "##trace_id": "99"}
    reply = pub.call(p.pub_ext("ext", b"body", header, partition=0))
    assert p.decode_trace_reply(reply.data).trace_id == 99  # a trace id in the header
    ok(pub.call(p.mpub_ext("ext", [b"b1", b"b2"], [{"a": 1}, b""], partition=0)))
    ok(pub.call(p.pub("ext", b"plain", partition=0)))
    msgs = [sub.message(extended=True) for _ in range(4)]
    assert [m.body for m in msgs] == [b"body", b"b1", b"b2", b"plain"]
    assert json.loads(msgs[0].ext) == header and msgs[0].ext_version == 4
    assert msgs[0].trace_id == 99
    assert json.loads(msgs[1].ext) == {"a": 1}
    assert msgs[2].ext_version == 0 and msgs[2].ext is None
    bad = pub.call(p.pub_ext("ext", b"x", b"{nope", partition=0))
    assert error(bad).startswith(b"E_INVALID_JSON_HEADER fail to parse json header:")
    ok(pub.call(p.pub("ext", b"still open", partition=0)))  # not fatal


def test_ext_header_on_a_plain_topic_and_extend_support_on_sub(cluster, raws):
    cluster.create_topic("plain", partitions=1)
    pub = raws(cluster, 0)
    assert error(pub.call(p.pub_ext("plain", b"x", {"a": "b"}, partition=0))) == (
        b"E_EXT_NOT_SUPPORT ext content not supported in topic plain"
    )
    ok(pub.call(p.pub("plain", b"x", partition=0)))
    sub = raws(cluster, 0, {"extend_support": True})
    assert error(sub.call(p.sub("plain", "ch", 0))) == (
        b"E_SUB_EXTEND_FORBIDDON this topic is not extended and should not identify as "
        b"extend support."
    )
    assert sub.closed()
    cluster.create_topic("extonly", partitions=1, ext=True)
    sub = raws(cluster, 0)
    assert error(sub.call(p.sub("extonly", "ch", 0))).startswith(b"E_SUB_EXTEND_NEED ")


# -- errors of the cluster


def test_pub_to_a_replica_is_not_leader_and_keeps_the_connection(cluster, raws):
    cluster.create_topic("rep", partitions=1, replica=2)
    follower = raws(cluster, 1)
    assert error(follower.call(p.pub("rep", b"x", partition=0))) == b"E_FAILED_ON_NOT_LEADER "
    assert error(follower.call(p.mpub("rep", [b"x"], partition=0))) == b"E_FAILED_ON_NOT_LEADER "
    follower.send(p.nop())
    sub = raws(cluster, 1)
    assert error(sub.call(p.sub("rep", "ch", 0))) == b"E_FAILED_ON_NOT_LEADER "
    assert sub.closed()


def test_pub_to_a_node_without_a_copy_is_topic_not_exist_and_closes(cluster, raws):
    cluster.create_topic("single", partitions=1)
    other = raws(cluster, 1)
    assert error(other.call(p.pub("single", b"x", partition=0))) == b"E_TOPIC_NOT_EXIST "
    assert other.closed()
    unknown = raws(cluster, 0)
    assert error(unknown.call(p.sub("nosuch", "ch", 0))) == b"E_TOPIC_NOT_EXIST "
    assert unknown.closed()


def test_not_writable_partition(cluster, raws):
    cluster.create_topic("ro", partitions=2)
    cluster.create_channel("ro", "ch")
    cluster.set_writable("ro", 0, False)
    pub = raws(cluster, 0)
    assert error(pub.call(p.pub("ro", b"x", partition=0))) == b"E_FAILED_ON_NOT_WRITABLE "
    lookupd = LookupdClient(cluster.lookupd.http_address)
    assert set(lookupd.lookup("ro", access="w")["partitions"]) == {"1"}
    assert set(lookupd.lookup("ro", access="r")["partitions"]) == {"0", "1"}
    cluster.set_writable("ro", 0, True)
    ok(pub.call(p.pub("ro", b"x", partition=0)))


def test_no_dpub(cluster, raws):
    cluster.create_topic("nodpub", partitions=1)
    pub = raws(cluster, 0)
    assert error(pub.call(p.dpub("nodpub", 1000, b"x"))).startswith(b"E_INVALID invalid command ")
    assert pub.closed()


# -- leader moves


def test_move_leader_to_a_replica(cluster, raws):
    cluster.create_topic("mv", partitions=1, replica=2, ordered=True)
    old = raws(cluster, 0)
    ok(old.call(p.sub_ordered("mv", "ch", 0)))
    old.send(p.rdy(1))
    pub = raws(cluster, 0)
    ok(pub.call(p.mpub("mv", [b"1", b"2"], partition=0)))
    first = old.message(ordered=True)
    cluster.move_leader("mv", 0, 1)
    assert old.closed()  # the old leader drops the partition's consumers
    assert error(pub.call(p.pub("mv", b"3", partition=0))) == b"E_FAILED_ON_NOT_LEADER "
    lookup = LookupdClient(cluster.lookupd.http_address).lookup("mv", access="w")
    assert lookup["partitions"]["0"]["tcp_port"] == cluster.nsqds[1].tcp_port
    new = raws(cluster, 1)
    ok(new.call(p.sub_ordered("mv", "ch", 0)))
    new.send(p.rdy(1))
    again = new.message(ordered=True)  # the unfinished message comes first, same id/offset
    assert (again.id, again.offset, again.body) == (first.id, first.offset, b"1")
    new.send(p.fin(again.id))
    assert new.message(ordered=True).body == b"2"
    ok(raws(cluster, 1).call(p.pub("mv", b"3", partition=0)))


def test_move_leader_to_a_node_without_a_copy(cluster, raws):
    cluster.create_topic("mv2", partitions=1)
    cluster.create_channel("mv2", "ch")
    cluster.move_leader("mv2", 0, 1)
    assert cluster.partition_replicas("mv2", 0) == [1]
    stale = raws(cluster, 0)
    assert error(stale.call(p.pub("mv2", b"x", partition=0))) == b"E_TOPIC_NOT_EXIST "
    ok(raws(cluster, 1).call(p.pub("mv2", b"x", partition=0)))


# -- lookupd


def test_lookup_wrapped_unless_version_1(cluster):
    cluster.create_topic("lk", partitions=2, replica=1, ordered=True, ext=True)
    url = cluster.lookupd.http_url + "/lookup?topic=lk&access=r&metainfo=true"
    wrapped = requests.get(url, timeout=TIMEOUT)
    assert wrapped.status_code == 200
    doc = wrapped.json()
    assert (doc["status_code"], doc["status_txt"]) == (200, "OK")
    bare = requests.get(url, headers=V1, timeout=TIMEOUT)
    assert bare.headers["X-NSQ-Content-Type"] == "nsq; version=1.0"
    data = bare.json()
    assert data == doc["data"]
    assert data["meta"] == {
        "disable_channel_auto_create": False,
        "extend_support": True,
        "multi_part": False,
        "ordered": True,
        "partition_num": 2,
        "replica": 1,
    }
    peer = data["partitions"]["0"]
    assert peer["version"] == YOUZAN_VERSION and peer["id"] == peer["remote_address"]
    assert (
        "meta"
        not in requests.get(url.replace("&metainfo=true", ""), timeout=TIMEOUT).json()["data"]
    )


def test_lookup_for_writing_needs_a_channel(cluster, raws):
    cluster.create_topic("nochan", partitions=2, ordered=True)
    url = cluster.lookupd.http_url + "/lookup?topic=nochan&access=w&metainfo=true"
    text = "Topic has no channel, should init at least one for the new topic"
    wrapped = requests.get(url, timeout=TIMEOUT)
    assert wrapped.status_code == 500
    assert wrapped.json() == {"status_code": 500, "status_txt": text, "data": None}
    bare = requests.get(url, headers=V1, timeout=TIMEOUT)
    assert (bare.status_code, bare.json()) == (404, {"message": text})
    sub = raws(cluster, cluster.partition_leader("nochan", 1))
    ok(sub.call(p.sub_ordered("nochan", "ch", 1)))
    found = LookupdClient(cluster.lookupd.http_address).lookup("nochan", "w", metainfo=True)
    assert set(found["partitions"]) == {"1"} and found["channels"] == ["ch"]
    assert found["meta"]["partition_num"] == 2
    unknown = requests.get(cluster.lookupd.http_url + "/lookup?topic=zz&access=r", timeout=TIMEOUT)
    assert unknown.json()["data"] == {"channels": [], "partitions": {}, "producers": []}


def test_listlookup_names_every_lookupd(cluster):
    client = LookupdClient(cluster.lookupds[1].http_address)
    assert client.listlookup() == [lk.http_address for lk in cluster.lookupds]
    doc = requests.get(cluster.lookupd.http_url + "/listlookup", headers=V1, timeout=TIMEOUT)
    node = doc.json()["lookupdnodes"][0]
    assert node["NodeIP"] == "127.0.0.1" and node["HttpPort"] == str(cluster.lookupd.http_port)
    assert doc.json()["lookupdleader"] == node


def test_topic_create_over_http(cluster):
    base = cluster.lookupd.http_url + "/topic/create"
    params = {"topic": "viahttp", "partition_num": "2", "replicator": "1", "orderedmulti": "true"}
    created = requests.post(base, params=params, timeout=TIMEOUT)
    assert (created.status_code, created.content) == (200, b"")
    assert cluster.partition_leader("viahttp", 1) == 1
    again = requests.post(base, params={**params, "extend": "true"}, timeout=TIMEOUT)
    assert (again.status_code, again.json()) == (400, {"message": "already exist"})
    missing = requests.post(base, params={"topic": "x", "replicator": "1"}, timeout=TIMEOUT)
    assert missing.json() == {"message": "MISSING_ARG_TOPIC_PARTITION_NUM"}
    other = requests.post(
        cluster.lookupds[1].http_url + "/topic/create",
        params={**params, "topic": "y"},
        timeout=TIMEOUT,
    )
    assert (other.status_code, other.json()) == (400, {"message": "E_FAILED_ON_NOT_LEADER"})


def test_peer_id_changes_across_restarts_distributed_id_does_not(cluster):
    cluster.create_topic("ids", partitions=1)
    client = LookupdClient(cluster.lookupd.http_address)
    before = client.lookup("ids")["partitions"]["0"]
    cluster.stop_nsqd(0)
    assert client.lookup("ids")["partitions"] == {}
    cluster.start_nsqd(0)
    after = client.lookup("ids")["partitions"]["0"]
    assert after["distributed_id"] == before["distributed_id"]
    assert after["id"] != before["id"]


def test_classic_cluster_has_no_youzan_controls():
    with EmbeddedNSQ(nsqd_count=1, lookupd=False) as classic:
        with pytest.raises(RuntimeError, match="not a youzan cluster"):
            classic.create_topic("t", 2)


def test_standalone_youzan_mode(tmp_path):
    """``python -m nsqclient.testing --youzan``: a youzan cluster in its own process."""
    import subprocess
    import sys

    from nsqclient.testing.waiting import wait_for

    socks = [socket.socket() for _ in range(4)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    tcp, http, ltcp, lhttp = (s.getsockname()[1] for s in socks)
    for s in socks:
        s.close()
    with open(tmp_path / "stderr.txt", "w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "nsqclient.testing", "--youzan", "--nsqd-count", "2"]
            + ["--lookupd-count", "2", "--tcp-address", f"127.0.0.1:{tcp}"]
            + ["--http-address", f"127.0.0.1:{http}"]
            + ["--lookupd-tcp-address", f"127.0.0.1:{ltcp}"]
            + ["--lookupd-http-address", f"127.0.0.1:{lhttp}"],
            stderr=log_file,
        )
    try:
        lookupd = LookupdClient(f"127.0.0.1:{lhttp}", timeout=1.0)

        def up() -> bool:
            try:
                return lookupd.ping()
            except Exception:
                return False

        wait_for(up, timeout=20.0, message="the standalone youzan cluster did not start")
        params = {"topic": "sa", "partition_num": "2", "replicator": "1", "orderedmulti": "true"}
        created = requests.post(f"http://127.0.0.1:{lhttp}/topic/create", params=params, timeout=5)
        assert created.status_code == 200
        assert len(lookupd.listlookup()) == 2
        partitions = lookupd.lookup("sa", "r", metainfo=True)["partitions"]
        assert partitions["0"]["tcp_port"] == tcp and partitions["1"]["tcp_port"] != tcp
        raw = Raw(f"127.0.0.1:{tcp}")
        try:
            tr = p.decode_trace_reply(raw.call(p.pub_trace("sa", b"x", 3, partition=0)).data)
            assert (tr.internal_id, tr.trace_id) == (2, 3)
        finally:
            raw.close()
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) == 0


# -- fault controls: a leader refusing publishes, a lookupd hanging or refusing


def test_refuse_publishes_answers_the_error_stores_nothing_and_keeps_the_connection(cluster, raws):
    cluster.create_topic("refused", partitions=1)
    cluster.create_channel("refused", "ch")
    sub = raws(cluster, 0)
    ok(sub.call(p.sub("refused", "ch", 0)))
    sub.send(p.rdy(10))
    pub = raws(cluster, 0)
    cluster.refuse_publishes(0, "E_PUB_FAILED exiting", count=2)
    assert error(pub.call(p.pub("refused", b"a", partition=0))) == b"E_PUB_FAILED exiting"
    # an MPUB gets youzan's E_MPUB_FAILED for the same cause
    assert error(pub.call(p.mpub("refused", [b"b"], partition=0))) == b"E_MPUB_FAILED exiting"
    ok(pub.call(p.pub("refused", b"stored", partition=0)))  # the count is spent
    assert sub.message().body == b"stored"  # nothing refused was stored before it
    cluster.refuse_publishes(0, "E_FAILED_ON_NOT_LEADER ")
    for _ in range(3):
        frame = pub.call(p.pub_trace("refused", b"x", 7, partition=0))
        assert error(frame) == b"E_FAILED_ON_NOT_LEADER "
    cluster.accept_publishes(0)
    ok(pub.call(p.pub("refused", b"again", partition=0)))
    with pytest.raises(ValueError, match="E_\\* code"):
        cluster.refuse_publishes(0, "exiting")


@pytest.mark.parametrize("youzan", [True, False], ids=["youzan", "classic"])
def test_a_stalled_lookupd_hangs_until_unstalled_and_a_stopped_one_refuses(youzan):
    with EmbeddedNSQ(youzan=youzan, nsqd_count=1, lookupd_count=2) as c:
        if youzan:
            c.create_topic("hang", partitions=1)
        lookupd = c.lookupds[0]
        url = f"http://{lookupd.http_address}/lookup?topic=hang"
        c.stall_lookupd(0)
        with pytest.raises(requests.exceptions.ReadTimeout):
            requests.get(url, timeout=0.3)
        if youzan:  # the other lookupd answers meanwhile
            other = f"http://{c.lookupds[1].http_address}/lookup?topic=hang"
            assert requests.get(other, headers=V1, timeout=TIMEOUT).status_code == 200
        c.unstall_lookupd(0)
        assert requests.get(url, headers=V1, timeout=TIMEOUT).status_code in (200, 404)
        c.stop_lookupd(0)
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(url, timeout=TIMEOUT)
        c.start_lookupd(0)
        assert requests.get(url, headers=V1, timeout=TIMEOUT).status_code in (200, 404)
        if not youzan:
            with pytest.raises(IndexError):
                c.stall_lookupd(1)
