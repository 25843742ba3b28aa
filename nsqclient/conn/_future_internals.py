"""The one place that relies on concurrent.futures' private interface.

A :class:`concurrent.futures.Future` makes a ``threading.Condition`` and two lists in its
``__init__``: several times the cost of everything else a ``pub_async()`` does.
:class:`LazyFuture` is a Future that makes none of them.  To stay a real Future for the
standard library's own functions (``wait()``, ``as_completed()``, ``asyncio.wrap_future()``,
``repr()``), it keeps the fields those read and write, which are CPython's private ones (in
``concurrent.futures._base``; the guard test named below checks the running Python's):

* ``_state``, one of the module's state strings, and ``_result`` / ``_exception``;
* ``_condition``, which ``wait()`` and ``as_completed()`` hold while they look at ``_state``
  and add a waiter to ``_waiters`` (and hold again to take it out), and under which the
  completing thread calls each waiter's ``add_result`` / ``add_exception``;
* ``_done_callbacks``, which ``_invoke_callbacks()`` calls (LazyFuture calls its own).

Every LazyFuture lends the same "Condition", used only as a lock, so a plain RLock
(``wait()`` holds those of all its futures at once): nobody waits on it, since ``result()``
and ``exception()`` wait through ``concurrent.futures.wait()`` itself.  Completing a future
takes it once, to write the state and wake the waiters ``wait()`` may have added.

Nothing else in nsqclient touches those names: ``tests/test_layout.py`` fails on any other
module that imports ``concurrent.futures._base`` or reads a Future's private fields, and
``tests/conn/test_future_internals.py`` fails loudly on a Python whose Future stops having
them, or whose ``wait()`` / ``as_completed()`` stop using them as described.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError, wait
from concurrent.futures._base import (
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    RUNNING,
)
from typing import Any

__all__ = ["LazyFuture", "deliver_all"]

#: the standard library logs a failing done callback there; so does LazyFuture
_futures_logger = logging.getLogger("concurrent.futures")

_DONE = (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED)
#: the ``_condition`` of every LazyFuture (see the module doc): only ever held, never waited
#: on, so a plain RLock (no Python-level Condition methods on wait()'s path)
_shared_condition = threading.RLock()
# Taken by _when_done() and by a finishing future that had callbacks added (see _finish).
_callback_lock = threading.Lock()


class _Sink(deque):
    """The ``_waiters`` of a future finished before ``wait()`` looked at it: what is added is
    dropped (``maxlen`` 0), what is taken out was never there."""

    def remove(self, value: Any) -> None:
        pass


_SINK = _Sink(maxlen=0)


class LazyFuture(Future):
    """A Future already RUNNING (it cannot be cancelled) that makes no Condition and no list
    until needed (see the module doc).  Completing it writes the state and wakes the waiters
    ``wait()`` added under the shared Condition, under which ``wait()`` reads the state and
    adds its waiters: it either sees the future done or has added its waiter before.  Done
    callbacks take one module lock instead (:meth:`_when_done`).

    Subclasses hook :meth:`_failed`, called on the completing thread after a failure.
    """

    _state = RUNNING
    _result: Any = None
    _exception: BaseException | None = None
    # The fields below are set only on a future some thread waits on (or calls back): they
    # start on the class.
    _waiter_list: list[Any] | None = None
    #: its done callback, or a list of them from the second on (most futures get one)
    _callbacks: Callable[[Future], object] | list[Callable[[Future], object]] | None = None
    #: a callback was added (set before the state is read; _finish reads it after setting it)
    _calling_back = False
    #: what a subclass keeps only until nsqd's answer (its request, say): dropped then by
    #: deliver() and deliver_all(), with no call
    _held: Any = None

    def __init__(self) -> None:  # no Future.__init__(): it would make the Condition now
        # Every field a future is sure to get, set now in one order: CPython then keeps them
        # in the object itself (set later, they would make it a dict).
        self._state = RUNNING
        self._result = None
        self._exception = None

    # ------------------------------------------------ the fields the standard library uses

    #: lent by every LazyFuture, finished or not (see the module doc)
    _condition = _shared_condition  # type: ignore[assignment]  # held only, as a Condition is

    @property
    def _waiters(self) -> Any:  # type: ignore[override]
        # wait() and as_completed() add theirs to every future they wait for, done or not,
        # and take them out again, under the Condition: a future finished before that (its
        # state cannot change under the Condition) lends the sink rather than a list of its own
        waiters = self._waiter_list
        if waiters is None:
            if self._state == FINISHED:
                return _SINK
            waiters = self._waiter_list = []
        return waiters

    @property
    def _done_callbacks(self) -> list[Callable[[Future], object]]:
        callbacks = self._callbacks
        if callbacks is None:
            return []
        return callbacks if type(callbacks) is list else [callbacks]  # type: ignore[list-item]

    # ------------------------------------------------ the public interface

    def done(self) -> bool:
        return self._state in _DONE

    def running(self) -> bool:
        return self._state == RUNNING

    def cancelled(self) -> bool:
        return self._state in (CANCELLED, CANCELLED_AND_NOTIFIED)

    def cancel(self) -> bool:
        return False  # already running: a request's bytes cannot be taken back

    def result(self, timeout: float | None = None) -> Any:
        if self._state != FINISHED:
            self._wait(timeout)
        if self._exception is not None:
            raise self._exception
        return self._result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state != FINISHED:
            self._wait(timeout)
        return self._exception

    def add_done_callback(self, fn: Callable[[Future], object]) -> None:
        self._when_done(fn)

    def set_result(self, result: Any) -> None:
        self._finish(result, None)

    def set_exception(self, exception: BaseException | None) -> None:
        self._finish(None, exception)

    def deliver(self, result: Any) -> None:
        """nsqd's answer: the result, unless the future is already done (it expired)."""
        self._complete(result, None)

    # ------------------------------------------------ for subclasses

    def _wait(self, timeout: float | None) -> None:
        """Block until done, or raise TimeoutError after ``timeout`` seconds."""
        wait((self,), timeout)
        if self._state != FINISHED:
            raise TimeoutError

    def _when_done(self, fn: Callable[[Future], object]) -> None:
        """Call ``fn(self)`` once done (now, if it is): a done callback, without a Condition."""
        self._calling_back = True
        with _callback_lock:
            if self._state != FINISHED:
                callbacks = self._callbacks
                if callbacks is None:
                    self._callbacks = fn
                elif type(callbacks) is list:
                    callbacks.append(fn)
                else:
                    self._callbacks = [callbacks, fn]  # type: ignore[list-item]
                return
        _call_back(fn, self)

    def _finish(self, result: Any, exception: BaseException | None) -> None:
        if not self._complete(result, exception):
            raise InvalidStateError(f"{self._state}: {self!r}")

    def _complete(self, result: Any, exception: BaseException | None) -> bool:
        """Complete it unless it is done already (False then); the state is checked and
        written under the shared Condition, so that two completions never both win."""
        with _shared_condition:  # before wait() looks at the state, or after it added its waiter
            if self._state != RUNNING:
                return False
            self._result = result
            self._exception = exception
            self._state = FINISHED
            for waiter in self._waiter_list or ():
                if exception is None:
                    waiter.add_result(self)
                else:
                    waiter.add_exception(self)
        if exception is None and self._held is not None:
            self._held = None
        if self._calling_back:
            self._call_backs()
        if exception is not None:
            self._failed()
        return True

    def _call_backs(self) -> None:
        # A _when_done() that saw the state before it was FINISHED has appended its callback
        # once this lock is free; one that comes later calls it itself.
        # They are let go once called: a finished future its caller keeps (a list of
        # thousands, say) no longer keeps what they hold alive.
        with _callback_lock:
            callbacks = self._callbacks
            self._callbacks = None
        if callbacks is None:
            return
        if type(callbacks) is not list:
            _call_back(callbacks, self)  # type: ignore[arg-type]
            return
        for fn in callbacks:
            _call_back(fn, self)

    def _failed(self) -> None:
        """Called on the completing thread once the future failed (after its callbacks)."""


def deliver_all(futures: list[Any], result: Any) -> None:
    """nsqd's ``result`` to each of ``futures`` in turn, as their ``deliver()`` would (those
    done already, expired, are passed over), taking the shared Condition once for them all;
    done callbacks run after it is released."""
    others = called_back = None
    with _shared_condition:
        for future in futures:
            if not isinstance(future, LazyFuture):
                if others is None:
                    others = []
                others.append(future)
                continue
            if future._state != RUNNING:
                continue
            future._result = result
            future._state = FINISHED
            waiters = future._waiter_list
            if waiters:
                for waiter in waiters:
                    waiter.add_result(future)
            if future._calling_back:
                if called_back is None:
                    called_back = []
                called_back.append(future)
            if future._held is not None:
                future._held = None
    for future in called_back or ():
        future._call_backs()
    for future in others or ():
        future.deliver(result)


def _call_back(fn: Callable[[Future], object], future: Future) -> None:
    try:
        fn(future)
    except Exception:
        _futures_logger.exception("exception calling callback for %r", future)
