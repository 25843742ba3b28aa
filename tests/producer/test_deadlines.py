"""producer/_deadlines.py: the deadline keeper notes each connection's request mark at every
tick and has it fail what was sent before the mark noted ``period`` seconds ago; its thread runs
while something is in flight, lingers ``LINGER`` seconds, and ends at ``stop()``.

The connections are fakes with the three methods the keeper calls (``request_mark``,
``expire_before``, ``pending_count``); the passes are driven at chosen instants first, then by
the keeper's own thread.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from nsqclient.producer import _deadlines
from nsqclient.producer._deadlines import DeadlineKeeper, tick_for
from nsqclient.testing.waiting import wait_for

#: Seconds: the bound of every wait; reached only when something is broken.
TIMEOUT = 5.0


class FakeConnection:
    """A connection whose requests are numbered: ``sent`` so far is its mark."""

    def __init__(self, address: str = "127.0.0.1:4150", pending: int = 0):
        self.address = address
        self.sent = 0
        self.pending = pending
        self.marks_taken = 0
        self.first_mark_at: float | None = None
        #: (when, mark) of every expire_before call
        self.expired: list[tuple[float, int]] = []

    def request_mark(self) -> int:
        self.marks_taken += 1
        if self.first_mark_at is None:
            self.first_mark_at = time.monotonic()
        return self.sent

    def expire_before(self, mark: int) -> None:
        self.expired.append((time.monotonic(), mark))

    def pending_count(self) -> int:
        return self.pending

    def marks(self) -> list[int]:
        return [mark for _, mark in self.expired]


def keeper_of(
    conns: list[Any], period: float = 1.0, outer: Any = None, name: str = "unit"
) -> DeadlineKeeper:
    return DeadlineKeeper(name, lambda: list(conns), period, outer or (lambda now: False))


def threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"nsq-deadlines-{name}"]


@pytest.mark.parametrize(
    ("period", "tick"), [(0.01, 0.005), (0.5, 0.025), (1.0, 0.05), (2.0, 0.1), (60.0, 0.1)]
)
def test_the_tick_is_a_twentieth_of_the_period_between_5_and_100_ms(period, tick):
    assert tick_for(period) == pytest.approx(tick)


# ------------------------------------------------------------------------------------------------
# What a pass expires (passes at chosen instants, no thread)


def test_a_pass_expires_what_was_sent_before_the_mark_noted_one_period_ago():
    conn = FakeConnection()
    keeper = keeper_of([conn], period=1.0)
    for now, sent in [(100.0, 5), (100.5, 8)]:
        conn.sent = sent
        keeper._pass(now)
    assert conn.expired == []  # no mark is a period old yet
    conn.sent = 12
    keeper._pass(101.0)
    assert conn.marks() == [5]  # the mark noted at 100.0, exactly a period ago
    keeper._pass(101.2)
    assert conn.marks() == [5]  # the next one (100.5) is not due yet
    keeper._pass(101.6)
    assert conn.marks() == [5, 8]


def test_when_several_marks_are_due_only_the_newest_is_expired():
    conn = FakeConnection()
    keeper = keeper_of([conn], period=1.0)
    for now, sent in [(0.0, 1), (0.1, 2), (0.2, 3)]:
        conn.sent = sent
        keeper._pass(now)
    keeper._pass(5.0)  # the keeper was late: every mark is due
    assert conn.marks() == [3]  # one call, covering all three
    keeper._pass(5.1)
    assert conn.marks() == [3]  # each mark is used once


def test_each_connection_is_expired_by_its_own_marks():
    a, b = FakeConnection("a:4150"), FakeConnection("b:4150")
    keeper = keeper_of([a, b], period=1.0)
    a.sent, b.sent = 10, 20
    keeper._pass(0.0)
    a.sent, b.sent = 11, 25
    keeper._pass(1.0)
    assert (a.marks(), b.marks()) == ([10], [20])


def test_a_connection_gone_from_the_list_forgets_its_marks():
    a, b = FakeConnection("a:4150"), FakeConnection("b:4150")
    conns: list[Any] = [a, b]
    keeper = keeper_of(conns, period=1.0)
    a.sent = 7
    keeper._pass(0.0)
    conns.remove(a)  # closed and replaced
    keeper._pass(0.5)
    conns.append(a)
    keeper._pass(2.0)
    assert a.expired == []  # its mark of 0.0 went with it: only marks noted since count


def test_a_pass_is_busy_while_a_request_is_pending_or_an_outer_future_waits():
    conn = FakeConnection()
    waiting = [False]
    seen: list[float] = []

    def outer(now: float) -> bool:
        seen.append(now)
        return waiting[0]

    keeper = keeper_of([conn], outer=outer)
    assert keeper._pass(1.0) is False
    conn.pending = 1
    assert keeper._pass(2.0) is True
    conn.pending, waiting[0] = 0, True
    assert keeper._pass(3.0) is True
    assert seen == [1.0, 2.0, 3.0]  # the outer Futures are expired at every pass, with its now


def test_a_connection_whose_expiry_fails_is_logged_and_the_others_still_expire(caplog):
    caplog.set_level(logging.ERROR, logger="nsqclient.producer")

    class Broken(FakeConnection):
        def expire_before(self, mark: int) -> None:
            raise RuntimeError("a bug")

    broken, fine = Broken("broken:4150"), FakeConnection("fine:4150")
    keeper = keeper_of([broken, fine], period=1.0)
    keeper._pass(0.0)
    keeper._pass(1.0)
    assert fine.marks() == [0]
    [record] = [r for r in caplog.records if r.exc_info]
    assert "broken:4150" in record.getMessage()


# ------------------------------------------------------------------------------------------------
# When: the keeper's thread


def test_the_thread_expires_a_request_a_period_after_its_mark_was_noted():
    conn = FakeConnection(pending=1)
    conn.sent = 3
    keeper = keeper_of([conn], period=0.2, name="expires")
    keeper.ensure()
    try:
        wait_for(lambda: conn.expired, TIMEOUT, message="nothing expired")
        when, mark = conn.expired[0]
        assert mark == 3
        assert conn.first_mark_at is not None
        # a period after (less the few microseconds between noting the time and the mark), plus a
        # tick or a little more
        assert 0.19 <= when - conn.first_mark_at < 1.0
    finally:
        keeper.stop()


def test_ensure_starts_one_named_thread_and_stop_joins_it():
    conn = FakeConnection(pending=1)
    keeper = keeper_of([conn], period=0.2, name="one")
    assert not keeper.running and not threads("one")
    keeper.ensure()
    keeper.ensure()
    assert keeper.running
    [thread] = threads("one")
    keeper.stop()
    assert not thread.is_alive() and not keeper.running
    keeper.ensure()  # stopped for good
    assert not threads("one") and not keeper.running


@pytest.mark.parametrize("busy", ["pending request", "outer future"])
def test_the_thread_runs_while_busy_and_ends_linger_after(monkeypatch, busy):
    monkeypatch.setattr(_deadlines, "LINGER", 0.05)
    conn = FakeConnection(pending=1 if busy == "pending request" else 0)
    waiting = [busy == "outer future"]
    keeper = keeper_of([conn], period=0.2, outer=lambda now: waiting[0], name="busy")
    keeper.ensure()
    try:
        # 30 passes at one per 10 ms tick: several times LINGER, and still running
        wait_for(lambda: conn.marks_taken >= 30, TIMEOUT)
        [thread] = threads("busy")
        assert keeper.running
        conn.pending, waiting[0] = 0, False
        wait_for(lambda: not thread.is_alive(), TIMEOUT, message="the idle keeper still runs")
        assert not keeper.running
        conn.pending = 1
        keeper.ensure()  # something new in flight: a fresh thread
        assert keeper.running and threads("busy")
    finally:
        keeper.stop()
    assert not threads("busy")
