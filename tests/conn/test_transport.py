"""Tests of nsqclient.conn._transport.

The client side is our Transport; the server side is built in each test from ssl, snappy and
zlib directly, so the two ends do not share code.  Sockets come from socket.socketpair() (and
loopback TCP where it matters).  A test against a real nsqd runs only when NSQ_BIN_DIR is set.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import selectors
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import snappy

from nsqclient import protocol
from nsqclient.conn._transport import Transport, make_tls_context
from nsqclient.errors import ProtocolError

CERTS = Path(__file__).parent.parent / "certs"
CERT = str(CERTS / "cert.pem")
KEY = str(CERTS / "key.pem")

#: Upper bound for any single blocking step; only reached when something is broken.
TIMEOUT = 20.0


# ------------------------------------------------------------------------------------------------
# Helpers


class Worker(threading.Thread):
    """Run ``fn(*args)`` on a named daemon thread; ``finish()`` joins and re-raises its error."""

    def __init__(self, name: str, fn: Callable[..., Any], *args: Any):
        super().__init__(name=name, daemon=True)
        self._fn = fn
        self._args = args
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self._fn(*self._args)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            self.error = exc

    def finish(self, timeout: float = TIMEOUT) -> Any:
        self.join(timeout)
        assert not self.is_alive(), f"thread {self.name} still running after {timeout} s"
        if self.error is not None:
            raise self.error
        return self.result


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """(client socket, server socket), connected, with a safety timeout on both."""
    a, b = socket.socketpair()
    a.settimeout(TIMEOUT)
    b.settimeout(TIMEOUT)
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def tcp_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """Like ``pair`` but a real loopback TCP connection."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(TIMEOUT)
        a = socket.create_connection(listener.getsockname(), timeout=TIMEOUT)
        b, _ = listener.accept()
    b.settimeout(TIMEOUT)
    yield a, b
    a.close()
    b.close()


def client_transport(sock: socket.socket) -> Transport:
    transport = Transport(sock)
    transport.settimeout(TIMEOUT)
    return transport


