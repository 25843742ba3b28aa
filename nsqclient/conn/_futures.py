"""What a request to nsqd returns: the objects its answer is delivered to.

* :class:`RequestFuture`: a :class:`concurrent.futures.Future` that is cheap to make and to
  complete (``pub_async()``, pipelined requests);
* :class:`Waiter`: a lighter one-shot result for a caller that blocks until the answer
  (``pub()``).

A :class:`~nsqclient.conn.Connection` completes either with ``set_result`` /
``set_exception`` when nsqd answers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, wait
from concurrent.futures._base import (
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    RUNNING,
)
from typing import Any, TypeVar

__all__ = ["AnyFuture", "RequestFuture", "Waiter", "failure_of", "wait_answered"]


class Waiter:
    """A one-shot result for a blocking caller: lighter than a concurrent.futures.Future (one
    pre-acquired lock, released once the result is in).  Has the part of the Future interface a
    Connection uses: ``set_result``, ``set_exception``, ``done``.

    Any number of threads may wait on it: each waiter that gets the lock releases it at once,
    so the next one gets it too (a publish's answer must reach both ``pub()`` and a ``close()``
    waiting for it).  The first ``set_*`` wins; later ones are ignored.
    """

    __slots__ = ("_lock", "_result", "_exception", "_done", "conn", "reading")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._result: Any = None
        self._exception: BaseException | None = None
        self._done = False
        #: the Connection the request went to (set by whoever sends it), for read_until();
        #: typed Any because conn/_connection.py imports this module, not the other way round
        self.conn: Any = None
        #: True while its caller holds that connection's reading (see Connection.read_until)
        self.reading = False

    def done(self) -> bool:
        return self._done

    def failure(self) -> BaseException | None:
        """The exception it failed with, None while not done or when it succeeded."""
        return self._exception

    def set_result(self, result: Any) -> None:
        if self._done:
            return
        self._result = result
        self._done = True
        self._lock.release()

    def set_exception(self, exception: BaseException) -> None:
        if self._done:
            return
        self._exception = exception
        self._done = True
        self._lock.release()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Wait up to ``timeout`` seconds; raise TimeoutError if still not done."""
        if not self._done:
            if not self._lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
                raise TimeoutError
            self._lock.release()  # wake the next waiter, if any
        return self._exception

    def result(self, timeout: float | None = None) -> Any:
        """Wait up to ``timeout`` seconds for the result; raise its exception, or
        TimeoutError."""
        exc = self.exception(timeout)
        if exc is not None:
            raise exc
        return self._result


_DONE = (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED)
_condition_lock = threading.Lock()
# Lent to every RequestFuture first asked for its Condition once finished: nobody ever waits
# to be notified on a finished future, so they can share one (an RLock, as wait() holds all
# the Conditions of its futures at once).
_finished_condition = threading.Condition(threading.RLock())
# Taken by RequestFuture.watch() and by a finishing future that was watched.
_watch_lock = threading.Lock()


