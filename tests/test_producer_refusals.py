"""What nsqd refuses, and what is around it: publishes queued behind one that nsqd refused
fatally are sent again (nsqd answers in order and closes the connection after a fatal error, so
it processed none of them), ``pub_async`` as ``pub()`` does; a body above nsqd's limits is
refused at the call, before any byte is written, so nothing around it is disturbed."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import wait
from typing import Any

import pytest

from nsqclient import Producer
from nsqclient.errors import ConnectionClosedError, UnauthorizedError
from nsqclient.testing.auth_server import AuthServer
from nsqclient.testing.helpers import consume, message_count

#: Seconds: the bound of every wait; reached only when something is broken.
TIMEOUT = 10.0
SECRET = "s3cret"
#: the secret may publish to "allowed" and nothing else: E_UNAUTHORIZED (fatal) for the rest
GRANTS = {
    SECRET: {
        "authorizations": [
            {"topic": "^allowed$", "channels": [".*"], "permissions": ["publish", "subscribe"]}
        ]
    }
}


@pytest.fixture
def producers() -> Iterator[Any]:
    """``make(addresses, **options) -> Producer``; every producer is closed at teardown."""
    made: list[Producer] = []

    def make(addresses: Any, **options: Any) -> Producer:
        producer = Producer(addresses, **options)
        made.append(producer)
        return producer

    yield make
    for producer in made:
        producer.close(timeout=2.0)


@pytest.fixture
def authorizing(nsq_cluster_factory: Any) -> Iterator[Any]:
    """A cluster whose nsqd's auth server lets ``SECRET`` publish to "allowed" only."""
    with AuthServer(GRANTS) as auth:
        yield nsq_cluster_factory(lookupd=False, auth_http_address=auth.address)


# ------------------------------------------------------------------------------------------------
# Publishes queued behind a fatal error are sent again


def test_pub_async_behind_a_fatal_refusal_is_sent_again_in_order(authorizing, producers):
    node = authorizing.nsqd
    p = producers(node.tcp_address, auth_secret=SECRET, pub_timeout=TIMEOUT)
    p.pub("allowed", b"warm up")
    before = [p.pub_async("allowed", b"%d" % i) for i in range(50)]
    refused = p.pub_async("denied", b"refused")
    behind = [p.pub_async("allowed", b"%d" % i) for i in range(50, 100)]
    done, not_done = wait([*before, refused, *behind], TIMEOUT)
    assert not not_done
    assert isinstance(refused.exception(0), UnauthorizedError)
    outcomes = [f.exception(0) for f in (*before, *behind)]
    assert outcomes == [None] * 100, [e for e in outcomes if e is not None][:3]
    assert message_count(node, "allowed") == 101  # each stored once
    bodies = consume(node, "allowed", 101, auth_secret=SECRET)
    assert bodies == [b"warm up", *(b"%d" % i for i in range(100))]  # call order kept
    p.close()  # nothing undelivered but the refused one, whose outcome was taken


def test_publishes_from_many_threads_behind_fatal_refusals_all_arrive(authorizing, producers):
    # pub_async and pub() from several threads, with a refused publish now and then: no
    # allowed publish fails as "not processed" (each is sent again), none is stored twice.
    # Real nsqd closes with commands still unread in its socket under this load, so that the
    # kernel resets the connection and may drop the error frame it had just written: the
    # client then never learns why, and what was in flight is unknown (maybe_processed=True),
    # as after any reset.  The embedded nsqd's error always arrives.
    node = authorizing.nsqd
    p = producers(node.tcp_address, auth_secret=SECRET, pub_timeout=TIMEOUT)
    p.pub("allowed", b"warm up")
    ok, unknown, wrong = [0], [0], []
    lock = threading.Lock()

    def record(exc: BaseException | None, allowed: bool) -> None:
        with lock:
            if allowed and exc is None:
                ok[0] += 1
            elif isinstance(exc, ConnectionClosedError) and exc.maybe_processed:
                unknown[0] += 1
            elif allowed or type(exc) is not UnauthorizedError:
                wrong.append(exc or AssertionError("a denied publish was stored"))

    def work(i: int) -> None:
        futures = []
        for j in range(200):
            if j % 50 == 25:
                futures.append((p.pub_async("denied", b"no"), False))
            elif i % 2:
                futures.append((p.pub_async("allowed", b"%d-%d" % (i, j)), True))
            else:
                try:
                    p.pub("allowed", b"%d-%d" % (i, j))
                except BaseException as exc:
                    record(exc, True)
                else:
                    record(None, True)
        for future, allowed in futures:
            record(future.exception(TIMEOUT), allowed)

    threads = [threading.Thread(target=work, args=(i,), name=f"test-fatal-{i}") for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT * 3)
    assert not any(t.is_alive() for t in threads)
    assert wrong == [], wrong[:3]
    if authorizing.kind == "embedded":
        assert unknown[0] == 0
    assert ok[0] <= message_count(node, "allowed") - 1 <= ok[0] + unknown[0]


def test_a_publish_behind_a_connection_lost_without_nsqd_error_is_not_resent(nsqd, producers):
    # Only nsqd's fatal error proves what was behind it unprocessed: a connection dropped
    # without one leaves the publishes in flight unknown (maybe_processed=True), not resent.
    node = nsqd.nsqd
    if nsqd.kind != "embedded":
        pytest.skip("needs the embedded nsqd's drop_connections")
    p = producers(node.tcp_address, pub_timeout=TIMEOUT)
    p.pub("p_lost", b"warm up")
    nsqd.stall_nsqd(0)
    try:
        futures = [p.pub_async("p_lost", b"%d" % i) for i in range(20)]
        nsqd.drop_connections(0)
        wait(futures, TIMEOUT)
    finally:
        nsqd.unstall_nsqd(0)
    for future in futures:
        exc = future.exception(0)
        assert isinstance(exc, ConnectionClosedError) and exc.maybe_processed, exc
