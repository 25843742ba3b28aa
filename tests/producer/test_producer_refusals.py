"""What nsqd refuses, and what is around it: publishes queued behind one that nsqd refused
fatally are sent again (nsqd answers in order and closes the connection after a fatal error, so
it processed none of them), ``pub_async`` as ``pub()`` does; a body above nsqd's limits is
refused at the call, before any byte is written, so nothing around it is disturbed."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent.futures import wait
from typing import Any

import pytest

from nsqclient import Consumer, Producer
from nsqclient.errors import (
    BadBodyError,
    BadMessageError,
    ConnectionClosedError,
    UnauthorizedError,
)
from nsqclient.testing.auth_server import AuthServer
from nsqclient.testing.helpers import consume, free_port, message_count
from nsqclient.testing.waiting import wait_for

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


# ------------------------------------------------------------------------------------------------
# A body above the limits is refused at the call, before any byte is written

MIB = 1024 * 1024


def test_a_body_above_nsqds_default_is_refused_at_the_call_beside_other_publishes(nsqd, producers):
    node = nsqd.nsqd
    p = producers(node.tcp_address, pub_timeout=TIMEOUT)
    p.pub("p_big_beside", b"warm up")
    futures = []
    for i in range(100):
        futures.append(p.pub_async("p_big_beside", b"%d" % i))
        if i == 50:
            with pytest.raises(BadMessageError) as info:
                p.pub_async("p_big_beside", b"B" * (2 * MIB))
    message = str(info.value)
    assert message.startswith("E_BAD_MESSAGE PUB message too big 2097152 > 1048576"), message
    assert "max_msg_size" in message and "--max-msg-size" in message, message
    done, not_done = wait(futures, TIMEOUT)
    assert not not_done
    assert [f.exception(0) for f in futures] == [None] * 100
    assert message_count(node, "p_big_beside") == 101
    [entry] = p.stats()["nsqd"]
    assert entry["connects"] == 1 and entry["connected"]  # nothing was disturbed


def test_every_publish_form_is_checked_before_anything_is_sent(producers):
    # No nsqd at all: a publish that passed the check would fail to connect instead.
    p = producers(f"127.0.0.1:{free_port()}", max_msg_size=100, max_body_size=300)
    with pytest.raises(BadMessageError, match=r"PUB message too big 101 > 100.*max_msg_size"):
        p.pub("t", b"x" * 101)
    with pytest.raises(BadMessageError, match="PUB message too big 101 > 100"):
        p.pub("t", "é" * 50 + "x")  # str: its UTF-8 bytes count
    with pytest.raises(BadMessageError, match="DPUB message too big 101 > 100"):
        p.dpub("t", b"x" * 101, delay=1.0)
    with pytest.raises(BadMessageError, match="MPUB message too big 101 > 100"):
        p.mpub("t", [b"ok", b"x" * 101])
    with pytest.raises(BadBodyError, match=r"MPUB body too big 316 > 300.*max_body_size"):
        p.mpub("t", [b"x" * 100] * 3)
    with pytest.raises(BadMessageError):
        p.pub_async("t", b"x" * 101)
    with pytest.raises(BadMessageError):
        p.dpub_async("t", b"x" * 101, delay=1.0)
    with pytest.raises(BadBodyError):
        p.mpub_async("t", [b"x" * 100] * 3)
    stats = p.stats()
    assert (stats["max_msg_size"], stats["max_body_size"]) == (100, 300)
    assert stats["nsqd"][0]["failures"] == 0 and stats["bytes_out"] == 0  # never tried
    fits = p.mpub_async("t", [b"x" * 100, b"x" * 96])  # 4 + 8 + 196 = 208: goes to nsqd
    assert isinstance(fits.exception(TIMEOUT), ConnectionClosedError)  # none listens


def test_nsqds_own_limits_are_learned_from_its_http_port(nsq_cluster_factory, producers):
    cluster = nsq_cluster_factory(lookupd=False, max_msg_size=1024, max_body_size=4096)
    node = cluster.nsqd
    p = producers(node.tcp_address, nsqd_http_addresses=node.http_address, pub_timeout=TIMEOUT)
    assert p.stats()["max_msg_size"] == MIB  # the option's default until nsqd said
    p.pub("p_learned", b"connects")
    wait_for(lambda: p.stats()["max_msg_size"] == 1024, TIMEOUT)
    stats = p.stats()
    assert stats["max_body_size"] == 4096
    assert (stats["nsqd"][0]["max_msg_size"], stats["nsqd"][0]["max_body_size"]) == (1024, 4096)
    behind = [p.pub_async("p_learned", b"%d" % i) for i in range(20)]
    with pytest.raises(BadMessageError, match=f"nsqd {node.tcp_address}'s --max-msg-size"):
        p.pub_async("p_learned", b"x" * 1025)
    with pytest.raises(BadBodyError, match="MPUB body too big"):
        p.mpub("p_learned", [b"x" * 1000] * 5)
    p.pub("p_learned", b"x" * 1024)
    assert [f.result(TIMEOUT) for f in behind] == [b"OK"] * 20
    assert message_count(node, "p_learned") == 22
    assert p.stats()["nsqd"][0]["connects"] == 1


def test_the_limits_are_learned_through_lookupd(nsq_cluster_factory, producers):
    cluster = nsq_cluster_factory(max_msg_size=2048)
    lookupd = cluster.lookupd
    p = producers(None, lookupd_http_addresses=[lookupd.http_address], pub_timeout=TIMEOUT)
    p.pub("p_learned_lookup", b"connects")
    wait_for(lambda: p.stats()["max_msg_size"] == 2048, TIMEOUT)
    with pytest.raises(BadMessageError, match="too big 2049 > 2048"):
        p.pub("p_learned_lookup", b"x" * 2049)
    with pytest.raises(BadMessageError, match="too big 2049 > 2048"):
        p.pub_async("p_learned_lookup", b"x" * 2049)


def test_a_given_option_is_honoured_and_a_lower_nsqd_limit_enforced(nsq_cluster_factory, producers):
    cluster = nsq_cluster_factory(lookupd=False, max_msg_size=2 * MIB)
    node = cluster.nsqd
    body = b"x" * (MIB + MIB // 2)

    def learned(**options: Any) -> Producer:
        p = producers(node.tcp_address, nsqd_http_addresses=node.http_address, **options)
        p.pub("p_given", b"connects")
        wait_for(lambda: p.stats()["nsqd"][0]["max_msg_size"] is not None, TIMEOUT)
        return p

    # Left at its default, the option gives way to nsqd's higher limit.
    assert learned().pub("p_given", body) is None
    # Given, it is the client's own check, even where nsqd would take more.
    with pytest.raises(BadMessageError, match=r"the max_msg_size option \(nsqd takes up to"):
        learned(max_msg_size=MIB).pub("p_given", body)
    # Given higher than nsqd's, nsqd's is enforced too: nsqd would refuse it anyway.
    higher = learned(max_msg_size=10 * MIB)
    assert higher.stats()["max_msg_size"] == 2 * MIB
    with pytest.raises(BadMessageError, match="--max-msg-size"):
        higher.pub("p_given", b"x" * (2 * MIB + 1))
    assert message_count(node, "p_given") == 3 + 1


def test_an_nsqd_http_port_that_does_not_answer_changes_nothing(nsqd, producers, caplog):
    node = nsqd.nsqd
    p = producers(
        node.tcp_address, nsqd_http_addresses=f"127.0.0.1:{free_port()}", pub_timeout=TIMEOUT
    )
    caplog.set_level(logging.INFO, logger="nsqclient.producer")
    p.pub("p_no_http", b"x")
    wait_for(lambda: any("size limits" in r.getMessage() for r in caplog.records), TIMEOUT)
    assert p.stats()["max_msg_size"] == MIB
    assert p.pub("p_no_http", b"y") is None


def test_nsqd_http_addresses_are_one_per_tcp_address():
    with pytest.raises(ValueError, match="one HTTP address per TCP address"):
        Producer(["127.0.0.1:4150", "127.0.0.1:4152"], nsqd_http_addresses="127.0.0.1:4151")
    with pytest.raises(TypeError, match="max_msg_size is a Producer option"):
        Consumer("t", "c", lambda m: None, nsqd_tcp_addresses="127.0.0.1:4150", max_msg_size=1)
