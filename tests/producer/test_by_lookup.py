"""Publishing by lookup (nsqclient/producer/_by_lookup.py) against a fake pool of nsqd endpoints:
the
collaborator asks the pool it writes through only what :class:`NsqdWriter` says, and one
retry policy decides for the blocking and the asynchronous path alike (each case runs both
ways)."""

from __future__ import annotations

import inspect
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest

from nsqclient.config import Config
from nsqclient.conn._futures import RequestFuture
from nsqclient.errors import (
    BadMessageError,
    ConnectionClosedError,
    FailedOnNotLeaderError,
    FailedOnNotWritableError,
    InvalidTraceIDError,
    MPubFailedError,
    NSQTimeoutError,
    PubFailedError,
    TopicNotExistError,
    error_from_frame,
)
from nsqclient.http import HTTPError
from nsqclient.producer._backlog import Backlog
from nsqclient.producer._by_lookup import LAST_ATTEMPT, LookupPublisher, NsqdWriter, Retries
from nsqclient.producer._nsqd_pool import NsqdPool
from nsqclient.producer._outer_futures import OuterFutures
from nsqclient.producer._producer import Producer
from nsqclient.producer._publish_forms import PublishResult, mpub_builder, pub_builder
from nsqclient.producer._router import Router
from nsqclient.testing.waiting import wait_for

TIMEOUT = 10.0


class FakeLookupd:
    """A youzan lookupd for topics of one partition, whose leader is ``ports[0]`` and moves
    to the next one each time ``move()`` is called."""

    def __init__(self, *ports: int) -> None:
        self.ports = list(ports)
        self.asked = 0
        #: while set, every lookup fails with it (a lookupd that hangs or refuses)
        self.failure: BaseException | None = None

    def move(self) -> None:
        self.ports.pop(0)

    def lookup(self, topic: str, access: str | None, metainfo: bool) -> dict[str, Any]:
        self.asked += 1
        if self.failure is not None:
            raise self.failure
        leader = {"broadcast_address": "h", "tcp_port": self.ports[0]}
        return {
            "channels": ["c"],
            "producers": [leader],
            "partitions": {"0": leader},
            "meta": {"partition_num": 1, "extend_support": True},
        }


class FakePool:
    def __init__(self, lookupd: FakeLookupd) -> None:
        self.lookupd = lookupd

    def refresh_members(self) -> list[str]:
        return []

    def first(self, ask: Callable[[Any], Any]) -> Any:
        return ask(self.lookupd)


class FakeEndpoint:
    def __init__(self, address: str) -> None:
        self.address = address
        self.dropped = 0

    def drop(self) -> None:
        self.dropped += 1


class FakeNsqdPool:
    """The Producer's pool as publishing by lookup sees it: each write takes the next outcome of
    ``outcomes`` (bytes: nsqd's answer; an exception: the write or the answer failed), and
    is recorded as (how, command, addresses)."""

    def __init__(self, outcomes: list[bytes | BaseException]):
        self.outcomes = outcomes
        self.writes: list[tuple[str, bytes, list[str] | None]] = []
        self.closed = False
        self.endpoints: dict[str, FakeEndpoint] = {}

    def endpoint(self, address: str, http_address: str | None = None) -> FakeEndpoint:
        return self.endpoints.setdefault(address, FakeEndpoint(address))

    def _next(self, how: str, command: bytes, endpoints: list[Any] | None) -> Any:
        self.writes.append(
            (how, command, None if endpoints is None else [e.address for e in endpoints])
        )
        return self.outcomes.pop(0) if self.outcomes else ConnectionClosedError("none left")

    def publish_on(self, command, endpoints, timeout, deadline, event) -> bytes:
        outcome = self._next("blocking", command, endpoints)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def submit_now(self, command, endpoints) -> Future | None:
        return None  # nothing connected: the first attempt goes to the backlog

    def submit_connecting(self, command, endpoints, deadline, first) -> Future:
        outcome = self._next("first" if first else "retry", command, endpoints)
        future = RequestFuture()
        if isinstance(outcome, ConnectionClosedError) and not outcome.maybe_processed:
            raise outcome  # could not connect: nothing written
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
        return future


