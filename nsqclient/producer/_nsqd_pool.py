"""The nsqd endpoints of a Producer, and writing one command on them.

A :class:`NsqdPool` holds an :class:`~nsqclient.producer._endpoint.Endpoint` per address: the
addresses the Producer was given, in order, and those lookup named.  It writes a command on
the first endpoint that can take it (round robin over the given ones; healthy addresses
before those waiting out a reconnect delay; a failed-over address is told of once per outage), sends
again what nsqd provably did not take, and reads a blocking caller's answer.  It is what
publishing by lookup writes through (:class:`~nsqclient.producer._by_lookup.NsqdWriter`).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from typing import Any

from .. import protocol
from ..config import Config
from ..conn._connection import AnyFuture, Connection, RequestFuture, Waiter
from ..conn._futures import failure_of
from ..errors import ConnectionClosedError, NSQError, NSQTimeoutError
from ..observe import PublishEvent
from ._endpoint import CUMULATIVE, Endpoint

__all__ = ["NsqdPool"]

logger = logging.getLogger("nsqclient.producer")


class NsqdPool(Mapping[str, Endpoint]):
    """Every endpoint of a Producer, by address (a read-only mapping).

    Args:
        addresses: the ``"host:port"`` the Producer was given (publishes not by lookup go
            round robin over them).
        config: the Producer's options.
        on_request_failed: given to every connection (the ledger's ``note``).
        sent: called after a command was written with a deadline (makes sure the deadline
            keeper runs).
        http_addresses: the HTTP address of each of ``addresses`` (None: unknown), where its
            size limits are asked once connected.
        on_limits: ``on_limits(address, max_msg_size, max_body_size)`` when an nsqd stated
            them (the Producer's :meth:`Limits.learn <nsqclient.producer._limits.Limits.learn>`).
        join_limit: given to every endpoint (see :class:`Endpoint`; None: no connection joins
            PUBs).
    """

    def __init__(
        self,
        addresses: list[str],
        config: Config,
        on_request_failed: Callable[[RequestFuture], None],
        sent: Callable[[], None],
        http_addresses: list[str | None] | None = None,
        on_limits: Callable[[str, int, int], None] | None = None,
        join_limit: Callable[[], int] | None = None,
    ):
        self.config = config
        self._on_limits = on_limits
        self._join_limit = join_limit
        #: True once the Producer is closed: nothing is written or connected any more
        self.closed = False
        self._on_request_failed = on_request_failed
        self._sent = sent
        self._rr = itertools.count()
        self._lock = threading.Lock()
        #: the endpoints of the given addresses, in order
        https = http_addresses or [None] * len(addresses)
        self.given = [self._new_endpoint(a, h) for a, h in zip(addresses, https, strict=True)]
        self._by_address = {e.address: e for e in self.given}
        #: the one given address's endpoint, when exactly one is given (no rotation to do)
        self._single = self.given[0] if len(self.given) == 1 else None

    # ---------------------------------------------------------------- the endpoints

    def __getitem__(self, address: str) -> Endpoint:
        return self._by_address[address]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._by_address))

    def __len__(self) -> int:
        return len(self._by_address)

    def endpoint(self, address: str, http_address: str | None = None) -> Endpoint:
        """The pool's endpoint of ``address`` (made on first use); ``http_address``: its
        HTTP address, when lookup named it."""
        endpoint = self._by_address.get(address)
        if endpoint is None:
            with self._lock:
                endpoint = self._by_address.setdefault(
                    address, self._new_endpoint(address, http_address)
                )
        if endpoint.http_address is None and http_address is not None:
            endpoint.http_address = http_address
        return endpoint

    def _new_endpoint(self, address: str, http_address: str | None = None) -> Endpoint:
        """A new endpoint of the pool (see :meth:`endpoint` for the one of an address)."""
        return Endpoint(
            address,
            self.config,
            self._on_request_failed,
            self._is_closed,
            http_address,
            self._on_limits,
            self._join_limit,
        )

    def _is_closed(self) -> bool:
        return self.closed

    def connection_of(self, address: str) -> Connection | None:
        """The connection of the endpoint at ``address``, if any."""
        endpoint = self._by_address.get(address)
        return endpoint.conn if endpoint is not None else None

    def live_connections(self) -> list[Connection]:
        """The connections of this process that are not closed (for the deadline keeper)."""
        conns = []
        for endpoint in list(self._by_address.values()):
            conn = endpoint.ours()
            if conn is not None and not conn.is_closed:
                conns.append(conn)
        return conns

    def pending_requests(self) -> list[Future | Waiter]:
        """The requests written on this process's connections and not answered yet."""
        pending: list[Future | Waiter] = []
        for endpoint in list(self._by_address.values()):
            conn = endpoint.ours()
            if conn is not None:
                pending.extend(conn.pending_requests())
        return pending

    def close(self, deadline: float) -> None:
        """Close every connection, waiting until ``deadline`` (a ``time.monotonic()``)."""
        for endpoint in list(self._by_address.values()):
            endpoint.close(deadline - time.monotonic())

    def stats(self) -> dict[str, Any]:
        """See :meth:`Producer.stats <nsqclient.Producer.stats>`."""
        entries = [endpoint.stats() for endpoint in list(self._by_address.values())]
        totals = {key: sum(e[key] for e in entries) for key in (*CUMULATIVE, "connects")}
        return {**totals, "nsqd": entries}

    # ---------------------------------------------------------------- writing a command
    # closed, endpoint, publish_on, submit_now and submit_connecting are what publishing by
    # lookup asks of the pool (nsqclient.producer._by_lookup.NsqdWriter).

    def publish_on(
        self,
        command: bytes,
        endpoints: list[Endpoint] | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        event: PublishEvent | None = None,
    ) -> bytes:
        """Write ``command`` on the first of ``endpoints`` (default: the given addresses,
        round robin) that can take it and return nsqd's answer, within ``timeout`` seconds
        (default ``pub_timeout``) or by ``deadline`` (a ``time.monotonic()``).  A publish
        that provably did not reach nsqd is sent again; one that may have, ``pub_retries``
        times."""
        timeout = self.config.pub_timeout if timeout is None else timeout
        if deadline is None:
            deadline = time.monotonic() + timeout
        retries_left = self.config.pub_retries
        while True:
            try:
                future = self.write_connecting(command, deadline, Waiter, endpoints)
            except ConnectionClosedError as exc:
                if time.monotonic() >= deadline:
                    raise NSQTimeoutError(
                        f"no nsqd connection within {timeout:g}s (nothing was sent): {exc}",
                        maybe_processed=False,
                    ) from exc
                raise
            conn = future.conn
            if conn is not None:
                if event is not None:
                    event.nsqd_address = conn.address
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
                if self.closed or time.monotonic() >= deadline:
                    raise
                if exc.maybe_processed:
                    if retries_left <= 0:
                        raise
                    retries_left -= 1
                logger.info("publish failed (%s); sending it again", exc)

    def submit_now(self, command: bytes, endpoints: list[Endpoint] | None = None) -> Future | None:
        """``command`` written on a connection already made, never blocking: its Future, or
        None when none is ready (see :meth:`write_ready`)."""
        future = RequestFuture()
        return future if self.write_ready(command, future, endpoints) else None

    def write_ready(
        self,
        command: bytes,
        future: RequestFuture,
        endpoints: list[Endpoint] | None = None,
        count: int | None = None,
    ) -> bool:
        """Hand ``command``, whose answer goes to ``future``, to the first of ``endpoints``
        (default: the given addresses, round robin) with a connection already made, never
        blocking; the addresses passed over are then connected in the background.  False, and
        ``future`` left as it is, when none is ready.  ``count``: the messages it publishes
        (default: read from the command)."""
        if self.closed:
            raise ConnectionClosedError("this Producer is closed", maybe_processed=False)
        if count is None:
            count = protocol.published_count(command)
        if endpoints is None and self._single is not None:
            endpoint = self._single
            conn = endpoint.conn
            if conn is None or not conn.offer(command, future, count):
                return False
            future.nsqd_address = endpoint.address  # type: ignore[attr-defined]
            return True
        order = self.given if endpoints is None else endpoints
        if len(order) > 1:
            order = self._rotation(order)
        #: addresses passed over, not connected yet (made only when there is one)
        passed: list[Endpoint] | None = None
        for endpoint in order:
            conn = endpoint.conn  # a connection that takes no request refuses the offer
            if conn is not None and conn.offer(command, future, count):
                future.nsqd_address = endpoint.address  # type: ignore[attr-defined]
                for other in passed or ():
                    other.warm()
                return True
            passed = _passing(passed, endpoint)
        return False

    def write_connecting(
        self,
        command: bytes,
        deadline: float | None,
        make_future: Callable[[], AnyFuture],
        endpoints: list[Endpoint] | None = None,
    ) -> AnyFuture:
        """Write ``command`` on the first of ``endpoints`` (default: the given addresses,
        round robin) that takes it, connecting where needed (until ``deadline``); return its
        ``make_future()``, which tells nsqd's answer.  ConnectionClosedError (nothing was
        sent) when no nsqd could be reached."""
        if self.closed:
            raise ConnectionClosedError("this Producer is closed", maybe_processed=False)
        count = protocol.published_count(command)
        errors: list[tuple[str, BaseException | None, str | None]] = []
        passed: list[Endpoint] | None = None
        for endpoint in self._rotation(self.given if endpoints is None else endpoints):
            future = self._write_on(endpoint, command, deadline, make_future, count)
            if type(future) is _Refused:
                endpoint.skip()
                errors.append((endpoint.address, future.error, None))
                passed = _passing(passed, endpoint)
                continue
            for other in passed or ():
                other.tell_failover(endpoint.address)
            return future  # type: ignore[return-value]
        raise _unreachable(errors)

    def _write_on(
        self,
        endpoint: Endpoint,
        command: bytes,
        deadline: float | None,
        make_future: Callable[[], AnyFuture],
        count: int,
    ) -> AnyFuture | _Refused:
        """``command`` written on ``endpoint``'s connection, made now if need be (until
        ``deadline``): its future.  A connection that closed just now, before nsqd took the
        command (nothing was stored), is replaced once by a fresh one to the same nsqd."""
        error: BaseException | None = None
        for _ in range(2):
            conn = endpoint.connection(deadline)
            if conn is None:
                break
            future = make_future()
            if conn.offer(command, future, count) and not _not_processed(future):
                if isinstance(future, Waiter):
                    future.conn = conn
                else:
                    future.nsqd_address = endpoint.address  # type: ignore[attr-defined]
                return future
            _discard(future)
            error = failure_of(future) or error
            if isinstance(future, Waiter):
                conn.read_until(future, 0.0)  # gives back a reading it claimed
        return _Refused(endpoint.last_error or error)

    def _rotation(self, endpoints: list[Endpoint]) -> list[Endpoint]:
        """The order to try ``endpoints`` in: round robin, the healthy addresses before those
        waiting out a reconnect delay."""
        n = len(endpoints)
        if n < 2:
            return endpoints
        start = next(self._rr) % n
        order = endpoints[start:] + endpoints[:start]
        now = time.monotonic()
        if any(e.waiting(now) for e in order):
            order.sort(key=lambda e: e.waiting(now))
        return order

    def submit_connecting(
        self,
        command: bytes,
        endpoints: list[Endpoint] | None,
        deadline: float,
        first: bool = True,
    ) -> Future:
        """:meth:`write_connecting` until ``deadline`` (a ``time.monotonic()``).  ``first``
        (a publish from the backlog, not a retry): when every address is waiting out its
        reconnect delay after a failure, fail at once with that failure rather than try again
        for every publish queued behind the one that found it down."""
        if not first:
            future = self.write_connecting(command, deadline, RequestFuture, endpoints)
            self._sent()
            return future
        candidates = self.given if endpoints is None else endpoints
        now = time.monotonic()
        if candidates and all(s.live() is None and s.waiting(now) for s in candidates):
            for endpoint in candidates:
                endpoint.skip()
            raise _unreachable([(s.address, s.last_error, s.outage(now)) for s in candidates])
        if now >= deadline:
            raise NSQTimeoutError(
                f"no nsqd connection within pub_timeout ({self.config.pub_timeout:g}s);"
                " nothing was sent",
                maybe_processed=False,
            )
        try:
            return self.submit_connecting(command, endpoints, deadline, False)
        except ConnectionClosedError as exc:
            if self.closed or time.monotonic() < deadline:
                raise
            raise NSQTimeoutError(
                f"no nsqd connection within pub_timeout ({self.config.pub_timeout:g}s; nothing"
                f" was sent): {exc}",
                maybe_processed=False,
            ) from exc


class _Refused:
    """What :meth:`NsqdPool._write_on` returns when ``endpoint`` did not take the command:
    the error why (None: unknown)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None):
        self.error = error


def _unreachable(
    errors: list[tuple[str, BaseException | None, str | None]],
) -> ConnectionClosedError:
    """The error of a publish that found no nsqd to write to (nothing was sent): ``errors``
    holds each address tried, its error and, optionally, the text that tells it (default
    ``"address: error"``); the last error is the cause."""
    shown = "; ".join(text or f"{address}: {error}" for address, error, text in errors)
    exc = ConnectionClosedError(
        "could not reach any nsqd: " + shown,
        maybe_processed=False,
        address=", ".join(address for address, _, _ in errors) or None,
    )
    if errors:
        exc.__cause__ = errors[-1][1]
    return exc


def _not_processed(future: Future | Waiter) -> bool:
    """True when the request has already failed in a way that proves nsqd did not process it
    (refused before sending, or queued behind a fatal error), so sending it elsewhere cannot
    store it twice.  A request written directly may already be answered, even with an error
    that closes the connection: that answer is the caller's."""
    if not future.done():
        return False
    exc = failure_of(future)
    return isinstance(exc, ConnectionClosedError) and not exc.maybe_processed


def _discard(future: Future | Waiter) -> None:
    """A request that failed before nsqd took it and is sent again as a new one: its failure is
    nobody's to report (see :class:`~nsqclient.producer._undelivered.Ledger`)."""
    if isinstance(future, RequestFuture):
        future.observed = True


def _passing(passed: list[Endpoint] | None, endpoint: Endpoint) -> list[Endpoint]:
    """``passed`` with ``endpoint`` added (the list made on the first one)."""
    if passed is None:
        return [endpoint]
    passed.append(endpoint)
    return passed
