"""Discovery as a collaborator: driven through its methods with a fake owner and a fake clock
(no sockets, no sleep), and the seam itself (the Protocol, who reads what)."""

from __future__ import annotations

import ast
import inspect
import logging
import threading
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest

import nsqclient
from nsqclient.config import Config
from nsqclient.consumer import _discovery as discovery_module
from nsqclient.consumer._consumer import Consumer
from nsqclient.consumer._discovery import ORPHAN_LOOKUP_CAP, Discovery, DiscoveryOwner
from nsqclient.errors import NSQError, SubExtendNeedError, SubOrderIsMustError


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeOwner:
    """A DiscoveryOwner that records what it is told."""

    def __init__(self, take: bool = True):
        self.held: dict[str, Any] = {}
        self.take = take
        self.calls: list[tuple[Any, ...]] = []
        self.failed: list[NSQError] = []

    def held_keys(self) -> Collection[str]:
        return set(self.held)

    def subscribed(self, conn: Any) -> bool:
        self.calls.append(("subscribed", conn.key))
        if self.take:
            self.held[conn.key] = conn
        return self.take

    def connection_made(self, key: str) -> None:
        self.calls.append(("made", key))

    def connection_lost(self, key: str, reason: BaseException | None) -> None:
        self.calls.append(("lost", key, reason))

    def fail(self, error: NSQError) -> None:
        self.failed.append(error)


class FakeLookupds:
    def __init__(self, answers: list[tuple[str, dict[str, Any]]]):
        self.answers = answers
        self.closed = False

    def __len__(self) -> int:
        return 1

    def refresh_members(self) -> list[str]:
        return []

    def lookup_each(self, topic: str, access: Any = None, metainfo: bool = False) -> Any:
        return list(self.answers)

    def close(self) -> None:
        self.closed = True


class FakeConn:
    """What Discovery._subscribe uses of a Connection."""

    def __init__(self, key: str, partition: int | None = None, error: BaseException | None = None):
        self.key = key
        self.partition = partition
        self.error = error
        self.closed = False
        self.close_reason: BaseException | None = None
        self.sent: list[bytes] = []

    def connect(self) -> None:
        pass

    def request(self, command: bytes) -> Any:
        self.sent.append(command)
        conn = self

        class Answer:
            def result(self, timeout: float) -> bytes:
                if conn.error is not None:
                    raise conn.error
                return b"OK"

        return Answer()

    def close(self, timeout: float = 5.0) -> None:
        self.closed = True


def make(
    owner: FakeOwner | None = None,
    *,
    clock: FakeClock | None = None,
    nsqd: tuple[str, ...] = (),
    lookupd: tuple[str, ...] = ("127.0.0.1:4161",),
    started: list[tuple[str, bool]] | None = None,
    **kwargs: Any,
) -> Discovery:
    """A Discovery whose connects are only recorded in ``started`` (no thread, no socket)."""
    options = {
        k: kwargs.pop(k)
        for k in list(kwargs)
        if k not in ("partition", "ordered", "on_connect", "on_disconnect")
    }
    config = Config(reconnect_interval=1.0, max_reconnect_interval=60.0, **options)
    d = Discovery(
        owner or FakeOwner(),
        "t",
        "c",
        config,
        delegate=None,  # type: ignore[arg-type]
        nsqd_tcp_addresses=nsqd,
        lookupd_http_addresses=lookupd,
        clock=clock or FakeClock(),
        **kwargs,
    )
    if started is not None:
        d._start_connect = lambda key, direct: started.append((key, direct))  # type: ignore[method-assign]
    return d


def producer(port: int) -> dict[str, Any]:
    return {"broadcast_address": "127.0.0.1", "tcp_port": port}


def youzan(partitions: dict[str, int], **meta: Any) -> dict[str, Any]:
    return {
        "partitions": {p: producer(port) for p, port in partitions.items()},
        "meta": {"partition_num": len(partitions), **meta},
    }


# ------------------------------------------------------------------------------------------------
# The seam


def test_consumer_inherits_from_no_mixin() -> None:
    assert Consumer.__mro__ == (Consumer, object)


def test_discovery_asks_its_owner_only_what_the_protocol_names() -> None:
    protocol = {n for n in vars(DiscoveryOwner) if not n.startswith("_")}
    assert protocol == {"held_keys", "subscribed", "connection_made", "connection_lost", "fail"}
    tree = ast.parse(Path(discovery_module.__file__).read_text(encoding="utf-8"))
    asked = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "_owner"
    }
    assert asked <= protocol, asked - protocol
    assert "_consumer" not in inspect.getsource(discovery_module)