class Parts:
    def __init__(
        self, outcomes: list[bytes | BaseException], lookup: bool = True, **options: Any
    ) -> None:
        self.lookupd = FakeLookupd(4001, 4002, 4003, 4004, 4005) if lookup else None
        self.nsqd = FakeNsqdPool(outcomes)
        self.config = Config(**options)
        router = Router(FakePool(self.lookupd), 60.0) if self.lookupd else None  # type: ignore[arg-type]
        self.failed: list[RequestFuture] = []
        self.outers = OuterFutures(
            self.failed.append, self.config.pub_timeout, lambda a: None, lambda: None
        )
        self.publisher = LookupPublisher(
            self.nsqd,  # type: ignore[arg-type]
            router,
            self.config,
            Backlog("test"),
            self.outers,
        )

    def publish(self, way: str, topic: str = "t", **kwargs: Any) -> Any:
        """Publish ``b"m"`` to ``topic`` the blocking or the asynchronous way; return what
        pub() returns or raise what it raises (for async: what the Future holds)."""
        trace_id = kwargs.pop("trace_id", None)
        ext = kwargs.pop("ext", None)
        router = self.publisher.router
        if kwargs.pop("batch", False):
            build, traced = mpub_builder(router, False, topic, [b"m", b"n"], None, trace_id, ext)
        else:
            build, traced = pub_builder(router, False, topic, b"m", None, trace_id, ext)
        partition, key = kwargs.pop("partition", None), kwargs.pop("key", None)
        if way == "blocking":
            return self.publisher.publish(topic, build, traced, None, partition, key)
        future = self.publisher.submit(topic, build, traced, partition, key)
        return future.result(TIMEOUT)

    def leader_moved(self, topic: str = "t") -> None:
        """The route of ``topic`` is cached (an earlier publish looked it up); then its
        leader moves."""
        assert self.publisher.router is not None and self.lookupd is not None
        self.publisher.router.route(topic)
        self.lookupd.move()

    def addresses(self) -> list[list[str] | None]:
        return [addresses for _, _, addresses in self.nsqd.writes]


WAYS = ["blocking", "async"]


@pytest.mark.parametrize("way", WAYS)
def test_a_moved_leader_is_looked_up_again_and_the_publish_goes_there(way):
    parts = Parts([FailedOnNotLeaderError("E_FAILED_ON_NOT_LEADER"), b"OK"])
    parts.leader_moved()
    answer = parts.publish(way)
    assert answer == (None if way == "blocking" else b"OK")
    assert parts.addresses() == [["h:4001"], ["h:4002"]]
    assert parts.lookupd is not None and parts.lookupd.asked == 2
    if way == "async":  # the first from the backlog, the retry connecting until its deadline
        assert [how for how, _, _ in parts.nsqd.writes] == ["first", "retry"]


@pytest.mark.parametrize("way", WAYS)
def test_a_route_the_failed_attempt_looked_up_itself_is_kept_for_one_retry(way):
    """Only a route fetched before the failed attempt began is thrown away: one it fetched
    is as fresh as lookup can tell; the retry after that one looks up again."""
    refusals: list[bytes | BaseException] = [
        FailedOnNotLeaderError("E_FAILED_ON_NOT_LEADER") for _ in range(2)
    ]
    parts = Parts([*refusals, b"OK"])
    parts.publish(way)
    assert parts.addresses() == [["h:4001"], ["h:4001"], ["h:4001"]]
    assert parts.lookupd is not None and parts.lookupd.asked == 2  # before the third attempt


@pytest.mark.parametrize("way", WAYS)
def test_stale_route_refusals_are_retried_at_most_leader_retries_times(way):
    refusals: list[bytes | BaseException] = [
        FailedOnNotLeaderError("E_FAILED_ON_NOT_LEADER") for _ in range(4)
    ]
    parts = Parts(refusals, leader_retries=2)
    with pytest.raises(FailedOnNotLeaderError):
        parts.publish(way)
    assert len(parts.nsqd.writes) == 3  # 1 + leader_retries


