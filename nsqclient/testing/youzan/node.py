"""An embedded nsqd in youzan's mode: the classic node with youzan's TCP protocol
(:mod:`.client`), a place in the cluster's metadata (:mod:`.meta`) and the
identities youzan's nsqlookupd shows for it.

It does not register with an nsqlookupd over TCP: the embedded youzan lookupd reads the
cluster's metadata directly (the real one learns leaders from etcd and registrations).  Its
lookup peer ``id`` is the address of a (made-up) connection to the lookupd and changes each time
the node starts; its ``distributed_id`` (``ip:rpc port:tcp port:extra``) does not.

:meth:`YouzanNSQD.stop` is a SIGKILL: listeners and connections close at once and the cluster
reacts when the node's registration expires (see :mod:`.meta`); :meth:`YouzanNSQD.terminate`
is a SIGTERM: the node hands its leaderships over first.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from typing import Any

from ..nsqd.node import NSQD
from ..nsqd.options import NSQDOptions
from .client import YouzanClientConn
from .meta import Coordinator
from .protocol import YOUZAN_VERSION

__all__ = ["YouzanNSQD"]

log = logging.getLogger("nsqclient.testing.youzan_nsqd")

_peer_ports = itertools.count(random.randrange(30000, 50000))


class YouzanNSQD(NSQD):
    """One embedded youzan nsqd node."""

    conn_class = YouzanClientConn

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        opts: NSQDOptions,
        coordinator: Coordinator,
        host: str = "127.0.0.1",
        tcp_port: int = 0,
        http_port: int = 0,
    ):
        super().__init__(loop, opts, host=host, tcp_port=tcp_port, http_port=http_port)
        self.coordinator = coordinator
        self.index = coordinator.add_node(self)
        self.version = YOUZAN_VERSION
        self.rpc_port = 0
        self.peer_id = ""
        self._extra_id = str(random.randrange(100000, 1000000))
        #: publishes refused on purpose (see refuse_publishes): the error, and how many more
        #: (None: every one until accept_publishes)
        self._refusal: tuple[str, str] | None = None
        self._refusals_left: int | None = None

    async def start(self) -> None:
        """Listen; the node gets a new lookup peer id (its distributed id stays)."""
        was_running = self.running
        await super().start()
        if not was_running:
            self.peer_id = f"{self.opts.broadcast_address}:{next(_peer_ports)}"
            if not self.rpc_port:
                self.rpc_port = self.tcp_port + 100 if self.tcp_port < 65000 else self.tcp_port
            log.info("youzan nsqd %d: %s (%s)", self.index, self.peer_id, self.distributed_id)
            self.coordinator.node_up(self.index)

    async def stop(self) -> None:
        """Die abruptly, as on SIGKILL: listeners and every connection close now; the cluster
        notices when the node's registration expires."""
        was_running = self.running
        await super().stop()
        if was_running:
            self.coordinator.node_killed(self.index)

    async def terminate(self) -> None:
        """Stop gracefully, as on SIGTERM: hand over the leadership of every partition this
        node leads (and leave every ISR) while still listening, then stop."""
        if not self.running:
            return
        self.coordinator.node_leaving(self.index)
        await super().stop()

    def refuse_publishes(self, error: str, count: int | None = None) -> None:
        """Answer publishes (every PUB and MPUB form) with the error frame ``error`` (``"CODE
        description"``), non-fatal, after reading the body and before storing anything: the
        next ``count`` of them, or every one until :meth:`accept_publishes`.  An MPUB gets
        E_MPUB_FAILED where ``error`` says E_PUB_FAILED, as youzan's nsqd answers."""
        code, _, desc = error.partition(" ")
        if not code.startswith("E_") or not code.replace("_", "").isalnum():
            raise ValueError(f"an error frame starts with an E_* code, not {error!r}")
        if count is not None and count < 1:
            raise ValueError(f"count must be at least 1 (or None), not {count!r}")
        self._refusal = (code, desc)
        self._refusals_left = count

    def accept_publishes(self) -> None:
        """Store publishes again after :meth:`refuse_publishes`."""
        self._refusal = None
        self._refusals_left = None

    def publish_refusal(self, mpub: bool) -> tuple[str, str] | None:
        """The (code, description) a publish is refused with now, if any (and count it)."""
        refusal = self._refusal
        if refusal is None:
            return None
        if self._refusals_left is not None:
            self._refusals_left -= 1
            if self._refusals_left <= 0:
                self.accept_publishes()
        code, desc = refusal
        if mpub and code == "E_PUB_FAILED":
            code = "E_MPUB_FAILED"
        return code, desc

    @property
    def distributed_id(self) -> str:
        """The node's id in the cluster (stable across restarts)."""
        return f"{self.opts.broadcast_address}:{self.rpc_port}:{self.tcp_port}:{self._extra_id}"

    def peer_info(self) -> dict[str, Any]:
        """The node as youzan's nsqlookupd lists it (PeerInfo's fields, in Go's order)."""
        return {
            "id": self.peer_id,
            "remote_address": self.peer_id,
            "hostname": self.hostname,
            "broadcast_address": self.opts.broadcast_address,
            "tcp_port": self.tcp_port,
            "http_port": self.http_port,
            "version": YOUZAN_VERSION,
            "distributed_id": self.distributed_id,
        }
