"""Producer: publish from plain synchronous or threaded code.

``pub()``/``mpub()``/``dpub()`` return once nsqd answered OK and raise otherwise; the ``*_async``
forms return a :class:`concurrent.futures.Future`.  One Producer is meant to be shared by every
thread of a process: concurrent publishes are pipelined over the same connection and each gets
its own answer.

Guarantees, stated plainly:

* A publish that returned was stored by nsqd.
* A publish that raised :class:`ServerError` was refused by nsqd and not stored.
* A publish that raised :class:`ConnectionClosedError` with ``maybe_processed`` True (the
  connection died while it was in flight) may or may not have been stored; nsqclient does not
  resend it unless ``pub_retries`` > 0, which trades this uncertainty for possible duplicates.
* A publish queued behind a fatal error on the same connection was provably not processed by nsqd
  (nsqd handles commands in order and closes right after a fatal error); ``pub()`` resends such
  publishes by itself.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from . import protocol
from .backoff import reconnect_delay
from .checks import check_float
from .config import Config
from .conn import AnyFuture, Connection, RequestFuture, Waiter, parse_address
from .errors import ConnectionClosedError, NSQError, NSQTimeoutError

__all__ = ["Producer"]

logger = logging.getLogger("nsqclient.producer")

_producers: weakref.WeakSet[Producer] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for producer in list(_producers):
        producer._after_fork()


os.register_at_fork(after_in_child=_reset_after_fork)


def _flush_at_exit() -> None:
    """At interpreter exit, deliver what every unclosed Producer accepted (see
    :meth:`Producer.close`); the connection threads are daemons and would die with it."""
    for producer in list(_producers):
        if not producer.closed and producer._pid == os.getpid():
            producer._close_at_exit()


atexit.register(_flush_at_exit)

#: Counters summed over every connection a slot has had (see Producer.stats).
_CUMULATIVE = ("messages_sent", "bytes_in", "bytes_out")


class _Slot:
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
        #: _CUMULATIVE counters of the connections this slot had before the current one
        self.totals = dict.fromkeys(_CUMULATIVE, 0)

    def retire(self, conn: Connection) -> None:
        """Fold a connection that is being replaced or closed into the slot's totals."""
        stats = conn.stats()
        for key in _CUMULATIVE:
            self.totals[key] += stats[key]

    def counters(self) -> dict[str, int]:
        """The _CUMULATIVE counters over every connection this slot has had."""
        out = dict(self.totals)
        if self.conn is not None:
            stats = self.conn.stats()
            for key in _CUMULATIVE:
                out[key] += stats[key]
        return out


