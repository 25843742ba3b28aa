"""The NSQ wire format with no I/O: command encoders, an incremental frame reader, message
decoding (classic and youzan) and topic/channel name validation.

Everything here works on bytes.  Times on the wire are integer milliseconds; the encoders take
them that way (``req(id, delay_ms)``) and leave the conversion from seconds to the caller.
"""

from __future__ import annotations

import functools
import json
import re
import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

from .checks import check_int
from .errors import ProtocolError

__all__ = [
    "MAGIC_V2",
    "FRAME_TYPE_RESPONSE",
    "FRAME_TYPE_ERROR",
    "FRAME_TYPE_MESSAGE",
    "HEARTBEAT",
    "OK",
    "CLOSE_WAIT",
    "DEFAULT_MAX_FRAME_SIZE",
    "LOOKUPD_BAD_PROTOCOL",
    "MESSAGE_HEADER",
    "Body",
    "Frame",
    "MessageRun",
    "FrameReader",
    "DecodedMessage",
    "TraceReply",
    "decode_message",
    "decode_message_at",
    "decode_trace_reply",
    "encode_frame",
    "encode_message",
    "valid_topic_name",
    "valid_channel_name",
    "check_topic_name",
    "check_channel_name",
    "to_bytes",
    "identify",
    "auth",
    "sub",
    "sub_ordered",
    "rdy",
    "fin",
    "req",
    "touch",
    "cls",
    "nop",
    "pub",
    "mpub",
    "dpub",
    "pub_trace",
    "mpub_trace",
    "pub_ext",
    "mpub_ext",
]

MAGIC_V2 = b"  V2"

FRAME_TYPE_RESPONSE = 0
FRAME_TYPE_ERROR = 1
FRAME_TYPE_MESSAGE = 2
_FRAME_TYPES = frozenset((FRAME_TYPE_RESPONSE, FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE))

HEARTBEAT = b"_heartbeat_"
OK = b"OK"
CLOSE_WAIT = b"CLOSE_WAIT"

#: The largest frame the reader accepts unless told otherwise: nsqd's default max-msg-size
#: (1 MiB) plus message header room, times four for MPUB-sized responses and headroom.
DEFAULT_MAX_FRAME_SIZE = 4 * 1024 * 1024 + 1024

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_FRAME_HEAD = struct.Struct(">Ii")  # size, frame type
#: one whole ``OK`` response frame, as nsqd sends it
OK_FRAME = _FRAME_HEAD.pack(4 + len(OK), FRAME_TYPE_RESPONSE) + OK
_OK_LEN = len(OK_FRAME)
_tuple_new = tuple.__new__  # builds a NamedTuple without its Python-level __new__
_MSG_HEADER = struct.Struct(">qH16s")  # timestamp ns, attempts, id
_MSG_HEADER_SIZE = _MSG_HEADER.size  # 26
#: The header of a message frame's data, ``[8B timestamp ns][2B attempts][16B id]``, a
#: ``struct.Struct``; on classic NSQ the body follows it.
MESSAGE_HEADER = _MSG_HEADER
_MESSAGE_FRAME_MIN = 4 + _MSG_HEADER_SIZE  # a message frame's size: the type, then the header
_TRACE_REPLY = struct.Struct(">2sQQQI")  # "OK", internal id, trace id, offset, raw size
_ORDERED_PREFIX = struct.Struct(">QI")  # disk queue offset, raw size


# --------------------------------------------------------------------------------------------
# Names


_NAME_RE = re.compile(r"[.a-zA-Z0-9_-]+(?:#ephemeral)?")
_NAME_RULE = "1 to 64 characters of [.a-zA-Z0-9_-], optionally ending in '#ephemeral'"


@functools.lru_cache(maxsize=4096)
def _valid_str_name(name: str) -> bool:
    return 1 <= len(name) <= 64 and _NAME_RE.fullmatch(name) is not None


def _valid_name(name: object) -> bool:
    return isinstance(name, str) and _valid_str_name(name)


def valid_topic_name(name: object) -> bool:
    """True if ``name`` is a valid NSQ topic name."""
    return _valid_name(name)


