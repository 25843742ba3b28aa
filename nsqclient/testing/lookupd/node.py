"""The embedded nsqlookupd (1.3.0): its listeners and lifecycle.  The registration database is
in :mod:`.db`, the TCP protocol nsqd nodes speak in :mod:`.tcp`, the HTTP API in
:mod:`.http_api`; an nsqd's side of the TCP protocol is
:mod:`nsqclient.testing.nsqd.lookup_peer`.
"""

from __future__ import annotations

import asyncio
import logging

from ..http.server import HTTPServerProtocol, Router
from ..nodes import Listeners
from .db import RegistrationDB
from .http_api import LookupdHTTP
from .tcp import LookupConn

__all__ = ["Lookupd", "LookupdListeners", "RegistrationDB"]

log = logging.getLogger("nsqclient.testing.lookupd")


class LookupdListeners(Listeners):
    """The TCP and HTTP listeners of an nsqlookupd and its open connections (shared by the
    classic and youzan lookupds): listen, then close everything."""

    loop: asyncio.AbstractEventLoop
    #: where the HTTP listener binds when not on ``host``
    http_host: str | None = None
    broadcast_address: str
    db: RegistrationDB
    router: Router
    stalled: bool
    conns: set[LookupConn]
    http_conns: set[HTTPServerProtocol]
    _servers: list[asyncio.AbstractServer]

    async def _listen(self) -> None:
        """Open both listeners (on the same ports again after a restart; port 0 picks one)."""
        tcp = await self.loop.create_server(
            lambda: LookupConn(self), self.host, self.tcp_port, reuse_address=True
        )
        self.tcp_port = tcp.sockets[0].getsockname()[1]
        try:
            http = await self.loop.create_server(
                lambda: HTTPServerProtocol(self),
                self.http_host or self.host,
                self.http_port,
                reuse_address=True,
            )
        except BaseException:
            tcp.close()
            raise
        self.http_port = http.sockets[0].getsockname()[1]
        self._servers = [tcp, http]

    async def _close_listeners(self) -> None:
        """Close both listeners and drop every TCP and HTTP connection."""
        for server in self._servers:
            server.close()
        for conn in list(self.conns):
            if conn.transport is not None:
                conn.transport.abort()
        for http_conn in list(self.http_conns):
            http_conn.close()
        for server in self._servers:
            try:
                await asyncio.wait_for(server.wait_closed(), 2.0)
            except (TimeoutError, Exception):
                pass
        self._servers = []

    def stall(self) -> None:
        """Keep accepting connections but stop reading them (TCP and HTTP)."""
        self.stalled = True
        for conn in self.conns:
            if conn.transport is not None:
                conn.transport.pause_reading()
        for http_conn in self.http_conns:
            if http_conn.transport is not None:
                http_conn.transport.pause_reading()

    def unstall(self) -> None:
        """Answer again after :meth:`stall`."""
        self.stalled = False
        for conn in list(self.conns):
            conn.resume()
        for http_conn in list(self.http_conns):
            http_conn.resume()


class Lookupd(LookupdListeners):
    """One embedded nsqlookupd."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        host: str = "127.0.0.1",
        tcp_port: int = 0,
        http_port: int = 0,
        legacy_json: bool = False,
        broadcast_address: str = "127.0.0.1",
        inactive_producer_timeout: float = 300.0,
        tombstone_lifetime: float = 45.0,
        registry: dict[str, Lookupd] | None = None,
        http_host: str | None = None,
    ):
        self.loop = loop
        self.host = host
        self.tcp_port = tcp_port
        self.http_port = http_port
        #: where the HTTP listener binds when not on ``host``
        self.http_host = http_host
        self.legacy_json = legacy_json
        self.broadcast_address = broadcast_address
        self.inactive_producer_timeout = inactive_producer_timeout
        self.tombstone_lifetime = tombstone_lifetime
        self.registry = registry if registry is not None else {}
        self.db = RegistrationDB()
        self.conns: set[LookupConn] = set()
        self.http_conns: set[HTTPServerProtocol] = set()
        self.stalled = False
        self.running = False
        self._servers: list[asyncio.AbstractServer] = []
        self.http = LookupdHTTP(self)
        self.router = self.http.router

    async def start(self) -> None:
        """Listen (again on the same ports after a restart) with an empty database."""
        if self.running:
            return
        await self._listen()
        self.db = RegistrationDB()
        self.running = True
        self.stalled = False
        self.registry[f"{self.broadcast_address}:{self.http_port}"] = self
        log.info("nsqlookupd TCP: listening on %s", self.tcp_address)
        log.info("nsqlookupd HTTP: listening on %s", self.http_address)

    async def stop(self) -> None:
        """Close listeners and connections and forget every registration."""
        if not self.running:
            return
        self.running = False
        self.stalled = False
        await self._close_listeners()
        self.registry.pop(f"{self.broadcast_address}:{self.http_port}", None)
        self.db = RegistrationDB()

    def channels_of(self, topic: str) -> list[str]:
        """The channels registered for ``topic`` (what ``/channels?topic=`` answers)."""
        return self.db.channels_of(topic)
