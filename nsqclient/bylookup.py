"""Publishing by lookup: a Producer's routed publishes (``lookupd_http_addresses``, youzan's
partitions, keys, tracing and ext headers).

For each topic the Producer asks nsqlookupd where to publish (:class:`~nsqclient.router.Router`
keeps the answer) and sends each publish to its partition's leader.  A publish the route turned
out stale for is retried after a fresh lookup: a refusal naming a moved leader
(E_FAILED_ON_NOT_LEADER, _NOT_WRITABLE, E_TOPIC_NOT_EXIST) at most ``leader_retries`` times; a
leader that is gone (cannot be reached, nothing sent; or lookupd names none while youzan
replaces it) until the publish's timeout.  Traced publishes answer a :class:`PublishResult`.

:class:`RoutedPublishing` holds these methods of :class:`~nsqclient.producer.Producer` (a mixin:
the state it works on is the Producer's, annotated here).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from .config import Config
from .errors import (
    ConnectionClosedError,
    FailedOnNotLeaderError,
    FailedOnNotWritableError,
    NoRouteError,
    NSQTimeoutError,
    ServerError,
    TopicNotExistError,
)
from .observe import PublishEvent
from .partitions import key_bytes
from .publishes import Build, PublishResult, traced_result
from .router import Router

if TYPE_CHECKING:
    from .backlog import Backlog
    from .endpoint import Endpoint
    from .outer import OuterFutures

__all__ = ["RoutedPublishing"]

logger = logging.getLogger("nsqclient.producer")
trace_logger = logging.getLogger("nsqclient.trace")

#: youzan's answers that mean "lookup is stale": refresh the route and try again
_STALE_ROUTE = (FailedOnNotLeaderError, FailedOnNotWritableError, TopicNotExistError)


class RoutedPublishing:
    """The routed-publishing methods of :class:`~nsqclient.producer.Producer`."""

    # The Producer's state and methods these use, set up by Producer.__init__.
    config: Config
    _router: Router | None
    _closed: bool
    _backlog: Backlog
    _publish: Callable[..., bytes]
    _submit: Callable[..., Any]
    _submit_live: Callable[..., Future | None]
    _submit_backlogged: Callable[..., Future]
    _submit_until: Callable[..., Future]
    _slot: Callable[[str], Endpoint]
    _outers: OuterFutures

    def _target(
        self, topic: str, partition: int | None, key: bytes | str | int | None
    ) -> tuple[int | None, list[Endpoint] | None]:
        """The partition and the slots (in order of preference) of one publish."""
        if self._router is None:
            if key is not None:
                raise ValueError(
                    "key= needs lookupd_http_addresses: the partition count comes from lookup"
                )
            return partition, None
        p, address = self._router.choose(topic, partition, key)
        if p is not None:
            return p, [self._slot(address)]
        # classic topic: the chosen nsqd first, the others it is on to fail over to
        route = self._router.route(topic)
        others = [self._slot(a) for a in route.nsqd if a != address]
        return None, [self._slot(address), *others]

    def _retry_delay(
        self, topic: str, exc: BaseException, retries: int, attempted_at: float
    ) -> float | None:
        """Seconds to wait before retrying a routed publish that failed with ``exc`` after
        ``retries`` retries, or None when it must not be retried.  ``attempted_at`` (the
        router's clock when the failed attempt took its route): only a route fetched before
        then is thrown away.

        A leader being replaced (lookup names none for the partition, or its nsqd cannot be
        reached and nothing was sent) is retried until the publish's deadline, waiting 0.1 s
        doubling up to 1 s; a refusal that names a stale route (NOT_LEADER, NOT_WRITABLE,
        TOPIC_NOT_EXIST) at most ``leader_retries`` times, waiting 0.1 s doubling."""
        if self._router is None or self._closed:
            return None
        if _leader_gone(exc):
            delay = min(0.1 * 2**retries, 1.0)
        elif isinstance(exc, _STALE_ROUTE) and retries < self.config.leader_retries:
            delay = 0.1 * 2**retries
        else:
            return None
        self._router.invalidate(topic, fetched_before=attempted_at)
        logger.info("publish to %s failed (%s); looking it up again in %.1fs", topic, exc, delay)
        return delay

    def _publish_routed(
        self,
        topic: str,
        build: Build,
        traced: bool,
        timeout: float | None,
        partition: int | None,
        key: bytes | str | int | None,
        event: PublishEvent | None = None,
    ) -> PublishResult | None:
        timeout = self.config.pub_timeout if timeout is None else timeout
        started = time.monotonic()
        deadline = started + timeout
        if key is not None:
            key_bytes(key)  # a bad key raises before any I/O
        retries = 0
        clock = time.monotonic if self._router is None else self._router.now
        while True:
            attempted_at = clock()
            try:
                p, slots = self._target(topic, partition, key)
                command = build(p)
                if event is not None:
                    event.partition = p
                try:
                    reply = self._publish(command, timeout, slots, deadline, event)
                except ServerError:
                    self._after_refusal(command, slots)
                    raise
            except (NoRouteError, ConnectionClosedError, *_STALE_ROUTE) as exc:
                delay = self._retry_delay(topic, exc, retries, attempted_at)
                if delay is None:
                    raise
                if time.monotonic() + delay >= deadline:
                    if _leader_gone(exc):
                        raise NSQTimeoutError(
                            f"no leader of {topic!r} could be reached within {timeout:g}s"
                            f" (nothing was sent): {exc}",
                            maybe_processed=False,
                        ) from exc
                    raise
                retries += 1
                time.sleep(delay)  # a retry's backoff, bounded by the deadline
                continue
            if not traced:
                return None
            address = slots[0].address if slots else ""
            return traced_result(topic, p, address, reply, started)

    def _submit_routed(
        self,
        topic: str,
        build: Build,
        traced: bool,
        partition: int | None,
        key: bytes | str | int | None,
    ) -> Future:
        """An asynchronous publish that follows lookup.  The first attempt runs on the calling
        thread when the topic's route is cached and its nsqd connected, otherwise on the
        backlog thread; retries after a stale-route answer run on a timer thread."""
        if key is not None:
            key_bytes(key)
        if self._closed:
            raise ConnectionClosedError("this Producer is closed", maybe_processed=False)
        router = self._router
        clock = time.monotonic if router is None else router.now
        started = time.monotonic()
        deadline = started + self.config.pub_timeout
        outer = self._outers.track(deadline)

        def attempt(retries: int, inline: bool = False) -> bool:
            """One attempt; False when ``inline`` and it cannot go without blocking."""
            attempted_at = clock()
            try:
                if inline and router is not None and router.cached(topic) is None:
                    return False
                p, slots = self._target(topic, partition, key)
                command = build(p)
                inner: Future | None
                if not self._outers.may_send(outer):
                    return True  # past its deadline: failed, and nothing may be sent now
                if inline:
                    inner = self._submit_live(command, slots)
                    if inner is None:
                        outer.sent = False  # not sent after all
                        return False
                elif retries == 0:
                    inner = self._submit_backlogged(command, deadline, slots)
                else:
                    inner = self._submit_until(command, deadline, slots)
            except (ValueError, TypeError) as exc:
                if inline:
                    raise  # bad input: at the call site
                self._outers.settle(outer, error=exc)
                return True
            except BaseException as exc:
                failed(exc, retries, attempted_at)
                return True
            outer.inner = inner  # for OuterFutures.expire
            address = slots[0].address if slots else ""
            inner.watch(  # type: ignore[attr-defined]
                lambda f: answered(f, p, address, retries, command, slots, attempted_at)
            )
            return True

        def answered(
            inner: Future,
            p: int | None,
            address: str,
            retries: int,
            command: bytes,
            slots: list[Endpoint] | None,
            attempted_at: float,
        ) -> None:
            # where this attempt went, for whoever reads the Future (the last attempt's)
            outer.nsqd_address = getattr(inner, "nsqd_address", None) or address
            outer.partition = p
            exc = inner.exception()
            if exc is not None:
                if isinstance(exc, ServerError):
                    self._after_refusal(command, slots)
                failed(exc, retries, attempted_at)
            elif traced:
                try:
                    self._outers.settle(
                        outer, traced_result(topic, p, address, inner.result(), started)
                    )
                except Exception as error:
                    self._outers.settle(outer, error=error)
            else:
                self._outers.settle(outer, inner.result())

        def failed(exc: BaseException, retries: int, attempted_at: float) -> None:
            delay = self._retry_delay(topic, exc, retries, attempted_at)
            if delay is None:
                self._outers.settle(outer, error=exc)
                return
            if time.monotonic() + delay >= deadline and _leader_gone(exc):
                self._outers.settle(
                    outer,
                    error=NSQTimeoutError(
                        f"no leader of {topic!r} could be reached within pub_timeout"
                        f" ({self.config.pub_timeout:g}s; nothing was sent): {exc}",
                        maybe_processed=False,
                    ),
                )
                return
            timer = threading.Timer(delay, attempt, (retries + 1,))
            timer.name = f"nsq-pub-retry-{topic}"
            timer.daemon = True
            timer.start()

        def first_attempt() -> None:
            attempt(0)

        try:
            if self._backlog.jobs or not attempt(0, inline=True):
                self._backlog.submit(first_attempt)
        except BaseException:
            self._outers.forget(outer)
            raise
        return outer

    def _after_refusal(self, command: bytes, slots: list[Endpoint] | None) -> None:
        """youzan's nsqd answers an MPUB_EXT it refuses before reading all of it: what it
        left unread would be taken for commands, so that connection is done for."""
        if command.startswith(b"MPUB_EXT ") and slots:
            slots[0].drop()


def _leader_gone(exc: BaseException) -> bool:
    """A routed publish failed because its nsqd is gone or not yet replaced, and nothing was
    sent: lookup names no leader for the partition (for now), or its nsqd cannot be reached."""
    if isinstance(exc, NoRouteError):
        return exc.retryable
    return isinstance(exc, ConnectionClosedError) and not exc.maybe_processed
