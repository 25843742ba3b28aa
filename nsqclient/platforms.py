"""What differs between the platforms CPython runs on (Linux, macOS, the BSDs, Windows),
asked in one place.

Every answer comes from what the running interpreter has (``hasattr``), never from
``sys.platform``: the suite's simulated macOS and Windows take those functions away, and a
platform that gains one later gets the faster path by itself.
"""

from __future__ import annotations

import os
import select
import selectors
import signal
from collections.abc import Callable
from typing import Any

__all__ = [
    "HAS_EPOLL",
    "readable_waiter",
    "register_at_fork",
    "stop_signals",
]

#: True where the interpreter has epoll (Linux), with which a Producer's blocking publish may
#: read its own answer (caller-reads mode).
HAS_EPOLL = hasattr(select, "epoll")


def register_at_fork(after_in_child: Callable[[], None]) -> bool:
    """Run ``after_in_child`` in every child forked from now on; False (nothing registered)
    where the platform cannot fork, so that nothing needs resetting."""
    register = getattr(os, "register_at_fork", None)
    if register is None:
        return False
    register(after_in_child=after_in_child)
    return True


def stop_signals() -> tuple[int, ...]:
    """The signals that ask a program to stop: SIGINT (Ctrl-C) and SIGTERM everywhere, and
    SIGBREAK (Ctrl-Break) where it exists (Windows)."""
    found: list[int] = [signal.SIGINT, signal.SIGTERM]
    sigbreak = getattr(signal, "SIGBREAK", None)
    if sigbreak is not None:
        found.append(sigbreak)
    return tuple(found)


def readable_waiter(fileno: int) -> tuple[Callable[[float], list[Any]], Callable[[], None]]:
    """``(wait, close)`` for a socket's file descriptor: ``wait(milliseconds)`` blocks until it
    is readable or ``milliseconds`` pass, and returns a list that is empty when they passed;
    ``close()`` frees what ``wait`` used.

    ``select.poll``'s own method where it exists (a blocking publish's hot path: no Python
    frame of ours around it), the ``selectors`` module's best choice elsewhere (``select()`` on
    Windows, which takes sockets: that is all this is for)."""
    poll = getattr(select, "poll", None)
    if poll is not None:
        poller = poll()
        poller.register(fileno, select.POLLIN | select.POLLPRI)
        return poller.poll, _nothing

    selector = selectors.DefaultSelector()
    selector.register(fileno, selectors.EVENT_READ)

    def wait_selector(milliseconds: float) -> list[Any]:
        return selector.select(milliseconds / 1000.0)

    return wait_selector, selector.close


def _nothing() -> None:
    pass
