"""A Producer keeps its promises: ``close()``, ``flush()`` and leaving a ``with`` block say what
they could not deliver, every publish ends within ``pub_timeout``, and an address that is down
says which attempt its error comes from."""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from collections.abc import Iterator
from concurrent.futures import wait
from typing import Any

import pytest

from nsqclient import Producer, protocol
from nsqclient.conn._futures import failure_of
from nsqclient.errors import (
    ConnectionClosedError,
    NSQError,
    NSQTimeoutError,
    UndeliveredError,
)
from nsqclient.testing.helpers import message_count
from nsqclient.testing.waiting import wait_for

#: Seconds: the bound of every wait; reached only when something is broken.
TIMEOUT = 10.0


def refused_address() -> str:
    """An address nobody listens on (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def frozen(nsqd: Any) -> Iterator[Any]:
    """The broker's nsqd, to be frozen with ``frozen.stall_nsqd(0)`` (SIGSTOP on real nsqd);
    resumed at teardown whatever happened."""
    yield nsqd
    nsqd.unstall_nsqd(0)


# ------------------------------------------------------------------------------------------------
# close(), flush() and the with block report what was not delivered


def test_close_raises_for_async_publishes_that_failed_unseen():
    producer = Producer(refused_address(), pub_timeout=TIMEOUT)
    futures = [producer.pub_async("undelivered", b"%d" % i) for i in range(5)]
    with pytest.raises(UndeliveredError) as info:
        producer.close()
    error = info.value
    assert isinstance(error, NSQError)
    assert (error.count, error.failed, error.unanswered) == (5, 5, 0)
    assert set(error.futures) == set(futures)
    assert all(isinstance(f.exception(0), ConnectionClosedError) for f in futures)
    message = str(error)
    assert "close(): 5 publishes" in message
    assert "5 failed" in message and "ConnectionClosedError" in message
    assert "refused" in message.lower()
    producer.close()  # reported once: a second close has nothing more to say


def test_the_summary_groups_failures_by_cause_not_by_their_timings():
    # The first publish finds the address refusing; the others fail at once while it waits
    # out its reconnect delay, each error saying how long ago the last attempt was: one cause.
    address = refused_address()
    producer = Producer(address, pub_timeout=TIMEOUT, reconnect_interval=0.05)
    futures = [producer.pub_async("undelivered", b"%d" % i) for i in range(300)]
    wait(futures, TIMEOUT)
    assert len({str(failure_of(f)) for f in futures}) > 1  # texts differ (timings)
    with pytest.raises(UndeliveredError) as info:
        producer.close()
    message = str(info.value)
    assert (
        f"300 failed (300 x ConnectionClosedError from {address}: connection refused)" in message
    ), message
    assert "other reason" not in message


def test_leaving_the_with_block_raises_for_what_was_not_delivered():
    with pytest.raises(UndeliveredError, match="3 publishes"):
        with Producer(refused_address(), pub_timeout=TIMEOUT) as producer:
            for i in range(3):
                producer.pub_async("undelivered", b"%d" % i)


def test_a_with_block_already_raising_keeps_its_error_and_logs_the_loss(caplog):
    caplog.set_level(logging.ERROR, logger="nsqclient.producer")
    with pytest.raises(KeyError):
        with Producer(refused_address(), pub_timeout=TIMEOUT) as producer:
            producer.pub_async("undelivered", b"x")
            producer.pub_async("undelivered", b"y")
            raise KeyError("the block's own error")
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("2 publishes" in m and "KeyError" in m for m in errors), errors


@pytest.mark.parametrize("take", ["result", "exception", "callback"])
def test_failures_already_taken_from_their_futures_are_not_reported_again(take):
    producer = Producer(refused_address(), pub_timeout=TIMEOUT)
    futures = [producer.pub_async("undelivered", b"%d" % i) for i in range(4)]
    seen: list[Any] = []
    for future in futures:
        if take == "result":
            with pytest.raises(ConnectionClosedError):
                future.result(TIMEOUT)
        elif take == "exception":
            assert future.exception(TIMEOUT) is not None
        else:
            future.add_done_callback(seen.append)
    producer.close()  # nothing is raised: every failure was taken
    if take == "callback":
        assert len(seen) == 4


def test_only_the_failures_nobody_took_are_reported():
    producer = Producer(refused_address(), pub_timeout=TIMEOUT)
    futures = [producer.pub_async("undelivered", b"%d" % i) for i in range(6)]
    for future in futures[:4]:
        future.exception(TIMEOUT)
    with pytest.raises(UndeliveredError) as info:
        producer.flush()
    assert info.value.count == 2
    assert set(info.value.futures) == set(futures[4:])
    producer.close()  # flush() reported them already


def test_a_clean_close_raises_nothing(nsqd):
    node = nsqd.nsqd
    with Producer(node.tcp_address) as producer:
        for i in range(50):
            producer.pub_async("delivered", b"%d" % i)
    assert message_count(node, "delivered") == 50


def test_blocking_publish_failures_are_the_callers_not_closes():
    producer = Producer(refused_address(), pub_timeout=1.0)
    with pytest.raises(ConnectionClosedError):
        producer.pub("undelivered", b"x")
    producer.close()  # pub() raised to its caller: nothing more to say


# ------------------------------------------------------------------------------------------------
# pub_timeout bounds every publish, blocking or not


def test_pub_async_to_a_frozen_nsqd_fails_within_pub_timeout(frozen):
    node = frozen.nsqd
    producer = Producer(node.tcp_address, pub_timeout=1.0)
    producer.pub("frozen", b"warm-up")  # connected
    frozen.stall_nsqd(0)
    started = time.monotonic()
    futures = [producer.pub_async("frozen", b"%d" % i) for i in range(101)]
    done, not_done = wait(futures, timeout=TIMEOUT)
    elapsed = time.monotonic() - started
    assert not not_done
    assert 0.9 <= elapsed < 3.0, elapsed  # pub_timeout, not the heartbeat check (a minute)
    for future in futures:
        exc = future.exception(0)
        assert isinstance(exc, NSQTimeoutError), exc
        assert exc.maybe_processed  # written: nsqd may store them when it wakes
    # The connection is kept, as pub() keeps it after a timeout.
    assert producer.stats()["nsqd"][0]["connected"]
    producer.close(0.5)  # every failure was taken above: close has nothing to add


def test_close_reports_what_a_frozen_nsqd_never_answered(frozen):
    node = frozen.nsqd
    producer = Producer(node.tcp_address, pub_timeout=30.0)
    producer.pub("frozen", b"warm-up")
    frozen.stall_nsqd(0)
    futures = [producer.pub_async("frozen", b"%d" % i) for i in range(101)]
    started = time.monotonic()
    with pytest.raises(UndeliveredError) as info:
        producer.close(0.5)
    assert time.monotonic() - started < 3.0
    error = info.value
    assert (error.unanswered, error.failed) == (101, 0)
    assert "101 still without nsqd's answer after 0.5s" in str(error)
    assert set(error.futures) == set(futures)
    assert all(f.done() for f in futures)  # failed as the connection closed


def test_flush_lists_what_the_deadline_failed(frozen):
    node = frozen.nsqd
    producer = Producer(node.tcp_address, pub_timeout=0.5)
    producer.pub("frozen", b"warm-up")
    frozen.stall_nsqd(0)
    futures = [producer.pub_async("frozen", b"%d" % i) for i in range(10)]
    with pytest.raises(UndeliveredError) as info:
        producer.flush(TIMEOUT)
    assert (info.value.failed, info.value.unanswered) == (10, 0)
    assert "10 x NSQTimeoutError" in str(info.value)
    assert set(info.value.futures) == set(futures)
    frozen.unstall_nsqd(0)
    producer.pub("frozen", b"after", timeout=TIMEOUT)  # the kept connection works again
    producer.close()


class SilentPeer:
    """A TCP peer that does nsqd's handshake (V2 magic, IDENTIFY answered OK) and then reads
    nothing until told to, so that what the client writes piles up in the socket buffers."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # inherited
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.listener.settimeout(TIMEOUT)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.drain = threading.Event()
        self.commands: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        sock, _ = self.listener.accept()
        with sock:
            reader = sock.makefile("rb")
            reader.read(4)  # "  V2"
            reader.readline()  # IDENTIFY
            reader.read(struct.unpack(">l", reader.read(4))[0])
            sock.sendall(struct.pack(">ll", 6, protocol.FRAME_TYPE_RESPONSE) + b"OK")
            self.drain.wait(TIMEOUT * 3)
            sock.settimeout(1.0)
            try:
                while True:
                    line = reader.readline()
                    if not line:
                        return
                    size = struct.unpack(">l", reader.read(4))[0]
                    reader.read(size)
                    self.commands.append(line)
            except OSError:
                return  # read everything there was (the client closed, or nothing more came)

    def close(self) -> None:
        self.drain.set()
        self.thread.join(TIMEOUT)
        self.listener.close()


