"""nsqlookupd's TCP side: one :class:`LookupConn` per nsqd speaking protocol ``  V1``
(IDENTIFY, REGISTER, UNREGISTER, PING), as ``lookup_protocol_v1.go`` answers them.

The nsqlookupd node is seen through the :class:`Registry` protocol, so this module does not
import it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
import time
from typing import Protocol

from ...protocol import valid_channel_name, valid_topic_name
from ..gostyle.text import VERSION, go_json
from .db import PeerInfo, RegistrationDB

__all__ = ["LookupConn", "Registry"]

log = logging.getLogger("nsqclient.testing.lookupd")

_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")


class Registry(Protocol):
    """What a registration connection needs of its nsqlookupd."""

    db: RegistrationDB
    conns: set[LookupConn]
    stalled: bool
    broadcast_address: str
    tcp_port: int
    http_port: int


class _FatalV1(Exception):
    def __init__(self, text: str, fatal: bool = True):
        super().__init__(text)
        self.text = text
        self.fatal = fatal


class LookupConn(asyncio.Protocol):
    """One nsqd connected to nsqlookupd's TCP port (protocol V1)."""

    def __init__(self, lookupd: Registry):
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
