"""MessageBatch and FrameReader.feed_runs from bytes alone (no sockets): every layout NSQ and
youzan's nsqd send, bodies of 0 bytes, frames split anywhere across reads."""

from __future__ import annotations

import struct

import pytest

from nsqclient import protocol
from nsqclient.consumer._batch import MessageBatch
from nsqclient.protocol import FrameReader, MessageRun, decode_message, encode_frame


def classic(i: int, body: bytes, attempts: int = 1) -> bytes:
    return protocol.encode_message(1_700_000_000_000_000_000 + i, attempts, b"%016x" % i, body)


def youzan(i: int, body: bytes, ext: bytes | None, offset: int | None) -> bytes:
    """A youzan message: raw id [8B internal id][8B trace id], then the ext header when
    ``ext`` is not None (version 0 when empty), then [8B offset][4B raw size] when ordered."""
    out = struct.pack(">qH", 1_700_000_000_000_000_000 + i, 1) + struct.pack(">QQ", i, 2**63 + i)
    if ext is not None:
        out += b"\x00" if not ext else b"\x02" + struct.pack(">H", len(ext)) + ext
    if offset is not None:
        out += struct.pack(">QI", offset, len(body))
    return out + body


def frames_of(payloads: list[bytes]) -> bytes:
    return b"".join(encode_frame(protocol.FRAME_TYPE_MESSAGE, p) for p in payloads)


def runs_in_pieces(data: bytes, step: int) -> list[MessageRun | protocol.Frame]:
    reader = FrameReader()
    out: list[MessageRun | protocol.Frame] = []
    for i in range(0, len(data), step):
        out += reader.feed_runs(data[i : i + step])
    assert reader.buffered == 0
    return out


def batch_of(run: MessageRun, **layout: bool) -> MessageBatch:
    return MessageBatch(run.buffer, run.starts, run.ends, nsqd_address="h:1", **layout)


BODIES = [b"", b"a", b"", bytes(range(256)) * 3, b"\n" * 30, b""]


@pytest.mark.parametrize("step", [1, 7, 34, 100, 10_000])
def test_classic_frames_split_anywhere_make_the_same_messages(step):
    payloads = [classic(i, body, attempts=i + 1) for i, body in enumerate(BODIES)]
    items = runs_in_pieces(frames_of(payloads), step)
    assert all(type(item) is MessageRun for item in items)
    batches = [batch_of(run) for run in items]  # type: ignore[arg-type]
    got = [d for b in batches for d in b.decoded()]
    assert got == [decode_message(p) for p in payloads]
    assert [x for b in batches for x in b.bodies()] == BODIES
    assert [x for b in batches for x in b.attempts()] == list(range(1, len(BODIES) + 1))
    assert [x for b in batches for x in b.ids()] == [b"%016x" % i for i in range(len(BODIES))]
    assert [x for b in batches for x in b.timestamps()] == [d.timestamp for d in got]
    assert all(b.trace_ids() == [None] * len(b) and b.offsets() == [None] * len(b) for b in batches)
    for b in batches:
        assert b.header_size == 26 and b.contiguous
        assert all(b.starts[i + 1] == b.ends[i] + 8 for i in range(len(b) - 1))


@pytest.mark.parametrize("extended", [False, True])
@pytest.mark.parametrize("ordered", [False, True])
def test_youzan_layouts_give_their_fields(extended, ordered):
    exts = [b"", b'{"k":"v"}', b"", b'{"##client_dispatch_tag":"t"}', b"", b""]
    payloads = [
        youzan(i, body, exts[i] if extended else None, 1000 + 10 * i if ordered else None)
        for i, body in enumerate(BODIES)
    ]
    (run,) = runs_in_pieces(frames_of(payloads), 10_000)
    batch = batch_of(run, youzan=True, extended=extended, ordered=ordered)  # type: ignore[arg-type]
    assert batch.bodies() == BODIES
    assert batch.trace_ids() == [2**63 + i for i in range(len(BODIES))]
    layout = {"youzan": True, "extended": extended, "ordered": ordered}
    assert batch.decoded() == [decode_message(p, **layout) for p in payloads]
    assert batch.offsets() == ([1000 + 10 * i for i in range(6)] if ordered else [None] * 6)
    assert batch.header_size == (None if extended else 26 + (12 if ordered else 0))


def test_other_frames_cut_the_runs_and_keep_their_place():
    heartbeat = encode_frame(protocol.FRAME_TYPE_RESPONSE, protocol.HEARTBEAT)
    error = encode_frame(protocol.FRAME_TYPE_ERROR, b"E_FIN_FAILED nope")
    data = frames_of([classic(0, b"a"), classic(1, b"b")]) + heartbeat
    data += frames_of([classic(2, b"c")]) + error + heartbeat + frames_of([classic(3, b"d")])
    kinds = []
    for item in runs_in_pieces(data, 10_000):
        if type(item) is MessageRun:
            kinds.append([b for b in batch_of(item).bodies()])
        else:
            kinds.append(item.data)  # type: ignore[union-attr]
    assert kinds == [[b"a", b"b"], protocol.HEARTBEAT, [b"c"], b"E_FIN_FAILED nope"] + [
        protocol.HEARTBEAT,
        [b"d"],
    ]
    # feed() still gives one Frame per message, in order
    frames = FrameReader().feed(data)
    assert [f.type for f in frames] == [2, 2, 0, 2, 1, 0, 2]


def test_split_cut_and_without_hand_the_messages_over_once():
    (run,) = runs_in_pieces(frames_of([classic(i, b"m%d" % i) for i in range(6)]), 10_000)
    batch = batch_of(run)  # type: ignore[arg-type]
    head, tail = batch.split(2)
    assert head.bodies() == [b"m0", b"m1"] and tail.bodies() == [b"m2", b"m3", b"m4", b"m5"]
    assert batch.has_responded() and not head.has_responded() and not tail.has_responded()
    with pytest.raises(ValueError, match="split"):
        batch.split(1)
    kept = tail._without({1, 3})
    assert kept.bodies() == [b"m2", b"m4"] and not kept.contiguous and tail.has_responded()
    empty, whole = head.split(0)
    assert len(empty) == 0 and whole.bodies() == [b"m0", b"m1"]
    with pytest.raises(RuntimeError, match="not received by a Consumer"):
        whole.finish()
    with pytest.raises(ValueError, match="starts but"):
        MessageBatch(b"", [1], [])


def test_a_message_frame_shorter_than_its_header_is_a_protocol_error():
    short = encode_frame(protocol.FRAME_TYPE_MESSAGE, b"\x00" * 25)
    reader = FrameReader()
    with pytest.raises(protocol.ProtocolError, match="shorter than its header"):
        reader.feed_runs(frames_of([classic(0, b"ok")]) + short)
    with pytest.raises(protocol.ProtocolError):  # the reader is broken: the connection closes
        reader.feed_runs(b"")
