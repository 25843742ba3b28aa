"""One nsqd address of a Producer's pool, with its own connect / down / up state (as go-nsq's
Producer is one address with its own state).

An :class:`Endpoint` makes its connection when asked (:meth:`Endpoint.connection`, or on a
thread of its own: :meth:`Endpoint.warm`), keeps the state of its outages (failures in a row,
the reconnect delay it waits out, when the outage began, publishes that could not use it),
logs each outage once, and keeps its counters across reconnects.  The Producer picks endpoints
and asks them for a connection; it never connects one itself.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ..backoff import reconnect_delay
from ..config import Config
from ..conn._connection import Connection
from ..conn._futures import RequestFuture
from ..errors import ConnectionClosedError, NSQError, NSQTimeoutError
from ._limits import learn_in_background

__all__ = ["CUMULATIVE", "Endpoint"]

logger = logging.getLogger("nsqclient.producer")

#: Counters summed over every connection an endpoint has had (see Producer.stats).
CUMULATIVE = ("messages_sent", "pubs_joined", "bytes_in", "bytes_out")


class Endpoint:
    """One nsqd address of the pool and its (lazily made) connection.

    Args:
        address: ``"host:port"`` of the nsqd.
        config: the Producer's options (the connection's, the reconnect delays).
        on_request_failed: given to every connection made (see
            :attr:`~nsqclient.conn.Connection.on_request_failed`).
        closed: True once the Producer is closed: no connection is made any more.
        http_address: the nsqd's HTTP address (``"host:port"``), when known: its size limits
            are asked there once connected (see :mod:`nsqclient.producer._limits`).
        on_limits: ``on_limits(address, max_msg_size, max_body_size)`` once nsqd stated them.
        join_limit: the largest MPUB body (bytes) a connection may join queued PUBs into
            (a connection's ``join_limit``; 0: none), asked at each
            connection and when nsqd states its limits.  Once this nsqd refused a joined MPUB,
            its later connections join nothing.
    """

    __slots__ = (
        "address",
        "conn",
        "lock",
        "failures",
        "down_until",
        "last_error",
        "down_since",
        "skipped",
        "connects",
        "totals",
        "warming",
        "warmer",
        "dialing",
        "warned",
        "failed_at",
        "http_address",
        "limits",
        "learning",
        "learner",
        "_on_limits",
        "_join_limit",
        "joining",
        "_config",
        "_on_request_failed",
        "_closed",
    )

    def __init__(
        self,
        address: str,
        config: Config,
        on_request_failed: Callable[[RequestFuture], None],
        closed: Callable[[], bool],
        http_address: str | None = None,
        on_limits: Callable[[str, int, int], None] | None = None,
        join_limit: Callable[[], int] | None = None,
    ):
        self.address = address
        self.http_address = http_address
        #: (max_msg_size, max_body_size) this nsqd stated, once it did
        self.limits: tuple[int, int] | None = None
        #: a thread is asking nsqd its limits
        self.learning = False
        #: the thread asking it (joined on close)
        self.learner: threading.Thread | None = None
        self._on_limits = on_limits
        self._join_limit = join_limit
        #: this nsqd's connections may join PUBs (False once it refused a joined MPUB)
        self.joining = join_limit is not None
        self.conn: Connection | None = None
        #: held while a connection is being made (one attempt at a time)
        self.lock = threading.Lock()
        #: consecutive failed connection attempts (0 while connected)
        self.failures = 0
        #: monotonic time before which no new attempt is made (the reconnect delay)
        self.down_until = 0.0
        self.last_error: BaseException | None = None
        #: monotonic time the current outage began (None: not in an outage)
        self.down_since: float | None = None
        #: publishes that could not use this address during the current outage
        self.skipped = 0
        #: connections made to this address
        self.connects = 0
        #: CUMULATIVE counters of the connections this endpoint had before the current one
        self.totals = dict.fromkeys(CUMULATIVE, 0)
        #: a thread is connecting it (see warm)
        self.warming = False
        #: the last ``nsq-connect-<address>`` thread started (joined on close)
        self.warmer: threading.Thread | None = None
        #: the connection being made, until its connect() returns (close aborts it)
        self.dialing: Connection | None = None
        #: the current outage's failover was told (publishes went to other addresses)
        self.warned = False
        #: monotonic time of the last failed connection attempt
        self.failed_at = 0.0
        self._config = config
        self._on_request_failed = on_request_failed
        self._closed = closed

    def __repr__(self) -> str:
        return f"<Endpoint {self.address} {'up' if self.live() else 'down'}>"

    # ---------------------------------------------------------------- connecting

    def live(self) -> Connection | None:
        """The connection, when it is connected (never blocks, never connects)."""
        conn = self.conn
        return conn if conn is not None and conn.is_connected else None

    def connection(self, deadline: float | None = None) -> Connection | None:
        """The connection, made now if need be (until ``deadline``, a ``time.monotonic()``;
        None: no limit).  None when it could not be made: :attr:`last_error` says why.

        Raises ConnectionClosedError once the Producer is closed."""
        # (A forked child gets fresh endpoints from the at-fork hook, before it can get here.)
        conn = self.conn
        if conn is not None and conn.is_connected:
            return conn
        remaining = None if deadline is None else deadline - time.monotonic()
        if not self.lock.acquire(timeout=-1 if remaining is None else max(remaining, 0.0)):
            self.last_error = NSQTimeoutError(
                f"timed out waiting to connect to {self.address}", maybe_processed=False
            )
            return None
        try:
            return self._connect_locked(deadline)
        finally:
            self.lock.release()

    def warm(self) -> None:
        """Connect on a thread of its own, ``nsq-connect-<address>`` (for pub_async, which
        never connects on the caller's thread), unless it waits out a reconnect delay or is
        being connected."""
        if self.warming or self.lock.locked() or self.down_until > time.monotonic():
            return
        if self._closed():
            return
        self.warming = True

        def connect() -> None:
            try:
                self.connection(time.monotonic() + self._config.handshake_timeout)
            except NSQError:
                pass  # closed meanwhile
            finally:
                self.warming = False

        self.warmer = threading.Thread(
            target=connect, name=f"nsq-connect-{self.address}", daemon=True
        )
        self.warmer.start()

    def _connect_locked(self, deadline: float | None) -> Connection | None:
        conn = self.conn
        if conn is not None and conn.is_connected:
            return conn
        if self._closed():
            raise ConnectionClosedError("this Producer is closed", maybe_processed=False)
        if conn is not None:
            self.retire(conn)
            self.conn = None
            if conn.join_refused is not None and self.joining:
                self.joining = False
                logger.warning(
                    "nsqd %s refused publishes joined into one MPUB (%s); they are sent again"
                    " one by one, and this Producer no longer joins publishes to it",
                    self.address,
                    conn.join_refused,
                )
            if not conn.is_closed and conn.pid == os.getpid():
                # nsqd sent an error it usually closes after, but kept the connection open
                # (youzan does after some errors): close it rather than leak its threads.
                conn.close(0.0)
        conn = Connection(self.address, self._config, caller_reads=True)
        conn.on_request_failed = self._on_request_failed
        self.dialing = conn
        try:
            conn.connect(deadline, "the publish's timeout: pub_timeout, or timeout=")
        except (OSError, NSQError) as exc:
            if self._closed():
                raise ConnectionClosedError(
                    "this Producer is closed", maybe_processed=False
                ) from exc
            self._failed(exc)
            return None
        finally:
            self.dialing = None
        if self._closed():  # made while close() gave up waiting for it
            conn.close(0.0)
            raise ConnectionClosedError("this Producer is closed", maybe_processed=False)
        if self.down_since is not None:
            logger.warning(
                "nsqd %s is reachable again after %.1fs; %d publishes could not use it meanwhile",
                self.address,
                time.monotonic() - self.down_since,
                self.skipped,
            )
            self.warned = False
        self.failures = 0
        self.down_until = 0.0
        self.down_since = None
        self.skipped = 0
        self.connects += 1
        self._set_join_limit(conn)
        self.conn = conn
        if self.http_address is not None and self.limits is None and not self.learning:
            self._learn_limits()
        return conn

    def _set_join_limit(self, conn: Connection) -> None:
        """Give ``conn`` the MPUB size it may join PUBs into (0 once this nsqd refused one)."""
        conn.join_limit = self._join_limit() if self._join_limit and self.joining else 0

    def _learn_limits(self) -> None:
        """Ask nsqd its size limits on a thread of its own (once answered, never again)."""
        self.learning = True

        def learned(address: str, msg: int, body: int) -> None:
            self.limits = (msg, body)
            if self._on_limits is not None:
                self._on_limits(address, msg, body)
            conn = self.conn
            if conn is not None:
                self._set_join_limit(conn)

        def done(answered: bool) -> None:
            self.learning = False

        assert self.http_address is not None
        self.learner = learn_in_background(
            self.address, self.http_address, self._config.dial_timeout, learned, done
        )

    def _failed(self, exc: BaseException) -> None:
        """Record a failed connection attempt; log it at WARNING once per outage (DEBUG
        afterwards), whether publishes fail over to another address or raise: a caller that
        catches the errors, or the nsqd nobody publishes to while another takes its share,
        must still leave one line in the service's log."""
        self.failures += 1
        self.last_error = exc
        self.failed_at = time.monotonic()
        delay = reconnect_delay(
            self.failures, self._config.reconnect_interval, self._config.max_reconnect_interval
        )
        self.down_until = time.monotonic() + delay
        if self.down_since is None:
            self.down_since = time.monotonic()
            logger.warning(
                "cannot connect to nsqd %s: %s (said once per outage; publishes to it fail"
                " over or raise until it is back)",
                self.address,
                exc,
            )
        else:
            logger.debug("still cannot connect to nsqd %s: %s", self.address, exc)

    # ---------------------------------------------------------------- outages

    def skip(self) -> None:
        """A publish could not use this address (counted for the reachable-again log)."""
        self.skipped += 1

    def waiting(self, now: float) -> bool:
        """True while it waits out a reconnect delay (``now``: ``time.monotonic()``)."""
        return self.down_until > now

    def outage(self, now: float) -> str:
        """Why the address is down, for an error: the last attempt's error, how long ago it
        was and when the next attempt is (``now``: ``time.monotonic()``)."""
        return (
            f"{self.address}: {self.last_error} (the last connection attempt's error,"
            f" {max(now - self.failed_at, 0.0):.1f}s ago; the next attempt is in"
            f" {max(self.down_until - now, 0.0):.1f}s)"
        )

    def tell_failover(self, used: str) -> None:
        """Once per outage, at INFO: publishes meant for this address succeed at ``used`` and
        the others (the outage itself was logged at WARNING when it began)."""
        if not self.warned:
            self.warned = True
            logger.info(
                "nsqd %s is unreachable (%s); publishes go to %s and the other addresses until"
                " it is back",
                self.address,
                self.last_error,
                used,
            )

    # ---------------------------------------------------------------- this process's connection

    def ours(self) -> Connection | None:
        """The connection when this process made it (not one inherited across a fork)."""
        conn = self.conn
        return conn if conn is not None and conn.pid == os.getpid() else None

    def drop(self) -> None:
        """Close the connection now (what nsqd left unread on it would be taken for commands);
        the next publish makes a new one."""
        conn = self.ours()
        if conn is not None:
            conn.close(0.0)

    def close(self, timeout: float) -> None:
        """Once the Producer is closed: abort a connection being made, close the connection
        (waiting up to ``timeout`` seconds in all), keeping its counters, and join the
        threads it started (``nsq-connect-<address>``, ``nsq-limits-<address>``)."""
        deadline = time.monotonic() + max(timeout, 0.0)
        dialing = self.dialing
        if dialing is not None:
            dialing.abort_connect()  # a blackholed or hung nsqd: the dial and handshake end now
        locked = self.lock.acquire(timeout=max(deadline - time.monotonic(), 0.1))
        try:
            conn, self.conn = self.conn, None
            if conn is not None:
                self.retire(conn)
        finally:
            if locked:
                self.lock.release()
        if conn is not None and conn.pid == os.getpid():
            conn.close(max(deadline - time.monotonic(), 0.0))
        current = threading.current_thread()
        for thread in (self.warmer, self.learner):
            if thread is not None and thread is not current:
                thread.join(max(deadline - time.monotonic(), 0.1))

    # ---------------------------------------------------------------- counters

    def retire(self, conn: Connection) -> None:
        """Fold a connection that is being replaced or closed into the endpoint's totals."""
        stats = conn.stats()
        for key in CUMULATIVE:
            self.totals[key] += stats[key]

    def counters(self) -> dict[str, int]:
        """The CUMULATIVE counters over every connection this endpoint has had."""
        out = dict(self.totals)
        if self.conn is not None:
            stats = self.conn.stats()
            for key in CUMULATIVE:
                out[key] += stats[key]
        return out

    def stats(self) -> dict[str, Any]:
        """This address's entry in :meth:`Producer.stats <nsqclient.Producer.stats>`."""
        conn = self.conn
        return {
            "address": self.address,
            "connected": bool(conn and conn.is_connected),
            "failures": self.failures,
            "last_error": repr(self.last_error) if self.last_error else None,
            **self.counters(),
            "connects": self.connects,
            "max_msg_size": self.limits[0] if self.limits else None,
            "max_body_size": self.limits[1] if self.limits else None,
            "connection": conn.stats() if conn is not None else None,
        }
