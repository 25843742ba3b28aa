"""Caller-reads mode: a blocking request on an idle plain connection reads its own answer in
the calling thread (one thread hand-off less), while the reader thread keeps everything else:
heartbeats, answers to other threads, a peer going silent or sending garbage."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from nsqclient import Producer, protocol
from nsqclient.config import Config
from nsqclient.conn import _connection as conn_module
from nsqclient.conn._connection import Connection, Waiter
from nsqclient.conn._transport import Transport
from nsqclient.errors import ConnectionClosedError, NSQTimeoutError, ProtocolError
from nsqclient.platforms import HAS_EPOLL
from nsqclient.testing.helpers import message_count, run_together
from nsqclient.testing.waiting import wait_for

#: Seconds: the bound of every wait; reached only when something is broken.
TIMEOUT = 10.0


def frame(data: bytes, frame_type: int = protocol.FRAME_TYPE_RESPONSE) -> bytes:
    return struct.pack(">ll", len(data) + 4, frame_type) + data


@pytest.fixture
def peer() -> Iterator[Any]:
    """``start(behaviour) -> address``: one connection's worth of nsqd that does the handshake
    and then runs ``behaviour(sock, reader)``."""
    made: list[tuple[socket.socket, threading.Thread, threading.Event]] = []

    def start(behaviour: Any) -> str:
        listener = socket.create_server(("127.0.0.1", 0))
        listener.settimeout(TIMEOUT)
        release = threading.Event()

        def serve() -> None:
            sock, _ = listener.accept()
            with sock:
                reader = sock.makefile("rb")
                reader.read(4)
                reader.readline()
                reader.read(struct.unpack(">l", reader.read(4))[0])
                sock.sendall(frame(b"OK"))
                behaviour(sock, reader, release)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        made.append((listener, thread, release))
        return f"127.0.0.1:{listener.getsockname()[1]}"

    yield start
    for listener, thread, release in made:
        release.set()
        thread.join(TIMEOUT)
        listener.close()


def readers_of(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads that read a transport's bytes, in order."""
    names: list[str] = []
    for method in ("recv", "recv_nowait", "recv_within"):
        original = getattr(Transport, method)

        def record(self: Transport, *args: Any, _original: Any = original) -> Any:
            data = _original(self, *args)
            if data:
                names.append(threading.current_thread().name)
            return data

        monkeypatch.setattr(Transport, method, record)
    return names


@pytest.mark.skipif(not HAS_EPOLL, reason="caller-reads mode needs epoll (Linux)")
def test_an_idle_blocking_publish_reads_its_own_answer(nsqd, monkeypatch):
    node = nsqd.nsqd
    with Producer(node.tcp_address) as p:
        p.pub("cr_own", b"connect")
        names = readers_of(monkeypatch)
        for i in range(20):
            p.pub("cr_own", b"%d" % i)
    assert names and all(name == threading.current_thread().name for name in names), names
    assert message_count(node, "cr_own") == 21


def test_without_epoll_the_reader_thread_reads_every_answer(nsqd, monkeypatch):
    """macOS, the BSDs, Windows: a blocking publish waits for the reader thread's answer."""
    monkeypatch.setattr(conn_module, "HAS_EPOLL", False)
    node = nsqd.nsqd
    with Producer(node.tcp_address) as p:
        p.pub("cr_no_epoll", b"connect")
        names = readers_of(monkeypatch)
        for i in range(20):
            p.pub("cr_no_epoll", b"%d" % i)
    assert names and all(name.startswith("nsq-reader-") for name in names), names
    assert message_count(node, "cr_no_epoll") == 21


def test_many_threads_publishing_each_get_their_answer(nsqd):
    node = nsqd.nsqd
    with Producer(node.tcp_address) as p:

        def work(i: int) -> None:
            for j in range(50):
                p.pub("cr_threads", b"%d-%d" % (i, j))

        run_together(work, 8, "cr-pub")
    assert message_count(node, "cr_threads") == 400


def test_caller_reads_is_off_under_tls_and_compression(nsqd):
    conn = Connection(nsqd.nsqd.tcp_address, Config(snappy=True), caller_reads=True)
    conn.connect()
    try:
        waiter = conn.request(protocol.pub("cr_snappy", b"x"), Waiter())
        conn.read_until(waiter, deadline=0.0)  # returns at once: the reader thread reads
        assert waiter.result(TIMEOUT) == b"OK"
        assert conn._caller_reads is False
    finally:
        conn.close()


def test_garbage_read_by_the_caller_closes_the_connection_with_the_reason(peer):
    def garbage(sock: socket.socket, reader: Any, release: threading.Event) -> None:
        reader.readline()
        reader.read(struct.unpack(">l", reader.read(4))[0])
        sock.sendall(struct.pack(">ll", 12, 99) + b"garbage!")  # frame type 99
        release.wait(TIMEOUT)

    conn = Connection(peer(garbage), Config(), caller_reads=True)
    conn.connect()
    waiter = conn.request(protocol.pub("cr_garbage", b"x"), Waiter())
    conn.read_until(waiter, deadline=float("inf"))
    with pytest.raises(ConnectionClosedError):
        waiter.result(TIMEOUT)
    assert conn.wait_closed(TIMEOUT)
    assert isinstance(conn.close_reason, ProtocolError), conn.close_reason
    conn.close()


def test_a_silent_peer_is_detected_in_caller_reads_mode(peer):
    def silent(sock: socket.socket, reader: Any, release: threading.Event) -> None:
        release.wait(TIMEOUT * 2)

    conn = Connection(peer(silent), Config(heartbeat_interval=1.0), caller_reads=True)
    conn.connect()
    assert conn.wait_closed(TIMEOUT)
    assert isinstance(conn.close_reason, NSQTimeoutError), conn.close_reason
    conn.close()


def test_heartbeats_are_answered_between_publishes(peer):
    got_nop = threading.Event()

    def heartbeat_then_echo(sock: socket.socket, reader: Any, release: threading.Event) -> None:
        sock.sendall(frame(protocol.HEARTBEAT))
        line = reader.readline()
        if line == b"NOP\n":
            got_nop.set()
        line = reader.readline()
        reader.read(struct.unpack(">l", reader.read(4))[0])
        sock.sendall(frame(b"OK"))
        release.wait(TIMEOUT)

    conn = Connection(peer(heartbeat_then_echo), Config(), caller_reads=True)
    conn.connect()
    try:
        assert got_nop.wait(TIMEOUT), "the heartbeat was not answered while idle"
        waiter = conn.request(protocol.pub("cr_hb", b"x"), Waiter())
        conn.read_until(waiter, deadline=float("inf"))
        assert waiter.result(TIMEOUT) == b"OK"
    finally:
        conn.close()


def test_a_deadline_bounds_the_callers_read(peer):
    def never_answer(sock: socket.socket, reader: Any, release: threading.Event) -> None:
        release.wait(TIMEOUT)

    conn = Connection(peer(never_answer), Config(), caller_reads=True)
    conn.connect()
    try:
        waiter = conn.request(protocol.pub("cr_deadline", b"x"), Waiter())
        conn.read_until(waiter, deadline=time.monotonic() + 0.05)
        assert not waiter.done()
        with pytest.raises(TimeoutError):
            waiter.result(0.01)
        wait_for(lambda: conn.is_connected, TIMEOUT)
    finally:
        conn.close()
