"""EmbeddedNSQ: nsqd nodes and an nsqlookupd in pure Python, on one background event loop.

The cluster owns one thread (``nsq-embedded-<n>``) running an asyncio loop that serves every
node.  All public methods are called from other threads and wait (with a timeout) for the loop
to do the work.  See ``/work/shared`` cluster_api for the interface shared with the runner of
real binaries.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Callable
from typing import Any

from .lookupd.node import Lookupd
from .nodes import LookupdNode, Node
from .nsqd.node import NSQD, NSQDOptions
from .waiting import wait_for
from .youzan.lookupd import YouzanLookupd
from .youzan.meta import REGISTRATION_TTL, Coordinator, TopicMeta
from .youzan.node import YouzanNSQD

__all__ = ["EmbeddedNSQ", "Node", "LookupdNode"]

log = logging.getLogger("nsqclient.testing.cluster")

_counter = itertools.count(1)

#: Seconds any cluster operation may take before it is reported as hung.
OP_TIMEOUT = 15.0


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


class EmbeddedNSQ:
    """A cluster of embedded nsqd nodes (and optionally one nsqlookupd) for tests and demos.

    Args:
        nsqd_count: how many nsqd nodes :meth:`start` brings up.
        lookupd: run an nsqlookupd; every node registers with it over TCP.
        data_dir: accepted for interface compatibility; data lives in memory only.
        host: the address every listener binds (loopback by default).
        nsqd_addresses: optional ``[(tcp_address, http_address), ...]`` to bind instead of
            free ports, one pair per initial node.
        lookupd_addresses: optional ``(tcp_address, http_address)`` for the nsqlookupd.
        lookupd_legacy_json: the nsqlookupd wraps its JSON like pre-1.0 releases.
        youzan: run youzan's partitioned NSQ instead of classic NSQ: youzan's TCP protocol
            (partitions, SUB_ORDERED, traced and extended publishing, raw ids) and youzan's
            nsqlookupd (see :meth:`create_topic`, :meth:`move_leader`).
        lookupd_count: (youzan mode) how many nsqlookupds; ``/listlookup`` names them all
            and the first one is the leader.
        registration_ttl: (youzan mode) seconds a dead node's registration outlives it (the
            etcd TTL, 20 s in youzan): the cluster elects new leaders for the partitions a
            killed node led only then (see :meth:`kill_nsqd`).
        **nsqd_options: nsqd flags with underscores, durations in seconds
            (see :class:`~nsqclient.testing.options.NSQDOptions`).
    """

    kind = "embedded"

    def __init__(
        self,
        nsqd_count: int = 1,
        lookupd: bool = True,
        data_dir: str | None = None,
        *,
        host: str = "127.0.0.1",
        nsqd_addresses: list[tuple[str, str]] | None = None,
        lookupd_addresses: tuple[str, str] | None = None,
        lookupd_legacy_json: bool = False,
        youzan: bool = False,
        lookupd_count: int = 1,
        registration_ttl: float = REGISTRATION_TTL,
        **nsqd_options: Any,
    ):
        NSQDOptions.from_kwargs(**nsqd_options)  # validate early, in the caller's thread
        if not registration_ttl >= 0:
            raise ValueError(f"registration_ttl must be >= 0 seconds, not {registration_ttl!r}")
        self.nsqd_count = nsqd_count
        self.use_lookupd = lookupd
        self.data_dir = data_dir
        self.host = host
        self.nsqd_options = dict(nsqd_options)
        self.lookupd_legacy_json = lookupd_legacy_json
        self.youzan = youzan
        self.lookupd_count = lookupd_count if youzan else 1
        self.registration_ttl = float(registration_ttl)
        self.nsqds: list[Node] = []
        self.lookupd: LookupdNode | None = None
        #: every nsqlookupd (several only in youzan mode)
        self.lookupds: list[LookupdNode] = []
        self._coordinator: Coordinator | None = None
        self._youzan_lookupds: list[YouzanLookupd] = []
        self._nsqd_addresses = list(nsqd_addresses or [])
        self._lookupd_addresses = lookupd_addresses
        self._servers: list[NSQD] = []
        self._lookupd_server: Lookupd | None = None
        self._registry: dict[str, Lookupd] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._name = f"nsq-embedded-{next(_counter)}"

    # -- lifecycle

    @property
    def nsqd(self) -> Node:
        """The first nsqd node."""
        return self.nsqds[0]

    def start(self) -> EmbeddedNSQ:
        """Start the loop thread, the nsqlookupd and ``nsqd_count`` nodes; return self."""
        if self._loop is not None:
            return self
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()

        self._loop = loop
        self._thread = threading.Thread(target=run, name=self._name, daemon=True)
        self._thread.start()
        if not ready.wait(OP_TIMEOUT):
            raise RuntimeError("the embedded NSQ event loop did not start")
        try:
            if self.youzan:
                self._coordinator = Coordinator(loop, self.registration_ttl)
            elif self.use_lookupd:
                self._call(self._start_lookupd_async())
            for i in range(self.nsqd_count):
                addresses = self._nsqd_addresses[i] if i < len(self._nsqd_addresses) else None
                self._add_nsqd(addresses, {})
            if self.youzan and self.use_lookupd:
                # youzan nodes need no lookupd to start; listening last means a lookupd that
                # answers already knows every node, so a topic created then spreads over all
                self._call(self._start_youzan_lookupds_async())
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop every node, the nsqlookupd and the loop thread (joined)."""
        loop = self._loop
        if loop is None:
            return
        try:
            if loop.is_running():
                self._call(self._close_async())
        except Exception:  # pragma: no cover - best effort on shutdown
            log.exception("error while closing %s", self._name)
        finally:
            if loop.is_running():
                loop.call_soon_threadsafe(loop.stop)
            if self._thread is not None:
                self._thread.join(OP_TIMEOUT)
            if not loop.is_running():
                loop.close()
            self._loop = None
            self._thread = None

    def __enter__(self) -> EmbeddedNSQ:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def _close_async(self) -> None:
        for server in self._servers:
            await server.stop()
        if self._lookupd_server is not None:
            await self._lookupd_server.stop()
        for youzan_lookupd in self._youzan_lookupds:
            await youzan_lookupd.stop()
        if self._coordinator is not None:
            self._coordinator.shutdown()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)

    def _call(self, work: Any, timeout: float = OP_TIMEOUT) -> Any:
        """Run a coroutine (or a plain callable) on the loop and wait for its result."""
        if self._loop is None:
            raise RuntimeError("the cluster is not started")
        if threading.current_thread() is self._thread:
            raise RuntimeError("cluster methods cannot be called from the cluster's own loop")
        if asyncio.iscoroutine(work):
            return asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout)

        async def wrap(fn: Callable[[], Any]) -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(wrap(work), self._loop).result(timeout)

    # -- nsqlookupd

    async def _start_lookupd_async(self) -> None:
        if self._lookupd_server is None:
            tcp_port = http_port = 0
            if self._lookupd_addresses:
                _, tcp_port = _split(self._lookupd_addresses[0])
                _, http_port = _split(self._lookupd_addresses[1])
            self._lookupd_server = Lookupd(
                asyncio.get_running_loop(),
                host=self.host,
                tcp_port=tcp_port,
                http_port=http_port,
                legacy_json=self.lookupd_legacy_json,
                broadcast_address=self.host,
                registry=self._registry,
            )
        await self._lookupd_server.start()
        server = self._lookupd_server
        if self.lookupd is None:
            self.lookupd = LookupdNode(self.host, server.tcp_port, server.http_port)
            self.lookupds = [self.lookupd]

    async def _start_youzan_lookupds_async(self) -> None:
        """The youzan nsqlookupds (the first on ``lookupd_addresses``)."""
        loop = asyncio.get_running_loop()
        assert self._coordinator is not None
        for i in range(self.lookupd_count):
            tcp_port = http_port = 0
            if i == 0 and self._lookupd_addresses:
                _, tcp_port = _split(self._lookupd_addresses[0])
                _, http_port = _split(self._lookupd_addresses[1])
            server = YouzanLookupd(
                loop,
                self._coordinator,
                host=self.host,
                tcp_port=tcp_port,
                http_port=http_port,
                broadcast_address=self.host,
            )
            await server.start()
            self._youzan_lookupds.append(server)
            self.lookupds.append(LookupdNode(self.host, server.tcp_port, server.http_port))
        self.lookupd = self.lookupds[0]

    def stop_lookupd(self, i: int = 0) -> None:
        """Stop the nsqlookupd (connections drop, registrations are forgotten): its ports
        refuse connections until :meth:`start_lookupd`.  In youzan mode, lookupd ``i`` (the
        cluster's metadata stays: it answers as before once started again)."""
        if self.youzan:
            self._call(self._youzan_lookupd(i).stop())
        elif self._lookupd_server is not None:
            self._only_lookupd(i)
            self._call(self._lookupd_server.stop())

    def start_lookupd(self, i: int = 0) -> None:
        """Start the nsqlookupd again on the same ports (nodes reconnect and re-register);
        in youzan mode, lookupd ``i``."""
        if self.youzan:
            self._call(self._youzan_lookupd(i).start())
            return
        if self._lookupd_server is None:
            raise RuntimeError("this cluster has no nsqlookupd")
        self._only_lookupd(i)
        self._call(self._start_lookupd_async())
        for server in self._servers:
            if server.running:
                self._wait_registered(server)

    def stall_lookupd(self, i: int = 0) -> None:
        """(embedded only) The nsqlookupd (youzan mode: lookupd ``i``) keeps accepting
        connections but answers nothing, HTTP or TCP, until :meth:`unstall_lookupd`: a
        request to it hangs until the client's timeout, as youzan's nsqlookupd did while a
        killed leader's registration lingered."""
        self._call(self._lookupd_listeners(i).stall)

    def unstall_lookupd(self, i: int = 0) -> None:
        """Answer again after :meth:`stall_lookupd` (what was asked meanwhile is answered)."""
        self._call(self._lookupd_listeners(i).unstall)

    def _only_lookupd(self, i: int) -> None:
        if i != 0:
            raise IndexError(f"a classic cluster has one nsqlookupd (0), not {i}")

    def _youzan_lookupd(self, i: int) -> YouzanLookupd:
        if not self._youzan_lookupds:
            raise RuntimeError("this cluster has no nsqlookupd")
        return self._youzan_lookupds[i]

    def _lookupd_listeners(self, i: int) -> YouzanLookupd | Lookupd:
        if self.youzan:
            return self._youzan_lookupd(i)
        self._only_lookupd(i)
        if self._lookupd_server is None:
            raise RuntimeError("this cluster has no nsqlookupd")
        return self._lookupd_server

    # -- nsqd

    def _add_nsqd(self, addresses: tuple[str, str] | None, overrides: dict[str, Any]) -> Node:
        options = dict(self.nsqd_options)
        options.update(overrides)
        if (
            self._lookupd_server is not None
            and "lookupd_tcp_addresses" not in options
            and not self.youzan
        ):
            options["lookupd_tcp_addresses"] = [self._lookupd_server.tcp_address]
        opts = NSQDOptions.from_kwargs(**options)
        tcp_port = http_port = 0
        if addresses:
            _, tcp_port = _split(addresses[0])
            _, http_port = _split(addresses[1])

        async def create() -> NSQD:
            server: NSQD
            if self._coordinator is not None:
                server = YouzanNSQD(
                    asyncio.get_running_loop(),
                    opts,
                    self._coordinator,
                    host=self.host,
                    tcp_port=tcp_port,
                    http_port=http_port,
                )
            else:
                server = NSQD(
                    asyncio.get_running_loop(),
                    opts,
                    host=self.host,
                    tcp_port=tcp_port,
                    http_port=http_port,
                    lookupd_registry=self._registry,
                )
            await server.start()
            return server

        server = self._call(create())
        self._servers.append(server)
        node = Node(self.host, server.tcp_port, server.http_port)
        self.nsqds.append(node)
        self._wait_registered(server)
        return node

    def _wait_registered(self, server: NSQD, timeout: float = 5.0) -> None:
        """Wait until the node has identified itself to every running nsqlookupd."""
        if not server.lookup_peers:
            return
        if self._lookupd_server is None or not self._lookupd_server.running:
            return

        async def watch() -> None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while loop.time() < deadline:
                if all(p.synced for p in server.lookup_peers):
                    break
                await asyncio.sleep(0.005)

        self._call(watch(), timeout + 1.0)

    def _wait_unregistered(self, server: NSQD, timeout: float = 5.0) -> None:
        """Wait until the local nsqlookupd has noticed that ``server`` went away."""
        lookupd = self._lookupd_server
        if lookupd is None:
            return

        async def watch() -> None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while loop.time() < deadline and lookupd.running:
                if not any(
                    p.peer.tcp_port == server.tcp_port
                    for p in lookupd.db.find_producers("client", "", "")
                ):
                    break
                await asyncio.sleep(0.005)

        self._call(watch(), timeout + 1.0)

    def add_nsqd(self, **nsqd_options: Any) -> Node:
        """Start one more nsqd (cluster options plus ``nsqd_options``); return its Node."""
        return self._add_nsqd(None, nsqd_options)

    def stop_nsqd(self, i: int, graceful: bool = False) -> None:
        """Stop node ``i``: listeners closed, connections dropped, lookupd registration gone.

        In youzan mode the stop is a SIGKILL (:meth:`kill_nsqd`), or with ``graceful`` a
        SIGTERM (:meth:`terminate_nsqd`).  A classic nsqd always stops as on SIGTERM.
        """
        server = self._servers[i]
        if graceful and isinstance(server, YouzanNSQD):
            self._call(server.terminate())
        else:
            self._call(server.stop())
        self._wait_unregistered(server)

    def kill_nsqd(self, i: int) -> None:
        """(youzan mode) Node ``i`` dies as on SIGKILL.

        At once: its listeners close, every connection to it drops and the lookupds stop
        naming it (no partition it leads is listed).  After ``registration_ttl`` seconds (its
        etcd registration expiring) each partition it led gets a new leader from the live
        nodes of its ISR, if there is one, and it leaves every ISR.  Restarted earlier
        (:meth:`start_nsqd`), it comes back with the roles it had.
        """
        self._youzan()
        self.stop_nsqd(i)

    def terminate_nsqd(self, i: int) -> None:
        """Stop node ``i`` as on SIGTERM: in youzan mode it first hands the leadership of its
        partitions to a live ISR member (when there is one) and leaves every ISR, then stops
        as :meth:`kill_nsqd` does; a classic nsqd stops as :meth:`stop_nsqd` does."""
        self.stop_nsqd(i, graceful=True)

    def start_nsqd(self, i: int) -> None:
        """Start node ``i`` again on the same ports with the data it had (youzan mode: it
        rejoins the ISR of the partitions it holds, without leading again what it lost)."""
        server = self._servers[i]
        self._call(server.start())
        self._wait_registered(server)

    def server(self, i: int = 0) -> NSQD:
        """The embedded node object (for white-box tests; touch it only via :meth:`run`)."""
        return self._servers[i]

    def run(self, fn: Callable[[], Any], timeout: float = OP_TIMEOUT) -> Any:
        """Run ``fn()`` on the cluster's loop and return its result (for white-box tests)."""
        return self._call(fn, timeout)

    # -- fault controls (embedded only)

    def drop_connections(self, i: int) -> None:
        """Close every client TCP connection of node ``i`` (the node keeps running)."""
        self._call(self._servers[i].drop_connections)

    def stall_nsqd(self, i: int) -> None:
        """Node ``i`` keeps accepting connections but stops answering anything (TCP and HTTP)."""
        self._call(self._servers[i].stall)

    def unstall_nsqd(self, i: int) -> None:
        """Resume node ``i`` after :meth:`stall_nsqd`."""
        self._call(self._servers[i].unstall)

    def inject_frame(self, i: int, raw: bytes) -> None:
        """Write ``raw`` to every client connection of node ``i`` (through TLS/compression)."""
        self._call(lambda: self._servers[i].inject(bytes(raw)))

    # -- youzan mode (topics, partitions, leaders)

    def _youzan(self) -> Coordinator:
        if self._coordinator is None:
            raise RuntimeError("this is not a youzan cluster (EmbeddedNSQ(youzan=True))")
        return self._coordinator

    def create_topic(
        self,
        topic: str,
        partitions: int = 1,
        replica: int = 1,
        *,
        ordered: bool = False,
        ext: bool = False,
        multi_part: bool = False,
    ) -> None:
        """Create a partitioned topic (what the lookupd's ``POST /topic/create`` does).

        Partition ``p`` is led by node ``p % nsqd_count`` and copied on the next
        ``replica - 1`` nodes.  ``ordered`` (youzan's ``orderedmulti``) topics must be consumed
        with SUB_ORDERED and published with a partition; ``ext`` topics carry JSON headers.
        Raises ValueError with youzan's reason when the cluster cannot hold the topic.
        """
        meta = TopicMeta(partitions, replica, ordered=ordered, ext=ext, multi_part=multi_part)
        coordinator = self._youzan()
        error = self._call(lambda: coordinator.create_topic(topic, meta))
        if error is not None:
            raise ValueError(error)

    def create_channel(self, topic: str, channel: str, partition: int | None = None) -> None:
        """Create ``channel`` on one partition (or all) of ``topic``, as a first SUB would."""
        coordinator = self._youzan()

        def create() -> None:
            yt = coordinator.topics[topic]
            for p, state in enumerate(yt.partitions):
                if partition is None or p == partition:
                    state.data.get_channel(channel)

        self._call(create)

    def partition_leader(self, topic: str, partition: int) -> int:
        """The index (in :attr:`nsqds`) of the node leading the partition."""
        coordinator = self._youzan()
        state = self._call(lambda: coordinator.partition(topic, partition))
        if state is None:
            raise KeyError(f"no partition {partition} of topic {topic!r}")
        return int(state.leader)

    def partition_replicas(self, topic: str, partition: int) -> list[int]:
        """The indexes of the nodes holding a copy of the partition (the leader first)."""
        coordinator = self._youzan()
        state = self._call(lambda: coordinator.partition(topic, partition))
        if state is None:
            raise KeyError(f"no partition {partition} of topic {topic!r}")
        return list(state.replicas)

    def partition_isr(self, topic: str, partition: int) -> list[int]:
        """The indexes of the in-sync replicas of the partition (the leader first)."""
        coordinator = self._youzan()

        def isr() -> list[int] | None:
            state = coordinator.partition(topic, partition)
            return None if state is None else list(state.isr)

        members: list[int] | None = self._call(isr)
        if members is None:
            raise KeyError(f"no partition {partition} of topic {topic!r}")
        return members

    def listed_leader(self, topic: str, partition: int) -> int | None:
        """The node the lookupds name as the partition's leader now (``/lookup?access=r``),
        or None when they name none (its leader is down)."""
        coordinator = self._youzan()

        def look() -> int | None:
            state = coordinator.partition(topic, partition)
            if state is None:
                raise KeyError(f"no partition {partition} of topic {topic!r}")
            return state.leader if coordinator.node_running(state.leader) else None

        result: int | None = self._call(look)
        return result

    def wait_leader(
        self,
        topic: str,
        partition: int,
        not_node: int | None = None,
        timeout: float = OP_TIMEOUT,
    ) -> int:
        """Wait until the lookupds name a leader for the partition other than ``not_node``,
        and return its index (a test tool).  AssertionError after ``timeout`` seconds."""

        def named() -> tuple[int] | None:
            leader = self.listed_leader(topic, partition)
            if leader is None or leader == not_node:
                return None
            return (leader,)

        found = wait_for(
            named,
            timeout=timeout,
            message=lambda: (
                f"no leader other than {not_node} for {topic!r} partition {partition}: "
                f"lookupd names {self.listed_leader(topic, partition)}"
            ),
        )
        return found[0]

    def refuse_publishes(
        self, i: int, error: str = "E_PUB_FAILED exiting", count: int | None = None
    ) -> None:
        """(youzan mode) Node ``i`` answers publishes with the error frame ``error`` (``"CODE
        description"``: e.g. ``"E_PUB_FAILED exiting"``, what a SIGTERMed leader answers;
        ``"E_PUB_FAILED pub timeout while pop wait queue"``; ``"E_FAILED_ON_NOT_LEADER "``),
        after reading each body and storing nothing, the connection left open: the next
        ``count`` publishes, or every one until :meth:`accept_publishes`.  An MPUB gets
        E_MPUB_FAILED where ``error`` says E_PUB_FAILED, as youzan's nsqd answers."""
        self._youzan()
        server = self._servers[i]
        assert isinstance(server, YouzanNSQD)
        self._call(lambda: server.refuse_publishes(error, count))

    def accept_publishes(self, i: int) -> None:
        """(youzan mode) Node ``i`` stores publishes again after :meth:`refuse_publishes`."""
        self._youzan()
        server = self._servers[i]
        assert isinstance(server, YouzanNSQD)
        self._call(server.accept_publishes)

    def move_leader(self, topic: str, partition: int, node: int) -> None:
        """Make node ``node`` lead the partition, mid-run (a fault control).

        The old leader drops the partition's consumers (their in-flight messages are delivered
        again by the new leader) and answers E_FAILED_ON_NOT_LEADER to publishes while it still
        holds a copy (when ``node`` was a replica, the two swap roles), E_TOPIC_NOT_EXIST once
        it holds none (when ``node`` was not a replica, it takes the old leader's copy).
        """
        coordinator = self._youzan()
        self._call(lambda: coordinator.move_leader(topic, partition, node))

    def set_writable(self, topic: str, partition: int, writable: bool) -> None:
        """Refuse (or allow again) writes to a partition: E_FAILED_ON_NOT_WRITABLE, and
        ``/lookup?access=w`` leaves the partition out meanwhile."""
        coordinator = self._youzan()
        self._call(lambda: coordinator.set_writable(topic, partition, writable))

    def __repr__(self) -> str:
        return f"EmbeddedNSQ(nsqds={self.nsqds!r}, lookupd={self.lookupd!r})"
