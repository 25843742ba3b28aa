"""The tornado IOLoop that ``nsq.run()`` runs for legacy pynsq programs built on tornado.

pynsq ran everything on tornado's IOLoop: ``nsq.run()`` started it, Reader handlers and Writer
callbacks ran on it, and programs mixed in ``PeriodicCallback``, ``tornado.web`` applications and
``IOLoop.current().stop()``.  When such a program runs on nsqclient, :func:`nsqclient.run` runs
the IOLoop of the calling thread in that thread and hands each handler and callback to it through
a :class:`LoopBridge`; connections keep their own reader and writer threads, so heartbeats are
answered even while tornado code blocks the loop.

The rule (see :func:`tornado_in_use`): the IOLoop is run when ``tornado.ioloop`` has been imported
by the time ``run()`` is called.  nsqclient never imports tornado unless the program did or
asked for it with ``run(tornado=True)``; ``run(tornado=False)`` keeps the threads-only model.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

__all__ = ["tornado_in_use", "current_ioloop", "LoopBridge", "LoopStopped"]

logger = logging.getLogger("nsqclient.tornado")

#: How long a thread waiting for the loop sleeps between checks that the bridge is still open
#: (seconds).  Only bounds how late a waiter notices a bridge closed without cancelling it.
_WAIT_SLICE = 1.0


def tornado_in_use() -> bool:
    """True when the program has imported ``tornado.ioloop`` (directly or through
    ``tornado.web``, ``tornado.httpserver``...): the rule by which ``nsq.run()`` runs the
    IOLoop.  Nothing is imported here."""
    return sys.modules.get("tornado.ioloop") is not None


def current_ioloop() -> Any:
    """The calling thread's tornado IOLoop (made if there is none yet).

    Raises:
        RuntimeError: tornado is not installed.
    """
    try:
        from tornado.ioloop import IOLoop
    except ImportError as exc:  # run(tornado=True) without tornado
        raise RuntimeError(
            "nsq.run(tornado=True) needs tornado (pip install tornado); without it, "
            "nsq.run() runs Readers and Writers on threads"
        ) from exc
    return IOLoop.current()


class LoopStopped(Exception):  # noqa: N818 - a state, not an error of the caller's
    """The IOLoop stopped before the work handed to it could run."""


class LoopBridge:
    """Hands work from any thread to one tornado IOLoop, in order.

    Args:
        ioloop: the IOLoop, made current in the thread that will run it (the one calling this).
    """

    def __init__(self, ioloop: Any):
        self.ioloop = ioloop
        self.thread_ident = threading.get_ident()
        self._lock = threading.Lock()
        self._pending: set[Future] = set()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def on_loop_thread(self) -> bool:
        """True in the thread that runs the loop."""
        return threading.get_ident() == self.thread_ident

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the loop and return its result (or raise its exception).

        Called on the loop thread, it runs at once.  From another thread, it waits until the
        loop has run it, however long that takes: the loop runs user code, which is unbounded.

        Raises:
            LoopStopped: the bridge was closed (the loop stopped) before ``fn`` ran.
        """
        if self.on_loop_thread():
            return fn(*args)
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise LoopStopped("the tornado IOLoop has stopped")
            self._pending.add(future)
        self.ioloop.add_callback(self._run, future, fn, args)
        while True:
            try:
                return future.result(timeout=_WAIT_SLICE)
            except CancelledError:
                raise LoopStopped("the tornado IOLoop stopped before this ran") from None
            except FutureTimeout:
                continue

    def _run(self, future: Future, fn: Callable[..., Any], args: tuple) -> None:
        with self._lock:
            self._pending.discard(future)
        if not future.set_running_or_notify_cancel():
            return
        try:
            result = fn(*args)
        except BaseException as exc:  # handed back to the waiting thread
            future.set_exception(exc)
        else:
            future.set_result(result)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Schedule ``fn(*args)`` on the loop without waiting (thread-safe)."""
        self.ioloop.add_callback(fn, *args)

    def stop_soon(self) -> None:
        """Make the loop stop after what it is running now (thread-safe; signal handlers too)."""
        self.ioloop.add_callback(self.ioloop.stop)

    def watch(self, awaitable: Any, done: Callable[[bool], None]) -> None:
        """On the loop thread: run ``awaitable`` (a coroutine or a tornado/asyncio Future) on the
        loop; ``done(ok)`` follows with ok = its result was truthy and it did not raise."""
        from tornado import gen

        future = gen.convert_yielded(awaitable)

        def finished(f: Any) -> None:
            try:
                ok = bool(f.result())
            except Exception:
                logger.exception("the awaitable returned by a message handler failed")
                ok = False
            done(ok)

        self.ioloop.add_future(future, finished)

    def close(self) -> None:
        """Refuse new work and cancel what the loop will not run: each waiting
        :meth:`call` raises LoopStopped.  Called once the loop has stopped."""
        with self._lock:
            self._closed = True
            pending, self._pending = self._pending, set()
        for future in pending:
            future.cancel()
