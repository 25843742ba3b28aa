"""Observers: what Consumers and Producers tell (nsqclient.observe), in handler mode, in pull
mode and for every form of publish; a global observer reaches clients made before and after."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

from nsqclient import Consumer, Message, Producer, RequeueMessage, observe
from nsqclient.errors import ConnectionClosedError
from nsqclient.observe import Observer, PublishEvent
from nsqclient.testing import EmbeddedNSQ
from nsqclient.testing.helpers import publish, wait_drained
from nsqclient.testing.waiting import wait_for

TIMEOUT = 10.0


class Recorder(Observer):
    """Every event, as (name, details), in the order told."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple[str, Any]] = []
        #: id(event) -> its end times unset at publish_started
        self.unended_at_start: dict[int, bool] = {}
        #: id(event) -> (time.monotonic(), time.time_ns()) when publish_ended was told
        self.ended_told: dict[int, tuple[float, int]] = {}

    def _add(self, name: str, details: Any) -> None:
        with self.lock:
            self.events.append((name, details))

    def names(self) -> list[str]:
        with self.lock:
            return [name for name, _ in self.events]

    def of(self, name: str) -> list[Any]:
        with self.lock:
            return [details for n, details in self.events if n == name]

    def attached(self, client: Any) -> None:
        self._add("attached", client)

    def detached(self, client: Any) -> None:
        self._add("detached", client)

    def publish_started(self, event: PublishEvent) -> None:
        self.unended_at_start[id(event)] = event.ended_at is None and event.ended_ns is None
        self._add("publish_started", event)

    def publish_ended(self, event: PublishEvent) -> None:
        self.ended_told[id(event)] = (time.monotonic(), time.time_ns())
        self._add("publish_ended", event)

    def assert_end_times(self, event: PublishEvent) -> None:
        """The event's end times were unset at its start, and taken before its end was told."""
        assert self.unended_at_start[id(event)]
        told_at, told_ns = self.ended_told[id(event)]
        assert event.ended_at is not None and event.ended_ns is not None
        assert event.started_at <= event.ended_at <= told_at
        assert event.started_ns <= event.ended_ns <= told_ns

    def connection_made(self, consumer: Any, key: str) -> None:
        self._add("connection_made", key)

    def connection_lost(self, consumer: Any, key: str, reason: Any) -> None:
        self._add("connection_lost", key)

    def handler_started(self, consumer: Any, message: Message) -> None:
        self._add("handler_started", message.body)

    def handler_ended(self, consumer: Any, message: Message, error: Any) -> None:
        self._add("handler_ended", (message.body, error))

    def messages_taken(self, consumer: Any, messages: Any) -> None:
        self._add("messages_taken", [m.body for m in messages])

    def message_given_up(self, consumer: Any, message: Message) -> None:
        self._add("message_given_up", message.body)

    def messages_answered(self, consumer, messages, action, delay, backoff) -> None:
        self._add("messages_answered", ([m.body for m in messages], action, delay, backoff))


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    rec = Recorder()
    yield rec
    observe.remove_observer(rec)


def refused_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


# ------------------------------------------------------------------------------------------------
# Producer


def test_every_publish_form_is_told_where_it_went(nsqd, recorder):
    node = nsqd.nsqd
    with Producer(node.tcp_address) as producer:
        producer.add_observer(recorder)
        producer.pub("obs_pub", b"one")
        producer.mpub("obs_pub", [b"a", b"bb", b"ccc"])
        producer.dpub("obs_pub", b"later", delay=0.01)
        futures = [
            producer.pub_async("obs_pub", b"x"),
            producer.mpub_async("obs_pub", [b"y", b"z"]),
            producer.dpub_async("obs_pub", b"w", delay=0.01),
        ]
        for future in futures:
            assert future.result(TIMEOUT) == b"OK"
        wait_for(lambda: len(recorder.of("publish_ended")) == 6, TIMEOUT)
    started = recorder.of("publish_started")
    ended = recorder.of("publish_ended")
    assert [(e.command, e.asynchronous, e.count) for e in started] == [
        ("PUB", False, 1),
        ("MPUB", False, 3),
        ("DPUB", False, 1),
        ("PUB", True, 1),
        ("MPUB", True, 2),
        ("DPUB", True, 1),
    ]
    assert {id(e) for e in started} == {id(e) for e in ended}
    assert started[0].body_size == 3 and started[1].body_size is None
    for event in ended:
        assert event.topic == "obs_pub"
        assert event.error is None and event.result == b"OK"
        assert event.nsqd_address == node.tcp_address
        assert event.single_nsqd == node.tcp_address
        assert not event.extendable
        recorder.assert_end_times(event)
    assert recorder.names()[0] == "attached" and recorder.names()[-1] == "detached"


