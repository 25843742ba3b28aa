"""What a Consumer's connections and its discovery call back: kept off the Consumer's public
face, on one object the Consumer makes."""

from __future__ import annotations

import threading
import time
from collections.abc import Collection
from typing import Protocol

from .. import protocol
from ..conn._connection import Connection
from ..errors import NSQError, ServerError
from ..observe import ObserverSet, tell
from ._rdy_balancer import ConnFlow

__all__ = ["Delegate", "DelegateOwner"]


class DelegateOwner(Protocol):
    """What a :class:`Delegate` reads and calls of its Consumer (the Consumer's own names)."""

    _lock: threading.RLock
    _conns: dict[str, ConnFlow]
    _stopping: threading.Event
    _observers: ObserverSet
    _rdy_wake: threading.Event

    def _on_message_run(self, conn: Connection, run: protocol.MessageRun) -> None: ...

    def _on_messages(self, conn: Connection, decoded: list[protocol.DecodedMessage]) -> None: ...

    def _on_server_error(self, conn: Connection, error: ServerError) -> None: ...

    def _on_close(self, conn: Connection, reason: BaseException | None) -> None: ...

    def _fail(self, error: NSQError) -> None: ...


class Delegate:
    """What a Connection and the Discovery call back (see
    :class:`~nsqclient.conn.ConnectionDelegate` and
    :class:`~nsqclient.consumer._discovery.DiscoveryOwner`), kept off the Consumer's public
    face.  The connections are the Consumer's: the Discovery hands each one over once subscribed
    (:meth:`subscribed`) and is told when it closes."""

    __slots__ = ("_consumer", "on_message_run")

    def __init__(self, consumer: DelegateOwner):
        self._consumer = consumer
        # The connections hand over each read's messages undecoded (see conn/_connection.py).
        self.on_message_run = consumer._on_message_run

    def on_message(self, conn: Connection, decoded: protocol.DecodedMessage) -> None:
        self._consumer._on_messages(conn, [decoded])

    def on_server_error(self, conn: Connection, error: ServerError) -> None:
        self._consumer._on_server_error(conn, error)

    def on_close(self, conn: Connection, reason: BaseException | None) -> None:
        self._consumer._on_close(conn, reason)

    def held_keys(self) -> Collection[str]:
        consumer = self._consumer
        with consumer._lock:
            return set(consumer._conns)

    def subscribed(self, conn: Connection) -> bool:
        consumer = self._consumer
        with consumer._lock:
            if consumer._stopping.is_set() or conn.is_closed:
                return False
            consumer._conns[conn.key] = ConnFlow(conn, time.monotonic())
        return True

    def connection_made(self, key: str) -> None:
        consumer = self._consumer
        observers = consumer._observers.active
        if observers:
            tell(observers, "connection_made", consumer, key)
        consumer._rdy_wake.set()

    def connection_lost(self, key: str, reason: BaseException | None) -> None:
        observers = self._consumer._observers.active
        if observers:
            tell(observers, "connection_lost", self._consumer, key, reason)

    def fail(self, error: NSQError) -> None:
        self._consumer._fail(error)
