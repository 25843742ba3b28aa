"""Backoff and reconnect policies: pure functions of attempt counts and a clock (seconds).

The consumer's backoff follows NSQ's "building client libraries" guide: after a failure, RDY 0
everywhere for a duration that grows with consecutive failures; when it ends, RDY 1 on a single
connection to test the water; that one result decides: a success shrinks the backoff level (and
at level 0 the consumer goes back to full speed), a failure grows it.  Results that arrive while a
backoff timeout is running are ignored, so each window is judged by one result.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "backoff_duration",
    "reconnect_delay",
    "BackoffMode",
    "BackoffDecision",
    "BackoffState",
]


def backoff_duration(
    level: int,
    multiplier: float,
    max_duration: float,
    strategy: str = "exponential",
    rand: Callable[[], float] = random.random,
) -> float:
    """Seconds to pause at backoff ``level`` (1, 2, ...).

    ``exponential``: ``multiplier * 2**level`` capped at ``max_duration``.
    ``full_jitter``: uniformly random in ``[0, that)`` (``rand`` returns a float in [0, 1)).
    """
    if level <= 0:
        return 0.0
    ceiling = min(multiplier * (2**level), max_duration)
    if strategy == "exponential":
        return ceiling
    if strategy == "full_jitter":
        return rand() * ceiling
    raise ValueError(f"unknown backoff strategy {strategy!r}")


def reconnect_delay(failures: int, interval: float, max_interval: float) -> float:
    """Seconds before reconnect attempt number ``failures`` (1-based): ``interval * 2**(n-1)``,
    capped at ``max_interval``; 0 for ``failures <= 0``."""
    if failures <= 0:
        return 0.0
    return min(interval * 2 ** min(failures - 1, 62), max_interval)


class BackoffMode(enum.Enum):
    NORMAL = "normal"  # full speed
    PAUSED = "paused"  # RDY 0 everywhere until the timeout ends
    TESTING = "testing"  # RDY 1 on one connection; its result decides


@dataclass(frozen=True)
class BackoffDecision:
    """What a recorded result changed: ``mode`` now, and ``until`` (clock time) when paused."""

    mode: BackoffMode
    level: int
    until: float = 0.0


class BackoffState:
    """The consumer's backoff level and timeout.  Pure: every method takes ``now`` (seconds of a
    monotonic clock) and nothing sleeps.

    Args:
        multiplier: seconds, the base of the duration.
        max_duration: seconds, the cap; 0 disables backoff entirely.
        strategy: "exponential" or "full_jitter".
    """

    def __init__(
        self,
        multiplier: float,
        max_duration: float,
        strategy: str = "exponential",
        rand: Callable[[], float] = random.random,
    ):
        self.multiplier = multiplier
        self.max_duration = max_duration
        self.strategy = strategy
        self.rand = rand
        self.level = 0
        self.until = 0.0

    @property
    def enabled(self) -> bool:
        return self.max_duration > 0

    def mode(self, now: float) -> BackoffMode:
        if self.level == 0:
            return BackoffMode.NORMAL
        if now < self.until:
            return BackoffMode.PAUSED
        return BackoffMode.TESTING

    def record(self, success: bool, now: float) -> BackoffDecision | None:
        """Record one message result; return the new state if it changed, else None."""
        if not self.enabled or now < self.until:
            return None
        if success:
            if self.level == 0:
                return None  # already at full speed
            self.level -= 1
        elif self.level == 0 or (
            backoff_duration(self.level + 1, self.multiplier, float("inf")) <= self.max_duration
        ):
            # Grow the level while its duration stays within the cap; at the cap, pause again
            # at the same level.
            self.level += 1
        if self.level == 0:
            self.until = 0.0
            return BackoffDecision(BackoffMode.NORMAL, 0)
        duration = backoff_duration(
            self.level, self.multiplier, self.max_duration, self.strategy, self.rand
        )
        self.until = now + duration
        return BackoffDecision(BackoffMode.PAUSED, self.level, self.until)