def test_bad_input_is_no_publish_and_a_failed_one_says_why(recorder):
    producer = Producer(refused_address(), pub_timeout=TIMEOUT)
    producer.add_observer(recorder)
    with pytest.raises(ValueError):
        producer.pub("bad topic!", b"x")
    with pytest.raises(TypeError):
        producer.pub_async("t", 12)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        producer.mpub("t", [])
    assert recorder.of("publish_started") == []
    with pytest.raises(ConnectionClosedError):
        producer.pub("t", b"x")
    future = producer.pub_async("t", b"y")
    assert isinstance(future.exception(TIMEOUT), ConnectionClosedError)
    wait_for(lambda: len(recorder.of("publish_ended")) == 2, TIMEOUT)
    for event in recorder.of("publish_ended"):
        assert isinstance(event.error, ConnectionClosedError)
        assert event.result is None
        recorder.assert_end_times(event)
    producer.close()


def test_an_observer_that_raises_is_logged_and_changes_nothing(nsqd, caplog):
    class Broken(Observer):
        def publish_started(self, event: PublishEvent) -> None:
            raise RuntimeError("observer bug")

    with Producer(nsqd.nsqd.tcp_address) as producer:
        producer.add_observer(Broken())
        with caplog.at_level(logging.ERROR, logger="nsqclient.observe"):
            producer.pub("obs_broken", b"x")
        assert producer.pub_async("obs_broken", b"y").result(TIMEOUT) == b"OK"
    assert any("observer bug" in r.getMessage() or r.exc_info for r in caplog.records)


def test_a_global_observer_reaches_clients_made_before_and_after(nsqd, recorder):
    node = nsqd.nsqd
    before = Producer(node.tcp_address)
    observe.add_observer(recorder)
    observe.add_observer(recorder)  # once, however often added
    after = Producer(node.tcp_address)
    before.pub("obs_global", b"1")
    after.pub("obs_global", b"2")
    assert [e.producer for e in recorder.of("publish_ended")] == [before, after]
    # A global observer reaches every client alive, and another test's client may not have been
    # collected yet: only this test's two count here.
    mine = [c for c in recorder.of("attached") if c is before or c is after]
    assert mine == [before, after]
    observe.remove_observer(recorder)
    assert set(map(id, recorder.of("detached"))) >= {id(before), id(after)}
    before.pub("obs_global", b"3")  # no longer told
    assert len(recorder.of("publish_ended")) == 2
    before.close()
    after.close()


def test_no_observer_means_nothing_is_kept_for_them(nsqd):
    with Producer(nsqd.nsqd.tcp_address) as producer:
        assert producer._observers.active == ()
        producer.pub("obs_none", b"x")


# ------------------------------------------------------------------------------------------------
# Consumer, handler mode