def valid_channel_name(name: object) -> bool:
    """True if ``name`` is a valid NSQ channel name."""
    return _valid_name(name)


def _check_name(kind: str, name: object) -> str:
    if isinstance(name, bytes):
        try:
            name = name.decode("ascii")
        except UnicodeDecodeError:
            pass
    if not _valid_name(name):
        raise ValueError(f"invalid {kind} name {name!r}: must be {_NAME_RULE}")
    return name  # type: ignore[return-value]


def check_topic_name(name: object) -> str:
    """Return ``name`` as str, or raise ValueError naming the bad topic and the rule."""
    return _check_name("topic", name)


def check_channel_name(name: object) -> str:
    """Return ``name`` as str, or raise ValueError naming the bad channel and the rule."""
    return _check_name("channel", name)


# --------------------------------------------------------------------------------------------
# Commands


#: What a message body may be: bytes, bytearray, memoryview, or str (sent as UTF-8).
Body = bytes | bytearray | memoryview | str


def to_bytes(body: object) -> bytes:
    """A message body as bytes: str is UTF-8 encoded; bytes/bytearray/memoryview accepted.

    Raises TypeError for anything else (None, int, dict...).
    """
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, bytearray | memoryview):
        return bytes(body)
    raise TypeError(
        f"message body must be bytes, bytearray, memoryview or str, not {type(body).__name__}"
    )


def _body(body: object) -> bytes:
    """A message body as bytes, refusing an empty one (nsqd rejects it and closes the
    connection, so the error belongs at the call site)."""
    data = to_bytes(body)
    if not data:
        raise ValueError("message body must not be empty (nsqd refuses empty messages)")
    return data


def _line(name: bytes, *params: str | bytes | int) -> bytes:
    parts = [name]
    for p in params:
        if isinstance(p, bytes):
            parts.append(p)
        else:
            parts.append(str(p).encode("utf-8"))
    return b" ".join(parts) + b"\n"


def _sized(body: bytes) -> bytes:
    return _U32.pack(len(body)) + body


def _partition(partition: int | None) -> tuple[int, ...]:
    if partition is None:
        return ()
    return (check_int(partition, "partition", min=0),)


def _message_id(message_id: bytes | str) -> bytes:
    if isinstance(message_id, str):
        message_id = message_id.encode("ascii")
    if not isinstance(message_id, bytes | bytearray) or len(message_id) != 16:
        raise ValueError(f"message id must be 16 bytes, got {message_id!r}")
    return bytes(message_id)


def identify(data: dict[str, Any]) -> bytes:
    """``IDENTIFY\\n[size][json]``."""
    return b"IDENTIFY\n" + _sized(json.dumps(data, separators=(",", ":")).encode("utf-8"))


def auth(secret: str | bytes) -> bytes:
    """``AUTH\\n[size][secret]``."""
    return b"AUTH\n" + _sized(to_bytes(secret))


def sub(topic: str, channel: str, partition: int | None = None) -> bytes:
    """``SUB <topic> <channel>[ <partition>]\\n`` (the partition is youzan's extension)."""
    return _line(
        b"SUB", check_topic_name(topic), check_channel_name(channel), *_partition(partition)
    )


def sub_ordered(topic: str, channel: str, partition: int) -> bytes:
    """youzan's ordered subscribe: ``SUB_ORDERED <topic> <channel> <partition>\\n``."""
    if partition is None:
        raise ValueError("SUB_ORDERED needs a partition")
    return _line(
        b"SUB_ORDERED", check_topic_name(topic), check_channel_name(channel), *_partition(partition)
    )


def rdy(count: int) -> bytes:
    """``RDY <count>\\n``."""
    return _line(b"RDY", check_int(count, "RDY count", "messages", min=0))


def fin(message_id: bytes | str) -> bytes:
    """``FIN <id>\\n``; the id is sent as it arrived (16 hex chars classic, 16 raw bytes youzan)."""
    return b"FIN " + _message_id(message_id) + b"\n"


