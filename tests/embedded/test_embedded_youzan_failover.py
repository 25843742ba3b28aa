"""The embedded youzan cluster losing a node, seen as a client sees it: raw lookups over HTTP
(nsqclient.http.LookupdClient) and raw PUB/SUB through nsqclient's Connection to a chosen node.

What real youzan does (youzan/nsq: consistence/nsqlookup_coordinator.go, nsqd_coordinator.go,
nsqd_coordinator_cluster_write.go, nsqd_node_etcd.go, nsqdserver/protocol_v2.go, lookup.go,
nsqlookupd/http.go) and what is checked here:

- SIGKILL: the node's listeners and connections go at once and lookupd stops naming it at once;
  the partitions it led get a new leader (from the live ISR) only when its etcd registration
  expires (``registration_ttl``, 20 s in youzan).  Back before that, it keeps its roles.
- SIGTERM: the leader hands its partitions over before it stops.
- A partition takes writes only while the live part of its ISR is a majority of the replicator;
  otherwise PUB/MPUB get E_FAILED_ON_NOT_WRITABLE (the connection stays open), the partition is
  unregistered (``access=w`` leaves it out, or names its leader when nothing else is left).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import requests

from nsqclient import protocol as p
from nsqclient.config import Config
from nsqclient.conn._connection import Connection
from nsqclient.errors import FailedOnNotLeaderError, FailedOnNotWritableError
from nsqclient.http import LookupdClient
from nsqclient.protocol import DecodedMessage
from nsqclient.testing import EmbeddedNSQ
from nsqclient.testing.waiting import wait_for

TIMEOUT = 5.0
#: long enough that a test never sees a registration expire unless it waits for it
LONG_TTL = 60.0


class Collector:
    """A Connection delegate keeping the messages it receives."""

    def __init__(self) -> None:
        self.messages: list[DecodedMessage] = []
        self.lock = threading.Lock()

    def on_message(self, conn: Connection, message: DecodedMessage) -> None:
        with self.lock:
            self.messages.append(message)

    def on_server_error(self, conn: Connection, error: Exception) -> None:
        pass

    def on_close(self, conn: Connection, reason: BaseException | None) -> None:
        pass


@pytest.fixture
def make_cluster() -> Iterator:
    made: list[EmbeddedNSQ] = []

    def make(nsqd_count: int, registration_ttl: float = LONG_TTL) -> EmbeddedNSQ:
        cluster = EmbeddedNSQ(
            youzan=True, nsqd_count=nsqd_count, registration_ttl=registration_ttl
        ).start()
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()


@pytest.fixture
def connect(make_cluster) -> Iterator:
    """``connect(cluster, node)``: a youzan Connection to one node (closed afterwards)."""
    opened: list[Connection] = []

    def conn_to(cluster: EmbeddedNSQ, node: int, delegate: Collector | None = None) -> Connection:
        config = Config(youzan=True, heartbeat_interval=30.0)
        conn = Connection(cluster.nsqds[node].tcp_address, config, delegate or Collector())
        conn.connect()
        opened.append(conn)
        return conn

    yield conn_to
    for conn in opened:
        conn.close(timeout=1.0)


def pub(conn: Connection, topic: str, partition: int, body: bytes) -> bytes:
    result: bytes = conn.request(p.pub(topic, body, partition), messages=1).result(TIMEOUT)
    return result


def lookupd(cluster: EmbeddedNSQ) -> LookupdClient:
    assert cluster.lookupd is not None
    return LookupdClient(cluster.lookupd.http_address)


def node_of(cluster: EmbeddedNSQ, producer: dict) -> int:
    """The index of the node a lookup's producer entry names."""
    ports = [n.tcp_port for n in cluster.nsqds]
    return ports.index(producer["tcp_port"])


def listed(cluster: EmbeddedNSQ, topic: str, access: str = "r") -> dict[int, int]:
    """partition -> node, as the lookupd answers ``/lookup?topic=&access=`` now."""
    answer = lookupd(cluster).lookup(topic, access=access)
    return {int(k): node_of(cluster, v) for k, v in answer["partitions"].items()}


def listed_nodes(cluster: EmbeddedNSQ) -> set[int]:
    return {node_of(cluster, n) for n in lookupd(cluster).nodes()}


def refuses_connections(cluster: EmbeddedNSQ, node: int) -> bool:
    """Both the TCP and the HTTP port of ``node`` refuse connections."""
    target = cluster.nsqds[node]
    try:
        socket.create_connection((target.host, target.tcp_port), timeout=TIMEOUT).close()
    except ConnectionRefusedError:
        pass
    else:
        return False
    try:
        requests.get(target.http_url + "/ping", timeout=TIMEOUT)
    except requests.ConnectionError:
        return True
    return False


def subscribe(connect, cluster: EmbeddedNSQ, node: int, topic: str, channel: str, partition: int):
    collector = Collector()
    conn = connect(cluster, node, collector)
    assert conn.request(p.sub(topic, channel, partition)).result(TIMEOUT) == b"OK"
    conn.send(p.rdy(10))
    return conn, collector


# -- SIGKILL