def test_handler_mode_tells_each_handler_and_answer(nsqd, consumers, recorder):
    node = nsqd.nsqd
    publish(node, "obs_handle", [b"ok", b"fail", b"req", b"async"])
    done = threading.Event()
    held: list[Message] = []

    def handle(message: Message) -> Any:
        if message.body == b"fail":
            raise KeyError("boom")
        if message.body == b"req":
            raise RequeueMessage(delay=0, backoff=False)
        if message.body == b"async":
            message.enable_async()
            held.append(message)
            done.set()
        return None

    consumer = consumers(
        "obs_handle",
        "c",
        handle,
        start=False,
        nsqd_tcp_addresses=node.tcp_address,
        max_tries=1,
        max_in_flight=10,
        default_requeue_delay=0,
    )
    consumer.add_observer(recorder)
    consumer.start()
    assert done.wait(TIMEOUT)
    held[0].touch()
    held[0].finish()
    wait_drained(node, "obs_handle", "c")
    ended: dict[bytes, list[Any]] = defaultdict(list)
    for body, error in recorder.of("handler_ended"):
        ended[body].append(error)
    assert ended[b"ok"] == [None] and ended[b"async"] == [None]
    # the first run raised; the second found it given up on (no handler ran: no error)
    assert [type(e) for e in ended[b"fail"]] == [KeyError, type(None)]
    assert [type(e) for e in ended[b"req"]] == [RequeueMessage, type(None)]
    # fail and req came back with attempts 2 > max_tries 1: given up on, inside a handler run
    assert sorted(recorder.of("message_given_up")) == [b"fail", b"req"]
    answers = recorder.of("messages_answered")
    actions: dict[bytes, list[str]] = defaultdict(list)
    for bodies, action, _delay, _backoff in answers:
        for body in bodies:
            actions[body].append(action)
    assert actions[b"ok"] == ["finish"]
    assert actions[b"fail"] == ["requeue", "finish"]
    assert actions[b"req"] == ["requeue", "finish"]
    assert actions[b"async"] == ["touch", "finish"]
    requeue = next(a for a in answers if a[0] == [b"req"] and a[1] == "requeue")
    assert requeue[2:] == (0.0, False)
    names = recorder.names()
    # each answer a handler sends comes between its started and ended
    first_ok = names.index("handler_started")
    assert names[first_ok + 1 : first_ok + 3] == ["messages_answered", "handler_ended"]
    assert recorder.of("connection_made") == [node.tcp_address]


# ------------------------------------------------------------------------------------------------
# Consumer, pull mode


def test_pull_mode_tells_batches_taken_and_answered(nsqd, recorder):
    node = nsqd.nsqd
    publish(node, "obs_pull", [b"%d" % i for i in range(20)])
    consumer = Consumer(
        "obs_pull", "c", None, nsqd_tcp_addresses=node.tcp_address, max_in_flight=20
    )
    consumer.add_observer(recorder)
    consumer.start()
    try:
        taken: list[Message] = []
        wait_for(lambda: taken.extend(consumer.take(timeout=0.1)) or len(taken) == 20, TIMEOUT)
        assert consumer.finish_many(taken[:15]) == 15
        assert consumer.requeue_many(taken[15:], delay=0, backoff=False) == 5
    finally:
        consumer.stop(TIMEOUT)
    batches = recorder.of("messages_taken")
    assert sorted(b for batch in batches for b in batch) == sorted(b"%d" % i for i in range(20))
    answers = recorder.of("messages_answered")
    assert answers[0] == ([b"%d" % i for i in range(15)], "finish", None, None)
    assert answers[1] == ([b"%d" % i for i in range(15, 20)], "requeue", 0.0, False)
    assert recorder.of("handler_started") == []
    assert recorder.names()[-1] == "detached"


@pytest.mark.embedded_only
def test_pull_mode_on_youzan_ordered_partitions_keeps_each_partitions_order():
    topic, per_partition = "yz_pull_ord", 30
    with EmbeddedNSQ(youzan=True, nsqd_count=2, lookupd_count=1) as cluster:
        cluster.create_topic(topic, partitions=2, replica=1, ordered=True)
        cluster.create_channel(topic, "c")
        with Producer(lookupd_http_addresses=[cluster.lookupd.http_address]) as producer:
            for i in range(per_partition):
                for p in (0, 1):
                    producer.pub(topic, f"{p}:{i}".encode(), partition=p, timeout=TIMEOUT)
        consumer = Consumer(
            topic,
            "c",
            None,
            lookupd_http_addresses=[cluster.lookupd.http_address],
            ordered=True,
            max_in_flight=8,
            max_tries=1,  # ordered: never given up on, whatever max_tries
        )
        consumer.start()
        try:
            seen: dict[int, list[int]] = defaultdict(list)
            offsets: dict[int, list[int]] = defaultdict(list)

            def step() -> bool:
                batch = consumer.take(timeout=0.1)
                for m in batch:
                    p, i = map(int, m.body.split(b":"))
                    assert m.partition == p
                    seen[p].append(i)
                    offsets[p].append(m.offset)
                consumer.finish_many(batch)
                return sum(map(len, seen.values())) >= 2 * per_partition

            wait_for(step, TIMEOUT * 3, message=lambda: f"seen {dict(seen)}")
        finally:
            consumer.stop(TIMEOUT)
        for p in (0, 1):
            assert seen[p] == list(range(per_partition))
            assert offsets[p] == sorted(offsets[p])
        assert consumer.stats()["given_up"] == 0
