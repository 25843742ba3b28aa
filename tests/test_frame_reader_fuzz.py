"""Fuzzing FrameReader with garbage: it may only ever raise ProtocolError, always returns, and
never holds more than one maximum-size frame plus the chunk just fed.

Inputs are bounded (a few KiB per example), so a reader that looped or waited would show up as
a pytest-timeout failure rather than a hang.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsqclient.errors import ProtocolError
from nsqclient.protocol import Frame, FrameReader, encode_frame

pytestmark = pytest.mark.timeout(60)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reference_parse(stream: bytes, max_frame_size: int) -> tuple[list[Frame], bool]:
    """A plain reading of the framing rules: (complete frames, whether the stream is invalid)."""
    frames: list[Frame] = []
    pos = 0
    while len(stream) - pos >= 4:
        if stream[pos : pos + 4] == b"HTTP":
            return frames, True
        (size,) = struct.unpack_from(">I", stream, pos)
        if size < 4 or size > max_frame_size:
            return frames, True
        if len(stream) - pos - 4 < size:
            break
        (frame_type,) = struct.unpack_from(">i", stream, pos + 4)
        if frame_type not in (0, 1, 2):
            return frames, True
        if frame_type == 2 and size < 4 + 26:  # a message frame holds its 26-byte header
            return frames, True
        frames.append(Frame(frame_type, stream[pos + 8 : pos + 4 + size]))
        pos += 4 + size
    return frames, False


def feed_in_chunks(
    reader: FrameReader, stream: bytes, cuts: list[int]
) -> tuple[list[Frame], ProtocolError | None]:
    """Feed ``stream`` cut at ``cuts``; check the buffer bound after every call."""
    bounds = [0, *sorted(c % (len(stream) + 1) for c in cuts), len(stream)]
    frames: list[Frame] = []
    for start, end in zip(bounds, bounds[1:], strict=False):
        chunk = stream[start:end]
        try:
            frames += reader.feed(chunk)
        except ProtocolError as exc:
            # any other exception type propagates and fails the test
            return frames, exc
        assert reader.buffered <= reader.max_frame_size + 4 + len(chunk)
    return frames, None


# Garbage with a bias towards the interesting: valid frames, sizes near the limits, "HTTP",
# bad frame types, and plain random bytes, concatenated.
def _frame_bytes(max_size: int) -> st.SearchStrategy[bytes]:
    return st.builds(encode_frame, st.integers(0, 2), st.binary(max_size=max_size))


def _typed_frame(frame_type: int, data: bytes) -> bytes:
    """A well-sized frame of any (mostly unknown) type."""
    return struct.pack(">Ii", 4 + len(data), frame_type) + data


piece_st = st.one_of(
    st.binary(max_size=64),
    _frame_bytes(64),
    st.integers(0, 2**32 - 1).map(lambda n: struct.pack(">I", n)),
    st.integers(0, 16).map(lambda n: struct.pack(">I", n)),
    st.builds(_typed_frame, st.integers(-(2**31), 2**31 - 1), st.binary(max_size=8)),
    st.sampled_from([b"HTTP", b"HTTP/1.1 400 Bad Request\r\n\r\n", b"H", b"TTP", b"\xff" * 4]),
)
stream_st = st.lists(piece_st, max_size=24).map(b"".join)
cuts_st = st.lists(st.integers(0, 1 << 16), max_size=32)
max_size_st = st.sampled_from([4, 5, 8, 16, 64, 100, 1024, 4 * 1024 * 1024 + 1024])


@FUZZ
@given(stream=st.binary(max_size=4096), cuts=cuts_st, max_frame_size=max_size_st)
def test_random_bytes_only_raise_protocol_error(
    stream: bytes, cuts: list[int], max_frame_size: int
) -> None:
    reader = FrameReader(max_frame_size=max_frame_size)
    frames, error = feed_in_chunks(reader, stream, cuts)
    for frame in frames:
        assert frame.type in (0, 1, 2) and len(frame.data) <= max_frame_size - 4
    if error is not None:
        assert reader.buffered == 0
        with pytest.raises(ProtocolError):
            reader.feed(b"")


@FUZZ
@given(stream=stream_st, cuts=cuts_st, max_frame_size=max_size_st)
def test_structured_garbage_matches_the_framing_rules(
    stream: bytes, cuts: list[int], max_frame_size: int
) -> None:
    expected, invalid = reference_parse(stream, max_frame_size)
    reader = FrameReader(max_frame_size=max_frame_size)
    frames, error = feed_in_chunks(reader, stream, cuts)
    if invalid:
        assert error is not None
        assert frames == expected[: len(frames)]
        # once broken, the reader stays broken
        with pytest.raises(ProtocolError):
            reader.feed(encode_frame(0, b"OK"))
    else:
        assert error is None
        assert frames == expected
        consumed = sum(4 + 4 + len(f.data) for f in frames)
        assert reader.buffered == len(stream) - consumed


@FUZZ
@given(
    declared=st.integers(0, 2**32 - 1),
    tail=st.binary(max_size=512),
    max_frame_size=st.integers(4, 256),
    cuts=cuts_st,
)
def test_declared_size_beyond_limit_fails_early(
    declared: int, tail: bytes, max_frame_size: int, cuts: list[int]
) -> None:
    reader = FrameReader(max_frame_size=max_frame_size)
    stream = struct.pack(">I", declared) + tail
    frames, error = feed_in_chunks(reader, stream, cuts)
    if declared > max_frame_size or declared < 4:
        assert error is not None and frames == []
        assert reader.buffered == 0
    else:
        assert error is None or len(tail) >= declared  # only an unknown frame type can fail
