"""The Consumer's RDY balancing: each connection's RDY bookkeeping, and the ``nsq-rdy`` thread
that applies the RDY policy (:mod:`nsqclient.rdy`) periodically and whenever woken.

The connection table (key -> :class:`ConnFlow`: a connection and its counts) is the
Consumer's, guarded by the Consumer's lock: the balancer reads and updates it under that lock
and sends RDY on the connections' command queues (never blocking).  The reader threads refill
a connection's RDY themselves (:func:`send_rdy`), without waiting for this thread.
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
    "ConnFlow",
    "ConnectionCounts",
    "RdyBalancer",
    "conn_views",
    "connection_counts",
    "send_rdy",
]

logger = logging.getLogger("nsqclient.consumer")


class ConnFlow:
    """One connection as the Consumer keeps it: the connection, and its flow-control counts
    (guarded by the Consumer's lock, but :attr:`queued` in handler mode: see
    :meth:`~nsqclient.consumer._work_queue.Intake.count_queued`).

    The Consumer's messages and batches carry it as their connection (``message._conn``,
    ``batch.conn``): it sends what they answer (:attr:`send` is the connection's) and counts
    them, with no look-up per message.
    """

    __slots__ = (
        "conn",
        "send",
        "put",
        "fin",
        "flush",
        "key",
        "address",
        "partition",
        "rdy",
        "in_flight",
        "queued",
        "remaining",
        "rdy_since",
        "waiting_since",
        "first_message",
        "last_rdy_at",
    )

    def __init__(self, conn: Connection, now: float):
        self.conn = conn
        #: queue a command on the connection (its ``send``: ConnectionClosedError once closed)
        self.send = conn.send
        #: the same, what is queued once it is closed being dropped (its ``queue_command``)
        self.put = conn.queue_command
        #: queue FIN for a message id it sent, dropped once it is closed (its ``queue_fin``)
        self.fin = conn.queue_fin
        #: write what is queued on this thread unless another is writing (its ``write_queued``)
        self.flush = conn.write_queued
        self.key = conn.key
        self.address = conn.address
        self.partition = conn.partition
        #: the RDY last sent
        self.rdy = 0
        #: messages received and not answered yet
        self.in_flight = 0
        #: of those, the ones waiting for a handler worker or a taker
        self.queued = 0
        #: messages nsqd may still send before the RDY last sent is used up
        self.remaining = 0
        #: since when its RDY has been above 0 (None: it is 0)
        self.rdy_since: float | None = None
        #: since when its RDY has been 0
        self.waiting_since = now
        #: no message received on it yet
        self.first_message = True
        self.last_rdy_at = 0.0

    def __repr__(self) -> str:
        return f"<ConnFlow {self.key} rdy={self.rdy} in_flight={self.in_flight}>"

    @property
    def msg_timeout(self) -> float:
        """nsqd's msg_timeout for this connection, seconds."""
        return self.conn.msg_timeout

    @property
    def max_rdy_count(self) -> int:
        return self.conn.max_rdy_count

    @property
    def last_message_at(self) -> float:
        return self.conn.last_message_at

    def counts(self) -> dict[str, int]:
        """``rdy``, ``in_flight`` and ``queued``, for ``Consumer.stats()``."""
        return {"rdy": self.rdy, "in_flight": self.in_flight, "queued": self.queued}


def send_rdy(flow: ConnFlow, count: int) -> None:
    """Send RDY ``count`` on ``flow``'s connection and note it (under the Consumer's lock)."""
    now = time.monotonic()
    if count > 0 and flow.rdy == 0:
        flow.rdy_since = now
    elif count == 0 and flow.rdy > 0:
        flow.rdy_since = None
        flow.waiting_since = now
    flow.rdy = count
    flow.remaining = count
    flow.last_rdy_at = now
    try:
        flow.send(protocol.rdy(count))
    except NSQError:
        pass  # closed: on_close cleans up


def conn_views(conns: dict[str, ConnFlow]) -> list[ConnView]:
    """What the RDY policy sees of each connection (under the Consumer's lock)."""
    return [
        ConnView(
            address=a,
            rdy=f.rdy,
            max_rdy_count=f.conn.max_rdy_count,
            in_flight=f.in_flight,
            queued=f.queued,
            last_message_at=None if f.first_message else f.conn.last_message_at,
            rdy_since=f.rdy_since,
            waiting_since=f.waiting_since,
        )
        for a, f in conns.items()
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


def connection_counts(conns: dict[str, ConnFlow]) -> list[ConnectionCounts]:
    """A snapshot of each connection's counts (the caller holds the Consumer's lock)."""
    return [
        ConnectionCounts(
            key,
            f.address,
            f.rdy,
            f.conn.max_rdy_count,
            f.in_flight,
            f.queued,
            float(f.conn.msg_timeout),
        )
        for key, f in conns.items()
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
        conns: dict[str, ConnFlow],
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
                ((n, a) for a, n in targets.items() if conns[a].rdy != n),
                key=lambda item: item[0] - conns[item[1]].rdy,
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
            return any(n > self._conns[a].rdy for a, n in targets.items())

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
