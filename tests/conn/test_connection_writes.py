"""How commands reach the socket: written by the caller on an idle connection, by the writer
thread otherwise; answers matched in order either way; writes bounded by ``write_timeout``.

Most tests talk to a scripted peer (a socket that does nsqd's handshake and then answers each
PUB with its own body), so that every caller can check it got *its* answer.  The transport
tests at the end run against the broker fixture.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nsqclient import Producer, protocol
from nsqclient.config import Config
from nsqclient.conn import _connection as conn_module
from nsqclient.conn._answer_wait import ANSWER_BACKLOG, ANSWER_WAIT
from nsqclient.conn._connection import Connection, ConnectionState, Waiter
from nsqclient.errors import ConnectionClosedError, ServerError
from nsqclient.testing.helpers import message_count, run_together
from nsqclient.testing.waiting import wait_for

CERTS = Path(__file__).parent.parent / "certs"
CERT = str(CERTS / "cert.pem")
KEY = str(CERTS / "key.pem")

#: Seconds: the bound of every wait; reached only when something is broken.
TIMEOUT = 10.0

Behaviour = Callable[[socket.socket, "ScriptedPeer"], None]


class ScriptedPeer:
    """One TCP connection's worth of nsqd: the handshake, then ``behaviour(sock, peer)``."""

    def __init__(self, behaviour: Behaviour):
        self.behaviour = behaviour
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(TIMEOUT)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.release = threading.Event()  # set at teardown: a stalled behaviour may return
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="test-scripted-nsqd", daemon=True)
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
                sock.sendall(frame(b"OK"))
                self.behaviour(sock, self)
        except BaseException as exc:  # noqa: BLE001 - reported by close()
            self.error = exc

    def close(self) -> None:
        self.release.set()
        self.thread.join(TIMEOUT)
        self.listener.close()
        assert not self.thread.is_alive(), "scripted peer still running"
        if self.error is not None:
            raise self.error


def frame(data: bytes, frame_type: int = protocol.FRAME_TYPE_RESPONSE) -> bytes:
    return struct.pack(">ll", len(data) + 4, frame_type) + data


def echo(sock: socket.socket, peer: ScriptedPeer) -> None:
    """Answer every PUB with its body; NOP needs no answer.  Returns at end of stream."""
    reader = sock.makefile("rb")
    while True:
        line = reader.readline()
        if not line:
            return
        if line.startswith(b"PUB "):
            body = reader.read(struct.unpack(">l", reader.read(4))[0])
            sock.sendall(frame(body))
        elif line == b"CLS\n":
            sock.sendall(frame(b"CLOSE_WAIT"))
        else:
            assert line == b"NOP\n", line


def never_read(sock: socket.socket, peer: ScriptedPeer) -> None:
    """A hung nsqd: keep the connection open, read nothing, answer nothing."""
    peer.release.wait(TIMEOUT * 3)


@pytest.fixture
def scripted() -> Iterator[Callable[[Behaviour], ScriptedPeer]]:
    peers: list[ScriptedPeer] = []

    def make(behaviour: Behaviour) -> ScriptedPeer:
        peers.append(ScriptedPeer(behaviour))
        return peers[-1]

    yield make
    for peer in peers:
        peer.close()


def record_writers(
    conn: Connection, monkeypatch: pytest.MonkeyPatch, with_data: bool = False
) -> list[Any]:
    """The name of the thread behind every write to ``conn``'s transport, in order (with the
    bytes written: ``(name, data)``, when ``with_data``)."""
    names: list[Any] = []
    transport = conn._transport
    assert transport is not None
    original = transport.sendall

    def sendall(data: bytes) -> None:
        name = threading.current_thread().name
        names.append((name, data) if with_data else name)
        original(data)

    monkeypatch.setattr(transport, "sendall", sendall)
    return names


# ------------------------------------------------------------------------------------------------
# Who writes