class RequestFuture(Future):
    """A :class:`concurrent.futures.Future` for a request already on its way (so it starts
    RUNNING and cannot be cancelled), cheap to make and to complete: its Condition is made
    only when some thread has to wait on it (``result()`` before the answer, ``wait()``,
    ``as_completed()``, ``add_done_callback()``).  Everything a Future offers works.

    Completing it never blocks on a lock nobody waits on: the state is written first, then
    waiters, if any, are woken under the Condition; a waiter makes the Condition first and
    reads the state under it, so one of the two always sees the other.

    Args:
        on_failure: called with the future when it fails while nobody has taken its outcome
            yet (:attr:`observed` False): how a Producer learns of failures that no caller
            will see.  (A request's future on a Connection needs none: the Connection tells
            its ``on_request_failed`` hook.)

    ``observed`` turns True once a caller asked for the outcome (``result()``,
    ``exception()``) or added a done callback; the library's own bookkeeping uses
    :meth:`failure`, :meth:`watch` and :func:`wait_answered`, which do not count.
    """

    #: True once a caller asked for the outcome or added a done callback (see above)
    observed = False
    #: watch() was called (set before it looks at the state; _finish reads it after setting it)
    _watching = False
    _on_failure: Callable[[RequestFuture], None] | None = None

    def __init__(
        self, on_failure: Callable[[RequestFuture], None] | None = None
    ) -> None:  # no super().__init__(): it would make the Condition now
        self._cond: threading.Condition | None = None
        self._state = RUNNING
        self._result: Any = None
        self._exception: BaseException | None = None
        self._waiters: list[Any] = []
        self._done_callbacks: list[Any] = []
        if on_failure is not None:
            self._on_failure = on_failure

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        cond = self._cond
        if cond is None and self._state == FINISHED:
            return _finished_condition
        if cond is None:
            with _condition_lock:
                cond = self._cond
                if cond is None:
                    cond = self._cond = threading.Condition()
        return cond

    def done(self) -> bool:
        return self._state in _DONE

    def running(self) -> bool:
        return self._state == RUNNING

    def cancelled(self) -> bool:
        return self._state in (CANCELLED, CANCELLED_AND_NOTIFIED)

    def result(self, timeout: float | None = None) -> Any:
        self.observed = True
        if self._state == FINISHED:
            if self._exception is not None:
                raise self._exception
            return self._result
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self.observed = True
        if self._state == FINISHED:
            return self._exception
        return super().exception(timeout)

    def add_done_callback(self, fn: Callable[[Future], object]) -> None:
        self.observed = True
        super().add_done_callback(fn)

    def failure(self) -> BaseException | None:
        """The exception it failed with, None while not done or when it succeeded; does not
        count as taking the outcome."""
        return self._exception

    def answer(self) -> Any:
        """The result once done (None before, or when it failed); does not count as taking the
        outcome."""
        return self._result

    def watch(self, fn: Callable[[Future], object]) -> None:
        """``add_done_callback`` for the library's own bookkeeping: does not count as taking
        the outcome (:attr:`observed` stays as it is), and makes no Condition (one module
        lock, held for two operations, instead: see _finish)."""
        self._watching = True
        with _watch_lock:
            if self._state != FINISHED:
                self._done_callbacks.append(fn)
                return
        fn(self)

    def set_result(self, result: Any) -> None:
        self._finish(result, None)

    def set_exception(self, exception: BaseException | None) -> None:
        self._finish(None, exception)

    def _finish(self, result: Any, exception: BaseException | None) -> None:
        if self._state in _DONE:
            from concurrent.futures import InvalidStateError

            raise InvalidStateError(f"{self._state}: {self!r}")
        self._result = result
        self._exception = exception
        self._state = FINISHED
        cond = self._cond
        if cond is not None:
            with cond:
                for waiter in self._waiters:
                    if exception is None:
                        waiter.add_result(self)
                    else:
                        waiter.add_exception(self)
                cond.notify_all()
        if self._watching:
            # A watch() that saw the state before it was FINISHED has appended its callback
            # once this lock is free; one that comes later sees FINISHED and calls it itself.
            with _watch_lock:
                pass
        if self._done_callbacks:
            self._invoke_callbacks()  # type: ignore[attr-defined]  # not in typeshed
        if exception is not None and not self.observed and self._on_failure is not None:
            self._on_failure(self)


#: what a request's answer is delivered to: a Future, or a Waiter for a blocking caller
AnyFuture = TypeVar("AnyFuture", Future, Waiter)


def failure_of(future: Future | Waiter) -> BaseException | None:
    """The exception ``future`` failed with (None while not done, or when it succeeded),
    without counting as taking its outcome."""
    if isinstance(future, RequestFuture | Waiter):
        return future.failure()
    return future.exception(0) if future.done() else None


def wait_answered(future: Future | Waiter, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``future`` to be done, without counting as taking its
    outcome (see :attr:`RequestFuture.observed`); True if it is done."""
    if future.done():
        return True
    if isinstance(future, Waiter):
        try:
            future.exception(timeout)
        except TimeoutError:
            return False
        return True
    wait([future], timeout=max(timeout, 0.0))
    return future.done()