def req(message_id: bytes | str, delay_ms: int) -> bytes:
    """``REQ <id> <delay_ms>\\n``."""
    delay_ms = check_int(delay_ms, "REQ delay", "milliseconds", min=0)
    return b"REQ " + _message_id(message_id) + b" " + str(delay_ms).encode() + b"\n"


def touch(message_id: bytes | str) -> bytes:
    """``TOUCH <id>\\n``."""
    return b"TOUCH " + _message_id(message_id) + b"\n"


def cls() -> bytes:
    """``CLS\\n``."""
    return b"CLS\n"


def nop() -> bytes:
    """``NOP\\n``."""
    return b"NOP\n"


def pub(topic: str, body: Body, partition: int | None = None) -> bytes:
    """``PUB <topic>[ <partition>]\\n[size][body]``; a str body is sent as UTF-8."""
    return _line(b"PUB", check_topic_name(topic), *_partition(partition)) + _sized(_body(body))


def mpub_payload(items: Sequence[bytes], command: str = "MPUB") -> bytes:
    """The body of an MPUB (TCP, or HTTP ``/mpub?binary=true``): ``[4B count]([4B size][body])*``
    of ``items``, already bytes.  ValueError naming ``command`` when there are none."""
    if not items:
        raise ValueError(f"{command} needs at least one message")
    return b"".join(_mpub_parts(b"", items)[2:])


class _PackedSizes(dict):
    """``_U32.pack(n)`` for each size ``n`` asked for, kept (at most 4096 of them)."""

    def __missing__(self, size: int) -> bytes:
        if len(self) >= 4096:
            self.clear()
        packed = self[size] = _U32.pack(size)
        return packed


_packed_sizes = _PackedSizes()


def _mpub_parts(
    line: bytes, items: Sequence[bytes], lengths: list[int] | None = None
) -> list[bytes]:
    """``[line, [4B size], [4B count], ([4B size], body)*]``, ready for one ``b"".join``
    (the per-item work done by C loops: this runs for every MPUB).  ``lengths``: the items'
    lengths when the caller has them already."""
    n = len(items)
    if lengths is None:
        lengths = list(map(len, items))
    parts = [b""] * (2 * n + 3)
    parts[0] = line
    parts[1] = _U32.pack(4 + 4 * n + sum(lengths))
    parts[2] = _U32.pack(n)
    parts[3::2] = map(_packed_sizes.__getitem__, lengths)
    parts[4::2] = items
    return parts


def _plain_lengths(bodies: Sequence[object]) -> list[int] | None:
    """The lengths of ``bodies`` when every one is non-empty ``bytes`` (nothing to convert or
    refuse); None otherwise."""
    if set(map(type, bodies)) != _ONLY_BYTES:
        return None
    lengths = list(map(len, bodies))  # type: ignore[arg-type]
    return None if 0 in lengths else lengths


_ONLY_BYTES = {bytes}


def check_body_list(bodies: object, command: str) -> None:
    """TypeError naming ``command`` when one body is given where a list of bodies belongs."""
    if isinstance(bodies, bytes | bytearray | memoryview | str):
        raise TypeError(f"{command} takes a list of message bodies, not a single body")


def mpub(topic: str, bodies: Sequence[Body], partition: int | None = None) -> bytes:
    """``MPUB <topic>[ <partition>]\\n[size][count]([size][body])*``."""
    check_body_list(bodies, "MPUB")
    line = _line(b"MPUB", check_topic_name(topic), *_partition(partition))
    lengths = _plain_lengths(bodies)
    items = bodies if lengths is not None else [_body(b) for b in bodies]
    if not items:
        raise ValueError("MPUB needs at least one message")
    return b"".join(_mpub_parts(line, items, lengths))  # type: ignore[arg-type]


def published_count(command: bytes) -> int:
    """How many messages an encoded publish command carries: the count field of any MPUB form
    (``[size][count]`` right after the command line), 1 for every other command."""
    if not command.startswith(b"MPUB"):
        return 1
    start = command.index(b"\n") + 5
    return _U32.unpack_from(command, start)[0]


