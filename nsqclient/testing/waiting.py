"""Polling with a deadline, for tests that must wait for a condition instead of sleeping."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["wait_for"]

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T | None],
    timeout: float = 5.0,
    interval: float = 0.01,
    message: str | Callable[[], str] = "condition not met",
) -> T:
    """Call ``predicate`` until it returns a truthy value, and return that value.

    Args:
        predicate: called with no arguments; a truthy result ends the wait.  An exception it
            raises propagates at once (wrap it yourself if it may fail while waiting).
        timeout: seconds to keep trying before giving up.
        interval: seconds to wait between two calls.
        message: the AssertionError text on timeout, or a callable producing it (evaluated
            only on timeout, so it may describe the last state seen).

    Raises:
        AssertionError: ``predicate`` stayed falsy for ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            text = message() if callable(message) else message
            raise AssertionError(f"{text} (waited {timeout:.2f}s)")
        _NEVER.wait(min(interval, remaining))


# Waited on between polls as a bounded pause; nothing ever sets it.
_NEVER = threading.Event()
