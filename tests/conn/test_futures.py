"""RequestFuture: the cheap Future a publish returns.  Everything concurrent.futures offers must
keep working on it, whichever thread completes it and whenever others start waiting."""

from __future__ import annotations

import threading
from concurrent.futures import FIRST_COMPLETED, Future, InvalidStateError, as_completed, wait

import pytest

from nsqclient.conn._connection import RequestFuture

#: Seconds: the bound of every wait; reached only when something is broken.
TIMEOUT = 10.0


def completed(result: object = b"OK") -> RequestFuture:
    future = RequestFuture()
    future.set_result(result)
    return future


def test_it_is_a_running_future_that_cannot_be_cancelled():
    future = RequestFuture()
    assert isinstance(future, Future)
    assert future.running() and not future.done() and not future.cancelled()
    assert future.cancel() is False
    future.set_result(b"OK")
    assert future.done() and not future.running()
    assert future.result(0) == b"OK" and future.exception(0) is None


def test_an_exception_is_raised_by_result_and_returned_by_exception():
    future = RequestFuture()
    boom = ValueError("refused")
    future.set_exception(boom)
    assert future.exception(0) is boom
    with pytest.raises(ValueError, match="refused"):
        future.result(0)


def test_completing_twice_is_refused():
    future = completed()
    with pytest.raises(InvalidStateError):
        future.set_result(b"again")
    with pytest.raises(InvalidStateError):
        future.set_exception(ValueError())
    assert future.result(0) == b"OK"


def test_result_times_out_while_unanswered():
    with pytest.raises(TimeoutError):
        RequestFuture().result(timeout=0.01)


def test_threads_already_waiting_are_woken_by_the_answer():
    future = RequestFuture()
    waiting = threading.Barrier(4, timeout=TIMEOUT)
    got: list[object] = []

    def wait_for_it() -> None:
        waiting.wait()
        got.append(future.result(TIMEOUT))

    threads = [threading.Thread(target=wait_for_it) for _ in range(3)]
    for t in threads:
        t.start()
    waiting.wait()
    # Each waiter is inside result() or about to enter it: either way it must see the answer.
    future.set_result(b"OK")
    for t in threads:
        t.join(TIMEOUT)
    assert got == [b"OK"] * 3


def test_wait_and_as_completed_work_with_finished_and_pending_futures():
    done = [completed(i) for i in range(1000)]
    pending = RequestFuture()
    finished, not_done = wait([*done, pending], timeout=0.01)
    assert finished == set(done) and not_done == {pending}

    releaser = threading.Timer(0.05, pending.set_result, args=(b"late",))
    releaser.start()
    first, _ = wait([pending, RequestFuture()], timeout=TIMEOUT, return_when=FIRST_COMPLETED)
    releaser.join(TIMEOUT)
    assert first == {pending}
    assert sorted(f.result() for f in as_completed(done, timeout=TIMEOUT)) == list(range(1000))


def test_as_completed_yields_a_future_answered_while_it_waits():
    futures = [RequestFuture() for _ in range(3)]
    results = []

    def answer() -> None:
        for i, future in enumerate(futures):
            future.set_result(i)

    answering = threading.Timer(0.05, answer)
    answering.start()
    for future in as_completed(futures, timeout=TIMEOUT):
        results.append(future.result())
    answering.join(TIMEOUT)
    assert sorted(results) == [0, 1, 2]


def test_done_callbacks_run_once_whether_added_before_or_after():
    calls: list[object] = []
    future = RequestFuture()
    future.add_done_callback(lambda f: calls.append(("before", f.result())))
    future.set_result(1)
    future.add_done_callback(lambda f: calls.append(("after", f.result())))
    assert calls == [("before", 1), ("after", 1)]


def test_several_done_callbacks_added_before_it_is_done_run_once_each_in_order():
    # (the first is kept on its own, a list made only for the second: both paths)
    calls: list[object] = []
    future = RequestFuture()
    future.watch(lambda f: calls.append("watched"))
    future.add_done_callback(lambda f: calls.append("first"))
    future.add_done_callback(lambda f: calls.append("second"))
    future.set_result(1)
    future.add_done_callback(lambda f: calls.append("after"))
    assert calls == ["watched", "first", "second", "after"]

    one: list[object] = []
    single = RequestFuture()
    single.add_done_callback(one.append)
    single.set_exception(OSError("gone"))
    assert one == [single]


