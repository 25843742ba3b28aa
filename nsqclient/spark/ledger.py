"""The driver-side ledger of the source: messages held until Spark has committed them.

Pure bookkeeping, no Spark and no sockets, so that it is tested with plain objects.  It holds
what the source's Consumers received as batches (:class:`~nsqclient.consumer.MessageBatch`:
one socket read's messages each, no object per message); every message is numbered in arrival
order (1, 2, ...); an offset handed to Spark is ``{"session": <this reader's id>, "seq": <last
seq included>}``.  A batch that a cut falls inside is split there (its two parts are then
answered on their own).  Messages leave the ledger only from the front, whole batches at a
time: when Spark has committed every seq up to some ``n`` (they are FINished), or all at once
when the reader stops (they are requeued).

An offset whose session is not this reader's comes from an earlier run of the query (read from
the checkpoint after a restart).  Its messages were never FINished by that run, so nsqd gives
them again to this one: a batch that starts from such an offset starts at the first message held.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

__all__ = ["Ledger", "HeldBatch"]


class HeldBatch(Protocol):
    """What the ledger needs of a batch (nsqclient.consumer.MessageBatch has it)."""

    received_at: float
    touched_at: float | None
    nsqd_address: str

    def __len__(self) -> int: ...

    def split(self, index: int) -> tuple[Any, Any]: ...


class Ledger:
    """Batches of messages held by one reader, numbered in arrival order; thread-safe.

    Args:
        session: this reader's id, written into every offset it returns.
        clock: monotonic clock in seconds (injectable for tests).
    """

    def __init__(self, session: str, clock: Callable[[], float] = time.monotonic):
        self.session = session
        self._clock = clock
        self._cond = threading.Condition()
        self._held: deque[Any] = deque()
        self._count = 0  # messages in _held
        self._first_seq = 1  # seq of _held[0]'s first message (or of the next one when empty)
        self._last_arrival: float | None = None

    # ------------------------------------------------------------------ offsets

    def offset(self, seq: int) -> dict[str, Any]:
        """The offset dict for ``seq`` in this session."""
        return {"session": self.session, "seq": seq}

    def seq_of(self, offset: Mapping[str, Any] | None) -> int | None:
        """The seq of ``offset`` if it is one of this session's, else None."""
        if not isinstance(offset, Mapping) or offset.get("session") != self.session:
            return None
        seq = offset.get("seq")
        return seq if isinstance(seq, int) and not isinstance(seq, bool) else None

    def _low(self, start: Mapping[str, Any] | None) -> int:
        """The last seq *before* a batch starting at ``start`` (caller holds the lock)."""
        seq = self.seq_of(start)
        if seq is None:
            return self._first_seq - 1
        return max(seq, self._first_seq - 1)

    # ------------------------------------------------------------------ messages in

    def add_many(self, batches: Iterable[Any]) -> int:
        """Hold ``batches`` in their order (one lock round for all); return the last seq."""
        with self._cond:
            before = self._count
            for batch in batches:
                if len(batch):
                    self._held.append(batch)
                    self._count += len(batch)
            if self._count > before:
                self._last_arrival = self._clock()
                self._cond.notify_all()
            return self._first_seq + self._count - 1

    def __len__(self) -> int:
        """Messages held."""
        with self._cond:
            return self._count

    @property
    def last_seq(self) -> int:
        """The seq of the newest message held (or of the last one released)."""
        with self._cond:
            return self._first_seq + self._count - 1

    def _cut(self, seq: int) -> int:
        """Split the batch holding ``seq`` and ``seq + 1`` (if any), so that a batch ends at
        ``seq``; return how many batches end at or before it (caller holds the lock)."""
        first = self._first_seq
        for index, batch in enumerate(self._held):
            last = first + len(batch) - 1
            if last == seq:
                return index + 1
            if last > seq:
                if seq < first:
                    return index
                head, tail = batch.split(seq - first + 1)
                self._held[index] = head
                self._held.insert(index + 1, tail)
                return index + 1
            first = last + 1
        return len(self._held)

    # ------------------------------------------------------------------ planning

    def available(self, start: Mapping[str, Any] | None) -> int:
        """How many held messages come after ``start``."""
        with self._cond:
            return self._first_seq + self._count - 1 - self._low(start)

    def latest(self, start: Mapping[str, Any], limit: int | None) -> dict[str, Any]:
        """The end offset of a batch starting at ``start`` taking at most ``limit`` messages
        (None: all held); ``start`` itself when nothing is held after it."""
        with self._cond:
            low = self._low(start)
            count = self._first_seq + self._count - 1 - low
            if limit is not None:
                count = min(count, limit)
            if count <= 0:
                return dict(start)
            self._cut(low + count)  # the batch ends on a batch boundary
            return self.offset(low + count)

    def slice(self, start: Mapping[str, Any] | None, end: Mapping[str, Any]) -> list[Any]:
        """The batches of the micro-batch ``(start, end]``, in seq order.  Empty when ``end``
        is another session's (that run's messages come back from nsqd instead)."""
        end_seq = self.seq_of(end)
        if end_seq is None:
            return []
        with self._cond:
            low = self._low(start)
            first = self._cut(low)
            last = self._cut(min(end_seq, self._first_seq + self._count - 1))
            # islice walks the deque once; indexing it costs O(n) per item in the middle
            return list(itertools.islice(self._held, first, max(last, first)))

    def wait_for_batch(
        self,
        start: Mapping[str, Any],
        limit: int | None,
        *,
        deadline: float,
        gap: float,
        empty_wait: float,
        full: Callable[[], bool],
        stop: threading.Event,
        refresh: Callable[[], object] | None = None,
        poll: float = 0.005,
    ) -> None:
        """Block while a batch starting at ``start`` is still filling, i.e. until one of:

        * ``limit`` messages are held after ``start``;
        * ``full()`` says nsqd will send no more (every connection's RDY is used);
        * messages are held after ``start`` and none arrived for ``gap`` seconds;
        * none is held after ``start`` and none arrived for ``empty_wait`` seconds since the
          call (0: return at once);
        * the clock reaches ``deadline``, or ``stop`` is set.

        Every ``poll`` seconds (or when a message is added) it calls ``refresh()`` (which may
        add messages) and then looks again; ``refresh`` and ``full`` run without the ledger's
        lock."""
        began = self._clock()
        while not stop.is_set():
            if refresh is not None:
                refresh()
            with self._cond:
                now = self._clock()
                count = self._first_seq + self._count - 1 - self._low(start)
                if limit is not None and count >= limit:
                    return
                quiet_since = max(began, self._last_arrival or began)
                wake = quiet_since + gap if count > 0 else began + empty_wait
                wake = min(wake, deadline)
                if now >= wake:
                    return
            if count > 0 and full():
                return
            with self._cond:
                if self._first_seq + self._count - 1 - self._low(start) == count:
                    self._cond.wait(min(wake - now, poll))

    # ------------------------------------------------------------------ messages out

    def release_through(self, seq: int) -> list[Any]:
        """Remove and return the batches of every message with a seq <= ``seq`` (Spark
        committed them)."""
        with self._cond:
            if seq < self._first_seq:
                return []
            count = self._cut(seq)
            out = [self._held.popleft() for _ in range(count)]
            released = sum(map(len, out))
            self._first_seq += released
            self._count -= released
        return out

    def release_all(self) -> list[Any]:
        """Remove and return every batch held (the reader stops)."""
        with self._cond:
            out = list(self._held)
            self._first_seq += self._count
            self._count = 0
            self._held.clear()
            self._cond.notify_all()
        return out

    def due_for_touch(self, now: float, timeouts: Mapping[str, float], default: float) -> list[Any]:
        """Held batches whose nsqd timer (restarted at delivery and at each TOUCH) has run
        more than half of its ``msg_timeout`` (per nsqd address, else ``default``) seconds."""
        with self._cond:
            held: Iterable[Any] = list(self._held)
        due = []
        for batch in held:
            last = max(batch.received_at, batch.touched_at or 0.0)
            if now - last >= timeouts.get(batch.nsqd_address, default) / 2:
                due.append(batch)
        return due
