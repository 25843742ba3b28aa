"""The requests of one connection waiting for nsqd's answer, in the order nsqd answers them.

nsqd answers requests (PUB, MPUB, DPUB, SUB, CLS...) in the order it reads them, so a
connection keeps their futures in a FIFO and hands each answer to the oldest.  :class:`Pending`
is that FIFO and what goes with it: which requests share one answer (written together as one
command, see :meth:`Pending.join`), the commands of the newest requests, not written yet, which
the writer takes from here in their order (:meth:`Pending.take_unsent`), and a place for every
request ever sent (for :meth:`Pending.mark`).  A request expired before it was written is taken
out with its command, so it is never written.  It holds no lock: its connection's lock guards
every call.
"""

from __future__ import annotations

from typing import Any

from ..errors import NSQTimeoutError
from ._futures import RequestFuture, Waiter

__all__ = ["Pending", "expired_error"]

#: answered futures cut off the front of the FIFO at once, at least
_CUT = 1024


class Pending:
    """The FIFO of requests awaiting answers (see the module doc)."""

    __slots__ = ("items", "head", "unsent", "base", "expired_upto", "shared")

    def __init__(self) -> None:
        #: the futures, oldest first; those before ``head`` are answered
        self.items: list[RequestFuture | Waiter] = []
        self.head = 0
        #: the commands of the newest items, not written yet (unsent[k] is that of
        #: items[len(items) - len(unsent) + k]), oldest first
        self.unsent: list[bytes] = []
        #: the place of items[0] among every request the connection ever sent
        self.base = 0
        #: every request before this place was looked at by expire_before
        self.expired_upto = 0
        #: id() of the first of several written requests answered together -> how many
        self.shared: dict[int, int] = {}

    def count(self) -> int:
        """Requests not answered yet."""
        return len(self.items) - self.head

    def waiting(self) -> list[RequestFuture | Waiter]:
        """The futures not answered yet, oldest first."""
        return self.items[self.head :]

    def take(self, count: int) -> list[RequestFuture | Waiter]:
        """The futures of the oldest ``count`` answers (or fewer), now answered: one per
        answer, or every request an answer is shared by (see :meth:`join`)."""
        head = self.head
        if self.shared:
            end = self._answered_end(count)
        else:
            end = head + count
        futures = self.items[head:end]
        self.head = head + len(futures)
        self._cut()
        return futures

    def _answered_end(self, count: int) -> int:
        items, shared = self.items, self.shared
        end, size = self.head, len(items)
        for _ in range(count):
            if end >= size:
                break
            end += shared.pop(id(items[end]), 1)
        return end

    def pop(self) -> RequestFuture | Waiter | None:
        """The oldest future, now answered (None when none waits); only when no answer is
        shared (see :meth:`join`): otherwise :meth:`take`."""
        if self.head >= len(self.items):
            return None
        future = self.items[self.head]
        self.head += 1
        self._cut()
        return future

    def join(self, start: int, counts: list[int]) -> None:
        """The written requests from ``items[start]`` on went out as ``len(counts)``
        commands, the k-th of them for the next ``counts[k]`` requests: nsqd's one answer to
        it is theirs (the writer, having taken their commands; see :meth:`take`)."""
        items, shared = self.items, self.shared
        for count in counts:
            if count > 1:
                shared[id(items[start])] = count
            start += count

    def clear(self) -> list[RequestFuture | Waiter]:
        """Every future not answered yet; the FIFO is empty afterwards (and nothing is left
        for the writer)."""
        waiting = self.items[self.head :]
        self.shared = {}
        self.base += len(self.items)
        self.items = []
        self.head = 0
        self.unsent = []
        return waiting

    def take_unsent(self, size: int) -> list[bytes]:
        """The commands of the oldest requests not written yet, for the writer, whose sizes
        add up to at least ``size`` bytes (or all of them, when they add up to less): from now
        on they count as written."""
        unsent = self.unsent
        total = 0
        for i, command in enumerate(unsent):
            total += len(command)
            if total >= size:
                taken = unsent[: i + 1]
                del unsent[: i + 1]
                return taken
        self.unsent = []
        return unsent

    def _cut(self) -> None:
        """Cut the answered futures off the front once they are many and most of the list."""
        head = self.head
        if head > _CUT and head * 2 > len(self.items):
            del self.items[:head]
            self.head = 0
            self.base += head

    def mark(self) -> int:
        """The place of the next request: every request sent so far comes before it."""
        return self.base + len(self.items)

    def expire_before(self, mark: int) -> list[tuple[Any, bool]]:
        """The requests before ``mark`` not answered nor looked at yet, but blocking callers'
        Waiters (they keep their own time), with whether each was written: those never
        written are taken out and put in ``dropped``, every later request keeping its place."""
        items = self.items
        end = min(mark - self.base, len(items))
        start = max(self.head, self.expired_upto - self.base)
        if end <= start:
            return []
        written_end = len(items) - len(self.unsent)
        expired = [
            (future, i < written_end)
            for i in range(start, end)
            if type(future := items[i]) is not Waiter and not future.done()
        ]
        self.expired_upto = self.base + end
        unsent = {future for future, written in expired if not written}
        if unsent:
            # Out with their commands: the later requests keep their places.
            kept = [
                (f, c)
                for f, c in zip(items[written_end:], self.unsent, strict=True)
                if f not in unsent
            ]
            items[written_end:] = [f for f, _ in kept]
            self.unsent = [c for _, c in kept]
            self.base += len(unsent)
        return expired

    def expire(self, future: RequestFuture | Waiter) -> bool | None:
        """Take ``future`` out as :meth:`expire_before` would (with its command, when it was
        not written): None when it is answered or not here, else whether it was written."""
        items = self.items
        try:
            i = items.index(future, self.head)
        except ValueError:
            return None
        if future.done():
            return None
        written_end = len(items) - len(self.unsent)
        written = i < written_end
        if not written:
            del items[i]
            del self.unsent[i - written_end]
            self.base += 1  # the later requests keep their places
        return written


def expired_error(address: str, written: bool) -> NSQTimeoutError:
    """The error of a request to ``address`` that got no answer within its publish's timeout:
    ``maybe_processed`` is whether it was ``written``."""
    if written:
        return NSQTimeoutError(
            f"no answer from {address} within the publish's timeout; it may or may not be"
            " stored (the connection is kept: nsqd may just be slow)",
            maybe_processed=True,
            address=address,
        )
    return NSQTimeoutError(
        f"not written to {address} within the publish's timeout (earlier writes were not"
        " taken); nothing was sent",
        maybe_processed=False,
        address=address,
    )
