"""Telling a Producer's observers how a publish ended (``publish_ended``, see
:mod:`nsqclient.observe`): for a blocking publish when its call returns or raises, for an
asynchronous one when its Future completes."""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

from ..conn._futures import failure_of
from ..observe import PublishEvent, tell
from ._publish_forms import PublishResult

__all__ = ["AsyncEnded", "ended", "failed"]


def ended(observers: tuple[Any, ...], event: PublishEvent, result: Any) -> None:
    """Tell ``publish_ended`` of a publish that succeeded with ``result``."""
    event.ended_at = time.monotonic()
    event.ended_ns = time.time_ns()
    event.result = result
    if isinstance(result, PublishResult):
        event.nsqd_address = result.nsqd_address or event.nsqd_address
        if result.partition is not None:
            event.partition = result.partition
    tell(observers, "publish_ended", event)


def failed(observers: tuple[Any, ...], event: PublishEvent, error: BaseException) -> None:
    """Tell ``publish_ended`` of a publish that failed with ``error``."""
    event.ended_at = time.monotonic()
    event.ended_ns = time.time_ns()
    event.error = error
    tell(observers, "publish_ended", event)


class AsyncEnded:
    """The done callback of an observed asynchronous publish's Future: when it completes, tell
    where the publish went and how it ended.  One object while the publish is in flight (a
    closure would be four for the garbage collector to go over)."""

    __slots__ = ("observers", "event")

    def __init__(self, observers: tuple[Any, ...], event: PublishEvent):
        self.observers = observers
        self.event = event

    def __call__(self, future: Future) -> None:
        event = self.event
        event.nsqd_address = getattr(future, "nsqd_address", None) or event.nsqd_address
        partition = getattr(future, "partition", None)
        if partition is not None:
            event.partition = partition
        error = failure_of(future)
        if error is not None:
            failed(self.observers, event, error)
        else:
            ended(self.observers, event, future.answer())  # type: ignore[attr-defined]
