"""The Consumer's discovery job: finding the nsqd to read from and keeping connected to them.

* nsqlookupd is asked at once, then every ``lookupd_poll_interval`` plus jitter; each answer
  names subscriptions (an nsqd, or for youzan an (nsqd, partition) pair: :func:`target_key`),
  and each new one is connected on a thread of its own (``nsq-connect-<key>``), so a hung nsqd
  never delays the others.
* A direct address (``nsqd_tcp_addresses``) that drops is reconnected after a delay that doubles
  while it keeps failing.  A youzan partition whose connection drops, or which no connection
  holds (its leader died and lookupd names no successor yet), makes it look up again soon:
  ``reconnect_interval`` doubling up to :data:`ORPHAN_LOOKUP_CAP`.
* The user's connection hooks run on the discovery thread (``on_connect`` on the connect thread).

:class:`Discovery` is a collaborator its Consumer owns.  It hands each subscribed connection to
its owner and talks back only through :class:`DiscoveryOwner`; the owner holds the connections
and tells :meth:`Discovery.lost` when one closes.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol

from .. import protocol
from ..addresses import producer_address
from ..backoff import reconnect_delay
from ..config import Config
from ..conn._connection import Connection, ConnectionDelegate
from ..errors import (
    NSQError,
    ServerError,
    SubChannelNotRegisteredError,
    SubExtendForbiddenError,
    SubExtendNeedError,
    SubOrderIsMustError,
)
from ..lookupd._partitions import missing_partitions, partition_count
from ..lookupd._pool import LookupdPool

__all__ = [
    "Discovery",
    "DiscoveryOwner",
    "ORPHAN_LOOKUP_CAP",
    "run_hook",
    "split_key",
    "target_key",
]

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


def run_hook(hook: Callable[..., Any] | None, *args: Any) -> None:
    """Run a user's hook (None: nothing); what it raises is logged, never raised."""
    if hook is None:
        return
    try:
        hook(*args)
    except Exception:
        logger.exception("connection hook %r failed", hook)


class DiscoveryOwner(Protocol):
    """What a :class:`Discovery` tells the Consumer that owns it, and asks it.

    Called on the discovery's own threads (``nsq-discovery-*``, ``nsq-connect-*``), never on a
    connection's reader or writer.  The discovery may hold its lock while it calls
    :meth:`held_keys` and :meth:`subscribed` (quick bookkeeping) and holds it around none of
    the others: the owner must not call the discovery while holding a lock those two take.
    """

    def held_keys(self) -> Collection[str]:
        """The keys (:func:`target_key`) of the connections the owner holds."""
        ...

    def subscribed(self, conn: Connection) -> bool:
        """``conn`` (``conn.key`` set) is connected and subscribed: hold it from now on, and
        call :meth:`Discovery.lost` when it closes.  False: not taken (the owner is stopping,
        or ``conn`` closed already); the discovery closes it."""
        ...

    def connection_made(self, key: str) -> None:
        """``key``'s connection is held and the user's ``on_connect`` hook has run."""
        ...

    def connection_lost(self, key: str, reason: BaseException | None) -> None:
        """The user's ``on_disconnect`` hook has run for ``key``, lost with ``reason``."""
        ...

    def fail(self, error: NSQError) -> None:
        """Stop for good: lookupd or nsqd answered in a way no retry can change."""
        ...


