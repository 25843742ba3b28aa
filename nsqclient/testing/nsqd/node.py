"""The embedded nsqd node: its listeners and lifecycle, its topics, registering with nsqlookupd,
and the scheduling that pumps channels and flushes client output once per event-loop pass.

Everything runs on one asyncio event loop (the cluster's thread) and is never touched from
another thread.  The rooms it is built from: :mod:`.options` (flags), :mod:`.ids` (message
ids), :mod:`.queues` (topics and channels), :mod:`.client` (one TCP client),
:mod:`.auth` (the auth server), :mod:`.lookup_peer` (registering with an nsqlookupd),
:mod:`.http_api` (the HTTP API).

A node that is stopped and started again (``NSQD.stop()`` / ``NSQD.start()``) keeps its
non-ephemeral topics, channels, pause flags and undelivered messages, as a real nsqd with a data
path would (in-flight and deferred messages go back to their channel's queue on stop).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import time
import urllib.parse
from collections.abc import Mapping
from typing import Protocol

from ..gostyle.text import VERSION
from ..http.client import http_get_json
from ..http.server import HTTPServerProtocol
from ..nodes import Listeners
from . import datapath
from .client import ClientConn
from .http_api import NSQDHTTP
from .ids import GUIDFactory
from .lookup_peer import LookupPeer
from .options import NSQDOptions, build_ssl_context
from .queues import Channel, Message, Topic
from .writes import WriteSplitter

__all__ = ["NSQDOptions", "NSQD", "Topic", "Channel", "Message", "ClientConn", "VERSION"]

log = logging.getLogger("nsqclient.testing.nsqd")


class ChannelDirectory(Protocol):
    """An nsqlookupd in this process, asked directly which channels a topic has."""

    running: bool

    def channels_of(self, topic: str) -> list[str]:
        """The channel names registered for ``topic``."""


class NSQD(Listeners):
    """One embedded nsqd node: state plus (while started) its TCP and HTTP listeners."""

    #: the protocol object made for each TCP connection
    conn_class: type[ClientConn] = ClientConn

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        opts: NSQDOptions,
        host: str = "127.0.0.1",
        tcp_port: int = 0,
        http_port: int = 0,
        lookupd_registry: Mapping[str, ChannelDirectory] | None = None,
        http_host: str | None = None,
        https_host: str | None = None,
        https_port: int | None = None,
    ):
        self.loop = loop
        self.opts = opts
        self.host = host
        self.tcp_port = tcp_port
        self.http_port = http_port
        #: where the HTTP listener binds when not on ``host``
        self.http_host = http_host
        #: the HTTPS listener (only with a TLS certificate; None: no HTTPS listener)
        self.https_host = https_host
        self.https_port = https_port
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
        self._https_server: asyncio.AbstractServer | None = None
        self._dirty: dict[Channel, None] = {}
        self._flush_q: list[ClientConn] = []
        self._kicked = False
        self._scan_handle: asyncio.TimerHandle | None = None
        self._scan_at = 0.0
        self._split_seed = (
            opts.split_writes_seed
            if opts.split_writes_seed is not None
            else random.randrange(1 << 32)
        )
        #: True while topics and channels are restored from the data path
        self.restoring = False
        self._restored = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.http = NSQDHTTP(self)
        self.router = self.http.router

    # -- setup

    def write_splitter(self, client_id: int) -> WriteSplitter | None:
        """The fault control cutting client ``client_id``'s writes, when it is on."""
        if not self.opts.split_writes:
            return None
        return WriteSplitter(f"{self._split_seed}:{client_id}")

    def next_client_id(self) -> int:
        self._client_seq += 1
        return self._client_seq

    async def start(self) -> None:
        """Listen (on the remembered ports after a restart) and connect to nsqlookupd."""
        if self.running:
            return
        if self.opts.data_path and not self._restored:
            self._restore()
        self._restored = True
        self._tcp_server = await self.loop.create_server(
            lambda: self.conn_class(self), self.host, self.tcp_port, reuse_address=True
        )
        self.tcp_port = self._tcp_server.sockets[0].getsockname()[1]
        try:
            self._http_server = await self.loop.create_server(
                lambda: HTTPServerProtocol(self),
                self.http_host or self.host,
                self.http_port,
                reuse_address=True,
            )
        except BaseException:
            self._tcp_server.close()
            raise
        self.http_port = self._http_server.sockets[0].getsockname()[1]
        if self.ssl_context is not None and self.https_port is not None:
            try:
                self._https_server = await self.loop.create_server(
                    lambda: HTTPServerProtocol(self),
                    self.https_host or self.host,
                    self.https_port,
                    reuse_address=True,
                    ssl=self.ssl_context,
                )
            except BaseException:
                self._tcp_server.close()
                self._http_server.close()
                raise
            self.https_port = self._https_server.sockets[0].getsockname()[1]
            log.info(
                "nsqd HTTPS: listening on %s:%d", self.https_host or self.host, self.https_port
            )
        self.start_time = int(time.time())
        self.running = True
        self.stalled = False
        log.info("nsqd TCP: listening on %s", self.tcp_address)
        log.info("nsqd HTTP: listening on %s", self.http_address)
        if self.opts.split_writes:
            log.info("nsqd: splitting writes to clients (seed %d)", self._split_seed)
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
        for server in (self._tcp_server, self._http_server, self._https_server):
            if server is not None:
                server.close()
        for conn in list(self.conns):
            conn.abort()
        for http_conn in list(self.http_conns):
            http_conn.close()
        for peer in self.lookup_peers:
            await peer.stop()
        self.lookup_peers = []
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=2.0)
        for server in (self._tcp_server, self._http_server, self._https_server):
            if server is not None:
                try:
                    await asyncio.wait_for(server.wait_closed(), 2.0)
                except (TimeoutError, Exception):
                    pass
        self._tcp_server = self._http_server = self._https_server = None
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
        if self.opts.data_path:
            self.persist_metadata()
            count = datapath.save_queues(self.opts.data_path, self.topics.values())
            log.info("nsqd: %d queued message(s) saved in %s", count, self.opts.data_path)

    # -- the data path

    def _restore(self) -> None:
        """Topics, channels, pause flags and queued messages from the data path."""
        data_path = self.opts.data_path
        assert data_path is not None
        os.makedirs(data_path, exist_ok=True)
        self.restoring = True
        count = 0
        try:
            for doc in datapath.load_metadata(data_path):
                topic = self.get_topic(doc["name"])
                for cdoc in doc.get("channels") or []:
                    if isinstance(cdoc, dict) and isinstance(cdoc.get("name"), str):
                        topic.get_channel(cdoc["name"]).paused = bool(cdoc.get("paused"))
                topic.paused = bool(doc.get("paused"))
            for topic_name, channel_name, msgs in datapath.load_queues(data_path):
                topic = self.get_topic(topic_name)
                if channel_name:
                    topic.get_channel(channel_name).queue.extend(msgs)
                else:
                    topic.queue.extend(msgs)
                    topic.drain()
                count += len(msgs)
        finally:
            self.restoring = False
        log.info(
            "nsqd: restored %d topic(s) and %d queued message(s) from %s",
            len(self.topics),
            count,
            data_path,
        )

    def persist_metadata(self) -> None:
        """Rewrite ``nsqd.dat`` in the data path (nothing without one)."""
        if self.opts.data_path and not self.restoring:
            datapath.save_metadata(self.opts.data_path, list(self.topics.values()))

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
        if self.restoring:
            return topic  # nsqd does not ask nsqlookupd while loading its metadata
        # nsqd asks nsqlookupd which channels the topic has elsewhere and pre-creates them
        # before any message flows (an nsqlookupd in this process is asked directly)
        names: list[str] = []
        remote: list[str] = []
        for address in self._lookupd_http_addresses():
            lookupd = self.lookupd_registry.get(address)
            if lookupd is None:
                remote.append(address)
            elif lookupd.running:
                names.extend(n for n in lookupd.channels_of(name) if n not in names)
        if remote:
            topic.loading = True
            task = self.loop.create_task(self._learn_channels(topic, names, remote))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            topic.finish_loading(names)
        if not names and not remote and self.opts.lookupd_tcp_addresses:
            log.info("no available nsqlookupd to query for channels of topic %s", name)
        return topic

    def _lookupd_http_addresses(self) -> list[str]:
        """``host:port`` of the HTTP API of every nsqlookupd this node has identified to."""
        out = []
        for peer in self.lookup_peers:
            info = peer.info
            if info and info.get("broadcast_address") and info.get("http_port"):
                address = f"{info['broadcast_address']}:{info['http_port']}"
                if address not in out:
                    out.append(address)
        return out

    async def _learn_channels(self, topic: Topic, names: list[str], addresses: list[str]) -> None:
        """Ask each nsqlookupd's ``/channels`` for ``topic``'s channels, then open the topic."""
        opts = self.opts
        query = urllib.parse.urlencode({"topic": topic.name})
        try:
            for address in addresses:
                url = f"http://{address}/channels?{query}"
                try:
                    doc = await http_get_json(
                        url, opts.http_client_connect_timeout, opts.http_client_request_timeout
                    )
                except (OSError, TimeoutError, ValueError) as exc:
                    log.warning(
                        "failed to query nsqlookupd %s for channels of topic %s - %s",
                        address,
                        topic.name,
                        exc,
                    )
                    continue
                if isinstance(doc, dict) and isinstance(doc.get("data"), dict):
                    doc = doc["data"]  # nsqlookupd before 1.0 wrapped its answers
                found = doc.get("channels") if isinstance(doc, dict) else None
                for channel in found or []:
                    if isinstance(channel, str) and channel not in names:
                        names.append(channel)
        finally:
            topic.finish_loading(names)

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
        """Tell every nsqlookupd (and the data path's metadata) that ``obj`` came or went."""
        if self.opts.data_path and not obj.ephemeral:
            self.persist_metadata()
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
