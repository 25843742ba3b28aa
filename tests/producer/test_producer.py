"""Producer against a broker (embedded NSQ, or real nsqd with NSQ_BIN_DIR).

Every publish is accounted for on the server side (/stats message_count or depth, or the bodies
consumed back).  Fault controls (stall) exist only in the embedded NSQ; those tests are marked
embedded_only.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from nsqclient.conn._connection import Connection
from nsqclient.errors import (
    BadMessageError,
    ConnectionClosedError,
    InvalidError,
    NSQTimeoutError,
)
from nsqclient.producer._producer import Producer
from nsqclient.testing.helpers import (
    consume,
    free_port,
    message_count,
    nsqd_stats,
    run_together,
    topic_stats,
)
from nsqclient.testing.waiting import wait_for

#: Seconds: the bound of every wait; reached only when something is broken.
TIMEOUT = 10.0


# ------------------------------------------------------------------------------------------------
# Helpers


def depth(node: Any, topic: str) -> int:
    """Messages stored in ``topic`` (no channel): survives an nsqd restart."""
    stats = topic_stats(node, topic)
    return 0 if stats is None else stats["depth"]


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A listening socket that never accepts by itself: shows whether anyone connected, and
    plays a hung nsqd (the kernel completes the TCP handshake, nothing is ever answered)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s


def address_of(sock: socket.socket) -> str:
    return f"127.0.0.1:{sock.getsockname()[1]}"


def nobody_connected(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        peer, _ = sock.accept()
    except BlockingIOError:
        return True
    peer.close()
    return False


def connection_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith(("nsq-reader-", "nsq-writer-"))}


class Outcomes:
    """Thread-safe tally of publish outcomes for the fault tests."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ok = 0
        self.ambiguous = 0  # may or may not be stored
        self.refused = 0  # provably not stored
        self.unexpected: list[BaseException] = []

    def record(self, exc: BaseException | None) -> None:
        with self.lock:
            if exc is None:
                self.ok += 1
            elif isinstance(exc, NSQTimeoutError):
                self.ambiguous += 1
            elif isinstance(exc, ConnectionClosedError):
                if exc.maybe_processed:
                    self.ambiguous += 1
                else:
                    self.refused += 1
            else:
                self.unexpected.append(exc)


# ------------------------------------------------------------------------------------------------
# pub, mpub, dpub


def test_pub_mpub_dpub_return_none_and_are_stored(nsqd, producers):
    node = nsqd.nsqd
    p = producers(node.tcp_address)
    assert p.pub("p_basic", b"one") is None
    assert p.mpub("p_basic", [b"two", b"three"]) is None
    assert p.dpub("p_basic", b"later", delay=60.0) is None
    assert p.dpub("p_basic", b"now", delay=0) is None
    assert message_count(node, "p_basic") == 5
    assert sorted(consume(node, "p_basic", 4)) == sorted([b"one", b"two", b"three", b"now"])
    [channel] = topic_stats(node, "p_basic")["channels"]
    assert channel["deferred_count"] == 1


def test_bodies_of_every_accepted_type(nsqd, producers):
    node = nsqd.nsqd
    p = producers(node.tcp_address)
    text = "héllo wörld ✓"
    p.pub("p_types", text)
    p.pub("p_types", bytearray(b"from a bytearray"))
    p.pub("p_types", memoryview(b"xxfrom a memoryviewxx")[2:-2])
    p.mpub("p_types", ["mpub str ✓", bytearray(b"mpub ba"), memoryview(b"mpub mv")])
    p.dpub("p_types", "dpub str ✓", delay=0)
    expected = [
        text.encode("utf-8"),
        b"from a bytearray",
        b"from a memoryview",
        "mpub str ✓".encode(),
        b"mpub ba",
        b"mpub mv",
        "dpub str ✓".encode(),
    ]
    assert sorted(consume(node, "p_types", len(expected))) == sorted(expected)


