"""The names nsqclient's OpenTelemetry instrumentation emits: span names, attribute keys, metric
names and units, and the small helpers that turn nsqclient's values into attribute values.

Everything standard comes from OpenTelemetry's messaging semantic conventions (the ``send``
operation type, ``messaging.client.sent.messages``...); what only NSQ has is under ``nsq.``.
Nothing here imports OpenTelemetry.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "SYSTEM",
    "SYSTEM_NAME",
    "DESTINATION",
    "CONSUMER_GROUP",
    "PARTITION",
    "OPERATION_TYPE",
    "OPERATION_NAME",
    "MESSAGE_ID",
    "BODY_SIZE",
    "BATCH_COUNT",
    "SERVER_ADDRESS",
    "SERVER_PORT",
    "ERROR_TYPE",
    "NSQ_COMMAND",
    "NSQ_ATTEMPTS",
    "NSQ_YOUZAN_TRACE_ID",
    "NSQ_YOUZAN_OFFSET",
    "NSQ_REQUEUE_DELAY",
    "NSQ_REQUEUE_BACKOFF",
    "NSQ_MAX_TRIES",
    "EVENT_FINISH",
    "EVENT_REQUEUE",
    "EVENT_TOUCH",
    "EVENT_GIVE_UP",
    "ERROR_REQUEUED",
    "ERROR_GIVEN_UP",
    "SENT_MESSAGES",
    "CONSUMED_MESSAGES",
    "OPERATION_DURATION",
    "PROCESS_DURATION",
    "OUT_OF_ORDER",
    "DURATION_BUCKETS",
    "split_address",
    "add_server",
    "error_type",
    "message_id",
    "body_size",
]

# ------------------------------------------------------------------ semantic conventions

SYSTEM = "messaging.system"
SYSTEM_NAME = "nsq"
DESTINATION = "messaging.destination.name"
CONSUMER_GROUP = "messaging.consumer.group.name"
PARTITION = "messaging.destination.partition.id"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
MESSAGE_ID = "messaging.message.id"
BODY_SIZE = "messaging.message.body.size"
BATCH_COUNT = "messaging.batch.message_count"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"

#: metric names (instrument kind, unit)
SENT_MESSAGES = "messaging.client.sent.messages"  # counter, {message}
CONSUMED_MESSAGES = "messaging.client.consumed.messages"  # counter, {message}
OPERATION_DURATION = "messaging.client.operation.duration"  # histogram, s
PROCESS_DURATION = "messaging.process.duration"  # histogram, s

#: youzan, ordered consumption: messages whose offset went backwards on their partition
OUT_OF_ORDER = "nsq.consumer.out_of_order"  # counter, {message}

#: the bucket boundaries the conventions advise for messaging durations (seconds)
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)

# ------------------------------------------------------------------ NSQ's own

#: the wire command family of a publish: PUB, MPUB or DPUB
NSQ_COMMAND = "nsq.command"
#: delivery attempts of a message, this one included (1 on first delivery)
NSQ_ATTEMPTS = "nsq.message.attempts"
#: youzan: the message's trace id (youzan's own tracing, not OpenTelemetry's), when not 0
NSQ_YOUZAN_TRACE_ID = "nsq.youzan.trace_id"
#: youzan, ordered consumption: the message's disk queue offset
NSQ_YOUZAN_OFFSET = "nsq.youzan.offset"
NSQ_REQUEUE_DELAY = "nsq.requeue.delay"
NSQ_REQUEUE_BACKOFF = "nsq.requeue.backoff"
NSQ_MAX_TRIES = "nsq.max_tries"

#: span events recorded on a process span while it is open
EVENT_FINISH = "nsq.finish"
EVENT_REQUEUE = "nsq.requeue"
EVENT_TOUCH = "nsq.touch"
EVENT_GIVE_UP = "nsq.give_up"

#: ``error.type`` of a process span whose message was requeued without an exception (the
#: handler returned False, or the message was requeued by hand), or given up on
ERROR_REQUEUED = "requeued"
ERROR_GIVEN_UP = "given_up"

# ------------------------------------------------------------------ helpers

_split_cache: dict[str, tuple[str, int | None]] = {}


def split_address(address: str) -> tuple[str, int | None]:
    """``"host:port"`` (or ``"[::1]:4150"``) as ``(host, port)``; port None when there is
    none.  Cached: an application talks to a handful of nsqd."""
    found = _split_cache.get(address)
    if found is not None:
        return found
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        result: tuple[str, int | None] = (address.strip("[]"), None)
    else:
        result = (host.strip("[]"), int(port))
    if len(_split_cache) < 4096:
        _split_cache[address] = result
    return result


def add_server(attributes: dict[str, Any], address: str | None) -> None:
    """Set ``server.address`` and ``server.port`` from ``"host:port"`` (nothing when None)."""
    if not address:
        return
    host, port = split_address(address)
    attributes[SERVER_ADDRESS] = host
    if port is not None:
        attributes[SERVER_PORT] = port


def error_type(exc: BaseException) -> str:
    """``error.type`` of an exception: its fully qualified class name (low cardinality)."""
    cls = type(exc)
    module = cls.__module__
    if module == "builtins":
        return cls.__qualname__
    return f"{module}.{cls.__qualname__}"


def message_id(internal_id: int | None, raw_id: bytes) -> str:
    """``messaging.message.id`` of a received message: youzan's internal id (decimal, as
    :class:`~nsqclient.PublishResult` gives it to the publisher), else classic NSQ's 16 hex
    characters."""
    if internal_id is not None:
        return str(internal_id)
    try:
        return raw_id.decode("ascii")
    except UnicodeDecodeError:
        return raw_id.hex()


def body_size(body: object) -> int | None:
    """Bytes of a body as the caller gave it (a str is counted once encoded); None when it is
    not a body at all (the publish then fails its own checks)."""
    if isinstance(body, bytes | bytearray):
        return len(body)
    if isinstance(body, memoryview):
        return body.nbytes
    if isinstance(body, str):
        return len(body.encode("utf-8")) if not body.isascii() else len(body)
    return None
