"""The reader's wait for nsqd's answers to pile up while many requests are unanswered
(conn/_answer_wait.py), in both reader loops (the reader thread alone, and caller-reads mode)."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from nsqclient import protocol
from nsqclient.config import Config
from nsqclient.conn import _connection as conn_module
from nsqclient.conn._answer_wait import ANSWER_BACKLOG, ANSWER_WAIT, SMALL_READ, answer_wait
from nsqclient.conn._connection import Connection

#: Seconds: the bound of every wait; reached only when something is broken.
TIMEOUT = 10.0


def test_the_reader_waits_only_after_a_small_read_with_many_requests_unanswered():
    assert answer_wait(10, ANSWER_BACKLOG) == ANSWER_WAIT
    assert answer_wait(SMALL_READ - 1, 100_000) == ANSWER_WAIT
    assert answer_wait(SMALL_READ, 100_000) == 0.0  # a read that carried many answers
    assert answer_wait(10, ANSWER_BACKLOG - 1) == 0.0
    assert answer_wait(10, 0) == 0.0  # a blocking request on a quiet connection


def ok_frame() -> bytes:
    return struct.pack(">ll", 6, protocol.FRAME_TYPE_RESPONSE) + b"OK"


class Peer:
    """nsqd's handshake, then: read ``count`` PUBs, answer the first, wait for ``go``, answer
    the rest.  ``go`` not set within TIMEOUT: the rest is never answered (``error`` says so)."""

    def __init__(self, count: int, go: threading.Event):
        self.count, self.go = count, go
        self.error: BaseException | None = None
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(TIMEOUT)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.thread = threading.Thread(target=self._run, name="test-answering-nsqd", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            sock, _ = self.listener.accept()
            with sock:
                sock.settimeout(TIMEOUT)
                reader = sock.makefile("rb")
                assert reader.read(4) == protocol.MAGIC_V2
                assert reader.readline() == b"IDENTIFY\n"
                reader.read(struct.unpack(">l", reader.read(4))[0])
                sock.sendall(ok_frame())
                for _ in range(self.count):
                    assert reader.readline() == b"PUB t\n"
                    reader.read(struct.unpack(">l", reader.read(4))[0])
                sock.sendall(ok_frame())
                if not self.go.wait(TIMEOUT):
                    raise AssertionError("not told to answer the rest")
                for _ in range(self.count - 1):
                    sock.sendall(ok_frame())  # one write each, as nsqd flushes every answer
                reader.read(1)  # until the client closes
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


@contextmanager
def connected(peer: Peer, caller_reads: bool) -> Iterator[Connection]:
    conn = Connection(peer.address, Config(), caller_reads=caller_reads)
    conn.connect()
    try:
        yield conn
    finally:
        conn.close(timeout=2.0)
        peer.thread.join(TIMEOUT)
        peer.listener.close()


READERS = pytest.mark.parametrize("caller_reads", [False, True], ids=["thread", "caller"])


@READERS
def test_after_a_small_read_with_a_backlog_the_reader_waits_for_more_answers(
    caller_reads, monkeypatch
):
    """One answer read with ANSWER_BACKLOG requests still unanswered: the reader waits
    (the peer answers the rest only once it does), then reads them all."""
    waits: list[float] = []
    waited = threading.Event()

    def wait(seconds: float) -> None:
        waits.append(seconds)
        waited.set()

    monkeypatch.setattr(conn_module, "_sleep", wait)
    peer = Peer(ANSWER_BACKLOG + 1, waited)
    with connected(peer, caller_reads) as conn:
        futures = [conn.request(protocol.pub("t", b"x")) for _ in range(peer.count)]
        assert [f.result(TIMEOUT) for f in futures] == [b"OK"] * peer.count
    assert peer.error is None
    assert waits and set(waits) == {ANSWER_WAIT}


@READERS
def test_below_the_backlog_the_reader_reads_again_at_once(caller_reads, monkeypatch):
    waits: list[float] = []
    monkeypatch.setattr(conn_module, "_sleep", waits.append)
    go = threading.Event()
    peer = Peer(ANSWER_BACKLOG, go)
    with connected(peer, caller_reads) as conn:
        futures = [conn.request(protocol.pub("t", b"x")) for _ in range(peer.count)]
        assert futures[0].result(TIMEOUT) == b"OK"  # ANSWER_BACKLOG - 1 left unanswered
        go.set()
        assert [f.result(TIMEOUT) for f in futures] == [b"OK"] * peer.count
    assert peer.error is None
    assert waits == []
