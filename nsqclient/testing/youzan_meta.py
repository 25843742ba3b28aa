"""youzan's cluster metadata (what etcd and the lookupd coordinator hold in the real cluster):
topics with their partition count, replica count and flags, each partition's leader and
replicas, which nodes and lookupds exist.

Placement is deterministic: partition ``p`` of a topic is led by node ``p % N`` and replicated
on the next ``replica - 1`` nodes.  :meth:`Coordinator.move_leader` moves a leader (to a replica,
which swaps the roles, or to a node without a copy, which then takes the old leader's place).
Nodes and lookupds are seen through the :class:`YNode` protocol, so this module imports neither.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from .youzan_queues import PartitionData

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
]

log = logging.getLogger("nsqclient.testing.youzan_meta")

MAX_PARTITION_NUM = 255
MAX_REPLICATOR = 5
#: the coordinator's answer when the nodes cannot hold the topic as asked
NO_NODE_AVAILABLE = "No node is available for topic"


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
    """One partition: its data, its leader node, the nodes holding a copy, write permission."""

    data: PartitionData
    leader: int
    replicas: list[int]
    writable: bool = True


@dataclass
class YouzanTopic:
    """A topic of the youzan cluster."""

    name: str
    meta: TopicMeta
    partitions: list[PartitionState] = field(default_factory=list)


class Coordinator:
    """The cluster's metadata, shared by every embedded youzan nsqd and lookupd."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.nodes: list[YNode] = []
        self.lookupds: list[YLookupd] = []
        self.topics: dict[str, YouzanTopic] = {}

    def add_node(self, node: YNode) -> int:
        """Register an nsqd node; return its index."""
        self.nodes.append(node)
        return len(self.nodes) - 1

    def node_running(self, index: int) -> bool:
        return 0 <= index < len(self.nodes) and self.nodes[index].running

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
            topic.partitions.append(PartitionState(data, leader, replicas))
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