def dpub(topic: str, delay_ms: int, body: Body) -> bytes:
    """``DPUB <topic> <delay_ms>\\n[size][body]`` (classic nsqd only; youzan has no DPUB)."""
    delay_ms = check_int(delay_ms, "DPUB delay", "milliseconds", min=0)
    return _line(b"DPUB", check_topic_name(topic), delay_ms) + _sized(_body(body))


def _check_trace_id(trace_id: int) -> int:
    return check_int(trace_id, "trace id", min=0, max=2**64 - 1)


def pub_trace(topic: str, body: bytes, trace_id: int, partition: int | None = None) -> bytes:
    """youzan's ``PUB_TRACE <topic>[ <partition>]\\n[size][8B trace id][body]``."""
    payload = _U64.pack(_check_trace_id(trace_id)) + _body(body)
    return _line(b"PUB_TRACE", check_topic_name(topic), *_partition(partition)) + _sized(payload)


def mpub_trace(
    topic: str, bodies: Sequence[bytes], trace_ids: Sequence[int], partition: int | None = None
) -> bytes:
    """youzan's ``MPUB_TRACE``: an MPUB whose every body is ``[8B trace id][body]``."""
    check_body_list(bodies, "MPUB_TRACE")
    items = [_body(b) for b in bodies]
    if len(trace_ids) != len(items):
        raise ValueError("MPUB_TRACE needs one trace id per message")
    traced = [_U64.pack(_check_trace_id(t)) + b for t, b in zip(trace_ids, items, strict=True)]
    line = _line(b"MPUB_TRACE", check_topic_name(topic), *_partition(partition))
    return line + _sized(mpub_payload(traced))


def _ext_payload(body: bytes, ext: dict[str, Any] | bytes) -> bytes:
    raw = ext if isinstance(ext, bytes) else json.dumps(ext, separators=(",", ":")).encode()
    if len(raw) >= 0xFFFF:
        raise ValueError("message extension header is limited to 65534 bytes")
    return _U16.pack(len(raw)) + raw + _body(body)


def pub_ext(
    topic: str, body: bytes, ext: dict[str, Any] | bytes, partition: int | None = None
) -> bytes:
    """youzan's ``PUB_EXT <topic>[ <partition>]\\n[size][2B ext size][ext json][body]``."""
    line = _line(b"PUB_EXT", check_topic_name(topic), *_partition(partition))
    return line + _sized(_ext_payload(body, ext))


def mpub_ext(
    topic: str,
    bodies: Sequence[bytes],
    exts: Sequence[dict[str, Any] | bytes],
    partition: int | None = None,
) -> bytes:
    """youzan's ``MPUB_EXT``: an MPUB whose every body is ``[2B ext size][ext json][body]``."""
    check_body_list(bodies, "MPUB_EXT")
    items = list(bodies)
    if len(exts) != len(items):
        raise ValueError("MPUB_EXT needs one extension header per message")
    payloads = [_ext_payload(b, e) for b, e in zip(items, exts, strict=True)]
    line = _line(b"MPUB_EXT", check_topic_name(topic), *_partition(partition))
    return line + _sized(mpub_payload(payloads))


# --------------------------------------------------------------------------------------------
# Frames


class Frame(NamedTuple):
    """One frame off the wire: ``type`` is FRAME_TYPE_*; ``data`` the bytes after the type."""

    type: int
    data: bytes


class MessageRun(NamedTuple):
    """Consecutive message frames of one read: message ``i``'s frame data (``[8B
    timestamp][2B attempts][16B id]...``, after the frame type) is
    ``buffer[starts[i]:ends[i]]``; the frames are adjacent (``starts[i + 1] == ends[i] +
    8``)."""

    buffer: bytes
    starts: list[int]
    ends: list[int]


def encode_frame(frame_type: int, data: bytes) -> bytes:
    """``[4B size][4B type][data]``, size counting the type and the data."""
    return _U32.pack(len(data) + 4) + _I32.pack(frame_type) + data


