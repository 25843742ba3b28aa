"""Publishing from asyncio code: ``await aresult(producer.pub_async(...))``.

An ASGI app (FastAPI, Starlette, Django's async views) runs its handlers on one event loop: a
blocking ``pub()`` there stalls every request of the process until nsqd answers.
``pub_async()`` never blocks on the network; :func:`aresult` waits for its Future without
blocking the loop.

Why not :func:`asyncio.wrap_future`: it adds a done callback to the Future at once, and a done
callback counts as taking the outcome (:attr:`~nsqclient.conn.RequestFuture.observed`).
When the awaiting task is then cancelled (the client went away, a timeout), asyncio drops the
outcome, so a publish that fails afterwards is reported nowhere: not raised, not in the
Producer's undelivered ledger, not logged.  :func:`aresult` takes the outcome only when it hands
it to a task that is still waiting for it.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Any, TypeVar

from ._futures import RequestFuture

__all__ = ["aresult"]

T = TypeVar("T")


async def aresult(future: Future[T]) -> T:
    """``await aresult(future)``: the asyncio counterpart of ``future.result()`` for the Futures
    of ``pub_async()``, ``mpub_async()`` and ``dpub_async()`` (any
    :class:`concurrent.futures.Future` works).  Returns what the Future resolves to (``b"OK"``
    or a :class:`~nsqclient.PublishResult`) or raises its error, without blocking the loop.

    Waiting does not count as taking the outcome: if the awaiting task is cancelled (the HTTP
    client went away, ``asyncio.timeout()`` fired), the publish goes on and its outcome stays
    untaken, so a failure still reaches the Producer's undelivered ledger
    (``flush()``/``close()`` raise :class:`~nsqclient.errors.UndeliveredError` for it, and an
    unclosed Producer logs it at exit), as for any ``pub_async()`` Future nobody looked at.
    Cancelling never cancels the publish itself: it may already be on the wire.
    """
    if future.done():
        return future.result()
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def wake(_: Any) -> None:  # on the thread that completed the Future: hand over only
        try:
            loop.call_soon_threadsafe(_wake, done)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    if isinstance(future, RequestFuture):
        future.watch(wake)  # not add_done_callback(): that would take the outcome
    else:
        future.add_done_callback(wake)
    await done  # a cancelled task stops here, leaving the outcome untaken
    return future.result()


def _wake(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)
