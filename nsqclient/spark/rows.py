"""The source's row schema, its columns' text forms, and Message objects -> Arrow record batch.

The source itself builds its rows from nsqd's frames on the executors
(:mod:`nsqclient.spark.frames`); :func:`to_record_batch` serves code that holds Message
objects (the benches' made-up rows), a column at a time: one list comprehension per attribute
and one Arrow conversion per column.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "SCHEMA_DDL",
    "arrow_schema",
    "to_record_batch",
    "message_id_text",
    "signed64",
]

#: The source's rows.  ``timestamp`` is when nsqd received the message (microsecond precision
#: of nsqd's nanoseconds); ``partition``, ``offset`` and ``trace_id`` are youzan's (null on
#: classic NSQ).
SCHEMA_DDL = (
    "body binary, topic string, message_id string, timestamp timestamp, attempts int, "
    "nsqd_address string, partition int, offset long, trace_id long"
)

_HEX = b"0123456789abcdefABCDEF"


def message_id_text(raw: bytes) -> str:
    """The id as text: classic nsqd's 16 hex characters as they are, youzan's 16 raw bytes as
    32 hex characters."""
    if raw and not raw.translate(None, _HEX):
        return raw.decode("ascii")
    return raw.hex()


def signed64(value: int | None) -> int | None:
    """An unsigned 64-bit number (youzan's trace id) as the signed long with the same bits."""
    if value is None:
        return None
    return value - (1 << 64) if value >= (1 << 63) else value


_SCHEMA: Any = None


def arrow_schema() -> Any:
    global _SCHEMA
    if _SCHEMA is None:
        import pyarrow as pa

        _SCHEMA = pa.schema(
            [
                pa.field("body", pa.binary()),
                pa.field("topic", pa.string()),
                pa.field("message_id", pa.string()),
                pa.field("timestamp", pa.timestamp("us", tz="UTC")),
                pa.field("attempts", pa.int32()),
                pa.field("nsqd_address", pa.string()),
                pa.field("partition", pa.int32()),
                pa.field("offset", pa.int64()),
                pa.field("trace_id", pa.int64()),
            ]
        )
    return _SCHEMA


def _optional(messages: Sequence[Any], name: str) -> list[Any]:
    """``getattr(m, name, None)`` of every message: youzan's fields, which a message of
    another kind may not have at all."""
    try:
        if name == "partition":
            return [m.partition for m in messages]
        if name == "offset":
            return [m.offset for m in messages]
        return [m.trace_id for m in messages]
    except AttributeError:
        return [getattr(m, name, None) for m in messages]


def _nullable(values: list[Any], arrow_type: Any) -> Any:
    import pyarrow as pa

    if values.count(None) == len(values):  # classic NSQ: no youzan field at all
        return pa.nulls(len(values), arrow_type)
    return pa.array(values, arrow_type)


def to_record_batch(messages: Sequence[Any], topic: str) -> Any:
    """An Arrow record batch of ``messages`` (nsqclient.Message) in the source's schema.

    youzan's attributes are read as ``getattr(..., None)``: a message without them (classic
    NSQ) gives nulls."""
    import pyarrow as pa
    import pyarrow.compute as pc

    schema = arrow_schema()
    n = len(messages)
    ids = [m.id for m in messages]
    if n and not b"".join(ids).translate(None, _HEX):
        # classic nsqd: every id is 16 ASCII hex characters, so the bytes are the text
        id_column = pa.array(ids, pa.binary()).cast(pa.string())
    else:
        id_column = pa.array([message_id_text(i) for i in ids], pa.string())
    nanoseconds = pa.array([m.timestamp for m in messages], pa.int64())
    # nsqd's timestamps are positive: truncating division is floor division
    timestamps = pc.divide(nanoseconds, 1000).cast(schema.field("timestamp").type)
    trace_ids = _optional(messages, "trace_id")
    if trace_ids.count(None) != n:
        trace_ids = [signed64(t) for t in trace_ids]
    columns = [
        pa.array([m.body for m in messages], pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        id_column,
        timestamps,
        pa.array([m.attempts for m in messages], pa.int32()),
        pa.array([m.nsqd_address for m in messages], pa.string()),
        _nullable(_optional(messages, "partition"), pa.int32()),
        _nullable(_optional(messages, "offset"), pa.int64()),
        _nullable(trace_ids, pa.int64()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)
