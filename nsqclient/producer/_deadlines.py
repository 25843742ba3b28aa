"""A Producer's deadline keeper: every asynchronous publish ends within ``pub_timeout``.

A connection to an nsqd that hangs (SIGSTOP, a frozen VM) keeps its requests pending until the
heartbeat check closes it, a minute later.  One thread per Producer, ``nsq-deadlines-<name>``,
runs while publishes are in flight (and :data:`LINGER` seconds after): every ``tick`` it notes
each connection's :meth:`~nsqclient.conn.Connection.request_mark`, and has the connection fail
what was sent before a mark noted ``pub_timeout`` seconds ago
(:meth:`~nsqclient.conn.Connection.expire_before`).  So a publish fails at most ``tick`` after
its ``pub_timeout``, and a publish costs nothing for it: no clock read, no deadline kept per
request.  Publishes handed to a Future before they reach a connection (the backlog, retries by
lookup) carry their own deadline, which the Producer's
:class:`~nsqclient.producer._outer_futures.OuterFutures` enforce at the same ticks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

from ..conn._connection import Connection

__all__ = ["DeadlineKeeper", "tick_for"]

logger = logging.getLogger("nsqclient.producer")

#: Seconds the thread goes on ticking with nothing in flight before it ends: its start blocks
#: the publisher that needs it (an event loop's thread, in an ASGI app) until it runs.
LINGER = 5.0


def tick_for(period: float) -> float:
    """How often the keeper looks (seconds): a twentieth of ``period``, between 5 and 100 ms;
    a publish fails at most this long after its timeout."""
    return min(max(period / 20, 0.005), 0.1)


class DeadlineKeeper:
    """Fails what a Producer's connections sent ``period`` seconds ago and is unanswered.

    Args:
        name: for the thread's name.
        connections: the Producer's live connections.
        period: the publishes' timeout (seconds).
        expire_outer: ``expire_outer(now) -> bool``: fail the Producer's own Futures past their
            deadline; True while some are still waiting.
    """

    def __init__(
        self,
        name: str,
        connections: Callable[[], Iterable[Connection]],
        period: float,
        expire_outer: Callable[[float], bool],
    ):
        self.name = name
        self._connections = connections
        self._period = period
        self._tick = tick_for(period)
        self._expire_outer = expire_outer
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopped = False
        #: per connection, (time, request mark) noted at each tick, oldest first
        self._marks: dict[Connection, deque[tuple[float, int]]] = {}
        #: the thread runs (read without the lock by every asynchronous publish: see ensure)
        self.running = False

    def ensure(self) -> None:
        """Something was just sent or handed out with a deadline: make sure the thread runs.
        Call it after the request is queued (the thread's last look happens after it reads
        ``running`` False, so a request queued before a caller reads True is seen)."""
        if self.running:
            return
        with self._cond:
            if self._thread is None and not self._stopped:
                self.running = True
                self._thread = threading.Thread(
                    target=self._run, name=f"nsq-deadlines-{self.name}", daemon=True
                )
                self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop and join the thread (seconds)."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _pass(self, now: float) -> bool:
        """Note every connection's mark; expire what is due; True while anything is pending."""
        busy = self._expire_outer(now)
        conns = list(self._connections())
        due = now - self._period
        for conn in conns:
            marks = self._marks.get(conn)
            if marks is None:
                marks = self._marks[conn] = deque()
            marks.append((now, conn.request_mark()))
            mark = None
            while marks and marks[0][0] <= due:
                mark = marks.popleft()[1]
            if mark is not None:
                try:
                    conn.expire_before(mark)
                except Exception:  # a bug here must not stop every later deadline
                    logger.exception("expiring the requests of %s failed", conn.address)
            busy = busy or conn.pending_count() > 0
        if len(self._marks) > len(conns):
            live = set(conns)
            for conn in [c for c in self._marks if c not in live]:
                del self._marks[conn]
        return busy

    def _run(self) -> None:
        idle_since = time.monotonic()  # when it last had something in flight
        while True:
            now = time.monotonic()
            if self._pass(now):
                idle_since = now
            with self._cond:
                if now - idle_since >= LINGER:
                    # Nothing in flight: end, unless something came meanwhile.  A publisher
                    # that read running=True before this line had queued its request before
                    # it, and this last look sees it; one that reads False starts a thread.
                    self.running = False
                    if not self._pass(time.monotonic()):
                        self._thread = None
                        self._marks.clear()
                        return
                    self.running = True
                if self._stopped:
                    self._thread = None
                    self.running = False
                    return
                self._cond.wait(self._tick)
                if self._stopped:
                    self._thread = None
                    self.running = False
                    return
