"""An nsqd endpoint of a Producer's pool (nsqclient/producer/_endpoint.py) owns its connect / down /
up
state: it connects when asked or on its own thread, waits out a reconnect delay after a failure,
logs an outage once, says so when the address is back, and keeps its counters across
reconnects."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest

from nsqclient.config import Config
from nsqclient.errors import ConnectionClosedError
from nsqclient.producer._endpoint import Endpoint
from nsqclient.testing.helpers import free_port
from nsqclient.testing.waiting import wait_for

TIMEOUT = 10.0


class Owner:
    """What an endpoint is given by its Producer: options, a failure hook, a closed flag."""

    def __init__(self, **options: float) -> None:
        self.config = Config(**options)
        self.failed: list[object] = []
        self.closed = False
        self.made: list[Endpoint] = []

    def endpoint(self, address: str) -> Endpoint:
        endpoint = Endpoint(address, self.config, self.failed.append, lambda: self.closed)
        self.made.append(endpoint)
        return endpoint


@pytest.fixture
def owner() -> Iterator[Owner]:
    made = Owner(reconnect_interval=0.05, max_reconnect_interval=0.2)
    yield made
    for endpoint in made.made:
        endpoint.close(1.0)


def test_a_refused_address_is_down_for_its_reconnect_delay_and_says_why(owner, caplog):
    endpoint = owner.endpoint(f"127.0.0.1:{free_port()}")
    caplog.set_level(logging.DEBUG, "nsqclient.producer")
    assert endpoint.connection(time.monotonic() + TIMEOUT) is None
    now = time.monotonic()
    assert endpoint.failures == 1 and endpoint.last_error is not None
    assert endpoint.waiting(now) and endpoint.down_since is not None
    assert "the last connection attempt's error" in endpoint.outage(now)
    assert endpoint.live() is None
    wait_for(lambda: not endpoint.waiting(time.monotonic()), TIMEOUT)
    assert endpoint.connection(time.monotonic() + TIMEOUT) is None
    assert endpoint.failures == 2
    said = [r for r in caplog.records if endpoint.address in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING, logging.DEBUG]  # once per outage


def test_an_address_back_after_an_outage_connects_and_says_so(nsqd, owner, caplog):
    address = nsqd.nsqd.tcp_address
    endpoint = owner.endpoint(address)
    endpoint.down_since = time.monotonic() - 1.0  # as after failed attempts
    endpoint.failures, endpoint.skipped, endpoint.warned = 3, 7, True
    caplog.set_level(logging.INFO, "nsqclient.producer")
    conn = endpoint.connection(time.monotonic() + TIMEOUT)
    assert conn is not None and endpoint.live() is conn and endpoint.ours() is conn
    assert (endpoint.failures, endpoint.skipped, endpoint.down_since) == (0, 0, None)
    assert endpoint.connects == 1 and not endpoint.warned
    [back] = [r for r in caplog.records if "reachable again" in r.getMessage()]
    assert back.levelno == logging.WARNING and "7 publishes" in back.getMessage()
    assert endpoint.connection() is conn  # made once
    assert conn.on_request_failed == owner.failed.append


def test_close_keeps_the_counters_and_a_closed_producer_connects_no_more(nsqd, owner):
    endpoint = owner.endpoint(nsqd.nsqd.tcp_address)
    conn = endpoint.connection(time.monotonic() + TIMEOUT)
    assert conn is not None
    conn.request(b"PUB e_counted\n\x00\x00\x00\x01x", messages=1).result(TIMEOUT)
    endpoint.close(TIMEOUT)
    assert endpoint.conn is None and conn.is_closed
    assert endpoint.counters()["messages_sent"] == 1
    stats = endpoint.stats()
    assert stats["messages_sent"] == 1 and stats["connects"] == 1 and not stats["connected"]
    owner.closed = True
    with pytest.raises(ConnectionClosedError, match="closed"):
        endpoint.connection(time.monotonic() + TIMEOUT)


def test_warm_connects_on_a_thread_of_its_own_unless_waiting(nsqd, owner):
    down = owner.endpoint(f"127.0.0.1:{free_port()}")
    down.connection(time.monotonic() + TIMEOUT)
    down.warm()  # waiting out its reconnect delay: no thread
    assert not down.warming
    endpoint = owner.endpoint(nsqd.nsqd.tcp_address)
    endpoint.warm()
    names = [t.name for t in threading.enumerate()]
    assert endpoint.warming or endpoint.live() is not None
    assert endpoint.live() is not None or f"nsq-connect-{endpoint.address}" in names
    wait_for(lambda: endpoint.live() is not None and not endpoint.warming, TIMEOUT)


def test_failover_is_told_once_per_outage(owner, caplog):
    endpoint = owner.endpoint(f"127.0.0.1:{free_port()}")
    endpoint.connection(time.monotonic() + TIMEOUT)
    caplog.set_level(logging.INFO, "nsqclient.producer")
    endpoint.tell_failover("127.0.0.1:1")
    endpoint.tell_failover("127.0.0.1:1")
    told = [r for r in caplog.records if "is unreachable" in r.getMessage()]
    assert len(told) == 1 and endpoint.warned and told[0].levelno == logging.INFO