@pytest.mark.parametrize("way", WAYS)
def test_a_gone_leader_is_retried_until_the_deadline_then_nothing_was_sent(way):
    gone: list[bytes | BaseException] = [
        ConnectionClosedError("refused", maybe_processed=False) for _ in range(50)
    ]
    parts = Parts(gone, pub_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(
        NSQTimeoutError, match="no leader of 't' could be reached within 0.5s"
    ) as info:
        parts.publish(way)
    assert not info.value.maybe_processed
    assert isinstance(info.value.__cause__, ConnectionClosedError)
    assert 0.1 < time.monotonic() - started < 0.5 + 0.5
    assert len(parts.nsqd.writes) >= 2  # waits of 0.1, 0.2 ... between attempts


@pytest.mark.parametrize("way", WAYS)
def test_a_publish_that_may_have_been_stored_is_not_retried(way):
    parts = Parts([ConnectionClosedError("died", maybe_processed=True), b"OK"])
    with pytest.raises(ConnectionClosedError, match="died"):
        parts.publish(way)
    assert len(parts.nsqd.writes) == 1


@pytest.mark.parametrize("way", WAYS)
def test_nothing_is_retried_once_the_producer_is_closed(way):
    parts = Parts([FailedOnNotLeaderError("E_FAILED_ON_NOT_LEADER"), b"OK"])
    parts.nsqd.closed = True
    if way == "async":
        with pytest.raises(ConnectionClosedError, match="closed"):
            parts.publish(way)
        assert parts.nsqd.writes == []
        return
    with pytest.raises(FailedOnNotLeaderError):
        parts.publish(way)
    assert len(parts.nsqd.writes) == 1


@pytest.mark.parametrize("way", WAYS)
def test_a_traced_publish_answers_a_publish_result(way):
    reply = struct.pack(">2sQQQI", b"OK", (0 << 50) | 7, 42, 1000, 60)
    parts = Parts([reply])
    result = parts.publish(way, trace_id=42)
    assert result == PublishResult(7, 42, 1000, 60, 0, "h:4001")
    assert parts.nsqd.writes[0][1].startswith(b"PUB_TRACE t 0\n")


@pytest.mark.parametrize("way", WAYS)
def test_a_refused_mpub_ext_drops_its_connection(way):
    parts = Parts([InvalidTraceIDError("E_INVALID_TRACE_ID")])
    with pytest.raises(InvalidTraceIDError):
        parts.publish(way, batch=True, ext={"k": "v"})
    assert parts.nsqd.endpoints["h:4001"].dropped == 1


@pytest.mark.parametrize("way", WAYS)
def test_without_lookupd_the_given_addresses_take_youzans_forms_once(way):
    parts = Parts([FailedOnNotLeaderError("E_FAILED_ON_NOT_LEADER"), b"OK"], lookup=False)
    with pytest.raises(FailedOnNotLeaderError):
        parts.publish(way, partition=1)
    assert parts.nsqd.writes[0][1].startswith(b"PUB t 1\n")
    assert parts.addresses() == [None]  # the Producer's own addresses
    with pytest.raises(ValueError, match="key= needs lookupd_http_addresses"):
        parts.publish(way, key="k")


def test_the_producers_pool_is_what_it_writes_through_and_the_producer_inherits_nothing():
    assert Producer.__mro__ == (Producer, object)
    producer = Producer(lookupd_http_addresses="127.0.0.1:4161")
    try:
        assert producer._by_lookup.pool is producer._pool
    finally:
        producer.close()
    wanted = {
        name
        for name, _ in inspect.getmembers(NsqdWriter)
        if not name.startswith("_") or name == "closed"
    }
    assert wanted == {"closed", "endpoint", "publish_on", "submit_now", "submit_connecting"}
    for name in wanted:
        assert hasattr(NsqdPool, name) or name == "closed", name
    for name in wanted - {"closed"}:
        ours = inspect.signature(getattr(NsqdPool, name)).parameters
        theirs = inspect.signature(getattr(NsqdWriter, name)).parameters
        assert list(ours)[: len(theirs)] == list(theirs), name


@pytest.mark.parametrize("way", WAYS)
def test_a_stale_route_refusal_is_retried_until_the_publishs_timeout(way):
    refusals: list[bytes | BaseException] = [
        FailedOnNotLeaderError("E_FAILED_ON_NOT_LEADER") for _ in range(50)
    ]
    parts = Parts(refusals, pub_timeout=0.8, leader_retries=100)
    started = time.monotonic()
    with pytest.raises(NSQTimeoutError, match="refused by its leader at every attempt") as info:
        parts.publish(way)
    elapsed = time.monotonic() - started
    # Waits of 0.1, 0.2, 0.4 (cut short): it raises at the deadline, not before.
    assert 0.8 - 2 * LAST_ATTEMPT <= elapsed < 0.8 + 0.5
    assert 3 <= len(parts.nsqd.writes) <= 5
    assert not info.value.maybe_processed
    assert isinstance(info.value.__cause__, FailedOnNotLeaderError)


#: youzan nsqd's refusals that come before it writes anything (nsqdserver/protocol_v2.go,
#: context.go), as frames: a retry cannot store them twice
UNSTORED = [
    b"E_FAILED_ON_NOT_LEADER ",
    b"E_FAILED_ON_NOT_WRITABLE ",
    b"E_TOPIC_NOT_EXIST ",
    b"E_PUB_FAILED exiting",
    b"E_PUB_FAILED pub timeout while pop wait queue",
    b"E_PUB_FAILED pub to wait channel timeout",
    b"E_MPUB_FAILED exiting",
]


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("frame", UNSTORED, ids=lambda f: f.decode().strip())
def test_a_refusal_that_stored_nothing_is_retried(way, frame):
    refusal = error_from_frame(frame)
    assert isinstance(
        refusal,
        (
            FailedOnNotLeaderError,
            FailedOnNotWritableError,
            TopicNotExistError,
            PubFailedError,
            MPubFailedError,
        ),
    )
    parts = Parts([refusal, refusal, b"OK"])
    parts.publish(way, batch=frame.startswith(b"E_MPUB"))
    assert len(parts.nsqd.writes) == 3


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize(
    "frame",
    [b"E_PUB_FAILED topic coordinator is exiting", b"E_PUB_FAILED ", b"E_BAD_MESSAGE too big"],
)
def test_a_refusal_that_may_have_stored_or_cannot_be_mended_is_not_retried(way, frame):
    """youzan's cluster write may fail after the leader wrote locally ("topic coordinator is
    exiting" comes from there too): only the texts sent before any write are retried."""
    refusal = error_from_frame(frame)
    assert isinstance(refusal, (PubFailedError, BadMessageError))
    parts = Parts([refusal, b"OK"])
    with pytest.raises(type(refusal)):
        parts.publish(way)
    assert len(parts.nsqd.writes) == 1


LOOKUPD_DOWN = [
    HTTPError(0, "timed out after 2 s waiting for h:4161", "http://h:4161/lookup"),
    HTTPError(0, "connection refused", "http://h:4161/lookup"),
    HTTPError(503, "unavailable", "http://h:4161/lookup"),
]


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("failure", LOOKUPD_DOWN, ids=lambda e: e.message.split()[0])
def test_while_lookupd_fails_the_last_known_leader_takes_the_publishes(way, failure):
    """A publish that finds its route old or stale while no lookupd answers goes to the last
    leader lookup named: lookupd's failure alone fails no publish."""
    refusal = FailedOnNotLeaderError("E_FAILED_ON_NOT_LEADER")
    parts = Parts([b"OK", refusal, b"OK", b"OK"])
    parts.publish(way)  # the route is known
    assert parts.lookupd is not None
    parts.lookupd.failure = failure
    parts.publish(way)  # refused once (its route now stale), then the last known leader
    parts.publish(way)  # within the lookup's backoff: lookupd is not asked
    assert parts.addresses() == [["h:4001"]] * 4
    assert parts.lookupd.asked == 2


@pytest.mark.parametrize("way", WAYS)
def test_a_topic_no_lookupd_can_tell_is_retried_until_the_timeout_naming_lookupds_error(way):
    parts = Parts([b"OK"], pub_timeout=0.6)
    assert parts.lookupd is not None
    parts.lookupd.failure = LOOKUPD_DOWN[0]
    started = time.monotonic()
    with pytest.raises(NSQTimeoutError, match="no lookupd told where 't' goes") as info:
        parts.publish(way)
    assert 0.6 - 2 * LAST_ATTEMPT <= time.monotonic() - started < 0.6 + 0.5
    assert "timed out after 2 s" in str(info.value)
    assert not info.value.maybe_processed
    assert parts.nsqd.writes == []
    assert parts.lookupd.asked >= 3


@pytest.mark.parametrize("way", WAYS)
def test_lookupd_coming_back_mid_publish_lets_it_through(way):
    parts = Parts([b"OK"], pub_timeout=TIMEOUT)
    assert parts.lookupd is not None
    lookupd = parts.lookupd
    lookupd.failure = LOOKUPD_DOWN[1]
    original = lookupd.lookup

    def heals(topic: str, access: str | None, metainfo: bool) -> dict[str, Any]:
        if lookupd.asked >= 2:
            lookupd.failure = None
        return original(topic, access, metainfo)

    lookupd.lookup = heals  # type: ignore[method-assign]
    parts.publish(way)
    assert parts.addresses() == [["h:4001"]]
    assert lookupd.asked == 3


@pytest.mark.parametrize("way", WAYS)
def test_the_timeout_names_the_last_failure_and_lookupds(way):
    """A dead leader while lookupd hangs: the publish raises at its timeout, saying its
    leader could not be reached and why lookup could not say where else to go."""
    gone = [ConnectionClosedError("connection refused", maybe_processed=False)] * 50
    parts = Parts([b"OK", *gone], pub_timeout=0.6)
    parts.publish(way)
    assert parts.lookupd is not None
    parts.lookupd.failure = LOOKUPD_DOWN[0]
    with pytest.raises(NSQTimeoutError) as info:
        parts.publish(way)
    text = str(info.value)
    assert "no leader of 't' could be reached within 0.6s" in text
    assert "connection refused" in text
    assert "lookupd meanwhile: no reply from" in text and "timed out after 2 s" in text


# ---------------------------------------------------------------- the retry timers and close()


def retry_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("nsq-pub-retry-t")]


