"""nsqd's TCP protocol V2, one :class:`ClientConn` per connection: parse commands out of the
receive buffer and answer them as nsqd 1.3.0 does (``nsqd/protocol_v2.go``, ``client_v2.go``).

The same commands, states, error codes and texts, the same fatal/non-fatal split, the same
limits, checked in the same order.  IDENTIFY negotiates heartbeats, output buffering, sampling,
TLS, snappy and deflate; AUTH asks the auth server (see :mod:`.auth`) without blocking the loop.
The node is seen through the :class:`Server` protocol, so this module does not import it.

Output frames are queued per client and written with one ``transport.write`` per event-loop
pass (see :mod:`.writes` for how writes are cut up on their way out).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import struct
import time
import zlib
from collections.abc import Callable
from typing import Any, Protocol, cast

from ...protocol import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_RESPONSE,
    encode_frame,
    valid_channel_name,
    valid_topic_name,
)
from ..gostyle.text import VERSION, go_json, go_quote
from .auth import AuthState, query_auth
from .ids import GUIDFactory
from .options import NSQDOptions, ms
from .queues import (
    IRREGULAR,
    STATE_CLOSING,
    STATE_INIT,
    STATE_SUBSCRIBED,
    Channel,
    Message,
    Topic,
)
from .writes import Output, WriteSplitter, snappy_writes

__all__ = ["ClientConn", "Server", "FatalClientError", "ClientError"]

log = logging.getLogger("nsqclient.testing.protocol_v2")

_I32 = struct.Struct(">i")
_LINE_LIMIT = 16 * 1024  # nsqd's bufio reader size: a longer line is a read error

_OK_FRAME = encode_frame(FRAME_TYPE_RESPONSE, b"OK")
_HEARTBEAT_FRAME = encode_frame(FRAME_TYPE_RESPONSE, b"_heartbeat_")
_CLOSE_WAIT_FRAME = encode_frame(FRAME_TYPE_RESPONSE, b"CLOSE_WAIT")

_NEED_MORE = -1  # a command handler's "not enough bytes yet"
_BLOCKED = -2  # a command handler's "waiting for something asynchronous; run me again"
_STATE_MAGIC = -1  # before the "  V2" magic


class Server(Protocol):
    """What a client connection needs of its nsqd node."""

    loop: asyncio.AbstractEventLoop
    opts: NSQDOptions
    guid: GUIDFactory
    conns: set[ClientConn]
    stalled: bool
    auth_enabled: bool
    ssl_context: ssl.SSLContext | None

    def next_client_id(self) -> int:
        """A new client id (1, 2, ...)."""

    def schedule_flush(self, conn: ClientConn) -> None:
        """Write ``conn``'s queued output on the next pass of the loop."""

    def mark_dirty(self, channel: Channel) -> None:
        """Pump ``channel`` on the next pass of the loop."""

    def get_topic(self, name: str) -> Topic:
        """The topic ``name``, created on first use."""

    def write_splitter(self, client_id: int) -> WriteSplitter | None:
        """The fault control that cuts this client's writes up, or None (the default)."""


def _base10(raw: bytes) -> int | None:
    """nsqd's ByteToBase10: digits only (empty is 0), wrapping at 2**64; None when invalid."""
    n = 0
    for b in raw:
        if not 48 <= b <= 57:
            return None
        n = (n * 10 + b - 48) & 0xFFFFFFFFFFFFFFFF
    return n


def _to_int64(n: int) -> int:
    n &= 0xFFFFFFFFFFFFFFFF
    return n - (1 << 64) if n >= 1 << 63 else n


def _ms_to_duration_ns(ms_u64: int) -> int:
    """``time.Duration(ms) * time.Millisecond`` with Go's int64 wrap-around."""
    return _to_int64(_to_int64(ms_u64) * 1_000_000)


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


