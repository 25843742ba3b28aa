"""producer/_backlog.py: jobs run one at a time in submit order on one ``nsq-backlog-<name>``
thread, which lingers ``LINGER`` idle seconds for the next job and ends at ``close()``."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import partial

import pytest

from nsqclient.producer import _backlog
from nsqclient.producer._backlog import Backlog
from nsqclient.testing.waiting import wait_for

Job = Callable[[], None]

#: Seconds: the bound of every wait; reached only when something is broken.
TIMEOUT = 5.0


def threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"nsq-backlog-{name}"]


def blocking(release: threading.Event, started: threading.Event | None = None) -> Job:
    """A job that waits (bounded) for ``release``; it sets ``started`` as it begins."""

    def job() -> None:
        if started is not None:
            started.set()
        release.wait(TIMEOUT)

    return job


def gone(name: str) -> None:
    wait_for(lambda: not threads(name), TIMEOUT, message=f"nsq-backlog-{name} still alive")


def test_jobs_run_in_submit_order_on_one_named_thread():
    backlog = Backlog("order")
    ran: list[tuple[int, str]] = []
    assert not threads("order")  # none before the first job

    def record(i: int) -> Job:
        return lambda: ran.append((i, threading.current_thread().name))

    for i in range(20):
        backlog.submit(record(i))
    assert backlog.wait_empty(TIMEOUT)
    assert ran == [(i, "nsq-backlog-order") for i in range(20)]
    assert len(threads("order")) == 1
    backlog.close()
    assert not threads("order")


def test_a_job_stays_in_jobs_until_it_has_run_and_later_ones_queue_behind():
    backlog = Backlog("queued")
    release = threading.Event()
    started = threading.Event()
    first = blocking(release, started)
    ran: list[str] = []
    backlog.submit(first)
    started.wait(TIMEOUT)
    backlog.submit(lambda: ran.append("second"))
    backlog.submit(lambda: ran.append("third"))
    assert len(backlog.jobs) == 3 and backlog.jobs[0] is first  # running, not yet popped
    assert not backlog.wait_empty(0.05)
    release.set()
    assert backlog.wait_empty(TIMEOUT)
    assert ran == ["second", "third"] and not backlog.jobs
    backlog.close()


def test_the_idle_thread_ends_after_linger_and_a_new_job_starts_another(monkeypatch):
    monkeypatch.setattr(_backlog, "LINGER", 0.05)
    backlog = Backlog("linger")
    idents: list[int] = []
    backlog.submit(lambda: idents.append(threading.get_ident()))
    gone("linger")  # nobody closed it: it ended once idle for LINGER
    backlog.submit(lambda: idents.append(threading.get_ident()))
    assert backlog.wait_empty(TIMEOUT)
    assert len(idents) == 2
    gone("linger")


def test_a_job_that_comes_while_the_thread_lingers_runs_on_the_same_thread(monkeypatch):
    monkeypatch.setattr(_backlog, "LINGER", 30.0)
    backlog = Backlog("reused")
    idents: list[int] = []
    backlog.submit(lambda: idents.append(threading.get_ident()))
    assert backlog.wait_empty(TIMEOUT)
    [lingering] = threads("reused")
    backlog.submit(lambda: idents.append(threading.get_ident()))
    assert backlog.wait_empty(TIMEOUT)
    assert idents == [lingering.ident, lingering.ident]
    start = time.monotonic()
    backlog.close()  # it lingers no more
    assert time.monotonic() - start < 1.0
    assert not lingering.is_alive()


def test_a_job_that_raises_is_logged_and_the_next_runs(caplog):
    caplog.set_level(logging.ERROR, logger="nsqclient.producer")
    backlog = Backlog("raises")
    ran: list[str] = []

    def broken() -> None:
        raise RuntimeError("a bug in a job")

    backlog.submit(broken)
    backlog.submit(lambda: ran.append("next"))
    assert backlog.wait_empty(TIMEOUT)
    backlog.close()
    assert ran == ["next"]
    [record] = [r for r in caplog.records if r.exc_info]
    assert "next one runs" in record.getMessage()
    assert isinstance(record.exc_info[1], RuntimeError)


def test_close_runs_what_was_queued_then_ends_the_thread(monkeypatch):
    monkeypatch.setattr(_backlog, "LINGER", 30.0)
    backlog = Backlog("close")
    release = threading.Event()
    ran: list[int] = []
    backlog.submit(blocking(release))
    for i in range(3):
        backlog.submit(partial(ran.append, i))
    closer = threading.Thread(target=backlog.close, args=(TIMEOUT,), name="test-closer")
    closer.start()
    release.set()
    closer.join(TIMEOUT)
    assert not closer.is_alive()
    assert ran == [0, 1, 2]
    assert not threads("close")  # close() returned once the thread had ended


def test_close_waits_at_most_its_timeout_for_a_job_that_blocks(monkeypatch):
    monkeypatch.setattr(_backlog, "LINGER", 30.0)  # longer than any wait below
    backlog = Backlog("stuck")
    release = threading.Event()
    started = threading.Event()
    backlog.submit(blocking(release, started))
    started.wait(TIMEOUT)
    start = time.monotonic()
    backlog.close(0.1)
    assert 0.1 <= time.monotonic() - start < 1.0
    assert threads("stuck")  # still in its job
    release.set()
    gone("stuck")  # and ends once the job returns, without lingering


def test_close_without_a_thread_returns_at_once_and_later_jobs_still_run(monkeypatch):
    monkeypatch.setattr(_backlog, "LINGER", 30.0)  # longer than any wait below
    backlog = Backlog("never")
    backlog.close()  # nothing was ever submitted
    ran: list[str] = []
    backlog.submit(lambda: ran.append("after close"))  # its Future must not hang: it runs
    gone("never")  # and its thread does not linger
    assert ran == ["after close"]


def test_close_from_a_job_does_not_wait_for_its_own_thread(monkeypatch):
    monkeypatch.setattr(_backlog, "LINGER", 30.0)  # longer than any wait below
    backlog = Backlog("self")
    done = threading.Event()

    def closing() -> None:
        backlog.close(TIMEOUT)  # would wait TIMEOUT joining itself
        done.set()

    backlog.submit(closing)
    assert done.wait(1.0)
    gone("self")


@pytest.mark.parametrize("timeout", [0.0, -1.0])
def test_wait_empty_with_no_jobs_is_true_whatever_its_timeout(timeout):
    assert Backlog("empty").wait_empty(timeout)


def test_wait_empty_from_a_job_does_not_wait_for_the_job_that_is_waiting(monkeypatch):
    """A Producer closed from a done callback the backlog runs: its wait for the backlog to
    empty cannot end while that job runs, so it answers at once."""
    monkeypatch.setattr(_backlog, "LINGER", 30.0)
    backlog = Backlog("waiting")
    answers: list[bool] = []
    done = threading.Event()

    def waiting() -> None:
        answers.append(backlog.wait_empty(TIMEOUT))
        done.set()

    backlog.submit(waiting)
    assert done.wait(1.0)  # not TIMEOUT
    assert answers == [False]  # this job is still in jobs
    backlog.close(TIMEOUT)
