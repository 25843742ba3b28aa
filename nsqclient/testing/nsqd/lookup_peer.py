"""An nsqd's side of nsqlookupd's TCP protocol (``  V1``): connect to one nsqlookupd, IDENTIFY,
replay the node's topics and channels as REGISTER commands, then send live REGISTER/UNREGISTER
lines and a PING every ``lookupd_ping_interval`` seconds (nsqd's ``lookup.go`` and
``lookup_peer.go``).  Works with any nsqlookupd, embedded or real, in this process or another.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from typing import Any, Protocol

from ..gostyle.text import VERSION, go_json
from .options import NSQDOptions

__all__ = ["LookupPeer", "Registrant"]

log = logging.getLogger("nsqclient.testing.lookup_peer")

_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")


class Registrant(Protocol):
    """What a lookup peer needs of its nsqd node."""

    loop: asyncio.AbstractEventLoop
    opts: NSQDOptions
    hostname: str
    tcp_port: int
    http_port: int

    def registrations(self) -> list[bytes]:
        """The REGISTER lines for every topic and channel the node has now."""


class LookupPeer:
    """An embedded nsqd's connection to one nsqlookupd: IDENTIFY, REGISTER/UNREGISTER, PING.

    Commands are sent one at a time, each waiting for its reply, like nsqd's lookupPeer.  After
    (re)connecting, the node's current topics and channels are registered again.  A lost
    connection is retried every ``lookupd_reconnect_interval`` seconds.
    """

    def __init__(self, nsqd: Registrant, address: str):
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
