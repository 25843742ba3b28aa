"""producer/_undelivered.py: the Ledger keeps the pub_async() Futures that failed while nobody
had taken their outcome; ``flush()`` and ``close()`` report them, grouped by cause, in one
UndeliveredError (:func:`undelivered_error`); a failure a caller took is never reported."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

import pytest

from nsqclient.conn._futures import RequestFuture, Waiter
from nsqclient.errors import (
    BadMessageError,
    ConnectionClosedError,
    NSQTimeoutError,
    PubFailedError,
)
from nsqclient.producer import _undelivered
from nsqclient.producer._undelivered import Ledger, cause, undelivered_error


def refused(address: str = "127.0.0.1:4150") -> ConnectionClosedError:
    error = ConnectionClosedError(f"connecting to {address} failed (0.1s ago)", address=address)
    error.__cause__ = ConnectionRefusedError(111, "Connection refused")
    return error


def failed_in(ledger: Ledger, error: BaseException) -> RequestFuture:
    """A pub_async() Future of ``ledger``'s Producer, failed with ``error`` unseen."""
    future = RequestFuture(ledger.note)
    future.set_exception(error)
    return future


def report(ledger: Ledger, call: str = "flush()", unanswered: Any = ()) -> Any:
    """What ``call`` raises: the ledger's untaken failures in one error (None for none)."""
    failed, extra = ledger.take()
    return undelivered_error(call, failed, extra, unanswered, 1.5)


# ------------------------------------------------------------------------------------------------
# The Ledger


def test_failures_nobody_took_are_kept_until_taken_and_the_ledger_starts_afresh():
    ledger = Ledger()
    futures = [failed_in(ledger, refused()) for _ in range(3)]
    ok = RequestFuture(ledger.note)
    ok.set_result(b"OK")
    assert ledger.take() == (futures, 0)  # in the order they failed; a success is not kept
    assert ledger.take() == ([], 0)


@pytest.mark.parametrize("take", ["result", "exception", "add_done_callback"])
def test_a_failure_taken_before_or_after_it_happened_is_not_reported(take):
    ledger = Ledger()

    def taken(future: RequestFuture) -> None:
        """A caller asks for the outcome (one still in flight: without waiting for it)."""
        if take == "result":
            with pytest.raises((ConnectionClosedError, TimeoutError)):
                future.result(0)
        elif take == "exception":
            try:
                future.exception(0)
            except TimeoutError:
                pass  # still in flight
        else:
            future.add_done_callback(lambda f: None)

    before = RequestFuture(ledger.note)
    taken(before)  # asked while in flight: never noted
    before.set_exception(refused())
    after = failed_in(ledger, refused())
    taken(after)  # noted when it failed, taken since
    unseen = failed_in(ledger, refused())
    error = report(ledger)
    assert error.futures == [unseen]
    assert (error.count, error.failed, error.unanswered) == (1, 1, 0)


def test_past_keep_failures_are_counted_not_kept(monkeypatch):
    monkeypatch.setattr(_undelivered, "KEEP", 3)
    ledger = Ledger()
    futures = [failed_in(ledger, refused()) for _ in range(5)]
    failed, extra = ledger.take()
    assert failed == futures[:3] and extra == 2
    error = undelivered_error("close()", failed, extra, [], 1.5)
    assert error is not None
    assert (error.count, error.failed, len(error.futures)) == (5, 5, 3)
    assert "close(): 5 publishes" in str(error) and "5 failed (3 x " in str(error)
    assert ledger.take() == ([], 0)  # the count starts afresh too