def test_a_request_on_an_idle_connection_is_written_by_its_caller(scripted, connect, monkeypatch):
    peer = scripted(echo)
    conn = connect(peer.address)
    writers = record_writers(conn, monkeypatch)
    for i in range(3):
        assert conn.request(protocol.pub("t", b"idle %d" % i)).result(TIMEOUT) == b"idle %d" % i
    assert writers == [threading.current_thread().name] * 3


@pytest.mark.parametrize("blocking", [False, True], ids=["future", "waiter"])
def test_who_writes_a_request_behind_one_in_flight(scripted, connect, monkeypatch, blocking):
    """Behind a request written and not answered yet: a caller pipelining futures leaves the
    writing to the writer thread, which joins them; a caller about to block on its answer (a
    Waiter) writes its request itself, as every earlier one is on the wire."""
    answer = threading.Event()

    def hold_first_answer(sock: socket.socket, peer: ScriptedPeer) -> None:
        assert answer.wait(TIMEOUT)
        echo(sock, peer)

    peer = scripted(hold_first_answer)
    conn = connect(peer.address)
    writers = record_writers(conn, monkeypatch)
    first = conn.request(protocol.pub("t", b"first"))
    second = conn.request(protocol.pub("t", b"second"), Waiter() if blocking else None)
    answer.set()
    assert first.result(TIMEOUT) == b"first"
    assert second.result(TIMEOUT) == b"second"
    here = threading.current_thread().name
    assert writers == [here, here if blocking else f"nsq-writer-{conn.address}"]


def test_a_blocking_request_behind_one_queued_waits_for_the_writer(scripted, connect, monkeypatch):
    """While a request left to the writer thread is not written yet, a blocking one queues
    behind it, even with the socket free (writing it first would swap their answers): the
    writer writes both, in their order."""
    answer = threading.Event()

    def hold_answers(sock: socket.socket, peer: ScriptedPeer) -> None:
        assert answer.wait(TIMEOUT)  # the first request stays in flight until then
        echo(sock, peer)

    peer = scripted(hold_answers)
    conn = connect(peer.address)
    writers = record_writers(conn, monkeypatch, with_data=True)
    writer_name = f"nsq-writer-{conn.address}"
    taken, go_on = threading.Event(), threading.Event()
    real_lock = conn._send_lock

    class GatedLock:
        """The send lock, held back from the writer thread's first ``with`` until go_on."""

        def acquire(self, blocking: bool = True) -> bool:
            return real_lock.acquire(blocking)

        def release(self) -> None:
            real_lock.release()

        def __enter__(self) -> None:
            if threading.current_thread().name == writer_name and not taken.is_set():
                taken.set()
                assert go_on.wait(TIMEOUT)
            real_lock.acquire()

        def __exit__(self, *exc: object) -> None:
            real_lock.release()

    monkeypatch.setattr(conn, "_send_lock", GatedLock())
    first = conn.request(protocol.pub("t", b"first"), Waiter())  # idle: written here
    second = conn.request(protocol.pub("t", b"second"))  # a future behind it: the writer's
    assert taken.wait(TIMEOUT)  # the writer was woken for it and waits for the socket
    third = conn.request(protocol.pub("t", b"third"), Waiter())
    go_on.set()
    answer.set()
    assert [f.result(TIMEOUT) for f in (first, second, third)] == [b"first", b"second", b"third"]
    assert writers == [
        (threading.current_thread().name, protocol.pub("t", b"first")),
        (writer_name, protocol.pub("t", b"second") + protocol.pub("t", b"third")),
    ]


def test_commands_without_an_answer_always_go_to_the_writer(scripted, connect, monkeypatch):
    peer = scripted(echo)
    conn = connect(peer.address)
    writes = record_writers(conn, monkeypatch, with_data=True)
    for _ in range(3):
        conn.send(protocol.nop())
    wait_for(lambda: b"".join(data for _, data in writes).count(b"NOP\n") == 3, TIMEOUT)
    assert {name for name, _ in writes} == {f"nsq-writer-{conn.address}"}


def record(sock: socket.socket, peer: ScriptedPeer) -> None:
    """Keep every byte the client writes (``peer.received``), answer nothing, until end of
    stream."""
    while data := sock.recv(65536):
        peer.received += data


