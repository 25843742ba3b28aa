"""nsqd's TCP protocol V2 without I/O: one client connection's bytes in, its commands out, and
its replies back out as bytes, as nsqd 1.3.0 reads and writes them (``nsqd/protocol_v2.go``,
``client_v2.go``).  What h11 is to HTTP.

:class:`ProtocolV2` holds what the client has sent (the ``"  V2"`` magic, then command lines
and their size-prefixed bodies), the client's state (INIT, SUBSCRIBED, CLOSING), what IDENTIFY
negotiated (heartbeats, output buffering, sampling, msg timeout, snappy or deflate) and the
frames queued for the client; compression is applied here, on both sides.  Its ``parse_*``
methods read a command's arguments with nsqd's checks, error codes and texts, in nsqd's order;
an error is a :class:`FatalClientError` (nsqd closes the connection) or a :class:`ClientError`.

It knows no socket, no event loop, no topic: :class:`~.client.ClientConn` feeds it the bytes it
reads, runs each command against the node (between the parse calls where nsqd does, e.g. AUTH
before MPUB's body is read) and writes what it queued.  Tested with bytes.
"""

from __future__ import annotations

import json
import logging
import struct
import zlib
from collections.abc import Callable
from typing import Any, NamedTuple

from ...protocol import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_RESPONSE,
    encode_frame,
    valid_channel_name,
    valid_topic_name,
)
from ..gostyle.text import VERSION, go_json, go_quote
from .options import NSQDOptions, ms
from .writes import snappy_writes

__all__ = [
    "ProtocolV2",
    "Negotiation",
    "FatalClientError",
    "ClientError",
    "BadProtocol",
    "LineTooLong",
    "NEED_MORE",
    "STATE_MAGIC",
    "STATE_INIT",
    "STATE_SUBSCRIBED",
    "STATE_CLOSING",
    "OK_FRAME",
    "HEARTBEAT_FRAME",
    "CLOSE_WAIT_FRAME",
    "BAD_PROTOCOL_FRAME",
    "IDENTIFY_FIELDS",
    "base10",
    "to_int64",
    "ms_to_duration_ns",
]

log = logging.getLogger("nsqclient.testing.protocol_v2")

_I32 = struct.Struct(">i")
LINE_LIMIT = 16 * 1024  # nsqd's bufio reader size: a longer line is a read error

OK_FRAME = encode_frame(FRAME_TYPE_RESPONSE, b"OK")
HEARTBEAT_FRAME = encode_frame(FRAME_TYPE_RESPONSE, b"_heartbeat_")
CLOSE_WAIT_FRAME = encode_frame(FRAME_TYPE_RESPONSE, b"CLOSE_WAIT")
BAD_PROTOCOL_FRAME = encode_frame(FRAME_TYPE_ERROR, b"E_BAD_PROTOCOL")

#: a parse method's (and a command handler's) "not enough bytes yet"
NEED_MORE = -1

# Client states, with nsqd's numbering (they show up in /stats); MAGIC: before "  V2".
STATE_MAGIC = -1
STATE_INIT = 0
STATE_SUBSCRIBED = 3
STATE_CLOSING = 4


def base10(raw: bytes) -> int | None:
    """nsqd's ByteToBase10: digits only (empty is 0), wrapping at 2**64; None when invalid."""
    n = 0
    for b in raw:
        if not 48 <= b <= 57:
            return None
        n = (n * 10 + b - 48) & 0xFFFFFFFFFFFFFFFF
    return n


def to_int64(n: int) -> int:
    """``int64(n)`` of a uint64."""
    n &= 0xFFFFFFFFFFFFFFFF
    return n - (1 << 64) if n >= 1 << 63 else n


def ms_to_duration_ns(ms_u64: int) -> int:
    """``time.Duration(ms) * time.Millisecond`` with Go's int64 wrap-around."""
    return to_int64(to_int64(ms_u64) * 1_000_000)


