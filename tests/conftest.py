"""Fixtures shared by the test modules in this folder."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nsqclient.config import Config
from nsqclient.conn import Connection
from nsqclient.consumer import Consumer
from nsqclient.producer import Producer

# The embedded NSQ's fixtures (nsqd, nsq_cluster, ...): opt-in, as for any project using them.
pytest_plugins = ["nsqclient.testing.pytest_plugin"]


@pytest.fixture
def consumers() -> Iterator[Callable[..., Consumer]]:
    """``make(topic, channel, handler, start=True, **kwargs) -> Consumer``; every consumer made
    is stopped at teardown."""
    made: list[Consumer] = []

    def make(topic: str, channel: str, handler: Any, start: bool = True, **kwargs: Any) -> Consumer:
        consumer = Consumer(topic, channel, handler, **kwargs)
        made.append(consumer)
        if start:
            consumer.start()
        return consumer

    yield make
    for consumer in made:
        consumer.stop(timeout=5.0)


@pytest.fixture
def producers() -> Iterator[Callable[..., Producer]]:
    """``make(addresses, **options) -> Producer``; every producer made is closed at teardown."""
    made: list[Producer] = []

    def make(addresses: Any, **options: Any) -> Producer:
        producer = Producer(addresses, **options)
        made.append(producer)
        return producer

    yield make
    for producer in made:
        producer.close(timeout=2.0)


@pytest.fixture
def pullers(consumers: Callable[..., Consumer]) -> Callable[..., Consumer]:
    """``make(topic, channel, start=True, **options) -> Consumer`` in pull mode (no handler):
    :func:`consumers`' Consumers, stopped at teardown like them."""

    def make(topic: str, channel: str, start: bool = True, **options: Any) -> Consumer:
        return consumers(topic, channel, None, start, **options)

    return make


@pytest.fixture
def connect() -> Iterator[Any]:
    """``connect(address, delegate=None, **options) -> Connection`` (connected); every
    connection made is closed at teardown, even when the test failed."""
    made: list[Connection] = []

    def make(address: str, delegate: Any = None, **options: Any) -> Connection:
        conn = Connection(address, Config(**options), delegate=delegate)
        made.append(conn)
        conn.connect()
        return conn

    yield make
    for conn in made:
        conn.close(timeout=2.0)


@pytest.fixture
def blackhole() -> Iterator[str]:
    """``host:port`` where a connect hangs (no SYN-ACK ever comes): a listener whose accept
    queue is full, so the kernel drops every new SYN, as a firewall that drops packets does."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    where = listener.getsockname()
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        try:
            filler.connect(where)
        except BlockingIOError:
            pass
        fillers.append(filler)
    probe = socket.socket()
    probe.settimeout(0.2)
    try:
        with pytest.raises(TimeoutError):  # the precondition: a dial there hangs
            probe.connect(where)
    finally:
        probe.close()
    try:
        yield f"127.0.0.1:{where[1]}"
    finally:
        for filler in fillers:
            filler.close()
        listener.close()
