"""Consumer at scale: many messages over several nsqd found through nsqlookupd, an nsqd added
mid-run, and RDY rotation when max_in_flight is below the number of nsqd.

The RDY budget is watched from both ends while the consumer runs:

* client side, exhaustively: every RDY the consumer hands to a connection is recorded, and the
  sum over its open connections must never exceed max_in_flight;
* server side, by sampling: a thread reads every nsqd's /stats about every 50 ms.  One sweep
  reads the nodes one after another, so a sweep alone is no snapshot (a RDY moved from a node
  read earlier to a node read later counts twice).  When two consecutive sweeps agree, every
  node held its values from its first read to its second, and all those intervals overlap: the
  values coexisted at one instant.  Those consistent samples must respect max_in_flight; the raw
  maximum is reported too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from nsqclient.conn._connection import Connection
from nsqclient.errors import NSQError
from nsqclient.http import NsqdHTTPClient
from nsqclient.message import Message
from nsqclient.testing.helpers import drained, publish
from nsqclient.testing.waiting import wait_for

#: Seconds: the bound of short waits; reached only when something is broken.
TIMEOUT = 10.0


# ------------------------------------------------------------------------------------------------
# Helpers


def all_drained(nodes: list[Any], topic: str, channel: str) -> bool:
    return all(drained(node, topic, channel) is not None for node in nodes)


class Seen:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0
        self.unique: set[bytes] = set()
        self.by_node: dict[str, int] = {}

    def add(self, message: Message) -> None:
        with self.lock:
            self.count += 1
            self.unique.add(message.body)
            self.by_node[message.nsqd_address] = self.by_node.get(message.nsqd_address, 0) + 1

    def has_all(self, bodies: set[bytes]) -> bool:
        with self.lock:
            return self.unique >= bodies

    def describe(self, bodies: set[bytes]) -> str:
        with self.lock:
            missing = bodies - self.unique
            return f"{len(missing)} of {len(bodies)} missing (e.g. {sorted(missing)[:5]})"


class RdyLedger:
    """Client side: the RDY last handed to each open connection, summed at every RDY sent."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, limit: int) -> None:
        self.limit = limit
        self.lock = threading.Lock()
        self.rdy: dict[Connection, int] = {}
        self.max_sum = 0
        self.sends = 0
        self.violations: list[dict[str, int]] = []
        self.granted_to: set[str] = set()
        original = Connection.send
        ledger = self

        def send(conn: Connection, command: bytes) -> None:
            if command.startswith(b"RDY "):
                ledger.record(conn, int(command.split()[1]))
            original(conn, command)

        monkeypatch.setattr(Connection, "send", send)

    def record(self, conn: Connection, count: int) -> None:
        with self.lock:
            self.sends += 1
            self.rdy[conn] = count
            if count:
                self.granted_to.add(conn.address)
            live = {c.address: n for c, n in self.rdy.items() if not c.is_closed}
            total = sum(live.values())
            self.max_sum = max(self.max_sum, total)
            if total > self.limit:
                self.violations.append(live)


class RdySampler:
    """Server side: polls every node's /stats about every ``period`` seconds (see the module
    docstring for raw and consistent samples).

    With ``pair_within`` (seconds) each poll is two sweeps back to back, consistent only when
    they agree and both took no longer than that in all: a RDY that moves away from a node
    and back between its two reads (two RDY passes apart, so at least the balancer's interval)
    would otherwise pass for a value held all along."""

    def __init__(
        self,
        nodes: Callable[[], list[Any]],
        topic: str,
        channel: str,
        period: float = 0.05,
        pair_within: float | None = None,
    ) -> None:
        self.nodes = nodes
        self.topic = topic
        self.channel = channel
        self.period = period
        self.pair_within = pair_within
        self.stopping = threading.Event()
        self.raw_max = 0
        self.consistent_max = 0
        self.sweeps = 0
        self.consistent = 0
        self.consistent_sums: list[tuple[int, dict[str, Any]]] = []
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, name="test-rdy-sampler", daemon=True)

    def __enter__(self) -> RdySampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(TIMEOUT)

    def _sweep(self, clients: dict[str, NsqdHTTPClient]) -> dict[str, tuple]:
        sweep = {}
        for node in self.nodes():
            http = clients.get(node.http_url)
            if http is None:
                http = clients[node.http_url] = NsqdHTTPClient(node.http_url, timeout=TIMEOUT)
            data = http.stats(self.topic, self.channel)
            sweep[node.tcp_address] = tuple(
                sorted(
                    (c["remote_address"], c["connect_ts"], c["ready_count"])
                    for t in data.get("topics") or []
                    for ch in t.get("channels") or []
                    for c in ch.get("clients") or []
                )
            )
        return sweep

    def _run(self) -> None:
        clients: dict[str, NsqdHTTPClient] = {}
        previous: dict[str, tuple] | None = None
        #: when the sweep before this one began (time.monotonic())
        previous_start = 0.0
        try:
            while not self.stopping.is_set():
                start = time.monotonic()
                try:
                    sweep = self._sweep(clients)
                except NSQError as exc:
                    self.errors.append(exc)
                    previous = None
                else:
                    total = sum(c[2] for node in sweep.values() for c in node)
                    self.sweeps += 1
                    self.raw_max = max(self.raw_max, total)
                    quick = (
                        self.pair_within is None
                        or time.monotonic() - previous_start <= self.pair_within
                    )
                    if sweep == previous and quick:
                        self.consistent += 1
                        self.consistent_max = max(self.consistent_max, total)
                        self.consistent_sums.append((total, sweep))
                    previous = sweep
                    previous_start = start
                    if self.pair_within is not None and self.sweeps % 2:
                        continue  # the second sweep of the pair at once
                self.stopping.wait(self.period)  # the sampling period
        finally:
            for http in clients.values():
                http.close()

    def over(self, limit: int) -> list[tuple[int, dict[str, Any]]]:
        return [(total, sweep) for total, sweep in self.consistent_sums if total > limit]


