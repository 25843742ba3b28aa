"""The FINs handler workers wrote and the Consumer has not counted yet.

A worker that FINs a message as its handler returns (the handler contract's common case)
writes the FIN at once but does not take the Consumer's lock for it: it adds one to its own
slot of :attr:`FinTally.written` (only that worker writes it, so no lock is needed) and the
count moves into the Consumer's books in one lock round per run of messages
(:meth:`FinTally.settle`).  Whoever reads the books settles first, under the lock, so that
``stats()``, ``connection_counts()`` and ``stop()`` see every FIN written, even while a
later handler of the same run blocks for minutes.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FinTally"]


class FinTally:
    """Per handler worker (a slot): FINs written (:attr:`written`, by that worker only), FINs
    counted in the books (:attr:`counted`, under the Consumer's lock), and the connection
    those not counted yet were written on (:attr:`flows`, set by the worker while nothing of
    its slot waits to be counted).

    Args:
        workers: how many slots (the Consumer's ``concurrency``).
    """

    __slots__ = ("counted", "flows", "written")

    def __init__(self, workers: int):
        self.written = [0] * workers
        self.counted = [0] * workers
        self.flows: list[Any] = [None] * workers

    def settle(self, stats: dict[str, int]) -> int:
        """Move what is written and not counted into the books: each connection's
        ``in_flight`` and ``stats["finished"]`` (the caller holds the Consumer's lock).
        Return how many FINs it moved."""
        moved = 0
        counted = self.counted
        for slot, written in enumerate(self.written):
            count = written - counted[slot]
            if count:
                flow = self.flows[slot]
                flow.in_flight = max(flow.in_flight - count, 0)
                counted[slot] = written
                moved += count
        if moved:
            stats["finished"] += moved
        return moved
