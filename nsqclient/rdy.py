"""The RDY policy, pure: given the connections' states and a clock, what RDY each should get.

The four duties from NSQ's "building client libraries" guide:

1. Start every connection at RDY 1 (a connection that has not received a message yet gets 1).
2. Spread ``max_in_flight`` evenly over the connections (the remainder goes to the first ones
   by address), never above a connection's ``max_rdy_count``.
3. The sum of RDY never exceeds ``max_in_flight``.
4. When ``max_in_flight`` is smaller than the number of connections, RDY 1 rotates: a
   connection keeps it while messages keep coming (but never longer than ``low_rdy_timeout``),
   loses it after ``low_rdy_idle_timeout`` without a message, and the freed RDY goes to the
   connection that has waited longest, so an nsqd that has messages is always found.

Refill (:func:`needs_refill`): re-send RDY when the count of messages received since the last
RDY leaves 0 or less than 25% of it.

All times are seconds on one monotonic clock, passed in as ``now``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .backoff import BackoffMode

__all__ = ["ConnView", "rdy_targets", "needs_refill", "is_starved"]


@dataclass(frozen=True)
class ConnView:
    """What the policy needs to know of one connection.

    Attributes:
        address: a unique key (``host:port``).
        rdy: the RDY last sent.
        max_rdy_count: the nsqd's limit from IDENTIFY.
        in_flight: messages received and not yet answered.
        queued: of those, messages still waiting for a handler (not yet seen by user code).
        last_message_at: clock time of the last message received (None: never).
        rdy_since: clock time the current non-zero RDY was granted (None while RDY is 0).
        waiting_since: clock time RDY last went to 0, or the connection was made.
    """

    address: str
    rdy: int = 0
    max_rdy_count: int = 2500
    in_flight: int = 0
    queued: int = 0
    last_message_at: float | None = None
    rdy_since: float | None = None
    waiting_since: float = 0.0


def _even_split(conns: Sequence[ConnView], budget: int) -> dict[str, int]:
    ordered = sorted(conns, key=lambda c: c.address)
    share, extra = divmod(budget, len(ordered))
    targets = {}
    for i, c in enumerate(ordered):
        n = share + (1 if i < extra else 0)
        if c.last_message_at is None:
            n = min(n, 1)
        targets[c.address] = max(0, min(n, c.max_rdy_count))
    return targets


def _rotate(
    conns: Sequence[ConnView],
    budget: int,
    now: float,
    low_rdy_idle_timeout: float,
    low_rdy_timeout: float,
) -> dict[str, int]:
    keep: list[str] = []
    waiting: list[tuple[float, str]] = []
    for c in conns:
        rdy_since = c.rdy_since
        if c.rdy > 0 and rdy_since is not None:  # holding RDY since then
            last_activity = max(rdy_since, c.last_message_at or rdy_since)
            idle = now - last_activity >= low_rdy_idle_timeout
            expired = now - rdy_since >= low_rdy_timeout
            if not idle and not expired:
                keep.append(c.address)
                continue
            # Just lost its turn: it waits from now on, behind everyone already waiting.
            waiting.append((now, c.address))
        else:
            waiting.append((c.waiting_since, c.address))
    keep.sort()
    keep = keep[:budget]
    targets = {c.address: 0 for c in conns}
    for address in keep:
        targets[address] = 1
    waiting.sort()
    for _, address in waiting[: budget - len(keep)]:
        targets[address] = 1
    return targets


def rdy_targets(
    conns: Sequence[ConnView],
    max_in_flight: int,
    now: float,
    mode: BackoffMode = BackoffMode.NORMAL,
    low_rdy_idle_timeout: float = 10.0,
    low_rdy_timeout: float = 30.0,
) -> dict[str, int]:
    """The RDY each connection should have now, keyed by address.

    ``mode`` is the consumer's backoff mode: PAUSED gives every connection 0; TESTING gives a
    single connection 1 (rotating like the low-RDY case when that connection stays idle).
    The sum of the result never exceeds ``max_in_flight`` (1 while TESTING).
    """
    if not conns:
        return {}
    if mode is BackoffMode.PAUSED or max_in_flight <= 0:
        return {c.address: 0 for c in conns}
    budget = 1 if mode is BackoffMode.TESTING else max_in_flight
    if len(conns) <= budget and mode is BackoffMode.NORMAL:
        return _even_split(conns, budget)
    return _rotate(conns, budget, now, low_rdy_idle_timeout, low_rdy_timeout)


def needs_refill(remaining: int, last_rdy: int) -> bool:
    """True when RDY should be sent again: ``remaining`` (messages nsqd may still send before
    the last RDY is used up) fell to 0 or below 25% of ``last_rdy``."""
    return last_rdy > 0 and (remaining <= 0 or remaining < last_rdy / 4)


def is_starved(conns: Sequence[ConnView], threshold: float = 0.85) -> bool:
    """The guide's rule: on some connection, the messages handlers hold (in flight and no longer
    queued for a handler) amount to ``threshold`` (85% by default) or more of its last RDY, so
    nsqd will soon send nothing more and a batching handler should process what it holds now.

    Messages still waiting in the consumer's queue are not counted: they are not in anyone's
    batch, and they flow to the handlers without nsqd sending anything (pynsq counts a message
    in flight only when its handler gets it, for the same reason)."""
    for c in conns:
        held = c.in_flight - c.queued
        if held > 0 and held >= threshold * c.rdy:
            return True
    return False
