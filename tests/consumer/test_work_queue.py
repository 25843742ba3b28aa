"""A Consumer's work queue in handler mode, on fake connections (no sockets): runs handed to
workers, shared before anyone sleeps, and the wake-ups that keep an idle worker from waiting
while a message sits behind a busy handler."""

from __future__ import annotations

import threading
import time
from typing import Any

from nsqclient.backoff import BackoffState
from nsqclient.consumer._rdy_balancer import ConnFlow
from nsqclient.consumer._shared_state import SharedState
from nsqclient.consumer._work_queue import Intake
from nsqclient.testing.waiting import wait_for

TIMEOUT = 10.0


class FakeConn:
    def __init__(self, key: str) -> None:
        self.key = self.address = key
        self.partition = None
        self.sent: list[bytes] = []

    def queue_command(self, data: bytes) -> None:
        self.send(data)

    def queue_fin(self, message_id: bytes) -> None:
        self.send(b"FIN " + message_id + b"\n")

    def write_queued(self) -> None:  # what it is given is written at once: nothing waits
        pass

    def send(self, data: bytes) -> None:
        self.sent.append(data)


def queue(workers: int) -> tuple[Intake, ConnFlow]:
    books = SharedState(BackoffState(1.0, 10.0), stats={"received": 0})
    flow = ConnFlow(FakeConn("a:1"), time.monotonic())  # type: ignore[arg-type]
    books.conns[flow.key] = flow
    return Intake(books, workers), flow


def worker(intake: Intake, index: int, out: list[Any]) -> threading.Thread:
    """A thread doing what a handler worker does, recording which messages it took."""

    def run() -> None:
        while (run := intake.next_run(index)) is not None:
            while run:
                try:
                    out.append(run.popleft())
                except IndexError:
                    break

    thread = threading.Thread(target=run, name=f"test-worker-{index}", daemon=True)
    thread.start()
    return thread


def test_a_worker_shares_the_run_of_a_busy_one_instead_of_sleeping() -> None:
    intake, flow = queue(2)
    intake.put(flow, ["m1", "m2", "m3"], 3, time.monotonic())
    run = intake.next_run(0)
    assert run is not None and run.popleft() == "m1"  # worker 0 is now "in a handler"
    # Worker 1 finds nothing waiting, but worker 0's run still holds two: it takes it too.
    assert intake.next_run(1) is run
    assert run.popleft() == "m2"
    intake.count_queued()
    assert flow.queued == 1 and flow.in_flight == 3


def test_a_sleeping_worker_is_woken_by_a_run_and_leaves_when_closed() -> None:
    intake, flow = queue(1)
    took: list[Any] = []
    thread = worker(intake, 0, took)
    wait_for(lambda: intake._sleepers == [0], TIMEOUT, 0.001)
    intake.put(flow, ["m1", "m2"], 2, time.monotonic())
    wait_for(lambda: took == ["m1", "m2"], TIMEOUT, 0.001)
    intake.close()
    thread.join(TIMEOUT)
    assert not thread.is_alive()


def test_a_woken_worker_that_leaves_messages_behind_wakes_the_next() -> None:
    """Two workers sleep; a run of three comes.  The one woken takes the run and is "in a
    handler" on its first message, which may block: before it starts, it wakes the other,
    which shares the run (nobody sleeps while a message waits behind a busy handler)."""
    intake, flow = queue(2)
    got: dict[int, Any] = {}
    release = threading.Event()

    def blocked_worker(index: int) -> None:
        run = intake.next_run(index)
        got[index] = run
        release.wait(TIMEOUT)  # the handler's load; the run is left as it was meanwhile

    threads = [
        threading.Thread(target=blocked_worker, args=(i,), name=f"test-worker-{i}", daemon=True)
        for i in (0, 1)
    ]
    for thread in threads:
        thread.start()
    wait_for(lambda: sorted(intake._sleepers) == [0, 1], TIMEOUT, 0.001)
    intake.put(flow, ["m1", "m2", "m3"], 3, time.monotonic())
    wait_for(lambda: len(got) == 2, TIMEOUT, 0.001)
    assert got[0] is got[1] and list(got[0]) == ["m1", "m2", "m3"]
    release.set()
    for thread in threads:
        thread.join(TIMEOUT)
        assert not thread.is_alive()


def test_pop_takes_unstarted_messages_from_runs_workers_are_on() -> None:
    intake, flow = queue(2)
    intake.put(flow, ["m1", "m2"], 2, time.monotonic())
    intake.put(flow, ["m3"], 1, time.monotonic())
    run = intake.next_run(0)
    assert run is not None and run.popleft() == "m1"
    assert intake.unstarted()
    assert [intake.pop(), intake.pop(), intake.pop()] == ["m2", "m3", None]
    assert not intake.unstarted()
