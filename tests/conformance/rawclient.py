"""A deliberately dumb NSQ TCP client for the conformance tests.

It writes exactly the bytes it is told to write and reads frames one at a time, exactly as many
bytes as each frame says, so that a feature upgrade (TLS, snappy, deflate) starts at the right
byte.  Every read takes a deadline.  Assertion helpers raise AssertionError with what arrived.
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import time
import zlib
from typing import Any

import requests
import snappy

from nsqclient import protocol
from nsqclient.protocol import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    HEARTBEAT,
    Frame,
    FrameReader,
)

TIMEOUT = 5.0  # seconds: the default deadline of every read
_FRAME_TYPES = {
    FRAME_TYPE_RESPONSE: "response",
    FRAME_TYPE_ERROR: "error",
    FRAME_TYPE_MESSAGE: "message",
}


class Closed(Exception):
    """The server closed the connection."""


def frame_bytes(frame_type: int, data: bytes) -> bytes:
    """The exact bytes of a frame on the wire."""
    return protocol.encode_frame(frame_type, data)


def describe(frame: Frame) -> str:
    kind = _FRAME_TYPES.get(frame.type, str(frame.type))
    data = frame.data if len(frame.data) < 300 else frame.data[:300] + b"..."
    return f"{kind} frame {data!r}"


def address_of(target: Any) -> tuple[str, int]:
    """(host, port) of a Node (its TCP port), a "host:port" string or a tuple."""
    if isinstance(target, tuple):
        return target
    if isinstance(target, str):
        host, _, port = target.rpartition(":")
        return host, int(port)
    return target.host, target.tcp_port


class RawConn:
    """One TCP connection to nsqd.

    Args:
        target: a Node, ``"host:port"`` or ``(host, port)``.
        magic: send ``"  V2"`` at once (pass False to send something else first).
    """

    def __init__(self, target: Any, magic: bool = True, timeout: float = TIMEOUT):
        self.address = address_of(target)
        self.timeout = timeout
        self.sock: socket.socket = socket.create_connection(self.address, timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._plain = bytearray()  # decoded bytes not yet consumed
        self._decode = None  # bytes -> bytes, after a compression upgrade
        self._encode = None
        self._reader = FrameReader(max_frame_size=64 * 1024 * 1024)
        self.closed = False
        if magic:
            self.send(protocol.MAGIC_V2)

    # --------------------------------------------------------------------- bytes

    def send(self, data: bytes) -> None:
        if self._encode is not None:
            data = self._encode(data)
        self.sock.sendall(data)

    def _fill(self, need: int, deadline: float) -> None:
        while len(self._plain) < need:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"no complete frame within the deadline ({len(self._plain)} of {need} "
                    f"bytes: {bytes(self._plain[:64])!r})"
                )
            self.sock.settimeout(remaining)
            # Before a compression upgrade read exactly what is missing, so that the bytes
            # after an upgrade point are never taken as plain ones.
            size = 65536 if self._decode is not None else need - len(self._plain)
            try:
                chunk = self.sock.recv(size)
            except TimeoutError:
                continue
            except ConnectionResetError as exc:
                self.closed = True
                raise Closed(f"connection reset ({exc})") from exc
            if not chunk:
                self.closed = True
                raise Closed(f"connection closed by the server ({len(self._plain)} bytes pending)")
            if self._decode is not None:
                chunk = self._decode(chunk)
            self._plain += chunk

    def _take(self, count: int, deadline: float) -> bytes:
        self._fill(count, deadline)
        data = bytes(self._plain[:count])
        del self._plain[:count]
        return data

    # --------------------------------------------------------------------- frames

    def read_raw_frame(self, timeout: float | None = None) -> bytes:
        """The next frame's exact bytes (size, type and data)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        header = self._take(4, deadline)
        (size,) = struct.unpack(">I", header)
        return header + self._take(size, deadline)

    def read_frame(self, timeout: float | None = None) -> Frame:
        raw = self.read_raw_frame(timeout)
        frames = self._reader.feed(raw)
        assert len(frames) == 1, frames
        return frames[0]

    def read_frame_skipping_heartbeats(
        self, timeout: float | None = None, answer: bool = True
    ) -> Frame:
        """The next frame that is not a heartbeat (answered with NOP when ``answer``)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            frame = self.read_frame(max(0.0, deadline - time.monotonic()))
            if frame.type == FRAME_TYPE_RESPONSE and frame.data == HEARTBEAT:
                if answer:
                    self.send(protocol.nop())
                continue
            return frame

    def expect_response(self, data: bytes = protocol.OK, timeout: float | None = None) -> None:
        frame = self.read_frame_skipping_heartbeats(timeout)
        assert frame == Frame(FRAME_TYPE_RESPONSE, data), (
            f"expected response {data!r}, got {describe(frame)}"
        )

    def expect_json(self, timeout: float | None = None) -> tuple[dict[str, Any], bytes]:
        frame = self.read_frame_skipping_heartbeats(timeout)
        assert frame.type == FRAME_TYPE_RESPONSE, f"expected a JSON response, got {describe(frame)}"
        return json.loads(frame.data), frame.data

    def expect_error(self, text: str | bytes, timeout: float | None = None) -> bytes:
        """The next frame must be the error frame whose whole body is ``text``."""
        if isinstance(text, str):
            text = text.encode()
        frame = self.read_frame_skipping_heartbeats(timeout)
        assert frame == Frame(FRAME_TYPE_ERROR, text), (
            f"expected error {text!r}, got {describe(frame)}"
        )
        return frame.data

    def expect_message(self, timeout: float | None = None) -> protocol.DecodedMessage:
        frame = self.read_frame_skipping_heartbeats(timeout)
        assert frame.type == FRAME_TYPE_MESSAGE, f"expected a message, got {describe(frame)}"
        return protocol.decode_message(frame.data)

    def expect_messages(self, count: int, timeout: float | None = None) -> list:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        return [self.expect_message(max(0.0, deadline - time.monotonic())) for _ in range(count)]

    def expect_closed(self, timeout: float | None = None) -> None:
        """The server must close the connection (heartbeats before that are tolerated)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            try:
                frame = self.read_frame(max(0.0, deadline - time.monotonic()))
            except Closed:
                return
            except TimeoutError as exc:
                raise AssertionError("the server did not close the connection") from exc
            if frame.type == FRAME_TYPE_RESPONSE and frame.data == HEARTBEAT:
                continue
            raise AssertionError(f"expected the connection to close, got {describe(frame)}")

    def expect_fatal(self, text: str | bytes) -> None:
        """The error ``text``, after which the server closes the connection."""
        self.expect_error(text)
        self.expect_closed()

    def expect_silence(self, seconds: float) -> None:
        """Nothing but heartbeats may arrive for ``seconds`` (a bounded negative check)."""
        deadline = time.monotonic() + seconds
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                frame = self.read_frame_skipping_heartbeats(remaining)
            except TimeoutError:
                return
            raise AssertionError(f"expected nothing, got {describe(frame)}")

    # --------------------------------------------------------------------- commands

    def identify(self, **data: Any) -> None:
        """IDENTIFY without feature negotiation; expects OK."""
        self.send(protocol.identify(data))
        self.expect_response()

    def negotiate(self, **data: Any) -> dict[str, Any]:
        """IDENTIFY with feature_negotiation; performs the TLS / snappy / deflate upgrades the
        reply grants (reading the OK after each) and returns the reply."""
        data.setdefault("feature_negotiation", True)
        self.send(protocol.identify(data))
        reply, _ = self.expect_json()
        self.upgrade(reply)
        return reply

    def upgrade(self, reply: dict[str, Any]) -> None:
        if reply.get("tls_v1"):
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            self.sock.settimeout(self.timeout)
            self.sock = context.wrap_socket(self.sock)
            self.expect_response()
        if reply.get("snappy"):
            decompressor = snappy.StreamDecompressor()
            compressor = snappy.StreamCompressor()
            self._decode = decompressor.decompress
            self._encode = compressor.add_chunk
            self.expect_response()
        if reply.get("deflate"):
            inflater = zlib.decompressobj(-zlib.MAX_WBITS)
            deflater = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
            self._decode = inflater.decompress
            self._encode = lambda b: deflater.compress(b) + deflater.flush(zlib.Z_SYNC_FLUSH)
            self.expect_response()

    def sub(self, topic: str, channel: str, rdy: int | None = None) -> None:
        self.send(protocol.sub(topic, channel))
        self.expect_response()
        if rdy is not None:
            self.send(protocol.rdy(rdy))

    def deliver_one(self, body: bytes) -> protocol.DecodedMessage:
        """Publish ``body`` to topic ``t``, subscribe to its channel ``c`` with RDY 1 and
        return the message delivered."""
        self.pub("t", body)
        self.sub("t", "c", rdy=1)
        return self.expect_message()

    def rdy(self, count: int) -> None:
        self.send(protocol.rdy(count))

    def pub(self, topic: str, body: bytes) -> None:
        self.send(protocol.pub(topic, body))
        self.expect_response()

    def mpub(self, topic: str, bodies: list[bytes]) -> None:
        self.send(protocol.mpub(topic, bodies))
        self.expect_response()

    def dpub(self, topic: str, delay_ms: int, body: bytes) -> None:
        self.send(protocol.dpub(topic, delay_ms, body))
        self.expect_response()

    def fin(self, message_id: bytes) -> None:
        self.send(protocol.fin(message_id))

    def req(self, message_id: bytes, delay_ms: int) -> None:
        self.send(protocol.req(message_id, delay_ms))

    def touch(self, message_id: bytes) -> None:
        self.send(protocol.touch(message_id))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> RawConn:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def assert_refused(conn: RawConn, data: bytes, text: str | bytes) -> None:
    """Send ``data`` on ``conn`` (closed afterwards): nsqd answers the fatal error ``text``
    and closes the connection."""
    with conn:
        conn.send(data)
        conn.expect_fatal(text)