def test_the_consumer_is_an_owner_through_its_delegate() -> None:
    consumer = Consumer("t", "c", lambda m: None, nsqd_tcp_addresses="127.0.0.1:4150")
    owner: DiscoveryOwner = (
        consumer._delegate
    )  # mypy checks it where consumer/_consumer.py passes it
    assert owner.held_keys() == set()
    assert consumer._discovery._owner is owner
    assert not any(isinstance(v, Discovery) for k, v in vars(consumer).items() if k != "_discovery")


def test_the_public_names_stay() -> None:
    assert nsqclient.consumer._consumer.split_key("h:1#2") == ("h:1", 2)
    assert nsqclient.consumer._consumer.target_key("h:1", None) == "h:1"


def test_hooks_set_on_the_consumer_are_the_ones_discovery_runs() -> None:
    consumer = Consumer("t", "c", lambda m: None, nsqd_tcp_addresses="127.0.0.1:4150")
    assert consumer.on_connect is None

    def hook(key: str) -> None:
        pass

    consumer.on_connect = hook
    assert consumer._discovery.on_connect is hook
    assert consumer.on_connect is hook


def test_ordered_checks_still_fail_at_construction() -> None:
    with pytest.raises(ValueError, match="needs partition="):
        Consumer("t", "c", print, nsqd_tcp_addresses="127.0.0.1:4150", ordered=True)
    with pytest.raises(ValueError, match="cannot sample"):
        Consumer("t", "c", print, lookupd_http_addresses="h:4161", ordered=True, sample_rate=5)


# ------------------------------------------------------------------------------------------------
# What lookup answers become


def test_a_classic_answer_names_each_nsqd() -> None:
    d = make()
    found = d._targets("l", {"producers": [producer(4150), producer(4152), {"tcp_port": 1}]})
    assert sorted(found) == ["127.0.0.1:4150", "127.0.0.1:4152"]
    assert all(c is d.config for c in found.values())


def test_a_youzan_answer_names_each_partition_with_a_youzan_config() -> None:
    d = make()
    found = d._targets("l", youzan({"0": 4150, "1": 4152}, extend_support=True))
    assert sorted(found) == ["127.0.0.1:4150#0", "127.0.0.1:4152#1"]
    config = found["127.0.0.1:4150#0"]
    assert config.youzan and config.extend_support
    assert d._partition_num == 2


def test_partition_keeps_only_that_partition() -> None:
    d = make(partition=1)
    assert list(d._targets("l", youzan({"0": 4150, "1": 4152}))) == ["127.0.0.1:4152#1"]


def test_an_ordered_topic_stops_an_unordered_consumer() -> None:
    owner = FakeOwner()
    d = make(owner)
    assert d._targets("l", youzan({"0": 4150}, ordered=True)) == {}
    [error] = owner.failed
    assert isinstance(error, SubOrderIsMustError) and "ordered=True" in str(error)


def test_ordered_against_classic_lookupd_stops(caplog: pytest.LogCaptureFixture) -> None:
    owner = FakeOwner()
    d = make(owner, ordered=True)
    assert d._targets("l", {"producers": [producer(4150)]}) == {}
    assert "classic NSQ's shape" in str(owner.failed[0])
    assert d._targets("l", youzan({"0": 4150}, ordered=False))  # warned, goes on
    assert d._targets("l", youzan({"0": 4150}, ordered=False))
    assert sum("is not ordered" in r.getMessage() for r in caplog.records) == 1


def test_a_poll_connects_what_is_neither_held_nor_connecting() -> None:
    owner = FakeOwner()
    owner.held["127.0.0.1:4150"] = object()
    started: list[tuple[str, bool]] = []
    d = make(owner, started=started)
    d._connecting["127.0.0.1:4152"] = object()  # type: ignore[assignment]
    d._lookupds = FakeLookupds(  # type: ignore[assignment]
        [("l", {"producers": [producer(p) for p in (4150, 4152, 4154, 4156)]})]
    )
    d._query_lookupds()
    assert started == [("127.0.0.1:4154", False), ("127.0.0.1:4156", False)]


# ------------------------------------------------------------------------------------------------
# Orphan partitions


