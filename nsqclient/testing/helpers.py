"""Helpers for tests of NSQ clients against a broker (embedded or real): publishing over HTTP,
reading nsqd's ``/stats``, waiting for a channel to drain, consuming with a bare Connection.

``node`` arguments are anything with ``http_url`` / ``tcp_address`` (a
:class:`~nsqclient.testing.nodes.Node`).  Every wait is bounded by :data:`TIMEOUT`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

import requests

from .. import protocol
from ..config import Config
from ..conn import Connection
from ..http import NsqdHTTPClient
from .nodes import free_ports
from .waiting import wait_for

__all__ = [
    "TIMEOUT",
    "channel_stats",
    "consume",
    "drained",
    "free_port",
    "message_count",
    "nsq_threads",
    "nsq_threads_gone",
    "nsqd_stats",
    "publish",
    "run_together",
    "topic_stats",
    "wait_drained",
]

#: Seconds: the bound of every wait and request; reached only when something is broken.
TIMEOUT = 10.0


def nsqd_stats(node: Any, **params: str) -> dict[str, Any]:
    """nsqd's ``/stats?format=json`` (with ``params``), fetched with requests."""
    reply = requests.get(
        f"{node.http_url}/stats", params={"format": "json", **params}, timeout=TIMEOUT
    )
    reply.raise_for_status()
    return reply.json()


def topic_stats(node: Any, topic: str) -> dict[str, Any] | None:
    """nsqd's /stats entry for ``topic``, or None."""
    topics = nsqd_stats(node, topic=topic).get("topics") or []
    found = [t for t in topics if t["topic_name"] == topic]
    return found[0] if found else None


def message_count(node: Any, topic: str) -> int:
    """Messages nsqd accepted on ``topic`` since it started (0 for an unknown topic)."""
    stats = topic_stats(node, topic)
    return 0 if stats is None else stats["message_count"]


def publish(node: Any, topic: str, bodies: list[bytes], batch: int = 500) -> None:
    """MPUB ``bodies`` over nsqd's HTTP API, ``batch`` at a time."""
    with NsqdHTTPClient(node.http_url, timeout=TIMEOUT) as http:
        for i in range(0, len(bodies), batch):
            assert http.mpub(topic, bodies[i : i + batch]) == "OK"


def channel_stats(node: Any, topic: str, channel: str) -> dict[str, Any] | None:
    """nsqd's /stats entry for ``topic``/``channel`` (clients included), or None."""
    with NsqdHTTPClient(node.http_url, timeout=TIMEOUT) as http:
        data = http.stats(topic, channel)
    for t in data.get("topics") or []:
        if t["topic_name"] != topic:
            continue
        for c in t.get("channels") or []:
            if c["channel_name"] == channel:
                return c
    return None


def drained(node: Any, topic: str, channel: str, depth: int = 0) -> dict[str, Any] | None:
    """The channel's stats when it holds ``depth`` messages and none in flight or deferred."""
    stats = channel_stats(node, topic, channel)
    if (
        stats is not None
        and stats["depth"] == depth
        and stats["in_flight_count"] == 0
        and stats["deferred_count"] == 0
    ):
        return stats
    return None


def wait_drained(node: Any, topic: str, channel: str, depth: int = 0) -> dict[str, Any]:
    """Wait (up to :data:`TIMEOUT`) until :func:`drained`; return the channel's stats."""
    return wait_for(
        lambda: drained(node, topic, channel, depth),
        TIMEOUT,
        message=lambda: f"channel not drained to {depth}: {channel_stats(node, topic, channel)}",
    )


def consume(node: Any, topic: str, count: int, **options: Any) -> list[bytes]:
    """Subscribe to ``topic`` on channel "check", receive and FIN ``count`` messages, return
    their bodies in the order they came (``options``: the connection's, e.g. ``auth_secret``)."""
    got: list[protocol.DecodedMessage] = []

    class Delegate:
        def on_message(self, conn: Connection, message: protocol.DecodedMessage) -> None:
            got.append(message)

        def on_server_error(self, conn: Connection, error: Exception) -> None:
            pass

        def on_close(self, conn: Connection, reason: BaseException | None) -> None:
            pass

    conn = Connection(node.tcp_address, Config(**options), delegate=Delegate())
    conn.connect()
    try:
        assert conn.request(protocol.sub(topic, "check")).result(TIMEOUT) == b"OK"
        conn.send(protocol.rdy(min(max(count, 1), 2500)))
        wait_for(
            lambda: len(got) >= count,
            TIMEOUT,
            message=lambda: f"consumed {len(got)} of {count} messages from {topic}",
        )
        for message in got:
            conn.send(protocol.fin(message.id))
    finally:
        conn.close(timeout=TIMEOUT)
    return [m.body for m in got]


def free_port() -> int:
    """A loopback TCP port nobody listens on (free a moment ago); several at once that differ:
    :func:`~nsqclient.testing.nodes.free_ports`."""
    return free_ports(1)[0]


def nsq_threads() -> set[threading.Thread]:
    """Live threads named like the library's (the embedded broker's loop excluded)."""
    return {
        t
        for t in threading.enumerate()
        if t.name.startswith("nsq-") and not t.name.startswith("nsq-embedded")
    }


def nsq_threads_gone(
    before: Iterable[threading.Thread] = (), within: float = 1.0, left: Iterable[str] = ()
) -> None:
    """Wait up to ``within`` seconds until no thread whose name starts with ``nsq`` is alive,
    but the embedded broker's (``nsq-embedded-*``), those in ``before`` (a snapshot taken
    before the test started its clients: a fixture's servers) and those a test leaves on
    purpose (names starting with one of ``left``).  Polls: returns as soon as they are gone.

    Raises:
        AssertionError: naming the threads still alive after ``within`` seconds.
    """
    kept = set(before)
    prefixes = ("nsq-embedded-", *left)

    def alive() -> list[str]:
        return sorted(
            t.name
            for t in threading.enumerate()
            if t.name.startswith("nsq") and t not in kept and not t.name.startswith(prefixes)
        )

    wait_for(
        lambda: not alive(),
        within,
        0.005,
        lambda: f"nsq threads alive {within:g}s after stop()/close(): {alive()}",
    )


def run_together(
    work: Callable[[int], None], threads: int, name: str, timeout: float = TIMEOUT * 3
) -> None:
    """Run ``work(0)`` ... ``work(threads - 1)`` on as many threads, released at once by a
    barrier; join them within ``timeout`` seconds and re-raise the first failure.

    AssertionError if a thread is still running after ``timeout``.
    """
    barrier = threading.Barrier(threads, timeout=TIMEOUT)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait()
            work(i)
        except BaseException as exc:  # handed to the calling thread below
            errors.append(exc)

    workers = [
        threading.Thread(target=run, args=(i,), name=f"{name}-{i}", daemon=True)
        for i in range(threads)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout)
    assert not any(w.is_alive() for w in workers), f"{name} threads still running"
    if errors:
        raise AssertionError(f"{len(errors)} of {threads} {name} threads failed") from errors[0]
