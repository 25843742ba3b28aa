"""The nsqd endpoints of a Producer and the writing of a command on them
(nsqclient/producer/_nsqd_pool.py): failover past an address that is down (warned once),
pub_async's never-blocking write, the backlog's fail-fast when every address waits out its
reconnect delay, and a closed pool."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

from nsqclient import protocol
from nsqclient.config import Config
from nsqclient.conn._futures import RequestFuture
from nsqclient.errors import ConnectionClosedError
from nsqclient.producer._nsqd_pool import NsqdPool
from nsqclient.testing.helpers import free_port
from nsqclient.testing.waiting import wait_for

TIMEOUT = 10.0


@pytest.fixture
def pools() -> Iterator:
    made: list[NsqdPool] = []

    def make(*addresses: str) -> NsqdPool:
        pool = NsqdPool(
            list(addresses), Config(reconnect_interval=5.0), lambda f: None, lambda: None
        )
        made.append(pool)
        return pool

    yield make
    for pool in made:
        pool.closed = True
        pool.close(time.monotonic() + 1.0)


def test_a_publish_fails_over_past_an_address_that_is_down(nsqd, pools, caplog):
    down = f"127.0.0.1:{free_port()}"
    pool = pools(down, nsqd.nsqd.tcp_address)
    assert list(pool) == [down, nsqd.nsqd.tcp_address] and len(pool) == 2
    caplog.set_level(logging.WARNING, "nsqclient.producer")
    for _ in range(4):  # round robin: some start at the address that is down
        assert pool.publish_on(protocol.pub("pool_t", b"x")) == protocol.OK
    assert pool[down].skipped >= 1 and pool[down].waiting(time.monotonic())
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and f"cannot connect to nsqd {down}" in warned[0], warned
    assert pool.stats()["messages_sent"] == 4


def test_submit_now_never_connects_on_the_callers_thread(nsqd, pools):
    pool = pools(nsqd.nsqd.tcp_address)
    assert pool.submit_now(protocol.pub("pool_t", b"x")) is None  # nothing connected yet
    endpoint = pool.given[0]
    endpoint.warm()
    wait_for(lambda: endpoint.live() is not None, TIMEOUT)
    future = pool.submit_now(protocol.pub("pool_t", b"y"))
    assert isinstance(future, RequestFuture) and future.result(TIMEOUT) == protocol.OK
    assert future.nsqd_address == nsqd.nsqd.tcp_address  # type: ignore[attr-defined]


def test_a_first_attempt_fails_at_once_while_every_address_waits(pools):
    pool = pools(f"127.0.0.1:{free_port()}")
    deadline = time.monotonic() + TIMEOUT
    with pytest.raises(ConnectionClosedError, match="could not reach any nsqd"):
        pool.submit_connecting(protocol.pub("pool_t", b"x"), None, deadline, first=False)
    started = time.monotonic()
    with pytest.raises(ConnectionClosedError, match="the last connection attempt's error"):
        pool.submit_connecting(protocol.pub("pool_t", b"x"), None, deadline)
    assert time.monotonic() - started < 1.0  # no new attempt: it waits out its delay
    assert pool.given[0].skipped == 2


def test_a_closed_pool_writes_nothing(nsqd, pools):
    pool = pools(nsqd.nsqd.tcp_address)
    pool.closed = True
    with pytest.raises(ConnectionClosedError, match="closed"):
        pool.publish_on(protocol.pub("pool_t", b"x"))
    with pytest.raises(ConnectionClosedError, match="closed"):
        pool.submit_now(protocol.pub("pool_t", b"x"))
    assert pool.endpoint("127.0.0.1:1") is pool.endpoint("127.0.0.1:1")  # made once
    assert "127.0.0.1:1" in pool and pool.given == [pool[nsqd.nsqd.tcp_address]]


def test_write_ready_leaves_the_future_alone_when_no_connection_takes_it(nsqd, pools):
    pool = pools(nsqd.nsqd.tcp_address)
    future = RequestFuture()
    assert pool.write_ready(protocol.pub("pool_t", b"x"), future) is False
    assert future.running()  # not failed: the caller sends it another way
    pool.publish_on(protocol.pub("pool_t", b"connect"))
    conn = pool.given[0].conn
    assert conn is not None
    conn.close(1.0)  # the connection closed since: offered, refused, left alone again
    assert pool.write_ready(protocol.pub("pool_t", b"x"), future) is False
    assert future.running()


def test_write_ready_warms_the_addresses_it_passed_over(nsqd, pools):
    down = f"127.0.0.1:{free_port()}"
    pool = pools(down, nsqd.nsqd.tcp_address)
    pool.publish_on(protocol.pub("pool_t", b"connect"), [pool[nsqd.nsqd.tcp_address]])
    taken = []
    for _ in range(2):  # round robin: one of the two starts at the address not connected
        future = RequestFuture()
        assert pool.write_ready(protocol.pub("pool_t", b"x"), future)
        taken.append(future)
    assert all(f.result(TIMEOUT) == protocol.OK for f in taken)
    wait_for(lambda: pool[down].failures >= 1, TIMEOUT)  # warmed: tried in the background


def test_write_connecting_replaces_a_connection_that_closed_before_it_took_the_command(nsqd, pools):
    pool = pools(nsqd.nsqd.tcp_address)
    pool.publish_on(protocol.pub("pool_t", b"connect"))
    endpoint = pool.given[0]
    first = endpoint.conn
    assert first is not None
    first.close(1.0)
    made: list[RequestFuture] = []

    def make() -> RequestFuture:
        made.append(RequestFuture())
        return made[-1]

    future = pool.write_connecting(protocol.pub("pool_t", b"y"), time.monotonic() + TIMEOUT, make)
    assert future.result(TIMEOUT) == protocol.OK
    assert endpoint.conn is not first and made == [future]  # one future: offered once more
