"""The embedded nsqd node: its listeners and lifecycle, its topics, registering with nsqlookupd,
and the scheduling that pumps channels and flushes client output once per event-loop pass.

Everything runs on one asyncio event loop (the cluster's thread) and is never touched from
another thread.  The rooms it is built from: :mod:`.options` (flags), :mod:`.ids` (message
ids), :mod:`.queues` (topics and channels), :mod:`.protocol_v2` (one TCP client),
:mod:`.auth` (the auth server), :mod:`.lookup_peer` (registering with an nsqlookupd),
:mod:`.nsqd_http` (the HTTP API).

A node that is stopped and started again (``NSQD.stop()`` / ``NSQD.start()``) keeps its
non-ephemeral topics, channels, pause flags and undelivered messages, as a real nsqd with a data
path would (in-flight and deferred messages go back to their channel's queue on stop).
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import time
from collections.abc import Mapping
from typing import Protocol

from .gostyle import VERSION
from .httpserver import HTTPServerProtocol
from .ids import GUIDFactory
from .lookup_peer import LookupPeer
from .nodes import Listeners
from .nsqd_http import NSQDHTTP
from .options import NSQDOptions, build_ssl_context
from .protocol_v2 import ClientConn
from .queues import Channel, Message, Topic

__all__ = ["NSQDOptions", "NSQD", "Topic", "Channel", "Message", "ClientConn", "VERSION"]

log = logging.getLogger("nsqclient.testing.nsqd")


class ChannelDirectory(Protocol):
    """An nsqlookupd in this process, asked directly which channels a topic has."""

    running: bool

    def channels_of(self, topic: str) -> list[str]:
        """The channel names registered for ``topic``."""


class NSQD(Listeners):
    """One embedded nsqd node: state plus (while started) its TCP and HTTP listeners."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        opts: NSQDOptions,
        host: str = "127.0.0.1",
        tcp_port: int = 0,
        http_port: int = 0,
        lookupd_registry: Mapping[str, ChannelDirectory] | None = None,
    ):
        self.loop = loop
        self.opts = opts
        self.host = host
        self.tcp_port = tcp_port
        self.http_port = http_port
        node_id = opts.node_id if opts.node_id is not None else random.randrange(1024)
        self.guid = GUIDFactory(node_id)
        self.topics: dict[str, Topic] = {}
        self.conns: set[ClientConn] = set()
        self.http_conns: set[HTTPServerProtocol] = set()
        self.stalled = False
        self.running = False
        self.start_time = int(time.time())
        self.hostname = socket.gethostname()
        self.auth_enabled = bool(opts.auth_http_address)
        self.ssl_context = build_ssl_context(opts)
        self.lookupd_registry: Mapping[str, ChannelDirectory] = lookupd_registry or {}
        self.lookup_peers: list[LookupPeer] = []
        self._client_seq = 0
        self._tcp_server: asyncio.AbstractServer | None = None
        self._http_server: asyncio.AbstractServer | None = None
        self._dirty: dict[Channel, None] = {}
        self._flush_q: list[ClientConn] = []
        self._kicked = False
        self._scan_handle: asyncio.TimerHandle | None = None
        self._scan_at = 0.0
        self.http = NSQDHTTP(self)
        self.router = self.http.router

    # -- setup

    def next_client_id(self) -> int:
        self._client_seq += 1
        return self._client_seq

    async def start(self) -> None:
        """Listen (on the remembered ports after a restart) and connect to nsqlookupd."""
        if self.running:
            return
        self._tcp_server = await self.loop.create_server(
            lambda: ClientConn(self), self.host, self.tcp_port, reuse_address=True
        )
        self.tcp_port = self._tcp_server.sockets[0].getsockname()[1]
        try:
            self._http_server = await self.loop.create_server(
                lambda: HTTPServerProtocol(self), self.host, self.http_port, reuse_address=True
            )
        except BaseException:
            self._tcp_server.close()
            raise
        self.http_port = self._http_server.sockets[0].getsockname()[1]
        self.start_time = int(time.time())
        self.running = True
        self.stalled = False
        log.info("nsqd TCP: listening on %s", self.tcp_address)
        log.info("nsqd HTTP: listening on %s", self.http_address)
        self.lookup_peers = [LookupPeer(self, addr) for addr in self.opts.lookupd_tcp_addresses]
        for peer in self.lookup_peers:
            peer.start()
        self.wake_scanner()

    async def stop(self) -> None:
        """Close listeners and every connection; keep (non-ephemeral) data for a restart."""
        if not self.running:
            return
        self.running = False
        self.stalled = False
        for server in (self._tcp_server, self._http_server):
            if server is not None:
                server.close()
        for conn in list(self.conns):
            conn.abort()
        for http_conn in list(self.http_conns):
            http_conn.close()
        for peer in self.lookup_peers:
            await peer.stop()
        self.lookup_peers = []
        for server in (self._tcp_server, self._http_server):
            if server is not None:
                try:
                    await asyncio.wait_for(server.wait_closed(), 2.0)
                except (TimeoutError, Exception):
                    pass
        self._tcp_server = self._http_server = None
        if self._scan_handle is not None:
            self._scan_handle.cancel()
            self._scan_handle = None
        # like nsqd's Exit(): ephemeral topics/channels are not persisted; in-flight and
        # deferred messages are written back to their channel's queue.
        for name, topic in list(self.topics.items()):
            if topic.ephemeral:
                del self.topics[name]
                continue
            for cname, channel in list(topic.channels.items()):
                if channel.ephemeral:
                    del topic.channels[cname]
                    continue
                channel.flush_for_shutdown()
        self._dirty.clear()
        self._flush_q.clear()

    def set_lookupd_addresses(self, addresses: list[str]) -> None:
        """nsqd's PUT /config/nsqlookupd_tcp_addresses: connect to new peers, drop old ones."""
        self.opts.lookupd_tcp_addresses = list(addresses)
        keep = []
        for peer in self.lookup_peers:
            if peer.address in addresses:
                keep.append(peer)
            else:
                self.loop.create_task(peer.stop())
        known = {p.address for p in keep}
        for addr in addresses:
            if addr not in known:
                peer = LookupPeer(self, addr)
                if self.running:
                    peer.start()
                keep.append(peer)
                known.add(addr)
        self.lookup_peers = keep

    # -- fault controls

    def drop_connections(self) -> None:
        for conn in list(self.conns):
            conn.abort()

    def stall(self) -> None:
        self.stalled = True
        for conn in list(self.conns):
            if conn.transport is not None:
                conn.transport.pause_reading()
        for http_conn in list(self.http_conns):
            if http_conn.transport is not None and not http_conn.closed:
                http_conn.transport.pause_reading()

    def unstall(self) -> None:
        if not self.stalled:
            return
        self.stalled = False
        for conn in list(self.conns):
            conn.resume()
        for http_conn in list(self.http_conns):
            http_conn.resume()
        self._kick()
        self.wake_scanner()

    def inject(self, raw: bytes) -> None:
        for conn in list(self.conns):
            if conn.transport is not None and conn.state >= 0:
                conn.write(raw)

    # -- topics

    def get_topic(self, name: str) -> Topic:
        topic = self.topics.get(name)
        if topic is not None:
            return topic
        topic = Topic(self, name)
        self.topics[name] = topic
        log.debug("TOPIC(%s): created", name)
        self.notify_lookupd(topic, registering=True)
        # nsqd asks nsqlookupd which channels the topic has elsewhere and pre-creates them
        for channel_name in self._lookupd_channels(name):
            if not channel_name.endswith("#ephemeral"):
                topic.get_channel(channel_name)
        return topic

    def _lookupd_channels(self, topic: str) -> list[str]:
        names: list[str] = []
        for peer in self.lookup_peers:
            info = peer.info
            if not info or not info.get("broadcast_address"):
                continue
            key = f"{info['broadcast_address']}:{info.get('http_port')}"
            lookupd = self.lookupd_registry.get(key)
            if lookupd is None or not lookupd.running:
                continue
            for name in lookupd.channels_of(topic):
                if name not in names:
                    names.append(name)
        return names

    def delete_topic(self, name: str) -> bool:
        topic = self.topics.get(name)
        if topic is None:
            return False
        topic.exiting = True
        for cname in list(topic.channels):
            channel = topic.channels.pop(cname)
            channel.delete()
        topic.queue.clear()
        self.notify_lookupd(topic, registering=False)
        self.topics.pop(name, None)
        return True

    def notify_lookupd(self, obj: Topic | Channel, registering: bool) -> None:
        if not self.lookup_peers:
            return
        verb = b"REGISTER " if registering else b"UNREGISTER "
        if isinstance(obj, Channel):
            cmd = verb + obj.topic.name.encode() + b" " + obj.name.encode() + b"\n"
        else:
            cmd = verb + obj.name.encode() + b"\n"
        for peer in self.lookup_peers:
            peer.send(cmd)

    def registrations(self) -> list[bytes]:
        """The REGISTER commands nsqd sends after (re)connecting to an nsqlookupd."""
        cmds = []
        for topic in self.topics.values():
            if not topic.channels:
                cmds.append(b"REGISTER " + topic.name.encode() + b"\n")
            for channel in topic.channels.values():
                cmds.append(
                    b"REGISTER " + topic.name.encode() + b" " + channel.name.encode() + b"\n"
                )
        return cmds

    # -- scheduling

    def mark_dirty(self, channel: Channel) -> None:
        self._dirty[channel] = None
        if not self._kicked:
            self._kicked = True
            self.loop.call_soon(self._run)

    def schedule_flush(self, conn: ClientConn) -> None:
        self._flush_q.append(conn)
        if not self._kicked:
            self._kicked = True
            self.loop.call_soon(self._run)

    def _kick(self) -> None:
        if not self._kicked:
            self._kicked = True
            self.loop.call_soon(self._run)

    def _run(self) -> None:
        try:
            while (self._dirty or self._flush_q) and not self.stalled:
                dirty = self._dirty
                while dirty:
                    channel = next(iter(dirty))
                    del dirty[channel]
                    channel.pump()
                queue = self._flush_q
                self._flush_q = []
                for conn in queue:
                    if conn.flush_scheduled:
                        conn.flush()
        finally:
            self._kicked = False

    def wake_scanner(self) -> None:
        """Make sure the in-flight/deferred scan runs soon enough for the nearest deadline."""
        if not self.running:
            return
        now = self.loop.time()
        at = now + self.opts.queue_scan_interval
        handle = self._scan_handle
        if handle is not None:
            if self._scan_at <= at:
                return
            handle.cancel()
        self._scan_at = at
        self._scan_handle = self.loop.call_at(at, self._scan)

    def _scan(self) -> None:
        self._scan_handle = None
        if not self.running:
            return
        if self.stalled:
            return  # resumed by unstall()
        now = self.loop.time()
        nearest = None
        for topic in list(self.topics.values()):
            for channel in list(topic.channels.values()):
                channel.scan(now)
                d = channel.next_deadline()
                if d is not None and (nearest is None or d < nearest):
                    nearest = d
        if nearest is not None:
            at = max(nearest, now + self.opts.queue_scan_interval)
            self._scan_at = at
            self._scan_handle = self.loop.call_at(at, self._scan)

    # -- stats

    def producers(self) -> list[ClientConn]:
        return [c for c in self.conns if c.pub_counts]
