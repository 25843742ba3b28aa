"""The source's row schema, and messages -> Arrow record batch (built on the driver)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["SCHEMA_DDL", "to_record_batch", "message_id_text", "signed64"]

#: The source's rows.  ``timestamp`` is when nsqd received the message (microsecond precision
#: of nsqd's nanoseconds); ``partition``, ``offset`` and ``trace_id`` are youzan's (null on
#: classic NSQ).
SCHEMA_DDL = (
    "body binary, topic string, message_id string, timestamp timestamp, attempts int, "
    "nsqd_address string, partition int, offset long, trace_id long"
)

_HEX = frozenset(b"0123456789abcdefABCDEF")


def message_id_text(raw: bytes) -> str:
    """The id as text: classic nsqd's 16 hex characters as they are, youzan's 16 raw bytes as
    32 hex characters."""
    if raw and all(b in _HEX for b in raw):
        return raw.decode("ascii")
    return raw.hex()


def signed64(value: int | None) -> int | None:
    """An unsigned 64-bit number (youzan's trace id) as the signed long with the same bits."""
    if value is None:
        return None
    return value - (1 << 64) if value >= (1 << 63) else value


def _arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
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


def to_record_batch(messages: Sequence[Any], topic: str) -> Any:
    """An Arrow record batch of ``messages`` (nsqclient.Message) in the source's schema.

    youzan's attributes are read with ``getattr(..., None)``: a message without them (classic
    NSQ) gives nulls."""
    import pyarrow as pa

    n = len(messages)
    columns = [
        pa.array([m.body for m in messages], pa.binary()),
        pa.array([topic] * n, pa.string()),
        pa.array([message_id_text(m.id) for m in messages], pa.string()),
        pa.array([m.timestamp // 1000 for m in messages], pa.timestamp("us", tz="UTC")),
        pa.array([m.attempts for m in messages], pa.int32()),
        pa.array([m.nsqd_address for m in messages], pa.string()),
        pa.array([getattr(m, "partition", None) for m in messages], pa.int32()),
        pa.array([getattr(m, "offset", None) for m in messages], pa.int64()),
        pa.array([signed64(getattr(m, "trace_id", None)) for m in messages], pa.int64()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=_arrow_schema())
