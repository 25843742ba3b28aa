"""What a Consumer shares with the collaborators that count its messages (the work queue of
consumer/_work_queue.py, the answers of consumer/_answers.py): one lock and what it guards."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..backoff import BackoffState
from ._rdy_balancer import ConnFlow

__all__ = ["SharedState"]


@dataclass(frozen=True)
class SharedState:
    """A Consumer's bookkeeping.

    Attributes:
        backoff: the backoff state.
        lock: guards everything here and each connection's counts
            (:class:`~nsqclient.consumer._rdy_balancer.ConnFlow`).
        conns: the connections by key.
        stats: the counters (received, finished, requeued, ...).
        rdy_wake: set to have the RDY balancer look again (a connection's first message, a
            change of backoff).
    """

    backoff: BackoffState
    lock: threading.RLock = field(default_factory=threading.RLock)
    conns: dict[str, ConnFlow] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    rdy_wake: threading.Event = field(default_factory=threading.Event)
