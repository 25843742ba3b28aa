"""The Consumer's RDY balancing: each connection's RDY bookkeeping, and the ``nsq-rdy`` thread
that applies the RDY policy (:mod:`nsqclient.rdy`) periodically and whenever woken.

The connection table (key -> :class:`ConnInfo`) is the Consumer's, guarded by the Consumer's
lock: the balancer reads and updates it under that lock and sends RDY on the connections'
command queues (never blocking).  The reader threads refill a connection's RDY themselves
(:func:`send_rdy`), without waiting for this thread.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import NamedTuple

from .. import protocol
from ..backoff import BackoffMode, BackoffState
from ..config import Config
from ..conn._connection import Connection
from ..errors import NSQError
from ..rdy import ConnView, rdy_targets

__all__ = [
    "ConnInfo",
    "ConnectionCounts",
    "RdyBalancer",
    "conn_views",
    "connection_counts",
    "send_rdy",
]

logger = logging.getLogger("nsqclient.consumer")


class ConnInfo:
    """The consumer's bookkeeping for one connection (guarded by the Consumer's lock)."""

    __slots__ = ("conn", "remaining", "rdy_since", "waiting_since", "first_message")

    def __init__(self, conn: Connection, now: float):
        self.conn = conn
        #: messages nsqd may still send before the RDY last sent is used up
        self.remaining = 0
        #: since when its RDY has been above 0 (None: it is 0)
        self.rdy_since: float | None = None
        #: since when its RDY has been 0
        self.waiting_since = now
        #: no message received on it yet
        self.first_message = True


def send_rdy(info: ConnInfo, count: int) -> None:
    """Send RDY ``count`` on ``info``'s connection and note it (under the Consumer's lock)."""
    conn = info.conn
    now = time.monotonic()
    if count > 0 and conn.rdy == 0:
        info.rdy_since = now
    elif count == 0 and conn.rdy > 0:
        info.rdy_since = None
        info.waiting_since = now
    conn.rdy = count
    info.remaining = count
    conn.last_rdy_at = now
    try:
        conn.send(protocol.rdy(count))
    except NSQError:
        pass  # closed: on_close cleans up


def conn_views(conns: dict[str, ConnInfo]) -> list[ConnView]:
    """What the RDY policy sees of each connection (under the Consumer's lock)."""
    return [
        ConnView(
            address=a,
            rdy=i.conn.rdy,
            max_rdy_count=i.conn.max_rdy_count,
            in_flight=i.conn.in_flight,
            queued=i.conn.queued,
            last_message_at=None if i.first_message else i.conn.last_message_at,
            rdy_since=i.rdy_since,
            waiting_since=i.waiting_since,
        )
        for a, i in conns.items()
    ]


class ConnectionCounts(NamedTuple):
    """One connection's flow-control counts (see :meth:`Consumer.connection_counts
    <nsqclient.Consumer.connection_counts>`)."""

    #: the Consumer's name for the connection: ``host:port``, plus ``#partition`` on youzan
    key: str
    #: ``host:port``
    address: str
    #: the RDY last sent
    rdy: int
    #: nsqd's limit on one connection's RDY (from IDENTIFY)
    max_rdy_count: int
    #: messages received and not answered yet
    in_flight: int
    #: of those, messages waiting for a handler worker, or for take() (pull mode)
    queued: int
    #: nsqd's msg_timeout for this connection, seconds (from IDENTIFY)
    msg_timeout: float = 60.0


def connection_counts(conns: dict[str, ConnInfo]) -> list[ConnectionCounts]:
    """A snapshot of each connection's counts (the caller holds the Consumer's lock)."""
    return [
        ConnectionCounts(
            key,
            info.conn.address,
            info.conn.rdy,
            info.conn.max_rdy_count,
            info.conn.in_flight,
            info.conn.queued,
            float(info.conn.msg_timeout),
        )
        for key, info in conns.items()
    ]


class RdyBalancer:
    """Keeps the RDY of ``conns`` as the policy says, on a thread ``nsq-rdy-<name>``.

    Args:
        config: the Consumer's (``max_in_flight``, the low-RDY timeouts, the interval).
        conns: the Consumer's connection table, guarded by ``lock``.
        lock: the Consumer's lock.
        backoff: the Consumer's backoff state (read under ``lock``).
        name: ``topic/channel``, for the thread's name.
    """

    def __init__(
        self,
        config: Config,
        conns: dict[str, ConnInfo],
        lock: threading.RLock,
        backoff: BackoffState,
        name: str,
    ):
        self.config = config
        #: the sum of RDY never exceeds it; 0 pauses
        self.max_in_flight = config.max_in_flight
        #: set it to have RDY balanced again at once (a connection came or went, backoff...)
        self.wake = threading.Event()
        self._conns = conns
        self._lock = lock
        self._backoff = backoff
        self._name = name
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._loop, name=f"nsq-rdy-{self._name}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Send RDY 0 everywhere once more and end the thread (:meth:`join` waits for it)."""
        self._stopping.set()
        self.wake.set()

    def join(self, deadline: float) -> None:
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(deadline - time.monotonic(), 0.1))

    def rebalance(self) -> float:
        """Apply the RDY policy once; return seconds until it should run again."""
        cfg = self.config
        now = time.monotonic()
        backoff = self._backoff
        conns = self._conns
        with self._lock:
            targets, mode = self._targets(now)
            # Lower first, so that the sum of RDY never exceeds max_in_flight.
            changes = sorted(
                ((n, a) for a, n in targets.items() if conns[a].conn.rdy != n),
                key=lambda item: item[0] - conns[item[1]].conn.rdy,
            )
            for count, address in changes:
                send_rdy(conns[address], count)
        wait = cfg.rdy_redistribute_interval
        if mode is BackoffMode.PAUSED and backoff.until:
            wait = min(wait, max(backoff.until - now, 0.0))
        return wait

    def would_raise(self) -> bool:
        """True when the policy would now give some connection a higher RDY than it has (its
        first message came at RDY 1, a rotation is due): nsqd will be told to send more."""
        with self._lock:
            targets, _ = self._targets(time.monotonic())
            return any(n > self._conns[a].conn.rdy for a, n in targets.items())

    def _targets(self, now: float) -> tuple[dict[str, int], BackoffMode]:
        """The RDY the policy gives each connection now, and the backoff mode (under the
        lock)."""
        if self._stopping.is_set():
            return {a: 0 for a in self._conns}, BackoffMode.PAUSED
        cfg = self.config
        mode = self._backoff.mode(now)
        targets = rdy_targets(
            conn_views(self._conns),
            self.max_in_flight,
            now,
            mode,
            cfg.low_rdy_idle_timeout,
            cfg.low_rdy_timeout,
        )
        return targets, mode

    def _loop(self) -> None:
        while True:
            try:
                wait = self.rebalance()
            except Exception:
                logger.exception("unexpected error balancing RDY; it goes on")
                wait = self.config.rdy_redistribute_interval
            if self._stopping.is_set():
                return
            if self.wake.wait(wait):
                self.wake.clear()
