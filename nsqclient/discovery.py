"""The Consumer's discovery job: finding the nsqd to read from and keeping connected to them.

* nsqlookupd is asked at once, then every ``lookupd_poll_interval`` plus jitter; each answer
  names subscriptions (an nsqd, or for youzan an (nsqd, partition) pair: :func:`target_key`),
  and each new one is connected on a thread of its own (``nsq-connect-<key>``), so a hung nsqd
  never delays the others.
* A direct address (``nsqd_tcp_addresses``) that drops is reconnected after a delay that doubles
  while it keeps failing.  A youzan partition whose connection drops, or which no connection
  holds (its leader died and lookupd names no successor yet), makes it look up again soon:
  ``reconnect_interval`` doubling up to :data:`ORPHAN_LOOKUP_CAP`.
* The user's connection hooks run on the discovery thread.

:class:`Discovery` holds these methods of :class:`~nsqclient.consumer.Consumer` (a mixin: the
state it works on is the Consumer's, set up in its ``__init__`` and annotated here).
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from . import protocol
from .backoff import reconnect_delay
from .config import Config
from .conn import Connection
from .errors import (
    NSQError,
    ServerError,
    SubChannelNotRegisteredError,
    SubExtendForbiddenError,
    SubExtendNeedError,
    SubOrderIsMustError,
)
from .http import producer_address
from .lookup import LookupdPool
from .observe import ObserverSet, tell
from .partitions import missing_partitions, partition_count

__all__ = ["Discovery", "ORPHAN_LOOKUP_CAP", "split_key", "target_key"]

logger = logging.getLogger("nsqclient.consumer")

#: seconds: the longest wait between lookups while a youzan partition has no connection (a dead
#: leader's successor is subscribed within about this long of lookupd naming it)
ORPHAN_LOOKUP_CAP = 4.0

#: SUB answers that no reconnect can change: the consumer's settings must
_REFUSED_FOR_GOOD = (
    SubOrderIsMustError,
    SubExtendNeedError,
    SubExtendForbiddenError,
    SubChannelNotRegisteredError,
)


def target_key(address: str, partition: int | None) -> str:
    """The consumer's name for a subscription: ``"host:port"``, or ``"host:port#P"`` for
    youzan partition P."""
    return address if partition is None else f"{address}#{partition}"


def split_key(key: str) -> tuple[str, int | None]:
    """``target_key``'s inverse: ``(address, partition or None)``."""
    address, sep, partition = key.rpartition("#")
    if not sep:
        return key, None
    return address, int(partition)


class _ConnInfo:
    """The consumer's bookkeeping for one connection (guarded by Consumer._lock)."""

    __slots__ = ("conn", "remaining", "rdy_since", "waiting_since", "direct", "first_message")

    def __init__(self, conn: Connection, direct: bool, now: float):
        self.conn = conn
        self.remaining = 0
        self.rdy_since: float | None = None
        self.waiting_since = now
        self.direct = direct
        self.first_message = True


