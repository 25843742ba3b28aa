"""Router: the per-topic routes a Producer keeps when it learns topics by lookup."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from nsqclient.errors import NoRouteError
from nsqclient.http import HTTPError
from nsqclient.producer._router import LOOKUP_RETRY_CAP, Router


class FakeLookupd:
    """Answers ``lookup`` for every topic with one nsqd (a port per topic), counting asks;
    topics in ``failing`` answer with a 500."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.failing: set[str] = set()

    def lookup(self, topic: str, access: str | None, metainfo: bool) -> dict[str, Any]:
        self.asked.append(topic)
        if topic in self.failing:
            raise HTTPError(500, "INTERNAL_ERROR", "boom")
        port = 4000 + int(topic.rsplit("_", 1)[1])
        return {"channels": [], "producers": [{"broadcast_address": "h", "tcp_port": port}]}


class FakePool:
    def __init__(self, lookupd: FakeLookupd) -> None:
        self.lookupd = lookupd

    def refresh_members(self) -> list[str]:
        return []

    def first(self, ask: Callable[[Any], Any]) -> Any:
        return ask(self.lookupd)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(max_topics: int) -> tuple[Router, FakeLookupd, Clock]:
    lookupd, clock = FakeLookupd(), Clock()
    router = Router(FakePool(lookupd), 60.0, clock=clock, max_topics=max_topics)  # type: ignore[arg-type]
    return router, lookupd, clock


def test_routes_are_cached_for_the_refresh_interval() -> None:
    router, lookupd, clock = make(8)
    assert router.choose("t_1") == (None, "h:4001")
    clock.now += 59.0
    assert router.choose("t_1") == (None, "h:4001")
    assert lookupd.asked == ["t_1"]
    clock.now += 1.0
    router.choose("t_1")
    assert lookupd.asked == ["t_1", "t_1"]


def test_at_most_max_topics_routes_are_kept_the_oldest_goes_first() -> None:
    router, lookupd, _ = make(3)
    for i in range(5):
        assert router.choose(f"t_{i}") == (None, f"h:{4000 + i}")
    assert router.cached_topics() == ["t_2", "t_3", "t_4"]
    # a dropped topic is looked up again, and pushes out the oldest kept one
    assert router.choose("t_0") == (None, "h:4000")
    assert lookupd.asked == ["t_0", "t_1", "t_2", "t_3", "t_4", "t_0"]
    assert router.cached_topics() == ["t_3", "t_4", "t_0"]


def test_a_refreshed_route_moves_to_the_back_of_the_line() -> None:
    router, _, clock = make(3)
    for i in range(3):
        router.choose(f"t_{i}")
    clock.now += 61.0
    router.choose("t_0")  # fetched again: now the newest
    router.choose("t_9")
    assert router.cached_topics() == ["t_2", "t_0", "t_9"]


def test_invalidate_makes_the_next_publish_look_up_again() -> None:
    router, lookupd, _ = make(3)
    router.choose("t_1")
    router.invalidate("t_1")
    router.invalidate("t_unknown_7")  # nothing to forget: no error
    assert router.cached("t_1") is None
    assert router.cached_topics() == ["t_1"]  # kept, for when lookupd fails
    router.choose("t_1")
    assert lookupd.asked == ["t_1", "t_1"]