def test_an_orphan_partition_looks_up_again_sooner_and_sooner_then_stops() -> None:
    clock = FakeClock()
    owner = FakeOwner()
    owner.held = {"127.0.0.1:4150#0": 1, "127.0.0.1:4152#1": 1}
    started: list[tuple[str, bool]] = []
    d = make(owner, clock=clock, started=started, lookupd_poll_interval=60.0)
    # three partitions, and lookup names no leader for partition 2
    lookupds = FakeLookupds([("l", youzan({"0": 4150, "1": 4152}, partition_num=3))])
    d._lookupds = lookupds  # type: ignore[assignment]
    d._query_lookupds()
    delays = [d._requery_at - clock.now]
    for _ in range(4):
        d._requery_at = float("inf")
        d._follow_orphans()
        delays.append(d._requery_at - clock.now)
    assert delays == [1.0, 2.0, ORPHAN_LOOKUP_CAP, ORPHAN_LOOKUP_CAP, ORPHAN_LOOKUP_CAP]
    assert started == []
    lookupds.answers = [("l", youzan({"0": 4150, "1": 4152, "2": 4154}))]
    d._query_lookupds()  # a successor is named: connect it
    assert started == [("127.0.0.1:4154#2", False)]
    owner.held["127.0.0.1:4154#2"] = 1
    d._requery_at = float("inf")
    d._follow_orphans()
    assert d._orphan_lookups == 0 and d._requery_at == float("inf")


def test_a_partition_being_connected_is_no_orphan() -> None:
    d = make()
    d._partition_num = 2
    d._partitions_seen = {0, 1}
    d._connecting = {"h:1#0": object(), "h:2#1": object()}  # type: ignore[dict-item]
    d._follow_orphans()
    assert d._requery_at == float("inf")


def test_the_orphan_cap_never_exceeds_the_poll_interval() -> None:
    clock = FakeClock()
    d = make(clock=clock, lookupd_poll_interval=1.5)
    d._partition_num = 1
    for _ in range(4):
        d._requery_at = float("inf")
        d._follow_orphans()
    assert d._requery_at - clock.now == 1.5


# ------------------------------------------------------------------------------------------------
# Reconnects


def test_a_direct_address_reconnects_after_a_growing_delay() -> None:
    clock = FakeClock()
    d = make(clock=clock, nsqd=("127.0.0.1:4150",), lookupd=())
    key = "127.0.0.1:4150"
    delays = []
    for _ in range(4):
        d._schedule_reconnect(key, True, OSError("refused"))
        delays.append(d._reconnect_at[key] - clock.now)
    assert delays == [1.0, 2.0, 4.0, 8.0]
    assert d._due_reconnects(clock.now + 7.9) == []
    assert d._due_reconnects(clock.now + 8.0) == [key]
    assert d._reconnect_at == {}


def test_a_classic_lookupd_found_nsqd_waits_for_the_next_poll() -> None:
    d = make()
    d._schedule_reconnect("127.0.0.1:4150", False, None)
    assert d._reconnect_at == {} and d._requery_at == float("inf")


def test_a_lost_partition_looks_up_again() -> None:
    clock = FakeClock()
    d = make(clock=clock)
    d._schedule_reconnect("127.0.0.1:4150#3", False, None)
    assert d._reconnect_at == {} and d._requery_at == clock.now + 1.0


def test_nothing_is_scheduled_once_stopped() -> None:
    d = make(nsqd=("127.0.0.1:4150",))
    d.stop()
    d._schedule_reconnect("127.0.0.1:4150", True, None)
    assert d._reconnect_at == {}


def test_start_schedules_each_direct_address_at_once() -> None:
    clock = FakeClock()
    d = make(clock=clock, nsqd=("127.0.0.1:4150", "127.0.0.1:4152"), lookupd=(), partition=4)
    d._loop = lambda: None  # type: ignore[method-assign]
    d.start()
    d.stop()
    d.join(0.0)
    assert d._reconnect_at == {"127.0.0.1:4150#4": clock.now, "127.0.0.1:4152#4": clock.now}


# ------------------------------------------------------------------------------------------------
# Subscribing and losing: what the owner is told, and on which thread the hooks run