def recv_exactly(transport: Transport, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = transport.recv(n - len(buf))
        assert chunk, f"EOF after {len(buf)} of {n} bytes"
        assert len(chunk) <= n - len(buf)
        buf += chunk
    return bytes(buf)


def read_frame_greedy(transport: Transport) -> protocol.Frame:
    """Read one frame with big reads, as a handshake might, and push back what follows it."""
    buf = b""
    while True:
        if len(buf) >= 4:
            size = struct.unpack(">I", buf[:4])[0]
            if len(buf) >= 4 + size:
                transport.push_back(buf[4 + size :])
                frame_type = struct.unpack(">i", buf[4:8])[0]
                return protocol.Frame(frame_type, buf[8 : 4 + size])
        chunk = transport.recv(65536)
        assert chunk, "EOF inside a frame"
        buf += chunk


def read_frame_exact(transport: Transport) -> protocol.Frame:
    """Read one frame with exact reads: never asks for a byte beyond the frame."""
    size = struct.unpack(">I", recv_exactly(transport, 4))[0]
    data = recv_exactly(transport, size)
    return protocol.Frame(struct.unpack(">i", data[:4])[0], data[4:])


def server_context() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(CERT, KEY)
    return ctx


def client_context(**kwargs: Any) -> ssl.SSLContext:
    kwargs.setdefault("ca_file", CERT)
    return make_tls_context(**kwargs)


class Peer:
    """The server's end of the stream, built from ssl/snappy/zlib directly (not Transport)."""

    def __init__(self, sock: socket.socket):
        self.sock: socket.socket = sock
        self.compress: Callable[[bytes], bytes] | None = None
        self.decompress: Callable[[bytes], bytes] | None = None
        self.buf = bytearray()  # decoded bytes not yet consumed
        self.raw_in = 0

    def start_tls(self, context: ssl.SSLContext | None = None) -> None:
        self.sock = (context or server_context()).wrap_socket(self.sock, server_side=True)

    def start_snappy(self) -> None:
        self.compress = snappy.StreamCompressor().add_chunk
        self.decompress = snappy.StreamDecompressor().decompress

    def start_deflate(self, level: int = 6) -> None:
        comp = zlib.compressobj(level, zlib.DEFLATED, -15)
        self.compress = lambda data: comp.compress(data) + comp.flush(zlib.Z_SYNC_FLUSH)
        self.decompress = zlib.decompressobj(-15).decompress

    def encode(self, data: bytes) -> bytes:
        return self.compress(data) if self.compress else data

    def send(self, data: bytes, piece: int | None = None) -> None:
        wire = self.encode(data)
        if piece is None:
            self.sock.sendall(wire)
            return
        for i in range(0, len(wire), piece):
            self.sock.sendall(wire[i : i + piece])

    def send_random_pieces(self, data: bytes, rng: random.Random) -> None:
        wire = self.encode(data)
        i = 0
        while i < len(wire):
            n = rng.choice((1, 2, 3, 7, 100, 4096, 70000))
            self.sock.sendall(wire[i : i + n])
            i += n

    def recv_exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            raw = self.sock.recv(65536)
            if not raw:
                raise EOFError(f"server got EOF with {len(self.buf)} of {n} bytes")
            self.raw_in += len(raw)
            self.buf += self.decompress(raw) if self.decompress else raw
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data


class MemoryTLSServer:
    """Server-side TLS over MemoryBIOs on a blocking socket, to control ciphertext exactly."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.obj = server_context().wrap_bio(self.incoming, self.outgoing, server_side=True)

    def handshake(self) -> None:
        while True:
            try:
                self.obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                pass
            out = self.outgoing.read()
            if out:
                self.sock.sendall(out)
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("client went away during the handshake")
            self.incoming.write(data)
        out = self.outgoing.read()
        if out:
            self.sock.sendall(out)

    def encrypt(self, data: bytes) -> bytes:
        self.obj.write(data)
        return self.outgoing.read()


# Snappy framing, written independently of python-snappy from the format description:
# chunk = [1B type][3B little-endian length][payload]; data chunks carry a masked CRC-32C of
# the uncompressed data in their first 4 payload bytes.

SNAPPY_STREAM_ID = b"\xff\x06\x00\x00sNaPpY"


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for byte in data:
        c = _CRC32C[(c ^ byte) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    c = crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def snappy_chunk(chunk_type: int, payload: bytes) -> bytes:
    return bytes([chunk_type]) + len(payload).to_bytes(3, "little") + payload


def snappy_uncompressed(data: bytes) -> bytes:
    return snappy_chunk(0x01, struct.pack("<I", masked_crc(data)) + data)


def snappy_compressed(data: bytes) -> bytes:
    raw = snappy.compress(data)
    return snappy_chunk(0x00, struct.pack("<I", masked_crc(data)) + raw)


def parse_snappy_stream(wire: bytes, check_crc: bool = True) -> bytes:
    """Decode a framed snappy stream strictly (stream id first, CRCs, chunk size limits)."""
    assert wire.startswith(SNAPPY_STREAM_ID), "stream must start with the stream identifier"
    out = bytearray()
    pos = 0
    while pos < len(wire):
        assert len(wire) - pos >= 4, "truncated chunk header"
        chunk_type = wire[pos]
        length = int.from_bytes(wire[pos + 1 : pos + 4], "little")
        payload = wire[pos + 4 : pos + 4 + length]
        assert len(payload) == length, "truncated chunk"
        pos += 4 + length
        if chunk_type == 0xFF:
            assert payload == b"sNaPpY"
        elif chunk_type in (0x00, 0x01):
            crc = struct.unpack("<I", payload[:4])[0]
            data = payload[4:]
            if chunk_type == 0x00:
                data = snappy.uncompress(data)
            assert len(data) <= 65536, "a chunk holds at most 64 KiB of data"
            if check_crc:
                assert crc == masked_crc(data), "bad chunk CRC"
            out += data
        else:
            assert 0x80 <= chunk_type <= 0xFE, f"reserved unskippable chunk type {chunk_type}"
    return bytes(out)


class OneByteSocket:
    """A socket stand-in whose reads return at most one byte: byte-by-byte decoding."""

    def __init__(self, sock: socket.socket):
        self._sock = sock

    def recv(self, n: int) -> bytes:
        return self._sock.recv(1)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def wait_until_in_recv(thread: threading.Thread, timeout: float = 5.0) -> None:
    """Wait until ``thread`` runs Transport's lowest read (best effort: the tests that use this
    are correct whether or not the thread got there first)."""
    names = {"_lower_recv", "_tls_recv"}
    deadline = time.monotonic() + timeout
    step = threading.Event()
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(thread.ident or -1)
        if frame is not None and frame.f_code.co_name in names:
            return
        step.wait(0.002)


# ------------------------------------------------------------------------------------------------
# Plain TCP


def test_plain_echo_and_counters(pair):
    a, b = pair
    t = client_transport(a)
    assert t.tls_version is None and t.compression is None
    t.sendall(b"hello, nsq")
    assert b.recv(100) == b"hello, nsq"
    b.sendall(b"and back")
    assert recv_exactly(t, 8) == b"and back"
    assert (t.bytes_out, t.bytes_in) == (10, 8)


def test_recv_never_returns_more_than_asked(pair):
    a, b = pair
    t = client_transport(a)
    b.sendall(b"0123456789")
    assert t.recv(4) == b"0123"
    assert t.recv(100) == b"456789"
    with pytest.raises(ValueError):
        t.recv(0)


def test_eof_returns_empty_and_stays_empty(pair):
    a, b = pair
    t = client_transport(a)
    b.sendall(b"last")
    b.close()
    assert recv_exactly(t, 4) == b"last"
    assert t.recv() == b""
    assert t.recv() == b""


def test_push_back_is_returned_first(pair):
    a, b = pair
    t = client_transport(a)
    b.sendall(b"world")
    t.push_back(b"")
    t.push_back(b"lo, ")
    t.push_back(b"hel")
    assert t.recv(2) == b"he"
    t.push_back(b"-")  # goes in front of what is still pushed back
    assert t.recv(100) == b"-llo, "
    assert recv_exactly(t, 5) == b"world"


@pytest.mark.parametrize("sockets", ["pair", "tcp_pair"])
def test_shutdown_unblocks_a_blocked_recv(sockets, request):
    a, b = request.getfixturevalue(sockets)
    t = client_transport(a)
    reader = Worker("test-reader", t.recv)
    reader.start()
    wait_until_in_recv(reader)
    t.shutdown()
    assert reader.finish() == b""
    t.shutdown()  # idempotent
    t.close()
    t.close()


def test_read_timeout(pair):
    a, b = pair
    t = client_transport(a)
    t.settimeout(0.05)
    with pytest.raises(TimeoutError):
        t.recv()
    t.settimeout(TIMEOUT)
    b.sendall(b"x")
    assert t.recv() == b"x"


# ------------------------------------------------------------------------------------------------
# python-snappy's framed decoder, pinned down (Transport relies on this behaviour)


def go_like_snappy_stream(messages: list[bytes]) -> bytes:
    """A stream as Go's snappy writer might produce it, plus the chunk types a reader must skip:
    uncompressed chunks, compressed chunks, padding, skippable chunks, a repeated stream id."""
    parts = [SNAPPY_STREAM_ID]
    for i, msg in enumerate(messages):
        parts.append(snappy_uncompressed(msg) if i % 2 else snappy_compressed(msg))
        if i % 3 == 0:
            parts.append(snappy_chunk(0xFE, b"\x00" * 7))  # padding
        if i % 4 == 1:
            parts.append(snappy_chunk(0x80, b"skip me"))  # reserved skippable
        if i == 2:
            parts.append(SNAPPY_STREAM_ID)
    return b"".join(parts)


MESSAGES = [b"OK", b"x" * 1000, bytes(range(256)) * 3, b"", b"tail" * 17]


def test_python_snappy_decoder_byte_by_byte():
    wire = go_like_snappy_stream(MESSAGES)
    assert parse_snappy_stream(wire) == b"".join(MESSAGES)
    d = snappy.StreamDecompressor()
    out = bytearray()
    for i in range(len(wire)):
        out += d.decompress(wire[i : i + 1])
    assert out == b"".join(MESSAGES)


def test_python_snappy_decoder_every_split_point():
    wire = go_like_snappy_stream(MESSAGES)
    for cut in range(len(wire) + 1):
        d = snappy.StreamDecompressor()
        assert d.decompress(wire[:cut]) + d.decompress(wire[cut:]) == b"".join(MESSAGES), cut


def test_python_snappy_encoder_output_is_valid_framing():
    c = snappy.StreamCompressor()
    rng = random.Random(1)
    pieces = [rng.randbytes(n) for n in (1, 100, 70000)] + [b"a" * 200000]
    wire = b"".join(c.add_chunk(p) for p in pieces)
    assert wire.count(SNAPPY_STREAM_ID) >= 1
    assert parse_snappy_stream(wire) == b"".join(pieces)


# ------------------------------------------------------------------------------------------------
# Snappy


def random_messages(rng: random.Random, count: int) -> list[bytes]:
    sizes = [rng.choice((0, 1, 5, 50, 1000, 70000, 200000)) for _ in range(count)]
    return [
        rng.randbytes(n) if i % 2 else (b"nsq %d " % i) * (n // 6 + 1) for i, n in enumerate(sizes)
    ]


def test_snappy_both_directions_random_chunking(pair):
    a, b = pair
    rng = random.Random(7)
    t = client_transport(a)
    t.upgrade_snappy()
    assert t.compression == "snappy"
    peer = Peer(b)
    peer.start_snappy()

    # client -> server: each sendall is decodable on its own (no buffering in the compressor)
    for msg in random_messages(rng, 12):
        t.sendall(msg)
        assert peer.recv_exactly(len(msg)) == msg
        assert peer.raw_in == t.bytes_out

    # server -> client, random piece sizes
    payload = b"".join(random_messages(rng, 12))
    server = Worker("test-server", peer.send_random_pieces, payload, rng)
    server.start()
    assert recv_exactly(t, len(payload)) == payload
    server.finish()

    # server -> client, one byte per write
    small = b"".join(random_messages(random.Random(3), 6))[:3000] + b"end"
    server = Worker("test-server", peer.send, small, 1)
    server.start()
    assert recv_exactly(t, len(small)) == small
    server.finish()


def test_snappy_client_stream_passes_strict_parser(pair):
    a, b = pair
    t = client_transport(a)
    t.upgrade_snappy()
    msgs = [b"PUB t\n", os.urandom(70000), b"z" * 150000, b"", b"NOP\n"]

    def read_to_eof() -> bytes:
        wire = bytearray()
        while chunk := b.recv(65536):
            wire += chunk
        return bytes(wire)

    server = Worker("test-server", read_to_eof)
    server.start()
    for m in msgs:
        t.sendall(m)
    t.shutdown()
    wire = server.finish()
    assert len(wire) == t.bytes_out
    assert parse_snappy_stream(bytes(wire)) == b"".join(msgs)


def test_snappy_go_like_stream_read_one_byte_at_a_time(pair):
    a, b = pair
    t = client_transport(OneByteSocket(a))  # type: ignore[arg-type]
    t.upgrade_snappy()
    b.sendall(go_like_snappy_stream(MESSAGES))
    expected = b"".join(MESSAGES)
    assert recv_exactly(t, len(expected)) == expected


def test_snappy_big_chunk_split_over_max_bytes(pair):
    a, b = pair
    t = client_transport(a)
    t.upgrade_snappy()
    data = b"abc" * 40000  # 120000 bytes, two chunks
    b.sendall(snappy.StreamCompressor().add_chunk(data))
    got = [t.recv(1000) for _ in range(5)]
    assert all(len(g) == 1000 for g in got)
    assert b"".join(got) + recv_exactly(t, len(data) - 5000) == data


def test_snappy_corrupt_stream_raises_protocol_error(pair):
    a, b = pair
    t = client_transport(a)
    t.upgrade_snappy()
    b.sendall(SNAPPY_STREAM_ID + snappy_chunk(0x01, b"\x00\x00\x00\x00OK"))  # wrong CRC
    with pytest.raises(ProtocolError, match="snappy"):
        t.recv()


def test_snappy_eof(pair):
    a, b = pair
    t = client_transport(a)
    t.upgrade_snappy()
    b.sendall(snappy.StreamCompressor().add_chunk(b"bye"))
    b.close()
    assert recv_exactly(t, 3) == b"bye"
    assert t.recv() == b""


# ------------------------------------------------------------------------------------------------
# Deflate


@pytest.mark.parametrize("level", [1, 6, 9])
def test_deflate_both_directions(pair, level):
    a, b = pair
    rng = random.Random(level)
    t = client_transport(a)
    t.upgrade_deflate(level)
    assert t.compression == "deflate"
    peer = Peer(b)
    peer.start_deflate(level)

    # every sendall ends with a sync flush: the server decodes it without waiting for more
    for msg in random_messages(rng, 10):
        t.sendall(msg)
        assert peer.recv_exactly(len(msg)) == msg
    assert peer.raw_in == t.bytes_out

    payload = b"".join(random_messages(rng, 10))
    server = Worker("test-server", peer.send_random_pieces, payload, rng)
    server.start()
    assert recv_exactly(t, len(payload)) == payload
    server.finish()

    small = b"deflate one byte at a time " * 40
    server = Worker("test-server", peer.send, small, 1)
    server.start()
    assert recv_exactly(t, len(small)) == small
    server.finish()


def test_deflate_read_one_byte_at_a_time(pair):
    a, b = pair
    t = client_transport(OneByteSocket(a))  # type: ignore[arg-type]
    t.upgrade_deflate(6)
    peer = Peer(b)
    peer.start_deflate()
    data = b"".join(random_messages(random.Random(5), 4))[:5000]
    peer.send(data)
    assert recv_exactly(t, len(data)) == data


def test_deflate_corrupt_stream_raises_protocol_error(pair):
    a, b = pair
    t = client_transport(a)
    t.upgrade_deflate(6)
    b.sendall(b"\xff" * 16)  # block type 3 is invalid
    with pytest.raises(ProtocolError, match="deflate"):
        t.recv()


def test_upgrade_errors(pair):
    a, _ = pair
    t = client_transport(a)
    with pytest.raises(ValueError):
        t.upgrade_deflate(10)
    t.upgrade_snappy()
    with pytest.raises(RuntimeError):
        t.upgrade_deflate(6)
    with pytest.raises(RuntimeError):
        t.upgrade_snappy()
    with pytest.raises(RuntimeError, match="before compression"):
        t.upgrade_tls(client_context(), "localhost", TIMEOUT)


# ------------------------------------------------------------------------------------------------
# Upgrades with bytes already read (the server sends the post-upgrade OK right away)


@pytest.mark.parametrize("mode", ["snappy", "deflate"])
def test_greedy_handshake_read_with_push_back(pair, mode):
    a, b = pair
    t = client_transport(a)
    peer = Peer(b)
    identify = protocol.encode_frame(protocol.FRAME_TYPE_RESPONSE, b'{"max_rdy_count":2500}')
    ok = protocol.encode_frame(protocol.FRAME_TYPE_RESPONSE, protocol.OK)
    getattr(peer, f"start_{mode}")()
    b.sendall(identify + peer.encode(ok))  # in one write: one recv() returns both
    first = t.recv(65536)
    assert len(first) > len(identify), "the test needs the compressed bytes in the same read"
    assert first.startswith(identify)
    t.push_back(first[len(identify) :])
    getattr(t, f"upgrade_{mode}")(*([6] if mode == "deflate" else []))
    assert read_frame_greedy(t) == (protocol.FRAME_TYPE_RESPONSE, b"OK")
    peer.send(b"more")
    assert recv_exactly(t, 4) == b"more"
    t.sendall(b"NOP\n")
    assert peer.recv_exactly(4) == b"NOP\n"


def test_exact_handshake_reads_need_no_push_back(pair):
    a, b = pair
    t = client_transport(a)
    peer = Peer(b)
    identify = protocol.encode_frame(protocol.FRAME_TYPE_RESPONSE, b'{"snappy":true}')
    ok = protocol.encode_frame(protocol.FRAME_TYPE_RESPONSE, protocol.OK)
    peer.start_snappy()
    b.sendall(identify + peer.encode(ok))
    assert read_frame_exact(t) == (protocol.FRAME_TYPE_RESPONSE, b'{"snappy":true}')
    t.upgrade_snappy()
    assert read_frame_exact(t) == (protocol.FRAME_TYPE_RESPONSE, b"OK")


def test_push_back_after_compression_is_plain_again(pair):
    a, b = pair
    t = client_transport(a)
    t.upgrade_snappy()
    b.sendall(snappy.StreamCompressor().add_chunk(b"abcdef"))
    got = recv_exactly(t, 6)
    t.push_back(got[3:])
    assert t.recv() == b"def"


# ------------------------------------------------------------------------------------------------
# TLS


def tls_server(sock: socket.socket, script: Callable[[Peer], Any]) -> Worker:
    def run() -> Any:
        peer = Peer(sock)
        peer.start_tls()
        return script(peer)

    worker = Worker("test-tls-server", run)
    worker.start()
    return worker


@pytest.mark.parametrize("hostname", ["localhost", "127.0.0.1"])
def test_tls_verified_echo(tcp_pair, hostname):
    a, b = tcp_pair

    def script(peer: Peer) -> bytes:
        data = peer.recv_exactly(5)
        peer.send(data.upper())
        return data

    server = tls_server(b, script)
    t = client_transport(a)
    t.upgrade_tls(client_context(), hostname, TIMEOUT)
    assert t.tls_version in ("TLSv1.2", "TLSv1.3")
    assert a.gettimeout() == TIMEOUT  # the handshake put the read timeout back
    t.sendall(b"hello")
    assert recv_exactly(t, 5) == b"HELLO"
    assert server.finish() == b"hello"
    assert t.bytes_out > 5 and t.bytes_in > 5


def test_tls_without_verification(pair):
    a, b = pair
    server = tls_server(b, lambda peer: peer.send(b"ok"))
    t = client_transport(a)
    t.upgrade_tls(client_context(ca_file=None, verify=False), None, TIMEOUT)
    assert recv_exactly(t, 2) == b"ok"
    server.finish()


def _expect_server_failure(peer_fn: Callable[[], Any]) -> Any:
    try:
        peer_fn()
    except (ssl.SSLError, OSError, EOFError) as exc:
        return exc
    return None


def test_tls_unknown_ca_fails_with_clear_message(pair):
    a, b = pair
    server = Worker("test-tls-server", _expect_server_failure, lambda: Peer(b).start_tls())
    server.start()
    t = client_transport(a)
    # no ca_file: the system CAs, which did not sign our self-signed test certificate
    with pytest.raises(ssl.SSLCertVerificationError) as info:
        t.upgrade_tls(client_context(ca_file=None), "localhost", TIMEOUT)
    message = str(info.value)
    assert "verification failed for localhost" in message
    # issue 8: it named "ca_file" (the option is tls_ca_file) and not how to skip verification
    assert "as tls_ca_file" in message and "tls_verify=False to skip verification" in message
    assert info.value.verify_code != 0
    assert isinstance(server.finish(), ssl.SSLError)  # the server got our alert
    assert t.tls_version is None


def test_tls_verification_error_from_the_broker_names_the_options(nsq_cluster_factory):
    # The same message through a whole Producer against the broker's TLS nsqd: what a user
    # who forgot tls_ca_file reads.
    from nsqclient import Producer
    from nsqclient.errors import ConnectionClosedError

    cluster = nsq_cluster_factory(lookupd=False, tls_cert=CERT, tls_key=KEY)
    with Producer(cluster.nsqd.tcp_address, tls_v1=True) as producer:
        with pytest.raises(ConnectionClosedError) as info:
            producer.pub("t", b"x", timeout=10)
    message = str(info.value)
    assert "TLS certificate verification failed for 127.0.0.1" in message
    assert "as tls_ca_file" in message and "tls_verify=False to skip verification" in message
    assert " ca_file" not in message.replace("as tls_ca_file", "")


def test_tls_hostname_mismatch(pair):
    a, b = pair
    server = Worker("test-tls-server", _expect_server_failure, lambda: Peer(b).start_tls())
    server.start()
    t = client_transport(a)
    with pytest.raises(ssl.SSLCertVerificationError, match="nsq.example.com"):
        t.upgrade_tls(client_context(), "nsq.example.com", TIMEOUT)
    server.finish()


def test_tls_needs_hostname_when_checking():
    a, b = socket.socketpair()
    with a, b:
        with pytest.raises(ValueError, match="server_hostname"):
            Transport(a).upgrade_tls(client_context(), None, TIMEOUT)


def test_tls_handshake_timeout(pair):
    a, _ = pair  # nobody answers
    t = client_transport(a)
    with pytest.raises(TimeoutError, match="TLS handshake"):
        t.upgrade_tls(client_context(), "localhost", 0.1)
    assert a.gettimeout() == TIMEOUT


def test_tls_server_closes_during_handshake(pair):
    a, b = pair
    b.close()
    t = client_transport(a)
    with pytest.raises(ConnectionError):
        t.upgrade_tls(client_context(), "localhost", TIMEOUT)


def test_push_back_before_tls_is_read_as_ciphertext(pair):
    a, _ = pair
    t = client_transport(a)
    t.push_back(b"\x15\x03\x03\x00\x02\x02\x28")  # a TLS record: fatal handshake_failure alert
    with pytest.raises(ssl.SSLError, match="(?i)handshake failure"):
        t.upgrade_tls(client_context(), "localhost", TIMEOUT)


def test_make_tls_context_options():
    ctx = make_tls_context(ca_file=CERT)
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    ctx = make_tls_context(
        verify=False, cert_file=CERT, key_file=KEY, min_version=ssl.TLSVersion.TLSv1_3
    )
    assert ctx.verify_mode == ssl.CERT_NONE and not ctx.check_hostname
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_3
    with pytest.raises(ValueError):
        make_tls_context(key_file=KEY)


@pytest.mark.parametrize("mode", ["snappy", "deflate"])
def test_tls_then_compression(pair, mode):
    """TLS, its OK frame, then compression whose OK frame arrives in the same TLS record."""
    a, b = pair
    ok = protocol.encode_frame(protocol.FRAME_TYPE_RESPONSE, protocol.OK)
    rng = random.Random(11)
    payload = b"".join(random_messages(rng, 8))
    upstream = [b"PUB topic\n", rng.randbytes(100000), b"x" * 3000]

    def script(peer: Peer) -> list[bytes]:
        plain_ok = ok
        getattr(peer, f"start_{mode}")()
        peer.sock.sendall(plain_ok + peer.encode(ok))  # one write, one TLS record
        got = [peer.recv_exactly(len(m)) for m in upstream]
        peer.send_random_pieces(payload, rng)
        return got

    server = tls_server(b, script)
    t = client_transport(a)
    t.upgrade_tls(client_context(), "localhost", TIMEOUT)
    assert read_frame_greedy(t) == (protocol.FRAME_TYPE_RESPONSE, b"OK")
    if mode == "snappy":
        t.upgrade_snappy()
    else:
        t.upgrade_deflate(6)
    assert read_frame_greedy(t) == (protocol.FRAME_TYPE_RESPONSE, b"OK")
    for m in upstream:
        t.sendall(m)
    assert recv_exactly(t, len(payload)) == payload
    assert server.finish() == upstream
    assert t.tls_version is not None and t.compression == mode


def test_tls_clean_close_and_ragged_close(pair):
    a, b = pair

    def script(peer: Peer) -> None:
        peer.send(b"bye")
        try:
            peer.sock.unwrap()  # sends close_notify, then waits for ours (which never comes)
        except (OSError, ValueError):
            pass

    server = tls_server(b, script)
    t = client_transport(a)
    t.upgrade_tls(client_context(), "localhost", TIMEOUT)
    assert recv_exactly(t, 3) == b"bye"
    assert t.recv() == b""
    assert t.recv() == b""
    t.shutdown()
    server.finish()

    c, d = socket.socketpair()
    with c, d:
        c.settimeout(TIMEOUT)
        d.settimeout(TIMEOUT)
        server = tls_server(d, lambda peer: (peer.send(b"x"), peer.sock.close()))
        t = client_transport(c)
        t.upgrade_tls(client_context(), "localhost", TIMEOUT)
        server.finish()
        assert t.recv() == b"x"
        assert t.recv() == b""  # TCP closed without close_notify: still EOF


def test_split_timeouts_read_times_out_and_loses_nothing(pair):
    a, b = pair
    t = Transport(a)
    t.set_timeouts(read=0.05, write=TIMEOUT)
    with pytest.raises(TimeoutError):
        t.recv()
    b.sendall(b"after the timeout")
    assert recv_exactly(t, 17) == b"after the timeout"
    t.sendall(b"writes still work")
    assert b.recv(100) == b"writes still work"


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_split_timeouts_write_to_a_peer_that_never_reads(pair, tls):
    """A peer that stops reading fills the socket buffers; the write gives up after the write
    timeout, although the read timeout is far longer, and reads keep their own timeout."""
    a, b = pair
    t = Transport(a)
    if tls:
        server = MemoryTLSServer(b)
        worker = Worker("test-tls-server", server.handshake)
        worker.start()
        t.settimeout(TIMEOUT)
        t.upgrade_tls(client_context(), "localhost", TIMEOUT)
        worker.finish()
    t.set_timeouts(read=TIMEOUT * 10, write=0.05)
    with pytest.raises(TimeoutError, match="did not complete within 0.05 s"):
        t.sendall(b"x" * (64 * 1024 * 1024))


def test_split_timeouts_must_be_positive(pair):
    t = Transport(pair[0])
    with pytest.raises(ValueError, match="positive"):
        t.set_timeouts(read=0, write=1.0)
    with pytest.raises(ValueError, match="positive"):
        t.set_timeouts(read=1.0, write=-1)


def test_tls_timeout_inside_a_record_loses_nothing(pair):
    a, b = pair
    server = MemoryTLSServer(b)
    worker = Worker("test-tls-server", server.handshake)
    worker.start()
    t = client_transport(a)
    t.upgrade_tls(client_context(), "localhost", TIMEOUT)
    worker.finish()
    record = server.encrypt(b"split record")
    b.sendall(record[:10])
    t.settimeout(0.05)
    with pytest.raises(TimeoutError):
        t.recv()
    t.settimeout(TIMEOUT)
    b.sendall(record[10:])
    assert recv_exactly(t, 12) == b"split record"


def test_tls_shutdown_unblocks_reader(tcp_pair):
    a, b = tcp_pair

    def script(peer: Peer) -> None:
        peer.send(b"x")
        peer.recv_exactly(1)

    server = tls_server(b, script)
    t = client_transport(a)
    t.upgrade_tls(client_context(), "localhost", TIMEOUT)
    assert t.recv() == b"x"  # everything the server sent so far is read
    reader = Worker("test-reader", t.recv)
    reader.start()
    wait_until_in_recv(reader)
    t.shutdown()
    assert reader.finish() == b""
    with pytest.raises(EOFError):
        server.finish()
    t.close()


def test_recv_after_shutdown_is_eof_even_if_data_arrives(tcp_pair):
    """Linux resets a connection that receives data after shutdown(); recv() still says EOF."""
    a, b = tcp_pair
    t = client_transport(a)
    t.shutdown()
    with contextlib.suppress(OSError):
        b.sendall(b"late data")
    assert t.recv() == b""


@pytest.mark.skipif(not ssl.HAS_TLSv1_3, reason="needs TLS 1.3")
@pytest.mark.parametrize("with_callback", [True, False])
def test_tls_output_made_by_a_read_is_flushed_by_the_writer(pair, with_callback):
    """A TLS 1.3 post-handshake certificate request makes the *reader* produce TLS bytes; they
    must reach the server through the writer (callback + flush(), or the next sendall)."""
    a, b = pair
    sctx = server_context()
    sctx.load_verify_locations(CERT)
    sctx.verify_mode = ssl.CERT_OPTIONAL
    sctx.post_handshake_auth = True
    got_ping = threading.Event()

    def script(peer: Peer) -> Any:
        assert peer.sock.getpeercert() is None
        peer.sock.verify_client_post_handshake()
        peer.send(b"ping")
        data = peer.recv_exactly(4)
        return data, peer.sock.getpeercert()["subject"]

    def run_server() -> Any:
        peer = Peer(b)
        peer.start_tls(sctx)
        return script(peer)

    server = Worker("test-tls-server", run_server)
    server.start()
    cctx = client_context(cert_file=CERT, key_file=KEY, min_version=ssl.TLSVersion.TLSv1_3)
    cctx.post_handshake_auth = True
    t = client_transport(a)
    t.upgrade_tls(cctx, "localhost", TIMEOUT)
    wakeups: list[str] = []
    if with_callback:
        t.set_output_callback(
            lambda: (wakeups.append(threading.current_thread().name), got_ping.set())
        )
    reader = Worker("test-reader", recv_exactly, t, 4)
    reader.start()
    assert reader.finish() == b"ping"
    assert t.pending_output > 0  # the reader did not write the socket itself
    if with_callback:
        assert got_ping.wait(TIMEOUT)
        assert set(wakeups) == {"test-reader"}
        before = t.bytes_out
        t.flush()
        assert t.bytes_out > before and t.pending_output == 0
    t.sendall(b"pong")  # without the callback, sendall sends the pending output first
    data, subject = server.finish()
    assert data == b"pong"
    assert subject == ((("commonName", "localhost"),),)


def _tls_pump_server(
    sock: socket.socket, send_data: bytes, expect_len: int, deadline: float
) -> tuple[str, int]:
    """One-thread, non-blocking TLS server: sends ``send_data`` while receiving ``expect_len``
    bytes.  Returns (sha256 of what it received, byte count)."""
    server = MemoryTLSServer(sock)
    server.handshake()
    obj, incoming, outgoing = server.obj, server.incoming, server.outgoing
    sock.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    digest = hashlib.sha256()
    received = 0
    view = memoryview(send_data)
    sent = 0
    wire = bytearray()
    reading = True
    try:
        while True:
            while True:
                try:
                    chunk = obj.read(65536)
                except ssl.SSLWantReadError:
                    break
                if not chunk:
                    raise EOFError("client closed TLS early")
                digest.update(chunk)
                received += len(chunk)
            while sent < len(send_data) and len(wire) < 512 * 1024:
                sent += obj.write(view[sent : sent + 65536])
                wire += outgoing.read()
            wire += outgoing.read()
            if received >= expect_len and sent == len(send_data) and not wire:
                return digest.hexdigest(), received
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"pump server: got {received}, sent {sent}")
            events = (selectors.EVENT_READ if reading else 0) | (
                selectors.EVENT_WRITE if wire else 0
            )
            sel.modify(sock, events)
            for _key, ev in sel.select(remaining):
                if ev & selectors.EVENT_READ:
                    try:
                        data = sock.recv(256 * 1024)
                    except BlockingIOError:
                        data = None
                    if data == b"":
                        raise EOFError(f"client closed TCP after {received} bytes")
                    if data:
                        incoming.write(data)
                if ev & selectors.EVENT_WRITE:
                    try:
                        n = sock.send(wire)
                    except BlockingIOError:
                        n = 0
                    del wire[:n]
    finally:
        sel.close()


def test_tls_concurrent_reader_and_writer_20mb_each_way(pair):
    a, b = pair
    size = 20 * 1024 * 1024
    up = random.Random(1).randbytes(size)
    down = random.Random(2).randbytes(size)
    deadline = time.monotonic() + 100
    server = Worker("test-tls-pump", _tls_pump_server, b, down, size, deadline)
    server.start()
    t = client_transport(a)
    t.upgrade_tls(client_context(), "localhost", TIMEOUT)
    wake = threading.Event()
    t.set_output_callback(wake.set)

    def read_all() -> tuple[str, int]:
        digest = hashlib.sha256()
        n = 0
        while n < size:
            chunk = t.recv(65536)
            assert chunk, f"EOF after {n} bytes"
            digest.update(chunk)
            n += len(chunk)
        return digest.hexdigest(), n

    def write_all() -> None:
        rng = random.Random(3)
        view = memoryview(up)
        off = 0
        while off < size:
            if wake.is_set():
                wake.clear()
                t.flush()
            n = rng.choice((1, 17, 1000, 16384, 65536, 300000))
            t.sendall(bytes(view[off : off + n]))
            off += n

    reader = Worker("test-reader", read_all)
    writer = Worker("test-writer", write_all)
    reader.start()
    writer.start()
    writer.finish(120)
    got_digest, got = reader.finish(120)
    server_digest, server_got = server.finish(120)
    assert got == size and got_digest == hashlib.sha256(down).hexdigest()
    assert server_got == size and server_digest == hashlib.sha256(up).hexdigest()
    assert t.bytes_in > size and t.bytes_out > size


# ------------------------------------------------------------------------------------------------
# Against a real nsqd (only with NSQ_BIN_DIR)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def real_nsqd(tmp_path_factory) -> Iterator[int]:
    bin_dir = os.environ.get("NSQ_BIN_DIR")
    nsqd_bin = shutil.which("nsqd", path=bin_dir) if bin_dir else None
    if not nsqd_bin:
        pytest.skip("NSQ_BIN_DIR with an nsqd binary is not set")
    tcp_port, http_port = _free_port(), _free_port()
    data = tmp_path_factory.mktemp("nsqd-data")
    proc = subprocess.Popen(
        [
            nsqd_bin,
            f"--tcp-address=127.0.0.1:{tcp_port}",
            f"--http-address=127.0.0.1:{http_port}",
            "--broadcast-address=127.0.0.1",
            f"--data-path={data}",
            f"--tls-cert={CERT}",
            f"--tls-key={KEY}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    listening = threading.Event()

    def watch() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "TCP: listening on" in line:
                listening.set()

    watcher = threading.Thread(target=watch, name="test-nsqd-log", daemon=True)
    watcher.start()
    try:
        assert listening.wait(TIMEOUT), "nsqd did not start"
        yield tcp_port
    finally:
        proc.terminate()
        try:
            proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(TIMEOUT)
        watcher.join(TIMEOUT)


@pytest.mark.real_only
@pytest.mark.parametrize(
    "tls,compression",
    [(False, "snappy"), (False, "deflate"), (True, None), (True, "snappy"), (True, "deflate")],
)
def test_real_nsqd_upgrades(real_nsqd, tls, compression):
    sock = socket.create_connection(("127.0.0.1", real_nsqd), timeout=TIMEOUT)
    t = Transport(sock)
    t.settimeout(TIMEOUT)
    try:
        t.sendall(protocol.MAGIC_V2)
        t.sendall(
            protocol.identify(
                {
                    "feature_negotiation": True,
                    "tls_v1": tls,
                    "snappy": compression == "snappy",
                    "deflate": compression == "deflate",
                    "deflate_level": 3,
                    "client_id": "transport",
                }
            )
        )
        kind, body = read_frame_greedy(t)
        assert kind == protocol.FRAME_TYPE_RESPONSE, body
        reply = json.loads(body)
        if tls:
            assert reply["tls_v1"]
            t.upgrade_tls(client_context(), "127.0.0.1", TIMEOUT)
            assert read_frame_greedy(t) == (protocol.FRAME_TYPE_RESPONSE, b"OK")
        if compression == "snappy":
            assert reply["snappy"]
            t.upgrade_snappy()
            assert read_frame_greedy(t) == (protocol.FRAME_TYPE_RESPONSE, b"OK")
        elif compression == "deflate":
            assert reply["deflate"]
            t.upgrade_deflate(reply["deflate_level"])
            assert read_frame_greedy(t) == (protocol.FRAME_TYPE_RESPONSE, b"OK")
        topic = f"transport_{int(tls)}_{compression}"
        bodies = [os.urandom(50000), b"small", b"y" * 100000]
        t.sendall(protocol.mpub(topic, bodies))
        assert read_frame_greedy(t) == (protocol.FRAME_TYPE_RESPONSE, b"OK")
        t.sendall(protocol.sub(topic, "ch") + protocol.rdy(10))
        assert read_frame_greedy(t) == (protocol.FRAME_TYPE_RESPONSE, b"OK")
        got = []
        while len(got) < len(bodies):
            kind, data = read_frame_greedy(t)
            if kind == protocol.FRAME_TYPE_MESSAGE:
                msg = protocol.decode_message(data)
                got.append(msg.body)
                t.sendall(protocol.fin(msg.id))
        assert got == bodies
    finally:
        t.shutdown()
        t.close()
