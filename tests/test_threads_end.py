"""Every thread a client starts is gone one second after its ``stop()``/``close()`` returns
(issue 34), on every path: a normal stop, a fatal error's stop (``nsq-stop-on-error``), pull
and columnar Consumers, a Producer closed while a background connect (``nsq-connect-<address>``)
dials a blackholed address, while asynchronous publishes are in flight, or while a publish by
lookup waits for its retry (``nsq-pub-retry-<topic>``).  Against the
session's broker (embedded, or real binaries with NSQ_BIN_DIR); :func:`nsq_threads_gone` polls.
"""

from __future__ import annotations

import socket
import threading
import time
import types

import pytest

from nsqclient import Consumer, Producer
from nsqclient.config import Config
from nsqclient.conn import Connection, _handshake
from nsqclient.errors import ConnectionClosedError, NSQError, SubOrderIsMustError, UndeliveredError
from nsqclient.testing import EmbeddedNSQ
from nsqclient.testing.helpers import TIMEOUT, message_count, nsq_threads_gone, publish
from nsqclient.testing.waiting import wait_for


def alive(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


# ---------------------------------------------------------------------------- Consumers


def test_a_consumer_stopped_normally_leaves_no_thread(nsqd, consumers):
    node = nsqd.nsqd
    before = set(threading.enumerate())
    bodies = [b"%d" % i for i in range(20)]
    publish(node, "t_end", bodies)
    got: list[bytes] = []
    consumer = consumers(
        "t_end",
        "ch",
        lambda m: got.append(m.body),
        nsqd_tcp_addresses=node.tcp_address,
        lookupd_http_addresses=[nsqd.lookupd.http_url],
        lookupd_poll_interval=0.2,
        concurrency=3,
    )
    wait_for(lambda: len(got) == len(bodies), TIMEOUT)
    assert alive("nsq-worker-t_end/ch-") and alive("nsq-discovery-t_end/ch")
    consumer.stop(timeout=5.0)
    nsq_threads_gone(before)


def test_a_handler_left_running_by_stop_is_the_only_thread_left(nsqd, consumers):
    node = nsqd.nsqd
    before = set(threading.enumerate())
    publish(node, "t_held", [b"hold"])
    holding, release = threading.Event(), threading.Event()

    def handler(message) -> None:
        holding.set()
        release.wait(TIMEOUT)

    consumer = consumers("t_held", "ch", handler, nsqd_tcp_addresses=node.tcp_address)
    assert holding.wait(TIMEOUT)
    consumer.stop(timeout=0.2)  # gives up on the handler: its worker is left, on purpose
    nsq_threads_gone(before, left=("nsq-worker-t_held/ch-",))
    assert len(alive("nsq-worker-t_held/ch-")) == 1
    release.set()
    nsq_threads_gone(before)


def test_a_pull_consumer_stopped_leaves_no_thread(nsqd, pullers):
    node = nsqd.nsqd
    before = set(threading.enumerate())
    bodies = [b"%d" % i for i in range(10)]
    publish(node, "t_pull", bodies)
    consumer = pullers("t_pull", "ch", nsqd_tcp_addresses=node.tcp_address, max_in_flight=10)
    taken = []
    deadline = time.monotonic() + TIMEOUT
    while len(taken) < len(bodies) and time.monotonic() < deadline:
        taken.extend(consumer.take(len(bodies), timeout=0.2))
    assert sorted(m.body for m in taken) == sorted(bodies)
    consumer.finish_many(taken)
    consumer.stop(timeout=5.0)
    nsq_threads_gone(before)


def test_a_columnar_consumer_stopped_with_batches_unanswered_leaves_no_thread(nsqd, pullers):
    node = nsqd.nsqd
    before = set(threading.enumerate())
    publish(node, "t_col", [b"%d" % i for i in range(10)])
    consumer = pullers(
        "t_col", "ch", columnar=True, nsqd_tcp_addresses=node.tcp_address, max_in_flight=10
    )
    batches = wait_for(lambda: consumer.take_batches(5, timeout=0.2), TIMEOUT)
    assert sum(len(b) for b in batches) >= 1
    consumer.stop(timeout=1.0)  # what was taken and not answered: left to nsqd's msg_timeout
    nsq_threads_gone(before)


def test_a_consumer_stopped_while_it_dials_a_blackhole_leaves_no_thread(nsqd, consumers, blackhole):
    """A connect under way on ``nsq-connect-<key>`` (here one that would hang for its whole
    dial_timeout): stop() aborts it and joins its thread, rather than wait the dial out."""
    node = nsqd.nsqd
    before = set(threading.enumerate())
    consumer = consumers(
        "t_dial",
        "ch",
        lambda m: None,
        nsqd_tcp_addresses=[node.tcp_address, blackhole],
        dial_timeout=30.0,
    )
    wait_for(lambda: alive(f"nsq-connect-{blackhole}"), TIMEOUT)
    began = time.monotonic()
    consumer.stop(timeout=2.0)
    assert time.monotonic() - began < 2.0 + 1.0
    nsq_threads_gone(before)


def test_an_abort_that_lands_just_before_the_dial_begins_is_not_lost(monkeypatch):
    """``abort_connect()`` (from stop() or close()) coming after the dial's socket was handed
    over, but before its connect() started: shutting down a socket not yet connecting does
    not stop the connect that follows (on Linux connect() then even returns at once, the
    socket still in SYN_SENT).  The dial fails as aborted, rather than go on to a handshake
    that blocks its ``nsq-connect-*`` thread until ``handshake_timeout``."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    conn = Connection(f"127.0.0.1:{port}", Config(dial_timeout=30.0, handshake_timeout=5.0))

    class AbortedAsItConnects(socket.socket):
        def connect(self, address: object) -> None:
            conn.abort_connect()  # another thread's abort, at the worst moment
            super().connect(address)

    sockets = types.SimpleNamespace(**vars(socket))
    sockets.socket = AbortedAsItConnects
    monkeypatch.setattr(_handshake, "socket", sockets)
    began = time.monotonic()
    try:
        with pytest.raises(ConnectionClosedError, match="was aborted"):
            conn.connect()
    finally:
        listener.close()
    assert time.monotonic() - began < 1.0


@pytest.fixture
def youzan():
    with EmbeddedNSQ(youzan=True, nsqd_count=1, lookupd_count=1) as cluster:
        cluster.create_topic("t_must", partitions=2, replica=1, ordered=True)
        cluster.create_channel("t_must", "c")
        yield cluster


@pytest.mark.parametrize("how", ["by itself", "stop() meanwhile", "run()"])
def test_a_consumer_stopped_by_a_fatal_error_leaves_no_thread(youzan, how):
    """youzan's lookupd says the topic is ordered, the Consumer is not: it stops itself on
    ``nsq-stop-on-error``, which is joined like the rest."""
    before = set(threading.enumerate())
    consumer = Consumer(
        "t_must",
        "c",
        lambda m: None,
        lookupd_http_addresses=[youzan.lookupd.http_address],
        lookupd_poll_interval=0.1,
    )
    if how == "run()":
        with pytest.raises(SubOrderIsMustError):
            consumer.run()
    else:
        consumer.start()
        wait_for(lambda: consumer.error is not None, TIMEOUT)
        if how == "stop() meanwhile":
            consumer.stop(timeout=5.0)  # waits for nsq-stop-on-error and joins it
            assert not alive("nsq-stop-on-error")
        else:
            wait_for(lambda: not consumer.is_running, TIMEOUT)
    assert isinstance(consumer.error, SubOrderIsMustError)
    nsq_threads_gone(before)


# ---------------------------------------------------------------------------- Producers


def test_a_producer_closed_while_a_background_connect_dials_a_blackhole(nsqd, blackhole):
    """pub_async passes over an address not connected yet and connects it in the
    background; close() aborts that dial rather than waiting out its dial_timeout."""
    node = nsqd.nsqd
    before = set(threading.enumerate())
    producer = Producer([node.tcp_address, blackhole], dial_timeout=30.0)
    producer.pub("t_bh", b"first")  # round robin: the first publish goes to the nsqd
    future = producer.pub_async("t_bh", b"second")  # passes over the blackhole, warms it
    assert future.result(TIMEOUT) == b"OK"
    wait_for(lambda: alive(f"nsq-connect-{blackhole}"), TIMEOUT)
    began = time.monotonic()
    producer.close(timeout=2.0)
    assert time.monotonic() - began < 2.0 + 1.0
    nsq_threads_gone(before)


def test_a_producer_closed_while_its_backlog_dials_a_blackhole(blackhole):
    """The only address hangs: pub_async's publish waits in the backlog, whose job dials;
    close(timeout) gives up at its deadline, aborts the dial and joins the backlog."""
    before = set(threading.enumerate())
    producer = Producer([blackhole], dial_timeout=30.0, pub_timeout=30.0)
    future = producer.pub_async("t_bh", b"never")
    wait_for(lambda: alive("nsq-backlog-"), TIMEOUT)
    began = time.monotonic()
    with pytest.raises(UndeliveredError):
        producer.close(timeout=0.5)
    assert time.monotonic() - began < 0.5 + 1.0
    nsq_threads_gone(before)
    assert isinstance(future.exception(0), NSQError)


def test_a_producer_closed_with_async_publishes_in_flight_leaves_no_thread(nsqd):
    node = nsqd.nsqd
    before = set(threading.enumerate())
    producer = Producer(node.tcp_address)
    futures = [producer.pub_async("t_async", b"%d" % i) for i in range(500)]
    producer.close(timeout=5.0)
    nsq_threads_gone(before)
    assert all(f.result(0) == b"OK" for f in futures)


def test_a_producer_closed_while_nsqd_hangs_with_publishes_unanswered(nsqd):
    node = nsqd.nsqd
    before = set(threading.enumerate())
    producer = Producer(node.tcp_address, pub_timeout=30.0)
    producer.pub("t_hang", b"connect")
    nsqd.stall_nsqd(0)
    try:
        futures = [producer.pub_async("t_hang", b"%d" % i) for i in range(20)]
        with pytest.raises(UndeliveredError):
            producer.close(timeout=0.3)
        nsq_threads_gone(before)
    finally:
        nsqd.unstall_nsqd(0)
    assert all(f.done() for f in futures)


def test_a_producer_by_lookup_closed_while_it_may_still_ask_nsqd_its_limits(nsqd):
    """Publishing by lookup knows each nsqd's HTTP port and asks its size limits there on
    ``nsq-limits-<address>`` after the first connection: close() joins it."""
    before = set(threading.enumerate())
    producer = Producer(lookupd_http_addresses=[nsqd.lookupd.http_url])
    producer.pub("t_limits", b"x")
    assert (
        alive(f"nsq-limits-{nsqd.nsqd.tcp_address}") or producer.stats()["nsqd"][0]["max_msg_size"]
    )  # asking, or done asking
    producer.close(timeout=5.0)
    nsq_threads_gone(before)


def test_a_producer_by_lookup_closed_while_a_publish_waits_for_its_retry(nsqd):
    """No lookupd answers: pub_async's publish is tried again on ``nsq-pub-retry-<topic>``
    timers.  close() cancels the retry not due yet (its publish fails: nothing was sent) and
    joins the timers before it returns."""
    before = set(threading.enumerate())
    nsqd.stop_lookupd()
    producer = Producer(lookupd_http_addresses=[nsqd.lookupd.http_url], pub_timeout=30.0)
    future = producer.pub_async("t_retry", b"never")
    wait_for(lambda: alive("nsq-pub-retry-t_retry"), TIMEOUT)
    with pytest.raises(UndeliveredError):
        producer.close(timeout=0.0)
    assert not alive("nsq-pub-retry-")  # joined by close(), not merely ended by now
    nsq_threads_gone(before)
    error = future.exception(0)
    assert isinstance(error, ConnectionClosedError) and not error.maybe_processed
    assert "closed while the publish waited to be tried again" in str(error)


def test_a_retry_due_within_close_timeout_still_goes_out(nsqd):
    """close() waits for publishes in flight, those waiting for a retry by lookup too: a
    lookupd that answers again while close() waits lets the retry through."""
    node = nsqd.nsqd
    before = set(threading.enumerate())
    nsqd.stall_lookupd()
    producer = Producer(
        lookupd_http_addresses=[nsqd.lookupd.http_url],
        lookupd_request_timeout=0.2,
        pub_timeout=TIMEOUT * 2,
    )
    future = producer.pub_async("t_retry_ok", b"later")
    wait_for(lambda: alive("nsq-pub-retry-t_retry_ok"), TIMEOUT)
    raised: list[BaseException] = []

    def close() -> None:
        try:
            producer.close(timeout=TIMEOUT)
        except BaseException as exc:
            raised.append(exc)

    closer = threading.Thread(target=close, name="test-closer")
    closer.start()
    nsqd.unstall_lookupd()
    closer.join(TIMEOUT * 2)
    assert not closer.is_alive() and raised == []
    assert future.result(0) == b"OK"
    assert message_count(node, "t_retry_ok") == 1
    nsq_threads_gone(before)