class Discovery:
    """The discovery methods of :class:`~nsqclient.consumer.Consumer` (see the module doc)."""

    # The Consumer's state these methods use, set up by Consumer.__init__.
    topic: str
    channel: str
    config: Config
    partition: int | None
    ordered: bool
    on_connect: Callable[[str], Any] | None
    on_disconnect: Callable[[str, BaseException | None], Any] | None
    _lock: threading.RLock
    _stopping: threading.Event
    _discovery_wake: threading.Event
    _rdy_wake: threading.Event
    _events: queue.SimpleQueue
    _lookupds: LookupdPool
    _direct: set[str]
    _conns: dict[str, _ConnInfo]
    _connecting: dict[str, Connection]
    _connect_threads: set[threading.Thread]
    _delegate: Any
    _reconnect_at: dict[str, float]
    _reconnect_failures: dict[str, int]
    _requery_at: float
    _target_config: dict[str, Config]
    _lookupd_found: set[str]
    _partition_num: int | None
    _partitions_seen: set[int]
    _orphan_lookups: int
    _warned_unordered: bool
    _fail: Callable[[NSQError], None]
    _observers: ObserverSet

    def _discovery_loop(self) -> None:
        cfg = self.config
        next_poll = time.monotonic() if len(self._lookupds) else float("inf")
        while not self._stopping.is_set():
            wait = 1.0
            try:
                self._drain_events()
                with self._lock:  # a connection closing sets _requery_at meanwhile
                    due = time.monotonic() >= min(next_poll, self._requery_at)
                    if due:
                        self._requery_at = float("inf")
                if due:
                    jitter = random.random() * cfg.lookupd_poll_jitter * cfg.lookupd_poll_interval
                    next_poll = time.monotonic() + cfg.lookupd_poll_interval + jitter
                    self._query_lookupds()
                for key in self._due_reconnects(time.monotonic()):
                    self._start_connect(key, direct=key in self._direct)
                with self._lock:
                    pending = list(self._reconnect_at.values())
                wake_at = min([next_poll, self._requery_at, *pending], default=next_poll)
                wait = min(max(wake_at - time.monotonic(), 0.0), 1.0)
            except Exception:
                logger.exception("unexpected error in discovery; it goes on")
            if self._discovery_wake.wait(wait):
                self._discovery_wake.clear()

    def _due_reconnects(self, now: float) -> list[str]:
        with self._lock:
            due = [a for a, t in self._reconnect_at.items() if t <= now]
            for a in due:
                del self._reconnect_at[a]
        return due

    def _query_lookupds(self) -> None:
        self._lookupds.refresh_members()
        found: dict[str, Config] = {}
        for source, result in self._lookupds.lookup_each(self.topic, "r", True):
            found.update(self._targets(source, result))
        with self._lock:
            self._lookupd_found = set(found)
            self._target_config.update(found)
            new = [k for k in found if k not in self._conns and k not in self._connecting]
            self._partitions_seen.update(
                p for p in map(lambda k: split_key(k)[1], found) if p is not None
            )
        for key in sorted(new):
            self._start_connect(key, direct=False)
        self._follow_orphans()

    def _follow_orphans(self) -> None:
        """youzan: while a partition this consumer should read has no connection (its leader
        died and lookupd names no successor yet, or names one that cannot be reached yet),
        look up again soon: ``reconnect_interval`` doubling up to :data:`ORPHAN_LOOKUP_CAP`
        seconds (never above ``lookupd_poll_interval``), until every partition is held."""
        with self._lock:
            held = {split_key(k)[1] for k in (*self._conns, *self._connecting)}
            missing = missing_partitions(
                self._partition_num,
                self._partitions_seen,
                self.partition,
                {p for p in held if p is not None},
            )
            if not missing:
                if self._orphan_lookups:
                    logger.info("%s: every partition is subscribed again", self.topic)
                self._orphan_lookups = 0
                return
            self._orphan_lookups += 1
            cap = min(ORPHAN_LOOKUP_CAP, self.config.lookupd_poll_interval)
            delay = min(
                reconnect_delay(self._orphan_lookups, self.config.reconnect_interval, cap), cap
            )
            self._requery_at = min(self._requery_at, time.monotonic() + delay)
            first = self._orphan_lookups == 1
        logger.log(
            logging.INFO if first else logging.DEBUG,
            "%s: no connection to partition(s) %s; looking up again in %.1fs",
            self.topic,
            ",".join(map(str, sorted(missing))),
            delay,
        )

    def _targets(self, source: str, result: dict[str, Any]) -> dict[str, Config]:
        """The subscriptions one lookup answer names, with their connections' Config (entries
        that make no sense are logged and skipped)."""
        config = self.config
        if "partitions" in result:  # youzan's nsqlookupd
            meta = result.get("meta") or {}
            if isinstance(meta, dict) and "ordered" in meta and not self._ordered_fits(meta):
                return {}
            if partition_count(meta):
                self._partition_num = partition_count(meta)
            wants_ext = meta.get("extend_support") if isinstance(meta, dict) else None
            extend = config.extend_support if wants_ext is None else bool(wants_ext)
            if not config.youzan or extend != config.extend_support:
                config = config.replace(youzan=True, extend_support=extend)
            entries = list((result.get("partitions") or {}).items())
        else:
            if self.ordered and self.partition is None:
                self._fail(
                    NSQError(
                        f"lookupd {source} answered in classic NSQ's shape: ordered=True"
                        " needs youzan's partitioned NSQ (or partition=)"
                    )
                )
                return {}
            entries = [(self.partition, p) for p in result.get("producers") or []]
        out = {}
        for name, producer in entries:
            try:
                partition = None if name is None else int(name)
                address = producer_address(producer)
            except (KeyError, TypeError, ValueError) as exc:
                logger.warning("lookupd %s: bad producer entry %r: %s", source, producer, exc)
                continue
            if self.partition is None or partition == self.partition:
                out[target_key(address, partition)] = config
        return out

    def _ordered_fits(self, meta: dict[str, Any]) -> bool:
        """Whether lookup's ``meta`` agrees with ``ordered``; stop (topic ordered, consumer
        not) or warn once (consumer ordered, topic not) when it does not."""
        if meta.get("ordered") and not self.ordered:
            self._fail(
                _refused_error(SubOrderIsMustError("lookupd says the topic is ordered"), self.topic)
            )
            return False
        if self.ordered and not meta.get("ordered") and not self._warned_unordered:
            self._warned_unordered = True
            logger.warning(
                "topic %s is not ordered, yet ordered=True: SUB_ORDERED makes youzan's nsqd"
                " send the whole channel %s in order, to every consumer of it",
                self.topic,
                self.channel,
            )
        return True

    def _start_connect(self, key: str, direct: bool) -> None:
        """Connect to ``key``'s nsqd on a thread of its own, so that a slow or hung nsqd never
        delays connecting to the others."""
        with self._lock:
            if self._stopping.is_set() or key in self._conns or key in self._connecting:
                return
            address, partition = split_key(key)
            config = self.config if direct else self._target_config.get(key, self.config)
            conn = Connection(address, config, delegate=self._delegate)
            conn.partition = partition
            conn.key = key
            conn.ordered = self.ordered
            self._connecting[key] = conn
            thread = threading.Thread(
                target=self._connect,
                args=(conn, direct),
                name=f"nsq-connect-{key}",
                daemon=True,
            )
            self._connect_threads.add(thread)
        thread.start()

    def _connect(self, conn: Connection, direct: bool) -> None:
        try:
            self._subscribe(conn, direct)
        except Exception as exc:
            logger.exception("unexpected error connecting to %s", conn.key)
            conn.close(0.5)
            with self._lock:
                self._connecting.pop(conn.key, None)
            self._schedule_reconnect(conn.key, direct, exc)
        finally:
            with self._lock:
                self._connect_threads.discard(threading.current_thread())

    def _sub_command(self, partition: int | None) -> bytes:
        if self.ordered:
            assert partition is not None  # checked in __init__ and _targets
            return protocol.sub_ordered(self.topic, self.channel, partition)
        return protocol.sub(self.topic, self.channel, partition)

    def _subscribe(self, conn: Connection, direct: bool) -> None:
        key = conn.key
        try:
            conn.connect()
            conn.request(self._sub_command(conn.partition)).result(self.config.handshake_timeout)
        except _REFUSED_FOR_GOOD as exc:
            conn.close(0.5)
            with self._lock:
                self._connecting.pop(key, None)
            self._fail(_refused_error(exc, self.topic))
            return
        except (OSError, NSQError, TimeoutError) as exc:
            logger.warning("cannot subscribe to %s: %s", key, exc)
            conn.close(0.5)
            with self._lock:
                self._connecting.pop(key, None)
            self._schedule_reconnect(key, direct, exc)
            return
        with self._lock:
            self._connecting.pop(key, None)
            if self._stopping.is_set() or conn.is_closed:
                stale = True
            else:
                stale = False
                self._conns[key] = _ConnInfo(conn, direct, time.monotonic())
                self._reconnect_failures.pop(key, None)
        if stale:
            conn.close(0.5)
            return
        logger.info("subscribed to %s/%s on %s", self.topic, self.channel, key)
        self._run_hook(self.on_connect, key)
        observers = self._observers.active
        if observers:
            tell(observers, "connection_made", self, key)
        self._rdy_wake.set()

    def _schedule_reconnect(self, key: str, direct: bool, reason: BaseException | None) -> None:
        """After a connection to ``key`` closed or failed: reconnect a direct address, or
        (youzan) look a lookupd-found partition up again, after a delay that grows while it
        keeps failing.  A classic lookupd-found nsqd comes back when a later poll lists it."""
        if self._stopping.is_set():
            return
        partitioned = split_key(key)[1] is not None
        if not direct and not partitioned:
            return
        with self._lock:
            failures = self._reconnect_failures.get(key, 0) + 1
            self._reconnect_failures[key] = failures
            delay = reconnect_delay(
                failures, self.config.reconnect_interval, self.config.max_reconnect_interval
            )
            if direct:
                self._reconnect_at[key] = time.monotonic() + delay
            else:
                # the partition's leader may have moved: ask lookupd where it is now
                self._requery_at = min(self._requery_at, time.monotonic() + delay)
        logger.info("%s %s in %.1fs", "reconnecting to" if direct else "looking up", key, delay)
        self._discovery_wake.set()

    def _drain_events(self) -> None:
        while True:
            try:
                address, reason = self._events.get_nowait()
            except queue.Empty:
                return
            self._run_hook(self.on_disconnect, address, reason)
            observers = self._observers.active
            if observers:
                tell(observers, "connection_lost", self, address, reason)

    def _run_hook(self, hook: Callable[..., Any] | None, *args: Any) -> None:
        if hook is None:
            return
        try:
            hook(*args)
        except Exception:
            logger.exception("connection hook %r failed", hook)


def _refused_error(exc: ServerError, topic: str) -> NSQError:
    """The error a Consumer stops with when nsqd refused its SUB for good."""
    if isinstance(exc, SubOrderIsMustError):
        hint = f"topic {topic!r} is ordered: it must be consumed with ordered=True"
    elif isinstance(exc, SubExtendNeedError):
        hint = f"topic {topic!r} has extend support: consume it with extend_support=True"
    elif isinstance(exc, SubChannelNotRegisteredError):
        hint = (
            f"topic {topic!r} creates no channel on SUB (disable_channel_auto_create):"
            " create the channel first, e.g. in nsqadmin"
        )
    else:
        hint = f"topic {topic!r} has no extend support: consume it without extend_support=True"
    return type(exc)(f"{hint} (nsqd answered: {exc.message or exc.code})")