class Discovery:
    """Find ``topic``'s nsqd and keep ``owner`` subscribed to them (see the module doc).

    Args:
        owner: told of each connection subscribed, asked which it holds (:class:`DiscoveryOwner`).
        topic, channel, config: what to subscribe to, and the connections' Config.
        delegate: what each new :class:`~nsqclient.conn.Connection` calls back (the owner's).
        nsqd_tcp_addresses: nsqd to connect to directly (``"host:port"``).
        lookupd_http_addresses: nsqlookupd to ask (checked addresses, as the Consumer's).
        partition, ordered, on_connect, on_disconnect: as the Consumer's arguments.
        clock: the monotonic clock of the schedule (tests pass their own).
    """

    def __init__(
        self,
        owner: DiscoveryOwner,
        topic: str,
        channel: str,
        config: Config,
        *,
        delegate: ConnectionDelegate,
        nsqd_tcp_addresses: Sequence[str] = (),
        lookupd_http_addresses: Sequence[str] = (),
        partition: int | None = None,
        ordered: bool = False,
        on_connect: Callable[[str], Any] | None = None,
        on_disconnect: Callable[[str, BaseException | None], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        if ordered and nsqd_tcp_addresses and partition is None:
            raise ValueError(
                "ordered=True with nsqd_tcp_addresses needs partition= (SUB_ORDERED names one"
                " partition); give lookupd_http_addresses to consume every partition"
            )
        if ordered and config.sample_rate:
            raise ValueError(
                "ordered=True cannot sample: youzan's nsqd refuses SUB_ORDERED with a sample_rate"
            )
        self._owner = owner
        self.topic = topic
        self.channel = channel
        self.config = config
        self.partition = partition
        self.ordered = ordered
        self.on_connect = on_connect
        self.on_disconnect = on_disconnect
        self._delegate = delegate
        self._lookupds = LookupdPool(lookupd_http_addresses, config.lookupd_request_timeout)
        self._clock = clock
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        #: the subscriptions to the nsqd given directly (see target_key)
        self._direct = {target_key(a, partition) for a in nsqd_tcp_addresses}
        #: connections being made, by key, and their threads
        self._connecting: dict[str, Connection] = {}
        self._connect_threads: set[threading.Thread] = set()
        #: every key connecting or held by the owner: dialled as a direct address or not
        self._dialled: dict[str, bool] = {}
        #: direct addresses to reconnect, and when; failures in a row per key
        self._reconnect_at: dict[str, float] = {}
        self._reconnect_failures: dict[str, int] = {}
        #: lookup again soon (a lookupd-found connection closed: its leader may have moved)
        self._requery_at = float("inf")
        #: Config of the connections to each lookupd-found subscription (youzan's differ)
        self._target_config: dict[str, Config] = {}
        #: youzan: the topic's partition count (lookup's meta) and every partition lookup named
        self._partition_num: int | None = None
        self._partitions_seen: set[int] = set()
        #: youzan: lookups in a row that left some partition without a connection
        self._orphan_lookups = 0
        #: warned once that ordered=True switches a topic that is not ordered
        self._warned_unordered = False
        #: connections lost, for the hooks to run on the discovery thread: (key, reason)
        self._events: queue.SimpleQueue[tuple[str, BaseException | None]] = queue.SimpleQueue()

    # ================================================================ the owner's calls

    def start(self) -> None:
        """Connect the direct addresses and start asking lookupd (``nsq-discovery-*``)."""
        now = self._clock()
        with self._lock:
            for key in self._direct:
                self._reconnect_at[key] = now
        self._thread = threading.Thread(
            target=self._loop, name=f"nsq-discovery-{self.topic}/{self.channel}", daemon=True
        )
        self._thread.start()

    def lost(self, key: str, reason: BaseException | None) -> None:
        """The owner's connection to ``key`` closed (from any thread): run ``on_disconnect``
        on the discovery thread, and reconnect or look up again (see the module doc)."""
        with self._lock:
            direct = self._dialled.pop(key, key in self._direct)
        self._events.put((key, reason))
        self._schedule_reconnect(key, direct, reason)
        self._wake.set()

    def stop(self) -> None:
        """Connect nothing more from now on (returns at once; :meth:`join` waits)."""
        self._stopping.set()
        self._wake.set()

    def join(self, deadline: float) -> None:
        """After :meth:`stop`: abort the handshakes under way and wait (until ``deadline``,
        ``time.monotonic()``) for the discovery thread and the connect threads, but the
        calling one (a hook may stop its consumer)."""
        with self._lock:
            dialing = list(self._connecting.values())
            threads = [self._thread, *self._connect_threads]
        for conn in dialing:
            conn.abort_connect()  # a hung nsqd may never answer the handshake
        current = threading.current_thread()
        for t in threads:
            if t is not None and t is not current:
                t.join(max(deadline - time.monotonic(), 0.1))

    def close(self) -> None:
        """Last: close the lookupd clients, run the hooks of the connections lost since."""
        self._lookupds.close()
        self._drain_events()

    # ================================================================ the discovery thread

    def _loop(self) -> None:
        cfg = self.config
        next_poll = self._clock() if len(self._lookupds) else float("inf")
        while not self._stopping.is_set():
            wait = 1.0
            try:
                self._drain_events()
                with self._lock:  # a connection closing sets _requery_at meanwhile
                    due = self._clock() >= min(next_poll, self._requery_at)
                    if due:
                        self._requery_at = float("inf")
                if due:
                    jitter = random.random() * cfg.lookupd_poll_jitter * cfg.lookupd_poll_interval
                    next_poll = self._clock() + cfg.lookupd_poll_interval + jitter
                    self._query_lookupds()
                for key in self._due_reconnects(self._clock()):
                    self._start_connect(key, direct=key in self._direct)
                with self._lock:
                    pending = list(self._reconnect_at.values())
                wake_at = min([next_poll, self._requery_at, *pending], default=next_poll)
                wait = min(max(wake_at - self._clock(), 0.0), 1.0)
            except Exception:
                logger.exception("unexpected error in discovery; it goes on")
            if self._wake.wait(wait):
                self._wake.clear()

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
            self._target_config.update(found)
            held = self._owner.held_keys()
            new = [k for k in found if k not in held and k not in self._connecting]
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
            held = {split_key(k)[1] for k in (*self._owner.held_keys(), *self._connecting)}
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
            self._requery_at = min(self._requery_at, self._clock() + delay)
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
                self._owner.fail(
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
            self._owner.fail(
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

    # ================================================================ connecting

    def _start_connect(self, key: str, direct: bool) -> None:
        """Connect to ``key``'s nsqd on a thread of its own, so that a slow or hung nsqd never
        delays connecting to the others."""
        with self._lock:
            if self._stopping.is_set() or key in self._connecting:
                return
            if key in self._owner.held_keys():
                return
            address, partition = split_key(key)
            config = self.config if direct else self._target_config.get(key, self.config)
            conn = Connection(address, config, delegate=self._delegate)
            conn.partition = partition
            conn.key = key
            conn.ordered = self.ordered
            self._connecting[key] = conn
            self._dialled[key] = direct
            thread = threading.Thread(
                target=self._connect,
                args=(conn, direct),
                name=f"nsq-connect-{key}",
                daemon=True,
            )
            self._connect_threads.add(thread)
            thread.start()  # under the lock: join() never sees it unstarted

    def _connect(self, conn: Connection, direct: bool) -> None:
        try:
            self._subscribe(conn, direct)
        except Exception as exc:
            logger.exception("unexpected error connecting to %s", conn.key)
            conn.close(0.5)
            self._forget(conn.key)
            self._schedule_reconnect(conn.key, direct, exc)
        finally:
            with self._lock:
                self._connect_threads.discard(threading.current_thread())

    def _forget(self, key: str) -> None:
        """``key`` is neither connecting nor held any more."""
        with self._lock:
            self._connecting.pop(key, None)
            self._dialled.pop(key, None)

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
            self._forget(key)
            self._owner.fail(_refused_error(exc, self.topic))
            return
        except (OSError, NSQError, TimeoutError) as exc:
            logger.warning("cannot subscribe to %s: %s", key, exc)
            conn.close(0.5)
            self._forget(key)
            self._schedule_reconnect(key, direct, exc)
            return
        with self._lock:  # connecting, then held: never neither (see _start_connect)
            self._connecting.pop(key, None)
            taken = not self._stopping.is_set() and self._owner.subscribed(conn)
            if taken:
                self._reconnect_failures.pop(key, None)
            else:
                self._dialled.pop(key, None)
        if not taken:
            conn.close(0.5)
            self._schedule_reconnect(key, direct, conn.close_reason)  # closed before it was held
            return
        logger.info("subscribed to %s/%s on %s", self.topic, self.channel, key)
        run_hook(self.on_connect, key)
        self._owner.connection_made(key)

    # ================================================================ reconnecting

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
                self._reconnect_at[key] = self._clock() + delay
            else:
                # the partition's leader may have moved: ask lookupd where it is now
                self._requery_at = min(self._requery_at, self._clock() + delay)
        logger.info("%s %s in %.1fs", "reconnecting to" if direct else "looking up", key, delay)
        self._wake.set()

    def _drain_events(self) -> None:
        while True:
            try:
                key, reason = self._events.get_nowait()
            except queue.Empty:
                return
            run_hook(self.on_disconnect, key, reason)
            self._owner.connection_lost(key, reason)


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
