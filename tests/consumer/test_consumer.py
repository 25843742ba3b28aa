"""Consumer against a broker (embedded NSQ, or real nsqd with NSQ_BIN_DIR).

Every outcome is checked on both sides: what the consumer says (``stats()``, the handler's own
log, the commands it sent) and what nsqd says (``/stats``: depth, in-flight, timeouts, the
client's ready_count).  Waiting is always on a condition with a deadline (``wait_for``, events,
queues); ``Event.wait(timeout)`` inside a handler is the *load* of a slow handler, never a means
of synchronisation.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from nsqclient.conn._connection import Connection
from nsqclient.consumer._consumer import Consumer
from nsqclient.message import Message, RequeueMessage
from nsqclient.testing.helpers import channel_stats, nsq_threads, publish, wait_drained
from nsqclient.testing.waiting import wait_for

#: Seconds: the bound of every wait; reached only when something is broken.
TIMEOUT = 10.0


# ------------------------------------------------------------------------------------------------
# Helpers


def client_ready_counts(node: Any, topic: str, channel: str) -> list[int]:
    stats = channel_stats(node, topic, channel)
    return [c["ready_count"] for c in (stats or {}).get("clients") or []]


class Calls:
    """Thread-safe log of handler calls: (body, attempts, extra)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[tuple[bytes, int, Any]] = []

    def add(self, message: Message, extra: Any = None) -> int:
        with self.lock:
            self.items.append((message.body, message.attempts, extra))
            return len(self.items)

    def __len__(self) -> int:
        with self.lock:
            return len(self.items)

    def snapshot(self) -> list[tuple[bytes, int, Any]]:
        with self.lock:
            return list(self.items)

    def bodies(self) -> set[bytes]:
        with self.lock:
            return {b for b, _, _ in self.items}