BAD_CALLS = [
    ("pub int", TypeError, lambda p: p.pub("t", 42)),
    ("pub None", TypeError, lambda p: p.pub("t", None)),
    ("pub dict", TypeError, lambda p: p.pub("t", {"a": 1})),
    ("pub empty", ValueError, lambda p: p.pub("t", b"")),
    ("pub empty str", ValueError, lambda p: p.pub("t", "")),
    ("pub bad topic", ValueError, lambda p: p.pub("bad topic!", b"x")),
    ("pub long topic", ValueError, lambda p: p.pub("t" * 65, b"x")),
    ("pub empty topic", ValueError, lambda p: p.pub("", b"x")),
    ("pub None topic", ValueError, lambda p: p.pub(None, b"x")),
    ("mpub empty list", ValueError, lambda p: p.mpub("t", [])),
    ("mpub empty body", ValueError, lambda p: p.mpub("t", [b"a", b""])),
    ("mpub int body", TypeError, lambda p: p.mpub("t", [b"a", 1])),
    ("mpub single bytes", TypeError, lambda p: p.mpub("t", b"abc")),
    ("mpub bad topic", ValueError, lambda p: p.mpub("bad/topic", [b"x"])),
    ("dpub negative", ValueError, lambda p: p.dpub("t", b"x", delay=-1)),
    ("dpub bool delay", ValueError, lambda p: p.dpub("t", b"x", delay=True)),
    ("dpub str delay", ValueError, lambda p: p.dpub("t", b"x", delay="5")),
    ("dpub empty", ValueError, lambda p: p.dpub("t", b"", delay=1)),
    ("dpub bad topic", ValueError, lambda p: p.dpub("a b", b"x", delay=1)),
    ("pub_async int", TypeError, lambda p: p.pub_async("t", 1)),
    ("pub_async bad topic", ValueError, lambda p: p.pub_async("bad topic", b"x")),
    ("mpub_async empty", ValueError, lambda p: p.mpub_async("t", [])),
    ("dpub_async negative", ValueError, lambda p: p.dpub_async("t", b"x", delay=-0.5)),
]