class Producer:
    """Publishes to one or more nsqd.

    Args:
        nsqd_tcp_addresses: ``"host:port"`` or a list of them.  Publishes go round-robin over
            the addresses; an address that cannot be reached is skipped (with a growing
            reconnect delay) and the publish goes to the next one.
        **options: any option of :class:`~nsqclient.config.Config` (``pub_timeout``,
            ``dial_timeout``, ``tls_v1``, ``snappy``, ``auth_secret``, ``heartbeat_interval``...).
            Durations are seconds.

    Connections are made on first use.  A Producer made before ``os.fork()`` (gunicorn
    ``--preload``) works in the child: the child makes its own connections.
    """

    def __init__(self, nsqd_tcp_addresses: str | Sequence[str], **options: Any):
        if isinstance(nsqd_tcp_addresses, str):
            nsqd_tcp_addresses = [nsqd_tcp_addresses]
        addresses = [f"{h}:{p}" for h, p in map(parse_address, nsqd_tcp_addresses)]
        if not addresses:
            raise ValueError("Producer needs at least one nsqd address")
        self.config = Config(**options)
        self._slots = [_Slot(a) for a in addresses]
        self._rr = itertools.count()
        #: topic -> b"PUB <topic>\n", for topics already checked (bounded, see _pub_command)
        self._pub_lines: dict[str, bytes] = {}
        self._closed = False
        self._pid = os.getpid()
        _producers.add(self)

    def __repr__(self) -> str:
        return f"<Producer {[s.address for s in self._slots]}{' closed' if self._closed else ''}>"

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---------------------------------------------------------------- public API

    def pub(self, topic: str, body: bytes | str, timeout: float | None = None) -> None:
        """Publish one message; return when nsqd answered OK.

        Args:
            body: bytes, bytearray, memoryview, or str (sent as UTF-8).
            timeout: seconds to wait for the answer (default: the ``pub_timeout`` option).

        Raises:
            ValueError: bad topic or body, before anything is sent.
            TypeError: a body of the wrong type, before anything is sent.
            ServerError: nsqd refused it (e.g. BadMessageError when too big).
            ConnectionClosedError: no nsqd could be reached, or the connection died.
            NSQTimeoutError: no answer within ``timeout`` (the outcome is unknown).
        """
        self._publish(self._pub_command(topic, body), timeout)

    def mpub(self, topic: str, bodies: Sequence[bytes | str], timeout: float | None = None) -> None:
        """Publish several messages atomically (one MPUB); see :meth:`pub`."""
        self._publish(protocol.mpub(topic, bodies), timeout)

    def dpub(
        self, topic: str, body: bytes | str, delay: float, timeout: float | None = None
    ) -> None:
        """Publish one message that nsqd delivers after ``delay`` seconds; see :meth:`pub`."""
        self._publish(protocol.dpub(topic, _delay_ms(delay), body), timeout)

    def pub_async(self, topic: str, body: bytes | str) -> Future:
        """Publish without waiting; the Future resolves to nsqd's answer (``b"OK"``) or fails
        with the error :meth:`pub` would raise.  Bad input raises here, at once."""
        return self._submit(self._pub_command(topic, body), None, RequestFuture)

    def mpub_async(self, topic: str, bodies: Sequence[bytes | str]) -> Future:
        """:meth:`mpub` without waiting; see :meth:`pub_async`."""
        return self._submit(protocol.mpub(topic, bodies), None, RequestFuture)

    def dpub_async(self, topic: str, body: bytes | str, delay: float) -> Future:
        """:meth:`dpub` without waiting; see :meth:`pub_async`."""
        return self._submit(protocol.dpub(topic, _delay_ms(delay), body), None, RequestFuture)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every publish accepted so far (``pub_async`` ones included) has nsqd's
        answer or has failed; ``timeout`` in seconds (default: ``pub_timeout``).

        Raises:
            NSQTimeoutError: some publishes were still unanswered after ``timeout``; it says
                how many.  They stay in flight: their futures resolve later.
        """
        timeout = self.config.pub_timeout if timeout is None else timeout
        unanswered, _ = self._wait_answered(time.monotonic() + timeout)
        if unanswered:
            raise NSQTimeoutError(
                f"{unanswered} publishes still without nsqd's answer after {timeout:g}s"
            )

    def close(self, timeout: float = 5.0) -> None:
        """Wait up to ``timeout`` seconds for publishes in flight, then close every connection.
        Publishing afterwards raises ConnectionClosedError.

        A Producer that was never closed is closed at interpreter exit: it waits up to the
        ``exit_flush_timeout`` option (seconds) for what it accepted, and logs an ERROR naming
        how many publishes it could not deliver."""
        self._closed = True
        deadline = time.monotonic() + timeout
        for slot in self._slots:
            with slot.lock:
                conn, slot.conn = slot.conn, None
                if conn is not None:
                    slot.retire(conn)
            if conn is not None and conn.pid == os.getpid():
                conn.close(max(deadline - time.monotonic(), 0.0))

    def _wait_answered(self, deadline: float) -> tuple[int, int]:
        """Wait until ``deadline`` for the requests in flight now; return (still unanswered,
        failed)."""
        pending = []
        for slot in self._slots:
            conn = slot.conn
            if conn is not None and conn.pid == os.getpid():
                pending.extend(conn.pending_requests())
        unanswered = failed = 0
        for future in pending:
            try:
                if future.exception(timeout=max(deadline - time.monotonic(), 0.0)) is not None:
                    failed += 1
            except TimeoutError:
                unanswered += 1
        return unanswered, failed

    def _close_at_exit(self) -> None:
        timeout = self.config.exit_flush_timeout
        unanswered, failed = self._wait_answered(time.monotonic() + timeout)
        if unanswered or failed:
            logger.error(
                "Producer %s was not closed before exit: %d publishes could not be delivered"
                " (%d without an answer after exit_flush_timeout=%gs, %d failed); call"
                " close() or flush() before exiting",
                [s.address for s in self._slots],
                unanswered + failed,
                unanswered,
                timeout,
                failed,
            )
        self.close(timeout=0.0)

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> dict[str, Any]:
        """Counters for the Producer's whole life, and one entry per nsqd address.

        Returns a dict: ``messages_sent`` (messages in the PUB/MPUB/DPUB written), ``bytes_in``,
        ``bytes_out`` and ``connects``, summed over every connection it has had (they survive
        reconnects), and ``nsqd``: a list with, per address, the same cumulative counters,
        ``connected``, ``failures`` (consecutive failed connection attempts), ``last_error``
        and ``connection`` (the current connection's own figures, or None).
        """
        entries = []
        totals = dict.fromkeys((*_CUMULATIVE, "connects"), 0)
        for slot in self._slots:
            conn = slot.conn
            counters = slot.counters()
            counters["connects"] = slot.connects
            for key, value in counters.items():
                totals[key] += value
            entries.append(
                {
                    "address": slot.address,
                    "connected": bool(conn and conn.is_connected),
                    "failures": slot.failures,
                    "last_error": repr(slot.last_error) if slot.last_error else None,
                    **counters,
                    "connection": conn.stats() if conn is not None else None,
                }
            )
        return {**totals, "nsqd": entries}

    # ---------------------------------------------------------------- internals

    def _pub_command(self, topic: str, body: bytes | str) -> bytes:
        """``protocol.pub(topic, body)``, with the command line of a topic already checked
        taken from a cache when the body is plain non-empty bytes."""
        line = self._pub_lines.get(topic)
        if line is not None and type(body) is bytes and body:
            return line + len(body).to_bytes(4, "big") + body
        command = protocol.pub(topic, body)  # checks the topic and the body
        if len(self._pub_lines) >= 1024:
            self._pub_lines.clear()
        self._pub_lines[topic] = command[: command.index(b"\n") + 1]
        return command

    def _publish(self, command: bytes, timeout: float | None) -> bytes:
        timeout = self.config.pub_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        retries_left = self.config.pub_retries
        while True:
            try:
                future = self._submit(command, deadline, Waiter)
            except ConnectionClosedError as exc:
                if time.monotonic() >= deadline:
                    raise NSQTimeoutError(f"no nsqd connection within {timeout}s: {exc}") from exc
                raise
            conn = future.conn
            if conn is not None:
                conn.read_until(future, deadline)  # read our own answer when nobody else is
            try:
                return future.result(max(deadline - time.monotonic(), 0.0))
            except TimeoutError as exc:
                if isinstance(exc, NSQError):
                    raise
                raise NSQTimeoutError(
                    f"nsqd did not answer within {timeout}s; the publish may or may not be stored"
                ) from None
            except ConnectionClosedError as exc:
                if self._closed or time.monotonic() >= deadline:
                    raise
                if exc.maybe_processed:
                    if retries_left <= 0:
                        raise
                    retries_left -= 1
                logger.info("publish failed (%s); sending it again", exc)

    def _submit(
        self,
        command: bytes,
        deadline: float | None,
        make_future: Callable[[], AnyFuture],
    ) -> AnyFuture:
        if self._closed:
            raise ConnectionClosedError("this Producer is closed", maybe_processed=False)
        errors = []
        count = protocol.published_count(command)
        slots = self._slots
        n = len(slots)
        if n > 1:
            start = next(self._rr) % n
            slots = slots[start:] + slots[:start]
            now = time.monotonic()
            if any(s.down_until > now for s in slots):
                # Healthy addresses first, then those waiting out a reconnect delay.
                slots.sort(key=lambda s: s.down_until > now)
        for slot in slots:
            conn = self._connection(slot, deadline)
            if conn is None:
                slot.skipped += 1
                errors.append(f"{slot.address}: {slot.last_error}")
                continue
            future = conn.request(command, make_future(), count)
            if _not_processed(future):
                # It closed just now, before nsqd took the command: nothing was stored.
                # One fresh connection to the same nsqd, then the next address.
                if isinstance(future, Waiter):
                    conn.read_until(future, 0.0)  # gives back a reading it claimed
                conn = self._connection(slot, deadline)
                if conn is not None:
                    future = conn.request(command, make_future(), count)
                if conn is None or _not_processed(future):
                    errors.append(f"{slot.address}: {slot.last_error or future.exception()}")
                    continue
            if isinstance(future, Future):
                future.nsqd_address = slot.address  # type: ignore[attr-defined]
            else:
                future.conn = conn
            return future
        raise ConnectionClosedError(
            "could not reach any nsqd: " + "; ".join(errors), maybe_processed=False
        )

    def _connection(self, slot: _Slot, deadline: float | None = None) -> Connection | None:
        # (A forked child gets fresh slots from the at-fork hook, before it can get here.)
        conn = slot.conn
        if conn is not None and conn.is_connected:
            return conn
        remaining = None if deadline is None else deadline - time.monotonic()
        if not slot.lock.acquire(timeout=-1 if remaining is None else max(remaining, 0.0)):
            slot.last_error = NSQTimeoutError(f"timed out waiting to connect to {slot.address}")
            return None
        try:
            return self._connect_locked(slot, deadline)
        finally:
            slot.lock.release()

    def _connect_locked(self, slot: _Slot, deadline: float | None) -> Connection | None:
        conn = slot.conn
        if conn is not None and conn.is_connected:
            return conn
        if self._closed:
            raise ConnectionClosedError("this Producer is closed", maybe_processed=False)
        if conn is not None:
            slot.retire(conn)
            slot.conn = None
        conn = Connection(slot.address, self.config, caller_reads=True)
        try:
            conn.connect(deadline)
        except (OSError, NSQError) as exc:
            self._connect_failed(slot, exc)
            return None
        if slot.down_since is not None:
            logger.warning(
                "nsqd %s is reachable again after %.1fs; %d publishes could not use it meanwhile",
                slot.address,
                time.monotonic() - slot.down_since,
                slot.skipped,
            )
        slot.failures = 0
        slot.down_until = 0.0
        slot.down_since = None
        slot.skipped = 0
        slot.connects += 1
        slot.conn = conn
        return conn

    def _connect_failed(self, slot: _Slot, exc: BaseException) -> None:
        """Record a failed connection attempt; log it once per outage (DEBUG afterwards)."""
        slot.failures += 1
        slot.last_error = exc
        delay = reconnect_delay(
            slot.failures, self.config.reconnect_interval, self.config.max_reconnect_interval
        )
        slot.down_until = time.monotonic() + delay
        if slot.down_since is None:
            slot.down_since = time.monotonic()
            logger.warning(
                "cannot connect to nsqd %s: %s (said once per outage; publishes to it fail"
                " over or raise until it is back)",
                slot.address,
                exc,
            )
        else:
            logger.debug("still cannot connect to nsqd %s: %s", slot.address, exc)

    def _after_fork(self) -> None:
        """In a forked child: forget the parent's connections (their threads did not survive
        the fork; their sockets are the parent's) and start afresh."""
        if os.getpid() == self._pid:
            return
        self._pid = os.getpid()
        self._slots = [_Slot(s.address) for s in self._slots]


def _not_processed(future: Future | Waiter) -> bool:
    """True when the request has already failed in a way that proves nsqd did not process it
    (refused before sending, or queued behind a fatal error), so sending it elsewhere cannot
    store it twice.  A request written directly may already be answered, even with an error
    that closes the connection: that answer is the caller's."""
    if not future.done():
        return False
    exc = future.exception()
    return isinstance(exc, ConnectionClosedError) and not exc.maybe_processed


def _delay_ms(delay: float) -> int:
    return int(round(check_float(delay, "delay", "seconds", min=0) * 1000))
