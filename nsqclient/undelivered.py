"""What a Producer accepted and could not deliver, with nobody told.

``pub()`` raises its own failure; a ``pub_async()`` Future holds its failure, and a caller who
never asks would never learn of it.  :class:`Ledger` keeps those Futures (failed while nobody
had taken their outcome) until ``flush()`` or ``close()`` reports them in one
:class:`~nsqclient.errors.UndeliveredError`.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import Future

from .answers import RequestFuture, Waiter
from .errors import UndeliveredError

__all__ = ["Ledger", "undelivered_error"]

#: Futures kept for the error at most; past that they are only counted (a service that never
#: flushes must not keep every failed publish forever).
KEEP = 10_000


class Ledger:
    """The Futures that failed with nobody looking, since the last :meth:`take`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._futures: list[RequestFuture] = []
        self._uncounted = 0

    def note(self, future: RequestFuture) -> None:
        """A RequestFuture's ``on_failure``: keep it (runs on whichever thread failed it)."""
        with self._lock:
            if len(self._futures) < KEEP:
                self._futures.append(future)
            else:
                self._uncounted += 1

    def take(self) -> tuple[list[RequestFuture], int]:
        """The failed Futures whose outcome is still untaken, and how many more failed past
        :data:`KEEP`; the ledger starts afresh."""
        with self._lock:
            futures, self._futures = self._futures, []
            extra, self._uncounted = self._uncounted, 0
        return [f for f in futures if not f.observed], extra


def undelivered_error(
    call: str,
    failed: list[RequestFuture],
    extra_failed: int,
    unanswered: Iterable[Future | Waiter],
    timeout: float,
) -> UndeliveredError | None:
    """The error ``call`` (``"flush()"``, ``"close()"``...) raises for these publishes, or None
    when there are none.  The Futures reported count as taken from then on."""
    # A blocking pub()'s Waiter, or a request chained to another Future, is someone's to see.
    waiting = [f for f in unanswered if isinstance(f, RequestFuture) and not f.observed]
    count = len(failed) + extra_failed + len(waiting)
    if not count:
        return None
    for future in (*failed, *waiting):
        future.observed = True
    parts = []
    if failed or extra_failed:
        reasons = Counter(_reason(f) for f in failed)
        shown = "; ".join(f"{n} x {reason}" for reason, n in reasons.most_common(3))
        more = len(reasons) - 3
        parts.append(
            f"{len(failed) + extra_failed} failed ({shown}"
            + (f"; and {more} other reasons" if more > 0 else "")
            + ")"
        )
    if waiting:
        parts.append(f"{len(waiting)} still without nsqd's answer after {timeout:g}s")
    return UndeliveredError(
        f"{call}: {count} publishes accepted since the last flush() or close() were not"
        f" delivered: {', '.join(parts)}.  Their Futures are in this error's .futures",
        futures=[*failed, *waiting],
        failed=len(failed) + extra_failed,
        unanswered=len(waiting),
    )


def _reason(future: RequestFuture) -> str:
    exc = future.failure()
    return f"{type(exc).__name__}: {exc}"