class FatalClientError(Exception):
    """An error frame after which nsqd closes the connection."""

    fatal = True

    def __init__(self, code: str, desc: str | bytes):
        super().__init__(code)
        self.code = code
        self.desc = desc

    def frame_body(self) -> bytes:
        desc = self.desc if isinstance(self.desc, bytes) else self.desc.encode("utf-8")
        return self.code.encode() + b" " + desc


class ClientError(FatalClientError):
    """An error frame that leaves the connection open (FIN/REQ/TOUCH failures)."""

    fatal = False


class BadProtocol(Exception):
    """The client's first four bytes are not ``"  V2"`` (nsqd answers E_BAD_PROTOCOL, closes)."""

    def __init__(self, magic: bytes):
        super().__init__(magic)
        self.magic = magic


class LineTooLong(Exception):
    """A command line outgrew nsqd's read buffer (nsqd closes the connection)."""


IDENTIFY_FIELDS: dict[str, str] = {
    "client_id": "str",
    "hostname": "str",
    "heartbeat_interval": "int",
    "output_buffer_size": "int",
    "output_buffer_timeout": "int",
    "feature_negotiation": "bool",
    "tls_v1": "bool",
    "deflate": "bool",
    "deflate_level": "int",
    "snappy": "bool",
    "sample_rate": "int32",
    "user_agent": "str",
    "msg_timeout": "int",
}


def decode_identify(body: bytes, fields: dict[str, str] = IDENTIFY_FIELDS) -> dict[str, Any]:
    """IDENTIFY's JSON body as Go's ``json.Unmarshal`` fills nsqd's struct: known fields (by
    name, then case-insensitively) of the right type; ValueError for a wrong type or bad JSON."""
    data = json.loads(body.decode("utf-8", "replace"))
    out: dict[str, Any] = {}
    if data is None:
        return out
    if not isinstance(data, dict):
        raise ValueError("not an object")
    error = None
    for key, value in data.items():
        name = key if key in fields else key.lower()
        kind = fields.get(name)
        if kind is None or value is None:
            continue
        if kind == "str":
            ok = isinstance(value, str)
        elif kind == "bool":
            ok = isinstance(value, bool)
        else:
            ok = isinstance(value, int) and not isinstance(value, bool)
            if ok and kind == "int32":
                ok = -(2**31) <= value < 2**31
            elif ok:
                ok = -(2**63) <= value < 2**63
        if ok:
            out[name] = value
        elif error is None:
            error = ValueError(f"cannot unmarshal {key}")
    if error is not None:
        raise error
    return out


class Negotiation(NamedTuple):
    """What IDENTIFY's feature negotiation turned on (TLS is the I/O's to start)."""

    tls: bool
    snappy: bool
    deflate: bool
    deflate_level: int

    @property
    def upgrades(self) -> bool:
        """True when the stream changes after the reply (TLS or compression)."""
        return self.tls or self.snappy or self.deflate


