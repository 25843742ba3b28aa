"""Publishing by lookup: where each publish of a Producer goes when it learns topics from
nsqlookupd (``lookupd_http_addresses``; youzan's partitions and keys), and its retries.

For each topic a :class:`~nsqclient.producer._router.Router` keeps the topic's *route* (where its
partitions are written, as lookup said: :class:`~nsqclient.lookupd.TopicRoute`), and each
publish goes to its partition's leader.  Within the publish's timeout, what stored nothing is
tried again, after a fresh lookup (the topic's last known route while no lookupd answers):

* a leader that is gone: its nsqd cannot be reached and nothing was sent, or lookup names no
  leader for the partition while youzan replaces it;
* no lookupd answered, and no route of the topic is known yet;
* a refusal nsqd sends before it writes anything (:func:`refused_unstored`): a moved leader
  (E_FAILED_ON_NOT_LEADER, _NOT_WRITABLE, E_TOPIC_NOT_EXIST) or a leader that is stopping or
  whose write queue timed out (E_PUB_FAILED / E_MPUB_FAILED ``exiting``, ``pub timeout while
  pop wait queue``, ``pub to wait channel timeout``); at most ``leader_retries`` of them.

Nothing else is retried.  Past the timeout the publish raises NSQTimeoutError naming the last
failure (``maybe_processed=False``: nothing was stored).  One policy (:class:`Attempts`)
decides for the blocking path, which sleeps between attempts, and the asynchronous one, which
waits on a timer (:class:`Retries`: one ``nsq-pub-retry-<topic>`` thread per publish waiting;
the Producer's close() lets those due by its deadline run, then cancels the others and joins
them all).  Without lookupd (no router) the same path sends youzan's forms (a
partition, a trace id, ext headers) to the Producer's given addresses, once.

:class:`LookupPublisher` is a collaborator the Producer owns, beside the pool of nsqd endpoints
(:class:`~nsqclient.producer._nsqd_pool.NsqdPool`) it writes through; what it asks of that pool is
written down as the Protocol :class:`NsqdWriter`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Protocol

from ..config import Config
from ..errors import (
    ConnectionClosedError,
    FailedOnNotLeaderError,
    FailedOnNotWritableError,
    MPubFailedError,
    NoRouteError,
    NSQTimeoutError,
    PubFailedError,
    ServerError,
    TopicNotExistError,
)
from ..lookupd._partitions import key_bytes
from ..lookupd._pool import unanswered
from ..observe import PublishEvent
from ._publish_forms import Build, PublishResult, traced_result
from ._router import Router

if TYPE_CHECKING:
    from ._backlog import Backlog
    from ._endpoint import Endpoint
    from ._outer_futures import OuterFuture, OuterFutures

    #: a partition (None: none on the wire) and the endpoints to try, in order (None: the
    #: Producer's given addresses)
    Target = tuple[int | None, list[Endpoint] | None]

__all__ = [
    "LAST_ATTEMPT",
    "Attempts",
    "LookupPublisher",
    "NsqdWriter",
    "Retries",
    "refused_unstored",
]

logger = logging.getLogger("nsqclient.producer")

#: youzan's answers that mean "lookup is stale": refresh the route and try again
_STALE_ROUTE = (FailedOnNotLeaderError, FailedOnNotWritableError, TopicNotExistError)
#: seconds left to the publish's deadline for its last attempt (it raises NSQTimeoutError
#: when less than twice this is left after a failure)
LAST_ATTEMPT = 0.1
#: the descriptions of youzan's E_PUB_FAILED / E_MPUB_FAILED that nsqd sends before it writes
#: anything (nsqdserver/protocol_v2.go, context.go's pub loop, nsqd/topic.go): the topic is
#: exiting (a SIGTERMed leader), or the publish waited too long for the write queue
_UNSTORED_PUB_FAILED = (
    "exiting",
    "pub timeout while pop wait queue",
    "pub to wait channel timeout",
)


def refused_unstored(exc: BaseException) -> bool:
    """True for an nsqd refusal that provably stored nothing and that a retry after a fresh
    lookup may get past: a stale route (E_FAILED_ON_NOT_LEADER, E_FAILED_ON_NOT_WRITABLE,
    E_TOPIC_NOT_EXIST), or youzan's E_PUB_FAILED / E_MPUB_FAILED ``exiting``, ``pub timeout
    while pop wait queue`` and ``pub to wait channel timeout`` (matched by prefix)."""
    if isinstance(exc, _STALE_ROUTE):
        return True
    if isinstance(exc, (PubFailedError, MPubFailedError)):
        return exc.message.strip().lower().startswith(_UNSTORED_PUB_FAILED)
    return False


class NsqdWriter(Protocol):
    """What publishing by lookup asks of the pool of nsqd endpoints it writes through (the
    Producer's :class:`~nsqclient.producer._nsqd_pool.NsqdPool`)."""

    @property
    def closed(self) -> bool:
        """True once the Producer is closed: nothing is retried any more."""
        ...

    def endpoint(self, address: str, http_address: str | None = None) -> Endpoint:
        """The pool's endpoint of ``address`` (made on first use); ``http_address``: its
        HTTP address, when lookup named it (where its size limits are asked)."""
        ...

    def publish_on(
        self,
        command: bytes,
        endpoints: list[Endpoint] | None,
        timeout: float,
        deadline: float,
        event: PublishEvent | None,
    ) -> bytes:
        """Write ``command`` on the first of ``endpoints`` that can take it and return nsqd's
        answer, blocking until ``deadline`` (``timeout`` is for the error message)."""
        ...

    def submit_now(self, command: bytes, endpoints: list[Endpoint] | None) -> Future | None:
        """Write ``command`` on a connection already made, never blocking; None when none is
        ready."""
        ...

    def submit_connecting(
        self, command: bytes, endpoints: list[Endpoint] | None, deadline: float, first: bool
    ) -> Future:
        """Write ``command``, connecting until ``deadline`` where needed.  ``first`` (a first
        attempt, from the backlog): fail at once when every endpoint waits out its reconnect
        delay."""
        ...


@dataclasses.dataclass(eq=False)
class Attempts:
    """One publish by lookup across its attempts, and the retry policy: whether a failed
    attempt is tried again, and when.

    Attributes:
        publisher: the :class:`LookupPublisher` it goes through.
        topic, build, partition, key: the publish.
        timeout: seconds it may take, lookups and retries included.
        started: ``time.monotonic()`` when it was made.
        retries: attempts made after the first.
        refusals: the retries that followed a refusal (at most ``leader_retries``).
        attempted_at: the router's clock when the last attempt took its route.
    """

    publisher: LookupPublisher
    topic: str
    build: Build
    partition: int | None
    key: bytes | str | int | None
    timeout: float
    started: float = dataclasses.field(default_factory=time.monotonic)
    retries: int = 0
    refusals: int = 0
    attempted_at: float = 0.0

    @property
    def deadline(self) -> float:
        """``time.monotonic()`` by which the publish ends."""
        return self.started + self.timeout

    def target(self) -> Target:
        """Start an attempt: its partition and endpoints (may look the topic up)."""
        router = self.publisher.router
        self.attempted_at = time.monotonic() if router is None else router.now()
        return self.publisher.target(self.topic, self.partition, self.key)

    def after(self, exc: BaseException) -> float | BaseException:
        """What follows an attempt that failed with ``exc``: seconds to wait before the next
        one, or the error the publish ends with (``exc`` itself, or NSQTimeoutError once the
        next attempt would start past the deadline).

        Retried (see the module): a gone leader, a lookup no lookupd answered, and a refusal
        that stored nothing (:func:`refused_unstored`; at most ``leader_retries`` of those),
        waiting 0.1 s doubling up to 1 s, the last wait cut short to leave
        :data:`LAST_ATTEMPT` for a last attempt; nothing else, and nothing once the Producer
        is closed.  Before a retry the route is looked up again (only a route fetched before the
        failed attempt took its own is thrown away: another publish may have a fresh one)."""
        publisher = self.publisher
        router = publisher.router
        if router is None or publisher.pool.closed:
            return exc
        why = _retryable(exc)
        if why is None:
            return exc
        if why == "refused":
            if self.refusals >= publisher.config.leader_retries:
                return exc
            self.refusals += 1
        router.invalidate(self.topic, fetched_before=self.attempted_at)
        left = self.deadline - time.monotonic()
        if left < 2 * LAST_ATTEMPT:
            return self._timed_out(why, exc)
        # the last wait ends with LAST_ATTEMPT left: that attempt may still get through
        delay = min(0.1 * 2**self.retries, 1.0, left - LAST_ATTEMPT)
        logger.info(
            "publish to %s failed (%s); looking it up again in %.1fs", self.topic, exc, delay
        )
        self.retries += 1
        return delay

    def _timed_out(self, why: str, exc: BaseException) -> NSQTimeoutError:
        """The error of a publish whose retries ran out of time, after ``exc``."""
        topic, timeout = self.topic, self.timeout
        if why == "gone":
            what = f"no leader of {topic!r} could be reached within {timeout:g}s"
        elif why == "lookupd":
            what = f"no lookupd told where {topic!r} goes within {timeout:g}s"
        else:
            what = f"{topic!r} was refused by its leader at every attempt within {timeout:g}s"
        detail = f"{what} (nothing was sent or stored; tried {self.retries + 1} times): {exc}"
        router = self.publisher.router
        lookup_error = None if router is None else router.lookup_error(topic)
        if lookup_error is not None and lookup_error is not exc:
            detail += f"; lookupd meanwhile: {lookup_error}"
        error = NSQTimeoutError(detail, maybe_processed=False)
        error.__cause__ = exc
        return error

    def traced_result(
        self, partition: int | None, address: str, reply: bytes
    ) -> PublishResult | None:
        """What a traced publish returns once nsqd at ``address`` answered ``reply``."""
        return traced_result(self.topic, partition, address, reply, self.started)


class LookupPublisher:
    """Publishes of a Producer that follow lookup or take youzan's forms (see the module).

    Args:
        pool: the nsqd endpoints it writes through (see :class:`NsqdWriter`).
        router: the routes of its topics, by lookup; None without lookupd.
        config: its options (``pub_timeout``, ``leader_retries``).
        backlog: its backlog (a first attempt that could block runs there, in call order).
        outers: its outer Futures (an asynchronous publish's Future is one).
    """

    def __init__(
        self,
        pool: NsqdWriter,
        router: Router | None,
        config: Config,
        backlog: Backlog,
        outers: OuterFutures,
    ):
        self.pool = pool
        self.router = router
        self.config = config
        self._backlog = backlog
        self._outers = outers
        self._retries = Retries()

    def wait_retries(self, deadline: float) -> bool:
        """Before the Producer closes: wait until ``deadline`` (a ``time.monotonic()``) for
        the retries waiting or running now, and those they schedule, to have run, so that one
        due before then still goes out; True if they have (see :meth:`Retries.wait`)."""
        return self._retries.wait(deadline)

    def cancel_retries(self) -> None:
        """Once the Producer is closed: the retries not due yet are never run, and their
        publishes fail now with ConnectionClosedError (nothing was stored)."""
        for outer, error in self._retries.cancel():
            self._outers.settle(outer, error=_closed_before_retry(error))

    def join_retries(self, deadline: float) -> None:
        """Join the retry timers, until ``deadline`` and at least 0.1 s: a retry running as the
        Producer closed fails at once, no connection being made any more, unless it waits on a
        lookupd request (bounded by ``lookupd_request_timeout``)."""
        self._retries.join(deadline)

    def target(self, topic: str, partition: int | None, key: bytes | str | int | None) -> Target:
        """The partition and the endpoints (in order of preference) of one publish."""
        router = self.router
        if router is None:
            if key is not None:
                raise ValueError(
                    "key= needs lookupd_http_addresses: the partition count comes from lookup"
                )
            return partition, None
        p, address = router.choose(topic, partition, key)
        endpoint = self.pool.endpoint
        route = router.route(topic)
        http = route.http
        if p is not None:
            return p, [endpoint(address, http.get(address))]
        # classic topic: the chosen nsqd first, the others it is on to fail over to
        others = [endpoint(a, http.get(a)) for a in route.nsqd if a != address]
        return None, [endpoint(address, http.get(address)), *others]

    def publish(
        self,
        topic: str,
        build: Build,
        traced: bool,
        timeout: float | None,
        partition: int | None,
        key: bytes | str | int | None,
        event: PublishEvent | None = None,
    ) -> PublishResult | None:
        """Publish and wait for nsqd's answer, retrying as :meth:`Attempts.after` says; see
        :meth:`Producer.pub <nsqclient.Producer.pub>`."""
        timeout = self.config.pub_timeout if timeout is None else timeout
        attempts = Attempts(self, topic, build, partition, key, timeout)
        if key is not None:
            key_bytes(key)  # a bad key raises before any I/O
        while True:
            try:
                p, endpoints = attempts.target()
                command = build(p)
                if event is not None:
                    event.partition = p
                try:
                    reply = self.pool.publish_on(
                        command, endpoints, timeout, attempts.deadline, event
                    )
                except ServerError:
                    _after_refusal(command, endpoints)
                    raise
            except BaseException as exc:
                after = attempts.after(exc)
                if after is exc:
                    raise
                if isinstance(after, BaseException):
                    raise after from exc
                time.sleep(after)  # a retry's backoff, bounded by the deadline
                continue
            if not traced:
                return None
            return attempts.traced_result(p, endpoints[0].address if endpoints else "", reply)

    def submit(
        self,
        topic: str,
        build: Build,
        traced: bool,
        partition: int | None,
        key: bytes | str | int | None,
    ) -> Future:
        """Publish without waiting: a Future of nsqd's answer, retried as
        :meth:`Attempts.after` says.  The first attempt runs on the calling thread when the
        topic's route is cached and its nsqd connected, otherwise on the backlog thread;
        retries run on a timer thread."""
        if key is not None:
            key_bytes(key)
        if self.pool.closed:
            raise ConnectionClosedError("this Producer is closed", maybe_processed=False)
        attempts = Attempts(self, topic, build, partition, key, self.config.pub_timeout)
        outer = self._outers.track(attempts.deadline)

        def first_attempt() -> None:
            self._attempt(attempts, outer, traced)

        try:
            if self._backlog.jobs or not self._attempt(attempts, outer, traced, inline=True):
                self._backlog.submit(first_attempt)
        except BaseException:
            self._outers.forget(outer)
            raise
        return outer

    def _attempt(
        self, attempts: Attempts, outer: OuterFuture, traced: bool, inline: bool = False
    ) -> bool:
        """One attempt of an asynchronous publish; False when ``inline`` (on the caller's
        thread) and it cannot go without blocking."""
        router = self.router
        try:
            if inline and router is not None and router.cached(attempts.topic) is None:
                return False
            p, endpoints = attempts.target()
            command = attempts.build(p)
            inner: Future | None
            if not self._outers.may_send(outer):
                return True  # past its deadline: failed, and nothing may be sent now
            if inline:
                inner = self.pool.submit_now(command, endpoints)
                if inner is None:
                    outer.sent = False  # not sent after all
                    return False
            else:
                first = attempts.retries == 0
                inner = self.pool.submit_connecting(command, endpoints, attempts.deadline, first)
        except (ValueError, TypeError) as exc:
            if inline:
                raise  # bad input: at the call site
            self._outers.settle(outer, error=exc)
            return True
        except BaseException as exc:
            self._failed(attempts, outer, traced, exc)
            return True
        outer.inner = inner  # for OuterFutures.expire
        address = endpoints[0].address if endpoints else ""

        def answered(inner: Future) -> None:
            # where this attempt went, for whoever reads the Future (the last attempt's)
            outer.nsqd_address = getattr(inner, "nsqd_address", None) or address
            outer.partition = p
            exc = inner.exception()
            if exc is not None:
                if isinstance(exc, ServerError):
                    _after_refusal(command, endpoints)
                self._failed(attempts, outer, traced, exc)
                return
            if not traced:
                self._outers.settle(outer, inner.result())
                return
            try:
                result = attempts.traced_result(p, address, inner.result())
            except Exception as error:
                self._outers.settle(outer, error=error)
                return
            self._outers.settle(outer, result)

        inner.watch(answered)  # type: ignore[attr-defined]
        return True

    def _failed(
        self, attempts: Attempts, outer: OuterFuture, traced: bool, exc: BaseException
    ) -> None:
        after = attempts.after(exc)
        if isinstance(after, BaseException):
            self._outers.settle(outer, error=after)
            return

        def retry() -> None:
            self._attempt(attempts, outer, traced)

        if not self._retries.schedule(after, attempts.topic, outer, exc, retry):
            self._outers.settle(outer, error=_closed_before_retry(exc))


class Retries:
    """The asynchronous publishes by lookup waiting to be tried again, each on a timer thread
    of its own, ``nsq-pub-retry-<topic>`` (not the backlog: a publish waiting for its retry
    must not hold up those queued behind it), and the attempts those timers run.

    Producer.close() lets the retries due before its deadline run, on connections still open
    (:meth:`wait`), then, once it is closed, cancels those not due yet (:meth:`cancel`: their
    publishes fail) and joins every timer (:meth:`join`)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        #: the timers not fired yet: each one's publish and what its last attempt failed with
        self._due: dict[threading.Timer, tuple[OuterFuture, BaseException]] = {}
        #: the timers whose thread may be alive (waiting, or running its attempt)
        self._threads: set[threading.Timer] = set()
        self._cancelled = False

    def schedule(
        self,
        delay: float,
        topic: str,
        outer: OuterFuture,
        error: BaseException,
        attempt: Callable[[], None],
    ) -> bool:
        """Run ``attempt`` (the next attempt of ``outer``'s publish to ``topic``, whose last
        one failed with ``error``) in ``delay`` seconds; False, and nothing scheduled, once
        :meth:`cancel` was called."""
        with self._cond:
            if self._cancelled:
                return False
            timer = threading.Timer(delay, self._fire)
            timer.args = (timer, attempt)
            timer.name = f"nsq-pub-retry-{topic}"
            timer.daemon = True
            self._due[timer] = (outer, error)
            self._threads.add(timer)
            # started under the lock, so that join() never finds it made but not started
            timer.start()
        return True

    def _fire(self, timer: threading.Timer, attempt: Callable[[], None]) -> None:
        try:
            with self._cond:
                if self._due.pop(timer, None) is None:
                    return  # cancelled as it fired: its publish failed already
            attempt()
        finally:
            with self._cond:
                self._threads.discard(timer)
                self._cond.notify_all()

    def wait(self, deadline: float) -> bool:
        """Wait until ``deadline`` (a ``time.monotonic()``) for every timer but the caller's
        to have fired and run its attempt, a retry that attempt schedules included; True if
        they have.  (An attempt written to nsqd is then waited for as any publish in flight.)"""
        current = threading.current_thread()
        with self._cond:
            return self._cond.wait_for(
                lambda: not self._threads.difference((current,)),
                max(deadline - time.monotonic(), 0.0),
            )

    def cancel(self) -> list[tuple[OuterFuture, BaseException]]:
        """Schedule nothing more, and stop the timers not fired yet; return their publishes
        (each with its last failure), which the caller fails."""
        with self._cond:
            self._cancelled = True
            due = list(self._due.items())
            self._due.clear()
        for timer, _ in due:
            timer.cancel()
        return [publish for _, publish in due]

    def join(self, deadline: float) -> None:
        """Join every timer thread but the caller's (a done callback may close the Producer
        on one), each until ``deadline`` and at least 0.1 s."""
        current = threading.current_thread()
        with self._cond:
            threads = [t for t in self._threads if t is not current]
        for thread in threads:
            thread.join(max(deadline - time.monotonic(), 0.1))


def _closed_before_retry(error: BaseException) -> ConnectionClosedError:
    """The error of a publish whose retry the Producer's close() cancelled, after ``error``."""
    closed = ConnectionClosedError(
        f"this Producer was closed while the publish waited to be tried again (nothing was"
        f" sent or stored); its last attempt failed: {error}",
        maybe_processed=False,
    )
    closed.__cause__ = error
    return closed


def _after_refusal(command: bytes, endpoints: list[Endpoint] | None) -> None:
    """youzan's nsqd answers an MPUB_EXT it refuses before reading all of it: what it left
    unread would be taken for commands, so that connection is done for."""
    if command.startswith(b"MPUB_EXT ") and endpoints:
        endpoints[0].drop()


def _retryable(exc: BaseException) -> str | None:
    """Why a failed attempt may be tried again (it stored nothing, and a later attempt may
    get through): ``"gone"`` (its leader cannot be reached and nothing was sent, or lookup
    names none for now), ``"lookupd"`` (no lookupd answered), ``"refused"``
    (:func:`refused_unstored`); None when it may not."""
    if isinstance(exc, NoRouteError):
        return "gone" if exc.retryable else None
    if isinstance(exc, ConnectionClosedError):
        return None if exc.maybe_processed else "gone"
    if refused_unstored(exc):
        return "refused"
    if unanswered(exc):
        return "lookupd"
    return None
