"""Backoff and reconnect policies: pure functions, a fake clock, no sockets, no sleep."""

import pytest

from nsqclient.backoff import (
    BackoffMode,
    BackoffState,
    backoff_duration,
    reconnect_delay,
)


def test_exponential_durations_double_and_cap():
    assert [backoff_duration(n, 1.0, 128.0) for n in range(0, 9)] == [
        0.0,
        2.0,
        4.0,
        8.0,
        16.0,
        32.0,
        64.0,
        128.0,
        128.0,
    ]


def test_full_jitter_is_uniform_below_the_exponential_ceiling():
    assert backoff_duration(3, 1.0, 128.0, "full_jitter", rand=lambda: 0.5) == 4.0
    assert backoff_duration(3, 1.0, 128.0, "full_jitter", rand=lambda: 0.0) == 0.0
    assert backoff_duration(10, 1.0, 30.0, "full_jitter", rand=lambda: 0.5) == 15.0


def test_unknown_strategy_is_an_error():
    with pytest.raises(ValueError, match="unknown backoff strategy"):
        backoff_duration(1, 1.0, 10.0, "linear")


def test_reconnect_delay_grows_and_caps():
    assert [reconnect_delay(n, 1.0, 10.0) for n in range(0, 7)] == [0, 1, 2, 4, 8, 10, 10]
    assert reconnect_delay(10_000, 1.0, 60.0) == 60.0  # no overflow


def test_failure_pauses_then_tests_the_water_then_resumes():
    b = BackoffState(multiplier=1.0, max_duration=128.0)
    assert b.mode(0.0) is BackoffMode.NORMAL
    d = b.record(False, now=10.0)
    assert (d.mode, d.level, d.until) == (BackoffMode.PAUSED, 1, 12.0)
    assert b.mode(11.9) is BackoffMode.PAUSED
    assert b.mode(12.0) is BackoffMode.TESTING
    d = b.record(True, now=12.5)
    assert (d.mode, d.level) == (BackoffMode.NORMAL, 0)
    assert b.mode(12.5) is BackoffMode.NORMAL


def test_results_inside_the_pause_window_are_ignored():
    b = BackoffState(1.0, 128.0)
    b.record(False, now=0.0)  # paused until 2.0
    assert b.record(False, now=1.0) is None
    assert b.record(True, now=1.5) is None
    assert b.level == 1


def test_consecutive_failures_grow_and_successes_shrink_one_level_each():
    b = BackoffState(1.0, 128.0)
    now = 0.0
    levels = []
    for _ in range(3):
        d = b.record(False, now)
        levels.append((d.level, d.until - now))
        now = d.until  # the test-the-water message fails again
    assert levels == [(1, 2.0), (2, 4.0), (3, 8.0)]
    d = b.record(True, now)
    assert (d.mode, d.level, d.until - now) == (BackoffMode.PAUSED, 2, 4.0)
    now = d.until
    d = b.record(True, now)
    assert (d.mode, d.level) == (BackoffMode.PAUSED, 1)
    now = d.until
    d = b.record(True, now)
    assert (d.mode, d.level) == (BackoffMode.NORMAL, 0)


def test_level_stops_growing_at_the_cap_but_pauses_continue():
    b = BackoffState(1.0, 8.0)
    now = 0.0
    seen = []
    for _ in range(6):
        d = b.record(False, now)
        seen.append((d.level, d.until - now))
        now = d.until
    assert seen == [(1, 2.0), (2, 4.0), (3, 8.0), (3, 8.0), (3, 8.0), (3, 8.0)]


def test_success_at_full_speed_changes_nothing():
    b = BackoffState(1.0, 128.0)
    assert b.record(True, 0.0) is None
    assert b.mode(0.0) is BackoffMode.NORMAL


def test_zero_max_duration_disables_backoff():
    b = BackoffState(1.0, 0.0)
    assert not b.enabled
    assert b.record(False, 0.0) is None
    assert b.mode(0.0) is BackoffMode.NORMAL


def test_cap_below_first_step_still_pauses_for_the_cap():
    b = BackoffState(multiplier=1.0, max_duration=0.5)
    d = b.record(False, 0.0)
    assert (d.level, d.until) == (1, 0.5)


def test_full_jitter_state_uses_the_injected_random():
    b = BackoffState(1.0, 128.0, "full_jitter", rand=lambda: 0.25)
    d = b.record(False, 100.0)
    assert d.until == pytest.approx(100.5)