#: What nsqlookupd's TCP port (its V1 protocol: ``[4B size][data]``, no frame type) answers to
#: nsqd's ``"  V2"`` magic, read by a frame reader as a size of 14 and frame type ``b"E_BA"``.
LOOKUPD_BAD_PROTOCOL = b"E_BAD_PROTOCOL"
_TEXT_BYTES = frozenset(range(0x20, 0x7F)) | {0x09, 0x0A, 0x0D}
_SHOWN = 64  # bytes of a foreign peer's reply quoted in the error


def _looks_like_text(data: bytes | bytearray) -> bool:
    return bool(data) and all(b in _TEXT_BYTES for b in data)


class FrameReader:
    """Incremental frame parser: ``feed()`` any chunk of the stream, get complete frames back.

    It never buffers more than one maximum-size frame plus the bytes of the current chunk, and
    raises :class:`~nsqclient.errors.ProtocolError` (and only that) on a stream that is not
    NSQ: a size below 4, a size above ``max_frame_size``, an unknown frame type, or an HTTP
    reply where a size should be.
    When the peer is plainly not an nsqd (an HTTP server, nsqlookupd's TCP port, anything that
    answers in text) the error says so and quotes what it sent.  ``peer`` (``"host:port"``) names
    it in those messages.  After an error the reader is broken; the connection must be closed.
    """

    __slots__ = ("_buf", "_need", "max_frame_size", "_error", "peer")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, peer: str | None = None):
        self._buf = bytearray()
        #: bytes the buffered, incomplete frame needs in all before parsing is worth it
        self._need = 0
        self.max_frame_size = max_frame_size
        self._error: ProtocolError | None = None
        self.peer = peer

    def _not_nsqd(self, sent: bytes | bytearray) -> ProtocolError:
        """The error for a peer that answered in text: name it, quote it, hint at the port."""
        shown = bytes(sent[:_SHOWN]) + (b"..." if len(sent) > _SHOWN else b"")
        if bytes(sent).startswith(LOOKUPD_BAD_PROTOCOL):
            hint = "nsqlookupd's TCP port answers this way"
        else:
            hint = "an nsqd answers in binary frames"
        return ProtocolError(
            f"{self.peer or 'the peer'} is not an nsqd TCP port: it sent {shown!r} ({hint};"
            " nsqd's TCP port is 4150 by default)"
        )

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a frame."""
        return len(self._buf)

    def leading_oks(self, data: bytes) -> tuple[int, int]:
        """A publisher's usual read: ``(count, used)``, where the stream's next ``count``
        frames are ``OK`` responses made of what was buffered and ``data[:used]``.  They are
        taken here (not returned by :meth:`feed`), and ``data[used:]`` must be fed next.
        ``(0, 0)``, taking nothing, when the next frame is not a whole ``OK``."""
        if self._error is not None:
            return 0, 0
        count = used = 0
        buffered = self._buf
        if buffered:  # an OK cut by the previous read?
            used = _OK_LEN - len(buffered)
            if used <= 0 or buffered + data[:used] != OK_FRAME:
                return 0, 0
            self._buf = bytearray()
            count = 1
        whole = (len(data) - used) // _OK_LEN
        if whole and data.startswith(OK_FRAME, used):
            end = used + whole * _OK_LEN
            if data.count(OK_FRAME, used, end) == whole:  # non-overlapping: they tile it
                return count + whole, end
            while data.startswith(OK_FRAME, used):  # OKs, then another frame
                count += 1
                used += _OK_LEN
        return count, used

    def feed(self, data: bytes) -> list[Frame]:
        """Add bytes; return every frame they complete, in order."""
        frames: list[Frame] = []
        for item in self.feed_runs(data):
            if type(item) is MessageRun:
                buf = item.buffer
                frames += [
                    _tuple_new(Frame, (FRAME_TYPE_MESSAGE, buf[start:end]))
                    for start, end in zip(item.starts, item.ends, strict=True)
                ]
            else:
                frames.append(item)  # type: ignore[arg-type]
        return frames

    def feed_runs(self, data: bytes) -> list[Frame | MessageRun]:
        """Add bytes; return what they complete, in order: each run of consecutive message
        frames as one :class:`MessageRun` (offsets into the bytes read, no copy per message),
        every other frame as a :class:`Frame`."""
        if self._error is not None:
            raise self._error
        if self._buf:
            self._buf += data
            if len(self._buf) < self._need:
                return []  # the frame begun earlier is still incomplete
            buf = bytes(self._buf)
        else:
            buf = data
        out: list[Frame | MessageRun] = []
        starts: list[int] = []
        ends: list[int] = []
        head = _FRAME_HEAD.unpack_from
        pos = 0
        end = len(buf)
        max_size = self.max_frame_size
        try:
            while True:
                left = end - pos
                if left < 8:
                    if left >= 4:
                        self._check_size(buf, pos, _U32.unpack_from(buf, pos)[0])
                    break
                size, frame_type = head(buf, pos)
                if size < 4 or size > max_size:
                    self._check_size(buf, pos, size)
                if left - 4 < size:
                    break
                if frame_type == FRAME_TYPE_MESSAGE:
                    if size < _MESSAGE_FRAME_MIN:
                        raise ProtocolError(
                            f"message frame of {size - 4} bytes is shorter than its header"
                        )
                    starts.append(pos + 8)
                    pos += 4 + size
                    ends.append(pos)
                    continue
                if frame_type not in _FRAME_TYPES:
                    body = buf[pos + 4 : pos + 4 + size]
                    if _looks_like_text(body):  # a size-prefixed text reply: not NSQ's V2
                        raise self._not_nsqd(body)
                    raise ProtocolError(f"unknown frame type {frame_type}")
                if starts:
                    out.append(_tuple_new(MessageRun, (buf, starts, ends)))
                    starts, ends = [], []
                out.append(_tuple_new(Frame, (frame_type, buf[pos + 8 : pos + 4 + size])))
                pos += 4 + size
        except ProtocolError as exc:
            self._error = exc
            self._buf = bytearray()
            raise
        if starts:
            out.append(_tuple_new(MessageRun, (buf, starts, ends)))
        rest = end - pos
        if rest:
            self._buf = bytearray(buf[pos:])
            self._need = (
                4 + _U32.unpack_from(buf, pos)[0] if rest >= 4 else 4
            )  # bytes the next frame needs in all
        elif self._buf:
            self._buf = bytearray()
        return out

    def _check_size(self, buf: bytes, pos: int, size: int) -> None:
        """ProtocolError for a frame size nsqd never sends (text where a size belongs: not an
        nsqd)."""
        if buf[pos : pos + 4] == b"HTTP":  # read as a size, b"HTTP" is far above any maximum
            where = f"{self.peer} is" if self.peer else "this is"
            raise ProtocolError(f"{where} an HTTP port, not an nsqd TCP port")
        if size < 4:
            raise ProtocolError(f"frame size {size} is below the minimum of 4")
        if size > self.max_frame_size:
            if _looks_like_text(buf[pos : pos + 4]):  # text where a size belongs
                raise self._not_nsqd(buf[pos:])
            raise ProtocolError(
                f"frame size {size} exceeds the maximum of {self.max_frame_size} bytes"
            )


# --------------------------------------------------------------------------------------------
# Messages


class DecodedMessage(NamedTuple):
    """The fields of a message frame.

    ``timestamp`` is nanoseconds since the epoch.  ``id`` is the 16 bytes exactly as sent (ASCII
    hex on classic nsqd, ``[8B internal id][8B trace id]`` on youzan's), to be echoed back in
    FIN/REQ/TOUCH.  The youzan fields are None when not present.
    """

    timestamp: int
    attempts: int
    id: bytes
    body: bytes
    internal_id: int | None = None
    trace_id: int | None = None
    offset: int | None = None
    raw_size: int | None = None
    ext_version: int | None = None
    ext: bytes | None = None


def encode_message(timestamp: int, attempts: int, message_id: bytes, body: bytes) -> bytes:
    """The body of a classic message frame: ``[8B ts][2B attempts][16B id][body]``."""
    if len(message_id) != 16:
        raise ValueError(f"message id must be 16 bytes, got {message_id!r}")
    return _MSG_HEADER.pack(timestamp, attempts, message_id) + body


_NO_YOUZAN_FIELDS = (None,) * 6


def decode_message(
    data: bytes, *, youzan: bool = False, extended: bool = False, ordered: bool = False
) -> DecodedMessage:
    """Decode the body of a message frame.

    Args:
        youzan: the id is youzan's raw ``[8B internal id][8B trace id]``; fill those fields.
        extended: the connection negotiated youzan's ``extend_support``: a
            ``[1B ext version]`` (and, when non-zero, ``[2B size][ext]``) header follows the id.
        ordered: the message came over SUB_ORDERED (or SUB_ADVANCED):
            ``[8B disk queue offset][4B raw size]`` precede the body.
    """
    if len(data) < _MSG_HEADER_SIZE:
        raise ProtocolError(f"message frame of {len(data)} bytes is shorter than its header")
    timestamp, attempts, message_id = _MSG_HEADER.unpack_from(data, 0)
    if not (youzan or extended or ordered):  # classic NSQ: the common case, kept short
        body = data[_MSG_HEADER_SIZE:]
        if type(body) is not bytes:
            body = bytes(body)
        return _tuple_new(
            DecodedMessage, (timestamp, attempts, message_id, body, *_NO_YOUZAN_FIELDS)
        )
    pos = _MSG_HEADER_SIZE
    internal_id = trace_id = offset = raw_size = ext_version = None
    ext = None
    if youzan or extended or ordered:
        internal_id, trace_id = struct.unpack(">QQ", message_id)
    if extended:
        if len(data) < pos + 1:
            raise ProtocolError("extended message frame is missing its ext version byte")
        ext_version = data[pos]
        pos += 1
        if ext_version != 0:
            if len(data) < pos + 2:
                raise ProtocolError("extended message frame is missing its ext size")
            ext_len = _U16.unpack_from(data, pos)[0]
            pos += 2
            if len(data) < pos + ext_len:
                raise ProtocolError("extended message frame is shorter than its ext header")
            ext = bytes(data[pos : pos + ext_len])
            pos += ext_len
    if ordered:
        if len(data) < pos + _ORDERED_PREFIX.size:
            raise ProtocolError("ordered message frame is missing its offset and size")
        offset, raw_size = _ORDERED_PREFIX.unpack_from(data, pos)
        pos += _ORDERED_PREFIX.size
    return DecodedMessage(
        timestamp,
        attempts,
        message_id,
        bytes(data[pos:]),
        internal_id,
        trace_id,
        offset,
        raw_size,
        ext_version,
        ext,
    )


def decode_message_at(
    buf: bytes,
    start: int,
    end: int,
    youzan: bool = False,
    extended: bool = False,
    ordered: bool = False,
) -> DecodedMessage:
    """:func:`decode_message` of ``buf[start:end]`` (a :class:`MessageRun`'s frame), without
    copying the frame first on classic NSQ."""
    if youzan or extended or ordered or end - start < _MSG_HEADER_SIZE:
        return decode_message(buf[start:end], youzan=youzan, extended=extended, ordered=ordered)
    timestamp, attempts, message_id = _MSG_HEADER.unpack_from(buf, start)
    return _tuple_new(
        DecodedMessage,
        (timestamp, attempts, message_id, buf[start + _MSG_HEADER_SIZE : end], *_NO_YOUZAN_FIELDS),
    )


class TraceReply(NamedTuple):
    """youzan's reply to PUB_TRACE/MPUB_TRACE (and PUB with tracing on)."""

    internal_id: int
    trace_id: int
    offset: int
    raw_size: int


def decode_trace_reply(data: bytes) -> TraceReply:
    """Decode ``OK[8B internal id][8B trace id][8B disk queue offset][4B raw size]`` (30 bytes)."""
    if len(data) != _TRACE_REPLY.size or not data.startswith(OK):
        raise ProtocolError(f"a traced publish reply is 30 bytes starting with OK, got {data!r}")
    _, internal_id, trace_id, offset, raw_size = _TRACE_REPLY.unpack(data)
    return TraceReply(internal_id, trace_id, offset, raw_size)