_IDENTIFY_FIELDS: dict[str, str] = {
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


def _decode_identify(body: bytes, fields: dict[str, str] = _IDENTIFY_FIELDS) -> dict[str, Any]:
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


class ClientConn(asyncio.Protocol):
    """One TCP client of nsqd speaking protocol V2."""

    #: the connection is closed when no command came for this many heartbeat intervals
    read_deadline_factor = 2
    #: IDENTIFY fields understood (name -> kind)
    identify_fields = _IDENTIFY_FIELDS
    #: FIN/REQ/TOUCH carry a raw 16-byte id that may hold a newline (youzan's nsqd)
    raw_id_lines = False

    def __init__(self, nsqd: Server):
        self.nsqd = nsqd
        self.opts = nsqd.opts
        self.loop = nsqd.loop
        self.id = nsqd.next_client_id()
        self.transport: asyncio.Transport | None = None
        self.raw_transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.pos = 0
        self.state = _STATE_MAGIC
        self.closed = False
        self.blocked = False
        self.write_paused = False
        self.out: list[bytes] = []
        self.flush_scheduled = False
        #: compresses one flush into the writes nsqd would make of it
        self.compress: Callable[[bytes], list[bytes]] | None = None
        self.decompress: Callable[[bytes], bytes] | None = None
        self.output: Output | None = None
        self.remote = ""
        self.remote_ip = ""
        self.client_id = ""
        self.hostname = ""
        self.user_agent = ""
        self.heartbeat_interval = self.opts.client_timeout / 2
        self.output_buffer_size = 16 * 1024
        self.output_buffer_timeout = self.opts.output_buffer_timeout
        self.msg_timeout = self.opts.msg_timeout
        self.sample_rate = 0
        self.tls = False
        self.snappy = False
        self.deflate = False
        self.rdy = 0
        self.in_flight_count = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts: dict[str, int] = {}
        self.connect_ts = int(time.time())
        self.channel: Channel | None = None
        self.in_ready = False
        self.auth_secret = ""
        self.auth_state: AuthState | None = None
        self._auth_result: AuthState | Exception | None = None
        self.last_cmd = 0.0
        self._hb_timer: asyncio.TimerHandle | None = None
        self._hb_next = 0.0
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._pending_task: asyncio.Task | None = None
        self._mpub_progress: tuple[int, int, int, list[bytes]] | None = None

    # -- asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)
        self.transport = self.raw_transport = transport
        self.output = Output(self.loop, transport, self.nsqd.write_splitter(self.id))
        peer = transport.get_extra_info("peername")
        if peer:
            self.remote_ip = peer[0]
            self.remote = f"{peer[0]}:{peer[1]}"
            self.client_id = self.hostname = peer[0]
        self.nsqd.conns.add(self)
        self.last_cmd = self.loop.time()
        if self.nsqd.stalled:
            transport.pause_reading()

    def connection_lost(self, exc):
        self._teardown()

    def pause_writing(self):
        self.write_paused = True

    def resume_writing(self):
        self.write_paused = False
        if self.channel is not None:
            self.channel.client_maybe_ready(self)

    def data_received(self, data):
        if self.closed:
            return
        if self.decompress is not None:
            try:
                data = self.decompress(data)
            except Exception:
                log.info("[%s] failed to decompress input; closing", self.remote)
                self.close()
                return
        self.buf += data
        if not self.blocked and not self.nsqd.stalled:
            self.process()

    def eof_received(self):
        return False

    # -- lifecycle

    def _teardown(self) -> None:
        if self.closed and self.transport is None:
            return
        self.closed = True
        for timer in (self._hb_timer, self._deadline_timer):
            if timer is not None:
                timer.cancel()
        self._hb_timer = self._deadline_timer = None
        if self._pending_task is not None and not self._pending_task.done():
            self._pending_task.cancel()
        self.nsqd.conns.discard(self)
        channel = self.channel
        if channel is not None:
            channel.remove_client(self)
        self.transport = None
        self.out.clear()
        if self.output is not None:
            self.output.discard()

    def close(self) -> None:
        """Flush what is queued and close (nsqd closing the connection)."""
        if self.transport is None:
            return
        if self.out and not self.nsqd.stalled:
            self._write_out()
        transport = self.transport
        self.closed = True
        if self.output is not None:
            self.output.drain_now()
        transport.close()
        self._teardown()

    def abort(self) -> None:
        """Drop the connection at once, nothing flushed."""
        transport = self.transport
        if transport is None:
            return
        self.closed = True
        transport.abort()
        self._teardown()

    def resume(self) -> None:
        """Continue after the node is unstalled."""
        if self.transport is None:
            return
        self.last_cmd = self.loop.time()
        if not self.blocked:
            self.transport.resume_reading()
        if self.out:
            self.nsqd.schedule_flush(self)
        if self.state != _STATE_MAGIC:
            self._arm_deadline()
        if not self.blocked:
            self.process()

    # -- output

    def write(self, data: bytes) -> None:
        self.out.append(data)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.nsqd.schedule_flush(self)

    def write_parts(self, a: bytes, b: bytes, c: bytes) -> None:
        out = self.out
        out.append(a)
        out.append(b)
        out.append(c)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.nsqd.schedule_flush(self)

    def flush(self) -> None:
        self.flush_scheduled = False
        if self.transport is None or not self.out or self.nsqd.stalled:
            return
        self._write_out()

    def _write_out(self) -> None:
        data = b"".join(self.out)
        self.out.clear()
        if self.output is not None:
            self.output.write([data] if self.compress is None else self.compress(data))

    def send_response(self, data: bytes) -> None:
        self.write(encode_frame(FRAME_TYPE_RESPONSE, data))

    def send_error(self, body: bytes) -> None:
        self.write(encode_frame(FRAME_TYPE_ERROR, body))

    # -- timers

    def _start_heartbeats(self) -> None:
        if self._hb_timer is not None:
            self._hb_timer.cancel()
            self._hb_timer = None
        if self.heartbeat_interval > 0:
            # absolute ticks, like Go's time.Ticker (no drift)
            self._hb_next = self.loop.time() + self.heartbeat_interval
            self._hb_timer = self.loop.call_at(self._hb_next, self._heartbeat)

    def _heartbeat(self) -> None:
        self._hb_timer = None
        if self.transport is None:
            return
        if not self.nsqd.stalled:
            self.write(_HEARTBEAT_FRAME)
        now = self.loop.time()
        self._hb_next += self.heartbeat_interval
        if self._hb_next <= now:  # fell behind (e.g. stalled): skip missed ticks
            self._hb_next = now + self.heartbeat_interval
        self._hb_timer = self.loop.call_at(self._hb_next, self._heartbeat)

    def _arm_deadline(self) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        if self.heartbeat_interval > 0 and self.transport is not None:
            self._deadline_timer = self.loop.call_at(
                self.last_cmd + self.read_deadline_factor * self.heartbeat_interval,
                self._check_deadline,
            )

    def _check_deadline(self) -> None:
        self._deadline_timer = None
        if self.transport is None or self.heartbeat_interval <= 0:
            return
        if self.nsqd.stalled:
            return  # re-armed on resume
        due = self.last_cmd + self.read_deadline_factor * self.heartbeat_interval
        if self.loop.time() >= due - 1e-6:
            log.info(
                "[%s] read deadline passed (no command in %.3fs); closing",
                self.remote,
                self.read_deadline_factor * self.heartbeat_interval,
            )
            self.close()
            return
        self._deadline_timer = self.loop.call_at(due, self._check_deadline)

    # -- input

    def process(self) -> None:
        """Run every complete command in the buffer."""
        if self.closed or self.blocked:
            return
        buf = self.buf
        pos = self.pos
        if self.state == _STATE_MAGIC:
            if len(buf) - pos < 4:
                return
            magic = bytes(buf[pos : pos + 4])
            if magic != b"  V2":
                log.info("client(%s) bad protocol magic %r", self.remote, magic)
                self.write(encode_frame(FRAME_TYPE_ERROR, b"E_BAD_PROTOCOL"))
                self.close()
                return
            pos += 4
            self.state = STATE_INIT
            self.last_cmd = self.loop.time()
            self._start_heartbeats()
            self._arm_deadline()
        handlers = self._handlers
        tls_required = self.opts.tls_required
        raw_id_lines = self.raw_id_lines
        ran = False
        try:
            while not self.closed and not self.blocked:
                special = self._raw_id_command(pos) if raw_id_lines else None
                if special is not None:
                    # youzan: FIN/REQ/TOUCH with a raw id (which may hold a newline)
                    params, nl = special
                    if nl < 0:
                        break  # the rest of the command has not arrived
                else:
                    nl = buf.find(b"\n", pos)
                    if nl < 0:
                        if len(buf) - pos >= _LINE_LIMIT:
                            log.info("[%s] command line too long; closing", self.remote)
                            self.pos = pos
                            self.close()
                            return
                        break
                    end = nl
                    if end > pos and buf[end - 1] == 13:
                        end -= 1
                    params = bytes(buf[pos:end]).split(b" ")
                handler = handlers.get(params[0])
                try:
                    if tls_required and not self.tls and params[0] != b"IDENTIFY":
                        raise FatalClientError(
                            "E_INVALID",
                            b"cannot " + params[0] + b" in current state (TLS required)",
                        )
                    if handler is None:
                        raise FatalClientError("E_INVALID", b"invalid command " + params[0])
                    nxt = handler(self, params, nl + 1)
                except FatalClientError as err:
                    ran = True
                    self.send_error(err.frame_body())
                    if err.fatal:
                        log.info("[%s] fatal error %s", self.remote, err.frame_body()[:200])
                        self.pos = pos
                        self.close()
                        return
                    pos = nl + 1
                    continue
                if nxt < 0:
                    break  # _NEED_MORE or _BLOCKED: run this command again later
                ran = True
                pos = nxt
        finally:
            if self.transport is not None:
                if pos >= len(buf):
                    buf.clear()
                    pos = 0
                elif pos > 65536:
                    del buf[:pos]
                    pos = 0
                self.pos = pos
                if ran:
                    self.last_cmd = self.loop.time()
                    # answer what this chunk asked at once (deliveries follow in _run)
                    if self.out and not self.nsqd.stalled and not self.blocked:
                        self._write_out()

    @property
    def server_version(self) -> str:
        """The version IDENTIFY reports."""
        return VERSION

    def _raw_id_command(self, pos: int) -> tuple[list[bytes], int] | None:
        """Split a command whose id is raw bytes (``raw_id_lines``): ``(params, index of its
        final newline)``, the index -1 while incomplete; None for any other command."""
        return None

    def _read_size(self, start: int) -> int | None:
        if len(self.buf) < start + 4:
            return None
        return _I32.unpack_from(self.buf, start)[0]

    def _read_body(self, cmd: str, end: int) -> int | None:
        """End offset of the size-prefixed IDENTIFY/AUTH body at ``end``, or None while it is
        incomplete; a size over ``max_body_size`` or not positive is E_BAD_BODY."""
        size = self._read_size(end)
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
        size = self._read_size(end)
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

    @staticmethod
    def _publish_topic(cmd: str, params: list, min_params: int, quirk: str = "") -> str:
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

    # -- commands

    def _cmd_nop(self, params, end):
        return end

    def _cmd_identify(self, params, end):
        if self.state != STATE_INIT:
            raise FatalClientError("E_INVALID", "cannot IDENTIFY in current state")
        after = self._read_body("IDENTIFY", end)
        if after is None:
            return _NEED_MORE
        body = bytes(self.buf[end + 4 : after])
        try:
            data = _decode_identify(body, self.identify_fields)
        except ValueError as exc:
            raise FatalClientError("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from exc
        self._apply_identify(data)
        if not data.get("feature_negotiation"):
            self.write(_OK_FRAME)
            return after
        opts = self.opts
        tls_v1 = self.nsqd.ssl_context is not None and bool(data.get("tls_v1"))
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
            "version": self.server_version,
            "max_msg_timeout": ms(opts.max_msg_timeout),
            "msg_timeout": ms(self.msg_timeout),
            "tls_v1": tls_v1,
            "deflate": deflate,
            "deflate_level": deflate_level,
            "max_deflate_level": opts.max_deflate_level,
            "snappy": snappy_on,
            "sample_rate": self.sample_rate,
            "auth_required": self.nsqd.auth_enabled,
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": ms(self.output_buffer_timeout),
        }
        self.write(encode_frame(FRAME_TYPE_RESPONSE, go_json(reply)))
        if not (tls_v1 or deflate or snappy_on):
            return after
        # Upgrade: everything queued goes out in the clear first; bytes already received
        # after the IDENTIFY belong to the upgraded stream.
        self._write_out()
        self.flush_scheduled = False
        rest = bytes(self.buf[after:])
        del self.buf[after:]
        if tls_v1:
            self.blocked = True
            if self.transport is not None:
                self.transport.pause_reading()
            self._pending_task = self.loop.create_task(
                self._upgrade_tls(rest, snappy_on, deflate, deflate_level)
            )
            return after
        decompress = self._upgrade_compression(snappy_on, deflate, deflate_level)
        if rest:
            self.buf += decompress(rest)
        return after

    def _apply_identify(self, data: dict[str, Any]) -> None:
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
        # nsqd restarts the heartbeat ticker with the negotiated interval
        self._start_heartbeats()
        self._arm_deadline()

    async def _upgrade_tls(self, rest: bytes, snappy_on: bool, deflate: bool, level: int):
        try:
            if rest:
                raise ConnectionError("client sent data before the TLS handshake")
            if self.transport is None or self.nsqd.ssl_context is None:
                raise ConnectionError("connection closed before the TLS handshake")
            if self.output is not None:
                self.output.drain_now()
            transport = await self.loop.start_tls(
                self.transport,
                self,
                self.nsqd.ssl_context,
                server_side=True,
                ssl_handshake_timeout=5.0,
            )
        except (Exception, asyncio.CancelledError) as exc:
            log.info("[%s] TLS upgrade failed: %s", self.remote, exc)
            if self.transport is not None:
                self.abort()
            return
        if self.closed or transport is None:
            return
        self.transport = transport
        ssl_object = transport.get_extra_info("ssl_object")
        if self.opts.tls_client_auth_policy and (
            ssl_object is None or ssl_object.getpeercert(binary_form=True) is None
        ):
            # Go's RequireAnyClientCert / RequireAndVerifyClientCert fail the handshake
            log.info("[%s] TLS upgrade failed: client didn't provide a certificate", self.remote)
            self.close()
            return
        self.output = Output(self.loop, transport, self.output.splitter if self.output else None)
        self.tls = True
        self.write(_OK_FRAME)
        self._write_out()
        self.flush_scheduled = False
        if snappy_on or deflate:
            self._upgrade_compression(snappy_on, deflate, level)
        self.blocked = False
        self._pending_task = None
        if self.buf and self.decompress is not None and self.pos < len(self.buf):
            # bytes that arrived over TLS while we were upgrading are compressed already
            pending = bytes(self.buf[self.pos :])
            del self.buf[self.pos :]
            self.buf += self.decompress(pending)
        self.process()

    def _upgrade_compression(
        self, snappy_on: bool, deflate: bool, level: int
    ) -> Callable[[bytes], bytes]:
        """Switch both directions to snappy or deflate; return the input decompressor."""
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
        self.write(_OK_FRAME)
        self._write_out()
        self.flush_scheduled = False
        return decompress

    # auth

    def _cmd_auth(self, params, end):
        if self.state != STATE_INIT:
            raise FatalClientError("E_INVALID", "cannot AUTH in current state")
        if len(params) != 1:
            raise FatalClientError("E_INVALID", "AUTH invalid number of parameters")
        after = self._read_body("AUTH", end)
        if after is None:
            return _NEED_MORE
        if self.auth_state is not None and self.auth_state.authorizations:
            raise FatalClientError("E_INVALID", "AUTH already set")
        if not self.nsqd.auth_enabled:
            raise FatalClientError("E_AUTH_DISABLED", "AUTH disabled")
        result = self._auth_result
        if result is None:
            self.auth_secret = bytes(self.buf[end + 4 : after]).decode("utf-8", "replace")
            self._query_auth()
            return _BLOCKED
        self._auth_result = None
        if isinstance(result, Exception):
            log.info("[%s] AUTH failed %s", self.remote, result)
            raise FatalClientError("E_AUTH_FAILED", "AUTH failed")
        self.auth_state = result
        if not result.authorizations:
            raise FatalClientError("E_UNAUTHORIZED", "AUTH no authorizations found")
        self.send_response(
            go_json(
                {
                    "identity": result.identity,
                    "identity_url": result.identity_url,
                    "permission_count": len(result.authorizations),
                }
            )
        )
        return after

    def _query_auth(self) -> None:
        self.blocked = True
        if self.transport is not None:
            self.transport.pause_reading()
        self._pending_task = self.loop.create_task(self._run_auth_query())

    async def _run_auth_query(self) -> None:
        opts = self.opts
        result: AuthState | Exception
        try:
            result = await query_auth(
                list(opts.auth_http_address or []),
                remote_ip=self.remote_ip,
                secret=self.auth_secret,
                tls=self.tls,
                common_name=self._peer_common_name(),
                connect_timeout=opts.http_client_connect_timeout,
                request_timeout=opts.http_client_request_timeout,
                now=self.loop.time(),
            )
        except ValueError as exc:
            result = exc
        self._auth_result = result
        self._pending_task = None
        if self.transport is None:
            return
        self.blocked = False
        if not self.nsqd.stalled:
            self.transport.resume_reading()
            self.process()

    def _wait_for(self, topic: Topic) -> int:
        """Hold this connection's commands until ``topic`` knows its channels (nsqd's PUB and
        SUB wait while GetTopic asks nsqlookupd); the command runs again then."""
        self.blocked = True
        if self.transport is not None:
            self.transport.pause_reading()
        topic.when_loaded(self._topic_loaded)
        return _BLOCKED

    def _topic_loaded(self) -> None:
        if self.transport is None or self.closed:
            return
        self.blocked = False
        if not self.nsqd.stalled:
            self.transport.resume_reading()
            self.process()

    def _peer_common_name(self) -> str:
        """The subject CN of the client's TLS certificate (what nsqd sends as common_name)."""
        if not self.tls or self.transport is None:
            return ""
        cert = self.transport.get_extra_info("peercert")
        for rdn in (cert or {}).get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    return str(value)
        return ""

    def _check_auth(self, cmd: str, topic: str, channel: str) -> bool:
        """True when allowed; False when a refresh was started (run the command again)."""
        if not self.nsqd.auth_enabled:
            return True
        state = self.auth_state
        if state is None or not state.authorizations:
            raise FatalClientError("E_AUTH_FIRST", f"AUTH required before {cmd}")
        if state.expires <= self.loop.time():
            result = self._auth_result
            if result is None:
                self._query_auth()
                return False
            self._auth_result = None
            if isinstance(result, Exception):
                log.info("[%s] AUTH failed %s", self.remote, result)
                raise FatalClientError("E_AUTH_FAILED", "AUTH failed")
            self.auth_state = state = result
        if not state.is_allowed(topic, channel):
            raise FatalClientError(
                "E_UNAUTHORIZED",
                f"AUTH failed for {cmd} on {go_quote(topic.encode())} {go_quote(channel.encode())}",
            )
        return True

    # subscribe and flow control

    def _sub_names(self, params: list[bytes]) -> tuple[str, str]:
        """The topic and channel a SUB names, after nsqd's state and parameter checks."""
        if self.state != STATE_INIT:
            raise FatalClientError("E_INVALID", "cannot SUB in current state")
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

    def _cmd_sub(self, params, end):
        topic_name, channel_name = self._sub_names(params)
        if not self._check_auth("SUB", topic_name, channel_name):
            return _BLOCKED
        topic = self.nsqd.get_topic(topic_name)
        if topic.loading:
            return self._wait_for(topic)
        channel = topic.get_channel(channel_name)
        err = channel.add_client(self)
        if err is not None:
            raise FatalClientError("E_SUB_FAILED", "SUB failed " + err)
        self.state = STATE_SUBSCRIBED
        self.channel = channel
        self.write(_OK_FRAME)
        return end

    def _cmd_rdy(self, params, end):
        state = self.state
        if state == STATE_CLOSING:
            return end
        if state != STATE_SUBSCRIBED:
            raise FatalClientError("E_INVALID", "cannot RDY in current state")
        count = 1
        if len(params) > 1:
            n = _base10(params[1])
            if n is None:
                raise FatalClientError("E_INVALID", b"RDY could not parse count " + params[1])
            count = _to_int64(n)
        max_rdy = self.opts.max_rdy_count
        if count < 0 or count > max_rdy:
            raise FatalClientError("E_INVALID", f"RDY count {count} out of range 0-{max_rdy}")
        self.rdy = count
        self._rdy_changed()
        return end

    def _rdy_changed(self) -> None:
        """After RDY set a new count: let the channel send what it now may."""
        self._subscribed("RDY").client_maybe_ready(self)

    def _check_subscribed(self, cmd: str) -> None:
        """E_INVALID unless the client is subscribed (or closing)."""
        if self.state != STATE_SUBSCRIBED and self.state != STATE_CLOSING:
            raise FatalClientError("E_INVALID", f"cannot {cmd} in current state")

    def _subscribed(self, cmd: str) -> Channel:
        """The channel of a subscribed (or closing) client; E_INVALID in any other state."""
        self._check_subscribed(cmd)
        channel = self.channel
        if channel is None:
            raise FatalClientError("E_INVALID", f"cannot {cmd} in current state")
        return channel

    #: the E_INVALID text of a message id that is not 16 bytes
    invalid_id_text = "invalid message ID"

    def _msg_id(self, params, cmd: str) -> bytes:
        if len(params) < 2:
            raise FatalClientError("E_INVALID", f"{cmd} insufficient number of params")
        msg_id = params[1]
        if len(msg_id) != 16:
            raise FatalClientError("E_INVALID", self.invalid_id_text)
        return msg_id

    def _cmd_fin(self, params, end):
        channel = self._subscribed("FIN")
        msg_id = self._msg_id(params, "FIN")
        # fast path of Channel.finish()
        msg = channel.in_flight.get(msg_id)
        if msg is not None and msg.client is self:
            del channel.in_flight[msg_id]
            bucket = msg.bucket
            if bucket is not None and bucket != IRREGULAR:
                channel.buckets[bucket].pop(msg_id, None)
            msg.bucket = None
        else:
            err = channel.finish(self, msg_id)
            if err is not None:
                raise ClientError("E_FIN_FAILED", b"FIN " + msg_id + b" failed " + err.encode())
        self.finish_count += 1
        self.in_flight_count -= 1
        if not self.in_ready:
            channel.client_maybe_ready(self)
        elif channel.queue:
            self.nsqd.mark_dirty(channel)
        return end

    def _cmd_req(self, params, end):
        channel = self._subscribed("REQ")
        if len(params) < 3:
            raise FatalClientError("E_INVALID", "REQ insufficient number of params")
        msg_id = self._msg_id(params, "REQ")
        n = _base10(params[2])
        if n is None:
            raise FatalClientError("E_INVALID", b"REQ could not parse timeout " + params[2])
        delay_ns = _ms_to_duration_ns(n)
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
        err = channel.requeue(self, msg_id, delay_ns / 1e9)
        if err is not None:
            raise ClientError("E_REQ_FAILED", b"REQ " + msg_id + b" failed " + err.encode())
        self.requeue_count += 1
        self.in_flight_count -= 1
        channel.client_maybe_ready(self)
        return end

    def _cmd_touch(self, params, end):
        channel = self._subscribed("TOUCH")
        msg_id = self._msg_id(params, "TOUCH")
        err = channel.touch(self, msg_id, self.msg_timeout)
        if err is not None:
            raise ClientError("E_TOUCH_FAILED", b"TOUCH " + msg_id + b" failed " + err.encode())
        return end

    def _cmd_cls(self, params, end):
        if self.state != STATE_SUBSCRIBED:
            raise FatalClientError("E_INVALID", "cannot CLS in current state")
        self.rdy = 0
        self.state = STATE_CLOSING
        self.write(_CLOSE_WAIT_FRAME)
        return end

    # publishing

    def _cmd_pub(self, params, end):
        topic_name = self._publish_topic("PUB", params, 2)
        after = self._read_message_body("PUB", end)
        if after is None:
            return _NEED_MORE
        if not self._check_auth("PUB", topic_name, ""):
            return _BLOCKED
        nsqd = self.nsqd
        topic = nsqd.get_topic(topic_name)
        if topic.loading:
            return self._wait_for(topic)
        topic.put(Message(nsqd.guid.new(), bytes(self.buf[end + 4 : after])))
        self.pub_counts[topic_name] = self.pub_counts.get(topic_name, 0) + 1
        self.write(_OK_FRAME)
        return after

    def _cmd_mpub(self, params, end):
        topic_name = self._publish_topic("MPUB", params, 2, quirk="E_BAD_TOPIC ")
        if not self._check_auth("MPUB", topic_name, ""):
            return _BLOCKED
        nsqd = self.nsqd
        topic = nsqd.get_topic(topic_name)
        if topic.loading:
            return self._wait_for(topic)
        buf = self.buf
        size = self._read_size(end)
        if size is None:
            return _NEED_MORE
        if size <= 0:
            raise FatalClientError("E_BAD_BODY", f"MPUB invalid body size {size}")
        max_body = self.opts.max_body_size
        if size > max_body:
            raise FatalClientError("E_BAD_BODY", f"MPUB body too big {size} > {max_body}")
        count = self._read_size(end + 4)
        if count is None:
            return _NEED_MORE
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
                return _NEED_MORE
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
                return _NEED_MORE
            bodies.append(bytes(buf[pos + 4 : pos + 4 + msize]))
            pos += 4 + msize
            i += 1
        self._mpub_progress = None
        ts = time.time_ns()
        topic.put_many(
            [
                Message(i, b, ts)
                for i, b in zip(nsqd.guid.new_many(len(bodies)), bodies, strict=True)
            ]
        )
        self.pub_counts[topic_name] = self.pub_counts.get(topic_name, 0) + len(bodies)
        self.write(_OK_FRAME)
        return pos

    def _cmd_dpub(self, params, end):
        topic_name = self._publish_topic("DPUB", params, 3)
        n = _base10(params[2])
        if n is None:
            raise FatalClientError("E_INVALID", b"DPUB could not parse timeout " + params[2])
        delay_ns = _ms_to_duration_ns(n)
        max_ns = int(round(self.opts.max_req_timeout * 1e9))
        if delay_ns < 0 or delay_ns > max_ns:
            raise FatalClientError(
                "E_INVALID", f"DPUB timeout {n} out of range 0-{max_ns // 1_000_000}"
            )
        after = self._read_message_body("DPUB", end)
        if after is None:
            return _NEED_MORE
        if not self._check_auth("DPUB", topic_name, ""):
            return _BLOCKED
        topic = self.nsqd.get_topic(topic_name)
        if topic.loading:
            return self._wait_for(topic)
        msg = Message(self.nsqd.guid.new(), bytes(self.buf[end + 4 : after]))
        msg.deferred = delay_ns / 1e9
        topic.put(msg)
        self.pub_counts[topic_name] = self.pub_counts.get(topic_name, 0) + 1
        self.write(_OK_FRAME)
        return after

    _handlers = {
        b"IDENTIFY": _cmd_identify,
        b"FIN": _cmd_fin,
        b"RDY": _cmd_rdy,
        b"REQ": _cmd_req,
        b"PUB": _cmd_pub,
        b"MPUB": _cmd_mpub,
        b"DPUB": _cmd_dpub,
        b"NOP": _cmd_nop,
        b"TOUCH": _cmd_touch,
        b"SUB": _cmd_sub,
        b"CLS": _cmd_cls,
        b"AUTH": _cmd_auth,
    }

    # -- stats

    def stats(self, topic_filter: str = "") -> dict[str, Any]:
        pub_counts = []
        for topic, count in self.pub_counts.items():
            if topic_filter and topic != topic_filter:
                continue
            pub_counts.append({"topic": topic, "count": count})
            break  # nsqd 1.3 reports only one (a `break` in client_v2.go)
        out: dict[str, Any] = {
            "client_id": self.client_id,
            "hostname": self.hostname,
            "version": "V2",
            "remote_address": self.remote,
            "state": self.state if self.state >= 0 else STATE_INIT,
            "ready_count": self.rdy,
            "in_flight_count": self.in_flight_count,
            "message_count": self.message_count,
            "finish_count": self.finish_count,
            "requeue_count": self.requeue_count,
            "connect_ts": self.connect_ts,
            "sample_rate": self.sample_rate,
            "deflate": self.deflate,
            "snappy": self.snappy,
            "user_agent": self.user_agent,
        }
        state = self.auth_state
        if state is not None and state.authorizations:
            out["authed"] = True
        if state is not None and state.identity:
            out["auth_identity"] = state.identity
        if state is not None and state.identity_url:
            out["auth_identity_url"] = state.identity_url
        if pub_counts:
            out["pub_counts"] = pub_counts
        cipher = version = ""
        if self.tls and self.transport is not None:
            ssl_obj = self.transport.get_extra_info("ssl_object")
            if ssl_obj is not None:
                c = ssl_obj.cipher()
                cipher = c[0] if c else ""
                version = {
                    "TLSv1": "TLS1.0",
                    "TLSv1.1": "TLS1.1",
                    "TLSv1.2": "TLS1.2",
                    "TLSv1.3": "TLS1.3",
                }.get(ssl_obj.version() or "", "")
        out["tls"] = self.tls
        out["tls_cipher_suite"] = cipher
        out["tls_version"] = version
        out["tls_negotiated_protocol"] = ""
        out["tls_negotiated_protocol_is_mutual"] = False
        return out
