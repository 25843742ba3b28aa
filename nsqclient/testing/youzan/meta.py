"""youzan's cluster metadata (what etcd and the lookupd coordinator hold in the real cluster):
topics with their partition count, replica count and flags, each partition's leader, replicas
and ISR, which nodes and lookupds exist, and the failover youzan's coordinator runs
(``consistence/nsqlookup_coordinator.go``, ``nsqd_coordinator*.go`` of youzan/nsq).

Placement is deterministic: partition ``p`` of a topic is led by node ``p % N`` and replicated
on the next ``replica - 1`` nodes.  :meth:`Coordinator.move_leader` moves a leader (to a replica,
which swaps the roles, or to a node without a copy, which then takes the old leader's place).
Nodes and lookupds are seen through the :class:`YNode` protocol, so this module imports neither.

Failover, as youzan's coordinator does it:

- A node that dies abruptly (:meth:`Coordinator.node_killed`) stays registered (its etcd key
  lives on) for ``registration_ttl`` seconds (youzan's ETCD_TTL, 20 s); only then are the
  partitions it led given a new leader, chosen among the live nodes of the ISR, and is it moved
  out of every ISR (to the catch-up list).  A node back before that keeps its roles.
- A node that stops gracefully (:meth:`Coordinator.node_leaving`, SIGTERM) hands its leaderships
  over and leaves every ISR at once, before it stops listening.
- A partition takes writes only while the live nodes of its ISR are a majority of its
  replicator (``len(ISR) > replica / 2``, ``IsISRReadyForWrite``) and its leader is up.
- A node that starts again catches up at once (replicas share the partition's data here) and
  rejoins the ISR of every partition it holds whose leader is up; it does not lead again.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from .queues import PartitionData

__all__ = [
    "YNode",
    "YLookupd",
    "TopicMeta",
    "PartitionState",
    "YouzanTopic",
    "Coordinator",
    "MAX_PARTITION_NUM",
    "MAX_REPLICATOR",
    "NO_NODE_AVAILABLE",
    "REGISTRATION_TTL",
]

log = logging.getLogger("nsqclient.testing.youzan_meta")

MAX_PARTITION_NUM = 255
MAX_REPLICATOR = 5
#: the coordinator's answer when the nodes cannot hold the topic as asked
NO_NODE_AVAILABLE = "No node is available for topic"
#: seconds a dead node's registration outlives it (youzan's ETCD_TTL in nsqd_node_etcd.go)
REGISTRATION_TTL = 20.0


class YNode(Protocol):
    """What the metadata needs of an nsqd node."""

    running: bool

    def peer_info(self) -> dict[str, Any]:
        """The node as the lookupd lists it."""


class YLookupd(Protocol):
    """What the metadata needs of an nsqlookupd."""

    running: bool

    def node_info(self) -> dict[str, Any]:
        """The lookupd as ``/listlookup`` lists it."""


@dataclass(frozen=True)
class TopicMeta:
    """A topic's creation parameters (youzan's TopicMetaInfo, the fields clients see)."""

    partition_num: int
    replica: int
    ordered: bool = False
    ext: bool = False
    multi_part: bool = False
    disable_channel_auto_create: bool = False

    @property
    def allow_multi(self) -> bool:
        """Several partitions of the topic may share a node."""
        return self.ordered or self.multi_part

    def as_json(self) -> dict[str, object]:
        """The ``meta`` object of a lookup (keys sorted as Go marshals a map)."""
        return {
            "disable_channel_auto_create": self.disable_channel_auto_create,
            "extend_support": self.ext,
            "multi_part": self.multi_part,
            "ordered": self.ordered,
            "partition_num": self.partition_num,
            "replica": self.replica,
        }


@dataclass
class PartitionState:
    """One partition: its data, its leader node, the nodes holding a copy (the leader first),
    the in-sync ones among them (the ISR, leader first; the others are catching up), the
    topic's replicator and the write switch of :meth:`Coordinator.set_writable`."""

    data: PartitionData
    leader: int
    replicas: list[int]
    writable: bool = True
    isr: list[int] = field(default_factory=list)
    replica: int = 1


@dataclass
class YouzanTopic:
    """A topic of the youzan cluster."""

    name: str
    meta: TopicMeta
    partitions: list[PartitionState] = field(default_factory=list)


