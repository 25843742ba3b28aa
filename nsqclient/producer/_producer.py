"""Producer: publish from plain synchronous or threaded code.

``pub()``/``mpub()``/``dpub()`` return once nsqd answered OK and raise otherwise; the ``*_async``
forms return a :class:`concurrent.futures.Future`.  One Producer is meant to be shared by every
thread of a process: concurrent publishes are pipelined over the same connection and each gets
its own answer.

Guarantees, stated plainly:

* A publish that returned was stored by nsqd.
* A publish that raised :class:`ServerError` was refused by nsqd and not stored.
* A publish that raised :class:`ConnectionClosedError` with ``maybe_processed`` True (the
  connection died while it was in flight) may or may not have been stored; nsqclient does not
  resend it unless ``pub_retries`` > 0, which trades this uncertainty for possible duplicates.
* A publish queued behind a fatal error on the same connection was provably not processed by nsqd
  (nsqd handles commands in order and closes right after a fatal error); ``pub()`` and
  ``pub_async()`` send such publishes again by themselves (asynchronous ones in their order).

:class:`Producer` is the public face of publishing (the calls, observers, flush, close, fork
and exit); the work is done by collaborators it owns, each in its own module of this package:
the ``NsqdPool`` of nsqd endpoints it writes on (_nsqd_pool.py; an ``Endpoint`` per address, each
with its own connect / down / up state: _endpoint.py), publishing by lookup
(``LookupPublisher``, _by_lookup.py), the backlog (_backlog.py), the outer Futures
(_outer_futures.py), the deadline keeper (_deadlines.py) and the ledger of what could not be
delivered (_undelivered.py).
"""

from __future__ import annotations

import atexit
import logging
import os
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, Unpack, overload

from .. import protocol
from ..addresses import lookupd_addresses, nsqd_addresses
from ..checks import check_float
from ..config import Config, ProducerOptions, add_options_help, check_owner
from ..conn._connection import Waiter
from ..conn._futures import wait_answered
from ..errors import (
    ConnectionClosedError,
    UndeliveredError,
)
from ..lookupd._partitions import key_bytes
from ..lookupd._pool import LookupdPool
from ..observe import ObserverSet, PublishEvent, tell
from ..platforms import register_at_fork
from ..protocol import Body
from ._backlog import Backlog
from ._by_lookup import LookupPublisher
from ._deadlines import DeadlineKeeper
from ._limits import Limits, body_size
from ._nsqd_pool import NsqdPool
from ._outer_futures import OuterFuture, OuterFutures, ResendableFuture
from ._publish_ended import AsyncEnded, ended, failed
from ._publish_forms import (
    Build,
    Plan,
    PublishResult,
    check_not_partitioned,
    dpub_builder,
    mpub_builder,
    pub_builder,
)
from ._router import Router
from ._undelivered import Ledger, undelivered_error

__all__ = ["Producer", "PublishResult", "Answer", "Key"]

#: What an asynchronous publish's Future resolves to: nsqd's ``b"OK"``, or a
#: :class:`PublishResult` for a traced publish.
Answer = bytes | PublishResult
#: youzan: a sharding key (see :func:`~nsqclient.lookupd.key_partition`).
Key = bytes | str | int | None

logger = logging.getLogger("nsqclient.producer")

#: bytes: the MPUB body a connection joins queued PUBs into at most.  Some dozens of small
#: messages already take nsqd's work per message down several-fold; kept small so that an nsqd
#: whose --max-body-size the Producer was not told (and could not ask) still takes it.
_JOIN_CAP = 16 * 1024

_producers: weakref.WeakSet[Producer] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for producer in list(_producers):
        producer._after_fork()


register_at_fork(_reset_after_fork)  # nothing to reset where there is no fork


def _flush_at_exit() -> None:
    """At interpreter exit, deliver what every unclosed Producer accepted (see
    :meth:`Producer.close`); the connection threads are daemons and would die with it."""
    for producer in list(_producers):
        if not producer.closed and producer._pid == os.getpid():
            producer._close_at_exit()


atexit.register(_flush_at_exit)


