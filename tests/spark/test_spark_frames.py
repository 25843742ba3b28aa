"""The source's InputPartitions: messages as nsqd framed them (spark/frames.py), and the Arrow
rows an executor builds from them, for every layout (no Spark, no sockets)."""

from __future__ import annotations

import pickle
import struct

import pytest

from nsqclient import protocol
from nsqclient.consumer._batch import MessageBatch
from nsqclient.protocol import FrameReader, decode_message, encode_frame
from nsqclient.spark.frames import frames_of, to_rows
from nsqclient.spark.rows import message_id_text, signed64
from nsqclient.spark.source import NSQInputPartition

pa = pytest.importorskip("pyarrow")

TS = 1_700_000_000_123_456_789


def batch_of(payloads: list[bytes], **layout: object) -> MessageBatch:
    """One read's worth of message frames as a MessageBatch (with a heartbeat after them, as
    a read may end)."""
    data = b"".join(encode_frame(protocol.FRAME_TYPE_MESSAGE, p) for p in payloads)
    data += encode_frame(protocol.FRAME_TYPE_RESPONSE, protocol.HEARTBEAT)
    run = FrameReader().feed_runs(data)[0]
    assert type(run) is protocol.MessageRun
    return MessageBatch(run.buffer, run.starts, run.ends, **layout)  # type: ignore[arg-type]


def classic_batch(bodies: list[bytes], first_id: int = 0, address: str = "n:1") -> MessageBatch:
    payloads = [
        protocol.encode_message(TS + i, 1 + i % 3, b"%016x" % (first_id + i), body)
        for i, body in enumerate(bodies)
    ]
    return batch_of(payloads, nsqd_address=address)


def youzan_payload(i: int, body: bytes, ext: bytes | None, offset: int | None) -> bytes:
    out = struct.pack(">qH", TS + i, 1) + struct.pack(">QQ", 7 + i, 2**63 + i)
    if ext is not None:
        out += b"\x00" if not ext else b"\x02" + struct.pack(">H", len(ext)) + ext
    if offset is not None:
        out += struct.pack(">QI", offset, len(body))
    return out + body


def expected_rows(payloads: list[bytes], topic: str, address: str, partition, **layout):
    rows = []
    for p in payloads:
        d = decode_message(p, **layout)
        rows.append(
            {
                "body": d.body,
                "topic": topic,
                "message_id": message_id_text(d.id),
                "timestamp_us": d.timestamp // 1000,
                "attempts": d.attempts,
                "nsqd_address": address,
                "partition": partition,
                "offset": d.offset,
                "trace_id": signed64(d.trace_id),
            }
        )
    return rows


def got_rows(batch) -> list[dict]:
    out = []
    for row in batch.to_pylist():
        ts = row.pop("timestamp")
        row["timestamp_us"] = int(ts.timestamp() * 1_000_000) if ts is not None else None
        out.append(row)
    return out


BODIES = [b"", b"a", bytes(range(256)) * 4, b"", b"\x00\n" * 9]


def test_classic_rows_from_frames_across_reads_and_partitions():
    batches = [classic_batch(BODIES, 0, "n:1"), classic_batch(BODIES[::-1], 5, "m:2")]
    for count in (1, 2, 3, 10):
        parts = frames_of(batches, count)
        assert sum(p.messages for p in parts) == 10
        rows = [r for p in parts for r in got_rows(to_rows(p, "clicks"))]
        assert [r["body"] for r in rows] == BODIES + BODIES[::-1]
        assert [r["message_id"] for r in rows] == [f"{i:016x}" for i in range(10)]
        assert [r["nsqd_address"] for r in rows] == ["n:1"] * 5 + ["m:2"] * 5
        assert [r["attempts"] for r in rows] == [1 + i % 3 for i in range(5)] * 2
        assert [r["timestamp_us"] for r in rows] == [(TS + i % 5) // 1000 for i in range(10)]
        assert all(r["partition"] is None and r["offset"] is None for r in rows)
        assert all(r["trace_id"] is None and r["topic"] == "clicks" for r in rows)


@pytest.mark.parametrize("extended", [False, True])
@pytest.mark.parametrize("ordered", [False, True])
def test_youzan_rows_from_frames(extended, ordered):
    exts = [b"", b'{"a":1}', b"", b"", b'{"##client_dispatch_tag":"x"}']
    payloads = [
        youzan_payload(i, body, exts[i] if extended else None, 900 + i if ordered else None)
        for i, body in enumerate(BODIES)
    ]
    layout = {"youzan": True, "extended": extended, "ordered": ordered}
    batch = batch_of(payloads, nsqd_address="y:3", partition=2, **layout)
    (frames,) = frames_of([batch], 1)
    rows = got_rows(to_rows(frames, "t"))
    assert rows == expected_rows(payloads, "t", "y:3", 2, **layout)
    assert rows[0]["trace_id"] == signed64(2**63)


def test_a_batch_with_a_message_taken_out_ships_the_others():
    batch = classic_batch([b"m%d" % i for i in range(6)])
    kept = batch._without({1, 4})
    assert not kept.contiguous
    parts = frames_of([kept], 2)
    rows = [r for p in parts for r in got_rows(to_rows(p, "t"))]
    assert [r["body"] for r in rows] == [b"m0", b"m2", b"m3", b"m5"]


def test_an_input_partition_carries_its_own_reads_only():
    # 2,000 messages over 8 reads, cut into two partitions of 1,000
    batches = [
        classic_batch([b"%05d" % i + b"x" * 195 for i in range(k, k + 250)], first_id=k)
        for k in range(0, 2_000, 250)
    ]
    parts = frames_of(batches, 2)
    assert [p.messages for p in parts] == [1_000, 1_000]
    sizes = [len(pickle.dumps(NSQInputPartition(i, f))) for i, f in enumerate(parts)]
    whole = sum(len(b.buffer) for b in batches)
    assert all(size < whole * 0.6 for size in sizes)
    half = pickle.loads(pickle.dumps(NSQInputPartition(1, parts[1])))
    assert (half.value, half.count) == (1, 1_000)
    rows = to_rows(half.frames, "t").to_pylist()
    assert rows[0]["body"].startswith(b"01000") and rows[-1]["body"].startswith(b"01999")
    empty = pickle.loads(pickle.dumps(NSQInputPartition(2, None)))
    assert (empty.value, empty.frames, empty.count) == (2, None, 0)