class Coordinator:
    """The cluster's metadata, shared by every embedded youzan nsqd and lookupd."""

    def __init__(self, loop: asyncio.AbstractEventLoop, registration_ttl: float = REGISTRATION_TTL):
        self.loop = loop
        self.registration_ttl = registration_ttl
        self.nodes: list[YNode] = []
        self.lookupds: list[YLookupd] = []
        self.topics: dict[str, YouzanTopic] = {}
        #: nodes registered in the cluster (etcd): the running ones and the dead ones whose
        #: registration has not expired yet
        self.registered: set[int] = set()
        self._expiries: dict[int, asyncio.TimerHandle] = {}

    def add_node(self, node: YNode) -> int:
        """Add an nsqd node to the cluster; return its index."""
        self.nodes.append(node)
        return len(self.nodes) - 1

    def node_running(self, index: int) -> bool:
        return 0 <= index < len(self.nodes) and self.nodes[index].running

    def _partitions(self) -> list[tuple[str, int, PartitionState]]:
        return [
            (name, p, state)
            for name, topic in self.topics.items()
            for p, state in enumerate(topic.partitions)
        ]

    # -- node life and death

    def node_up(self, index: int) -> None:
        """Node ``index`` listens (again): registered, and back in the ISR of every partition
        it holds whose leader is up (it catches up at once; replicas share the data here)."""
        handle = self._expiries.pop(index, None)
        if handle is not None:
            handle.cancel()
            log.info("nsqd node %d back before its registration expired", index)
        self.registered.add(index)
        for _, _, state in self._partitions():
            if index in state.replicas:
                self._catch_up(state)

    def node_killed(self, index: int) -> None:
        """Node ``index`` died abruptly (SIGKILL): its registration expires after
        ``registration_ttl`` seconds, and only then does the cluster react."""
        if index not in self.registered or index in self._expiries:
            return
        ttl = max(0.0, self.registration_ttl)
        log.info("nsqd node %d died; its registration expires in %.3gs", index, ttl)
        self._expiries[index] = self.loop.call_later(ttl, self._expire, index)

    def node_leaving(self, index: int) -> None:
        """Node ``index`` stops gracefully (SIGTERM): it hands over the leadership of its
        partitions and leaves every ISR now, then unregisters (nsqd's prepareLeavingCluster)."""
        handle = self._expiries.pop(index, None)
        if handle is not None:
            handle.cancel()
        self._unregister(index)

    def _expire(self, index: int) -> None:
        self._expiries.pop(index, None)
        if self.node_running(index):  # pragma: no cover - node_up cancels the timer
            return
        log.info("nsqd node %d: registration expired", index)
        self._unregister(index)

    def _unregister(self, index: int) -> None:
        """The node left the cluster: a new leader for what it led (from the ISR), and it
        leaves every ISR that keeps another member (doCheckTopics)."""
        self.registered.discard(index)
        for name, p, state in self._partitions():
            if index not in state.isr:
                continue
            if state.leader == index:
                self._elect(name, p, state)
            elif len(state.isr) > 1:
                state.isr.remove(index)
                log.info("topic %s partition %d: node %d left the ISR", name, p, index)

    def _elect(self, name: str, partition: int, state: PartitionState) -> bool:
        """A new leader from the live members of the ISR (chooseNewLeaderFromISR); the old
        one goes to the catch-up list.  False when no member can lead."""
        old = state.leader
        candidates = [
            n
            for n in state.replicas
            if n != old and n in state.isr and n in self.registered and self.node_running(n)
        ]
        if not candidates:
            log.warning(
                "topic %s partition %d: no leader can be elected (ISR %s)",
                name,
                partition,
                state.isr,
            )
            return False
        new = candidates[0]
        state.isr.remove(old)
        state.leader = new
        state.replicas = [new] + [n for n in state.replicas if n != new]
        self._sort_isr(state)
        for channel in state.data.channels.values():
            channel.disable()
        log.info(
            "topic %s partition %d: node %d elected leader (was %d), ISR %s",
            name,
            partition,
            new,
            old,
            state.isr,
        )
        self._catch_up(state)
        return True

    def _catch_up(self, state: PartitionState) -> None:
        """Registered, running replicas rejoin the ISR when the leader is up to feed them."""
        if state.leader not in self.registered or not self.node_running(state.leader):
            return
        for n in state.replicas:
            if n not in state.isr and n in self.registered and self.node_running(n):
                state.isr.append(n)
        self._sort_isr(state)

    @staticmethod
    def _sort_isr(state: PartitionState) -> None:
        state.isr.sort(key=lambda n: state.replicas.index(n) if n in state.replicas else n)

    def accepts_writes(self, state: PartitionState) -> bool:
        """The partition takes writes: not switched off, its leader up and in the ISR, and
        the ISR's live members a majority of the replicator (``IsISRReadyForWrite``; a write
        to a dead ISR member fails until it leaves the ISR)."""
        if not state.writable or state.leader not in state.isr:
            return False
        if not self.node_running(state.leader):
            return False
        alive = sum(1 for n in state.isr if self.node_running(n))
        return alive > state.replica // 2

    def shutdown(self) -> None:
        """Forget pending registration expiries (the cluster is closing)."""
        for handle in self._expiries.values():
            handle.cancel()
        self._expiries.clear()

    # -- topics

    def create_topic(self, name: str, meta: TopicMeta) -> str | None:
        """Create ``name`` (idempotent with the same meta); an error text when refused."""
        existing = self.topics.get(name)
        if existing is not None:
            return None if existing.meta == meta else "already exist"
        n = len(self.nodes)
        if meta.partition_num >= MAX_PARTITION_NUM:
            return "max partition allowed exceed"
        if n < meta.replica:
            return NO_NODE_AVAILABLE
        if not meta.allow_multi and (
            n < meta.partition_num or n < meta.replica * meta.partition_num
        ):
            return NO_NODE_AVAILABLE
        topic = YouzanTopic(name, meta)
        for p in range(meta.partition_num):
            leader = p % n
            replicas = [(leader + i) % n for i in range(meta.replica)]
            data = PartitionData(self.loop, name, p, meta.ordered, meta.ext)
            isr = [n for n in replicas if n in self.registered and self.node_running(n)]
            state = PartitionState(data, leader, replicas, isr=isr, replica=meta.replica)
            topic.partitions.append(state)
        self.topics[name] = topic
        log.info(
            "topic %s created: %d partition(s), replica %d, ordered=%s, ext=%s",
            name,
            meta.partition_num,
            meta.replica,
            meta.ordered,
            meta.ext,
        )
        return None

    def partition(self, name: str, partition: int) -> PartitionState | None:
        topic = self.topics.get(name)
        if topic is None or not 0 <= partition < len(topic.partitions):
            return None
        return topic.partitions[partition]

    def copy_on(self, node: int, name: str, partition: int) -> PartitionState | None:
        """The partition when ``node`` holds a copy of it (youzan's GetExistingTopic)."""
        state = self.partition(name, partition)
        if state is None or node not in state.replicas:
            return None
        return state

    def default_partition(self, node: int, name: str) -> int:
        """A partition of ``name`` that ``node`` leads, or -1 (nsqd's default partition)."""
        topic = self.topics.get(name)
        if topic is None:
            return -1
        for p, state in enumerate(topic.partitions):
            if state.leader == node:
                return p
        return -1

    def move_leader(self, name: str, partition: int, node: int) -> None:
        """Make ``node`` the partition's leader; the old leader's consumers are dropped."""
        state = self.partition(name, partition)
        if state is None:
            raise KeyError(f"no partition {partition} of topic {name!r}")
        if not 0 <= node < len(self.nodes):
            raise IndexError(f"no nsqd node {node}")
        old = state.leader
        if old == node:
            return
        if node in state.replicas:
            state.replicas.remove(node)
        else:
            state.replicas.remove(old)  # the new node takes the old leader's copy
        state.replicas.insert(0, node)
        state.leader = node
        state.isr = [node if n == old and old not in state.replicas else n for n in state.isr]
        if node not in state.isr:
            state.isr.append(node)
        self._sort_isr(state)
        for channel in state.data.channels.values():
            channel.disable()
        log.info(
            "topic %s partition %d: leader moved from node %d to %d", name, partition, old, node
        )

    def set_writable(self, name: str, partition: int, writable: bool) -> None:
        """Allow or refuse writes to a partition (E_FAILED_ON_NOT_WRITABLE while refused)."""
        state = self.partition(name, partition)
        if state is None:
            raise KeyError(f"no partition {partition} of topic {name!r}")
        state.writable = writable