class SentCommands:
    """Records every command a consumer's connections pass to Connection.send."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.lock = threading.Lock()
        self.commands: list[bytes] = []
        original = Connection.send
        recorder = self

        def send(conn: Connection, command: bytes) -> None:
            with recorder.lock:
                recorder.commands.append(bytes(command))
            original(conn, command)

        monkeypatch.setattr(Connection, "send", send)

    def named(self, name: bytes) -> list[list[bytes]]:
        """The commands ``name`` sent, each split into its words."""
        with self.lock:
            return [c.split() for c in self.commands if c.split()[:1] == [name]]

    def rdy_values(self) -> list[int]:
        return [int(words[1]) for words in self.named(b"RDY")]


# ------------------------------------------------------------------------------------------------
# FIN and REQ


def test_handler_returning_none_or_true_finishes(nsqd, consumers):
    node = nsqd.nsqd
    bodies = [b"m%d" % i for i in range(10)]
    publish(node, "c_fin", bodies)
    calls = Calls()

    def handler(message: Message) -> bool | None:
        n = calls.add(message)
        return None if n % 2 else True

    consumer = consumers(
        "c_fin", "ch", handler, nsqd_tcp_addresses=node.tcp_address, max_in_flight=5
    )
    wait_for(lambda: consumer.stats()["finished"] == 10, TIMEOUT)
    stats = wait_drained(node, "c_fin", "ch")
    assert stats["requeue_count"] == 0
    assert stats["timeout_count"] == 0
    assert [c["finish_count"] for c in stats["clients"]] == [10]
    assert sorted(calls.bodies()) == sorted(bodies)
    assert {attempts for _, attempts, _ in calls.snapshot()} == {1}
    s = consumer.stats()
    assert (s["received"], s["requeued"], s["handler_errors"], s["given_up"]) == (10, 0, 0, 0)


def test_handler_returning_false_requeues_and_the_message_comes_back(nsqd, consumers):
    node = nsqd.nsqd
    publish(node, "c_false", [b"again"])
    calls = Calls()

    def handler(message: Message) -> bool:
        calls.add(message)
        return message.attempts >= 2

    consumer = consumers(
        "c_false",
        "ch",
        handler,
        nsqd_tcp_addresses=node.tcp_address,
        default_requeue_delay=0,
        max_backoff_duration=0,
    )
    wait_for(lambda: consumer.stats()["finished"] == 1, TIMEOUT)
    assert [(b, a) for b, a, _ in calls.snapshot()] == [(b"again", 1), (b"again", 2)]
    stats = wait_drained(node, "c_false", "ch")
    assert stats["requeue_count"] == 1
    s = consumer.stats()
    assert (s["requeued"], s["finished"], s["handler_errors"]) == (1, 1, 0)


def test_exception_requeues_backs_off_and_recovers(nsqd, consumers, monkeypatch, caplog):
    node = nsqd.nsqd
    sent = SentCommands(monkeypatch)
    bodies = [b"b%d" % i for i in range(6)]
    publish(node, "c_boom", bodies)
    failures_left = [3]
    calls = Calls()
    ok: set[bytes] = set()
    holder: list[Consumer] = []

    def handler(message: Message) -> None:
        # The level seen on entry: every call after a recorded failure sees it > 0.
        calls.add(message, holder[0].stats()["backoff_level"])
        with calls.lock:
            fail = failures_left[0] > 0
            failures_left[0] -= 1
        if fail:
            raise RuntimeError("handler failure on purpose")
        with calls.lock:
            ok.add(message.body)

    caplog.set_level(logging.INFO, logger="nsqclient")
    consumer = consumers(
        "c_boom",
        "ch",
        handler,
        start=False,
        nsqd_tcp_addresses=node.tcp_address,
        max_in_flight=5,
        default_requeue_delay=0,
        backoff_multiplier=0.05,
        max_backoff_duration=0.4,
    )
    holder.append(consumer)
    consumer.start()
    wait_for(lambda: ok == set(bodies), TIMEOUT, message=lambda: f"handled ok: {sorted(ok)}")
    levels = [level for _, _, level in calls.snapshot()]
    assert levels[0] == 0
    assert max(levels) >= 1, levels
    # Results that arrive while a pause runs are ignored, so the last bodies may all have been
    # handled inside pauses: recovery needs successes after them, one per test window.  A
    # message nsqd sends between a test window's FIN and the RDY 0 that follows it is handled
    # inside the next pause, so how many it takes depends on timing: one at a time until the
    # level is back at 0 (with 3 failures it is at most 3 above it).
    more: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT
    while consumer.stats()["backoff_level"]:
        assert time.monotonic() < deadline, f"still backing off after {len(more)} successes"
        body = b"m%d" % len(more)
        more.append(body)
        publish(node, "c_boom", [body])
        wait_for(lambda body=body: body in ok, TIMEOUT, message=lambda: f"ok: {sorted(ok)}")
    assert ok == set(bodies) | set(more)
    # Back at full speed: nsqd sees the whole max_in_flight again.
    wait_for(lambda: client_ready_counts(node, "c_boom", "ch") == [5], TIMEOUT)
    wait_drained(node, "c_boom", "ch")
    s = consumer.stats()
    assert s["handler_errors"] == 3
    assert s["requeued"] == 3
    assert s["finished"] == len(bodies) + len(more)
    # The consumer really paused (RDY 0) after the first failure, and came back to 5.
    rdys = sent.rdy_values()
    first_req = next(i for i, c in enumerate(sent.commands) if c.startswith(b"REQ "))
    after = [int(c.split()[1]) for c in sent.commands[first_req:] if c.startswith(b"RDY ")]
    assert 0 in after, rdys
    assert rdys[-1] == 5, rdys
    assert [r for r in caplog.records if "handler failed" in r.getMessage()], "no error logged"


def test_requeue_message_without_backoff(nsqd, consumers, monkeypatch, caplog):
    node = nsqd.nsqd
    sent = SentCommands(monkeypatch)
    publish(node, "c_reqmsg", [b"x", b"y"])
    calls = Calls()
    holder: list[Consumer] = []

    def handler(message: Message) -> None:
        calls.add(message, holder[0].stats()["backoff_level"])
        if message.attempts == 1:
            raise RequeueMessage(delay=0, backoff=False)

    consumer = consumers(
        "c_reqmsg",
        "ch",
        handler,
        start=False,
        nsqd_tcp_addresses=node.tcp_address,
        max_in_flight=2,
        backoff_multiplier=0.05,
        max_backoff_duration=0.4,
    )
    holder.append(consumer)
    consumer.start()
    wait_for(lambda: consumer.stats()["finished"] == 2, TIMEOUT)
    snapshot = calls.snapshot()
    assert sorted((b, a) for b, a, _ in snapshot) == [(b"x", 1), (b"x", 2), (b"y", 1), (b"y", 2)]
    assert {level for _, _, level in snapshot} == {0}
    reqs = sent.named(b"REQ")
    assert [words[2] for words in reqs] == [b"0", b"0"]
    assert 0 not in sent.rdy_values()  # never paused
    s = consumer.stats()
    assert (s["requeued"], s["handler_errors"], s["backoff_level"]) == (2, 0, 0)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    wait_drained(node, "c_reqmsg", "ch")


def test_enable_async_and_finish_from_another_thread(nsqd, consumers):
    node = nsqd.nsqd
    bodies = [b"a%d" % i for i in range(5)]
    publish(node, "c_async", bodies)
    handed: queue.Queue[Message] = queue.Queue()
    finished: list[bytes] = []
    done = threading.Event()

    def handler(message: Message) -> bool:
        message.enable_async()
        handed.put(message)
        return False  # ignored: the message is answered elsewhere

    def finisher() -> None:
        while len(finished) < len(bodies):
            try:
                message = handed.get(timeout=TIMEOUT)
            except queue.Empty:
                return
            message.finish()
            finished.append(message.body)
        done.set()

    thread = threading.Thread(target=finisher, name="test-finisher", daemon=True)
    thread.start()
    consumer = consumers(
        "c_async", "ch", handler, nsqd_tcp_addresses=node.tcp_address, max_in_flight=5
    )
    assert done.wait(TIMEOUT), f"finished {finished}"
    thread.join(TIMEOUT)
    wait_for(lambda: consumer.stats()["finished"] == 5, TIMEOUT)
    stats = wait_drained(node, "c_async", "ch")
    assert stats["requeue_count"] == 0
    assert sorted(finished) == sorted(bodies)
    assert consumer.stats()["requeued"] == 0


def test_second_answer_is_ignored_with_a_warning(nsqd, consumers, caplog):
    node = nsqd.nsqd
    publish(node, "c_twice", [b"once"])
    answered = threading.Event()

    def handler(message: Message) -> None:
        message.finish()
        message.finish()
        message.requeue(delay=0)
        answered.set()

    caplog.set_level(logging.WARNING)
    consumer = consumers("c_twice", "ch", handler, nsqd_tcp_addresses=node.tcp_address)
    assert answered.wait(TIMEOUT)
    wait_for(lambda: consumer.stats()["finished"] == 1, TIMEOUT)
    stats = wait_drained(node, "c_twice", "ch")
    assert stats["requeue_count"] == 0
    assert [c["finish_count"] for c in stats["clients"]] == [1]
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.name == "nsqclient.message" and "already answered" in r.getMessage()
    ]
    assert len(warnings) == 2, warnings
    assert "finish" in warnings[0] and "requeue" in warnings[1]
    s = consumer.stats()
    assert (s["finished"], s["requeued"]) == (1, 0)
    assert not [r for r in caplog.records if "E_FIN_FAILED" in r.getMessage()]


def test_max_tries_gives_up_then_finishes(nsqd, consumers):
    node = nsqd.nsqd
    publish(node, "c_tries", [b"poison"])
    calls = Calls()
    given_up: list[tuple[bytes, int]] = []

    def handler(message: Message) -> bool:
        calls.add(message)
        return False

    def giving_up(message: Message) -> None:
        given_up.append((message.body, message.attempts))

    consumer = consumers(
        "c_tries",
        "ch",
        handler,
        nsqd_tcp_addresses=node.tcp_address,
        giving_up=giving_up,
        max_tries=2,
        default_requeue_delay=0,
        max_backoff_duration=0,
    )
    wait_for(lambda: given_up, TIMEOUT)
    assert given_up == [(b"poison", 3)]
    assert [(b, a) for b, a, _ in calls.snapshot()] == [(b"poison", 1), (b"poison", 2)]
    wait_for(lambda: consumer.stats()["finished"] == 1, TIMEOUT)
    stats = wait_drained(node, "c_tries", "ch")
    assert stats["requeue_count"] == 2
    s = consumer.stats()
    assert (s["given_up"], s["requeued"], s["finished"]) == (1, 2, 1)


def test_requeue_delay_grows_with_attempts_up_to_the_cap(nsqd, consumers, monkeypatch):
    node = nsqd.nsqd
    sent = SentCommands(monkeypatch)
    publish(node, "c_delay", [b"slow"])
    calls = Calls()
    given_up = threading.Event()

    def handler(message: Message) -> bool:
        calls.add(message)
        return False

    consumers(
        "c_delay",
        "ch",
        handler,
        nsqd_tcp_addresses=node.tcp_address,
        giving_up=lambda message: given_up.set(),
        max_tries=4,
        default_requeue_delay=0.1,
        max_requeue_delay=0.25,
        max_backoff_duration=0,
    )
    assert given_up.wait(TIMEOUT)
    assert [a for _, a, _ in calls.snapshot()] == [1, 2, 3, 4]
    # default_requeue_delay x attempts, capped at max_requeue_delay, in milliseconds.
    assert [int(words[2]) for words in sent.named(b"REQ")] == [100, 200, 250, 250]
    wait_drained(node, "c_delay", "ch")


def test_explicit_requeue_delay_is_sent_as_given(nsqd, consumers, monkeypatch):
    node = nsqd.nsqd
    sent = SentCommands(monkeypatch)
    publish(node, "c_explicit", [b"later", b"pynsq"])

    def handler(message: Message) -> None:
        if message.attempts > 1:
            return
        message.enable_async()
        if message.body == b"later":
            message.requeue(delay=0.123, backoff=False)
        else:
            message.requeue(time_ms=45, backoff=False)

    consumer = consumers(
        "c_explicit", "ch", handler, nsqd_tcp_addresses=node.tcp_address, max_in_flight=2
    )
    wait_for(lambda: consumer.stats()["requeued"] == 2, TIMEOUT)
    assert sorted(int(words[2]) for words in sent.named(b"REQ")) == [45, 123]
    # nsqd accepted both REQs.
    wait_for(lambda: (channel_stats(node, "c_explicit", "ch") or {}).get("requeue_count") == 2)


def test_touch_keeps_a_slow_message_alive(nsqd, consumers):
    node = nsqd.nsqd
    publish(node, "c_touch", [b"long"])
    calls = Calls()
    load = threading.Event()  # never set: waiting on it is the handler's work

    def handler(message: Message) -> None:
        calls.add(message)
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            message.touch()
            load.wait(min(0.4, max(end - time.monotonic(), 0)))

    consumer = consumers(
        "c_touch", "ch", handler, nsqd_tcp_addresses=node.tcp_address, msg_timeout=1.0
    )
    wait_for(lambda: consumer.stats()["finished"] == 1, TIMEOUT)
    assert consumer.connections()[0].msg_timeout == 1.0
    stats = wait_drained(node, "c_touch", "ch")
    assert stats["timeout_count"] == 0
    assert stats["requeue_count"] == 0
    assert [(b, a) for b, a, _ in calls.snapshot()] == [(b"long", 1)]
    # The handler kept the message alive: it was not late, so no "timed out" warning/count.
    assert consumer.stats()["timed_out_locally"] == 0


def test_untouched_slow_message_times_out_and_is_redelivered(nsqd, consumers):
    """The counterpart of the touch test: without touch() nsqd takes the message back after
    msg_timeout (1 s, set by the consumer) and delivers it again."""
    node = nsqd.nsqd
    publish(node, "c_notouch", [b"late"])
    calls = Calls()
    redelivered = threading.Event()

    def handler(message: Message) -> None:
        calls.add(message)
        if message.attempts == 1:
            redelivered.wait(TIMEOUT)  # holds the first delivery past its timeout
        else:
            redelivered.set()

    consumers(
        "c_notouch",
        "ch",
        handler,
        nsqd_tcp_addresses=node.tcp_address,
        msg_timeout=1.0,
        max_in_flight=2,
        concurrency=2,
    )
    # Real nsqd notices timeouts on its queue scan (a new channel joins it within 5 s).
    assert redelivered.wait(TIMEOUT)
    wait_for(lambda: len(calls) == 2, TIMEOUT)
    assert [(b, a) for b, a, _ in calls.snapshot()] == [(b"late", 1), (b"late", 2)]
    stats = wait_drained(node, "c_notouch", "ch")
    assert stats["timeout_count"] == 1


# ------------------------------------------------------------------------------------------------
# Flow control


def test_max_in_flight_zero_pauses_and_a_positive_value_resumes(nsqd, consumers):
    node = nsqd.nsqd
    calls = Calls()
    consumer = consumers(
        "c_pause", "ch", calls.add, nsqd_tcp_addresses=node.tcp_address, max_in_flight=5
    )
    publish(node, "c_pause", [b"p0", b"p1", b"p2"])
    wait_for(lambda: len(calls) == 3, TIMEOUT)
    wait_drained(node, "c_pause", "ch")
    wait_for(lambda: client_ready_counts(node, "c_pause", "ch") == [5], TIMEOUT)

    consumer.set_max_in_flight(0)
    assert consumer.max_in_flight == 0
    wait_for(lambda: client_ready_counts(node, "c_pause", "ch") == [0], TIMEOUT)
    publish(node, "c_pause", [b"q%d" % i for i in range(5)])
    # nsqd holds RDY 0 for this client: the messages wait in the channel, none is sent.
    stats = wait_drained(node, "c_pause", "ch", depth=5)
    assert [c["ready_count"] for c in stats["clients"]] == [0]
    assert len(calls) == 3
    assert consumer.stats()["received"] == 3

    consumer.set_max_in_flight(5)
    wait_for(lambda: len(calls) == 8, TIMEOUT)
    wait_drained(node, "c_pause", "ch")
    wait_for(lambda: client_ready_counts(node, "c_pause", "ch") == [5], TIMEOUT)
    with pytest.raises(ValueError):
        consumer.set_max_in_flight(-1)
    with pytest.raises(TypeError):
        consumer.set_max_in_flight("5")  # type: ignore[arg-type]
    assert consumer.max_in_flight == 5


def test_is_starved_when_held_messages_reach_85_percent_of_rdy(nsqd, consumers):
    node = nsqd.nsqd
    held: list[Message] = []
    lock = threading.Lock()

    def handler(message: Message) -> None:
        message.enable_async()
        with lock:
            held.append(message)

    consumer = consumers(
        "c_starved", "ch", handler, nsqd_tcp_addresses=node.tcp_address, max_in_flight=4
    )
    publish(node, "c_starved", [b"s0"])
    wait_for(lambda: len(held) == 1, TIMEOUT)
    # The first message raises RDY from 1 to 4; wait for nsqd to have it.
    wait_for(lambda: client_ready_counts(node, "c_starved", "ch") == [4], TIMEOUT)
    publish(node, "c_starved", [b"s1", b"s2"])
    wait_for(lambda: len(held) == 3, TIMEOUT)
    assert not consumer.is_starved()  # 3 of 4 is 75%
    publish(node, "c_starved", [b"s3"])
    wait_for(lambda: len(held) == 4, TIMEOUT)
    assert consumer.is_starved()
    with lock:
        batch = list(held)
    for message in batch:
        message.finish()
    assert not consumer.is_starved()
    wait_drained(node, "c_starved", "ch")


# ------------------------------------------------------------------------------------------------
# API surface


def test_stats_keys(nsqd, consumers):
    node = nsqd.nsqd
    publish(node, "c_stats", [b"k"])
    consumer = consumers(
        "c_stats", "ch", lambda m: None, nsqd_tcp_addresses=node.tcp_address, max_in_flight=3
    )
    wait_for(lambda: consumer.stats()["finished"] == 1, TIMEOUT)
    s = consumer.stats()
    assert set(s) >= {
        "received",
        "finished",
        "requeued",
        "given_up",
        "timed_out_locally",
        "handler_errors",
        "backoff_level",
        "max_in_flight",
        "connections",
    }
    assert s["max_in_flight"] == 3
    assert s["received"] == 1
    assert list(s["connections"]) == [node.tcp_address]
    conn = s["connections"][node.tcp_address]
    assert set(conn) >= {"address", "state", "rdy", "in_flight", "messages_received"}
    assert conn["state"] == "connected"
    assert conn["messages_received"] == 1
    assert conn["in_flight"] == 0
    assert consumer.is_running
    assert "c_stats/ch" in repr(consumer)


def test_start_twice_and_restart_raise_stop_twice_is_harmless(nsqd, consumers):
    node = nsqd.nsqd
    consumer = consumers("c_life", "ch", lambda m: None, nsqd_tcp_addresses=node.tcp_address)
    assert consumer.is_running
    with pytest.raises(RuntimeError):
        consumer.start()
    consumer.stop(timeout=5.0)
    assert not consumer.is_running
    consumer.stop(timeout=5.0)  # a second stop is a no-op
    with pytest.raises(RuntimeError):
        consumer.start()
    assert not nsq_threads()


def test_start_after_stop_of_a_never_started_consumer_raises(consumers):
    before = nsq_threads()
    consumer = consumers(
        "c_never", "ch", lambda m: None, start=False, nsqd_tcp_addresses="127.0.0.1:1"
    )
    consumer.stop(timeout=1.0)
    with pytest.raises(RuntimeError):
        consumer.start()
    assert not consumer.is_running
    assert not nsq_threads() - before


def test_concurrent_stops_close_each_connection_once(nsqd, consumers, monkeypatch):
    node = nsqd.nsqd
    cls_sent: list[str] = []
    original = Connection.send_cls

    def send_cls(conn: Connection) -> Any:
        cls_sent.append(conn.address)
        return original(conn)

    monkeypatch.setattr(Connection, "send_cls", send_cls)
    publish(node, "c_stop2", [b"z"])
    consumer = consumers("c_stop2", "ch", lambda m: None, nsqd_tcp_addresses=node.tcp_address)
    wait_for(lambda: consumer.stats()["finished"] == 1, TIMEOUT)
    go = threading.Barrier(3, timeout=TIMEOUT)

    def stopper() -> None:
        go.wait()
        consumer.stop(timeout=5.0)

    threads = [threading.Thread(target=stopper, name=f"test-stop-{i}") for i in range(2)]
    for t in threads:
        t.start()
    go.wait()
    for t in threads:
        t.join(TIMEOUT)
        assert not t.is_alive()
    # A second CLS on a closing connection is a fatal E_INVALID on nsqd.
    assert cls_sent == [node.tcp_address]


@pytest.mark.parametrize(
    "kwargs, error, text",
    [
        ({"topic": "bad topic!"}, ValueError, "topic"),
        ({"topic": "t" * 65}, ValueError, "topic"),
        ({"channel": "bad/channel"}, ValueError, "channel"),
        ({"handler": "not callable"}, TypeError, "callable"),
        ({"nsqd_tcp_addresses": None}, ValueError, "address"),
        ({"nsqd_tcp_addresses": ["nohost"]}, ValueError, "nohost"),
        ({"max_in_flight": -1}, ValueError, "max_in_flight"),
        ({"max_in_flight": 1.5}, TypeError, "max_in_flight"),
        ({"concurrency": 0}, ValueError, "concurrency"),
        ({"max_in_fligth": 3}, TypeError, "max_in_flight"),
        ({"msg_timeout": 0.5}, ValueError, "msg_timeout"),
    ],
)
def test_bad_arguments_fail_at_the_call_site(kwargs, error, text):
    before = set(threading.enumerate())
    args: dict[str, Any] = {
        "topic": "t",
        "channel": "c",
        "handler": lambda m: None,
        "nsqd_tcp_addresses": ["127.0.0.1:1"],
    }
    args.update(kwargs)
    with pytest.raises(error, match=text):
        Consumer(**args)
    assert set(threading.enumerate()) <= before


def test_run_returns_when_stop_is_called_from_another_thread(nsqd, consumers, monkeypatch):
    node = nsqd.nsqd
    cls_sent: list[str] = []
    original = Connection.send_cls

    def send_cls(conn: Connection) -> Any:
        cls_sent.append(conn.address)
        return original(conn)

    monkeypatch.setattr(Connection, "send_cls", send_cls)
    publish(node, "c_run", [b"r"])
    calls = Calls()
    consumer = consumers("c_run", "ch", calls.add, start=False, nsqd_tcp_addresses=node.tcp_address)
    errors: list[BaseException] = []

    def runner() -> None:
        try:
            consumer.run()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=runner, name="test-runner", daemon=True)
    thread.start()
    wait_for(lambda: len(calls) == 1, TIMEOUT)
    consumer.stop(timeout=5.0)
    thread.join(TIMEOUT)
    assert not thread.is_alive()
    assert errors == []
    assert not consumer.is_running
    wait_drained(node, "c_run", "ch")
    # run() stops too when it returns; the two stops must not both CLS (fatal on nsqd).
    assert cls_sent == [node.tcp_address]


CHILD = """
import sys
import threading

