"""What a Consumer shares with its work queue and its answers (consumer/_shared_state.py): each
Consumer's own lock, counts and connections, never another's, and never rebound."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from nsqclient.backoff import BackoffState
from nsqclient.consumer._shared_state import SharedState


def test_two_consumers_share_nothing():
    a, b = SharedState(BackoffState(1.0, 60.0)), SharedState(BackoffState(1.0, 60.0))
    a.stats["received"] = 1
    a.conns["127.0.0.1:4150"] = object()  # type: ignore[assignment]
    a.rdy_wake.set()
    assert b.stats == {} and b.conns == {} and not b.rdy_wake.is_set()
    assert a.lock is not b.lock


def test_the_lock_is_reentrant_and_nothing_is_rebound():
    shared = SharedState(BackoffState(1.0, 60.0))
    with shared.lock, shared.lock:  # the answers take it again under the work queue's
        pass
    assert isinstance(shared.rdy_wake, threading.Event)
    with pytest.raises(dataclasses.FrozenInstanceError):
        shared.stats = {}  # type: ignore[misc]
