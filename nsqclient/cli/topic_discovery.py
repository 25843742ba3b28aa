"""Which topics ``nsqclient to-file`` archives, as ``nsq_to_file`` chooses them.

With ``--topic``: those topics, less any that ``--topic-pattern`` (when given) does not match.
Without ``--topic``: every topic that nsqlookupd lists (``GET /topics`` on each
``--lookupd-http-address``) and the pattern matches, looked up at start and again every
``--topic-refresh``, so that a topic created later is archived from then on.

The pattern is a regular expression searched anywhere in the name, as Go's
``regexp.MatchString`` does (anchor it with ``^...$`` to match whole names).  Each topic gets
one archiver (made by the caller's factory), started at once; a topic is never dropped while
the tool runs.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Generic, Protocol, TypeVar

from ..consumer import Consumer
from ..errors import HTTPError
from ..http import LookupdClient
from .common import UsageError, describe_error

__all__ = ["Archiver", "topic_matcher", "TopicDiscoverer"]

logger = logging.getLogger("nsqclient.cli.topic_discovery")


class Archiver(Protocol):
    """What the discoverer needs of the archiver of one topic."""

    @property
    def consumer(self) -> Consumer: ...

    def start(self) -> None: ...


A = TypeVar("A", bound=Archiver)


def topic_matcher(pattern: str | None) -> Callable[[str], bool]:
    """A test of topic names for ``--topic-pattern`` (every name passes without one); a pattern
    that is not a regular expression is a usage error."""
    if not pattern:
        return lambda topic: True
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise UsageError(
            f"--topic-pattern {pattern!r} is not a regular expression: {exc}"
        ) from None
    return lambda topic: compiled.search(topic) is not None


class TopicDiscoverer(Generic[A]):
    """The archivers of the topics chosen so far, and the thread that looks for new ones.

    Args:
        make: the archiver of a topic (not started); may raise (the topic is then skipped, to
            be tried again at the next refresh).
        allowed: whether a topic name is to be archived (see :func:`topic_matcher`).
        lookupds: where to list topics; empty: only the topics given to :meth:`start`.
        refresh: seconds between two listings.
    """

    def __init__(
        self,
        make: Callable[[str], A],
        allowed: Callable[[str], bool],
        lookupds: Sequence[LookupdClient],
        refresh: float,
    ):
        self._make = make
        self._allowed = allowed
        self._lookupds = list(lookupds)
        self._refresh = refresh
        self._archivers: dict[str, A] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, topics: Iterable[str]) -> None:
        """Archive ``topics`` (those allowed; an archiver that cannot be made or started raises
        here); with lookupds, also list topics now and every ``refresh`` seconds on a thread of
        its own until :meth:`close`."""
        self.add(topics, strict=True)
        if self._lookupds:
            self._thread = threading.Thread(
                target=self._run, name="nsq-to-file-topic-discovery", daemon=True
            )
            self._thread.start()

    def archivers(self) -> list[A]:
        """The archivers made so far, in the order their topics were found."""
        with self._lock:
            return list(self._archivers.values())

    def consumers(self) -> list[Consumer]:
        return [a.consumer for a in self.archivers()]

    def add(self, topics: Iterable[str], strict: bool = False) -> list[str]:
        """Make and start an archiver for each of ``topics`` that is allowed and has none yet
        (nothing after :meth:`close`); the topics added.  An archiver that cannot be made is
        logged and skipped (tried again at the next refresh), or, when ``strict``, raises."""
        added = []
        with self._lock:  # held while starting, so that close() sees every archiver made
            for topic in dict.fromkeys(topics):
                if self._closed.is_set():
                    break
                if topic in self._archivers:
                    continue
                if not self._allowed(topic):
                    logger.debug("skipping topic %s: it does not match --topic-pattern", topic)
                    continue
                try:
                    archiver = self._make(topic)
                    archiver.start()
                except Exception as exc:  # a name nsqd took but we cannot use, a bug
                    if strict:
                        raise
                    logger.error("cannot archive topic %s: %s", topic, exc)
                    continue
                self._archivers[topic] = archiver
                added.append(topic)
        for topic in added:
            logger.info("archiving topic %s", topic)
        return added

    def list_topics(self) -> list[str] | None:
        """Every topic the lookupds list (their union); None when none of them answered."""
        topics: dict[str, None] = {}
        answered = False
        for lookupd in self._lookupds:
            try:
                topics.update(dict.fromkeys(lookupd.topics()))
                answered = True
            except (HTTPError, ValueError) as exc:
                logger.error(
                    "cannot list the topics of nsqlookupd %s: %s",
                    lookupd.base_url,
                    describe_error(exc),
                )
        return list(topics) if answered else None

    def refresh(self) -> list[str]:
        """List the topics now and archive the new ones; the topics added."""
        topics = self.list_topics()
        return self.add(topics) if topics else []

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                self.refresh()
            except Exception:  # never let the thread die: the next refresh may work
                logger.exception("topic discovery failed")
            self._closed.wait(self._refresh)

    def close(self, timeout: float) -> list[A]:
        """Look for topics no more (waiting up to ``timeout`` seconds for a listing under
        way); every archiver made, none to be added after this."""
        with self._lock:
            self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.warning("topic discovery did not stop within %.0fs", timeout)
        return self.archivers()
