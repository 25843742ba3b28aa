"""A Consumer's work queue: what its connections received, until a handler worker or a taker
(pull mode) has it, and the flow-control counts a delivery moves.

Items are :class:`~nsqclient.message.Message` objects, or :class:`~nsqclient.consumer.MessageBatch`
for a columnar Consumer.  A connection's reader thread appends a whole socket read's worth at
once (:meth:`Intake.put`); workers pop one item at a time, takers take many
(:meth:`Intake.take`, or :meth:`Intake.fill` to wait for a full batch).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..backoff import BackoffMode
from ..conn._connection import Connection
from ..rdy import needs_refill
from ._batch import MessageBatch
from ._rdy_balancer import send_rdy
from ._shared_state import SharedState

__all__ = ["Intake"]


class Intake:
    """The work queue of one Consumer.

    Args:
        books: the Consumer's bookkeeping (its lock is taken before :attr:`cond` when both
            are; workers take :attr:`cond` alone): ``received`` counts, each connection's
            counts, RDY kept going (a delivery in backoff's test window takes RDY back, a
            connection's first message wakes the RDY balancer).
    """

    def __init__(self, books: SharedState):
        self._lock, self._conns, self._stats = books.lock, books.conns, books.stats
        self._backoff, self._rdy_wake = books.backoff, books.rdy_wake
        #: the items, oldest first
        self.work: deque[Any] = deque()
        self.cond = threading.Condition(threading.Lock())
        #: threads waiting on :attr:`cond` (idle workers, takers)
        self.waiting = 0
        #: workers leave once the queue is empty
        self.exit = False

    def put(self, conn: Connection, items: list[Any], count: int, now: float) -> None:
        """``items`` (``count`` messages) arrived on ``conn`` at ``now``: count them in flight,
        keep RDY going, queue them and wake who waits (on the reader thread)."""
        with self._lock:
            self._stats["received"] += count
            conn.in_flight += count
            info = self._conns.get(conn.key)
            if info is not None and info.conn is conn:
                info.remaining -= count
                mode = BackoffMode.NORMAL if self._backoff.level == 0 else self._backoff.mode(now)
                if mode is BackoffMode.TESTING:
                    # One message per test window: take the RDY back until its result is in.
                    send_rdy(info, 0)
                elif mode is BackoffMode.NORMAL and needs_refill(info.remaining, conn.rdy):
                    send_rdy(info, conn.rdy)
                if info.first_message:
                    info.first_message = False
                    self._rdy_wake.set()
            # Under both locks, so that is_starved() never counts these as held by handlers.
            with self.cond:
                conn.queued += count
                self.work.extend(items)
                if self.waiting:
                    self.cond.notify(min(len(items), self.waiting))

    def wake_all(self) -> None:
        """Wake every waiting taker (the Consumer stops)."""
        with self.cond:
            self.cond.notify_all()

    def take(
        self, max_messages: int | None, timeout: float, stopping: threading.Event
    ) -> list[Any]:
        """The oldest items, at most ``max_messages`` messages (None: all; a batch is split
        to fit), waiting up to ``timeout`` seconds for the first; [] when stopping."""
        work = self.work
        deadline = time.monotonic() + timeout
        with self.cond:
            while not work and not stopping.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self.waiting += 1  # the reader threads wake a waiting taker
                try:
                    self.cond.wait(remaining)
                finally:
                    self.waiting -= 1
            if stopping.is_set() or not work:
                return []
            if type(work[0]) is MessageBatch:
                return self._cut_batches(max_messages)
            return self._cut_messages(max_messages)

    def fill(
        self,
        max_messages: int | None,
        timeout: float,
        stopping: threading.Event,
        saturated: Callable[[], bool],
    ) -> list[Any]:
        """:meth:`take`, then more as they arrive, until there are ``max_messages`` (None: no
        limit), ``timeout`` seconds have passed, the Consumer stops, or ``saturated()`` (nsqd
        sends nothing more until something is answered: called without :attr:`cond`)."""
        deadline = time.monotonic() + timeout
        items = self.take(max_messages, timeout, stopping)
        count = _count(items)
        while items and count != max_messages and not stopping.is_set() and not saturated():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            more = self.take(None if max_messages is None else max_messages - count, remaining,
                             stopping)  # fmt: skip
            items += more
            count += _count(more)
        return items

    def _cut_messages(self, max_messages: int | None) -> list[Any]:
        work = self.work
        if max_messages is None or max_messages >= len(work):
            taken = list(work)
            work.clear()
        else:
            taken = [work.popleft() for _ in range(max_messages)]
        for conn, run in itertools.groupby(taken, _message_conn):
            conn.queued -= sum(1 for _ in run)
        return taken

    def _cut_batches(self, max_messages: int | None) -> list[MessageBatch]:
        work = self.work
        taken: list[MessageBatch] = []
        room = -1 if max_messages is None else max_messages  # -1: no limit
        while work and room != 0:
            batch = work.popleft()
            if 0 < room < len(batch):
                batch, rest = batch._cut(room)
                work.appendleft(rest)
            batch.conn.queued -= len(batch)
            taken.append(batch)
            if room > 0:
                room -= len(batch)
        return taken

    def pop(self) -> Any | None:
        """The oldest item, off the queue (None when empty)."""
        with self.cond:
            try:
                item = self.work.popleft()
            except IndexError:
                return None
            if type(item) is MessageBatch:
                item.conn.queued -= len(item)
            else:
                item._conn.queued -= 1
            return item

    def close(self) -> None:
        """Workers leave once the queue is empty."""
        with self.cond:
            self.exit = True
            self.cond.notify_all()


def _count(items: list[Any]) -> int:
    """How many messages ``items`` (messages, or batches) hold."""
    if items and type(items[0]) is MessageBatch:
        return sum(len(batch) for batch in items)
    return len(items)


def _message_conn(message: Any) -> Connection:
    return message._conn