@pytest.mark.parametrize("name,error,call", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_input_fails_before_anything_is_sent(name, error, call, listener):
    # The "nsqd" is a bare listener: had the producer dialled it, accept() would show it.
    p = Producer(address_of(listener))
    try:
        with pytest.raises(error):
            call(p)
        assert nobody_connected(listener)
        assert p.stats()["nsqd"][0]["connected"] is False
    finally:
        p.close(timeout=1.0)


def test_invalid_topic_is_refused_and_the_server_sees_no_client(nsqd, producers):
    node = nsqd.nsqd
    p = producers(node.tcp_address)
    with pytest.raises(ValueError, match="topic"):
        p.pub("no spaces allowed", b"x")
    assert p.stats()["nsqd"][0]["connected"] is False
    assert not nsqd_stats(node).get("producers")
    assert not nsqd_stats(node).get("topics")


def test_server_refusal_arrives_typed(nsq_cluster_factory, producers):
    cluster = nsq_cluster_factory(lookupd=False, max_req_timeout=10.0)
    node = cluster.nsqd
    p = producers(node.tcp_address)
    with pytest.raises(InvalidError, match="DPUB"):
        p.dpub("p_dpub_range", b"x", delay=20.0)
    p.pub("p_dpub_range", b"after")  # a fresh connection
    assert message_count(node, "p_dpub_range") == 1


def test_oversized_body_is_refused_and_the_producer_recovers(nsq_cluster_factory, producers):
    cluster = nsq_cluster_factory(lookupd=False, max_msg_size=1024)
    node = cluster.nsqd
    p = producers(node.tcp_address)
    p.pub("p_big", b"fits")
    with pytest.raises(BadMessageError):
        p.pub("p_big", b"x" * 1025)
    with pytest.raises(BadMessageError):
        p.mpub("p_big", [b"ok", b"y" * 2048])
    p.pub("p_big", b"x" * 1024)
    f = p.pub_async("p_big", b"z" * 5000)
    assert isinstance(f.exception(TIMEOUT), BadMessageError)
    p.pub("p_big", b"last")
    assert message_count(node, "p_big") == 3


def test_concurrent_publishes_survive_a_refused_one(nsq_cluster_factory, producers):
    # A refused publish makes nsqd close the shared connection.  Publishes from other threads
    # queued behind it were provably not processed: pub() must resend them, so none of them
    # fails and none is stored twice.
    cluster = nsq_cluster_factory(lookupd=False, max_msg_size=1024)
    node = cluster.nsqd
    p = producers(node.tcp_address)
    p.pub("p_conc_big", b"warm up")
    stop = threading.Event()
    outcomes = Outcomes()

    def small() -> None:
        while not stop.is_set():
            try:
                p.pub("p_conc_small", b"s")
            except Exception as exc:  # anything but NSQError is recorded as unexpected
                outcomes.record(exc)
            else:
                outcomes.record(None)

    workers = [threading.Thread(target=small, name=f"test-small-{i}") for i in range(4)]
    for w in workers:
        w.start()
    try:
        refused = 0
        for _ in range(20):
            wait_for(lambda n=outcomes.ok: outcomes.ok > n, TIMEOUT)
            with pytest.raises(BadMessageError):
                p.pub("p_conc_big", b"B" * 4096)
            refused += 1
    finally:
        stop.set()
        for w in workers:
            w.join(TIMEOUT)
    assert refused == 20
    assert not outcomes.unexpected, outcomes.unexpected[:3]
    failed = outcomes.ambiguous + outcomes.refused
    assert failed == 0, (
        f"{failed} concurrent publishes failed ({outcomes.ambiguous} 'maybe processed', "
        f"{outcomes.refused} 'not processed') instead of being resent"
    )
    assert message_count(node, "p_conc_small") == outcomes.ok
    assert message_count(node, "p_conc_big") == 1


def test_async_publishes_resolve_to_ok(nsqd, producers):
    node = nsqd.nsqd
    p = producers(node.tcp_address)
    futures = [p.pub_async("p_async", b"a%d" % i) for i in range(100)]
    futures.append(p.mpub_async("p_async", [b"m1", b"m2", b"m3"]))
    futures.append(p.dpub_async("p_async", b"d", delay=0.1))
    assert all(isinstance(f, Future) for f in futures)
    assert [f.result(TIMEOUT) for f in futures] == [b"OK"] * 102
    assert message_count(node, "p_async") == 104


def test_stats_count_published_messages(nsqd, producers):
    p = producers(nsqd.nsqd.tcp_address)
    p.pub("p_stats", b"1")
    p.mpub("p_stats", [b"2", b"3", b"4"])
    p.pub_async("p_stats", b"5").result(TIMEOUT)
    p.dpub("p_stats", b"6", delay=0.0)
    stats = p.stats()
    [entry] = stats["nsqd"]
    assert stats["messages_sent"] == entry["messages_sent"] == 6
    assert entry["connected"] is True and entry["connection"]["pending_requests"] == 0


def test_many_threads_every_publish_accounted_for(nsqd, producers):
    node = nsqd.nsqd
    p = producers(node.tcp_address)

    def work(i: int) -> None:
        for j in range(2000):
            p.pub("p_threads", b"%d-%d" % (i, j))

    run_together(work, 16, "test-pub", timeout=60.0)
    assert message_count(node, "p_threads") == 16 * 2000
    # One shared connection, not one per thread.
    assert len(nsqd_stats(node)["producers"]) == 1


# ------------------------------------------------------------------------------------------------
# Failures, failover, reconnects


def test_nsqd_killed_mid_stream(nsq_cluster_factory, producers):
    cluster = nsq_cluster_factory(lookupd=False)
    node = cluster.nsqd
    p = producers(node.tcp_address, pub_timeout=5.0)
    stop = threading.Event()
    outcomes = Outcomes()

    def work(i: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                p.pub("p_killed", b"%d-%d" % (i, n))
            except Exception as exc:  # anything but NSQError is recorded as unexpected
                outcomes.record(exc)
            else:
                outcomes.record(None)

    workers = [threading.Thread(target=work, args=(i,), name=f"test-kill-{i}") for i in range(8)]
    for w in workers:
        w.start()
    try:
        wait_for(lambda: outcomes.ok >= 300, TIMEOUT)
        cluster.stop_nsqd(0)
        down = outcomes.ok + outcomes.ambiguous + outcomes.refused
        wait_for(lambda: outcomes.ok + outcomes.ambiguous + outcomes.refused > down + 50, TIMEOUT)
        cluster.start_nsqd(0)
        restarted = outcomes.ok
        wait_for(lambda: outcomes.ok >= restarted + 300, TIMEOUT)
    finally:
        stop.set()
        for w in workers:
            w.join(TIMEOUT)
    assert not any(w.is_alive() for w in workers)
    assert not outcomes.unexpected, outcomes.unexpected[:3]
    stored = depth(node, "p_killed")
    assert outcomes.ok <= stored <= outcomes.ok + outcomes.ambiguous, vars(outcomes)


def test_failover_to_a_live_address(nsqd, producers):
    node = nsqd.nsqd
    dead = f"127.0.0.1:{free_port()}"
    for addresses in ([dead, node.tcp_address], [node.tcp_address, dead]):
        p = producers(addresses)
        for i in range(10):
            assert p.pub("p_failover", b"%d" % i) is None
    assert message_count(node, "p_failover") == 20


def test_connection_closing_just_before_the_send_is_replaced(nsqd, producers, monkeypatch):
    # The connection a publish picked closes before the command is queued (nsqd went away a
    # moment earlier, a fatal error from another thread...).  Nothing was sent, so the
    # publish must go out on a fresh connection instead of failing.
    node = nsqd.nsqd
    p = producers(node.tcp_address)
    p.pub("p_race", b"first")
    original = Connection.offer
    closed: list[Connection] = []

    def offer(self: Connection, command: bytes, future, messages: int = 0) -> bool:
        if not closed:
            closed.append(self)
            self.close(timeout=1.0)  # the race, made deterministic
        return original(self, command, future, messages)

    monkeypatch.setattr(Connection, "offer", offer)
    p.pub("p_race", b"second")
    assert closed and closed[0].is_closed
    assert message_count(node, "p_race") == 2


def test_a_fatal_answer_before_request_returns_is_not_resent(
    nsq_cluster_factory, producers, monkeypatch
):
    # A publish on an idle connection is written by the caller, so nsqd may refuse it (and
    # close the connection) before offer() has returned.  That refusal is the publish's
    # answer; it must not be mistaken for "closed before sending" and sent again.
    cluster = nsq_cluster_factory(lookupd=False, max_msg_size=1024)
    node = cluster.nsqd
    p = producers(node.tcp_address)
    p.pub("p_fast_refusal", b"warm up")
    original = Connection.offer
    sent: list[bytes] = []

    def offer(self: Connection, command: bytes, future, messages: int = 0) -> bool:
        sent.append(command)
        taken = original(self, command, future, messages)
        # The reader was quicker than this thread.  (A blocking pub() that took the reading
        # before writing reads the refusal itself, after offer() returns: nothing to race.)
        if taken and not getattr(future, "reading", False):
            future.exception(TIMEOUT)
            wait_for(lambda: not self.is_connected, TIMEOUT)
        return taken

    monkeypatch.setattr(Connection, "offer", offer)
    future = p.pub_async("p_fast_refusal", b"z" * 5000)
    assert isinstance(future.exception(0), BadMessageError)
    with pytest.raises(BadMessageError):
        p.pub("p_fast_refusal", b"y" * 5000)
    assert len(sent) == 2  # each sent once
    monkeypatch.undo()
    p.pub("p_fast_refusal", b"after")
    assert message_count(node, "p_fast_refusal") == 2


def test_publishes_go_round_robin(nsq_cluster_factory, producers):
    cluster = nsq_cluster_factory(nsqd_count=2, lookupd=False)
    p = producers([node.tcp_address for node in cluster.nsqds])
    for i in range(20):
        p.pub("p_rr", b"%d" % i)
    assert [message_count(node, "p_rr") for node in cluster.nsqds] == [10, 10]


def test_all_addresses_down_names_each(producers):
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    p = producers(dead)
    with pytest.raises(ConnectionClosedError) as info:
        p.pub("p_down", b"x")
    for address in dead:
        assert address in str(info.value)
    assert info.value.maybe_processed is False, "nothing was sent: the outcome is known"
    with pytest.raises(ConnectionClosedError):
        p.pub_async("p_down", b"x").result(TIMEOUT)


def test_long_outage_keeps_raising_connection_closed(producers):
    # Every publish during an outage fails the same documented way, however long it lasts
    # (the reconnect delay grows with consecutive failures and must stay bounded).
    p = producers(f"127.0.0.1:{free_port()}", reconnect_interval=0.001)
    for attempt in range(1100):
        try:
            p.pub("p_outage", b"x")
        except ConnectionClosedError:
            continue
        except Exception as exc:
            pytest.fail(f"attempt {attempt}: {type(exc).__name__}: {exc}")
        pytest.fail("a publish to a closed port succeeded")


def test_reconnect_after_restart(nsq_cluster_factory, producers):
    cluster = nsq_cluster_factory(lookupd=False)
    node = cluster.nsqd
    p = producers(node.tcp_address)
    p.pub("p_restart", b"before")
    cluster.stop_nsqd(0)
    wait_for(lambda: not p.stats()["nsqd"][0]["connected"], TIMEOUT)
    with pytest.raises(ConnectionClosedError):
        p.pub("p_restart", b"while down")
    cluster.start_nsqd(0)
    p.pub("p_restart", b"after")
    p.mpub("p_restart", [b"after 2", b"after 3"])
    assert depth(node, "p_restart") == 4
    assert p.stats()["nsqd"][0]["connected"] is True


def test_close_then_publish_raises(nsqd, producers):
    node = nsqd.nsqd
    p = producers(node.tcp_address)
    p.pub("p_close", b"x")
    p.close()
    assert p.closed
    with pytest.raises(ConnectionClosedError) as info:
        p.pub("p_close", b"y")
    assert info.value.maybe_processed is False, "nothing was sent: the outcome is known"
    with pytest.raises(ConnectionClosedError):
        p.mpub("p_close", [b"y"])
    with pytest.raises(ConnectionClosedError):
        p.dpub("p_close", b"y", delay=1)
    with pytest.raises(ConnectionClosedError):
        p.pub_async("p_close", b"y")
    p.close()  # twice is fine
    assert message_count(node, "p_close") == 1


def test_close_waits_for_publishes_in_flight(nsqd):
    node = nsqd.nsqd
    p = Producer(node.tcp_address)
    futures = [p.pub_async("p_close_flight", b"%d" % i) for i in range(500)]
    p.close(timeout=TIMEOUT)
    assert [f.result(0) for f in futures] == [b"OK"] * 500
    assert message_count(node, "p_close_flight") == 500


def test_context_manager_closes_and_joins_threads(nsqd):
    node = nsqd.nsqd
    before = connection_threads()
    with Producer(node.tcp_address) as p:
        p.pub("p_with", b"x")
        mine = connection_threads() - before
        assert len(mine) == 2
    assert p.closed
    assert not any(t.is_alive() for t in mine)
    with pytest.raises(ConnectionClosedError):
        p.pub("p_with", b"y")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_fork_child_publishes_with_its_own_connection(nsqd, producers):
    node = nsqd.nsqd
    p = producers(node.tcp_address)
    p.pub("p_fork", b"parent before")
    parent_conn = [c["remote_address"] for c in nsqd_stats(node)["producers"]]
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            p.pub("p_fork", b"child", timeout=5.0)
            p.close(timeout=5.0)
            code = 0
        finally:
            os._exit(code)
    code = wait_child(pid, TIMEOUT)
    assert code == 0, "the child could not publish"
    p.pub("p_fork", b"parent after")
    assert message_count(node, "p_fork") == 3
    assert sorted(consume(node, "p_fork", 3)) == [b"child", b"parent after", b"parent before"]
    # The parent kept its connection; the child's was its own and is gone with it.
    wait_for(
        lambda: [c["remote_address"] for c in nsqd_stats(node)["producers"]] == parent_conn,
        TIMEOUT,
        message=lambda: f"{nsqd_stats(node)['producers']} != {parent_conn}",
    )


def wait_child(pid: int, timeout: float) -> int:
    """Reap the child ``pid`` and return its exit code; kill it if it outlives ``timeout``."""

    def reaped() -> tuple[int] | None:
        done, status = os.waitpid(pid, os.WNOHANG)
        return None if done == 0 else (os.waitstatus_to_exitcode(status),)

    try:
        return wait_for(reaped, timeout, message="the forked child did not exit")[0]
    except AssertionError:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise


# ------------------------------------------------------------------------------------------------
# Timeouts


@pytest.mark.embedded_only
def test_pub_timeout_on_a_stalled_nsqd(nsqd, producers):
    node = nsqd.nsqd
    p = producers(node.tcp_address)
    p.pub("p_stall", b"before")
    nsqd.stall_nsqd(0)
    try:
        start = time.monotonic()
        with pytest.raises(NSQTimeoutError):
            p.pub("p_stall", b"stalled", timeout=0.5)
        assert time.monotonic() - start < 5.0, "the timeout was not honoured"
    finally:
        nsqd.unstall_nsqd(0)
    # The connection is still in step: the late answer goes to the abandoned request.
    p.pub("p_stall", b"after")
    assert message_count(node, "p_stall") == 3


def test_pub_timeout_bounds_the_connect_too(listener, producers):
    # A hung nsqd that accepts TCP and never answers the handshake.
    p = producers(address_of(listener), handshake_timeout=4.0)
    start = time.monotonic()
    with pytest.raises(NSQTimeoutError):
        p.pub("p_hung", b"x", timeout=0.5)
    assert time.monotonic() - start < 3.0, "pub(timeout=0.5) waited for the whole handshake"


@pytest.mark.embedded_only
def test_cancelled_async_publish_is_not_stored(nsqd, producers):
    # cancel() returning True promises the work will not happen; a PUB already queued for
    # the writer cannot be taken back, so either cancel() refuses or nothing is stored.
    node = nsqd.nsqd
    p = producers(node.tcp_address)
    p.pub("p_cancel", b"warm up")
    nsqd.stall_nsqd(0)
    try:
        future = p.pub_async("p_cancel", b"cancel me")
        cancelled = future.cancel()
    finally:
        nsqd.unstall_nsqd(0)
    p.pub("p_cancel", b"after")
    stored = message_count(node, "p_cancel")
    assert stored == (2 if cancelled else 3), f"cancel() said {cancelled}, nsqd stored {stored}"


def test_idle_producer_keeps_its_connection_through_heartbeats(nsqd, producers):
    node = nsqd.nsqd
    p = producers(node.tcp_address, heartbeat_interval=1.0)
    p.pub("p_idle", b"x")
    first = nsqd_stats(node)["producers"]
    sent = p.stats()["nsqd"][0]["bytes_out"]
    wait_for(lambda: p.stats()["nsqd"][0]["bytes_out"] >= sent + 3 * len(b"NOP\n"), TIMEOUT)
    p.pub("p_idle", b"y")
    [entry] = p.stats()["nsqd"]
    assert entry["connected"] and entry["failures"] == 0
    assert [c["remote_address"] for c in nsqd_stats(node)["producers"]] == [
        c["remote_address"] for c in first
    ]


def test_producer_options_are_validated():
    with pytest.raises(ValueError):
        Producer([])
    with pytest.raises(ValueError):
        Producer("no-port")
    with pytest.raises(TypeError, match="pub_timeout"):
        Producer("127.0.0.1:4150", pub_timeuot=1.0)
    with pytest.raises(ValueError):
        Producer("127.0.0.1:4150", pub_timeout=-1)
