"""What a Consumer's arguments must be, checked when it is made: its mode, its options and its
addresses (each a ValueError or TypeError at the call, before anything starts)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..addresses import lookupd_addresses, nsqd_addresses
from ..config import Config, ConsumerOptions, check_owner
from ..message import Message

__all__ = ["Handler", "check_addresses", "check_config", "check_mode"]

Handler = Callable[[Message], Any]


def check_mode(handler: Handler | None, columnar: bool) -> tuple[bool, bool]:
    """``(pull, columnar)``: pull mode without a handler; columnar only in pull mode."""
    if handler is not None and not callable(handler):
        raise TypeError(f"handler must be callable or None, not {type(handler).__name__}")
    pull = handler is None
    if columnar and not pull:
        raise ValueError("columnar=True is for pull mode: make the Consumer with handler=None")
    return pull, bool(columnar)


def check_config(options: ConsumerOptions) -> Config:
    """The options as a :class:`~nsqclient.config.Config` (TypeError for one that only a
    Producer takes)."""
    check_owner(options, "Consumer")
    return Config(**options)


def check_addresses(
    nsqd_tcp_addresses: str | Sequence[str] | None,
    lookupd_http_addresses: str | Sequence[str] | None,
) -> tuple[list[str], list[str]]:
    """The nsqd and lookupd addresses, parsed (:mod:`nsqclient.addresses`); one of them
    is needed."""
    nsqd = nsqd_addresses(nsqd_tcp_addresses, "nsqd_tcp_addresses")
    lookupd = lookupd_addresses(lookupd_http_addresses, "lookupd_http_addresses")
    if not nsqd and not lookupd:
        raise ValueError("Consumer needs nsqd_tcp_addresses or lookupd_http_addresses")
    return nsqd, lookupd