def assert_alive(conn: RawConn, topic: str = "conformance_probe") -> None:
    """Prove the connection still serves commands: a PUB must be answered OK."""
    conn.pub(topic, b"probe")


# ------------------------------------------------------------------------- HTTP helpers


def stats(node: Any, **params: str) -> dict[str, Any]:
    """nsqd ``/stats?format=json`` (plus ``params``) as a dict."""
    resp = requests.get(f"{node.http_url}/stats", params={"format": "json", **params}, timeout=5)
    assert resp.status_code == 200, resp.text
    return resp.json()


def topic_stats(node: Any, topic: str) -> dict[str, Any] | None:
    topics = stats(node, topic=topic)["topics"] or []
    for t in topics:
        if t["topic_name"] == topic:
            return t
    return None


def channel_stats(node: Any, topic: str, channel: str) -> dict[str, Any] | None:
    t = topic_stats(node, topic)
    if t is None:
        return None
    for c in t["channels"]:
        if c["channel_name"] == channel:
            return c
    return None


def post(node: Any, path: str, data: bytes | None = None, **params: str) -> requests.Response:
    return requests.post(f"{node.http_url}{path}", params=params, data=data, timeout=5)


def get(node: Any, path: str, **params: str) -> requests.Response:
    return requests.get(f"{node.http_url}{path}", params=params, timeout=5)


def scanned_channels(cluster: Any, *pairs: tuple[str, str], index: int = 0) -> Any:
    """Create each (topic, channel) on nsqd ``index`` so that its timeout and defer scanner
    watches them from the start; returns that node.

    Real nsqd 1.3 refreshes the list of channels its queue scanner visits only every 5 seconds
    (QueueScanRefreshInterval, not configurable), so on a channel created after start a
    deferred, requeued-with-delay or timed-out message can wait up to 5 s longer than asked.
    Channels that exist when nsqd starts are scanned at once, so on real binaries the node is
    restarted (its metadata keeps the channels).  The embedded NSQ needs no such help.
    """
    node = cluster.nsqds[index]
    for topic, channel in pairs:
        resp = post(node, "/topic/create", topic=topic)
        assert resp.status_code == 200, resp.text
        resp = post(node, "/channel/create", topic=topic, channel=channel)
        assert resp.status_code == 200, resp.text
    if cluster.kind == "real":
        cluster.stop_nsqd(index)
        cluster.start_nsqd(index)
    return cluster.nsqds[index]
