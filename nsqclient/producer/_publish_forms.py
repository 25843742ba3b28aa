"""What a publish beyond a classic PUB sends and what it answers.

youzan's forms of a publish (a partition on the wire, ``PUB_TRACE``/``MPUB_TRACE`` with trace
ids, ``PUB_EXT``/``MPUB_EXT`` with JSON headers) and a DPUB by lookup are built by a *builder*:
``build(partition) -> bytes``, run once the publish knows its partition (it may learn it from
lookup, and again on a retry).  The input is checked when the builder is made, at the call.
A traced publish answers a :class:`PublishResult` (:func:`traced_result`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from .. import protocol
from ..checks import check_int
from ._router import Router

__all__ = [
    "TRACE_ID_KEY",
    "Build",
    "Plan",
    "PublishResult",
    "check_not_partitioned",
    "dpub_builder",
    "mpub_builder",
    "pub_builder",
    "traced_result",
]

trace_logger = logging.getLogger("nsqclient.trace")

#: Builds a publish command for a partition (None: no partition on the wire).
Build = Callable[[int | None], bytes]

#: the key of a youzan message header that carries the trace id (a decimal string)
TRACE_ID_KEY = "##trace_id"


@dataclasses.dataclass(frozen=True)
class PublishResult:
    """youzan's answer to a traced publish (``PUB_TRACE``/``MPUB_TRACE``).

    Attributes:
        message_id: nsqd's internal id of the message (an MPUB: of its first message); the
            partition is in its top bits (``partition << 50``).
        trace_id: the trace id sent (MPUB_TRACE answers 0).
        offset: where the message starts in the partition's disk queue, bytes.
        raw_size: bytes it takes there (an MPUB: the whole batch); the next message of the
            partition starts at ``offset + raw_size``.
        partition: the partition it went to (None when none was named on the wire).
        nsqd_address: ``"host:port"`` of the nsqd that stored it ("" when not known).
    """

    message_id: int
    trace_id: int
    offset: int
    raw_size: int
    partition: int | None
    nsqd_address: str


@dataclasses.dataclass(slots=True)
class Plan:
    """One publish, its input checked and encoded, before it is sent: what every form of
    publish (PUB, MPUB, DPUB; youzan's) hands the Producer's one publish path.

    It goes as ``wire`` on a given address when it has no ``build`` (classic NSQ, no lookup),
    else by lookup with ``build``.  ``rebuild(ext)`` makes ``build`` and ``traced`` again with
    an ext header (None: no header can be added, DPUB or a classic publish); ``headers``: the
    form takes one the topic's route allows (False for a traced MPUB, which answers no trace
    result with headers).

    Attributes beyond those: ``command`` (``"PUB"``, ``"MPUB"``, ``"DPUB"``), ``topic``,
    ``count`` and ``body_size`` (None for MPUB), for the observers' event; ``partition``,
    ``key``, ``ext`` as given.
    """

    command: str
    topic: str
    count: int
    body_size: int | None
    wire: bytes | None = None
    build: Build | None = None
    traced: bool = False
    partition: int | None = None
    key: bytes | str | int | None = None
    ext: dict[str, Any] | None = None
    rebuild: Callable[[dict[str, Any] | None], tuple[Build, bool]] | None = None
    headers: bool = True

    def with_ext(self, ext: dict[str, Any] | None) -> None:
        """Carry the ext header ``ext`` (an observer's, at ``publish_started``)."""
        assert self.rebuild is not None
        self.build, self.traced = self.rebuild(ext)


def pub_builder(
    router: Router | None,
    tracing: bool,
    topic: str,
    body: protocol.Body,
    partition: int | None,
    trace_id: int | None,
    ext: dict[str, Any] | None,
) -> tuple[Build, bool]:
    """The command builder of one PUB-like publish, and whether it is traced (``trace_id``
    given, or ``tracing``: the Producer traces every publish).  The command is checked here;
    ext headers are checked against the topic's route by the builder, once the publish has
    its route (see :func:`_checking_ext`)."""
    traced = trace_id is not None or tracing
    build: Build
    if ext is not None:
        ext = _traced_header(ext, (trace_id or 0) if traced else None)

        def build(p: int | None) -> bytes:
            return protocol.pub_ext(topic, protocol.to_bytes(body), ext, p)

    elif traced:
        tid = 0 if trace_id is None else trace_id

        def build(p: int | None) -> bytes:
            return protocol.pub_trace(topic, protocol.to_bytes(body), tid, p)

    else:

        def build(p: int | None) -> bytes:
            return protocol.pub(topic, body, p)

    build(partition)  # bad topic, body, partition or ext raise here
    return _checking_ext(router, topic, ext, build), traced


def mpub_builder(
    router: Router | None,
    tracing: bool,
    topic: str,
    bodies: Sequence[protocol.Body],
    partition: int | None,
    trace_id: int | Sequence[int] | None,
    ext: dict[str, Any] | None,
) -> tuple[Build, bool]:
    """:func:`pub_builder` for MPUB and its traced and extended forms."""
    traced = trace_id is not None or tracing
    if traced and ext is not None and not (trace_id is None or isinstance(trace_id, int)):
        raise ValueError("an MPUB with ext headers takes one trace id for every message")
    protocol.check_body_list(bodies, "MPUB")
    items = [protocol.to_bytes(b) for b in bodies]
    build: Build
    if ext is not None:
        tid = (trace_id or 0) if traced else None
        exts = [_traced_header(ext, tid)] * len(items)  # type: ignore[arg-type]

        def build(p: int | None) -> bytes:
            return protocol.mpub_ext(topic, items, exts, p)

    elif traced:
        if trace_id is None or isinstance(trace_id, int):
            ids = [trace_id or 0] * len(items)
        else:
            ids = list(trace_id)

        def build(p: int | None) -> bytes:
            return protocol.mpub_trace(topic, items, ids, p)

    else:

        def build(p: int | None) -> bytes:
            return protocol.mpub(topic, items, p)

    build(partition)
    return _checking_ext(router, topic, ext, build), traced


def dpub_builder(router: Router, topic: str, command: bytes) -> Build:
    """The builder of a DPUB by lookup (``command``, already checked): the topic must not be
    partitioned, which its route (cached by the time a builder runs) says."""

    def build(p: int | None) -> bytes:
        check_not_partitioned(router, topic)
        return command

    return build


def check_not_partitioned(router: Router, topic: str) -> None:
    """ValueError when lookup says ``topic`` is partitioned: youzan's nsqd has no DPUB."""
    if router.route(protocol.check_topic_name(topic)).partitioned:
        raise ValueError(
            f"topic {topic!r} is partitioned (youzan's NSQ), which has no deferred publish (DPUB)"
        )


def traced_result(
    topic: str, partition: int | None, address: str, reply: bytes, started: float
) -> PublishResult | None:
    """The :class:`PublishResult` of a traced publish answered ``reply`` by the nsqd at
    ``address`` (None for a plain OK), logged at INFO on ``nsqclient.trace`` with the
    milliseconds since ``started`` (a ``time.monotonic()``)."""
    if reply == protocol.OK:
        # youzan answers an MPUB_EXT whose headers carry trace ids with a plain OK
        trace_logger.info("traced publish to %s answered a plain OK (no ids)", topic)
        return None
    decoded = protocol.decode_trace_reply(reply)
    result = PublishResult(
        decoded.internal_id,
        decoded.trace_id,
        decoded.offset,
        decoded.raw_size,
        partition,
        address,
    )
    trace_logger.info(
        "PUB_TRACE topic=%s partition=%s nsqd=%s message_id=%d trace_id=%d offset=%d"
        " raw_size=%d elapsed_ms=%.2f",
        topic,
        partition,
        address,
        result.message_id,
        result.trace_id,
        result.offset,
        result.raw_size,
        (time.monotonic() - started) * 1000,
    )
    return result


def _checking_ext(
    router: Router | None, topic: str, ext: dict[str, Any] | None, build: Build
) -> Build:
    """``build``, first checking that the topic takes ext headers, when there are some:
    youzan's nsqd answers others with an error, and an MPUB_EXT refused midway leaves the
    stream unusable.  A builder runs once the publish has its route (it is cached)."""
    if ext is None or router is None:
        return build

    def checked(p: int | None) -> bytes:
        route = router.route(topic)
        if route.partitioned and not route.extend_support:
            raise ValueError(
                f"topic {topic!r} was not created with extend support: publish it without ext="
            )
        return build(p)

    return checked


def _traced_header(ext: dict[str, Any], trace_id: int | None) -> dict[str, Any]:
    """``ext`` with the trace id in it (youzan traces PUB_EXT through its header)."""
    if not isinstance(ext, dict):
        raise TypeError(f"ext must be a dict of JSON headers, not {type(ext).__name__}")
    if trace_id is None:
        return ext
    return {**ext, TRACE_ID_KEY: str(check_int(trace_id, "trace id", min=0, max=2**64 - 1))}
