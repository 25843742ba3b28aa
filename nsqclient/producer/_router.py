"""Which nsqd a Producer's publish goes to when it learns topics by lookup.

A :class:`Router` asks nsqlookupd (``access=w&metainfo=true``) where a topic is written, keeps
the answer per topic for ``refresh_interval`` seconds (or until a publish error says it is
stale), and picks ``(partition, "host:tcp_port")`` for each publish: the partition given, the
partition of a sharding key (:func:`~nsqclient.lookupd.key_partition`), or the next
partition round-robin.  A classic topic (no partitions in the answer) goes round-robin over
the nsqd that have it, or, for a topic no nsqd has yet, over every nsqd lookupd knows.
At most ``max_topics`` routes are kept: past that, the route fetched longest ago is dropped
(and looked up again if that topic is published again).

A route is never dropped because lookupd fails: when no lookupd answers (none reachable, none
in time, a 5xx; or, for a classic topic, lookupd knows no nsqd at all, as a classic nsqlookupd
just restarted does until the nsqd register again), the topic's last known route goes on being
used, and lookupd is asked again after :data:`LOOKUP_RETRY_FIRST` seconds, doubling while it
keeps failing up to :data:`LOOKUP_RETRY_CAP`.  The leaders that still answer keep taking their
partitions' writes; a publish to one that does not fails on its own (and is retried by its
caller).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable

from ..addresses import producer_address, producer_http_address
from ..checks import check_int
from ..errors import NoRouteError
from ..http import HTTPError, TopicNotFoundError
from ..lookupd._partitions import TopicRoute, key_partition, route_from_lookup
from ..lookupd._pool import LookupdPool, unanswered

__all__ = ["LOOKUP_RETRY_CAP", "LOOKUP_RETRY_FIRST", "Router"]

logger = logging.getLogger("nsqclient.router")

#: seconds a topic's last known route is used without asking lookupd, after no lookupd
#: answered for it; doubles with each further failure in a row, up to LOOKUP_RETRY_CAP
LOOKUP_RETRY_FIRST = 0.5
#: the longest wait, in seconds, before lookupd is asked again for a topic it keeps failing for
LOOKUP_RETRY_CAP = 4.0


@dataclasses.dataclass(eq=False)
class _Kept:
    """A topic's route as the router keeps it."""

    route: TopicRoute
    #: the router's clock when lookupd answered it
    fetched_at: float
    #: a publish failed on it since: look it up again before it is used (unless lookupd fails)
    stale: bool = False
    #: lookups of the topic in a row that no lookupd answered, the last one's error, and when
    #: to ask again (the last known route is used until then)
    failures: int = 0
    error: BaseException | None = None
    retry_at: float = 0.0


