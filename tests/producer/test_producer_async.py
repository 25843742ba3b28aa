"""pub_async() never blocks and never raises for the network: connection failures (refused, a
handshake nobody answers, lookupd down) arrive in the Future; bad input still raises at the
call.  The pynsq Writer's callbacks follow."""

from __future__ import annotations

import queue
import socket
import threading
from collections.abc import Iterator

import pytest

from nsqclient import compat
from nsqclient.errors import ConnectionClosedError, NSQError, NSQTimeoutError
from nsqclient.message import Message
from nsqclient.producer._producer import Producer
from nsqclient.testing.helpers import free_port, message_count, wait_drained
from nsqclient.testing.waiting import wait_for

TIMEOUT = 10.0


@pytest.fixture
def hung() -> Iterator[tuple[str, queue.Queue]]:
    """A listener that accepts and never answers (an nsqd hung before the handshake): yields
    its address and a queue of the sockets it accepted (close one to end that handshake)."""
    accepted: queue.Queue = queue.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        stop = threading.Event()

        def accept() -> None:
            while not stop.is_set():
                try:
                    peer, _ = s.accept()
                except OSError:
                    return
                accepted.put(peer)

        t = threading.Thread(target=accept, name="test-hung-nsqd", daemon=True)
        t.start()
        yield f"127.0.0.1:{s.getsockname()[1]}", accepted
        stop.set()
        s.close()
        while not accepted.empty():
            accepted.get().close()


def test_pub_async_to_a_refused_port_fails_in_the_future():
    p = Producer(f"127.0.0.1:{free_port()}")
    try:
        future = p.pub_async("t", b"x")  # no exception here
        exc = future.exception(TIMEOUT)
        assert isinstance(exc, ConnectionClosedError) and not exc.maybe_processed
        assert "could not reach any nsqd" in str(exc)
        # While the address waits out its reconnect delay, the next ones fail the same way.
        more = [p.pub_async("t", b"y") for _ in range(3)]
        for f in more:
            assert isinstance(f.exception(TIMEOUT), ConnectionClosedError)
    finally:
        p.close(0)


def test_pub_async_to_a_hung_nsqd_returns_before_the_handshake(hung):
    address, accepted = hung
    p = Producer(address, handshake_timeout=30.0, pub_timeout=30.0)
    try:
        future = p.pub_async("t", b"x")
        # The call returned while the handshake is still waiting on nsqd (held below).
        peer = accepted.get(timeout=TIMEOUT)
        assert not future.done()
        later = p.pub_async("t", b"y")  # queued behind the first, not blocked either
        assert not later.done()
        peer.close()  # nsqd goes away mid-handshake
        exc = future.exception(TIMEOUT)
        assert isinstance(exc, NSQError)
        assert isinstance(later.exception(TIMEOUT), NSQError)
    finally:
        p.close(0)


def test_pub_async_bad_input_still_raises_at_the_call():
    p = Producer(f"127.0.0.1:{free_port()}")
    try:
        with pytest.raises(ValueError):
            p.pub_async("bad topic!", b"x")
        with pytest.raises(TypeError):
            p.pub_async("t", 5)  # type: ignore[arg-type]
    finally:
        p.close(0)


def test_pub_async_through_a_dead_lookupd_fails_in_the_future():
    p = Producer(lookupd_http_addresses=[f"http://127.0.0.1:{free_port()}"], leader_retries=0)
    try:
        future = p.pub_async("t", b"x")
        assert future.exception(TIMEOUT) is not None
    finally:
        p.close(0)


def test_pub_async_keeps_the_callers_order_while_the_connection_comes_up(nsqd, consumers):
    """The first publishes wait in the backlog for the connection; the later ones must not
    overtake them on the connection once it is up."""
    node = nsqd.nsqd
    total = 2000
    p = Producer(node.tcp_address)
    try:
        futures = [p.pub_async("a_order", b"%05d" % i) for i in range(total)]
        for f in futures:
            assert f.result(TIMEOUT) == b"OK"
    finally:
        p.close()
    assert message_count(node, "a_order") == total
    got: list[bytes] = []

    def handler(message: Message) -> None:
        got.append(message.body)

    consumers("a_order", "ch", handler, nsqd_tcp_addresses=node.tcp_address, max_in_flight=1)
    wait_for(lambda: len(got) == total, TIMEOUT)
    wait_drained(node, "a_order", "ch")
    assert got == [b"%05d" % i for i in range(total)]


def test_close_delivers_what_pub_async_accepted_before_the_connection_was_made(nsqd):
    node = nsqd.nsqd
    p = Producer(node.tcp_address)
    futures = [p.pub_async("a_close", b"%d" % i) for i in range(300)]
    p.close(TIMEOUT)
    assert all(f.result(0) == b"OK" for f in futures)
    assert message_count(node, "a_close") == 300


def test_pub_async_after_the_deadline_in_the_backlog_times_out(hung):
    address, accepted = hung
    p = Producer(address, handshake_timeout=30.0, pub_timeout=0.5)
    try:
        future = p.pub_async("t", b"x")
        accepted.get(timeout=TIMEOUT)  # held: the handshake outlives pub_timeout
        exc = future.exception(TIMEOUT)
        assert isinstance(exc, NSQTimeoutError), exc
        assert "pub_timeout" in str(exc)
    finally:
        p.close(0)


def test_writer_callback_to_a_hung_nsqd_never_blocks_the_caller(hung):
    address, accepted = hung
    writer = compat.Writer(address, handshake_timeout=30.0)
    answers: queue.Queue = queue.Queue()
    try:
        future = writer.pub("t", b"x", lambda conn, data: answers.put((conn, data)))
        peer = accepted.get(timeout=TIMEOUT)
        assert not future.done() and answers.empty()
        peer.close()
        conn, data = answers.get(timeout=TIMEOUT)
        assert conn is None and isinstance(data, compat.SendError)
    finally:
        writer.close()


def test_pub_async_spreads_over_every_address_once_they_are_connected(nsq_cluster_factory):
    """The first publish connects one nsqd on the backlog; the others are connected in the
    background, and round robin then reaches all of them."""
    cluster = nsq_cluster_factory(nsqd_count=2, lookupd=False)
    a, b = cluster.nsqds
    p = Producer([a.tcp_address, b.tcp_address])
    try:
        p.pub_async("a_spread", b"first").result(TIMEOUT)
        assert sum(e["connected"] for e in p.stats()["nsqd"]) == 1
        # The next publish goes out on the connected nsqd and has the other one connected.
        p.pub_async("a_spread", b"second").result(TIMEOUT)
        wait_for(lambda: all(e["connected"] for e in p.stats()["nsqd"]), TIMEOUT)
        futures = [p.pub_async("a_spread", b"%d" % i) for i in range(100)]
        assert all(f.result(TIMEOUT) == b"OK" for f in futures)
    finally:
        p.close()
    assert message_count(a, "a_spread") >= 50 and message_count(b, "a_spread") >= 50