def test_failures_noted_from_many_threads_are_all_kept():
    ledger = Ledger()
    futures = [RequestFuture(ledger.note) for _ in range(400)]
    workers = [
        threading.Thread(target=lambda part=part: [f.set_exception(refused()) for f in part])
        for part in (futures[i::4] for i in range(4))
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(10.0)
    failed, extra = ledger.take()
    assert set(failed) == set(futures) and len(failed) == 400 and extra == 0


# ------------------------------------------------------------------------------------------------
# The one error flush() and close() raise


def test_nothing_undelivered_is_no_error():
    assert report(Ledger()) is None
    waiter = Waiter()  # a blocking pub()'s: its caller sees its outcome
    plain: Future[Any] = Future()  # chained to another Future: someone's to see
    assert report(Ledger(), unanswered=[waiter, plain]) is None


def test_failures_are_grouped_by_cause_in_one_error_and_reported_once():
    ledger = Ledger()
    a = [failed_in(ledger, refused("10.0.0.1:4150")) for _ in range(4)]
    b = [failed_in(ledger, refused("10.0.0.2:4150")) for _ in range(2)]
    c = [failed_in(ledger, PubFailedError("topic is exiting"))]
    error = report(ledger, "close()")
    message = str(error)
    assert message.startswith("close(): 7 publishes accepted since the last flush() or close()")
    assert (
        "7 failed (4 x ConnectionClosedError from 10.0.0.1:4150: connection refused;"
        " 2 x ConnectionClosedError from 10.0.0.2:4150: connection refused;"
        " 1 x PubFailedError: E_PUB_FAILED)"
    ) in message, message
    assert error.futures == [*a, *b, *c]
    assert all(f.observed for f in error.futures)  # reported: taken from now on
    assert report(ledger) is None


def test_unanswered_publishes_are_counted_beside_the_failures():
    ledger = Ledger()
    failed = failed_in(ledger, refused())
    waiting = [RequestFuture() for _ in range(2)]
    seen = RequestFuture()
    with pytest.raises(TimeoutError):
        seen.result(0)  # its caller asked: theirs to see
    error = report(ledger, unanswered=[*waiting, seen, Waiter()])
    assert (error.count, error.failed, error.unanswered) == (3, 1, 2)
    assert error.futures == [failed, *waiting]
    assert "1 failed (1 x ConnectionClosedError" in str(error)
    assert "2 still without nsqd's answer after 1.5s" in str(error)
    assert all(f.observed for f in waiting)
    assert report(ledger, unanswered=waiting) is None  # not reported twice


def test_the_summary_names_nsqd_its_error_code_and_counts_the_other_reasons():
    def failed(error: BaseException, address: str | None = None) -> RequestFuture:
        future = RequestFuture()
        if address is not None:
            future.nsqd_address = address  # type: ignore[attr-defined]
        future.set_exception(error)
        return future

    behind = ConnectionClosedError(
        "connection to 10.0.0.1:4150 closed before nsqd answered: E_BAD_MESSAGE too big",
        maybe_processed=False,
        address="10.0.0.1:4150",
    )
    behind.__cause__ = BadMessageError("PUB message too big 2097152 > 1048576")
    reset = ConnectionClosedError("connection to 10.0.0.2:4150 closed", address="10.0.0.2:4150")
    reset.__cause__ = ConnectionResetError(104, "Connection reset by peer")
    futures = [
        *(failed(BadMessageError(f"PUB message too big {n} > 1048576"), "10.0.0.1:4150")
          for n in (2097152, 3000000)),
        *(failed(behind) for _ in range(3)),
        failed(reset),
        failed(NSQTimeoutError("no nsqd connection within pub_timeout (10s); nothing was sent")),
        failed(ValueError("bad")),
    ]  # fmt: skip
    error = undelivered_error("flush()", futures, 0, [], 1.0)
    assert error is not None
    message = str(error)
    assert "8 failed (3 x ConnectionClosedError from 10.0.0.1:4150: E_BAD_MESSAGE;" in message
    assert "; 2 x BadMessageError from 10.0.0.1:4150: E_BAD_MESSAGE;" in message
    assert "; and 2 other reasons)" in message, message
    assert cause(reset) == ("ConnectionClosedError from 10.0.0.2:4150: connection reset by peer")
    assert cause(futures[6].failure()) == (
        "NSQTimeoutError: no nsqd connection within pub_timeout; nothing was sent"
    )
    one_more = undelivered_error("flush()", futures[:7], 0, [], 1.0)
    assert "; and 1 other reason)" in str(one_more)


# ------------------------------------------------------------------------------------------------
# cause(): the same text for every publish one cause failed


@pytest.mark.parametrize(
    ("error", "address", "expected"),
    [
        (None, None, "None"),
        (
            refused("10.0.0.3:4150"),
            None,
            "ConnectionClosedError from 10.0.0.3:4150: connection refused",
        ),
        (
            PubFailedError("exiting"),
            "10.0.0.4:4150",
            "PubFailedError from 10.0.0.4:4150: E_PUB_FAILED",
        ),
        (NSQTimeoutError("no answer (after 2.1s)"), None, "NSQTimeoutError: no answer"),
        (ValueError(""), None, "ValueError: ValueError"),
    ],
    ids=["none", "socket-error", "server-error", "brackets-dropped", "no-text"],
)
def test_cause(error, address, expected):
    assert cause(error, address) == expected
