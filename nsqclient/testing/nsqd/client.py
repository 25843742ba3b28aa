"""One TCP client of the embedded nsqd: the I/O around the protocol (:mod:`.protocol_v2`) and
the commands run against the node.

:class:`ClientConn` is the connection's asyncio protocol.  It feeds what it reads to its
:class:`~.protocol_v2.ProtocolV2`, takes the commands out of it and runs each one on the node
as nsqd 1.3.0 does (``nsqd/protocol_v2.go``): subscribing to a channel, RDY and the FIN/REQ/TOUCH
of messages in flight, publishing to topics, AUTH against the auth server (the client's
:class:`~.auth.ClientAuth`) without blocking the loop.  It keeps the timers (heartbeats, the
read deadline), starts TLS, holds commands while an answer is awaited, and reports the client
in ``/stats``.  The node is seen through the :class:`Server` protocol, so this module does not
import it.

Output frames are queued per client and written with one ``transport.write`` per event-loop
pass (see :mod:`.writes` for how writes are cut up on their way out).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import Any, Protocol, cast

from ...protocol import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE, encode_frame
from ..gostyle.text import go_json
from .auth import ClientAuth
from .ids import GUIDFactory
from .options import NSQDOptions
from .protocol_v2 import (
    BAD_PROTOCOL_FRAME,
    CLOSE_WAIT_FRAME,
    HEARTBEAT_FRAME,
    NEED_MORE,
    OK_FRAME,
    STATE_INIT,
    STATE_MAGIC,
    BadProtocol,
    ClientError,
    FatalClientError,
    LineTooLong,
    Negotiation,
    ProtocolV2,
)
from .queues import IRREGULAR, Channel, Message, Topic
from .writes import Output, WriteSplitter

__all__ = ["ClientConn", "Server", "FatalClientError", "ClientError", "BLOCKED"]

log = logging.getLogger("nsqclient.testing.protocol_v2")

#: a command handler's "waiting for something asynchronous; run me again"
BLOCKED = -2


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


class ClientConn(asyncio.Protocol):
    """One TCP client of nsqd speaking protocol V2."""

    #: the connection is closed when no command came for this many heartbeat intervals
    read_deadline_factor = 2
    #: the protocol core made for each connection
    wire_class: type[ProtocolV2] = ProtocolV2

    def __init__(self, nsqd: Server):
        self.nsqd = nsqd
        self.opts = nsqd.opts
        self.loop = nsqd.loop
        self.id = nsqd.next_client_id()
        #: the protocol: bytes in, commands out, frames back
        self.wire = self.wire_class(nsqd.opts)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.blocked = False
        self.write_paused = False
        self.flush_scheduled = False
        self.output: Output | None = None
        self.remote_ip = ""
        self.tls = False
        self.rdy = 0
        self.in_flight_count = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts: dict[str, int] = {}
        self.connect_ts = int(time.time())
        self.channel: Channel | None = None
        self.in_ready = False
        #: what the auth server said of this client
        self.auth = ClientAuth(nsqd.opts)
        self.last_cmd = 0.0
        self._hb_timer: asyncio.TimerHandle | None = None
        self._hb_next = 0.0
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._pending_task: asyncio.Task | None = None

    # -- what the channel (and /stats) read of the client's protocol state

    @property
    def state(self) -> int:
        """The client's state (nsqd's numbering; -1 before the magic)."""
        return self.wire.state

    @property
    def remote(self) -> str:
        """The client's address, ``host:port``."""
        return self.wire.remote

    @property
    def sample_rate(self) -> int:
        return self.wire.sample_rate

    @property
    def msg_timeout(self) -> float:
        return self.wire.msg_timeout

    # -- asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        self.output = Output(self.loop, transport, self.nsqd.write_splitter(self.id))
        peer = transport.get_extra_info("peername")
        if peer:
            wire = self.wire
            self.remote_ip = peer[0]
            wire.remote = f"{peer[0]}:{peer[1]}"
            wire.client_id = wire.hostname = peer[0]
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
        try:
            self.wire.receive_data(data)
        except Exception:
            log.info("[%s] failed to decompress input; closing", self.remote)
            self.close()
            return
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
        self.wire.out.clear()
        if self.output is not None:
            self.output.discard()

    def close(self) -> None:
        """Flush what is queued and close (nsqd closing the connection)."""
        if self.transport is None:
            return
        if self.wire.out and not self.nsqd.stalled:
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
        if self.wire.out:
            self.nsqd.schedule_flush(self)
        if self.wire.state != STATE_MAGIC:
            self._arm_deadline()
        if not self.blocked:
            self.process()

    # -- output

    def write(self, data: bytes) -> None:
        self.wire.out.append(data)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.nsqd.schedule_flush(self)

    def write_parts(self, a: bytes, b: bytes, c: bytes) -> None:
        out = self.wire.out
        out.append(a)
        out.append(b)
        out.append(c)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.nsqd.schedule_flush(self)

    def flush(self) -> None:
        self.flush_scheduled = False
        if self.transport is None or not self.wire.out or self.nsqd.stalled:
            return
        self._write_out()

    def _write_out(self) -> None:
        pieces = self.wire.data_to_send()
        if self.output is not None:
            self.output.write(pieces)

    def send_response(self, data: bytes) -> None:
        self.write(encode_frame(FRAME_TYPE_RESPONSE, data))

    def send_error(self, body: bytes) -> None:
        self.write(encode_frame(FRAME_TYPE_ERROR, body))

    # -- timers

    def _start_heartbeats(self) -> None:
        if self._hb_timer is not None:
            self._hb_timer.cancel()
            self._hb_timer = None
        interval = self.wire.heartbeat_interval
        if interval > 0:
            # absolute ticks, like Go's time.Ticker (no drift)
            self._hb_next = self.loop.time() + interval
            self._hb_timer = self.loop.call_at(self._hb_next, self._heartbeat)

    def _heartbeat(self) -> None:
        self._hb_timer = None
        if self.transport is None:
            return
        if not self.nsqd.stalled:
            self.write(HEARTBEAT_FRAME)
        now = self.loop.time()
        interval = self.wire.heartbeat_interval
        self._hb_next += interval
        if self._hb_next <= now:  # fell behind (e.g. stalled): skip missed ticks
            self._hb_next = now + interval
        self._hb_timer = self.loop.call_at(self._hb_next, self._heartbeat)

    def _arm_deadline(self) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        interval = self.wire.heartbeat_interval
        if interval > 0 and self.transport is not None:
            self._deadline_timer = self.loop.call_at(
                self.last_cmd + self.read_deadline_factor * interval,
                self._check_deadline,
            )

    def _check_deadline(self) -> None:
        self._deadline_timer = None
        interval = self.wire.heartbeat_interval
        if self.transport is None or interval <= 0:
            return
        if self.nsqd.stalled:
            return  # re-armed on resume
        due = self.last_cmd + self.read_deadline_factor * interval
        if self.loop.time() >= due - 1e-6:
            log.info(
                "[%s] read deadline passed (no command in %.3fs); closing",
                self.remote,
                self.read_deadline_factor * interval,
            )
            self.close()
            return
        self._deadline_timer = self.loop.call_at(due, self._check_deadline)

    # -- input

    def process(self) -> None:
        """Run every complete command the protocol has received."""
        if self.closed or self.blocked:
            return
        wire = self.wire
        if wire.state == STATE_MAGIC:
            try:
                if not wire.read_magic():
                    return
            except BadProtocol as exc:
                log.info("client(%s) bad protocol magic %r", self.remote, exc.magic)
                self.write(BAD_PROTOCOL_FRAME)
                self.close()
                return
            self.last_cmd = self.loop.time()
            self._start_heartbeats()
            self._arm_deadline()
        handlers = self._handlers
        tls_required = self.opts.tls_required
        ran = False
        try:
            while not self.closed and not self.blocked:
                try:
                    command = wire.next_command()
                except LineTooLong:
                    log.info("[%s] command line too long; closing", self.remote)
                    self.close()
                    return
                if command is None:
                    break  # the rest of the command has not arrived
                params, nl = command
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
                        self.close()
                        return
                    wire.advance(nl + 1)
                    continue
                if nxt < 0:
                    break  # NEED_MORE or BLOCKED: run this command again later
                ran = True
                wire.advance(nxt)
        finally:
            if self.transport is not None:
                wire.compact()
                if ran:
                    self.last_cmd = self.loop.time()
                    # answer what this chunk asked at once (deliveries follow in _run)
                    if wire.out and not self.nsqd.stalled and not self.blocked:
                        self._write_out()

    # -- commands

    def _cmd_nop(self, params, end):
        return end

    def _cmd_identify(self, params, end):
        wire = self.wire
        read = wire.parse_identify(end)
        if read is None:
            return NEED_MORE
        after, data = read
        # nsqd restarts the heartbeat ticker with the negotiated interval
        self._start_heartbeats()
        self._arm_deadline()
        if not data.get("feature_negotiation"):
            self.write(OK_FRAME)
            return after
        reply, negotiated = wire.negotiate(
            data, self.nsqd.ssl_context is not None, self.nsqd.auth_enabled
        )
        self.write(reply)
        if not negotiated.upgrades:
            return after
        # Upgrade: everything queued goes out in the clear first; bytes already received
        # after the IDENTIFY belong to the upgraded stream.
        self._write_out()
        self.flush_scheduled = False
        rest = wire.split_upgraded(after)
        if negotiated.tls:
            self.blocked = True
            if self.transport is not None:
                self.transport.pause_reading()
            self._pending_task = self.loop.create_task(self._upgrade_tls(rest, negotiated))
            return after
        self._upgrade_compression(negotiated)
        if rest:
            wire.receive_data(rest)
        return after

    async def _upgrade_tls(self, rest: bytes, negotiated: Negotiation):
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
        self.write(OK_FRAME)
        self._write_out()
        self.flush_scheduled = False
        if negotiated.snappy or negotiated.deflate:
            self._upgrade_compression(negotiated)
        self.blocked = False
        self._pending_task = None
        # bytes that arrived over TLS while we were upgrading are compressed already
        self.wire.decompress_unread()
        self.process()

    def _upgrade_compression(self, negotiated: Negotiation) -> None:
        """Switch both directions to snappy or deflate; the OK leaves compressed."""
        self.wire.start_compression(negotiated.snappy, negotiated.deflate, negotiated.deflate_level)
        self.write(OK_FRAME)
        self._write_out()
        self.flush_scheduled = False

    # auth

    def _cmd_auth(self, params, end):
        read = self.wire.parse_auth(params, end)
        if read is None:
            return NEED_MORE
        after, secret = read
        auth = self.auth
        if auth.authorized:
            raise FatalClientError("E_INVALID", "AUTH already set")
        if not self.nsqd.auth_enabled:
            raise FatalClientError("E_AUTH_DISABLED", "AUTH disabled")
        if not auth.answered:
            auth.secret = secret
            self._query_auth()
            return BLOCKED
        state = auth.take(self.remote)
        if not state.authorizations:
            raise FatalClientError("E_UNAUTHORIZED", "AUTH no authorizations found")
        self.send_response(
            go_json(
                {
                    "identity": state.identity,
                    "identity_url": state.identity_url,
                    "permission_count": len(state.authorizations),
                }
            )
        )
        return after

    def _check_auth(self, cmd: str, topic: str, channel: str) -> bool:
        """True when allowed; False when a refresh was started (run the command again)."""
        if not self.nsqd.auth_enabled:
            return True
        if self.auth.check(cmd, topic, channel, self.loop.time(), self.remote):
            return True
        self._query_auth()
        return False

    def _query_auth(self) -> None:
        self.blocked = True
        if self.transport is not None:
            self.transport.pause_reading()
        self._pending_task = self.loop.create_task(self._run_auth_query())

    async def _run_auth_query(self) -> None:
        await self.auth.fetch(self.remote_ip, self.tls, self._peer_common_name(), self.loop.time())
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
        return BLOCKED

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

    # subscribe and flow control

    def _cmd_sub(self, params, end):
        topic_name, channel_name = self.wire.parse_sub(params)
        if not self._check_auth("SUB", topic_name, channel_name):
            return BLOCKED
        topic = self.nsqd.get_topic(topic_name)
        if topic.loading:
            return self._wait_for(topic)
        channel = topic.get_channel(channel_name)
        err = channel.add_client(self)
        if err is not None:
            raise FatalClientError("E_SUB_FAILED", "SUB failed " + err)
        self.wire.subscribed()
        self.channel = channel
        self.write(OK_FRAME)
        return end

    def _cmd_rdy(self, params, end):
        count = self.wire.parse_rdy(params)
        if count is not None:
            self.rdy = count
            self._rdy_changed()
        return end

    def _rdy_changed(self) -> None:
        """After RDY set a new count: let the channel send what it now may."""
        self._subscribed("RDY").client_maybe_ready(self)

    def _subscribed(self, cmd: str) -> Channel:
        """The channel of a subscribed (or closing) client; E_INVALID in any other state."""
        self.wire.check_subscribed(cmd)
        channel = self.channel
        if channel is None:
            raise FatalClientError("E_INVALID", f"cannot {cmd} in current state")
        return channel

    def _cmd_fin(self, params, end):
        channel = self._subscribed("FIN")
        msg_id = self.wire.parse_msg_id(params, "FIN")
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
        msg_id, delay = self.wire.parse_req(params)
        err = channel.requeue(self, msg_id, delay)
        if err is not None:
            raise ClientError("E_REQ_FAILED", b"REQ " + msg_id + b" failed " + err.encode())
        self.requeue_count += 1
        self.in_flight_count -= 1
        channel.client_maybe_ready(self)
        return end

    def _cmd_touch(self, params, end):
        channel = self._subscribed("TOUCH")
        msg_id = self.wire.parse_msg_id(params, "TOUCH")
        err = channel.touch(self, msg_id, self.wire.msg_timeout)
        if err is not None:
            raise ClientError("E_TOUCH_FAILED", b"TOUCH " + msg_id + b" failed " + err.encode())
        return end

    def _cmd_cls(self, params, end):
        self.wire.start_closing()
        self.rdy = 0
        self.write(CLOSE_WAIT_FRAME)
        return end

    # publishing

    def _cmd_pub(self, params, end):
        parsed = self.wire.parse_pub(params, end)
        if parsed is None:
            return NEED_MORE
        topic_name, after = parsed
        if not self._check_auth("PUB", topic_name, ""):
            return BLOCKED
        nsqd = self.nsqd
        topic = nsqd.get_topic(topic_name)
        if topic.loading:
            return self._wait_for(topic)
        topic.put(Message(nsqd.guid.new(), self.wire.body(end + 4, after)))
        self.pub_counts[topic_name] = self.pub_counts.get(topic_name, 0) + 1
        self.write(OK_FRAME)
        return after

    def _cmd_mpub(self, params, end):
        wire = self.wire
        topic_name = wire.parse_publish_topic("MPUB", params, 2, quirk="E_BAD_TOPIC ")
        if not self._check_auth("MPUB", topic_name, ""):
            return BLOCKED
        nsqd = self.nsqd
        topic = nsqd.get_topic(topic_name)
        if topic.loading:
            return self._wait_for(topic)
        read = wire.read_mpub(end)
        if read is None:
            return NEED_MORE
        after, bodies = read
        ts = time.time_ns()
        topic.put_many(
            [
                Message(i, b, ts)
                for i, b in zip(nsqd.guid.new_many(len(bodies)), bodies, strict=True)
            ]
        )
        self.pub_counts[topic_name] = self.pub_counts.get(topic_name, 0) + len(bodies)
        self.write(OK_FRAME)
        return after

    def _cmd_dpub(self, params, end):
        parsed = self.wire.parse_dpub(params, end)
        if parsed is None:
            return NEED_MORE
        topic_name, delay, after = parsed
        if not self._check_auth("DPUB", topic_name, ""):
            return BLOCKED
        topic = self.nsqd.get_topic(topic_name)
        if topic.loading:
            return self._wait_for(topic)
        msg = Message(self.nsqd.guid.new(), self.wire.body(end + 4, after))
        msg.deferred = delay
        topic.put(msg)
        self.pub_counts[topic_name] = self.pub_counts.get(topic_name, 0) + 1
        self.write(OK_FRAME)
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
        wire = self.wire
        pub_counts = []
        for topic, count in self.pub_counts.items():
            if topic_filter and topic != topic_filter:
                continue
            pub_counts.append({"topic": topic, "count": count})
            break  # nsqd 1.3 reports only one (a `break` in client_v2.go)
        out: dict[str, Any] = {
            "client_id": wire.client_id,
            "hostname": wire.hostname,
            "version": "V2",
            "remote_address": wire.remote,
            "state": wire.state if wire.state >= 0 else STATE_INIT,
            "ready_count": self.rdy,
            "in_flight_count": self.in_flight_count,
            "message_count": self.message_count,
            "finish_count": self.finish_count,
            "requeue_count": self.requeue_count,
            "connect_ts": self.connect_ts,
            "sample_rate": wire.sample_rate,
            "deflate": wire.deflate,
            "snappy": wire.snappy,
            "user_agent": wire.user_agent,
        }
        state = self.auth.state
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