def test_sigkill_drops_the_node_at_once_and_elects_a_leader_after_the_ttl(make_cluster, connect):
    ttl = 2.0
    cluster = make_cluster(3, registration_ttl=ttl)
    cluster.create_topic("killed", partitions=1, replica=3)
    cluster.create_channel("killed", "c")
    assert cluster.partition_leader("killed", 0) == 0
    assert listed(cluster, "killed", "w") == {0: 0}
    leader_conn = connect(cluster, 0)
    assert pub(leader_conn, "killed", 0, b"before") == b"OK"

    started = time.monotonic()
    cluster.kill_nsqd(0)
    # at once: connections gone, ports closed, lookupd names neither the node nor its partition
    wait_for(
        lambda: leader_conn.is_closed, timeout=1.0, message="the dead node's connection stayed up"
    )
    assert refuses_connections(cluster, 0)
    assert listed(cluster, "killed", "r") == {}
    assert listed(cluster, "killed", "w") == {}
    assert listed_nodes(cluster) == {1, 2}
    # ... but no election before the registration expires
    assert cluster.partition_leader("killed", 0) == 0
    assert cluster.listed_leader("killed", 0) is None
    assert cluster.partition_isr("killed", 0) == [0, 1, 2]

    new = cluster.wait_leader("killed", 0, not_node=0, timeout=ttl + 10.0)
    assert time.monotonic() - started >= ttl - 0.05
    assert new == 1  # the first live member of the ISR
    assert cluster.partition_isr("killed", 0) == [1, 2]
    assert listed(cluster, "killed", "w") == {0: 1}
    # the new leader takes writes (2 of 3 in the ISR), the other replica says not leader
    assert pub(connect(cluster, 1), "killed", 0, b"after") == b"OK"
    with pytest.raises(FailedOnNotLeaderError):
        pub(connect(cluster, 2), "killed", 0, b"nope")
    # what the dead leader had is delivered by the new one
    _, collector = subscribe(connect, cluster, 1, "killed", "c", 0)
    wait_for(lambda: len(collector.messages) == 2, message=lambda: repr(collector.messages))
    assert [m.body for m in collector.messages] == [b"before", b"after"]
    assert refuses_connections(cluster, 0)


def test_sigkill_then_restart_before_the_ttl_keeps_the_leader(make_cluster, connect):
    ttl = 2.0
    cluster = make_cluster(3, registration_ttl=ttl)
    cluster.create_topic("back", partitions=1, replica=3)
    cluster.create_channel("back", "c")
    cluster.kill_nsqd(0)
    cluster.kill_nsqd(1)  # its registration expires later than node 0's would have
    assert listed(cluster, "back") == {}
    cluster.start_nsqd(0)
    assert listed(cluster, "back", "w") == {0: 0}
    assert pub(connect(cluster, 0), "back", 0, b"x") == b"OK"  # 0 and 2 of 3: a majority
    # node 1's registration expires: it leaves the ISR; by then node 0's would have expired too
    wait_for(
        lambda: cluster.partition_isr("back", 0) == [0, 2],
        timeout=ttl + 10.0,
        message=lambda: f"ISR {cluster.partition_isr('back', 0)}",
    )
    assert cluster.partition_leader("back", 0) == 0
    assert listed(cluster, "back", "w") == {0: 0}
    assert pub(connect(cluster, 0), "back", 0, b"y") == b"OK"


def test_sigkill_of_a_leader_without_a_live_isr_member_elects_nobody(make_cluster, connect):
    cluster = make_cluster(2, registration_ttl=0.5)
    cluster.create_topic("alone", partitions=1, replica=1)  # led by 0, no copy elsewhere
    cluster.create_topic("pair", partitions=1, replica=2)  # led by 0, copy on 1
    for topic in ("alone", "pair"):
        cluster.create_channel(topic, "c")
    cluster.kill_nsqd(0)
    assert cluster.wait_leader("pair", 0, not_node=0) == 1  # node 0's registration expired
    assert listed(cluster, "alone") == {}
    assert cluster.partition_leader("alone", 0) == 0
    # replicator 2 with one node left: the new leader takes no writes, lookupd still names it
    assert listed(cluster, "pair", "w") == {0: 1}
    with pytest.raises(FailedOnNotWritableError):
        pub(connect(cluster, 1), "pair", 0, b"x")

    cluster.start_nsqd(0)
    assert listed(cluster, "alone", "w") == {0: 0}
    assert pub(connect(cluster, 0), "alone", 0, b"x") == b"OK"
    # node 0 is back in the ISR of "pair" without leading it again: writes resume on node 1
    assert cluster.partition_leader("pair", 0) == 1
    assert cluster.partition_isr("pair", 0) == [1, 0]
    assert listed(cluster, "pair", "w") == {0: 1}
    assert pub(connect(cluster, 1), "pair", 0, b"y") == b"OK"
    with pytest.raises(FailedOnNotLeaderError):
        pub(connect(cluster, 0), "pair", 0, b"z")


# -- SIGTERM