@pytest.mark.parametrize("connected", [False, True], ids=["from-the-backlog", "direct"])
def test_a_publish_that_was_never_written_says_so_and_is_never_sent(connected):
    peer = SilentPeer()
    producer = Producer(peer.address, pub_timeout=1.0, write_timeout=TIMEOUT)
    try:
        futures = []
        if connected:  # connected first: the publishes below go straight to the connection
            futures.append(producer.pub_async("silent", b"first"))
            wait_for(lambda: producer.stats()["nsqd"][0]["connected"], TIMEOUT)
        body = b"x" * 500_000
        futures += [producer.pub_async("silent", body) for _ in range(60)]
        assert not wait(futures, timeout=TIMEOUT).not_done
        outcomes = [f.exception(0) for f in futures]
        assert all(isinstance(e, NSQTimeoutError) for e in outcomes), outcomes
        written = sum(e.maybe_processed for e in outcomes)  # type: ignore[union-attr]
        # 30 MB cannot all fit in the socket buffers of a peer that reads nothing.
        assert 0 < written < len(futures), written
        never = [e for e in outcomes if not e.maybe_processed]  # type: ignore[union-attr]
        assert all("nothing was sent" in str(e) for e in never)
        assert all("may or may not be stored" in str(e) for e in outcomes if e not in never)
        peer.drain.set()  # the peer reads again: the writer finishes what it had started
        wait_for(lambda: len(peer.commands) == written, TIMEOUT, message="the written ones arrive")
    finally:
        producer.close(0.0)  # every outcome was taken above
        peer.close()
    assert len(peer.commands) == written  # not one publish reported unsent was sent later


# ------------------------------------------------------------------------------------------------
# An address that is down says when it was tried and when it will be tried again


def test_an_address_in_its_reconnect_delay_says_its_error_is_the_last_attempts(caplog):
    producer = Producer(refused_address(), pub_timeout=TIMEOUT, reconnect_interval=5.0)
    first = producer.pub_async("down", b"1")
    assert isinstance(first.exception(TIMEOUT), ConnectionClosedError)
    second = producer.pub_async("down", b"2")  # within the reconnect delay: not tried again
    message = str(second.exception(TIMEOUT))
    assert "the last connection attempt's error" in message, message
    assert "s ago" in message and "the next attempt is in" in message, message
    producer.close()