@pytest.mark.parametrize("count", [1, 2])
@pytest.mark.parametrize("how", ["set_result", "set_exception", "deliver_all"])
def test_a_finished_future_lets_go_of_its_callbacks_once_they_ran(how: str, count: int):
    # A caller keeping finished futures (a list of thousands) must not keep alive what their
    # done callbacks hold: an observed publish's event, say.
    import weakref

    from nsqclient.conn._future_internals import deliver_all

    class Callback:
        def __init__(self) -> None:
            self.calls = 0

        def __call__(self, future: Future) -> None:
            self.calls += 1

    future = RequestFuture()
    callbacks = [Callback() for _ in range(count)]
    for callback in callbacks:
        future.add_done_callback(callback)
    if how == "set_result":
        future.set_result(b"OK")
    elif how == "set_exception":
        future.set_exception(OSError("gone"))
    else:
        deliver_all([future], b"OK")
    assert [callback.calls for callback in callbacks] == [1] * count
    refs = [weakref.ref(callback) for callback in callbacks]
    del callbacks, callback
    assert [ref() for ref in refs] == [None] * count  # (no collection needed: no cycle)
    assert future.done() and future._done_callbacks == []


def test_watch_calls_back_exactly_once_whichever_thread_wins_the_race():
    import threading as _threading

    from nsqclient.conn._futures import RequestFuture as _RequestFuture

    calls: dict[int, int] = {}
    lock = _threading.Lock()

    def seen(f) -> None:
        with lock:
            calls[id(f)] = calls.get(id(f), 0) + 1

    futures = [_RequestFuture() for _ in range(20000)]
    start = _threading.Barrier(2)

    def finish() -> None:
        start.wait()
        for f in futures:
            f.set_result(b"OK")

    finisher = _threading.Thread(target=finish)
    finisher.start()
    start.wait()
    for f in futures:
        f.watch(seen)
    finisher.join()
    assert sorted(set(calls.values())) == [1]
    assert len(calls) == len(futures)
    assert not any(f.observed for f in futures)


def test_wait_never_misses_an_answer_racing_with_it():
    # The answer writes the state under the lock wait() holds while it reads the states and
    # adds its waiter: wait() sees each future either done or with its waiter in place.
    rounds = 300
    batches = [[RequestFuture() for _ in range(20)] for _ in range(rounds)]
    start = threading.Barrier(2, timeout=TIMEOUT)

    def answer() -> None:
        for batch in batches:
            start.wait()
            for future in batch:
                future.set_result(b"OK")

    answering = threading.Thread(target=answer)
    answering.start()
    for batch in batches:
        start.wait()
        done, not_done = wait(batch, timeout=TIMEOUT)
        assert not not_done and len(done) == len(batch)
    answering.join(TIMEOUT)


def test_a_plain_future_given_to_request_follows_the_answer():
    from nsqclient.conn._futures import forwarding_to

    given: Future = Future()
    inner = forwarding_to(given)
    assert given.running()
    inner.deliver(b"OK")
    assert given.result(0) == b"OK"
    failing: Future = Future()
    forwarding_to(failing).set_exception(ValueError("refused"))
    assert isinstance(failing.exception(0), ValueError)


def test_deliver_ignores_a_future_already_done():
    future = RequestFuture()
    future.set_exception(ValueError("expired"))
    future.deliver(b"OK")  # nsqd's late answer
    assert isinstance(future.failure(), ValueError) and future.answer() is None


def test_an_answer_and_an_expiry_racing_never_both_win():
    from nsqclient.conn._future_internals import deliver_all

    futures = [RequestFuture() for _ in range(5000)]
    calls: dict[int, int] = {}
    lock = threading.Lock()

    def seen(f: Future) -> None:
        with lock:
            calls[id(f)] = calls.get(id(f), 0) + 1

    for future in futures:
        future.watch(seen)
    start = threading.Barrier(2, timeout=TIMEOUT)

    def expire() -> None:
        start.wait()
        for future in reversed(futures):
            try:
                future.set_exception(TimeoutError("expired"))
            except InvalidStateError:
                pass  # answered first

    expiring = threading.Thread(target=expire)
    expiring.start()
    start.wait()
    for i in range(0, len(futures), 100):
        deliver_all(futures[i : i + 100], b"OK")
    expiring.join(TIMEOUT)
    for future in futures:
        assert (future.answer() is None) != (future.failure() is None)
    assert sorted(set(calls.values())) == [1] and len(calls) == len(futures)