@pytest.mark.parametrize("replica", [2, 3])
def test_sigterm_hands_the_leadership_over_at_once(make_cluster, connect, replica):
    cluster = make_cluster(3)  # a registration never expires during the test
    cluster.create_topic("term", partitions=1, replica=replica)
    cluster.create_channel("term", "c")
    conn, _ = subscribe(connect, cluster, 0, "term", "c", 0)
    assert pub(connect(cluster, 0), "term", 0, b"before") == b"OK"

    cluster.terminate_nsqd(0)
    assert cluster.partition_leader("term", 0) == 1
    assert cluster.listed_leader("term", 0) == 1
    assert listed(cluster, "term") == {0: 1}
    assert cluster.partition_isr("term", 0) == [1, 2][: replica - 1]
    assert conn.wait_closed(TIMEOUT)
    assert refuses_connections(cluster, 0)
    _, collector = subscribe(connect, cluster, 1, "term", "c", 0)
    wait_for(lambda: collector.messages, message="the new leader delivered nothing")
    assert collector.messages[0].body == b"before"
    writer = connect(cluster, 1)
    if replica == 3:
        assert listed(cluster, "term", "w") == {0: 1}
        assert pub(writer, "term", 0, b"after") == b"OK"
    else:  # one of two left: no majority, no writes; lookupd still names the leader for w
        assert listed(cluster, "term", "w") == {0: 1}
        with pytest.raises(FailedOnNotWritableError):
            pub(writer, "term", 0, b"after")
        cluster.start_nsqd(0)  # back in the ISR, not the leader
        assert cluster.partition_isr("term", 0) == [1, 0]
        assert pub(writer, "term", 0, b"after") == b"OK"
    assert cluster.partition_leader("term", 0) == 1


# -- writes need a majority of the ISR


@pytest.mark.parametrize(("replica", "writable"), [(2, False), (3, True)])
def test_writes_need_a_live_isr_majority(make_cluster, connect, replica, writable):
    cluster = make_cluster(3)
    cluster.create_topic("maj", partitions=1, replica=replica)
    cluster.create_channel("maj", "c")
    leader = connect(cluster, 0)
    assert pub(leader, "maj", 0, b"a") == b"OK"
    cluster.kill_nsqd(1)  # a replica, not the leader; its registration does not expire
    assert listed(cluster, "maj", "r") == {0: 0}
    assert listed(cluster, "maj", "w") == {0: 0}  # the only partition: still named for w
    if writable:
        assert pub(leader, "maj", 0, b"b") == b"OK"
        assert leader.request(p.mpub("maj", [b"c", b"d"], 0)).result(TIMEOUT) == b"OK"
    else:
        for _ in range(2):  # not fatal: the connection stays open
            with pytest.raises(FailedOnNotWritableError):
                pub(leader, "maj", 0, b"b")
        with pytest.raises(FailedOnNotWritableError):
            leader.request(p.mpub("maj", [b"c", b"d"], 0)).result(TIMEOUT)
        assert not leader.is_closed
        cluster.start_nsqd(1)
        assert pub(leader, "maj", 0, b"b") == b"OK"
    assert cluster.partition_leader("maj", 0) == 0


def test_lookup_for_writing_leaves_out_a_partition_without_isr_majority(make_cluster, connect):
    cluster = make_cluster(3)
    cluster.create_topic("parts", partitions=2, replica=2, multi_part=True)  # p0: 0,1; p1: 1,2
    cluster.create_channel("parts", "c")
    assert cluster.partition_replicas("parts", 1) == [1, 2]
    cluster.kill_nsqd(2)
    assert listed(cluster, "parts", "r") == {0: 0, 1: 1}
    assert listed(cluster, "parts", "w") == {0: 0}
    assert 1 not in {int(n) for n in _nodes_partitions(cluster, 1)}
    with pytest.raises(FailedOnNotWritableError):
        pub(connect(cluster, 1), "parts", 1, b"x")
    assert pub(connect(cluster, 0), "parts", 0, b"x") == b"OK"
    cluster.start_nsqd(2)
    assert listed(cluster, "parts", "w") == {0: 0, 1: 1}
    assert pub(connect(cluster, 1), "parts", 1, b"x") == b"OK"


def _nodes_partitions(cluster: EmbeddedNSQ, node: int) -> list[str]:
    """The partitions of "parts" that ``/nodes`` says ``node`` registered."""
    for entry in lookupd(cluster).nodes():
        if node_of(cluster, entry) == node:
            return list(entry.get("partitions", {}).get("parts", []))
    return []


# -- the controls themselves


def test_failover_controls_and_options():
    with pytest.raises(ValueError, match="registration_ttl"):
        EmbeddedNSQ(youzan=True, registration_ttl=-1.0)
    assert EmbeddedNSQ(youzan=True).registration_ttl == 20.0
    with EmbeddedNSQ(nsqd_count=1, lookupd=False) as classic:
        with pytest.raises(RuntimeError, match="not a youzan cluster"):
            classic.kill_nsqd(0)
        with pytest.raises(RuntimeError, match="not a youzan cluster"):
            classic.wait_leader("t", 0)
        classic.terminate_nsqd(0)  # a classic nsqd's stop is its SIGTERM
        assert refuses_connections(classic, 0)