class Producer:
    """Publishes to one or more nsqd.

    Args:
        nsqd_tcp_addresses: ``"host:port"``, a list of them, or one comma-separated str.
            Publishes go round-robin over the addresses; an address that cannot be reached is
            skipped (with a growing reconnect delay) and the publish goes to the next one.
        lookupd_http_addresses: nsqlookupd HTTP addresses (``"http://host:4161"`` or
            ``"host:4161"``, the port required; a list or a comma-separated str) to learn, per
            topic, which nsqd to publish to (used instead of ``nsqd_tcp_addresses`` when given).
            On youzan's NSQ this is how publishes find each partition's leader; see
            :meth:`pub`.  Bad addresses raise ValueError here (:mod:`nsqclient.addresses`).
        nsqd_http_addresses: the HTTP address (``"host:port"`` or ``"http://host:port"``) of
            each of ``nsqd_tcp_addresses``, in the same order, where each nsqd's size limits
            are read once connected (lookup names them by itself); see ``max_msg_size``.
        **options: the options below (:class:`~nsqclient.config.ProducerOptions` to a type
            checker), durations in seconds, sizes in bytes.

    Connections are made on first use.  A Producer made before ``os.fork()`` (gunicorn
    ``--preload``) works in the child: the child makes its own connections.
    """

    def __init__(
        self,
        nsqd_tcp_addresses: str | Sequence[str] | None = None,
        lookupd_http_addresses: str | Sequence[str] | None = None,
        *,
        nsqd_http_addresses: str | Sequence[str] | None = None,
        **options: Unpack[ProducerOptions],
    ):
        addresses = nsqd_addresses(nsqd_tcp_addresses, "nsqd_tcp_addresses")
        lookupds = lookupd_addresses(lookupd_http_addresses, "lookupd_http_addresses")
        if not addresses and not lookupds:
            raise ValueError("Producer needs nsqd_tcp_addresses or lookupd_http_addresses")
        https = lookupd_addresses(nsqd_http_addresses, "nsqd_http_addresses")
        if https and len(https) != len(addresses):
            raise ValueError(
                f"nsqd_http_addresses: {len(https)} given for {len(addresses)}"
                " nsqd_tcp_addresses; give one HTTP address per TCP address, in the same order"
            )
        #: the HTTP address of each given nsqd (None: unknown)
        self._http_addresses: list[str | None] = list(https) or [None] * len(addresses)
        check_owner(options, "Producer")
        self.config = Config(**options)
        self._limits = Limits(
            self.config.max_msg_size,
            self.config.max_body_size,
            {"max_msg_size", "max_body_size"} & set(options),
        )
        self._pub_timeout = self.config.pub_timeout
        self._router: Router | None = None
        if lookupds:
            pool = LookupdPool(lookupds, self.config.lookupd_request_timeout)
            self._router = Router(pool, self.config.lookupd_poll_interval)
        self._tracing = self.config.trace
        #: neither lookup nor tracing: a publish with no youzan argument takes the fast path
        self._plain = self._router is None and not self._tracing
        #: topic -> b"PUB <topic>\n", for topics already checked (bounded, see _pub_command)
        self._pub_lines: dict[str, bytes] = {}
        self._start(addresses, addresses[0] if addresses else "lookup", False)
        _producers.add(self)
        self._observers = ObserverSet(self)

    def _start(self, addresses: list[str], name: str, closed: bool) -> None:
        """The state of this process's publishing: made anew in a forked child."""
        self._pid = os.getpid()
        #: pub_async Futures that failed with nobody looking (flush() and close() report them)
        self._ledger = Ledger()
        #: what every ResendableFuture is given (made once, not per publish)
        self._note_failure = self._ledger.note
        self._resend_future = self._resend
        #: every endpoint by address: the given ones and those lookup named
        self._pool = NsqdPool(
            addresses,
            self.config,
            self._ledger.note,
            self._keep_deadlines,
            self._http_addresses,
            self._limits.learn,
            self._join_limit if self._joins() else None,
        )
        self._pool.closed = closed
        #: the endpoints of the given addresses, in order
        self._slots = self._pool.given
        #: pub_async work that may block (connecting, lookups), run in order on one thread
        self._backlog = Backlog(name)
        #: asynchronous publishes not yet on a connection, or waiting for a retry by lookup,
        #: and not answered yet (flush and close wait for them)
        self._outers = OuterFutures(
            self._ledger.note, self._pub_timeout, self._pool.connection_of, self._keep_deadlines
        )
        self._deadlines = DeadlineKeeper(
            name, self._pool.live_connections, self._pub_timeout, self._outers.expire
        )
        self._by_lookup = LookupPublisher(
            self._pool, self._router, self.config, self._backlog, self._outers
        )

    def __repr__(self) -> str:
        where = [s.address for s in self._slots] or self._router.pool.addresses()  # type: ignore[union-attr]
        return f"<Producer {where}{' closed' if self.closed else ''}>"

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except UndeliveredError as error:  # the block's own exception goes on
            logger.error("%s (not raised: the with block raised %s)", error, exc_type.__name__)

    # ---------------------------------------------------------------- public API

    @overload
    def pub(self, topic: str, body: Body, timeout: float | None = None, *,
            partition: int | None = None, key: Key = None, trace_id: int,
            ext: dict[str, Any] | None = None) -> PublishResult: ...  # fmt: skip
    @overload
    def pub(self, topic: str, body: Body, timeout: float | None = None, *,
            partition: int | None = None, key: Key = None, trace_id: None = None,
            ext: dict[str, Any] | None = None) -> PublishResult | None: ...  # fmt: skip

    def pub(
        self,
        topic: str,
        body: Body,
        timeout: float | None = None,
        *,
        partition: int | None = None,
        key: bytes | str | int | None = None,
        trace_id: int | None = None,
        ext: dict[str, Any] | None = None,
    ) -> PublishResult | None:
        """Publish one message; return when nsqd answered OK.

        Args:
            body: bytes, bytearray, memoryview, or str (sent as UTF-8).
            timeout: seconds to wait for the answer (default: the ``pub_timeout`` option),
                connecting, looking up and youzan's leader retries included.
            partition: youzan: the partition to publish to (``PUB topic partition``).
            key: youzan: a sharding key; every message with the same key goes to the same
                partition, from any process (:func:`~nsqclient.lookupd.key_partition`).
                Needs ``lookupd_http_addresses`` (lookup says how many partitions there are).
                Without partition or key, publishes go round-robin over the partitions.
            trace_id: youzan: send ``PUB_TRACE`` with this 64-bit trace id (the ``trace``
                option or :meth:`set_tracing` traces every publish, with trace id 0).
            ext: youzan: JSON headers (``PUB_EXT``) for a topic created with extend support.

        Returns None, or, for a traced publish (``trace_id`` given, or the ``trace`` option or
        :meth:`set_tracing` on), a :class:`PublishResult` (message id, trace id, disk queue
        offset and raw size).

        Raises:
            ValueError: bad topic, body, partition or key, before anything is sent.
            TypeError: a body of the wrong type, before anything is sent.
            ServerError: nsqd refused it (e.g. BadMessageError when too big).  By lookup,
                the refusals youzan's nsqd sends before storing anything (E_FAILED_ON_NOT_LEADER,
                E_PUB_FAILED exiting...; docs/youzan.rst lists them) are first retried after a
                fresh lookup, until ``timeout`` (at most ``leader_retries`` times).
            NoRouteError: lookup named no nsqd for the topic or partition.
            ConnectionClosedError: no nsqd could be reached, or the connection died.
            NSQTimeoutError: no answer within ``timeout`` (``maybe_processed`` True: the
                outcome is unknown), or by lookup no leader, lookupd answer or accepting nsqd
                within it (``maybe_processed`` False: nothing was stored; it names the last
                failure).
        """
        if self._observers.active or not self._classic(partition, key, trace_id, ext):
            return self._publish(
                self._pub_plan(topic, body, partition, key, trace_id, ext), timeout
            )
        self._pool.publish_on(self._pub_command(topic, body), None, timeout)
        return None

    @overload
    def mpub(self, topic: str, bodies: Sequence[Body], timeout: float | None = None, *,
             partition: int | None = None, key: Key = None, trace_id: int | Sequence[int],
             ext: dict[str, Any] | None = None) -> PublishResult: ...  # fmt: skip
    @overload
    def mpub(self, topic: str, bodies: Sequence[Body], timeout: float | None = None, *,
             partition: int | None = None, key: Key = None, trace_id: None = None,
             ext: dict[str, Any] | None = None) -> PublishResult | None: ...  # fmt: skip

    def mpub(
        self,
        topic: str,
        bodies: Sequence[Body],
        timeout: float | None = None,
        *,
        partition: int | None = None,
        key: bytes | str | int | None = None,
        trace_id: int | Sequence[int] | None = None,
        ext: dict[str, Any] | None = None,
    ) -> PublishResult | None:
        """Publish several messages atomically (one MPUB); see :meth:`pub`.  ``trace_id`` may
        be one id for every message or one per message; ``ext`` goes with every message."""
        if self._observers.active or not self._classic(partition, key, trace_id, ext):
            plan = self._mpub_plan(topic, bodies, partition, key, trace_id, ext)
            return self._publish(plan, timeout)
        self._pool.publish_on(self._mpub_command(topic, bodies), None, timeout)
        return None

    def dpub(self, topic: str, body: Body, delay: float, timeout: float | None = None) -> None:
        """Publish one message that nsqd delivers after ``delay`` seconds; see :meth:`pub`.
        Classic NSQ only: youzan's nsqd has no DPUB (ValueError for a partitioned topic)."""
        if self._observers.active or self._router is not None:
            self._publish(self._dpub_plan(topic, body, delay, False), timeout)
            return
        self._pool.publish_on(self._dpub_command(topic, delay, body), None, timeout)

    @overload
    def pub_async(self, topic: str, body: Body, *, partition: int | None = None,
                  key: Key = None, trace_id: int,
                  ext: dict[str, Any] | None = None) -> Future[PublishResult]: ...  # fmt: skip
    @overload
    def pub_async(self, topic: str, body: Body, *, partition: int | None = None,
                  key: Key = None, trace_id: None = None,
                  ext: dict[str, Any] | None = None) -> Future[Answer]: ...  # fmt: skip

    def pub_async(
        self,
        topic: str,
        body: Body,
        *,
        partition: int | None = None,
        key: bytes | str | int | None = None,
        trace_id: int | None = None,
        ext: dict[str, Any] | None = None,
    ) -> Future[Any]:  # the overloads above say what it resolves to
        """Publish without waiting: returns a :class:`concurrent.futures.Future` at once, never
        blocking on the network.

        The Future resolves to nsqd's answer: ``b"OK"``, or a :class:`PublishResult` when the
        publish is traced (``trace_id`` given, or the ``trace`` option or :meth:`set_tracing`
        on; with ``trace_id`` a type checker knows it).  It fails with the error :meth:`pub`
        would raise: a connection that cannot be made (refused, no handshake within
        ``handshake_timeout``, closed) fails the Future, within ``pub_timeout`` seconds of the
        call.  Bad input (topic, body, partition) raises
        here, at once.  When no connection is ready (the first publish, an nsqd down) or a
        topic's route must be looked up first, that work runs on the Producer's backlog
        thread, in the order of the calls.  While 256 or more publishes on a connection are
        unanswered, their answers are read in batches: a Future may resolve up to 0.5 ms after
        nsqd's answer arrived (the reader's CPU per answer falls several-fold)."""
        if self._observers.active or not (
            partition is None and key is None and trace_id is None and ext is None and self._plain
        ):
            return self._publish_async(self._pub_plan(topic, body, partition, key, trace_id, ext))
        # _submit_async's usual case, and _pub_command's cache, read here: two calls less
        line = self._pub_lines.get(topic)
        if line is None or type(body) is not bytes or not 0 < len(body) <= self._limits.msg:
            return self._submit_async(self._pub_command(topic, body), 1)
        command = line + len(body).to_bytes(4, "big") + body
        future = ResendableFuture(command, self._resend_future, self._note_failure)
        if self._backlog.jobs or not self._pool.write_ready(command, future, None, 1):
            return self._submit_later(command, future)
        if not self._deadlines.running:
            self._deadlines.ensure()
        return future

    @overload
    def mpub_async(self, topic: str, bodies: Sequence[Body], *, partition: int | None = None,
                   key: Key = None, trace_id: int | Sequence[int],
                   ext: dict[str, Any] | None = None) -> Future[PublishResult]: ...  # fmt: skip
    @overload
    def mpub_async(self, topic: str, bodies: Sequence[Body], *, partition: int | None = None,
                   key: Key = None, trace_id: None = None,
                   ext: dict[str, Any] | None = None) -> Future[Answer]: ...  # fmt: skip

    def mpub_async(
        self,
        topic: str,
        bodies: Sequence[Body],
        *,
        partition: int | None = None,
        key: bytes | str | int | None = None,
        trace_id: int | Sequence[int] | None = None,
        ext: dict[str, Any] | None = None,
    ) -> Future[Any]:  # the overloads above say what it resolves to
        """:meth:`mpub` without waiting; see :meth:`pub_async`."""
        if self._observers.active or not self._classic(partition, key, trace_id, ext):
            return self._publish_async(
                self._mpub_plan(topic, bodies, partition, key, trace_id, ext)
            )
        return self._submit_async(self._mpub_command(topic, bodies), len(bodies))

    def dpub_async(self, topic: str, body: Body, delay: float) -> Future[bytes]:
        """:meth:`dpub` without waiting; see :meth:`pub_async`.  The Future resolves to
        ``b"OK"``."""
        if self._observers.active or self._router is not None:
            return self._publish_async(self._dpub_plan(topic, body, delay, True))
        return self._submit_async(self._dpub_command(topic, delay, body), 1)

    # ---------------------------------------------------------------- observers

    def add_observer(self, observer: Any) -> None:
        """Tell ``observer`` about every publish of this Producer (see
        :mod:`nsqclient.observe`)."""
        self._observers.add(observer)

    def remove_observer(self, observer: Any) -> None:
        """Stop telling ``observer`` (added with :meth:`add_observer`)."""
        self._observers.remove(observer)

    # ---------------------------------------------------------------- the publish path

    def _publish(self, plan: Plan, timeout: float | None) -> PublishResult | None:
        """Send ``plan`` and wait for nsqd's answer (observers told, when there are any)."""
        observers = self._observers.active
        event = self._started(observers, plan, False) if observers else None
        try:
            result = self._send(plan, timeout, event)
        except BaseException as exc:
            if event is not None:
                failed(observers, event, exc)
            raise
        if event is not None:
            ended(observers, event, protocol.OK if result is None else result)
        return result

    def _publish_async(self, plan: Plan) -> Future[Any]:
        """Send ``plan`` without waiting: its Future (observers told as it completes)."""
        observers = self._observers.active
        event = self._started(observers, plan, True) if observers else None
        try:
            future = self._send_async(plan)
        except BaseException as exc:
            if event is not None:
                failed(observers, event, exc)
            raise
        if event is not None:
            future.watch(AsyncEnded(observers, event))  # type: ignore[attr-defined]
        return future

    def _send(
        self, plan: Plan, timeout: float | None, event: PublishEvent | None
    ) -> PublishResult | None:
        """``plan`` on a given address (classic) or by lookup, waiting for the answer."""
        if plan.build is None:
            assert plan.wire is not None
            self._pool.publish_on(plan.wire, None, timeout, event=event)
            return None
        return self._by_lookup.publish(
            plan.topic, plan.build, plan.traced, timeout, plan.partition, plan.key, event
        )

    def _send_async(self, plan: Plan) -> Future[Any]:
        """``plan`` on a given address (classic) or by lookup, without waiting."""
        if plan.build is None:
            assert plan.wire is not None
            return self._submit_async(plan.wire, plan.count)
        return self._by_lookup.submit(plan.topic, plan.build, plan.traced, plan.partition, plan.key)

    def _started(self, observers: tuple[Any, ...], plan: Plan, asynchronous: bool) -> PublishEvent:
        """Tell ``publish_started`` of ``plan``; carry the ext header an observer set."""
        single = self._slots[0].address if self._router is None and len(self._slots) == 1 else None
        event = PublishEvent(
            self, plan.command, asynchronous, plan.topic, plan.count, plan.body_size,
            plan.partition, plan.ext, self._extendable(plan, not asynchronous), single,
        )  # fmt: skip
        tell(observers, "publish_started", event)
        if event.ext is not plan.ext and event.extendable:
            plan.with_ext(event.ext)
        return event

    def _pub_plan(
        self, topic: str, body: Body, partition: int | None, key: Key, trace_id: int | None,
        ext: dict[str, Any] | None,
    ) -> Plan:  # fmt: skip
        """A PUB (or youzan's PUB_TRACE/PUB_EXT, by lookup), checked."""
        if key is not None:
            key_bytes(key)
        size = body_size(body)
        if self._classic(partition, key, trace_id, ext):
            return Plan("PUB", topic, 1, size, self._pub_command(topic, body))
        self._limits.check_body(body)

        def rebuild(ext: dict[str, Any] | None) -> tuple[Build, bool]:
            return pub_builder(self._router, self._tracing, topic, body, partition, trace_id, ext)

        build, traced = rebuild(ext)
        return Plan("PUB", topic, 1, size, None, build, traced, partition, key, ext, rebuild)

    def _mpub_plan(
        self, topic: str, bodies: Sequence[Body], partition: int | None, key: Key,
        trace_id: int | Sequence[int] | None, ext: dict[str, Any] | None,
    ) -> Plan:  # fmt: skip
        """An MPUB (or youzan's MPUB_TRACE/MPUB_EXT, by lookup), checked."""
        if key is not None:
            key_bytes(key)
        if self._classic(partition, key, trace_id, ext):
            return Plan("MPUB", topic, len(bodies), None, self._mpub_command(topic, bodies))
        self._limits.check_bodies(bodies)

        def rebuild(ext: dict[str, Any] | None) -> tuple[Build, bool]:
            return mpub_builder(self._router, self._tracing, topic, bodies, partition, trace_id,
                                ext)  # fmt: skip

        build, traced = rebuild(ext)
        return Plan("MPUB", topic, len(bodies), None, None, build, traced, partition, key, ext,
                    rebuild, headers=not traced)  # fmt: skip

    def _dpub_plan(self, topic: str, body: Body, delay: float, asynchronous: bool) -> Plan:
        """A DPUB, checked (by lookup: the topic must not be partitioned; a blocking one is
        refused now, an asynchronous one once its route is known)."""
        wire = self._dpub_command(topic, delay, body)
        build = None
        if self._router is not None:
            if not asynchronous:
                check_not_partitioned(self._router, topic)
            build = dpub_builder(self._router, topic, wire)
        return Plan("DPUB", topic, 1, body_size(body), wire, build)

    def _extendable(self, plan: Plan, lookup: bool) -> bool:
        """May a header be added to ``plan``: one was given, or the topic's route (looked up
        now when ``lookup`` and not cached: the publish looks it up anyway) says it takes
        headers, and its form takes one (see :class:`Plan`)."""
        if plan.rebuild is None:
            return False
        if plan.ext is not None:
            return True
        router = self._router
        if router is None or not plan.headers:
            return False
        route = router.cached(plan.topic)
        if route is None and lookup:
            try:
                route = router.route(plan.topic)
            except Exception:
                return False  # the publish itself raises it
        return route is not None and route.partitioned and route.extend_support

    def _classic(self, partition: object, key: object, trace_id: object, ext: object) -> bool:
        """True for a publish with nothing of youzan's and no lookup: the fast path."""
        return (
            partition is None and key is None and trace_id is None and ext is None and self._plain
        )

    @property
    def tracing(self) -> bool:
        """True while every publish is traced (youzan's PUB_TRACE); see :meth:`set_tracing`."""
        return self._tracing

    def set_tracing(self, enabled: bool) -> None:
        """Switch tracing on or off at run time.  While on, every publish is sent as
        youzan's PUB_TRACE/MPUB_TRACE (trace id 0 unless given), returns a
        :class:`PublishResult`, and is logged at INFO on ``nsqclient.trace`` with the topic,
        partition, nsqd, message id, trace id, disk queue offset, raw size and elapsed
        milliseconds.  Classic nsqd does not know PUB_TRACE: trace only youzan topics."""
        self._tracing = bool(enabled)
        self._plain = self._router is None and not self._tracing

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every publish accepted so far (``pub_async`` ones included) has nsqd's
        answer or has failed; ``timeout`` in seconds (default: ``pub_timeout``).

        Raises:
            UndeliveredError: publishes accepted since the previous ``flush()``/``close()``
                failed, or were still unanswered after ``timeout``, and nobody took their
                outcome from their Future (``result()``, ``exception()``, a done callback).
                It says how many and why, and holds their Futures.  The unanswered ones stay
                in flight: their Futures resolve later.
        """
        timeout = self.config.pub_timeout if timeout is None else timeout
        unanswered = self._wait_answered(time.monotonic() + timeout)
        self._raise_undelivered("flush()", unanswered, timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Wait up to ``timeout`` seconds for publishes in flight, then close every connection
        (a connection still being made is aborted) and join the threads the Producer started.
        Publishing afterwards raises ConnectionClosedError.

        Raises:
            UndeliveredError: as :meth:`flush` does, once everything is closed: publishes
                accepted since the previous ``flush()``/``close()`` that failed or were still
                unanswered after ``timeout``, and whose outcome nobody took from its Future.
                Leaving a ``with Producer(...)`` block raises it too, unless the block is
                already raising (then it is logged at ERROR).

        A Producer that was never closed is closed at interpreter exit: it waits up to the
        ``exit_flush_timeout`` option (seconds) for what it accepted, and logs an ERROR naming
        how many publishes it could not deliver."""
        unanswered = self._close(timeout)
        self._raise_undelivered("close()", unanswered, timeout)

    def _close(self, timeout: float) -> list[Future | Waiter]:
        """Close (see :meth:`close`); return the requests still unanswered at the deadline
        (they failed as their connections closed: the caller reports them as unanswered)."""
        deadline = time.monotonic() + timeout
        # Publishes accepted by pub_async and still waiting for a connection go out first.
        self._backlog.wait_empty(deadline - time.monotonic())
        self._by_lookup.wait_retries(deadline)  # so do the retries due by the deadline
        self._pool.closed = True
        self._by_lookup.cancel_retries()  # the others fail now: their Futures are done
        unanswered = self._wait_answered(deadline)
        self._pool.close(deadline)
        self._by_lookup.join_retries(deadline)
        # what was backlogged fails now that no connection can be made: its thread ends
        self._backlog.close(max(deadline - time.monotonic(), 0.1))
        self._deadlines.stop()
        self._observers.close()
        return unanswered

    def _raise_undelivered(
        self, call: str, unanswered: list[Future | Waiter], timeout: float
    ) -> None:
        failed, extra = self._ledger.take()
        if unanswered:  # close() failed them as it closed their connections: unanswered
            waiting = set(unanswered)
            failed = [f for f in failed if f not in waiting]
        error = undelivered_error(call, failed, extra, unanswered, timeout)
        if error is not None:
            raise error

    def _wait_answered(self, deadline: float) -> list[Future | Waiter]:
        """Wait until ``deadline`` for the publishes in flight now (queued for a connection,
        waiting for a retry, or sent); return those still unanswered.  Taking no outcome (see
        :func:`~nsqclient.conn.wait_answered`)."""
        pending = [*self._outers.pending(), *self._pool.pending_requests()]
        unanswered = []
        for future in pending:
            if not wait_answered(future, deadline - time.monotonic()):
                unanswered.append(future)
        return unanswered

    def _close_at_exit(self) -> None:
        timeout = self.config.exit_flush_timeout
        unanswered = self._wait_answered(time.monotonic() + timeout)
        failed, extra = self._ledger.take()
        error = undelivered_error("exit", failed, extra, unanswered, timeout)
        if error is not None:
            logger.error(
                "Producer %s was not closed before exit: %d publishes could not be delivered"
                " (%d without an answer after exit_flush_timeout=%gs, %d failed); call"
                " close() or flush() before exiting",
                list(self._pool),
                error.count,
                error.unanswered,
                timeout,
                error.failed,
            )
        self._close(0.0)
        self._ledger.take()  # what failed as the connections closed: counted above

    @property
    def closed(self) -> bool:
        return self._pool.closed

    def stats(self) -> dict[str, Any]:
        """Counters for the Producer's whole life, and one entry per nsqd address.

        Returns a dict: ``messages_sent`` (messages in the PUB/MPUB/DPUB written), ``bytes_in``,
        ``bytes_out`` and ``connects``, summed over every connection it has had (they survive
        reconnects), ``max_msg_size`` and ``max_body_size`` (the size limits publishes are
        checked against now, bytes), and ``nsqd``: a list with, per address, the same
        cumulative counters, ``connected``, ``failures`` (consecutive failed connection
        attempts), ``last_error``, ``max_msg_size`` and ``max_body_size`` (what that nsqd
        stated, None until it did) and ``connection`` (the current connection's own figures,
        or None).
        """
        stats = self._pool.stats()
        stats["max_msg_size"] = self._limits.msg
        stats["max_body_size"] = self._limits.body
        return stats

    # ---------------------------------------------------------------- internals

    def _pub_command(self, topic: str, body: Body) -> bytes:
        """``protocol.pub(topic, body)``, with the command line of a topic already checked
        taken from a cache when the body is plain non-empty bytes; BadMessageError above
        the size limit (:mod:`nsqclient.producer._limits`)."""
        line = self._pub_lines.get(topic)
        if line is not None and type(body) is bytes and body:
            if len(body) > self._limits.msg:
                self._limits.check_message(len(body), "PUB")
            return line + len(body).to_bytes(4, "big") + body
        command = protocol.pub(topic, body)  # checks the topic and the body
        self._limits.check_message(len(command) - command.index(b"\n") - 5, "PUB")
        if len(self._pub_lines) >= 1024:
            self._pub_lines.clear()
        self._pub_lines[topic] = command[: command.index(b"\n") + 1]
        return command

    def _mpub_command(self, topic: str, bodies: Sequence[Body]) -> bytes:
        """``protocol.mpub(topic, bodies)``, checked against the size limits."""
        command = protocol.mpub(topic, bodies)
        size = len(command) - command.index(b"\n") - 5  # the MPUB body
        if size > self._limits.body or size > self._limits.msg:
            self._limits.check_bodies(bodies)
        return command

    def _dpub_command(self, topic: str, delay: float, body: Body) -> bytes:
        """``protocol.dpub(...)``, checked against the size limits."""
        command = protocol.dpub(topic, _delay_ms(delay), body)
        self._limits.check_message(len(command) - command.index(b"\n") - 5, "DPUB")
        return command

    def _submit_async(self, command: bytes, count: int) -> Future:
        """A classic asynchronous publish: written at once on a ready connection, or handed
        to the backlog (connecting there, within ``pub_timeout``) when none is ready or
        earlier publishes wait there, so that one caller's publishes keep their order.  Its
        Future is a :class:`~nsqclient.producer._outer_futures.ResendableFuture` (see
        :meth:`_resend`).  ``count``: the messages it publishes."""
        future = ResendableFuture(command, self._resend_future, self._note_failure)
        if self._backlog.jobs or not self._pool.write_ready(command, future, None, count):
            return self._submit_later(command, future)
        if not self._deadlines.running:
            self._deadlines.ensure()
        return future

    def _submit_later(self, command: bytes, future: ResendableFuture) -> Future:
        """:meth:`_submit_async` when ``future``'s publish cannot be written at once: it goes
        to the backlog, behind what waits there."""
        if self._pool.closed:
            raise ConnectionClosedError("this Producer is closed", maybe_processed=False)
        deadline = time.monotonic() + self._pub_timeout
        self._outers.adopt(future, deadline)
        self._backlog.submit(lambda: self._send_outer(future, command, deadline))
        return future

    def _send_outer(self, outer: OuterFuture, command: bytes, deadline: float) -> None:
        """A backlog job: write ``command`` for ``outer`` (connecting until ``deadline``)."""
        if not self._outers.may_send(outer):
            return  # its deadline passed while it waited: failed, nothing sent
        try:
            inner = self._pool.submit_connecting(command, None, deadline)
        except BaseException as exc:
            self._outers.settle(outer, error=exc)
            return
        outer.inner = inner  # for OuterFutures.expire
        self._outers.chain(inner, outer)

    def _resend(self, future: ResendableFuture) -> bool:
        """Send an asynchronous publish again: nsqd provably did not process it (it was queued
        behind a publish nsqd refused fatally, and nsqd processes nothing after that).  Runs on
        the thread failing it (a reader thread): the sending is a backlog job, in the order
        the connection failed them (the order they were written).  The deadline is
        ``pub_timeout`` from the first resend (a publish from the backlog keeps its own).
        False (it fails) once the Producer is closed or the deadline has passed."""
        command = future.command
        if self._pool.closed or command is None:
            return False
        now = time.monotonic()
        deadline = future.deadline or now + self._pub_timeout
        if now >= deadline:
            return False
        self._outers.adopt(future, deadline)
        logger.debug("resending a publish queued behind a fatal error")
        self._backlog.submit(lambda: self._send_outer(future, command, deadline))
        return True

    def _joins(self) -> bool:
        """Whether connections join queued PUBs: the option, for a classic nsqd given by
        address (youzan's nsqd, and publishing by lookup, keep each PUB on its own)."""
        return self.config.join_publishes and self._router is None and not self.config.youzan

    def _join_limit(self) -> int:
        """The largest MPUB body (bytes) a connection may join queued PUBs into: at most
        _JOIN_CAP, and never above nsqd's ``--max-body-size`` as far as this Producer knows
        it (see _limits.py)."""
        return min(self._limits.body, _JOIN_CAP)

    def _keep_deadlines(self) -> None:
        self._deadlines.ensure()

    def _after_fork(self) -> None:
        """In a forked child: forget the parent's connections (their threads did not survive
        the fork; their sockets are the parent's) and start afresh."""
        if os.getpid() != self._pid:
            self._start([s.address for s in self._slots], self._backlog.name, self.closed)


def _delay_ms(delay: float) -> int:
    return int(round(check_float(delay, "delay", "seconds", min=0) * 1000))


add_options_help(Producer, "Producer")