import nsqclient

topic, channel, address = sys.argv[1:4]
lock = threading.Lock()
counts = {"handled": 0}
load = threading.Event()  # never set: waiting on it is the handler's work


def handler(message):
    with lock:
        first = counts["handled"] == 0
    if first:
        print("ready", flush=True)
    load.wait(0.5)
    with lock:
        counts["handled"] += 1


consumer = nsqclient.Consumer(topic, channel, handler, nsqd_tcp_addresses=[address])
consumer.run()
s = consumer.stats()
print(f"handled={counts['handled']} finished={s['finished']} requeued={s['requeued']}",
      flush=True)
"""


def test_run_in_a_process_stops_cleanly_on_sigterm(nsqd, tmp_path):
    node = nsqd.nsqd
    publish(node, "c_sigterm", [b"t%d" % i for i in range(5)])
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(
        [sys.executable, str(script), "c_sigterm", "ch", node.tcp_address],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.strip())
        lines.put(None)

    reader = threading.Thread(target=read, name="test-child-stdout", daemon=True)
    reader.start()
    try:
        assert lines.get(timeout=TIMEOUT) == "ready"
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(TIMEOUT)
    stderr = proc.stderr.read() if proc.stderr else ""
    reader.join(TIMEOUT)
    assert rc == 0, stderr
    out = []
    while (line := lines.get(timeout=TIMEOUT)) is not None:
        out.append(line)
    match = re.fullmatch(r"handled=(\d+) finished=(\d+) requeued=(\d+)", out[-1])
    assert match, out
    handled, finished, requeued = map(int, match.groups())
    # The message in the handler when SIGTERM came was finished, not abandoned.
    assert handled >= 1
    assert finished == handled
    assert requeued == 0
    # And every FIN reached nsqd before the process exited.
    wait_drained(node, "c_sigterm", "ch", depth=5 - finished)


def test_connection_hooks(nsqd, consumers):
    node = nsqd.nsqd
    events: queue.Queue[tuple[Any, ...]] = queue.Queue()
    consumer = consumers(
        "c_hooks",
        "ch",
        lambda m: None,
        nsqd_tcp_addresses=node.tcp_address,
        on_connect=lambda address: events.put(("connect", address)),
        on_disconnect=lambda address, reason: events.put(("disconnect", address, reason)),
    )
    assert events.get(timeout=TIMEOUT) == ("connect", node.tcp_address)
    consumer.stop(timeout=5.0)
    event = events.get(timeout=TIMEOUT)
    assert event[:2] == ("disconnect", node.tcp_address)
    assert events.empty()


def test_a_failing_hook_is_logged_and_does_not_stop_consuming(nsqd, consumers, caplog):
    node = nsqd.nsqd
    publish(node, "c_badhook", [b"h"])
    calls = Calls()

    def hook(address: str) -> None:
        raise RuntimeError("hook failure on purpose")

    consumer = consumers(
        "c_badhook", "ch", calls.add, nsqd_tcp_addresses=node.tcp_address, on_connect=hook
    )
    wait_for(lambda: len(calls) == 1, TIMEOUT)
    wait_for(lambda: consumer.stats()["finished"] == 1, TIMEOUT)
    assert [r for r in caplog.records if "hook" in r.getMessage() and r.exc_info]


def test_no_library_thread_survives_stop(nsqd, consumers):
    node = nsqd.nsqd
    before = nsq_threads()
    publish(node, "c_threads", [b"%d" % i for i in range(20)])
    calls = Calls()
    consumer = consumers(
        "c_threads",
        "ch",
        calls.add,
        nsqd_tcp_addresses=node.tcp_address,
        lookupd_http_addresses=[nsqd.lookupd.http_url],
        lookupd_poll_interval=0.2,
        max_in_flight=5,
        concurrency=3,
    )
    wait_for(lambda: len(calls) == 20, TIMEOUT)
    names = {t.name for t in nsq_threads() - before}
    for prefix in ("nsq-discovery", "nsq-rdy", "nsq-reader-", "nsq-writer-"):
        assert [n for n in names if n.startswith(prefix)], (prefix, names)
    assert len([n for n in names if n.startswith("nsq-worker")]) == 3, names
    assert f"nsq-reader-{node.tcp_address}" in names
    consumer.stop(timeout=5.0)
    assert not {t.name for t in nsq_threads() - before}


def stopper(holder: list[Consumer], outcome: queue.Queue) -> Callable[..., None]:
    """A callback (handler or hook) that stops ``holder[0]`` from inside the consumer and puts
    the outcome on ``outcome``: None, or the exception stop() raised."""

    def stop(*_: Any) -> None:
        try:
            holder[0].stop(timeout=2.0)
        except BaseException as exc:
            outcome.put(exc)
        else:
            outcome.put(None)

    return stop


def wait_threads_gone(before: set[threading.Thread]) -> None:
    wait_for(
        lambda: not (nsq_threads() - before),
        TIMEOUT,
        message=lambda: f"left running: {sorted(t.name for t in nsq_threads() - before)}",
    )


def test_stop_called_from_a_handler(nsqd, consumers):
    """A handler may decide to stop its consumer (pynsq programs do: ``reader.close()``)."""
    node = nsqd.nsqd
    before = nsq_threads()
    publish(node, "c_selfstop", [b"stop"])
    outcome: queue.Queue[BaseException | None] = queue.Queue()
    holder: list[Consumer] = []
    consumer = consumers(
        "c_selfstop",
        "ch",
        stopper(holder, outcome),
        start=False,
        nsqd_tcp_addresses=node.tcp_address,
    )
    holder.append(consumer)
    consumer.start()
    assert outcome.get(timeout=TIMEOUT) is None
    assert not consumer.is_running
    wait_threads_gone(before)


def test_stop_called_from_a_connection_hook(nsqd, consumers):
    node = nsqd.nsqd
    before = nsq_threads()
    outcome: queue.Queue[BaseException | None] = queue.Queue()
    holder: list[Consumer] = []
    consumer = consumers(
        "c_hookstop",
        "ch",
        lambda m: None,
        start=False,
        nsqd_tcp_addresses=node.tcp_address,
        on_connect=stopper(holder, outcome),
    )
    holder.append(consumer)
    consumer.start()
    assert outcome.get(timeout=TIMEOUT) is None
    assert not consumer.is_running
    wait_threads_gone(before)


def test_max_in_flight_above_nsqd_max_rdy_count_is_capped(nsq_cluster_factory, consumers):
    cluster = nsq_cluster_factory(max_rdy_count=5)
    node = cluster.nsqd
    bodies = [b"cap%d" % i for i in range(30)]
    publish(node, "c_cap", bodies)
    calls = Calls()
    hooks: queue.Queue[Any] = queue.Queue()
    consumer = consumers(
        "c_cap",
        "ch",
        calls.add,
        nsqd_tcp_addresses=node.tcp_address,
        max_in_flight=20,
        on_disconnect=lambda address, reason: hooks.put(reason),
    )
    wait_for(lambda: len(calls) == 30, TIMEOUT)
    wait_drained(node, "c_cap", "ch")
    # A RDY above nsqd's limit is a fatal E_INVALID: the connection must have stayed up.
    assert hooks.empty()
    assert client_ready_counts(node, "c_cap", "ch") == [5]
    assert consumer.connections()[0].max_rdy_count == 5


@pytest.mark.embedded_only
def test_discovery_through_a_pre_1_0_lookupd(nsq_cluster_factory, consumers):
    cluster = nsq_cluster_factory(nsqd_count=2, lookupd_legacy_json=True)
    bodies = []
    for i, node in enumerate(cluster.nsqds):
        batch = [b"legacy%d-%d" % (i, j) for j in range(5)]
        publish(node, "c_legacy", batch)
        bodies += batch
    calls = Calls()
    consumer = consumers(
        "c_legacy",
        "ch",
        calls.add,
        lookupd_http_addresses=[cluster.lookupd.http_address],  # host:port works too
        max_in_flight=4,
    )
    wait_for(lambda: calls.bodies() == set(bodies), TIMEOUT)
    assert sorted(c.address for c in consumer.connections()) == sorted(
        n.tcp_address for n in cluster.nsqds
    )


def test_a_consumer_started_with_max_in_flight_0_says_it_is_paused(nsqd, consumers, caplog):
    caplog.set_level(logging.INFO, logger="nsqclient.consumer")
    got: list[Message] = []
    consumer = consumers(
        "c_paused0", "ch", got.append, nsqd_tcp_addresses=nsqd.nsqd.tcp_address, max_in_flight=0
    )
    paused = [r for r in caplog.records if "max_in_flight is 0" in r.getMessage()]
    assert len(paused) == 1 and paused[0].levelno == logging.WARNING
    publish(nsqd.nsqd, "c_paused0", [b"x"])
    consumer.set_max_in_flight(1)
    wait_for(lambda: len(got) == 1, TIMEOUT)
    assert any(r.getMessage().endswith("resumed") for r in caplog.records)


def test_stop_lets_handlers_work_through_the_messages_waiting_for_a_worker(nsqd, consumers):
    """docs/consumer.rst, Shutdown: within stop()'s timeout, messages already received but not
    yet started are handled, not requeued."""
    node = nsqd.nsqd
    release = threading.Event()
    handled: list[bytes] = []

    def handler(message: Message) -> None:
        release.wait(TIMEOUT)  # the first one holds the only worker: the rest wait for it
        handled.append(message.body)

    consumer = consumers(
        "c_stop_drain", "ch", handler, nsqd_tcp_addresses=node.tcp_address, max_in_flight=5
    )
    bodies = [b"d%d" % i for i in range(5)]
    publish(node, "c_stop_drain", bodies)
    wait_for(lambda: consumer.stats()["received"] == 5, TIMEOUT)
    stopper = threading.Thread(target=consumer.stop, kwargs={"timeout": TIMEOUT})
    stopper.start()
    wait_for(consumer._stopping.is_set, TIMEOUT)
    release.set()
    stopper.join(TIMEOUT)
    assert sorted(handled) == bodies
    stats = consumer.stats()
    assert (stats["finished"], stats["requeued"]) == (5, 0)


def test_an_idle_worker_takes_what_waits_behind_a_blocked_handler(nsqd, consumers):
    """Workers are handed runs (a socket read's messages): while one handler blocks, the other
    worker handles every other message received, and nsqd gets their FINs meanwhile."""
    node = nsqd.nsqd
    release = threading.Event()
    blocked: list[bytes] = []
    handled = Calls()

    def handler(message: Message) -> None:
        if not blocked:
            blocked.append(message.body)
            release.wait(TIMEOUT)  # the load: a handler that blocks
        handled.add(message)

    consumer = consumers(
        "c_run_shared",
        "ch",
        handler,
        nsqd_tcp_addresses=node.tcp_address,
        max_in_flight=10,
        concurrency=2,
    )
    publish(node, "c_run_shared", [b"r%d" % i for i in range(10)])
    try:
        wait_for(lambda: len(handled) == 9, TIMEOUT, message=lambda: f"{handled.snapshot()}")
        wait_for(
            lambda: (channel_stats(node, "c_run_shared", "ch") or {}).get("in_flight_count") == 1,
            TIMEOUT,
        )
        assert consumer.stats()["finished"] == 9
    finally:
        release.set()
    wait_drained(node, "c_run_shared", "ch")
    assert len(handled) == 10


def test_a_fin_is_sent_while_the_next_handler_blocks(nsqd, consumers):
    """One worker: each message's FIN is on its way to nsqd as its handler returns, not after
    the handlers of the messages read with it, and counted in stats() and
    connection_counts() while the next handler blocks."""
    node = nsqd.nsqd
    release = threading.Event()
    started = threading.Event()

    def handler(message: Message) -> None:
        if message.body == b"second":
            started.set()
            release.wait(TIMEOUT)  # the load: a handler that blocks

    consumer = consumers(
        "c_fin_early", "ch", handler, nsqd_tcp_addresses=node.tcp_address, max_in_flight=5
    )
    publish(node, "c_fin_early", [b"first", b"second"])
    try:
        assert started.wait(TIMEOUT)
        wait_for(
            lambda: (channel_stats(node, "c_fin_early", "ch") or {}).get("in_flight_count") == 1,
            TIMEOUT,
        )
        # Counted for whoever asks, though the worker is still on the run: see _fin_tally.py.
        assert consumer.stats()["finished"] == 1
        assert [c.in_flight for c in consumer.connection_counts()] == [1]
    finally:
        release.set()
    wait_drained(node, "c_fin_early", "ch")
