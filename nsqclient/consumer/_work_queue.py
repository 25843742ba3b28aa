"""A Consumer's work queue: what its connections received, until a handler worker or a taker
(pull mode) has it, and the flow-control counts a delivery moves.

A connection's reader thread appends a whole socket read's worth at once (:meth:`Intake.put`).
In pull mode the items are :class:`~nsqclient.message.Message` objects, or
:class:`~nsqclient.consumer.MessageBatch` for a columnar Consumer, and takers take many
(:meth:`Intake.take`, or :meth:`Intake.fill` to wait for a full batch).

In handler mode each read is one :class:`Run` and workers are handed runs, not single
messages (:meth:`Intake.next_run`): a worker takes the messages of its run one by one with
``run.popleft()`` (atomic: no lock per message), and a worker that finds no run waiting
shares one a busy worker is on, both taking from it, before it sleeps.  A worker sleeps only
when no message is waiting anywhere, and whenever messages wait while a worker sleeps, one is
on its way (woken by the reader's put, or by the worker that arrived before it and left
messages behind): an idle worker never waits while a message sits behind a blocked handler.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..backoff import BackoffMode
from ..rdy import needs_refill
from ._batch import MessageBatch
from ._rdy_balancer import ConnFlow, send_rdy
from ._shared_state import SharedState

__all__ = ["Intake", "Run"]

#: seconds an idle worker sleeps before it looks again (nothing is missed meanwhile: it is
#: woken when work comes; this only bounds the wait)
_IDLE_WAIT = 5.0


class Run(deque):
    """The messages of one socket read on one connection, for handler workers: taken with
    ``popleft()`` (atomic), by the worker on it and by any worker sharing it."""

    __slots__ = ("flow",)

    def __init__(self, messages: list[Any], flow: ConnFlow):
        super().__init__(messages)
        self.flow = flow


class Intake:
    """The work queue of one Consumer.

    Args:
        books: the Consumer's bookkeeping (its lock is taken before :attr:`cond` when both
            are; workers and takers take :attr:`cond` alone): ``received`` counts, each
            connection's counts, RDY kept going (a delivery in backoff's test window takes RDY
            back, a connection's first message wakes the RDY balancer).
        workers: handler workers (0: pull mode).
    """

    def __init__(self, books: SharedState, workers: int = 0):
        self._lock, self._conns, self._stats = books.lock, books.conns, books.stats
        self._backoff, self._rdy_wake = books.backoff, books.rdy_wake
        #: the items, oldest first (handler mode: runs)
        self.work: deque[Any] = deque()
        self.cond = threading.Condition(threading.Lock())
        #: threads waiting on :attr:`cond` (takers)
        self.waiting = 0
        #: workers leave once the queue is empty
        self.exit = False
        self.handler_mode = workers > 0
        #: per worker, the run it is on (shared with any worker that finds it); None: none yet
        self.runs: list[Run | None] = [None] * workers
        #: per worker, the lock it sleeps on (held while it is awake)
        self._bells = [threading.Lock() for _ in range(workers)]
        #: the workers asleep, each to be woken by releasing its bell
        self._sleepers: list[int] = []
        #: a worker was woken and has not looked for work yet
        self._on_way = False

    def put(self, flow: ConnFlow, items: list[Any], count: int, now: float) -> None:
        """``items`` (``count`` messages) arrived on ``flow``'s connection at ``now``: count
        them in flight, keep RDY going, queue them and wake who waits (on the reader
        thread)."""
        with self._lock:
            self._stats["received"] += count
            flow.in_flight += count
            if self._conns.get(flow.key) is flow:
                flow.remaining -= count
                mode = BackoffMode.NORMAL if self._backoff.level == 0 else self._backoff.mode(now)
                if mode is BackoffMode.TESTING:
                    # One message per test window: take the RDY back until its result is in.
                    send_rdy(flow, 0)
                elif mode is BackoffMode.NORMAL and needs_refill(flow.remaining, flow.rdy):
                    send_rdy(flow, flow.rdy)
                if flow.first_message:
                    flow.first_message = False
                    self._rdy_wake.set()
            # Under both locks, so that is_starved() never counts these as held by handlers.
            with self.cond:
                if self.handler_mode:
                    self.work.append(Run(items, flow))
                    if self._sleepers and not self._on_way:
                        self._wake_one()
                    return
                flow.queued += count
                self.work.extend(items)
                if self.waiting:
                    self.cond.notify(min(len(items), self.waiting))

    # ---------------------------------------------------------------- handler mode

    def next_run(self, index: int) -> Run | None:
        """Worker ``index``'s next run: one waiting, else one another worker is on (shared),
        else it sleeps until there is one; None once the Consumer closes the queue and no
        message waits."""
        bell = self._bells[index]
        runs = self.runs
        with self.cond:
            if not bell.locked():
                bell.acquire()  # awake: held until it sleeps
            while True:
                run = self._find(index)
                if run is not None:
                    runs[index] = run
                    # More waits than this run's next message: someone else on its way.
                    if self._sleepers and (len(run) > 1 or self.work or self._shared(index)):
                        self._wake_one()
                    return run
                if self.exit:
                    return None
                self._sleepers.append(index)
                self.cond.release()
                try:
                    bell.acquire(timeout=_IDLE_WAIT)  # released by _wake_one
                finally:
                    self.cond.acquire()
                if index in self._sleepers:  # not woken: looked again after _IDLE_WAIT
                    self._sleepers.remove(index)
                else:
                    self._on_way = False
                    if not bell.locked():
                        bell.acquire()

    def _find(self, index: int) -> Run | None:
        """A run with messages (under :attr:`cond`): this worker's own, the oldest waiting,
        or one another worker is on."""
        own = self.runs[index]
        if own:
            return own
        work = self.work
        while work:
            run = work.popleft()
            if run:
                return run
        return self._shared(index)

    def _shared(self, index: int) -> Run | None:
        for i, run in enumerate(self.runs):
            if i != index and run:
                return run
        return None

    def _wake_one(self) -> None:
        """Wake the worker that went to sleep last (under :attr:`cond`)."""
        self._on_way = True
        self._bells[self._sleepers.pop()].release()

    def unstarted(self) -> bool:
        """True while a message waits for a worker or a taker."""
        if self.handler_mode:
            return any(self.work) or any(self.runs)
        return bool(self.work)

    def count_queued(self) -> None:
        """Handler mode: set each connection's ``queued`` (the messages of its runs still
        waiting for a worker); the caller holds the Consumer's lock.  (A worker takes a
        message off its run without a lock: counting them there would cost every message a
        lock round; this runs only when someone asks.)"""
        if not self.handler_mode:
            return
        for flow in self._conns.values():
            flow.queued = 0
        with self.cond:
            seen = set()
            for run in itertools.chain(self.work, self.runs):
                if run is not None and id(run) not in seen:
                    seen.add(id(run))
                    run.flow.queued += len(run)

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
        """The oldest item not handed over yet, off the queue (None when none is left); in
        handler mode a message of a run a worker is on, or of a waiting run."""
        with self.cond:
            if self.handler_mode:
                for run in itertools.chain(self.runs, self.work):
                    if run:
                        try:
                            return run.popleft()
                        except IndexError:  # a worker took the last one meanwhile
                            continue
                return None
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
            while self._sleepers:
                self._wake_one()


def _count(items: list[Any]) -> int:
    """How many messages ``items`` (messages, or batches) hold."""
    if items and type(items[0]) is MessageBatch:
        return sum(len(batch) for batch in items)
    return len(items)


def _message_conn(message: Any) -> ConnFlow:
    return message._conn
