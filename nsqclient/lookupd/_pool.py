"""The nsqlookupds a Consumer or Producer asks, in the order it asks them.

A :class:`LookupdPool` keeps one :class:`~nsqclient.http.LookupdClient` per nsqlookupd, learns
the other members of a youzan cluster from ``/listlookup``, and demotes a lookupd that keeps
failing: after ``DEMOTE_AFTER`` failures in a row it is skipped for a while (growing with each
further failure, at most ``MAX_DEMOTION`` seconds), unless it is the only one not demoted: one
lookupd is always asked.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..errors import NSQError
from ..http import HTTPError, LookupdClient, TopicNotFoundError

__all__ = ["LookupdPool", "UnusableAnswerError", "demotion_delay", "is_answer", "unanswered"]

logger = logging.getLogger("nsqclient.lookup")

T = TypeVar("T")

#: failures in a row before a lookupd is demoted
DEMOTE_AFTER = 3
#: seconds a lookupd stays demoted after DEMOTE_AFTER failures; doubles with each further one
FIRST_DEMOTION = 5.0
#: the longest demotion, seconds
MAX_DEMOTION = 300.0


def demotion_delay(failures: int) -> float:
    """Seconds a lookupd that failed ``failures`` times in a row is skipped (0: not demoted)."""
    if failures < DEMOTE_AFTER:
        return 0.0
    return min(FIRST_DEMOTION * 2 ** (failures - DEMOTE_AFTER), MAX_DEMOTION)


class UnusableAnswerError(NSQError):
    """No lookupd gave an answer that could be used (the last one answered something that is
    not a lookup's shape): :meth:`LookupdPool.first` raises it."""


def is_answer(exc: HTTPError) -> bool:
    """True when the lookupd itself answered with an error about the request (bad topic,
    youzan's "Topic has no channel"): asking another lookupd would get the same answer."""
    if isinstance(exc, TopicNotFoundError) or 400 <= exc.status < 500:
        return True
    return exc.status == 500 and "no channel" in exc.message.lower()


def unanswered(exc: BaseException) -> bool:
    """True for what :meth:`LookupdPool.first` raises when no lookupd answered the request
    itself: none could be reached, none answered in time, a 5xx, or an answer that cannot be
    used.  Asking again later may get an answer; an :func:`is_answer` error would not."""
    if isinstance(exc, HTTPError):
        return not is_answer(exc)
    return isinstance(exc, UnusableAnswerError)


class LookupdPool:
    """Several nsqlookupds, asked healthiest first.

    Args:
        addresses: the HTTP addresses the user gave (``"host:4161"`` or ``"http://host:4161"``).
        timeout: seconds for each HTTP request.
        clock: the monotonic clock (tests pass their own).
    """

    def __init__(
        self,
        addresses: Sequence[str],
        timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._clients: dict[str, LookupdClient] = {}
        self._failures: dict[str, int] = {}
        self._demoted_until: dict[str, float] = {}
        #: the last error answer of each lookupd to lookup_each, logged once while it repeats
        self._refusals: dict[str, str] = {}
        #: False once a lookupd answered /listlookup with "not supported" (classic nsqlookupd)
        self._listlookup_supported = True
        for address in addresses:
            self._add(address)

    def __len__(self) -> int:
        return len(self._clients)

    def __repr__(self) -> str:
        return f"<LookupdPool {self.addresses()}>"

    def _add(self, address: str) -> bool:
        client = LookupdClient(address, timeout=self._timeout)
        if client.base_url in (c.base_url for c in self._clients.values()):
            client.close()
            return False
        self._clients[address] = client
        return True

    def addresses(self) -> list[str]:
        """Every lookupd known, the user's first, then those learnt from /listlookup."""
        with self._lock:
            return list(self._clients)

    def candidates(self) -> list[LookupdClient]:
        """The lookupds to ask now, in order: those not demoted (never none, as
        :meth:`failed` never demotes the last of them)."""
        now = self._clock()
        with self._lock:
            return [c for a, c in self._clients.items() if self._demoted_until.get(a, 0.0) <= now]

    def _address_of(self, client: LookupdClient) -> str | None:
        for address, c in self._clients.items():
            if c is client:
                return address
        return None

    def succeeded(self, client: LookupdClient) -> None:
        with self._lock:
            address = self._address_of(client)
            if address is None:
                return
            self._demoted_until.pop(address, None)
            if self._failures.pop(address, None):
                logger.info("lookupd %s answers again", address)

    def failed(self, client: LookupdClient, exc: BaseException) -> None:
        """Count a failure; demote the lookupd after DEMOTE_AFTER in a row, unless it is
        the only one not demoted."""
        now = self._clock()
        with self._lock:
            address = self._address_of(client)
            if address is None:
                return
            failures = self._failures.get(address, 0) + 1
            self._failures[address] = failures
            if failures == 1:
                logger.warning(
                    "lookupd %s: %s (said once until it answers again)", client.base_url, exc
                )
            else:
                logger.debug("lookupd %s still failing: %s", client.base_url, exc)
            delay = demotion_delay(failures)
            others = [
                a for a in self._clients if a != address and self._demoted_until.get(a, 0.0) <= now
            ]
            if delay and others:
                first = address not in self._demoted_until
                self._demoted_until[address] = now + delay
                logger.log(
                    logging.INFO if first else logging.DEBUG,
                    "lookupd %s failed %d times in a row; asking the others first for %.0fs",
                    address,
                    failures,
                    delay,
                )

    def lookup_each(
        self, topic: str, access: str | None = None, metainfo: bool = False
    ) -> list[tuple[str, dict[str, Any]]]:
        """Ask every candidate; return ``(lookupd base URL, answer)`` of those that answered
        (an unknown topic answers as empty).  Failures are logged and counted, never raised."""
        results = []
        for client in self.candidates():
            try:
                results.append((client.base_url, client.lookup(topic, access, metainfo)))
            except TopicNotFoundError:
                self.succeeded(client)
                results.append((client.base_url, {"channels": [], "producers": []}))
                continue
            except HTTPError as exc:
                if is_answer(exc):
                    # It works and refused the request (as first() sees it): not an outage.
                    self.succeeded(client)
                    self._log_refusal(client.base_url, topic, exc)
                else:
                    self.failed(client, exc)
                continue
            except (NSQError, ValueError, TypeError) as exc:
                self.failed(client, exc)
                continue
            self.succeeded(client)
            if self._refusals:
                with self._lock:
                    self._refusals.pop(client.base_url, None)
        return results

    def _log_refusal(self, base_url: str, topic: str, exc: HTTPError) -> None:
        """A lookupd's error answer: WARNING the first time, DEBUG while it repeats it."""
        with self._lock:
            repeated = self._refusals.get(base_url) == exc.message
            self._refusals[base_url] = exc.message
        logger.log(
            logging.DEBUG if repeated else logging.WARNING,
            "lookupd %s refused the lookup of %r: %s",
            base_url,
            topic,
            exc,
        )

    def first(self, ask: Callable[[LookupdClient], T]) -> T:
        """``ask(client)`` of the healthiest lookupd that answers.

        A lookupd that answers with an error about the request itself (TopicNotFoundError,
        another 4xx, youzan's "Topic has no channel") ends the search: that error is raised.
        When none answers, the last lookupd's error (HTTPError, or UnusableAnswerError) is
        raised."""
        error: HTTPError | UnusableAnswerError | None = None
        for client in self.candidates():
            try:
                result = ask(client)
            except HTTPError as exc:
                if is_answer(exc):
                    self.succeeded(client)  # it answered: the answer is for the caller
                    raise
                self.failed(client, exc)
                error = exc
                continue
            except (ValueError, TypeError) as exc:
                self.failed(client, exc)
                error = UnusableAnswerError(
                    f"lookupd {client.base_url} answered something unusable: {exc}"
                )
                continue
            self.succeeded(client)
            return result
        assert error is not None
        raise error

    def refresh_members(self) -> list[str]:
        """Ask a lookupd for every member of its cluster (youzan's ``/listlookup``) and add
        the new ones.  Returns the addresses added.  Classic nsqlookupd has no such endpoint:
        after its first "not supported" answer this does nothing."""
        if not self._listlookup_supported:
            return []
        for client in self.candidates():
            try:
                members = client.listlookup()
            except HTTPError as exc:
                if exc.status in (0, 500, 502, 503, 504):
                    continue  # unreachable or broken: another one may answer
                self._listlookup_supported = False
                logger.debug("lookupd %s has no /listlookup: %s", client.base_url, exc)
                return []
            added = []
            with self._lock:
                for member in members:
                    if self._add(member):
                        added.append(member)
            if added:
                logger.info("learnt lookupds %s from %s", added, client.base_url)
            return added
        return []

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                client.close()
