"""One nsqd address of a Producer's pool: its lazily made connection, the state of its
outages (failures in a row, when it may be tried again) and its counters across reconnects."""

from __future__ import annotations

import threading

from .conn import Connection

__all__ = ["Endpoint", "CUMULATIVE"]

#: Counters summed over every connection an endpoint has had (see Producer.stats).
CUMULATIVE = ("messages_sent", "bytes_in", "bytes_out")


class Endpoint:
    """One nsqd address of the pool and its (lazily made) connection."""

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
        "warned",
        "failed_at",
    )

    def __init__(self, address: str):
        self.address = address
        self.conn: Connection | None = None
        self.lock = threading.Lock()
        #: consecutive failed connection attempts (0 while connected)
        self.failures = 0
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
        #: a thread is connecting it for pub_async (see Producer._warm)
        self.warming = False
        #: the current outage was logged at WARNING (publishes failed over to other addresses)
        self.warned = False
        #: monotonic time of the last failed connection attempt
        self.failed_at = 0.0

    def live(self) -> Connection | None:
        """The connection, when it is connected."""
        conn = self.conn
        return conn if conn is not None and conn.is_connected else None

    def outage(self, now: float) -> str:
        """Why the address is down, for an error: the last attempt's error, how long ago it
        was and when the next attempt is (``now``: ``time.monotonic()``)."""
        return (
            f"{self.address}: {self.last_error} (the last connection attempt's error,"
            f" {max(now - self.failed_at, 0.0):.1f}s ago; the next attempt is in"
            f" {max(self.down_until - now, 0.0):.1f}s)"
        )

    def retire(self, conn: Connection) -> None:
        """Fold a connection that is being replaced or closed into the slot's totals."""
        stats = conn.stats()
        for key in CUMULATIVE:
            self.totals[key] += stats[key]

    def counters(self) -> dict[str, int]:
        """The CUMULATIVE counters over every connection this slot has had."""
        out = dict(self.totals)
        if self.conn is not None:
            stats = self.conn.stats()
            for key in CUMULATIVE:
                out[key] += stats[key]
        return out