def stall_first_write(conn: Connection, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """Make the writer's next write wait, inside the send lock, until ``go`` is set; ``inside``
    is set once it waits."""
    inside, go = threading.Event(), threading.Event()
    transport = conn._transport
    assert transport is not None
    original = transport.sendall

    def sendall(data: bytes) -> None:
        if not go.is_set():
            inside.set()
            go.wait(TIMEOUT)
        original(data)

    monkeypatch.setattr(transport, "sendall", sendall)
    return inside, go


def stalled_writer(
    scripted: Any, connect: Any, monkeypatch: pytest.MonkeyPatch
) -> tuple[ScriptedPeer, Connection, threading.Event, list[Any]]:
    """A connection to a peer that records what it is sent (``peer.received``), its writer
    inside its first write (a NOP) with the send lock held until ``go`` is set; ``writes``:
    every write's ``(thread name, data)``, that NOP first."""
    peer = scripted(record)
    peer.received = b""
    conn = connect(peer.address)
    inside, go = stall_first_write(conn, monkeypatch)
    writes = record_writers(conn, monkeypatch, with_data=True)
    conn.queue_command(protocol.nop())
    assert inside.wait(TIMEOUT)
    return peer, conn, go, writes


def test_fins_queued_meanwhile_go_out_in_one_write_after_the_commands_before_them(
    scripted, connect, monkeypatch
):
    """queue_fin(): the FINs queued while a write is under way go out in the next write, as
    one command, after every command queued before them (a TOUCH never follows its FIN)."""
    peer, conn, go, writes = stalled_writer(scripted, connect, monkeypatch)
    ids = [b"%016d" % i for i in range(3)]
    conn.queue_command(protocol.touch(ids[0]))
    conn.queue_fin(ids[0])
    conn.queue_command(protocol.rdy(5))
    conn.queue_fin(ids[1])
    conn.queue_fin(ids[2])
    go.set()
    expected = protocol.touch(ids[0]) + protocol.rdy(5) + b"".join(map(protocol.fin, ids))
    wait_for(lambda: len(peer.received) == len(protocol.nop() + expected), TIMEOUT)
    assert [data for _, data in writes] == [protocol.nop(), expected]
    assert {name for name, _ in writes} == {f"nsq-writer-{conn.address}"}


def test_fins_follow_commands_queued_before_them_even_past_two_writes(
    scripted, connect, monkeypatch
):
    """When the commands queued before a FIN fill more than two writes, they go out in writes
    of about _WRITE_SIZE bytes, and the FIN after the last of them."""
    peer, conn, go, writes = stalled_writer(scripted, connect, monkeypatch)
    filler = [b"RDY %05d\n" % i for i in range(3 * conn_module._WRITE_SIZE // 10)]
    for command in filler:
        conn.queue_command(command)
    message_id = b"0123456789abcdef"
    conn.queue_command(protocol.touch(message_id))
    conn.queue_fin(message_id)
    go.set()
    expected = protocol.nop() + b"".join(filler) + protocol.touch(message_id)
    expected += protocol.fin(message_id)
    wait_for(lambda: len(peer.received) == len(expected), TIMEOUT)
    assert peer.received == expected
    sizes = [len(data) for _, data in writes[1:]]
    assert len(sizes) >= 3 and max(sizes) <= conn_module._WRITE_SIZE + 10


def test_the_ids_are_taken_before_the_commands_queued_with_them(scripted, connect, monkeypatch):
    """A TOUCH and its FIN queued while the writer takes what is queued: the FIN is not taken
    without the TOUCH (it goes out in the next write, after it)."""
    peer, conn, go, writes = stalled_writer(scripted, connect, monkeypatch)
    message_id = b"0123456789abcdef"

    class QueuedMeanwhile(deque):
        def popleft(self) -> bytes:
            if not hasattr(self, "done"):
                self.done = True  # another thread queues a TOUCH and its FIN, this once
                conn.queue_command(protocol.touch(message_id))
                conn.queue_fin(message_id)
            return super().popleft()

    conn._out = QueuedMeanwhile()
    conn.queue_command(protocol.rdy(1))
    go.set()
    expected = [
        protocol.nop(),
        protocol.rdy(1),
        protocol.touch(message_id) + protocol.fin(message_id),
    ]
    wait_for(lambda: len(peer.received) == len(b"".join(expected)), TIMEOUT)
    assert [data for _, data in writes] == expected


def test_a_worker_writes_what_is_queued_itself_when_nobody_else_writes(
    scripted, connect, monkeypatch
):
    """write_queued(): the FINs (and the commands before them) go out on the caller's thread,
    in one write, the writer not woken for them."""
    peer = scripted(record)
    peer.received = b""
    conn = connect(peer.address)
    writes = record_writers(conn, monkeypatch, with_data=True)
    ids = [b"%016d" % i for i in range(3)]
    conn._woken = True  # as if the writer had been woken already: it stays asleep
    conn.queue_command(protocol.touch(ids[0]))
    for message_id in ids:
        conn.queue_fin(message_id)
    conn.write_queued()
    conn._woken = False
    expected = protocol.touch(ids[0]) + b"".join(map(protocol.fin, ids))
    assert writes == [(threading.current_thread().name, expected)]
    wait_for(lambda: peer.received == expected, TIMEOUT)
    conn.write_queued()  # nothing queued: nothing written
    assert len(writes) == 1


def test_a_worker_leaves_what_is_queued_to_the_writer_while_it_writes(
    scripted, connect, monkeypatch
):
    peer, conn, go, writes = stalled_writer(scripted, connect, monkeypatch)
    conn.queue_fin(b"0123456789abcdef")
    conn.write_queued()  # returns at once: the writer holds the socket
    assert len(writes) == 1
    go.set()
    expected = protocol.nop() + protocol.fin(b"0123456789abcdef")
    wait_for(lambda: peer.received == expected, TIMEOUT)
    assert {name for name, _ in writes} == {f"nsq-writer-{conn.address}"}


def test_while_closing_a_worker_leaves_what_is_queued_to_the_writer(scripted, connect, monkeypatch):
    """close() has marked the connection closing: write_queued() writes nothing (the socket
    may be shut down under it); the writer writes it before it stops."""
    peer = scripted(record)
    peer.received = b""
    conn = connect(peer.address)
    writes = record_writers(conn, monkeypatch, with_data=True)
    with conn._lock:
        conn.state = ConnectionState.CLOSING  # close()'s first step
    conn._woken = True  # as if the writer had been woken already: it stays asleep
    conn.queue_fin(b"0123456789abcdef")
    conn.write_queued()
    assert writes == [] and list(conn._fins) == [b"0123456789abcdef"]
    conn.close(timeout=2.0)  # the rest of close(): the writer's last write, then the socket
    peer.thread.join(TIMEOUT)
    assert peer.received == protocol.fin(b"0123456789abcdef")
    assert {name for name, _ in writes} == {f"nsq-writer-{conn.address}"}


def test_a_fin_queued_on_a_closed_connection_is_dropped(scripted, connect):
    """As queue_command(): nsqd sends the message again; the caller sees no error."""
    peer = scripted(record)
    peer.received = b""
    conn = connect(peer.address)
    conn.queue_fin(b"0123456789abcdef")
    wait_for(lambda: peer.received == protocol.fin(b"0123456789abcdef"), TIMEOUT)
    conn.close(timeout=2.0)
    conn.queue_fin(b"fedcba9876543210")
    conn.write_queued()
    conn.queue_fin(b"fedcba9876543211")
    assert not conn._writer.is_alive()
    peer.thread.join(TIMEOUT)
    assert peer.received == protocol.fin(b"0123456789abcdef")


# ------------------------------------------------------------------------------------------------
# Order


def test_concurrent_callers_each_get_their_own_answer(scripted, connect):
    """Sixteen threads mixing blocking requests, futures and NOPs: the direct and the queued
    paths interleave, and every answer still reaches the request that caused it."""
    peer = scripted(echo)
    conn = connect(peer.address)
    wrong: list[tuple[bytes, Any]] = []

    def work(i: int) -> None:
        futures = []
        for j in range(300):
            body = b"%d-%d" % (i, j)
            if j % 3 == 0:
                futures.append((body, conn.request(protocol.pub("t", body))))
            else:
                got = conn.request(protocol.pub("t", body), Waiter()).result(TIMEOUT)
                if got != body:
                    wrong.append((body, got))
            if j % 7 == 0:
                conn.send(protocol.nop())
        for body, future in futures:
            got = future.result(TIMEOUT)
            if got != body:
                wrong.append((body, got))

    run_together(work, 16, "test-req")
    assert not wrong, wrong[:5]
    assert conn.pending_count() == 0


def test_oks_in_one_read_answer_the_oldest_requests_in_order(scripted, connect, caplog):
    """A read of nothing but OK frames (a publisher's usual read) answers as many pending
    requests, oldest first; the request behind them still gets its own answer."""
    got_all = threading.Event()

    def answer_in_bulk(sock: socket.socket, peer: ScriptedPeer) -> None:
        reader = sock.makefile("rb")
        for _ in range(51):
            assert reader.readline().startswith(b"PUB ")
            reader.read(struct.unpack(">l", reader.read(4))[0])
        got_all.set()
        # 50 OKs in one write, then an error for the 51st, then one OK nobody asked for
        sock.sendall(protocol.OK_FRAME * 50)
        sock.sendall(frame(b"E_PUB_FAILED full", protocol.FRAME_TYPE_ERROR))
        sock.sendall(protocol.OK_FRAME)
        peer.release.wait(TIMEOUT)

    peer = scripted(answer_in_bulk)
    conn = connect(peer.address)
    futures = [conn.request(protocol.pub("t", b"%d" % i)) for i in range(51)]
    assert got_all.wait(TIMEOUT)
    with caplog.at_level(logging.WARNING, logger="nsqclient.conn"):
        assert [f.result(TIMEOUT) for f in futures[:50]] == [b"OK"] * 50
        assert "E_PUB_FAILED" in str(futures[50].exception(TIMEOUT))
        # the extra OK may come in the error's read or in one of its own
        wait_for(lambda: "unexpected response from" in caplog.text, TIMEOUT)
    assert conn.pending_count() == 0


# ------------------------------------------------------------------------------------------------
# write_timeout


BIG = b"x" * (32 * 1024 * 1024)  # far more than the socket buffers of both ends hold


def test_write_timeout_on_the_callers_write(scripted, connect):
    peer = scripted(never_read)
    conn = connect(peer.address, write_timeout=0.2, heartbeat_interval=30.0)
    future = conn.request(protocol.pub("t", BIG))  # idle: the caller writes, and gives up
    exc = future.exception(TIMEOUT)
    assert isinstance(exc, ConnectionClosedError)
    assert exc.maybe_processed is True  # part of it may be on the wire
    assert isinstance(conn.close_reason, TimeoutError)
    assert "did not complete within 0.2 s" in str(conn.close_reason)
    assert conn.wait_closed(TIMEOUT)


def test_write_timeout_on_the_writer_thread_fails_everything_pending(scripted, connect):
    peer = scripted(never_read)
    conn = connect(peer.address, write_timeout=0.2, heartbeat_interval=30.0)
    first = conn.request(protocol.pub("t", b"small"))  # written at once, never answered
    queued = [conn.request(protocol.pub("t", BIG)) for _ in range(2)]  # on the writer
    for future in [first, *queued]:
        exc = future.exception(TIMEOUT)
        assert isinstance(exc, ConnectionClosedError), exc
    assert "did not complete within 0.2 s" in str(conn.close_reason)
    late = conn.request(protocol.pub("t", b"late")).exception(TIMEOUT)
    assert isinstance(late, ConnectionClosedError) and late.maybe_processed is False


def test_pub_to_a_hung_nsqd_raises_after_the_write_timeout(scripted):
    """The user's view: pub() of a body the hung nsqd never reads raises ConnectionClosedError
    (the outcome is unknown), long before pub_timeout."""
    peer = scripted(never_read)
    # An nsqd started with --max-msg-size above BIG: the Producer checks nothing at the call.
    with Producer(
        peer.address, write_timeout=0.2, pub_timeout=60.0, max_msg_size=len(BIG)
    ) as producer:
        with pytest.raises(ConnectionClosedError) as caught:
            producer.pub("t", BIG)
    assert caught.value.maybe_processed is True
    assert isinstance(caught.value.__cause__, TimeoutError)


def answer_one_then_the_rest(count: int, go: threading.Event) -> Behaviour:
    """Read ``count`` PUBs, answer the first, and the rest once ``go`` is set (a write each, as
    nsqd flushes every answer); ``go`` not set within TIMEOUT: the rest is never answered."""

    def behaviour(sock: socket.socket, peer: ScriptedPeer) -> None:
        reader = sock.makefile("rb")
        for _ in range(count):
            assert reader.readline() == b"PUB t\n"
            reader.read(struct.unpack(">l", reader.read(4))[0])
        sock.sendall(frame(b"OK"))
        if not go.wait(TIMEOUT):
            raise AssertionError("not told to answer the rest")
        for _ in range(count - 1):
            sock.sendall(frame(b"OK"))
        reader.read(1)  # until the client closes

    return behaviour


READERS = pytest.mark.parametrize("caller_reads", [False, True], ids=["thread", "caller"])


def pipelined_answers(peer: ScriptedPeer, caller_reads: bool, count: int) -> list[Any]:
    """``count`` PUBs pipelined on a connection of its own (``caller_reads`` as given);
    their answers, each awaited."""
    conn = Connection(peer.address, Config(), caller_reads=caller_reads)
    conn.connect()
    try:
        futures = [conn.request(protocol.pub("t", b"x")) for _ in range(count)]
        assert futures[0].result(TIMEOUT) == b"OK"
        return [f.result(TIMEOUT) for f in futures]
    finally:
        conn.close(timeout=2.0)


@READERS
def test_after_a_small_read_with_a_backlog_the_reader_waits_for_more_answers(
    scripted, caller_reads, monkeypatch
):
    """One answer read with ANSWER_BACKLOG requests still unanswered: the reader waits
    (conn/_answer_wait.py; the peer answers the rest only once it does), then reads them."""
    waits: list[float] = []
    waited = threading.Event()

    def wait(seconds: float) -> None:
        waits.append(seconds)
        waited.set()

    monkeypatch.setattr(conn_module, "_sleep", wait)
    count = ANSWER_BACKLOG + 1
    peer = scripted(answer_one_then_the_rest(count, waited))
    assert pipelined_answers(peer, caller_reads, count) == [b"OK"] * count
    assert waits and set(waits) == {ANSWER_WAIT}


@READERS
def test_below_the_backlog_the_reader_reads_again_at_once(scripted, caller_reads, monkeypatch):
    waits: list[float] = []
    monkeypatch.setattr(conn_module, "_sleep", waits.append)
    go = threading.Event()
    peer = scripted(answer_one_then_the_rest(ANSWER_BACKLOG, go))
    original = Connection._answer_oks

    def answered(self: Connection, count: int) -> None:
        original(self, count)
        go.set()  # the first answer handled, ANSWER_BACKLOG - 1 left: now the rest

    monkeypatch.setattr(Connection, "_answer_oks", answered)
    assert pipelined_answers(peer, caller_reads, ANSWER_BACKLOG) == [b"OK"] * ANSWER_BACKLOG
    assert waits == []


# ------------------------------------------------------------------------------------------------
# Through TLS and compression, against the broker


TRANSPORTS = {
    "plain": {},
    "snappy": {"snappy": True},
    "deflate": {"deflate": True},
    "tls+snappy": {"tls_v1": True, "tls_ca_file": CERT, "snappy": True},
    "tls+deflate": {"tls_v1": True, "tls_ca_file": CERT, "deflate": True},
}


@pytest.mark.parametrize("name", list(TRANSPORTS))
def test_concurrent_publishers_through_each_transport(name, nsq_cluster_factory, connect):
    """Caller writes and writer-thread writes share one compression stream and one TLS session;
    the stream must stay whole."""
    cluster = nsq_cluster_factory(lookupd=False, tls_cert=CERT, tls_key=KEY)
    node = cluster.nsqd
    conn = connect(node.tcp_address, **TRANSPORTS[name])
    topic = f"writes_{name.replace('+', '_')}"

    def work(i: int) -> None:
        for j in range(250):
            body = b"%d-%d " % (i, j) + b"z" * (j % 50)
            assert conn.request(protocol.pub(topic, body), Waiter()).result(TIMEOUT) == b"OK"

    run_together(work, 8, "test-tx")
    assert conn.is_connected
    assert message_count(node, topic) == 8 * 250


def test_the_writer_joins_at_most_write_size_bytes_per_write(scripted, connect):
    """Commands queued while a write is under way go out joined, in order, in writes of at
    most _WRITE_SIZE bytes (plus the one command that crosses it)."""
    peer = scripted(echo)
    conn = connect(peer.address)
    sizes: list[int] = []
    transport = conn._transport
    real_sendall = transport.sendall

    def sendall(data: bytes) -> None:
        sizes.append(len(data))
        real_sendall(data)

    transport.sendall = sendall
    bodies = [b"%04d" % i + b"x" * 1000 for i in range(300)]
    with conn._send_lock:  # every request is queued while the writer waits for the socket
        futures = [conn.request(protocol.pub("t", body)) for body in bodies]
    assert [f.result(TIMEOUT) for f in futures] == bodies
    command = len(protocol.pub("t", bodies[0]))
    assert sum(sizes) == command * len(bodies)
    assert len(sizes) >= (command * len(bodies)) // (conn_module._WRITE_SIZE + command)
    assert max(sizes) <= conn_module._WRITE_SIZE + command
    assert max(sizes) > conn_module._WRITE_SIZE // 2  # still joined, not one write each


def test_the_writer_stops_only_after_writing_every_request_left_to_it(scripted, connect):
    """A stop queued behind more than one write's worth of requests ends the writer thread once
    all of them are written, in their order (close() stops it so)."""
    peer = scripted(echo)
    conn = connect(peer.address)
    bodies = [b"%04d" % i + b"x" * 1000 for i in range(300)]
    with conn._send_lock:  # the writer waits for the socket while all is queued
        futures = [conn.request(protocol.pub("t", body)) for body in bodies]
        conn._queue.put(conn_module._STOP)
    assert [f.result(TIMEOUT) for f in futures] == bodies
    conn._writer.join(TIMEOUT)
    assert not conn._writer.is_alive()


# ------------------------------------------------------------------------------------------------
# PUBs joined into one MPUB (join_limit, set by a Producer)


def mpub_peer(answers: list[bytes]) -> Behaviour:
    """Answer each PUB with its body and each MPUB with the next of ``answers`` (frames; after
    an error frame the stream ends, as nsqd's after a fatal error); keep each command's first
    line and its bodies in ``peer.commands``."""

    def behaviour(sock: socket.socket, peer: ScriptedPeer) -> None:
        reader = sock.makefile("rb")
        script = iter(answers)
        while line := reader.readline():
            body = reader.read(struct.unpack(">l", reader.read(4))[0])
            if line.startswith(b"PUB "):
                peer.commands.append((line, [body]))
                sock.sendall(frame(body))
                continue
            assert line.startswith(b"MPUB "), line
            count = struct.unpack(">l", body[:4])[0]
            bodies, at = [], 4
            for _ in range(count):
                size = struct.unpack(">l", body[at : at + 4])[0]
                bodies.append(body[at + 4 : at + 4 + size])
                at += 4 + size
            peer.commands.append((line, bodies))
            answer = next(script)
            sock.sendall(answer)
            if struct.unpack(">l", answer[4:8])[0] == protocol.FRAME_TYPE_ERROR:
                return

    return behaviour


def joining(
    scripted: Any, connect: Any, answers: list[bytes], join_limit: int = 1 << 20
) -> tuple[ScriptedPeer, Connection]:
    """A connection with ``join_limit`` to an :func:`mpub_peer` answering MPUBs with
    ``answers``."""
    peer = scripted(mpub_peer(answers))
    peer.commands = []
    conn = connect(peer.address)
    conn.join_limit = join_limit
    return peer, conn


def queued_together(conn: Connection, commands: list[bytes]) -> list[Any]:
    """Request each of ``commands`` while the send lock is held (every one waits for the
    writer, which takes them all at once); their futures."""
    with conn._send_lock:
        return [conn.request(command) for command in commands]


def test_pubs_of_one_topic_queued_together_go_out_as_one_mpub_answered_for_each(scripted, connect):
    peer, conn = joining(scripted, connect, [frame(b"OK"), frame(b"OK")])
    first, second = [b"a%d" % i for i in range(5)], [b"b0", b"b1"]
    futures = queued_together(
        conn,
        [
            *(protocol.pub("t", body) for body in first),
            protocol.pub("u", b"alone"),
            *(protocol.pub("t", body) for body in second),
        ],
    )
    assert [f.result(TIMEOUT) for f in futures] == [b"OK"] * 5 + [b"alone"] + [b"OK"] * 2
    assert peer.commands == [(b"MPUB t\n", first), (b"PUB u\n", [b"alone"]), (b"MPUB t\n", second)]
    assert conn.stats()["pubs_joined"] == 7
    assert conn.stats()["messages_sent"] == 0  # request() was told of no message count


def test_without_a_join_limit_each_pub_goes_out_on_its_own(scripted, connect):
    peer, conn = joining(scripted, connect, [], join_limit=0)
    bodies = [b"%d" % i for i in range(4)]
    futures = queued_together(conn, [protocol.pub("t", body) for body in bodies])
    assert [f.result(TIMEOUT) for f in futures] == bodies
    assert peer.commands == [(b"PUB t\n", [body]) for body in bodies]
    assert conn.stats()["pubs_joined"] == 0


def test_an_error_answering_a_joined_mpub_fails_each_of_its_publishes(scripted, connect):
    # E_MPUB_FAILED (nsqd could not store them: exiting, its disk failing) is each one's, as
    # E_PUB_FAILED is a PUB's; it is fatal, so the request behind is not processed.
    error = frame(b"E_MPUB_FAILED MPUB failed exiting", protocol.FRAME_TYPE_ERROR)
    _, conn = joining(scripted, connect, [error])
    commands = [protocol.pub("t", b"%d" % i) for i in range(3)] + [protocol.pub("u", b"x")]
    *joined, behind = queued_together(conn, commands)
    errors = [f.exception(TIMEOUT) for f in joined]
    assert all(isinstance(e, ServerError) and e.code == "E_MPUB_FAILED" for e in errors)
    assert all("one MPUB of 3 publishes" in str(e) for e in errors)
    assert len({id(e) for e in errors}) == 3  # one exception each, raised in its own thread
    late = behind.exception(TIMEOUT)
    assert type(late) is ConnectionClosedError and not late.maybe_processed
    assert conn.join_refused is None


def test_a_joined_mpub_nsqd_refuses_fails_its_publishes_as_not_processed(scripted, connect):
    # E_BAD_BODY is fatal: nsqd stored none of them and closes, as after any fatal error.
    refusal = frame(b"E_BAD_BODY MPUB body too big 2060 > 1000", protocol.FRAME_TYPE_ERROR)
    _, conn = joining(scripted, connect, [refusal])
    futures = queued_together(conn, [protocol.pub("t", b"%d" % i) for i in range(10)])
    errors = [f.exception(TIMEOUT) for f in futures]
    assert all(type(e) is ConnectionClosedError and not e.maybe_processed for e in errors)
    assert all(e.__cause__ is conn.join_refused for e in errors)
    assert conn.join_refused is not None and conn.join_refused.code == "E_BAD_BODY"
    assert conn.wait_closed(TIMEOUT)
