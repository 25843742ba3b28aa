"""What a Producer accepted and could not deliver, with nobody told.

``pub()`` raises its own failure; a ``pub_async()`` Future holds its failure, and a caller who
never asks would never learn of it.  :class:`Ledger` keeps those Futures (failed while nobody
had taken their outcome) until ``flush()`` or ``close()`` reports them in one
:class:`~nsqclient.errors.UndeliveredError`.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import Future

from ..conn._futures import RequestFuture, Waiter
from ..errors import (
    ConnectionClosedError,
    NSQError,
    NSQTimeoutError,
    ServerError,
    UndeliveredError,
)

__all__ = ["Ledger", "cause", "undelivered_error"]

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
        reasons = Counter(cause(f.failure(), getattr(f, "nsqd_address", None)) for f in failed)
        shown = "; ".join(f"{n} x {reason}" for reason, n in reasons.most_common(3))
        more = len(reasons) - 3
        parts.append(
            f"{len(failed) + extra_failed} failed ({shown}"
            + (f"; and {more} other reason{'s' if more > 1 else ''}" if more > 0 else "")
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


def cause(exc: BaseException | None, address: str | None = None) -> str:
    """What failed a publish, the same for every publish it failed: the exception's type, the
    nsqd (its ``address``, else the first in its causes, else ``address``) and why: nsqd's
    error code, the socket's error (``connection refused``), or the error's own text without
    its remarks in brackets (which carry timings), e.g.
    ``ConnectionClosedError from 127.0.0.1:4150: connection refused``."""
    if exc is None:
        return "None"
    chain = [exc]
    while chain[-1].__cause__ is not None and len(chain) < 10:
        chain.append(chain[-1].__cause__)
    where = next((e.address for e in chain if isinstance(e, _ADDRESSED) and e.address), address)
    why = None
    for e in reversed(chain):
        if isinstance(e, ServerError):
            why = e.code
            break
        if isinstance(e, OSError) and not isinstance(e, NSQError):
            why = (e.strerror or str(e) or type(e).__name__).lower()
            break
    if why is None:
        why = _STEADY.sub("", str(chain[-1])).strip() or type(chain[-1]).__name__
    return f"{type(exc).__name__}{f' from {where}' if where else ''}: {why}"


#: the errors that may name their nsqd
_ADDRESSED = (ConnectionClosedError, NSQTimeoutError)
#: what differs between failures of one cause: remarks in brackets (timings: "1.3s ago")
_STEADY = re.compile(r"\s*\([^()]*\)")
