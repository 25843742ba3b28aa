"""Message ids as nsqd makes them: snowflake-style, 16 lowercase hex characters."""

from __future__ import annotations

import time

__all__ = ["GUIDFactory"]

_TWEPOCH = 1288834974288


class GUIDFactory:
    """nsqd's snowflake-style ids, as 16 lowercase hex characters (bytes)."""

    __slots__ = ("node_id", "sequence", "last_ts")

    def __init__(self, node_id: int):
        self.node_id = node_id & 0x3FF
        self.sequence = 0
        self.last_ts = 0

    def new(self) -> bytes:
        ts = time.time_ns() >> 20
        if ts < self.last_ts:
            ts = self.last_ts
        if ts == self.last_ts:
            self.sequence = (self.sequence + 1) & 0xFFF
            if self.sequence == 0:
                ts += 1  # borrow the next pseudo-millisecond instead of sleeping
        else:
            self.sequence = 0
        self.last_ts = ts
        value = ((ts - _TWEPOCH) << 22) | (self.node_id << 12) | self.sequence
        return b"%016x" % (value & 0xFFFFFFFFFFFFFFFF)

    def new_many(self, n: int) -> list[bytes]:
        """``n`` ids at once (what ``n`` calls of :meth:`new` would give, minus clock reads)."""
        out = []
        ts = time.time_ns() >> 20
        if ts < self.last_ts:
            ts = self.last_ts
        seq = self.sequence if ts == self.last_ts else -1
        node = self.node_id << 12
        for _ in range(n):
            seq += 1
            if seq > 0xFFF:
                ts += 1
                seq = 0
            out.append(b"%016x" % ((((ts - _TWEPOCH) << 22) | node | seq) & 0xFFFFFFFFFFFFFFFF))
        self.last_ts = ts
        self.sequence = seq
        return out
