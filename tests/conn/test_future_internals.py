"""The guard of nsqclient/conn/_future_internals.py, the one place that relies on
concurrent.futures' private interface: each test checks one thing LazyFuture takes for granted
about this Python's Future, ``wait()`` and ``as_completed()``.  A failure here means a Python
release changed them: every ``pub_async()`` Future is at stake, so it must fail loudly here
rather than quietly there (hung ``wait()`` calls, lost callbacks)."""

from __future__ import annotations

import asyncio
import concurrent.futures._base as base
import threading
from concurrent.futures import FIRST_COMPLETED, Future, as_completed, wait
from typing import Any

import pytest

from nsqclient.conn._future_internals import LazyFuture

TIMEOUT = 10.0


def test_the_state_names_are_the_strings_lazyfuture_writes():
    assert (base.PENDING, base.RUNNING, base.FINISHED) == ("PENDING", "RUNNING", "FINISHED")
    assert (base.CANCELLED, base.CANCELLED_AND_NOTIFIED) == (
        "CANCELLED",
        "CANCELLED_AND_NOTIFIED",
    )


def test_a_stock_future_has_exactly_the_fields_lazyfuture_keeps():
    future = Future()
    assert set(vars(future)) == {
        "_condition",
        "_state",
        "_result",
        "_exception",
        "_waiters",
        "_done_callbacks",
    }
    assert isinstance(future._condition, threading.Condition)
    assert future._waiters == [] and future._done_callbacks == []
    assert callable(Future._invoke_callbacks)


def test_every_public_method_of_future_is_one_lazyfuture_has_or_inherits_safely():
    # LazyFuture overrides what would wait on or notify the Condition it does not have; a new
    # public method of Future would have to be looked at before it is trusted on a LazyFuture.
    public = {name for name in vars(Future) if not name.startswith("_")}
    overridden = {name for name in vars(LazyFuture) if not name.startswith("_")}
    inherited_safely = {"set_running_or_notify_cancel"}  # reads _state under _condition only
    # (__class_getitem__ and __repr__ are dunders; repr is checked below)
    assert public - overridden == inherited_safely


class Probe(LazyFuture):
    """A LazyFuture that counts what the standard library reads of it."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: dict[str, int] = {}

    def __getattribute__(self, name: str) -> Any:
        if name in ("_condition", "_waiters", "_state"):
            reads = object.__getattribute__(self, "reads")
            reads[name] = reads.get(name, 0) + 1
        return object.__getattribute__(self, name)


def answer_later(future: LazyFuture, waiting: threading.Event) -> threading.Thread:
    """A thread that completes ``future`` once ``waiting`` is set (by a waiter install)."""

    def answer() -> None:
        assert waiting.wait(TIMEOUT)
        future.set_result(b"OK")

    thread = threading.Thread(target=answer)
    thread.start()
    return thread


class WaiterSpy(list):
    """The waiter list of a future, telling when wait()/as_completed() added theirs."""

    def __init__(self) -> None:
        super().__init__()
        self.added = threading.Event()

    def append(self, waiter: Any) -> None:
        assert hasattr(waiter, "add_result") and hasattr(waiter, "add_exception")
        super().append(waiter)
        self.added.set()


def test_wait_holds_the_condition_reads_the_state_and_adds_a_waiter():
    future = Probe()
    spy = future._waiter_list = WaiterSpy()
    answering = answer_later(future, spy.added)
    done, not_done = wait([future], timeout=TIMEOUT)
    answering.join(TIMEOUT)
    assert done == {future} and not not_done
    assert future.reads["_condition"] >= 2  # to add the waiter, and to take it out
    assert future.reads["_waiters"] >= 2
    assert future.reads["_state"] >= 1
    assert spy == []  # taken out again


def test_as_completed_adds_a_waiter_and_takes_it_out():
    future = Probe()
    spy = future._waiter_list = WaiterSpy()
    answering = answer_later(future, spy.added)
    assert list(as_completed([future], timeout=TIMEOUT)) == [future]
    answering.join(TIMEOUT)
    assert future.reads["_condition"] >= 2 and future.reads["_waiters"] >= 2
    assert spy == []


def test_wait_for_the_first_of_a_stock_and_a_lazy_future():
    lazy, stock = LazyFuture(), Future()
    stock.set_running_or_notify_cancel()
    spy = lazy._waiter_list = WaiterSpy()
    answering = answer_later(lazy, spy.added)
    done, not_done = wait([stock, lazy], timeout=TIMEOUT, return_when=FIRST_COMPLETED)
    answering.join(TIMEOUT)
    assert done == {lazy} and not_done == {stock}


def test_a_finished_future_lends_the_sink_and_wait_returns_at_once():
    future = LazyFuture()
    future.set_result(1)
    pending = LazyFuture()
    done, not_done = wait([future, pending], timeout=0.01)
    assert done == {future} and not_done == {pending}
    assert future._waiter_list is None  # no list made for it
    assert pending._waiter_list == []


def test_repr_and_set_running_or_notify_cancel_read_the_fields():
    future = LazyFuture()
    assert "state=running" in repr(future)
    with pytest.raises(RuntimeError):  # already running, as a stock running Future
        future.set_running_or_notify_cancel()
    future.set_result(b"OK")
    assert "state=finished returned bytes" in repr(future)


def test_asyncio_wrap_future_follows_it():
    future = LazyFuture()

    async def main() -> Any:
        wrapped = asyncio.wrap_future(future)
        asyncio.get_running_loop().call_later(0.01, future.set_result, b"OK")
        return await asyncio.wait_for(wrapped, TIMEOUT)

    assert asyncio.run(main()) == b"OK"


def test_a_failing_callback_is_logged_on_concurrent_futures_logger(caplog):
    future = LazyFuture()
    future.add_done_callback(lambda f: 1 / 0)
    with caplog.at_level("ERROR", logger="concurrent.futures"):
        future.set_result(None)
    assert "exception calling callback" in caplog.text