class ProtocolV2:
    """One client connection of nsqd speaking protocol V2, without I/O.

    Bytes in: :meth:`receive_data`.  Commands out: :meth:`read_magic`, then
    :meth:`next_command` (the parameters and the end of each line, left in place until
    :meth:`advance` moves past the command and its body) and the ``parse_*`` methods for their
    arguments.  Replies out: the frames are queued in :attr:`out` and :meth:`data_to_send`
    gives them as the writes nsqd would make (compressed when compression is on).
    """

    #: IDENTIFY fields understood (name -> kind)
    identify_fields = IDENTIFY_FIELDS
    #: FIN/REQ/TOUCH carry a raw 16-byte id that may hold a newline (youzan's nsqd)
    raw_id_lines = False
    #: the E_INVALID text of a message id that is not 16 bytes
    invalid_id_text = "invalid message ID"

    def __init__(self, opts: NSQDOptions):
        self.opts = opts
        #: the client's address, for log lines
        self.remote = ""
        self.buf = bytearray()
        self.pos = 0
        self.state = STATE_MAGIC
        #: frames queued for the client, sent by :meth:`data_to_send`
        self.out: list[bytes] = []
        #: compresses one flush into the writes nsqd would make of it
        self.compress: Callable[[bytes], list[bytes]] | None = None
        self.decompress: Callable[[bytes], bytes] | None = None
        # what IDENTIFY negotiated (the client's address until then)
        self.client_id = ""
        self.hostname = ""
        self.user_agent = ""
        self.heartbeat_interval = opts.client_timeout / 2
        self.output_buffer_size = 16 * 1024
        self.output_buffer_timeout = opts.output_buffer_timeout
        self.msg_timeout = opts.msg_timeout
        self.sample_rate = 0
        self.snappy = False
        self.deflate = False
        self._mpub_progress: tuple[int, int, int, list[bytes]] | None = None

    @property
    def version(self) -> str:
        """The version IDENTIFY reports."""
        return VERSION

    # -- bytes in

    def receive_data(self, data: bytes) -> None:
        """Take bytes read from the client (decompressed once compression is on; an error of
        the decompressor propagates)."""
        if self.decompress is not None:
            data = self.decompress(data)
        self.buf += data

    def read_magic(self) -> bool:
        """Read the protocol magic: True once ``"  V2"`` is read (the state is then INIT),
        False while fewer than 4 bytes have arrived; BadProtocol for any other magic."""
        if self.state != STATE_MAGIC:
            return True
        pos = self.pos
        if len(self.buf) - pos < 4:
            return False
        magic = bytes(self.buf[pos : pos + 4])
        if magic != b"  V2":
            raise BadProtocol(magic)
        self.pos = pos + 4
        self.state = STATE_INIT
        return True

    def next_command(self) -> tuple[list[bytes], int] | None:
        """The command at the read position: its parameters (the line split on spaces) and the
        index of its newline (a body starts right after it); None until the line is complete.
        LineTooLong when the line outgrows nsqd's read buffer."""
        buf = self.buf
        pos = self.pos
        if self.raw_id_lines:
            special = self._raw_id_command(pos)
            if special is not None:
                # youzan: FIN/REQ/TOUCH with a raw id (which may hold a newline)
                return None if special[1] < 0 else special
        nl = buf.find(b"\n", pos)
        if nl < 0:
            if len(buf) - pos >= LINE_LIMIT:
                raise LineTooLong()
            return None
        end = nl
        if end > pos and buf[end - 1] == 13:
            end -= 1
        return bytes(buf[pos:end]).split(b" "), nl

    def _raw_id_command(self, pos: int) -> tuple[list[bytes], int] | None:
        """Split a command whose id is raw bytes (``raw_id_lines``): ``(params, index of its
        final newline)``, the index -1 while incomplete; None for any other command."""
        return None

    def advance(self, pos: int) -> None:
        """The command just read (and its body) ends at ``pos``: read on from there."""
        self.pos = pos

    def compact(self) -> None:
        """Drop the bytes already read (all of them, or a prefix once it is large)."""
        buf = self.buf
        pos = self.pos
        if pos >= len(buf):
            buf.clear()
            self.pos = 0
        elif pos > 65536:
            del buf[:pos]
            self.pos = 0

    def body(self, start: int, end: int) -> bytes:
        """The received bytes ``start:end`` (a command's body)."""
        return bytes(self.buf[start:end])

    def read_size(self, start: int) -> int | None:
        """The 4-byte size at ``start``, or None while it has not arrived."""
        if len(self.buf) < start + 4:
            return None
        return _I32.unpack_from(self.buf, start)[0]

    def _read_body(self, cmd: str, end: int) -> int | None:
        """End offset of the size-prefixed IDENTIFY/AUTH body at ``end``, or None while it is
        incomplete; a size over ``max_body_size`` or not positive is E_BAD_BODY."""
        size = self.read_size(end)
        if size is None:
            return None
        max_body = self.opts.max_body_size
        if size > max_body:
            raise FatalClientError("E_BAD_BODY", f"{cmd} body too big {size} > {max_body}")
        if size <= 0:
            raise FatalClientError("E_BAD_BODY", f"{cmd} invalid body size {size}")
        after = end + 4 + size
        if len(self.buf) < after:
            return None
        return after

    def _read_message_body(self, cmd: str, end: int) -> int | None:
        """End offset of the size-prefixed PUB/DPUB message body at ``end``, or None while it is
        incomplete; a size not positive or over ``max_msg_size`` is E_BAD_MESSAGE."""
        size = self.read_size(end)
        if size is None:
            return None
        if size <= 0:
            raise FatalClientError("E_BAD_MESSAGE", f"{cmd} invalid message body size {size}")
        max_msg = self.opts.max_msg_size
        if size > max_msg:
            raise FatalClientError("E_BAD_MESSAGE", f"{cmd} message too big {size} > {max_msg}")
        after = end + 4 + size
        if len(self.buf) < after:
            return None
        return after

    # -- commands: their arguments, with nsqd's checks in nsqd's order

    def check_state(self, state: int, cmd: str) -> None:
        """E_INVALID unless the client is in ``state``."""
        if self.state != state:
            raise FatalClientError("E_INVALID", f"cannot {cmd} in current state")

    def check_subscribed(self, cmd: str) -> None:
        """E_INVALID unless the client is subscribed (or closing)."""
        if self.state != STATE_SUBSCRIBED and self.state != STATE_CLOSING:
            raise FatalClientError("E_INVALID", f"cannot {cmd} in current state")

    def subscribed(self) -> None:
        """SUB succeeded: the client is subscribed."""
        self.state = STATE_SUBSCRIBED

    def parse_sub(self, params: list[bytes]) -> tuple[str, str]:
        """The topic and channel a SUB names, after nsqd's state and parameter checks."""
        self.check_state(STATE_INIT, "SUB")
        if self.heartbeat_interval <= 0:
            raise FatalClientError("E_INVALID", "cannot SUB with heartbeats disabled")
        if len(params) < 3:
            raise FatalClientError("E_INVALID", "SUB insufficient number of parameters")
        topic_name = params[1].decode("utf-8", "surrogateescape")
        if not valid_topic_name(topic_name):
            raise FatalClientError(
                "E_BAD_TOPIC", f"SUB topic name {go_quote(params[1])} is not valid"
            )
        channel_name = params[2].decode("utf-8", "surrogateescape")
        if not valid_channel_name(channel_name):
            raise FatalClientError(
                "E_BAD_CHANNEL", f"SUB channel name {go_quote(params[2])} is not valid"
            )
        return topic_name, channel_name

    def parse_rdy(self, params: list[bytes]) -> int | None:
        """The count a RDY sets; None when it is ignored (the client is closing)."""
        state = self.state
        if state == STATE_CLOSING:
            return None
        if state != STATE_SUBSCRIBED:
            raise FatalClientError("E_INVALID", "cannot RDY in current state")
        count = 1
        if len(params) > 1:
            n = base10(params[1])
            if n is None:
                raise FatalClientError("E_INVALID", b"RDY could not parse count " + params[1])
            count = to_int64(n)
        max_rdy = self.opts.max_rdy_count
        if count < 0 or count > max_rdy:
            raise FatalClientError("E_INVALID", f"RDY count {count} out of range 0-{max_rdy}")
        return count

    def parse_msg_id(self, params: list[bytes], cmd: str) -> bytes:
        """The 16-byte message id a FIN/REQ/TOUCH names."""
        if len(params) < 2:
            raise FatalClientError("E_INVALID", f"{cmd} insufficient number of params")
        msg_id = params[1]
        if len(msg_id) != 16:
            raise FatalClientError("E_INVALID", self.invalid_id_text)
        return msg_id

    def parse_req(self, params: list[bytes]) -> tuple[bytes, float]:
        """A REQ's message id and delay in seconds (above ``max_req_timeout``: clamped)."""
        if len(params) < 3:
            raise FatalClientError("E_INVALID", "REQ insufficient number of params")
        msg_id = self.parse_msg_id(params, "REQ")
        n = base10(params[2])
        if n is None:
            raise FatalClientError("E_INVALID", b"REQ could not parse timeout " + params[2])
        delay_ns = ms_to_duration_ns(n)
        max_ns = int(round(self.opts.max_req_timeout * 1e9))
        if delay_ns < 0:
            delay_ns = 0
        elif delay_ns > max_ns:
            log.info(
                "[%s] REQ timeout %d out of range 0-%d. Setting to %d",
                self.remote,
                delay_ns,
                max_ns,
                max_ns,
            )
            delay_ns = max_ns
        return msg_id, delay_ns / 1e9

    def start_closing(self) -> None:
        """CLS: the client is closing (E_INVALID unless it is subscribed)."""
        self.check_state(STATE_SUBSCRIBED, "CLS")
        self.state = STATE_CLOSING

    @staticmethod
    def parse_publish_topic(cmd: str, params: list, min_params: int, quirk: str = "") -> str:
        """The topic name a PUB/MPUB/DPUB names; ``quirk`` prefixes the E_BAD_TOPIC text (nsqd
        repeats the code in MPUB's)."""
        if len(params) < min_params:
            raise FatalClientError("E_INVALID", f"{cmd} insufficient number of parameters")
        topic_name = params[1].decode("utf-8", "surrogateescape")
        if not valid_topic_name(topic_name):
            raise FatalClientError(
                "E_BAD_TOPIC", f"{quirk}{cmd} topic name {go_quote(params[1])} is not valid"
            )
        return topic_name

    def parse_pub(self, params: list[bytes], end: int) -> tuple[str, int] | None:
        """A PUB's topic and the end of its body (which starts at ``end + 4``); None while the
        body is incomplete."""
        topic_name = self.parse_publish_topic("PUB", params, 2)
        after = self._read_message_body("PUB", end)
        if after is None:
            return None
        return topic_name, after

    def parse_dpub(self, params: list[bytes], end: int) -> tuple[str, float, int] | None:
        """A DPUB's topic, delay in seconds and the end of its body (which starts at
        ``end + 4``); None while the body is incomplete."""
        topic_name = self.parse_publish_topic("DPUB", params, 3)
        n = base10(params[2])
        if n is None:
            raise FatalClientError("E_INVALID", b"DPUB could not parse timeout " + params[2])
        delay_ns = ms_to_duration_ns(n)
        max_ns = int(round(self.opts.max_req_timeout * 1e9))
        if delay_ns < 0 or delay_ns > max_ns:
            raise FatalClientError(
                "E_INVALID", f"DPUB timeout {n} out of range 0-{max_ns // 1_000_000}"
            )
        after = self._read_message_body("DPUB", end)
        if after is None:
            return None
        return topic_name, delay_ns / 1e9, after

    def read_mpub(self, end: int) -> tuple[int, list[bytes]] | None:
        """The end and the message bodies of the MPUB body at ``end``; None while incomplete
        (what is complete is kept, not parsed again)."""
        buf = self.buf
        size = self.read_size(end)
        if size is None:
            return None
        if size <= 0:
            raise FatalClientError("E_BAD_BODY", f"MPUB invalid body size {size}")
        max_body = self.opts.max_body_size
        if size > max_body:
            raise FatalClientError("E_BAD_BODY", f"MPUB body too big {size} > {max_body}")
        count = self.read_size(end + 4)
        if count is None:
            return None
        max_messages = (max_body - 4) // 5
        if count <= 0 or count > max_messages:
            raise FatalClientError("E_BAD_BODY", f"MPUB invalid message count {count}")
        progress = self._mpub_progress
        if progress is not None and progress[0] == end:
            _, pos, i, bodies = progress
        else:
            pos, i, bodies = end + 8, 0, []
        max_msg = self.opts.max_msg_size
        n = len(buf)
        while i < count:
            if n < pos + 4:
                self._mpub_progress = (end, pos, i, bodies)
                return None
            msize = _I32.unpack_from(buf, pos)[0]
            if msize <= 0:
                self._mpub_progress = None
                raise FatalClientError(
                    "E_BAD_MESSAGE", f"MPUB invalid message({i}) body size {msize}"
                )
            if msize > max_msg:
                self._mpub_progress = None
                raise FatalClientError("E_BAD_MESSAGE", f"MPUB message too big {msize} > {max_msg}")
            if n < pos + 4 + msize:
                self._mpub_progress = (end, pos, i, bodies)
                return None
            bodies.append(bytes(buf[pos + 4 : pos + 4 + msize]))
            pos += 4 + msize
            i += 1
        self._mpub_progress = None
        return pos, bodies

    def parse_auth(self, params: list[bytes], end: int) -> tuple[int, str] | None:
        """The end of an AUTH's body and the secret in it; None while the body is
        incomplete."""
        self.check_state(STATE_INIT, "AUTH")
        if len(params) != 1:
            raise FatalClientError("E_INVALID", "AUTH invalid number of parameters")
        after = self._read_body("AUTH", end)
        if after is None:
            return None
        return after, self.body(end + 4, after).decode("utf-8", "replace")

    # -- IDENTIFY

    def parse_identify(self, end: int) -> tuple[int, dict[str, Any]] | None:
        """Read the IDENTIFY at ``end`` and take the client's settings from it: the end of its
        body and its fields; None while the body is incomplete."""
        self.check_state(STATE_INIT, "IDENTIFY")
        after = self._read_body("IDENTIFY", end)
        if after is None:
            return None
        try:
            data = decode_identify(self.body(end + 4, after), self.identify_fields)
        except ValueError as exc:
            raise FatalClientError("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from exc
        self.apply_identify(data)
        return after, data

    def apply_identify(self, data: dict[str, Any]) -> None:
        """Take the client's settings from IDENTIFY's fields (E_BAD_BODY for one out of
        range)."""
        opts = self.opts
        self.client_id = data.get("client_id", "")
        self.hostname = data.get("hostname", "")
        self.user_agent = data.get("user_agent", "")
        hb = data.get("heartbeat_interval", 0)
        if hb == -1:
            self.heartbeat_interval = 0
        elif hb == 0:
            pass
        elif 1000 <= hb <= ms(opts.max_heartbeat_interval):
            self.heartbeat_interval = hb / 1000
        else:
            raise FatalClientError("E_BAD_BODY", f"IDENTIFY heartbeat interval ({hb}) is invalid")
        obt = data.get("output_buffer_timeout", 0)
        if obt == -1:
            self.output_buffer_timeout = 0
        elif obt == 0:
            pass
        elif ms(opts.min_output_buffer_timeout) <= obt <= ms(opts.max_output_buffer_timeout):
            self.output_buffer_timeout = obt / 1000
        else:
            raise FatalClientError(
                "E_BAD_BODY", f"IDENTIFY output buffer timeout ({obt}) is invalid"
            )
        obs = data.get("output_buffer_size", 0)
        if obs == -1:
            self.output_buffer_size = 1
            self.output_buffer_timeout = 0
        elif obs == 0:
            pass
        elif 64 <= obs <= opts.max_output_buffer_size:
            self.output_buffer_size = obs
        else:
            raise FatalClientError("E_BAD_BODY", f"IDENTIFY output buffer size ({obs}) is invalid")
        rate = data.get("sample_rate", 0)
        if rate < 0 or rate > 99:
            raise FatalClientError("E_BAD_BODY", f"IDENTIFY sample rate ({rate}) is invalid")
        self.sample_rate = rate
        mt = data.get("msg_timeout", 0)
        if mt == 0:
            pass
        elif 1000 <= mt <= ms(opts.max_msg_timeout):
            self.msg_timeout = mt / 1000
        else:
            raise FatalClientError("E_BAD_BODY", f"IDENTIFY msg timeout ({mt}) is invalid")

    def negotiate(
        self, data: dict[str, Any], tls_available: bool, auth_required: bool
    ) -> tuple[bytes, Negotiation]:
        """Feature negotiation for IDENTIFY's ``data``: the JSON reply frame and what it turns
        on (TLS only when the node has a certificate)."""
        opts = self.opts
        tls_v1 = tls_available and bool(data.get("tls_v1"))
        deflate = opts.deflate and bool(data.get("deflate"))
        deflate_level = 6
        if deflate and data.get("deflate_level", 0) > 0:
            deflate_level = data["deflate_level"]
        deflate_level = min(deflate_level, opts.max_deflate_level)
        snappy_on = opts.snappy and bool(data.get("snappy"))
        if deflate and snappy_on:
            raise FatalClientError(
                "E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression"
            )
        reply = {
            "max_rdy_count": opts.max_rdy_count,
            "version": self.version,
            "max_msg_timeout": ms(opts.max_msg_timeout),
            "msg_timeout": ms(self.msg_timeout),
            "tls_v1": tls_v1,
            "deflate": deflate,
            "deflate_level": deflate_level,
            "max_deflate_level": opts.max_deflate_level,
            "snappy": snappy_on,
            "sample_rate": self.sample_rate,
            "auth_required": auth_required,
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": ms(self.output_buffer_timeout),
        }
        frame = encode_frame(FRAME_TYPE_RESPONSE, go_json(reply))
        return frame, Negotiation(tls_v1, snappy_on, deflate, deflate_level)

    def split_upgraded(self, after: int) -> bytes:
        """Take out the bytes received after the IDENTIFY that ends at ``after``: they belong
        to the upgraded stream."""
        rest = bytes(self.buf[after:])
        del self.buf[after:]
        return rest

    def start_compression(self, snappy_on: bool, deflate: bool, level: int) -> None:
        """Switch both directions to snappy or deflate: what :meth:`data_to_send` gives from now
        on is compressed, and what :meth:`receive_data` takes is decompressed."""
        decompress: Callable[[bytes], bytes]
        if snappy_on:
            import snappy as _snappy  # python-snappy (framed stream)

            comp = _snappy.StreamCompressor()
            decomp = _snappy.StreamDecompressor()

            def snappy_compress(data: bytes, _c: Any = comp) -> list[bytes]:
                return snappy_writes(_c.compress(data))

            self.compress = snappy_compress
            decompress = decomp.decompress
            self.snappy = True
        else:
            zcomp = zlib.compressobj(level, zlib.DEFLATED, -15)
            zdecomp = zlib.decompressobj(-15)

            def compress(data: bytes, _c: Any = zcomp) -> list[bytes]:
                return [_c.compress(data) + _c.flush(zlib.Z_SYNC_FLUSH)]

            self.compress = compress
            decompress = zdecomp.decompress
            self.deflate = True
        self.decompress = decompress

    def decompress_unread(self) -> None:
        """Decompress the unread bytes that arrived before compression was switched on (over
        TLS, while it was being started)."""
        if self.buf and self.decompress is not None and self.pos < len(self.buf):
            pending = bytes(self.buf[self.pos :])
            del self.buf[self.pos :]
            self.buf += self.decompress(pending)

    # -- bytes out

    def data_to_send(self) -> list[bytes]:
        """The queued frames as the writes nsqd makes of one flush (one, or snappy's chunks),
        compressed when compression is on; the queue is emptied."""
        data = b"".join(self.out)
        self.out.clear()
        return [data] if self.compress is None else self.compress(data)
