"""The embedded nsqlookupd (HTTP API + the ``  V1`` TCP registration protocol) and the
lookup peer an embedded nsqd uses to register with any nsqlookupd over that protocol.

Follows nsqlookupd 1.3.0 (``nsqlookupd/http.go``, ``lookup_protocol_v1.go``,
``registration_db.go``) and nsqd's ``lookup.go`` / ``lookup_peer.go``.  With
``legacy_json=True`` every JSON reply is wrapped in ``{"status_code", "status_txt", "data"}``
as nsqlookupd did before 1.0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
import time
from typing import TYPE_CHECKING, Any

from ..protocol import valid_channel_name, valid_topic_name
from .httpserver import HTTPServerProtocol, QueryError, Request, Response, Router, parse_query
from .nodes import Listeners
from .nsqd import VERSION, go_json

if TYPE_CHECKING:  # pragma: no cover
    from .nsqd import NSQD

__all__ = ["RegistrationDB", "Lookupd", "LookupPeer"]

log = logging.getLogger("nsqclient.testing.lookupd")

_JSON = "application/json; charset=utf-8"
_NSQ_V1 = "nsq; version=1.0"
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")


# --------------------------------------------------------------------------------------------
# Registration database


class PeerInfo:
    """An nsqd known to nsqlookupd (its IDENTIFY plus the connection's address)."""

    __slots__ = (
        "id",
        "remote_address",
        "hostname",
        "broadcast_address",
        "tcp_port",
        "http_port",
        "version",
        "last_update",
    )

    def __init__(self, peer_id: str):
        self.id = peer_id
        self.remote_address = peer_id
        self.hostname = ""
        self.broadcast_address = ""
        self.tcp_port = 0
        self.http_port = 0
        self.version = ""
        self.last_update = time.monotonic()

    def as_json(self) -> dict[str, Any]:
        return {
            "remote_address": self.remote_address,
            "hostname": self.hostname,
            "broadcast_address": self.broadcast_address,
            "tcp_port": self.tcp_port,
            "http_port": self.http_port,
            "version": self.version,
        }


class Producer:
    """A peer's registration under one key (tombstones are per registration)."""

    __slots__ = ("peer", "tombstoned", "tombstoned_at")

    def __init__(self, peer: PeerInfo):
        self.peer = peer
        self.tombstoned = False
        self.tombstoned_at = 0.0

    def is_tombstoned(self, lifetime: float) -> bool:
        return self.tombstoned and time.monotonic() - self.tombstoned_at < lifetime


Key = tuple[str, str, str]  # category, key, subkey


class RegistrationDB:
    """nsqlookupd's registration map: (category, key, subkey) -> {peer id: Producer}."""

    def __init__(self):
        self.map: dict[Key, dict[str, Producer]] = {}

    def add_registration(self, k: Key) -> None:
        self.map.setdefault(k, {})

    def add_producer(self, k: Key, peer: PeerInfo) -> bool:
        producers = self.map.setdefault(k, {})
        if peer.id in producers:
            return False
        producers[peer.id] = Producer(peer)
        return True

    def remove_producer(self, k: Key, peer_id: str) -> tuple[bool, int]:
        producers = self.map.get(k)
        if producers is None:
            return False, 0
        removed = producers.pop(peer_id, None) is not None
        return removed, len(producers)

    def remove_registration(self, k: Key) -> None:
        self.map.pop(k, None)

    def find_registrations(self, category: str, key: str, subkey: str) -> list[Key]:
        if key != "*" and subkey != "*":
            k = (category, key, subkey)
            return [k] if k in self.map else []
        return [k for k in self.map if _match(k, category, key, subkey)]

    def find_producers(self, category: str, key: str, subkey: str) -> list[Producer]:
        if key != "*" and subkey != "*":
            return list(self.map.get((category, key, subkey), {}).values())
        seen: set[str] = set()
        out = []
        for k, producers in self.map.items():
            if not _match(k, category, key, subkey):
                continue
            for p in producers.values():
                if p.peer.id not in seen:
                    seen.add(p.peer.id)
                    out.append(p)
        return out

    def lookup_registrations(self, peer_id: str) -> list[Key]:
        return [k for k, producers in self.map.items() if peer_id in producers]

    def channels_of(self, topic: str) -> list[str]:
        return [k[2] for k in self.find_registrations("channel", topic, "*")]


def _match(k: Key, category: str, key: str, subkey: str) -> bool:
    return k[0] == category and (key == "*" or k[1] == key) and (subkey == "*" or k[2] == subkey)


def _active(producers: list[Producer], inactive: float, tombstone_lifetime: float):
    now = time.monotonic()
    return [
        p
        for p in producers
        if now - p.peer.last_update <= inactive and not p.is_tombstoned(tombstone_lifetime)
    ]


# --------------------------------------------------------------------------------------------
# The TCP protocol


class _FatalV1(Exception):
    def __init__(self, text: str, fatal: bool = True):
        super().__init__(text)
        self.text = text
        self.fatal = fatal


class LookupConn(asyncio.Protocol):
    """One nsqd connected to nsqlookupd's TCP port (protocol V1)."""

    def __init__(self, lookupd: Lookupd):
        self.lookupd = lookupd
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.magic_ok = False
        self.peer: PeerInfo | None = None
        self.remote = ""
        self.closed = False

    def connection_made(self, transport):
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if peer:
            self.remote = f"{peer[0]}:{peer[1]}"
        self.lookupd.conns.add(self)
        if self.lookupd.stalled:
            transport.pause_reading()

    def connection_lost(self, exc):
        self.closed = True
        self.lookupd.conns.discard(self)
        self.transport = None
        peer = self.peer
        if peer is not None:
            db = self.lookupd.db
            for k in db.lookup_registrations(peer.id):
                db.remove_producer(k, peer.id)
            self.peer = None

    def data_received(self, data):
        self.buf += data
        if not self.lookupd.stalled:
            self.process()

    def resume(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()
            self.process()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _send(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(_U32.pack(len(data)) + data)

    def process(self) -> None:
        buf = self.buf
        if not self.magic_ok:
            if len(buf) < 4:
                return
            if bytes(buf[:4]) != b"  V1":
                self._send(b"E_BAD_PROTOCOL")
                self.close()
                return
            del buf[:4]
            self.magic_ok = True
        while not self.closed and self.transport is not None:
            nl = buf.find(b"\n")
            if nl < 0:
                return
            line = bytes(buf[:nl]).decode("utf-8", "replace").strip()
            params = line.split(" ")
            cmd = params[0]
            try:
                if cmd == "PING":
                    consumed = nl + 1
                    if self.peer is not None:
                        self.peer.last_update = time.monotonic()
                    response = b"OK"
                elif cmd == "IDENTIFY":
                    res = self._identify(nl + 1)
                    if res is None:
                        return
                    consumed, response = res
                elif cmd == "REGISTER":
                    consumed = nl + 1
                    response = self._register(params[1:])
                elif cmd == "UNREGISTER":
                    consumed = nl + 1
                    response = self._unregister(params[1:])
                else:
                    raise _FatalV1(f"E_INVALID invalid command {cmd}")
            except _FatalV1 as err:
                self._send(err.text.encode())
                if err.fatal:
                    self.close()
                    return
                del buf[: nl + 1]
                continue
            del buf[:consumed]
            self._send(response)

    def _identify(self, start: int) -> tuple[int, bytes] | None:
        if self.peer is not None:
            raise _FatalV1("E_INVALID cannot IDENTIFY again")
        buf = self.buf
        if len(buf) < start + 4:
            return None
        size = _I32.unpack_from(buf, start)[0]
        if size < 0 or size > 64 * 1024 * 1024:
            raise _FatalV1("E_BAD_BODY IDENTIFY failed to read body")
        if len(buf) < start + 4 + size:
            return None
        body = bytes(buf[start + 4 : start + 4 + size])
        try:
            data = json.loads(body)
            if not isinstance(data, dict):
                raise ValueError
        except ValueError as exc:
            raise _FatalV1("E_BAD_BODY IDENTIFY failed to decode JSON body") from exc
        peer = PeerInfo(self.remote)
        peer.hostname = str(data.get("hostname") or "")
        peer.broadcast_address = str(data.get("broadcast_address") or "")
        peer.tcp_port = int(data.get("tcp_port") or 0)
        peer.http_port = int(data.get("http_port") or 0)
        peer.version = str(data.get("version") or "")
        if not (peer.broadcast_address and peer.tcp_port and peer.http_port and peer.version):
            raise _FatalV1("E_BAD_BODY IDENTIFY missing fields")
        peer.last_update = time.monotonic()
        self.peer = peer
        self.lookupd.db.add_producer(("client", "", ""), peer)
        log.info(
            "CLIENT(%s): IDENTIFY Address:%s TCP:%d HTTP:%d Version:%s",
            self.remote,
            peer.broadcast_address,
            peer.tcp_port,
            peer.http_port,
            peer.version,
        )
        lk = self.lookupd
        reply = {
            "broadcast_address": lk.broadcast_address,
            "hostname": socket.gethostname(),
            "http_port": lk.http_port,
            "tcp_port": lk.tcp_port,
            "version": VERSION,
        }
        return start + 4 + size, go_json(reply)

    @staticmethod
    def _topic_chan(command: str, params: list[str]) -> tuple[str, str]:
        if not params:
            raise _FatalV1(f"E_INVALID {command} insufficient number of params")
        topic = params[0]
        channel = params[1] if len(params) >= 2 else ""
        if not valid_topic_name(topic):
            raise _FatalV1(f"E_BAD_TOPIC {command} topic name '{topic}' is not valid")
        if channel and not valid_channel_name(channel):
            raise _FatalV1(f"E_BAD_CHANNEL {command} channel name '{channel}' is not valid")
        return topic, channel

    def _register(self, params: list[str]) -> bytes:
        if self.peer is None:
            raise _FatalV1("E_INVALID client must IDENTIFY")
        topic, channel = self._topic_chan("REGISTER", params)
        db = self.lookupd.db
        if channel:
            db.add_producer(("channel", topic, channel), self.peer)
        db.add_producer(("topic", topic, ""), self.peer)
        return b"OK"

    def _unregister(self, params: list[str]) -> bytes:
        if self.peer is None:
            raise _FatalV1("E_INVALID client must IDENTIFY")
        topic, channel = self._topic_chan("UNREGISTER", params)
        db = self.lookupd.db
        pid = self.peer.id
        if channel:
            key = ("channel", topic, channel)
            _, left = db.remove_producer(key, pid)
            if left == 0 and channel.endswith("#ephemeral"):
                db.remove_registration(key)
        else:
            for k in db.find_registrations("channel", topic, "*"):
                db.remove_producer(k, pid)
            key = ("topic", topic, "")
            _, left = db.remove_producer(key, pid)
            if left == 0 and topic.endswith("#ephemeral"):
                db.remove_registration(key)
        return b"OK"


# --------------------------------------------------------------------------------------------
# The server


class Lookupd(Listeners):
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
        registry: dict | None = None,
    ):
        self.loop = loop
        self.host = host
        self.tcp_port = tcp_port
        self.http_port = http_port
        self.legacy_json = legacy_json
        self.broadcast_address = broadcast_address
        self.inactive_producer_timeout = inactive_producer_timeout
        self.tombstone_lifetime = tombstone_lifetime
        self.registry = registry if registry is not None else {}
        self.db = RegistrationDB()
        self.conns: set[LookupConn] = set()
        self.http_conns: set = set()
        self.stalled = False
        self.running = False
        self._servers: list[asyncio.AbstractServer] = []
        r = Router(self._not_found, self._method_not_allowed)
        r.add("GET", "/ping", self.ping)
        r.add("GET", "/info", self._v1(self.info))
        r.add("GET", "/debug", self._v1(self.debug))
        r.add("GET", "/lookup", self._v1(self.lookup))
        r.add("GET", "/topics", self._v1(self.topics))
        r.add("GET", "/channels", self._v1(self.channels))
        r.add("GET", "/nodes", self._v1(self.nodes))
        r.add("POST", "/topic/create", self._v1(self.topic_create))
        r.add("POST", "/topic/delete", self._v1(self.topic_delete))
        r.add("POST", "/channel/create", self._v1(self.channel_create))
        r.add("POST", "/channel/delete", self._v1(self.channel_delete))
        r.add("POST", "/topic/tombstone", self._v1(self.topic_tombstone))
        self.router = r

    async def start(self) -> None:
        """Listen (again on the same ports after a restart) with an empty database."""
        if self.running:
            return
        tcp = await self.loop.create_server(
            lambda: LookupConn(self), self.host, self.tcp_port, reuse_address=True
        )
        self.tcp_port = tcp.sockets[0].getsockname()[1]
        try:
            http = await self.loop.create_server(
                lambda: HTTPServerProtocol(self), self.host, self.http_port, reuse_address=True
            )
        except BaseException:
            tcp.close()
            raise
        self.http_port = http.sockets[0].getsockname()[1]
        self._servers = [tcp, http]
        self.db = RegistrationDB()
        self.running = True
        self.stalled = False
        self.registry[f"{self.broadcast_address}:{self.http_port}"] = self
        log.info("nsqlookupd TCP: listening on %s", self.tcp_address)
        log.info("nsqlookupd HTTP: listening on %s", self.http_address)

    async def stop(self) -> None:
        if not self.running:
            return
        self.running = False
        self.stalled = False
        for server in self._servers:
            server.close()
        for conn in list(self.conns):
            if conn.transport is not None:
                conn.transport.abort()
        for conn in list(self.http_conns):
            conn.close()
        for server in self._servers:
            try:
                await asyncio.wait_for(server.wait_closed(), 2.0)
            except (TimeoutError, Exception):
                pass
        self._servers = []
        self.registry.pop(f"{self.broadcast_address}:{self.http_port}", None)
        self.db = RegistrationDB()

    def stall(self) -> None:
        self.stalled = True
        for conn in list(self.conns) + list(self.http_conns):
            if conn.transport is not None:
                conn.transport.pause_reading()

    def unstall(self) -> None:
        self.stalled = False
        for conn in list(self.conns) + list(self.http_conns):
            conn.resume()

    # -- HTTP

    def _respond(self, status: int, text: str, data: Any) -> Response:
        if self.legacy_json:
            body = go_json({"status_code": status, "status_txt": text, "data": data})
            return Response(status, body, {"Content-Type": _JSON})
        if status != 200:
            return Response(
                status,
                go_json({"message": text}),
                {"Content-Type": _JSON, "X-Nsq-Content-Type": _NSQ_V1},
            )
        if data is None:
            return Response(200, b"", {"X-Nsq-Content-Type": _NSQ_V1})
        return Response(200, go_json(data), {"Content-Type": _JSON, "X-Nsq-Content-Type": _NSQ_V1})

    def _v1(self, fn):
        def handler(request: Request) -> Response:
            try:
                params = parse_query(request.raw_query)
            except QueryError:
                return self._respond(400, "INVALID_REQUEST", None)
            result = fn(params)
            if isinstance(result, tuple):
                return self._respond(result[0], result[1], None)
            return self._respond(200, "OK", result)

        return handler

    def _not_found(self, request: Request) -> Response:
        return self._respond(404, "NOT_FOUND", None)

    def _method_not_allowed(self, request: Request, allowed: list[str]) -> Response:
        response = self._respond(405, "METHOD_NOT_ALLOWED", None)
        response.headers["Allow"] = ", ".join(allowed)
        return response

    def ping(self, request: Request) -> Response:
        return Response(200, b"OK", {})

    def info(self, params):
        return {"version": VERSION}

    def topics(self, params):
        return {"topics": [k[1] for k in self.db.find_registrations("topic", "*", "")]}

    def channels(self, params):
        if "topic" not in params:
            return 400, "MISSING_ARG_TOPIC"
        topic = params["topic"][0]
        return {"channels": self.db.channels_of(topic)}

    def lookup(self, params):
        if "topic" not in params:
            return 400, "MISSING_ARG_TOPIC"
        topic = params["topic"][0]
        if not self.db.find_registrations("topic", topic, ""):
            return 404, "TOPIC_NOT_FOUND"
        channels = self.db.channels_of(topic)
        producers = _active(
            self.db.find_producers("topic", topic, ""),
            self.inactive_producer_timeout,
            self.tombstone_lifetime,
        )
        return {"channels": channels, "producers": [p.peer.as_json() for p in producers]}

    def topic_create(self, params):
        if "topic" not in params:
            return 400, "MISSING_ARG_TOPIC"
        topic = params["topic"][0]
        if not valid_topic_name(topic):
            return 400, "INVALID_ARG_TOPIC"
        self.db.add_registration(("topic", topic, ""))
        return None

    def topic_delete(self, params):
        if "topic" not in params:
            return 400, "MISSING_ARG_TOPIC"
        topic = params["topic"][0]
        for k in self.db.find_registrations("channel", topic, "*"):
            self.db.remove_registration(k)
        for k in self.db.find_registrations("topic", topic, ""):
            self.db.remove_registration(k)
        return None

    def topic_tombstone(self, params):
        if "topic" not in params:
            return 400, "MISSING_ARG_TOPIC"
        if "node" not in params:
            return 400, "MISSING_ARG_NODE"
        topic = params["topic"][0]
        node = params["node"][0]
        for p in self.db.find_producers("topic", topic, ""):
            if f"{p.peer.broadcast_address}:{p.peer.http_port}" == node:
                p.tombstoned = True
                p.tombstoned_at = time.monotonic()
        return None

    @staticmethod
    def _topic_channel(params) -> tuple[str, str] | tuple[int, str]:
        if "topic" not in params:
            return 400, "MISSING_ARG_TOPIC"
        topic = params["topic"][0]
        if not valid_topic_name(topic):
            return 400, "INVALID_ARG_TOPIC"
        if "channel" not in params:
            return 400, "MISSING_ARG_CHANNEL"
        channel = params["channel"][0]
        if not valid_channel_name(channel):
            return 400, "INVALID_ARG_CHANNEL"
        return topic, channel

    def channel_create(self, params):
        res = self._topic_channel(params)
        if isinstance(res[0], int):
            return res
        topic, channel = res
        self.db.add_registration(("channel", topic, channel))
        self.db.add_registration(("topic", topic, ""))
        return None

    def channel_delete(self, params):
        res = self._topic_channel(params)
        if isinstance(res[0], int):
            return res
        topic, channel = res
        keys = self.db.find_registrations("channel", topic, channel)
        if not keys:
            return 404, "CHANNEL_NOT_FOUND"
        for k in keys:
            self.db.remove_registration(k)
        return None

    def nodes(self, params):
        producers = _active(
            self.db.find_producers("client", "", ""), self.inactive_producer_timeout, 0.0
        )
        nodes = []
        for p in producers:
            topics = [
                k[1]
                for k in self.db.lookup_registrations(p.peer.id)
                if k[0] == "topic" and k[2] == ""
            ]
            tombstones = []
            for t in topics:
                flag = False
                for tp in self.db.find_producers("topic", t, ""):
                    if tp.peer is p.peer:
                        flag = tp.is_tombstoned(self.tombstone_lifetime)
                        break
                tombstones.append(flag)
            info = p.peer.as_json()
            info["tombstones"] = tombstones
            info["topics"] = topics
            nodes.append(info)
        return {"producers": nodes}

    def debug(self, params):
        data: dict[str, list] = {}
        for k, producers in self.db.map.items():
            key = ":".join(k)
            for p in producers.values():
                data.setdefault(key, []).append(
                    {
                        "id": p.peer.id,
                        "hostname": p.peer.hostname,
                        "broadcast_address": p.peer.broadcast_address,
                        "tcp_port": p.peer.tcp_port,
                        "http_port": p.peer.http_port,
                        "version": p.peer.version,
                        "last_update": int(p.peer.last_update * 1e9),
                        "tombstoned": p.tombstoned,
                        "tombstoned_at": int(p.tombstoned_at * 1e9),
                    }
                )
        return data


# --------------------------------------------------------------------------------------------
# The nsqd side: a lookup peer


class LookupPeer:
    """An embedded nsqd's connection to one nsqlookupd: IDENTIFY, REGISTER/UNREGISTER, PING.

    Commands are sent one at a time, each waiting for its reply, like nsqd's lookupPeer.  After
    (re)connecting, the node's current topics and channels are registered again.  A lost
    connection is retried every ``lookupd_reconnect_interval`` seconds.
    """

    def __init__(self, nsqd: NSQD, address: str):
        self.nsqd = nsqd
        self.address = address
        host, _, port = address.rpartition(":")
        self.host = host.strip("[]") or "127.0.0.1"
        self.port = int(port)
        self.info: dict[str, Any] | None = None
        #: True once IDENTIFY and the replay of current registrations are done
        self.synced = False
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._stopping = False

    def start(self) -> None:
        self._stopping = False
        self._task = self.nsqd.loop.create_task(self._run())

    def send(self, cmd: bytes) -> None:
        """Queue a REGISTER/UNREGISTER line (dropped while disconnected: re-sync on connect)."""
        if self._writer is not None:
            self.queue.put_nowait(cmd)

    async def stop(self) -> None:
        """Close the connection and end the task (nsqlookupd then forgets this node)."""
        self._stopping = True
        task = self._task
        self._task = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if task is not None:
            task.cancel()
            # (asyncio.wait, not "await task": a cancellation swallowed by a racing
            # timeout in Python 3.11 must not hang the caller; the loop checks _stopping)
            await asyncio.wait({task}, timeout=2.0)

    async def _command(self, reader, writer, cmd: bytes, timeout: float = 1.0) -> bytes:
        writer.write(cmd)
        async with asyncio.timeout(timeout):
            head = await reader.readexactly(4)
            size = _I32.unpack(head)[0]
            if size > self.nsqd.opts.max_body_size:
                raise ConnectionError(f"response body size ({size}) is greater than limit")
            return await reader.readexactly(size)

    async def _run(self) -> None:
        opts = self.nsqd.opts
        loop = self.nsqd.loop
        while not self._stopping:
            try:
                async with asyncio.timeout(1.0):
                    reader, writer = await asyncio.open_connection(self.host, self.port)
            except OSError as exc:  # refused, unreachable, timed out
                log.debug("LOOKUP(%s): connect failed - %s", self.address, exc)
                await asyncio.sleep(opts.lookupd_reconnect_interval)
                continue
            if self._stopping:
                writer.close()
                return
            try:
                writer.write(b"  V1")
                ident = {
                    "broadcast_address": opts.broadcast_address,
                    "hostname": self.nsqd.hostname,
                    "http_port": self.nsqd.http_port,
                    "tcp_port": self.nsqd.tcp_port,
                    "version": VERSION,
                }
                body = go_json(ident)
                resp = await self._command(
                    reader, writer, b"IDENTIFY\n" + _U32.pack(len(body)) + body
                )
                if resp == b"E_INVALID":
                    raise ConnectionError("lookupd returned E_INVALID")
                self.info = json.loads(resp)
                # start queueing live notifications, then register what exists now
                while not self.queue.empty():
                    self.queue.get_nowait()
                self._writer = writer
                for cmd in self.nsqd.registrations():
                    await self._command(reader, writer, cmd)
                self.synced = True
                ping_at = loop.time() + opts.lookupd_ping_interval
                while not self._stopping:
                    if reader.at_eof():
                        raise ConnectionError("nsqlookupd closed the connection")
                    now = loop.time()
                    if now >= ping_at:
                        cmd = b"PING\n"
                        ping_at = now + opts.lookupd_ping_interval
                    else:
                        try:
                            async with asyncio.timeout(min(ping_at - now, 0.25)):
                                cmd = await self.queue.get()
                        except TimeoutError:
                            continue
                    await self._command(reader, writer, cmd)
            except asyncio.CancelledError:
                writer.close()
                raise
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                log.info("LOOKUPD(%s): connection lost - %s", self.address, exc)
            self._writer = None
            self.info = None
            self.synced = False
            writer.close()
            if not self._stopping:
                await asyncio.sleep(opts.lookupd_reconnect_interval)
