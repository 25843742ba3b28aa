"""conn/_handshake.py: :func:`open_transport` against small scripted peers on loopback.

Each peer is a listening socket and a thread that plays nsqd's side of the handshake byte by
byte (the magic, IDENTIFY answered with JSON or a bare OK, error frames, AUTH).  Whatever
happens, a failed ``open_transport`` leaves no socket open and no ``nsq-handshake-*`` watchdog
alive once it returns.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nsqclient import protocol
from nsqclient.config import Config
from nsqclient.conn._handshake import Opened, open_transport
from nsqclient.errors import (
    AuthFailedError,
    AuthRequiredError,
    BadBodyError,
    ConnectionClosedError,
    IdentifyFailedError,
    NSQError,
    NSQTimeoutError,
    ProtocolError,
    ServerError,
)

#: Seconds: the bound of every wait; reached only when something is broken.
TIMEOUT = 10.0


class Hangup(Exception):
    """The client closed its end."""


class Wire:
    """The peer's end of one accepted connection, as the script sees it."""

    def __init__(self, sock: socket.socket, stop: threading.Event):
        self.sock = sock
        self.stop = stop
        self.sent = 0  # bytes the script sent

    def read_exact(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise Hangup
            data += chunk
        return data

    def read_command(self) -> tuple[bytes, bytes | None]:
        """One command: its line, and its body for those that carry one (IDENTIFY, AUTH)."""
        line = b""
        while not line.endswith(b"\n"):
            line += self.read_exact(1)
        line = line[:-1]
        if line in (b"IDENTIFY", b"AUTH"):
            (size,) = struct.unpack(">l", self.read_exact(4))
            return line, self.read_exact(size)
        return line, None

    def expect_identify(self) -> dict[str, Any]:
        """Read the magic and the IDENTIFY; its JSON."""
        assert self.read_exact(4) == protocol.MAGIC_V2
        line, body = self.read_command()
        assert line == b"IDENTIFY" and body is not None
        return json.loads(body)

    def send(self, data: bytes, frame_type: int = protocol.FRAME_TYPE_RESPONSE) -> None:
        frame = protocol.encode_frame(frame_type, data)
        self.sock.sendall(frame)
        self.sent += len(frame)

    def drip(self, data: bytes, frame_type: int = protocol.FRAME_TYPE_RESPONSE) -> None:
        """Send a frame one byte every 20 ms (the pace of a peer that stalls, not a wait)."""
        for byte in protocol.encode_frame(frame_type, data):
            if self.stop.wait(0.02):
                return
            self.sock.sendall(bytes([byte]))
            self.sent += 1

    def hold(self) -> None:
        """Keep the connection open, reading, until the client closes it."""
        while self.sock.recv(4096):
            pass


Script = Callable[[Wire], None]


class Peer:
    """A loopback listener whose first connection is handed to a script on a thread."""

    def __init__(self, script: Script):
        self.script = script
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)  # a close() does not wake an accept() everywhere
        self.host, self.port = self.listener.getsockname()
        self.address = f"{self.host}:{self.port}"
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.wire: Wire | None = None
        self.thread = threading.Thread(target=self._serve, name="test-handshake-peer", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                sock, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with sock:
                sock.settimeout(TIMEOUT)
                self.wire = Wire(sock, self.stop)
                try:
                    self.script(self.wire)
                except (Hangup, OSError):
                    pass  # the client went away: what a failing handshake does
                except BaseException as exc:  # an assertion of the script: the test reports it
                    self.error = exc
            return

    def close(self) -> None:
        self.stop.set()
        if self.wire is not None:  # ends a hold() the client never ended (a failed test)
            try:
                self.wire.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.thread.join(TIMEOUT)
        self.listener.close()
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error


@pytest.fixture
def peers() -> Iterator[Callable[[Script], Peer]]:
    """``peers(script) -> Peer``; each is stopped and its script's own failure raised at
    teardown."""
    made: list[Peer] = []

    def make(script: Script) -> Peer:
        made.append(Peer(script))
        return made[-1]

    yield make
    for peer in made:
        peer.close()


class Attempt:
    """One ``open_transport`` call: the sockets its ``keep_socket`` got, and its abort flag."""

    def __init__(self, address: str, **options: Any):
        self.address = address
        self.host, port = address.rsplit(":", 1)
        self.port = int(port)
        self.config = Config(**options)
        self.aborted = threading.Event()
        self.kept: list[socket.socket] = []
        self.elapsed = 0.0

    def open(self, deadline: float | None = None, deadline_name: str = "deadline") -> Opened:
        start = time.monotonic()
        try:
            return open_transport(
                self.address,
                self.host,
                self.port,
                self.config,
                deadline,
                deadline_name,
                self.aborted,
                self.kept.append,
            )
        finally:
            self.elapsed = time.monotonic() - start

    def watchdogs(self) -> list[threading.Thread]:
        name = f"nsq-handshake-{self.address}"
        return [t for t in threading.enumerate() if t.name == name]

    def left_nothing(self) -> None:
        """Every socket it dialled is closed and its watchdog has ended."""
        assert self.kept, "keep_socket got no socket"
        assert all(s.fileno() == -1 for s in self.kept), self.kept
        assert not self.watchdogs()


def answer_identify(reply: bytes, frame_type: int = protocol.FRAME_TYPE_RESPONSE) -> Script:
    def script(wire: Wire) -> None:
        wire.expect_identify()
        wire.send(reply, frame_type)
        wire.hold()

    return script


def silent(wire: Wire) -> None:
    """Read the IDENTIFY and never answer it."""
    wire.expect_identify()
    wire.hold()


def dripping(wire: Wire) -> None:
    """Answer the IDENTIFY with a 200-byte frame, one byte at a time."""
    wire.expect_identify()
    wire.drip(b" " * 200)


@pytest.fixture
def refused() -> Iterator[str]:
    """An address that refuses connections (bound, not listening)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{sock.getsockname()[1]}"


# ------------------------------------------------------------------------------------------------
# Success


def test_a_json_identify_answer_is_parsed_and_keep_socket_has_the_socket(peers):
    seen: list[dict[str, Any]] = []

    def script(wire: Wire) -> None:
        seen.append(wire.expect_identify())
        wire.send(b'{"max_rdy_count": 2500, "version": "1.3.0"}')
        wire.hold()

    peer = peers(script)
    attempt = Attempt(peer.address, client_id="unit")
    opened = attempt.open()
    try:
        assert opened.identify_response == {"max_rdy_count": 2500, "version": "1.3.0"}
        assert opened.auth_response is None
        assert seen[0]["client_id"] == "unit" and seen[0]["feature_negotiation"] is True
        [sock] = attempt.kept
        assert opened.transport.fileno() == sock.fileno() != -1
        assert sock.getpeername() == (peer.host, peer.port)
        assert not attempt.watchdogs()  # cancelled and joined before it returned
    finally:
        opened.transport.close()
    assert sock.fileno() == -1  # the transport owned it


def test_a_bare_ok_answer_is_an_empty_identify_response(peers):
    peer = peers(answer_identify(protocol.OK))
    opened = Attempt(peer.address).open()
    opened.transport.close()
    assert opened.identify_response == {}


def test_a_heartbeat_during_the_handshake_is_answered_with_nop(peers):
    commands: list[bytes] = []

    def script(wire: Wire) -> None:
        wire.expect_identify()
        wire.send(protocol.HEARTBEAT)
        commands.append(wire.read_command()[0])
        wire.send(protocol.OK)
        wire.hold()

    peer = peers(script)
    opened = Attempt(peer.address).open()
    opened.transport.close()
    assert commands == [b"NOP"]
    assert opened.identify_response == {}


def test_auth_is_sent_when_nsqd_requires_it_and_its_answer_parsed(peers):
    secrets: list[bytes | None] = []

    def script(wire: Wire) -> None:
        wire.expect_identify()
        wire.send(b'{"auth_required": true}')
        line, secret = wire.read_command()
        assert line == b"AUTH"
        secrets.append(secret)
        wire.send(b'{"identity": "unit", "permission_count": 1}')
        wire.hold()

    peer = peers(script)
    opened = Attempt(peer.address, auth_secret="s3cret").open()
    opened.transport.close()
    assert secrets == [b"s3cret"]
    assert opened.auth_response == {"identity": "unit", "permission_count": 1}


# ------------------------------------------------------------------------------------------------
# Refusals: the typed error, nothing left open


def auth_refused(wire: Wire) -> None:
    wire.expect_identify()
    wire.send(b'{"auth_required": true}')
    wire.read_command()
    wire.send(b"E_AUTH_FAILED AUTH failed", protocol.FRAME_TYPE_ERROR)
    wire.hold()


def hang_up_after_identify(wire: Wire) -> None:
    wire.expect_identify()


@pytest.mark.parametrize(
    ("script", "options", "error", "match"),
    [
        (
            answer_identify(b"E_BAD_BODY IDENTIFY invalid body", protocol.FRAME_TYPE_ERROR),
            {},
            BadBodyError,
            "E_BAD_BODY IDENTIFY invalid body",
        ),
        (
            answer_identify(b"E_IDENTIFY_FAILED bad deflate", protocol.FRAME_TYPE_ERROR),
            {},
            IdentifyFailedError,
            "E_IDENTIFY_FAILED bad deflate",
        ),
        (answer_identify(b'{"auth_required": true}'), {}, AuthRequiredError, "auth_secret"),
        (auth_refused, {"auth_secret": "wrong"}, AuthFailedError, "E_AUTH_FAILED AUTH failed"),
        (answer_identify(b"not json"), {}, ProtocolError, "not JSON"),
        (
            answer_identify(b"x" * 30, protocol.FRAME_TYPE_MESSAGE),
            {},
            ProtocolError,
            "message during IDENTIFY",
        ),
        (answer_identify(b'{"tls_v1": false}'), {"tls_v1": True}, NSQError, "TLS"),
        (hang_up_after_identify, {}, ConnectionClosedError, "during handshake"),
    ],
    ids=[
        "E_BAD_BODY",
        "E_IDENTIFY_FAILED",
        "auth-required-no-secret",
        "E_AUTH_FAILED",
        "not-json",
        "message-frame",
        "tls-not-offered",
        "hang-up",
    ],
)
def test_a_refused_handshake_raises_its_error_and_leaves_nothing_open(
    peers, script, options, error, match
):
    peer = peers(script)
    attempt = Attempt(peer.address, **options)
    with pytest.raises(error, match=match) as info:
        attempt.open()
    attempt.left_nothing()
    if isinstance(info.value, ServerError):
        assert info.value.code == match.split()[0]


def test_a_refused_dial_raises_the_socket_error_and_leaves_nothing_open(refused):
    attempt = Attempt(refused)
    with pytest.raises(ConnectionRefusedError):
        attempt.open()
    attempt.left_nothing()


# ------------------------------------------------------------------------------------------------
# Time limits


def test_a_dripping_peer_is_bounded_by_handshake_timeout_as_a_whole(peers):
    peer = peers(dripping)
    attempt = Attempt(peer.address, handshake_timeout=0.3)
    with pytest.raises(NSQTimeoutError, match=r"timed out after 0\.3s \(handshake_timeout\)"):
        attempt.open()
    assert 0.3 <= attempt.elapsed < 1.5
    assert peer.wire is not None and peer.wire.sent > 3  # bytes kept coming, each in time
    attempt.left_nothing()


def test_a_deadline_sooner_than_handshake_timeout_is_named(peers):
    peer = peers(silent)
    attempt = Attempt(peer.address, handshake_timeout=30.0, dial_timeout=30.0)
    with pytest.raises(NSQTimeoutError) as info:
        attempt.open(time.monotonic() + 0.3, "the test's deadline")
    assert "(the test's deadline)" in str(info.value)
    assert "handshake_timeout" not in str(info.value)
    assert attempt.elapsed < 1.5
    attempt.left_nothing()


def test_a_deadline_sooner_than_dial_timeout_is_named(blackhole):
    attempt = Attempt(blackhole, dial_timeout=30.0)
    with pytest.raises(NSQTimeoutError, match=r"took longer than 0\.\d+s \(the test's deadline\)"):
        attempt.open(time.monotonic() + 0.3, "the test's deadline")
    assert attempt.elapsed < 1.5
    attempt.left_nothing()


# ------------------------------------------------------------------------------------------------
# Aborts


def test_aborted_before_the_dial_raises_connection_closed(peers):
    peer = peers(lambda wire: None)
    attempt = Attempt(peer.address)
    attempt.aborted.set()
    with pytest.raises(ConnectionClosedError, match="aborted"):
        attempt.open()
    attempt.left_nothing()


def test_aborted_during_a_handshake_that_then_succeeds_raises_connection_closed(peers):
    attempt: Attempt

    def script(wire: Wire) -> None:
        wire.expect_identify()
        attempt.aborted.set()  # as Connection.close() on another thread, before nsqd answers
        wire.send(protocol.OK)
        wire.hold()

    peer = peers(script)
    attempt = Attempt(peer.address)
    with pytest.raises(ConnectionClosedError, match="aborted"):
        attempt.open()
    attempt.left_nothing()


def test_shutting_the_kept_socket_ends_a_handshake_in_progress(peers):
    attempt: Attempt

    def script(wire: Wire) -> None:
        wire.expect_identify()
        attempt.aborted.set()  # what Connection.close() does to a connect in progress
        attempt.kept[0].shutdown(socket.SHUT_RDWR)
        wire.hold()

    peer = peers(script)
    attempt = Attempt(peer.address, handshake_timeout=30.0)
    with pytest.raises(ConnectionClosedError):
        attempt.open()
    assert attempt.elapsed < 1.5  # long before handshake_timeout
    attempt.left_nothing()