def submit(parts: Parts) -> Future:
    build, traced = pub_builder(parts.publisher.router, False, "t", b"m", None, None, None)
    return parts.publisher.submit("t", build, traced, None, None)


GONE: list[bytes | BaseException] = [
    ConnectionClosedError("refused", maybe_processed=False) for _ in range(50)
]


def test_cancelled_retries_fail_their_publishes_at_once_and_their_timers_are_joined():
    """What Producer.close() does once closed: a retry not due yet never runs; its publish
    fails now, saying nothing was sent, and the timer threads are joined."""
    parts = Parts(list(GONE), pub_timeout=30.0)
    future = submit(parts)
    wait_for(retry_threads, TIMEOUT)
    parts.nsqd.closed = True
    parts.publisher.cancel_retries()
    error = future.exception(0)
    assert isinstance(error, ConnectionClosedError) and not error.maybe_processed
    parts.publisher.join_retries(time.monotonic() + TIMEOUT)
    assert retry_threads() == []


def test_nothing_is_scheduled_once_the_retries_are_cancelled():
    """A retry an attempt asks for as close() cancels the others: refused, so that the
    caller fails its publish rather than leave a timer behind close()."""
    parts = Parts([])
    retries = Retries()
    retries.cancel()
    ran: list[int] = []
    outer = parts.outers.track(time.monotonic() + TIMEOUT)
    assert not retries.schedule(0.0, "t", outer, GONE[0], lambda: ran.append(1))
    assert retries.wait(time.monotonic()) and retries.cancel() == []
    assert ran == [] and retry_threads() == []


def test_waiting_for_the_retries_lets_one_due_go_out():
    """What Producer.close() does first: the retries due before its deadline run."""
    parts = Parts([ConnectionClosedError("refused", maybe_processed=False), b"OK"])
    future = submit(parts)
    wait_for(lambda: retry_threads() or future.done(), TIMEOUT)
    assert parts.publisher.wait_retries(time.monotonic() + TIMEOUT)
    assert future.result(0) == b"OK"
    assert [how for how, _, _ in parts.nsqd.writes] == ["first", "retry"]


def test_a_done_callback_on_a_retry_thread_may_close_without_waiting_for_itself():
    parts = Parts([ConnectionClosedError("refused", maybe_processed=False), b"OK"])
    closed: list[tuple[str, bool]] = []

    def close(future: Future) -> None:  # what Producer.close() asks of publishing by lookup
        deadline = time.monotonic() + TIMEOUT
        waited = parts.publisher.wait_retries(deadline)
        parts.publisher.cancel_retries()
        parts.publisher.join_retries(deadline)
        closed.append((threading.current_thread().name, waited and time.monotonic() < deadline))

    submit(parts).add_done_callback(close)
    wait_for(lambda: closed, TIMEOUT)
    assert closed == [("nsq-pub-retry-t", True)]