class Router:
    """Routes of the topics a Producer publishes, by lookup.

    Args:
        pool: the nsqlookupds to ask.
        refresh_interval: seconds a topic's route is used before it is asked again.
        clock: the monotonic clock.
        max_topics: routes kept at most (a Producer publishing to ever new topic names must
            not grow without bound); the one fetched longest ago goes first.
    """

    def __init__(
        self,
        pool: LookupdPool,
        refresh_interval: float,
        clock: Callable[[], float] = time.monotonic,
        max_topics: int = 1024,
    ):
        self.pool = pool
        self.refresh_interval = refresh_interval
        self.max_topics = check_int(max_topics, "max_topics", min=1)
        self._clock = clock
        self._lock = threading.Lock()
        self._routes: dict[str, _Kept] = {}
        #: one lock per topic being looked up, so one lookup serves every waiting publisher
        self._fetching: dict[str, threading.Lock] = {}
        self._rr = itertools.count()
        self._next_members = 0.0

    def route(self, topic: str) -> TopicRoute:
        """The topic's route: from the cache, or a fresh lookup.  When no lookupd answers, the
        last known route (see the module); without one, the lookup's error (HTTPError,
        NoRouteError...)."""
        kept = self._routes.get(topic)
        if kept is not None and self._usable(kept, self._clock()):
            return kept.route
        with self._lock:
            fetch_lock = self._fetching.setdefault(topic, threading.Lock())
        if not fetch_lock.acquire(blocking=False):
            if kept is not None and not kept.stale:
                # merely old, and another thread is asking lookupd: the last known meanwhile
                return kept.route
            fetch_lock.acquire()  # one lookup serves every waiting publisher
        try:
            kept = self._routes.get(topic)
            if kept is not None and self._usable(kept, self._clock()):
                return kept.route
            try:
                route = self._fetch(topic)
            except Exception as exc:
                if kept is None or not unanswered(exc):
                    raise
                self._lookup_failed(topic, kept, exc)
                return kept.route
            if kept is not None and not route.partitioned and not route.nsqd and kept.route.nsqd:
                # A classic nsqlookupd just restarted knows no nsqd until they register
                # again (up to 15 s): as good as no answer.
                empty = NoRouteError(f"lookupd knows no nsqd (yet) to publish {topic!r} to")
                self._lookup_failed(topic, kept, empty)
                return kept.route
            self._keep(topic, route)
            return route
        finally:
            fetch_lock.release()
            self._forget_fetch_locks()

    def _usable(self, kept: _Kept, now: float) -> bool:
        """True when ``kept`` serves a publish without asking lookupd: fresh, or lookupd
        failed for it lately."""
        if now < kept.retry_at:
            return True
        return not kept.stale and now - kept.fetched_at < self.refresh_interval

    def _lookup_failed(self, topic: str, kept: _Kept, exc: BaseException) -> None:
        """No lookupd answered for ``topic``: go on with its last known route for a while."""
        now = self._clock()
        with self._lock:
            kept.failures += 1
            kept.error = exc
            delay = min(LOOKUP_RETRY_FIRST * 2 ** (kept.failures - 1), LOOKUP_RETRY_CAP)
            kept.retry_at = now + delay
            first = kept.failures == 1
        logger.log(
            logging.WARNING if first else logging.DEBUG,
            "lookupd did not answer for %s (%s): publishing on its last known route (looked"
            " up %.1fs ago) and asking again in %.1fs",
            topic,
            exc,
            now - kept.fetched_at,
            delay,
        )

    def cached(self, topic: str) -> TopicRoute | None:
        """The topic's route when :meth:`route` would give it without asking lookupd (fresh,
        or lookupd failed for it lately), else None (never looks up)."""
        kept = self._routes.get(topic)
        if kept is not None and self._usable(kept, self._clock()):
            return kept.route
        return None

    def lookup_error(self, topic: str) -> BaseException | None:
        """While no lookupd answers for ``topic`` (its last known route is used), the last
        lookup's error; None when lookupd answered it last."""
        kept = self._routes.get(topic)
        return kept.error if kept is not None and kept.failures else None

    def now(self) -> float:
        """The router's clock (for :meth:`invalidate`'s ``fetched_before``)."""
        return self._clock()

    def invalidate(self, topic: str, fetched_before: float | None = None) -> None:
        """A publish failed on the topic's route: look it up again before the next publish
        uses it (the route is kept: it is used again if no lookupd answers).  With
        ``fetched_before`` (a :meth:`now` value), only a route fetched before then: a publish
        that failed on an old route must not throw away the fresh one another publish got."""
        with self._lock:
            kept = self._routes.get(topic)
            if kept is not None and (fetched_before is None or kept.fetched_at < fetched_before):
                kept.stale = True

    def cached_topics(self) -> list[str]:
        """The topics whose route is kept, fetched longest ago first."""
        with self._lock:
            return list(self._routes)

    def _keep(self, topic: str, route: TopicRoute) -> None:
        """Store a fresh route last in line, dropping the oldest beyond ``max_topics``."""
        with self._lock:
            old = self._routes.pop(topic, None)
            self._routes[topic] = _Kept(route, self._clock())
            while len(self._routes) > self.max_topics:
                del self._routes[next(iter(self._routes))]
        if old is not None and old.failures:
            logger.info("lookupd answers for %s again", topic)

    def _forget_fetch_locks(self) -> None:
        """Drop the fetch locks of topics without a kept route that no thread holds (topics
        whose route was dropped, or whose lookup failed) once there are too many."""
        with self._lock:
            if len(self._fetching) <= self.max_topics:
                return
            for name, lock in list(self._fetching.items()):
                if name not in self._routes and not lock.locked():
                    del self._fetching[name]

    def _fetch(self, topic: str) -> TopicRoute:
        if self._clock() >= self._next_members:
            self._next_members = self._clock() + self.refresh_interval
            self.pool.refresh_members()
        try:
            result = self.pool.first(lambda c: c.lookup(topic, "w", True))
        except TopicNotFoundError:
            result = {"channels": [], "producers": []}
        except HTTPError as exc:
            if "no channel" in exc.message.lower():
                raise NoRouteError(
                    f"{exc} (youzan's lookupd names no nsqd to write topic {topic!r}"
                    " until the topic has a channel: create one, e.g. in nsqadmin or by"
                    " starting a consumer)"
                ) from exc
            if exc.status == 404:
                # youzan's lookupd (its etcd) knows no such topic: only an admin creates one.
                raise NoRouteError(
                    f"{exc} (lookupd knows no topic {topic!r}: youzan's NSQ creates topics only"
                    " on request, e.g. curl -X POST"
                    f" 'http://<lookupd-http>/topic/create?topic={topic}&partition_num=2"
                    "&replicator=2', then give it a channel by starting its consumer)"
                ) from exc
            raise
        route = route_from_lookup(topic, result)
        if route.partitioned or route.nsqd:
            logger.debug("route of %s: %s", topic, route)
            return route
        # A classic topic no nsqd has yet: any nsqd will create it.
        nodes = self.pool.first(lambda c: c.nodes())
        addresses = tuple(dict.fromkeys(producer_address(n) for n in nodes))
        http = {producer_address(n): h for n in nodes if (h := producer_http_address(n))}
        return TopicRoute(topic=topic, leaders={}, nsqd=addresses, http=http)

    def choose(
        self,
        topic: str,
        partition: int | None = None,
        key: bytes | str | int | None = None,
    ) -> tuple[int | None, str]:
        """``(partition, "host:tcp_port")`` for one publish to ``topic``.

        Raises ValueError for a partition the topic does not have, or a partition or key on
        a topic that has no partitions; NoRouteError when lookup names no nsqd for it."""
        route = self.route(topic)
        if not route.partitioned:
            if partition is not None or key is not None:
                raise ValueError(
                    f"topic {topic!r} has no partitions (lookup answered in classic NSQ's"
                    " shape): publish it without partition= or key="
                )
            if not route.nsqd:
                raise NoRouteError(f"lookupd knows no nsqd to publish {topic!r} to")
            return None, route.nsqd[next(self._rr) % len(route.nsqd)]
        if key is not None:
            if not route.partition_num:
                # Guessing the count from the partitions listed would send keys elsewhere
                # than other clients do while a partition has no leader.
                raise NoRouteError(
                    f"lookupd did not say how many partitions {topic!r} has (no metainfo):"
                    " key= needs it"
                )
            partition = key_partition(key, route.partition_num)
        elif partition is not None:
            check_int(partition, "partition", min=0)
            if route.partition_num and partition >= route.partition_num:
                raise ValueError(
                    f"topic {topic!r} has {route.partition_num} partitions"
                    f" (0..{route.partition_num - 1}), not partition {partition}"
                )
        else:
            live = sorted(route.leaders)
            if not live:
                raise NoRouteError(f"lookupd names no leader for any partition of {topic!r}", True)
            partition = live[next(self._rr) % len(live)]
        address = route.leader(partition)
        if address is None:
            raise NoRouteError(
                f"lookupd names no leader for partition {partition} of {topic!r} now", True
            )
        return partition, address
