"""What an InputPartition carries to the executors: its messages as nsqd framed them, and the
Arrow rows an executor builds from them.

The driver-side reader holds :class:`~nsqclient.consumer.MessageBatch` objects (the bytes each
socket read brought, and where its messages start).  For a micro-batch it makes no row and no
object per message: a partition's :class:`Frames` is a few pieces, each one read's bytes (the
same ``bytes`` object the connection read, pickled as it is) with the byte range of the
partition's messages in it and their offsets (an array of 8-byte integers).  The executor's
``read`` joins the pieces and builds the columns (:func:`to_rows`) with pyarrow's compute
kernels: classic NSQ's fixed layout needs no Python step per message; youzan's fields are read
with :class:`~nsqclient.consumer.MessageBatch`'s list methods.
"""

from __future__ import annotations

import array
import itertools
from collections.abc import Sequence
from typing import Any, NamedTuple

from ..consumer import HEADER_SIZE, ID_OFFSET, MessageBatch
from .rows import arrow_schema, message_id_text, signed64

__all__ = ["Piece", "Frames", "frames_of", "split_frames", "to_rows"]

_FRAME_HEAD = 8  # [4B size][4B frame type] before each message


class Piece(NamedTuple):
    """Messages of one socket read: ``buffer[first:end]`` holds their frames, adjacent;
    ``starts`` (8-byte integers, native order) where each message starts in ``buffer``."""

    buffer: bytes
    first: int
    end: int
    starts: bytes
    nsqd_address: str
    partition: int | None


class Frames(NamedTuple):
    """One InputPartition's messages (pieces in arrival order) and their layout."""

    pieces: list[Piece]
    youzan: bool
    extended: bool
    ordered: bool

    @property
    def messages(self) -> int:
        """How many messages."""
        return sum(len(p.starts) for p in self.pieces) // 8


def _pieces(batch: MessageBatch, lo: int, hi: int) -> list[Piece]:
    """Messages ``lo:hi`` of ``batch`` as pieces: one when its frames are adjacent, else one
    per message."""
    starts, ends = batch.starts, batch.ends
    address, partition, buf = batch.nsqd_address, batch.partition, batch.buffer
    if batch.contiguous:
        first = starts[lo] - _FRAME_HEAD
        own = array.array("q", starts[lo:hi]).tobytes()
        return [Piece(buf, first, ends[hi - 1], own, address, partition)]
    return [
        Piece(buf, starts[i] - _FRAME_HEAD, ends[i], _one(starts[i]), address, partition)
        for i in range(lo, hi)
    ]


def _one(start: int) -> bytes:
    return array.array("q", (start,)).tobytes()


def frames_of(batches: Sequence[MessageBatch], count: int) -> list[Frames]:
    """``batches`` (of one layout) cut into ``count`` Frames of about the same number of
    messages, in order (fewer when there are fewer messages)."""
    total = sum(map(len, batches))
    count = max(1, min(count, total))
    size = -(-total // count)
    out: list[Frames] = []
    pieces: list[Piece] = []
    room = size
    layout = (False, False, False)
    for batch in batches:
        layout = (batch.youzan, batch.extended, batch.ordered)
        lo, n = 0, len(batch)
        while lo < n:
            hi = min(n, lo + room)
            pieces += _pieces(batch, lo, hi)
            room -= hi - lo
            lo = hi
            if room == 0:
                out.append(Frames(pieces, *layout))
                pieces, room = [], size
    if pieces:
        out.append(Frames(pieces, *layout))
    return out


def split_frames(frames: Frames) -> tuple[bytes, list[int], list[tuple[int, str, int | None]]]:
    """The pieces joined: the frames' bytes (adjacent), each message's start in them, and
    (count, nsqd address, partition) per piece."""
    data = b"".join([memoryview(p.buffer)[p.first : p.end] for p in frames.pieces])
    starts: list[int] = []
    runs = []
    pos = 0
    for piece in frames.pieces:
        shift = pos - piece.first
        own = array.array("q")
        own.frombytes(piece.starts)
        starts += [s + shift for s in own]
        runs.append((len(own), piece.nsqd_address, piece.partition))
        pos += piece.end - piece.first
    return data, starts, runs


def to_rows(frames: Frames, topic: str) -> Any:
    """The Arrow record batch of ``frames`` in the source's schema (on an executor)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    schema = arrow_schema()
    data, starts, runs = split_frames(frames)
    n = len(starts)
    address = pa.concat_arrays(
        [pa.repeat(pa.scalar(a, pa.string()), k) for k, a, _ in runs] or [pa.array([], pa.string())]
    )
    if frames.youzan:
        partition = pa.array(
            list(itertools.chain.from_iterable([p] * k for k, _, p in runs)), pa.int32()
        )
    else:
        partition = pa.nulls(n, pa.int32())
    if frames.extended or frames.ordered or not n:
        return _rows_by_lists(data, starts, frames, topic, address, partition)
    # Message i is element i of a binary array whose offsets are the starts: its own frame,
    # then the next frame's 8-byte head (8 bytes of padding after the last).
    padded = data + bytes(_FRAME_HEAD)
    offsets = pa.array([*starts, len(padded)], pa.int64())
    elements = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), n, [None, offsets.buffers()[1], pa.py_buffer(padded)]
    )

    def field(begin: int, end: int) -> Any:
        return pc.binary_slice(elements, begin, end)

    def number(begin: int, end: int, kind: Any) -> Any:
        # big-endian: reversed bytes are the little-endian value
        reversed_ = pc.binary_reverse(field(begin, end)).cast(pa.binary(end - begin))
        return reversed_.view(kind)

    timestamps = pc.divide(number(0, 8, pa.int64()), 1000).cast(schema.field("timestamp").type)
    ids = field(ID_OFFSET, HEADER_SIZE)
    if frames.youzan:
        id_column = pa.array([message_id_text(i) for i in ids.to_pylist()], pa.string())
        trace_ids = number(18, 26, pa.int64())  # the same bits as signed64(trace id)
    else:
        id_column = ids.cast(pa.large_string()).cast(pa.string())
        trace_ids = pa.nulls(n, pa.int64())
    columns = [
        field(HEADER_SIZE, -_FRAME_HEAD).cast(pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        id_column,
        timestamps,
        number(8, 10, pa.uint16()).cast(pa.int32()),
        address,
        partition,
        pa.nulls(n, pa.int64()),
        trace_ids,
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _rows_by_lists(
    data: bytes, starts: list[int], frames: Frames, topic: str, address: Any, partition: Any
) -> Any:
    """youzan's variable layouts (ext header, ordered offsets): read with MessageBatch's list
    methods."""
    import pyarrow as pa
    import pyarrow.compute as pc

    schema = arrow_schema()
    ends = [s - _FRAME_HEAD for s in starts[1:]] + [len(data)]
    batch = MessageBatch(
        data,
        starts,
        ends,
        youzan=frames.youzan,
        extended=frames.extended,
        ordered=frames.ordered,
    )
    n = len(batch)
    nanoseconds = pa.array(batch.timestamps(), pa.int64())
    columns = [
        pa.array(batch.bodies(), pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.array([message_id_text(i) for i in batch.ids()], pa.string()),
        pc.divide(nanoseconds, 1000).cast(schema.field("timestamp").type),
        pa.array(batch.attempts(), pa.int32()),
        address,
        partition,
        pa.array(batch.offsets(), pa.int64()),
        pa.array([signed64(t) for t in batch.trace_ids()], pa.int64()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)
