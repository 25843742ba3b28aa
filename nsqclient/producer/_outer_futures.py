"""The Futures a Producer hands out before their publish is on a connection, or while it is
sent again.

An asynchronous publish that cannot be written at once (it waits in the backlog for a
connection or a lookup, or for youzan's retry after a stale route) gets an *outer* Future at
the call; the request written for it later has its own *inner* Future on a connection, which
the outer one follows.  :class:`OuterFutures` keeps the outer ones until they are done:
``flush()`` and ``close()`` wait for them, each fails with NSQTimeoutError at its deadline
(:meth:`OuterFutures.expire`, called by the deadline keeper), and the send gate makes sure a
publish whose outer Future already failed saying "nothing was sent" is never sent.

A classic asynchronous publish's Future is a :class:`ResendableFuture`: it keeps its command
until nsqd answers, and when the publish fails in a way that proves nsqd did not process it (it
was queued behind a publish nsqd refused fatally: nsqd answers in order and closes the
connection after a fatal error), it is not failed but handed back to its Producer to be sent
again, becoming an outer Future (:meth:`OuterFutures.adopt`) until that answer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from ..conn._connection import Connection
from ..conn._future_internals import LazyFuture
from ..conn._futures import RequestFuture
from ..errors import ConnectionClosedError, NSQTimeoutError, ServerError

__all__ = ["OuterFuture", "OuterFutures", "ResendableFuture"]


class OuterFuture(RequestFuture):
    """The Future of an asynchronous publish not yet on a connection when it was handed out.

    Attributes:
        deadline: ``time.monotonic()`` by which it is done (see :meth:`OuterFutures.expire`).
        sent: its publish is being or was written (its outcome is unknown until nsqd answers).
        inner: the Future of the request written for it, once there is one.
        nsqd_address: where the (last attempt of the) publish went, once known.
        partition: youzan: the partition the (last attempt of the) publish went to.
    """

    deadline = 0.0
    sent = False
    inner: Future | None = None
    nsqd_address: str | None = None
    partition: int | None = None

    def __init__(self, deadline: float, on_failure: Callable[[RequestFuture], None]):
        super().__init__(on_failure)
        self.deadline = deadline


class ResendableFuture(OuterFuture):
    """The Future of a classic asynchronous publish, written at once or from the backlog, that
    is sent again when nsqd provably did not process it.

    Args:
        command: the publish as written (kept until the Future is done).
        resend: ``resend(future) -> bool``, called on the thread that fails the Future with a
            ConnectionClosedError whose ``maybe_processed`` is False and whose cause is nsqd's
            error (the connection closed after a fatal error, with this publish queued behind
            it; a reader thread: it must not block): True when the publish will be sent again
            (the Future stays running and follows that attempt), False to let it fail.
        on_failure: as :class:`~nsqclient.conn.RequestFuture`'s.
        deadline: ``time.monotonic()`` by which it ends, once known (0: from its first resend).

    Made once per ``pub_async()``: the callables are the Producer's, made once; every field it
    is sure to get is set here, in one order (see :class:`~nsqclient.conn.RequestFuture`).
    """

    def __init__(
        self,
        command: bytes,
        resend: Callable[[ResendableFuture], bool],
        on_failure: Callable[[RequestFuture], None],
        deadline: float = 0.0,
    ):
        LazyFuture.__init__(self)  # RequestFuture's fields set here: one call less
        self.observed = False
        self._on_failure = on_failure
        self._held = command  # dropped at nsqd's answer (see command)
        self._resend = resend
        self.nsqd_address = None
        self.deadline = deadline

    @property
    def command(self) -> bytes | None:
        """The publish as written, until nsqd answers it or it fails (None from then on: it
        is never sent again)."""
        return self._held

    def set_exception(self, exception: BaseException | None) -> None:
        if (
            exception is not None
            and type(exception) is ConnectionClosedError
            and not exception.maybe_processed
            and isinstance(exception.__cause__, ServerError)  # nsqd's fatal error, before it
            and self._held is not None
            and self._resend(self)
        ):
            return  # sent again: this Future follows the new attempt
        self._held = None
        self._finish(None, exception)


class OuterFutures:
    """The outer Futures of one Producer that are not done yet.

    Args:
        on_failure: a failed outer Future nobody looked at goes there (the ledger's ``note``).
        pub_timeout: seconds, for the error of one that expires.
        connection_of: the connection of the pool at an address (None when it has none), to
            expire an inner request that is on it.
        started: called when one is handed out (makes sure the deadline keeper runs).
    """

    def __init__(
        self,
        on_failure: Callable[[RequestFuture], None],
        pub_timeout: float,
        connection_of: Callable[[str], Connection | None],
        started: Callable[[], None],
    ):
        self._on_failure = on_failure
        self._pub_timeout = pub_timeout
        self._connection_of = connection_of
        self._started = started
        self._lock = threading.Lock()
        self._outers: set[OuterFuture] = set()
        #: taken by a backlogged publish before it is sent, and by its expiry (see may_send)
        self._send_gate = threading.RLock()

    def track(
        self,
        deadline: float,
        command: bytes | None = None,
        resend: Callable[[ResendableFuture], bool] | None = None,
    ) -> OuterFuture:
        """A running Future handed to a pub_async caller before its publish is written: flush()
        and close() wait for it until it is done, it fails with NSQTimeoutError at
        ``deadline`` (a ``time.monotonic()``; see expire), and it goes to ``on_failure``
        when it fails unseen.  With ``command`` and ``resend``: a :class:`ResendableFuture`."""
        outer: OuterFuture
        if resend is not None and command is not None:
            outer = ResendableFuture(command, resend, self._on_failure, deadline)
        else:
            outer = OuterFuture(deadline, self._on_failure)
        with self._lock:
            self._outers.add(outer)
        outer.watch(self.forget)
        self._started()
        return outer

    def adopt(self, outer: OuterFuture, deadline: float) -> None:
        """Keep ``outer``, already handed out, as :meth:`track` keeps a new one: its publish
        is to be sent again, by ``deadline`` (a ``time.monotonic()``)."""
        outer.deadline = deadline
        outer.sent = False
        outer.inner = None
        with self._lock:
            if outer in self._outers:
                return
            self._outers.add(outer)
        outer.watch(self.forget)
        self._started()

    def forget(self, outer: Future) -> None:
        """Stop keeping ``outer`` (done, or never handed out after all)."""
        with self._lock:
            self._outers.discard(outer)

    def pending(self) -> list[OuterFuture]:
        """The outer Futures not done yet."""
        with self._lock:
            return list(self._outers)

    def may_send(self, outer: OuterFuture) -> bool:
        """Before a backlogged or retried publish is written for ``outer``: False if ``outer``
        is done (its deadline passed: it failed saying nothing was sent, so nothing may be);
        otherwise mark it sent (from now on its outcome is unknown until nsqd answers)."""
        with self._send_gate:
            if outer.done():
                return False
            outer.sent = True
            return True

    def settle(
        self, outer: OuterFuture, result: Any = None, error: BaseException | None = None
    ) -> None:
        """Complete ``outer`` unless its deadline already failed it."""
        with self._send_gate:
            if outer.done():
                return
            if error is not None:
                outer.set_exception(error)
            else:
                outer.set_result(result)

    def chain(self, inner: Future, outer: OuterFuture) -> None:
        """Complete ``outer`` as ``inner`` completes (with its nsqd address)."""
        outer.nsqd_address = getattr(inner, "nsqd_address", None)

        def done(f: Future) -> None:
            error = f.exception()
            self.settle(outer, None if error is not None else f.result(), error)

        inner.add_done_callback(done)

    def expire(self, now: float) -> bool:
        """The deadline keeper's look at the outer Futures past their deadline: one never
        sent fails saying so; one whose publish is on a connection fails as that request
        expires there (never written: never will be); one being sent right now is left to
        its own deadline, which bounds the connecting.  True while some wait."""
        outers = self.pending()
        for outer in outers:
            if outer.deadline > now:
                continue
            with self._send_gate:
                if outer.done():
                    continue
                inner = outer.inner
                if not outer.sent:
                    outer.set_exception(
                        NSQTimeoutError(
                            f"no nsqd connection within pub_timeout ({self._pub_timeout:g}s);"
                            " nothing was sent",
                            maybe_processed=False,
                        )
                    )
                    continue
            if inner is not None and not inner.done():
                conn = self._connection_of(getattr(inner, "nsqd_address", None) or "")
                if conn is not None:
                    conn.expire_request(inner)  # outer follows through its chain
        return bool(outers)