# ------------------------------------------------------------------------------------------------
# Tests


def test_many_messages_over_three_nsqd_and_one_added_mid_run(nsq_cluster, consumers, monkeypatch):
    cluster = nsq_cluster
    max_in_flight = 20
    per_node = 10_000
    topic = "s_bulk"
    bodies = {b"%d" % i for i in range(3 * per_node)}
    ordered = sorted(bodies)
    for i, node in enumerate(cluster.nsqds):
        publish(node, topic, ordered[i * per_node : (i + 1) * per_node])
    nodes = list(cluster.nsqds)
    nodes_lock = threading.Lock()

    def current_nodes() -> list[Any]:
        with nodes_lock:
            return list(nodes)

    ledger = RdyLedger(monkeypatch, max_in_flight)
    seen = Seen()
    began = time.monotonic()
    with RdySampler(current_nodes, topic, "ch") as sampler:
        consumer = consumers(
            topic,
            "ch",
            seen.add,
            lookupd_http_addresses=[cluster.lookupd.http_url],
            max_in_flight=max_in_flight,
            concurrency=4,
            lookupd_poll_interval=0.5,
        )
        wait_for(lambda: seen.count >= len(bodies) // 3, 60, interval=0.1)
        extra_node = cluster.add_nsqd()
        extra = {b"extra-%d" % i for i in range(1_000)}
        publish(extra_node, topic, sorted(extra))
        with nodes_lock:
            nodes.append(extra_node)
        everything = bodies | extra
        wait_for(
            lambda: seen.has_all(everything),
            120,
            interval=0.1,
            message=lambda: seen.describe(everything),
        )
        took = time.monotonic() - began
        wait_for(lambda: all_drained(current_nodes(), topic, "ch"), TIMEOUT, interval=0.1)
    assert extra_node.tcp_address in consumer.stats()["connections"]
    assert seen.by_node.get(extra_node.tcp_address) == 1_000
    print(
        f"\n{len(everything)} messages in {took:.1f}s ({len(everything) / took:.0f}/s); "
        f"handled {seen.count}; RDY sum: client max {ledger.max_sum} over {ledger.sends} sends, "
        f"nsqd raw max {sampler.raw_max}, consistent max {sampler.consistent_max} "
        f"({sampler.consistent} of {sampler.sweeps} sweeps)"
    )
    assert ledger.violations == []
    assert ledger.max_sum <= max_in_flight
    assert sampler.errors == []
    assert sampler.consistent >= 5, (sampler.consistent, sampler.sweeps)
    assert sampler.over(max_in_flight) == []
    # The budget was used, not just respected.
    assert sampler.consistent_max >= max_in_flight - 4


def test_rdy_rotation_finds_the_only_nsqd_with_messages(
    nsq_cluster_factory, consumers, monkeypatch
):
    cluster = nsq_cluster_factory(nsqd_count=5)
    max_in_flight = 2
    topic = "s_rotate"
    for node in cluster.nsqds:
        with NsqdHTTPClient(node.http_url, timeout=TIMEOUT) as http:
            http.create_topic(topic)
    # The node whose address sorts last: the consumer connects to it last, so it starts
    # without RDY and only rotation can find it.
    busy = max(cluster.nsqds, key=lambda n: n.tcp_address)
    bodies = {b"r%d" % i for i in range(300)}
    publish(busy, topic, sorted(bodies))
    ledger = RdyLedger(monkeypatch, max_in_flight)
    seen = Seen()
    # RDY 1 rotates every 0.1 s here: only pairs of sweeps quicker than that are consistent.
    with RdySampler(lambda: list(cluster.nsqds), topic, "ch", pair_within=0.1) as sampler:
        consumer = consumers(
            topic,
            "ch",
            seen.add,
            lookupd_http_addresses=[cluster.lookupd.http_url],
            max_in_flight=max_in_flight,
            low_rdy_idle_timeout=0.3,
            rdy_redistribute_interval=0.1,
            lookupd_poll_interval=0.5,
        )
        wait_for(lambda: len(consumer.connections()) == 5, TIMEOUT)
        wait_for(
            lambda: seen.has_all(bodies), 60, interval=0.05, message=lambda: seen.describe(bodies)
        )
        wait_for(lambda: all_drained(cluster.nsqds, topic, "ch"), TIMEOUT, interval=0.1)
        # Let the sampler see the rotation go on among the idle nodes for a while, and every
        # node have its turn (asserted below).  A consistent sample needs two quick sweeps of
        # five /stats alike: under make test's five passes on two cores that can take far
        # longer than TIMEOUT (10 s was not enough once), hence the bound of the drain above.
        target = sampler.consistent + 10
        wait_for(
            lambda: sampler.consistent >= target and len(ledger.granted_to) == 5,
            60,
            interval=0.05,
        )
    print(
        f"\nrotation: RDY sum client max {ledger.max_sum} over {ledger.sends} sends, granted to "
        f"{len(ledger.granted_to)} nodes; nsqd raw max {sampler.raw_max}, consistent max "
        f"{sampler.consistent_max} ({sampler.consistent} of {sampler.sweeps} sweeps)"
    )
    assert ledger.violations == []
    assert ledger.max_sum <= max_in_flight
    assert sampler.errors == []
    assert sampler.over(max_in_flight) == []
    assert len(ledger.granted_to) == 5  # every node had its turn
    assert seen.by_node == {busy.tcp_address: seen.count}
