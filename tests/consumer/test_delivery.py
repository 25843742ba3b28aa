"""A message's way to user code, without sockets: the checks before (trace, ordered offsets,
give-up at max_tries) and the handler contract after, with a recording responder."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Any

import pytest

from nsqclient.backoff import BackoffState
from nsqclient.consumer._delivery import Handling
from nsqclient.consumer._fin_tally import FinTally
from nsqclient.consumer._work_queue import Run
from nsqclient.message import Message, RequeueMessage
from nsqclient.observe import ObserverSet
from nsqclient.protocol import DecodedMessage

TIMEOUT = 10.0


class Responder:
    def __init__(self) -> None:
        self.answers: list[tuple[Any, ...]] = []

    def finish_message(self, message: Message) -> None:
        self.answers.append(("FIN", message.body))

    def requeue_message(self, message: Message, delay: float | None, backoff: bool) -> None:
        self.answers.append(("REQ", message.body, delay, backoff))

    def touch_message(self, message: Message) -> None:
        self.answers.append(("TOUCH", message.body))


class Subject:
    topic = "t"

    def __init__(self) -> None:
        self.giving_up: Any = None
        self.on_out_of_order: Any = None


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] = []

    def handler_started(self, consumer: Any, message: Message) -> None:
        self.seen.append(("started", message.body))

    def handler_ended(self, consumer: Any, message: Message, error: Any) -> None:
        self.seen.append(("ended", message.body, type(error).__name__ if error else None))

    def message_given_up(self, consumer: Any, message: Message) -> None:
        self.seen.append(("given_up", message.body))

    def message_out_of_order(self, consumer: Any, message: Message, last_offset: int) -> None:
        self.seen.append(("out_of_order", message.body, message.offset, last_offset))


def make(handler: Any = None, **settings: Any) -> tuple[Handling, Responder, Counter[str]]:
    responder, counts = Responder(), Counter[str]()
    subject = Subject()
    options = {"ordered": False, "max_tries": 0, "tracing": False, **settings}
    handling = Handling(
        subject,
        handler,
        observers=ObserverSet(subject),
        finish=responder.finish_message,
        count=lambda name: counts.update([name]),
        tally=FinTally(1),
        settle=lambda: None,
        backoff=BackoffState(1.0, 0.0),  # max_duration 0: never backs off
        **options,
    )
    return handling, responder, counts


def message(
    responder: Responder, body: bytes, attempts: int = 1, partition: int | None = None, **kw: Any
) -> Message:
    decoded = DecodedMessage(0, attempts, b"0" * 16, body, **kw)
    return Message(decoded, responder=responder, partition=partition)


def test_the_handler_contract() -> None:
    def handler(m: Message) -> Any:
        if m.body == b"raise":
            raise ValueError("bad")
        if m.body == b"req":
            raise RequeueMessage(delay=3, backoff=False)
        if m.body == b"async":
            m.enable_async()
        return m.body != b"false"

    handling, responder, counts = make(handler)
    for body in (b"ok", b"false", b"raise", b"req", b"async"):
        handling.run_handler(message(responder, body))
    assert responder.answers == [
        ("FIN", b"ok"),
        ("REQ", b"false", None, True),
        ("REQ", b"raise", None, True),
        ("REQ", b"req", 3, False),
    ]
    assert counts == {"handler_errors": 1}


def test_observers_see_each_handler_run() -> None:
    handling, responder, _ = make(lambda m: 1 / 0)
    events = Events()
    handling._observers.add(events)
    handling.handle(message(responder, b"x"))
    assert events.seen == [("started", b"x"), ("ended", b"x", "ZeroDivisionError")]


def test_a_message_past_max_tries_is_given_up_and_finished() -> None:
    handling, responder, counts = make(max_tries=3)
    given: list[bytes] = []
    handling._consumer.giving_up = lambda m: given.append(m.body)
    events = Events()
    handling._observers.add(events)
    kept = handling.prepare([message(responder, b"a", 3), message(responder, b"b", 4)])
    assert [m.body for m in kept] == [b"a"]
    assert given == [b"b"] and responder.answers == [("FIN", b"b")]
    assert counts == {"given_up": 1} and events.seen == [("given_up", b"b")]


def test_ordered_never_gives_up_and_reports_an_offset_going_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    handling, responder, counts = make(ordered=True, max_tries=1)
    events = Events()
    handling._observers.add(events)
    back: list[tuple[bytes, int]] = []
    handling._consumer.on_out_of_order = lambda m, last: back.append((m.body, last))
    kept = handling.prepare(
        [
            message(responder, b"a", 9, offset=10, raw_size=1, partition=0),
            message(responder, b"a", 9, offset=10, raw_size=1, partition=0),
            message(responder, b"b", 1, offset=20, raw_size=1, partition=1),
            message(responder, b"c", 1, offset=5, raw_size=1, partition=0),
            # the check goes on from where the partition went back to: once per regression
            message(responder, b"d", 1, offset=6, raw_size=1, partition=0),
        ]
    )
    assert len(kept) == 5 and back == [(b"c", 10)]
    assert events.seen == [("out_of_order", b"c", 5, 10)]
    assert counts == {"out_of_order": 1}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "topic t partition 0 went backwards: offset 5 after offset 10" in warnings[0]


def test_tracing_logs_each_message_while_on(caplog: pytest.LogCaptureFixture) -> None:
    handling, responder, _ = make()
    caplog.set_level(logging.INFO, "nsqclient.trace")
    handling.prepare([message(responder, b"x")])
    handling.tracing = True
    handling.prepare([message(responder, b"y")])
    [record] = caplog.records
    assert record.getMessage().startswith("received topic=t ")


class Flow:
    """A connection's counts and its command queue, as a Consumer's ConnFlow has them."""

    def __init__(self, in_flight: int) -> None:
        self.in_flight = in_flight
        self.written: list[bytes] = []
        #: queued for the writer, which has been woken for them (``woken``: after which write)
        self.queued: list[bytes] = []
        self.woken: int | None = None
        #: what each flush() found queued
        self.flushes: list[list[bytes]] = []
        self.put = self.written.append

    def fin(self, message_id: bytes) -> None:  # the command the writer makes of it
        self.queued.append(b"FIN " + message_id + b"\n")
        if self.woken is None:  # the writer, woken by the first: it writes them some time
            self.woken = len(self.written)

    def writer_runs(self) -> None:
        """The writer thread takes its turn: it writes what is queued."""
        self.written += self.queued
        self.queued.clear()
        self.woken = None

    def flush(self) -> None:  # the worker writes what is queued when nobody else writes
        self.flushes.append(list(self.queued))
        self.writer_runs()


def run_of(responder: Responder, flow: Flow, *bodies: bytes) -> Run:
    messages = [message(responder, body) for body in bodies]
    for i, m in enumerate(messages):
        m.id = b"%016d" % i
        m._conn = flow
    return Run(messages, flow)  # type: ignore[arg-type]


def make_counted(
    handler: Any, backoff: BackoffState | None = None
) -> tuple[Handling, Responder, FinTally, dict[str, int], threading.Lock]:
    """A Handling whose FINs out of backoff go to a tally, settled as the Consumer does."""
    responder, tally, lock = Responder(), FinTally(1), threading.Lock()
    stats = {"finished": 0}
    subject = Subject()

    def settle() -> None:
        with lock:
            tally.settle(stats)

    handling = Handling(
        subject,
        handler,
        ordered=False,
        max_tries=0,
        tracing=False,
        observers=ObserverSet(subject),
        finish=responder.finish_message,
        count=lambda name: None,
        tally=tally,
        settle=settle,
        backoff=backoff or BackoffState(1.0, 0.0),
    )
    return handling, responder, tally, stats, lock


def test_a_runs_fins_are_written_at_once_and_counted_for_whoever_asks_meanwhile() -> None:
    """While the second handler of a run blocks, the first message's FIN is queued with the
    writer woken for it, and a reader that settles (as stats() does) counts it; the worker
    writes the rest itself as the run ends, and counts them."""
    started, release = threading.Event(), threading.Event()

    def handler(m: Message) -> None:
        if m.body == b"second":
            started.set()
            release.wait(TIMEOUT)  # the load: a handler that blocks

    handling, responder, tally, stats, lock = make_counted(handler)
    flow = Flow(in_flight=3)
    run = run_of(responder, flow, b"first", b"second", b"third")
    current: list[Message | None] = [None]
    worker = threading.Thread(target=handling.handle_run, args=(run, current, 0))
    worker.start()
    try:
        assert started.wait(TIMEOUT)
        assert (flow.queued, flow.woken) == ([b"FIN 0000000000000000\n"], 0)
        flow.writer_runs()
        with lock:
            tally.settle(stats)
        assert (stats["finished"], flow.in_flight) == (1, 2)
    finally:
        release.set()
        worker.join(TIMEOUT)
    assert not worker.is_alive()
    assert flow.flushes == [[b"FIN 0000000000000001\n", b"FIN 0000000000000002\n"]]
    assert len(flow.written) == 3 and tally.written == tally.counted  # settled by the run's end
    assert (stats["finished"], flow.in_flight) == (3, 0)
    assert responder.answers == []  # none went through finish_message


def test_in_backoff_each_fin_goes_through_finish_to_record_its_success() -> None:
    backoff = BackoffState(1.0, 60.0)
    backoff.level = 2
    handling, responder, tally, stats, _ = make_counted(lambda m: None, backoff)
    flow = Flow(in_flight=2)
    handling.handle_run(run_of(responder, flow, b"a", b"b"), [None], 0)
    assert responder.answers == [("FIN", b"a"), ("FIN", b"b")]
    assert flow.written == [] and stats["finished"] == 0 and tally.written == tally.counted