def test_a_subscribed_connection_is_handed_over_then_the_hook_runs() -> None:
    owner = FakeOwner()
    hooked: list[tuple[str, str, bool]] = []
    d = make(
        owner,
        on_connect=lambda key: hooked.append((key, "hook", "127.0.0.1:4150" in owner.held)),
    )
    d._reconnect_failures["127.0.0.1:4150"] = 3
    d._connecting["127.0.0.1:4150"] = conn = FakeConn("127.0.0.1:4150")  # type: ignore[assignment]
    d._subscribe(conn, False)  # type: ignore[arg-type]
    assert conn.sent == [b"SUB t c\n"]
    assert hooked == [("127.0.0.1:4150", "hook", True)]  # held before its hook ran
    assert owner.calls == [("subscribed", "127.0.0.1:4150"), ("made", "127.0.0.1:4150")]
    assert d._connecting == {} and d._reconnect_failures == {}
    assert not conn.closed


def test_a_connection_the_owner_refuses_is_closed_and_reconnected() -> None:
    owner = FakeOwner(take=False)
    clock = FakeClock()
    d = make(owner, clock=clock, nsqd=("127.0.0.1:4150",))
    d._connecting["127.0.0.1:4150"] = conn = FakeConn("127.0.0.1:4150")  # type: ignore[assignment]
    d._subscribe(conn, True)  # type: ignore[arg-type]
    assert conn.closed and owner.calls == [("subscribed", "127.0.0.1:4150")]
    assert d._reconnect_at == {"127.0.0.1:4150": clock.now + 1.0}


def test_a_failed_sub_is_retried_and_a_refusal_for_good_stops() -> None:
    owner = FakeOwner()
    d = make(owner, nsqd=("127.0.0.1:4150",))
    conn = FakeConn("127.0.0.1:4150", error=OSError("reset"))
    d._subscribe(conn, True)  # type: ignore[arg-type]
    assert conn.closed and "127.0.0.1:4150" in d._reconnect_at and not owner.failed
    conn = FakeConn("127.0.0.1:4150", error=SubExtendNeedError("E_SUB_EXTEND_NEED"))
    d._subscribe(conn, True)  # type: ignore[arg-type]
    [error] = owner.failed
    assert isinstance(error, SubExtendNeedError) and "extend_support=True" in str(error)
    assert owner.calls == []


def test_a_lost_connection_runs_its_hook_on_the_discovery_thread_then_tells_the_owner(
    caplog: pytest.LogCaptureFixture,
) -> None:
    owner = FakeOwner()
    clock = FakeClock()
    seen: list[tuple[str, str]] = []

    def on_disconnect(key: str, reason: BaseException | None) -> None:
        seen.append((key, threading.current_thread().name))
        raise RuntimeError("hook bug")

    d = make(owner, clock=clock, nsqd=("127.0.0.1:4150",), on_disconnect=on_disconnect)
    d._dialled["127.0.0.1:4150"] = True
    reason = ConnectionResetError()
    d.lost("127.0.0.1:4150", reason)
    assert seen == [] and owner.calls == []  # not on the thread that saw it close
    assert d._reconnect_at == {"127.0.0.1:4150": clock.now + 1.0}
    thread = threading.Thread(target=d._drain_events, name="nsq-discovery-t/c")
    thread.start()
    thread.join()
    assert seen == [("127.0.0.1:4150", "nsq-discovery-t/c")]
    assert owner.calls == [("lost", "127.0.0.1:4150", reason)]  # told despite the hook's error
    assert any(r.levelno == logging.ERROR and "hook" in r.getMessage() for r in caplog.records)


def test_close_runs_the_hooks_left_and_closes_the_lookupds() -> None:
    owner = FakeOwner()
    d = make(owner)
    d._lookupds = lookupds = FakeLookupds([])  # type: ignore[assignment]
    d.stop()
    d.lost("127.0.0.1:4150", None)
    d.close()
    assert lookupds.closed and owner.calls == [("lost", "127.0.0.1:4150", None)]
    assert d._requery_at == float("inf")  # stopped: nothing scheduled


def test_the_owner_may_call_back_from_what_it_is_told() -> None:
    """connection_made and connection_lost come without the discovery's lock held."""
    d: Discovery

    class Reentrant(FakeOwner):
        def connection_made(self, key: str) -> None:
            super().connection_made(key)
            d.lost(key, None)  # would deadlock if called under the lock

    owner = Reentrant()
    d = make(owner, nsqd=("127.0.0.1:4150",))
    conn = FakeConn("127.0.0.1:4150")
    d._subscribe(conn, True)  # type: ignore[arg-type]
    assert "127.0.0.1:4150" in d._reconnect_at
