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
from typing import Any, TypeVar

from ._future_internals import LazyFuture

__all__ = [
    "AnyFuture",
    "RequestFuture",
    "Waiter",
    "failure_of",
    "forwarding_to",
    "wait_answered",
]


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

    #: nsqd's answer (ignored once done, as every set_* after the first)
    deliver = set_result

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


class RequestFuture(LazyFuture):
    """A :class:`concurrent.futures.Future` for a request already on its way (so it starts
    RUNNING and cannot be cancelled), cheap to make and to complete: it makes its Condition
    only when some thread has to wait on it (``result()`` before the answer, ``wait()``,
    ``as_completed()``).  Everything a Future offers works (conn/_future_internals.py).

    Args:
        on_failure: called with the future when it fails while nobody has taken its outcome
            yet (:attr:`observed` False): how a Producer learns of failures that no caller
            will see.  (A request's future on a Connection needs none: the Connection tells
            its ``on_request_failed`` hook.)

    ``observed`` turns True once a caller asked for the outcome (``result()``,
    ``exception()``) or added a done callback; the library's own bookkeeping uses
    :meth:`failure`, :meth:`watch` and :func:`wait_answered`, which do not count.
    """

    def __init__(self, on_failure: Callable[[RequestFuture], None] | None = None) -> None:
        LazyFuture.__init__(self)
        #: True once a caller asked for the outcome or added a done callback (see above)
        self.observed = False
        self._on_failure = on_failure

    def result(self, timeout: float | None = None) -> Any:
        self.observed = True
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self.observed = True
        return super().exception(timeout)

    def add_done_callback(self, fn: Callable[[Future], object]) -> None:
        self.observed = True
        self._when_done(fn)

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
        the outcome (:attr:`observed` stays as it is)."""
        self._when_done(fn)

    def _failed(self) -> None:
        if not self.observed and self._on_failure is not None:
            self._on_failure(self)


#: what a request's answer is delivered to: a Future, or a Waiter for a blocking caller
AnyFuture = TypeVar("AnyFuture", "RequestFuture", Waiter)


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


def forwarding_to(future: Future) -> RequestFuture:
    """A RequestFuture whose outcome goes to ``future``, a plain Future given to
    :meth:`Connection.request` (made RUNNING now: queued bytes cannot be taken back)."""
    if not future.running() and not future.done():
        future.set_running_or_notify_cancel()
    inner = RequestFuture()

    def forward(done: Future) -> None:
        if future.done():
            return
        error = inner.failure()
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(inner.answer())

    inner.add_done_callback(forward)
    return inner
