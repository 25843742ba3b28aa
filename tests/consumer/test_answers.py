"""The Consumer's answers on fake connections (no sockets): the bytes written, one write per
connection for many, and what each answer moves (counters, in-flight, backoff, held)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from nsqclient.backoff import BackoffState
from nsqclient.config import Config
from nsqclient.consumer._answers import Responder
from nsqclient.consumer._shared_state import SharedState
from nsqclient.errors import ConnectionClosedError, ServerError
from nsqclient.message import Message
from nsqclient.observe import ObserverSet


class FakeConn:
    def __init__(self, address: str):
        self.address = address
        self.in_flight = 0
        self.writes: list[bytes] = []
        self.closed = False

    def send(self, data: bytes) -> None:
        if self.closed:
            raise ConnectionClosedError("closed")
        self.writes.append(data)

    def put(self, data: bytes) -> None:  # a ConnFlow's: queued, or dropped once closed
        if not self.closed:
            self.writes.append(data)

    def fin(self, message_id: bytes) -> None:  # a ConnFlow's, as the writer writes it
        self.put(b"FIN " + message_id + b"\n")


class Subject:
    topic = "t"
    channel = "c"

    def __repr__(self) -> str:
        return "<the consumer>"


class Recorder:
    def __init__(self) -> None:
        self.answered: list[tuple[Any, ...]] = []

    def messages_answered(self, consumer: Any, messages: Any, action: str, *rest: Any) -> None:
        self.answered.append((consumer, [m.body for m in messages], action, *rest))


def make(pull: bool = False, ordered: bool = False, **options: Any) -> Responder:
    stats = {k: 0 for k in ("finished", "requeued", "finish_failed", "requeue_failed")}
    stats["touch_failed"] = 0
    subject = Subject()
    return Responder(
        subject,
        Config(**options),
        ordered,
        SharedState(BackoffState(1.0, 10.0), stats=stats),
        observers=ObserverSet(subject),
        pull=pull,
        idle=threading.Event(),
    )


def received(responder: Responder, conn: FakeConn, *bodies: bytes, attempts: int = 1) -> list[Any]:
    out = []
    for i, body in enumerate(bodies):
        m = Message(
            b"%015d%s" % (i, body[:1]),
            body,
            attempts=attempts,
            responder=responder,
            conn=conn,  # type: ignore[arg-type]
        )
        conn.in_flight += 1
        out.append(m)
    return out


def test_finish_many_writes_once_per_connection() -> None:
    r = make()
    a, b = FakeConn("a:1"), FakeConn("b:1")
    messages = received(r, a, b"x", b"y") + received(r, b, b"z")
    assert r.finish_many(messages) == 3
    assert a.writes == [b"FIN 000000000000000x\nFIN 000000000000001y\n"]
    assert b.writes == [b"FIN 000000000000000z\n"]
    assert r._stats["finished"] == 3 and a.in_flight == 0 and b.in_flight == 0
    assert r.finish_many(messages) == 0  # answered already: skipped


def test_requeue_many_writes_each_delay_and_backs_off() -> None:
    r = make(default_requeue_delay=2.0, max_requeue_delay=5.0)
    conn = FakeConn("a:1")
    first = received(r, conn, b"x", attempts=1)
    again = received(r, conn, b"y", attempts=4)
    assert r.requeue_many(first + again, None, True) == 2
    assert conn.writes == [b"REQ 000000000000000x 2000\nREQ 000000000000000y 5000\n"]
    assert r._stats["requeued"] == 2 and r._backoff.level == 1 and r._rdy_wake.is_set()


def test_ordered_requeues_without_delay() -> None:
    r = make(ordered=True)
    conn = FakeConn("a:1")
    (m,) = received(r, conn, b"x", attempts=3)
    m.requeue(delay=30)
    assert conn.writes == [b"REQ 000000000000000x 0\n"]


def test_a_message_of_another_consumer_is_refused_before_anything_is_sent() -> None:
    r, other = make(), make()
    conn = FakeConn("a:1")
    messages = received(r, conn, b"x") + received(other, conn, b"y")
    with pytest.raises(ValueError, match="was not received by <the consumer>"):
        r.finish_many(messages)
    assert conn.writes == [] and not messages[0].has_responded()


def test_a_closed_connection_only_marks_the_answer() -> None:
    r = make()
    conn = FakeConn("a:1")
    conn.closed = True
    (m,) = received(r, conn, b"x")
    m.finish()
    assert m.has_responded() and r._stats["finished"] == 1


def test_observers_hear_each_answer() -> None:
    r = make()
    recorder = Recorder()
    r._observers.add(recorder)
    conn = FakeConn("a:1")
    one, two, three = received(r, conn, b"1", b"2", b"3")
    one.finish()
    two.touch()
    r.requeue_many([two, three], 0.5, False)
    subject = r._consumer
    assert recorder.answered == [
        (subject, [b"1"], "finish", None, None),
        (subject, [b"2"], "touch", None, None),
        (subject, [b"2", b"3"], "requeue", 0.5, False),
    ]


def test_a_failed_answer_is_counted_apart() -> None:
    r = make()
    conn = FakeConn("a:1")
    r._stats["finished"] = 1
    assert r.answer_failed(conn, ServerError("gone", code="E_FIN_FAILED"))  # type: ignore[arg-type]
    assert r._stats["finish_failed"] == 1 and r._stats["finished"] == 0
    assert r.answer_failed(conn, ServerError("gone", code="E_TOUCH_FAILED"))  # type: ignore[arg-type]
    assert not r.answer_failed(conn, ServerError("no", code="E_INVALID"))  # type: ignore[arg-type]


def test_pull_mode_holds_until_answered_and_requeues_what_is_left() -> None:
    r = make(pull=True)
    conn = FakeConn("a:1")
    messages = received(r, conn, b"x", b"y", b"z")
    r.held.update(messages)
    messages[0].finish()
    r.finish_many(messages[1:2])
    assert r.held == {messages[2]} and not r._idle.is_set()
    r.stopping = True
    r.requeue_held()
    assert conn.writes[-1] == b"REQ 000000000000002z 0\n"
    assert r.held == set() and r._idle.is_set() and r._backoff.level == 0
