"""Opening a connection to nsqd: the dial, and the handshake bounded as a whole.

:func:`open_transport` dials (``dial_timeout``), then runs the handshake (magic, IDENTIFY,
TLS/snappy/deflate upgrades, AUTH) under one watchdog (``handshake_timeout``), whatever the peer
does: a peer dripping one byte a second cannot stretch it.  It runs on the thread that calls
:meth:`nsqclient.conn.Connection.connect`, before the connection's reader and writer exist, and
leaves nothing open when it fails.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import protocol
from ..config import Config, identify_payload
from ..errors import (
    AuthRequiredError,
    ConnectionClosedError,
    NSQError,
    NSQTimeoutError,
    ProtocolError,
    error_from_frame,
)
from ..protocol import FrameReader
from ._transport import Transport, make_tls_context

__all__ = ["Opened", "open_transport"]

logger = logging.getLogger("nsqclient.conn")


@dataclass
class Opened:
    """What a successful handshake leaves: the transport (upgraded as agreed) and what nsqd
    said."""

    transport: Transport
    #: nsqd's IDENTIFY answer ({} when it answered a bare OK)
    identify_response: dict[str, Any] = field(default_factory=dict)
    #: nsqd's AUTH answer, None without AUTH
    auth_response: dict[str, Any] | None = None


def open_transport(
    address: str,
    host: str,
    port: int,
    config: Config,
    deadline: float | None,
    deadline_name: str,
    aborted: threading.Event,
    keep_socket: Callable[[socket.socket], None],
) -> Opened:
    """Dial ``host:port`` and handshake; see the module doc.  ``deadline`` (a
    ``time.monotonic()``, or None) bounds both together when it comes first; a timeout error
    names the limit that fired (``dial_timeout``, ``handshake_timeout`` or ``deadline_name``).
    ``keep_socket`` gets the socket as soon as it is dialled (so another thread may shut it down
    to abort); ``aborted`` set meanwhile makes it fail with ConnectionClosedError.

    Raises:
        NSQError: nsqd refused or broke the handshake (ServerError, AuthRequiredError,
            ProtocolError, NSQTimeoutError...).
        OSError: the connection cannot be made.
    """
    sock = None
    transport: Transport | None = None
    watchdog: threading.Timer | None = None
    expired = threading.Event()
    handshake_timeout = config.handshake_timeout
    handshake_limit = "handshake_timeout"
    try:
        dial_timeout, dial_limit = config.dial_timeout, "dial_timeout"
        if deadline is not None and deadline - time.monotonic() < dial_timeout:
            dial_timeout, dial_limit = max(deadline - time.monotonic(), 0.001), deadline_name
        try:
            sock = _dial(address, host, port, dial_timeout, aborted, keep_socket)
        except TimeoutError as exc:
            raise NSQTimeoutError(
                f"connecting to {address} took longer than {dial_timeout:.2g}s ({dial_limit})"
            ) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if deadline is not None and deadline - time.monotonic() < handshake_timeout:
            handshake_timeout = max(deadline - time.monotonic(), 0.0)
            handshake_limit = deadline_name
        dialled = sock

        def expire() -> None:
            expired.set()
            try:
                dialled.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        # Each read below has its own socket timeout; the watchdog bounds them all together.
        watchdog = threading.Timer(handshake_timeout, expire)
        watchdog.name = f"nsq-handshake-{address}"
        watchdog.daemon = True
        watchdog.start()
        transport = Transport(sock)
        transport.settimeout(max(handshake_timeout, 0.001))
        opened = _Handshake(transport, config, address, host).run()
        if aborted.is_set():
            raise ConnectionClosedError(f"connecting to {address} was aborted")
        watchdog.cancel()
        if expired.is_set():
            raise NSQTimeoutError("expired")
        return opened
    except BaseException as exc:
        if watchdog is not None:
            watchdog.cancel()
        if transport is not None:
            transport.close()
        elif sock is not None:
            sock.close()
        timed_out = isinstance(exc, TimeoutError) and not isinstance(exc, NSQError)
        if expired.is_set() or timed_out:
            raise NSQTimeoutError(
                f"handshake with {address} timed out after {handshake_timeout:.2g}s"
                f" ({handshake_limit})"
            ) from exc
        raise
    finally:
        if watchdog is not None:
            watchdog.join()


def _dial(
    address: str,
    host: str,
    port: int,
    timeout: float,
    aborted: threading.Event,
    keep_socket: Callable[[socket.socket], None],
) -> socket.socket:
    """``socket.create_connection((host, port), timeout)``, but each socket goes to
    ``keep_socket`` before its connect starts: another thread shutting it down ends a dial in
    progress (on Linux at once; where a platform's connect does not notice, it waits out
    ``timeout``), and ``aborted`` set makes it fail with ConnectionClosedError."""
    error: OSError | None = None
    for family, kind, proto, _, sockaddr in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        keep_socket(sock)
        try:
            if aborted.is_set():
                raise ConnectionClosedError(f"connecting to {address} was aborted")
            sock.settimeout(timeout)
            sock.connect(sockaddr)
            if aborted.is_set():
                # Shut down after the check above but before its connect began: that shutdown
                # did not stop the connect, which may even have "succeeded" half-way (Linux).
                raise ConnectionClosedError(f"connecting to {address} was aborted")
        except BaseException as exc:
            sock.close()
            if aborted.is_set():
                raise ConnectionClosedError(f"connecting to {address} was aborted") from exc
            if not isinstance(exc, OSError):
                raise
            error = exc
            continue
        return sock
    raise error if error is not None else OSError(f"getaddrinfo returned nothing for {host}")


class _Handshake:
    """The handshake's steps on a fresh transport: magic and IDENTIFY, the upgrades nsqd
    agreed to, AUTH.  Heartbeats that arrive meanwhile are answered."""

    def __init__(self, transport: Transport, config: Config, address: str, host: str):
        self.transport = transport
        self.config = config
        self.address = address
        self.host = host
        self.frames = FrameReader(config.max_frame_size, peer=address)

    def run(self) -> Opened:
        from .._version import __version__

        cfg = self.config
        transport = self.transport
        opened = Opened(transport)
        transport.sendall(protocol.MAGIC_V2 + protocol.identify(identify_payload(cfg, __version__)))
        data = self._expect_ok("IDENTIFY")
        if data != protocol.OK:
            try:
                opened.identify_response = json.loads(data)
            except ValueError as exc:
                raise ProtocolError(f"IDENTIFY reply is not JSON: {data[:100]!r}") from exc
        resp = opened.identify_response
        if cfg.tls_v1:
            if not resp.get("tls_v1"):
                raise NSQError(f"TLS was requested but {self.address} does not offer it")
            context = make_tls_context(
                ca_file=cfg.tls_ca_file,
                verify=cfg.tls_verify,
                cert_file=cfg.tls_cert_file,
                key_file=cfg.tls_key_file,
            )
            transport.upgrade_tls(context, cfg.tls_server_name or self.host, cfg.handshake_timeout)
            self._expect_ok("TLS upgrade")
        if cfg.snappy and resp.get("snappy"):
            transport.upgrade_snappy()
            self._expect_ok("snappy upgrade")
        elif cfg.deflate and resp.get("deflate"):
            transport.upgrade_deflate(int(resp.get("deflate_level", cfg.deflate_level)))
            self._expect_ok("deflate upgrade")
        elif (cfg.snappy or cfg.deflate) and not (resp.get("snappy") or resp.get("deflate")):
            logger.warning("%s does not offer the requested compression", self.address)
        if resp.get("auth_required"):
            if cfg.auth_secret is None:
                raise AuthRequiredError(
                    f"{self.address} requires AUTH; pass auth_secret=... to authenticate"
                )
            transport.sendall(protocol.auth(cfg.auth_secret))
            data = self._expect_ok("AUTH")
            try:
                opened.auth_response = json.loads(data)
            except ValueError as exc:
                raise ProtocolError(f"AUTH reply is not JSON: {data[:100]!r}") from exc
            logger.info("authenticated to %s as %s", self.address, opened.auth_response)
        elif cfg.auth_secret is not None:
            logger.warning("auth_secret given but %s does not require AUTH", self.address)
        return opened

    def _read_frame(self) -> protocol.Frame:
        """Read exactly one frame, answering heartbeats."""
        while True:
            header = self._read_exact(4)
            self.frames.feed(header)
            size = int.from_bytes(header, "big")
            frame = self.frames.feed(self._read_exact(size))[0]
            if frame.type == protocol.FRAME_TYPE_RESPONSE and frame.data == protocol.HEARTBEAT:
                self.transport.sendall(protocol.nop())
                continue
            return frame

    def _read_exact(self, n: int) -> bytes:
        chunks = []
        while n:
            data = self.transport.recv(n)
            if not data:
                raise ConnectionClosedError(
                    f"{self.address} closed the connection during handshake"
                )
            chunks.append(data)
            n -= len(data)
        return b"".join(chunks)

    def _expect_ok(self, step: str) -> bytes:
        frame = self._read_frame()
        if frame.type == protocol.FRAME_TYPE_ERROR:
            raise error_from_frame(frame.data)
        if frame.type != protocol.FRAME_TYPE_RESPONSE:
            raise ProtocolError(f"{self.address} sent a message during {step}")
        return frame.data