@pytest.mark.parametrize("status", [0, 500, 503])
def test_while_no_lookupd_answers_the_last_known_route_is_used(status: int, caplog) -> None:
    class Down(FakeLookupd):
        def lookup(self, topic: str, access: str | None, metainfo: bool) -> dict[str, Any]:
            if topic in self.failing:
                self.asked.append(topic)
                raise HTTPError(status, "timed out after 2 s", "http://h:4161/lookup")
            return super().lookup(topic, access, metainfo)

    lookupd, clock = Down(), Clock()
    router = Router(FakePool(lookupd), 60.0, clock=clock)  # type: ignore[arg-type]
    assert router.choose("t_1") == (None, "h:4001")
    lookupd.failing = {"t_1"}
    router.invalidate("t_1")
    assert router.choose("t_1") == (None, "h:4001")  # asked, failed: the last known
    assert "publishing on its last known route" in caplog.text
    assert router.lookup_error("t_1") is not None
    assert router.cached("t_1") is not None  # within the backoff: no lookup, no wait
    router.invalidate("t_1")
    router.choose("t_1")
    assert lookupd.asked == ["t_1", "t_1"]
    waits = []
    for _ in range(5):  # asked again after 0.5 s, doubling up to LOOKUP_RETRY_CAP
        before = len(lookupd.asked)
        start = clock.now
        while len(lookupd.asked) == before:
            clock.now += 0.25
            router.choose("t_1")
        waits.append(clock.now - start)
    assert waits == [0.5, 1.0, 2.0, LOOKUP_RETRY_CAP, LOOKUP_RETRY_CAP]
    lookupd.failing.clear()
    clock.now += LOOKUP_RETRY_CAP
    router.choose("t_1")
    assert router.lookup_error("t_1") is None
    assert router.cached("t_1") is not None


def test_a_restarted_classic_lookupd_knowing_no_nsqd_yet_keeps_the_last_route() -> None:
    class Restarted(FakeLookupd):
        def lookup(self, topic: str, access: str | None, metainfo: bool) -> dict[str, Any]:
            if self.failing:
                return {"channels": [], "producers": []}
            return super().lookup(topic, access, metainfo)

        def nodes(self) -> list[dict[str, Any]]:
            return []

    lookupd, clock = Restarted(), Clock()
    router = Router(FakePool(lookupd), 60.0, clock=clock)  # type: ignore[arg-type]
    assert router.choose("t_1") == (None, "h:4001")
    lookupd.failing = {"t_1"}
    router.invalidate("t_1")
    assert router.choose("t_1") == (None, "h:4001")
    assert isinstance(router.lookup_error("t_1"), NoRouteError)


def test_a_lookupds_answer_about_the_topic_is_not_covered_by_the_last_route() -> None:
    """A 4xx (or youzan's "no channel") is lookupd's answer, not an outage: it is raised."""
    lookupd, clock = FakeLookupd(), Clock()
    router = Router(FakePool(lookupd), 60.0, clock=clock)  # type: ignore[arg-type]
    router.choose("t_1")

    def refuse(topic: str, access: str | None, metainfo: bool) -> dict[str, Any]:
        raise HTTPError(400, "INVALID_ARG_TOPIC", "http://h:4161/lookup")

    lookupd.lookup = refuse  # type: ignore[method-assign]
    router.invalidate("t_1")
    with pytest.raises(HTTPError, match="INVALID_ARG_TOPIC"):
        router.choose("t_1")


def test_failed_lookups_leave_no_state_behind_beyond_max_topics() -> None:
    router, lookupd, _ = make(2)
    lookupd.failing = {f"t_{i}" for i in range(50)}
    for i in range(50):
        with pytest.raises(HTTPError):
            router.choose(f"t_{i}")
    assert router.cached_topics() == []
    assert len(router._fetching) <= 2 + 1  # at most max_topics, plus the one failing now
    lookupd.failing.clear()
    assert router.choose("t_3") == (None, "h:4003")


def test_max_topics_is_checked() -> None:
    lookupd = FakeLookupd()
    with pytest.raises(ValueError, match="max_topics"):
        Router(FakePool(lookupd), 60.0, max_topics=0)  # type: ignore[arg-type]


def test_a_topic_no_nsqd_has_and_no_nodes_is_no_route() -> None:
    class Empty(FakeLookupd):
        def lookup(self, topic: str, access: str | None, metainfo: bool) -> dict[str, Any]:
            return {"channels": [], "producers": []}

        def nodes(self) -> list[dict[str, Any]]:
            return []

    router = Router(FakePool(Empty()), 60.0)  # type: ignore[arg-type]
    with pytest.raises(NoRouteError, match="knows no nsqd"):
        router.choose("t_1")
