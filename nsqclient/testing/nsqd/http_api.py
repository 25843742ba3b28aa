"""The embedded nsqd's HTTP API, answering like nsqd 1.3.0's ``nsqd/http.go``.

Replies follow ``internal/http_api``: 200 with the handler's value (JSON objects get
``Content-Type: application/json; charset=utf-8``), errors as ``{"message": "..."}`` with the
status nsqd uses, ``X-Nsq-Content-Type: nsq; version=1.0`` on every API reply but ``/ping``.
"""

from __future__ import annotations

import gc
import json
import socket
import struct
import sys
import time
from typing import Any, Protocol

from ...protocol import valid_channel_name, valid_topic_name
from ..gostyle.text import VERSION, duration_string
from ..http.replies import JSON_CONTENT_TYPE, NSQ_V1, v1_error, v1_response
from ..http.server import QueryError, Request, Response, Router, parse_query
from .client import ClientConn
from .ids import GUIDFactory
from .options import NSQDOptions
from .queues import Channel, Message, Topic

__all__ = ["NSQDHTTP", "NodeAPI"]
_BOOL_PARAMS = {"true": True, "1": True, "false": False, "0": False}


class HTTPErr(Exception):
    """An http_api.Err: status and message."""

    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status = status
        self.text = text


def _memory_stats() -> dict[str, int]:
    collections = sum(s.get("collections", 0) for s in gc.get_stats())
    return {
        "heap_objects": sys.getallocatedblocks(),
        "heap_idle_bytes": 0,
        "heap_in_use_bytes": 0,
        "heap_released_bytes": 0,
        "gc_pause_usec_100": 0,
        "gc_pause_usec_99": 0,
        "gc_pause_usec_95": 0,
        "next_gc_bytes": 0,
        "gc_total_runs": collections,
    }


_E2E_EMPTY = {"count": 0, "percentiles": None}


class NodeAPI(Protocol):
    """What the HTTP API needs of its nsqd node."""

    opts: NSQDOptions
    guid: GUIDFactory
    topics: dict[str, Topic]
    start_time: int
    tcp_port: int
    http_port: int
    https_port: int | None

    def get_topic(self, name: str) -> Topic:
        """The topic ``name``, created on first use."""

    def delete_topic(self, name: str) -> bool:
        """Delete the topic ``name``; False when there is none."""

    def set_lookupd_addresses(self, addresses: list[str]) -> None:
        """Register with these nsqlookupd TCP addresses from now on."""

    def producers(self) -> list[ClientConn]:
        """The client connections that have published."""

    def persist_metadata(self) -> None:
        """Record topics, channels and pause flags in the data path (if any)."""


class NSQDHTTP:
    """Routes and handlers for one embedded nsqd node."""

    def __init__(self, nsqd: NodeAPI):
        self.nsqd = nsqd
        r = Router(self._not_found, self._method_not_allowed)
        r.add("GET", "/ping", self.ping)
        r.add("GET", "/info", self._v1(self.info))
        r.add("POST", "/pub", self._v1(self.pub))
        r.add("POST", "/mpub", self._v1(self.mpub))
        r.add("GET", "/stats", self._v1(self.stats))
        r.add("POST", "/topic/create", self._v1(self.topic_create))
        r.add("POST", "/topic/delete", self._v1(self.topic_delete))
        r.add("POST", "/topic/empty", self._v1(self.topic_empty))
        r.add("POST", "/topic/pause", self._v1(self.topic_pause))
        r.add("POST", "/topic/unpause", self._v1(self.topic_pause))
        r.add("POST", "/channel/create", self._v1(self.channel_create))
        r.add("POST", "/channel/delete", self._v1(self.channel_delete))
        r.add("POST", "/channel/empty", self._v1(self.channel_empty))
        r.add("POST", "/channel/pause", self._v1(self.channel_pause))
        r.add("POST", "/channel/unpause", self._v1(self.channel_pause))
        self._router = r

    # the object HTTPServerProtocol calls
    @property
    def router(self) -> NSQDHTTP:
        return self

    def dispatch(self, request: Request) -> Response:
        """Route one request (``TLS_REQUIRED`` first when nsqd's --tls-required=2)."""
        if self.nsqd.opts.tls_required == 2 and not request.tls:
            body = b'{"message": "TLS_REQUIRED", "https_port": %d}' % (self.nsqd.https_port or 0)
            return Response(
                403, body, {"X-Nsq-Content-Type": NSQ_V1, "Content-Type": JSON_CONTENT_TYPE}
            )
        if request.path.startswith("/config/") and request.method in ("GET", "PUT"):
            return self._v1(self.config)(request)
        return self._router.dispatch(request)

    @staticmethod
    def _v1(fn):
        def handler(request: Request) -> Response:
            try:
                return v1_response(fn(request))
            except HTTPErr as err:
                response = v1_error(err.status, err.text)
                # Go's net/http hangs up when more than 256KiB of the body went unread
                response.close = err.status == 413 and request.content_length > 256 * 1024
                return response

        return handler

    @staticmethod
    def _not_found(request: Request) -> Response:
        return v1_error(404, "NOT_FOUND")

    @staticmethod
    def _method_not_allowed(request: Request, allowed: list[str]) -> Response:
        return v1_error(405, "METHOD_NOT_ALLOWED", {"Allow": ", ".join(allowed)})

    # -- helpers

    @staticmethod
    def _params(request: Request) -> dict[str, list[str]]:
        try:
            return parse_query(request.raw_query)
        except QueryError as exc:
            raise HTTPErr(400, "INVALID_REQUEST") from exc

    @staticmethod
    def _valid_topic_name(params: dict[str, list[str]], invalid: str) -> str:
        """The ``topic`` parameter; a bad name is a 400 with ``invalid`` (nsqd's endpoints
        disagree: INVALID_TOPIC or INVALID_ARG_TOPIC)."""
        if "topic" not in params:
            raise HTTPErr(400, "MISSING_ARG_TOPIC")
        name = params["topic"][0]
        if not valid_topic_name(name):
            raise HTTPErr(400, invalid)
        return name

    def _topic_from_query(self, request: Request) -> tuple[dict[str, list[str]], Topic]:
        params = self._params(request)
        name = self._valid_topic_name(params, "INVALID_TOPIC")
        return params, self.nsqd.get_topic(name)

    def _existing_topic_channel(self, request: Request) -> tuple[Topic, str]:
        params = self._params(request)
        topic_name = self._valid_topic_name(params, "INVALID_ARG_TOPIC")
        if "channel" not in params:
            raise HTTPErr(400, "MISSING_ARG_CHANNEL")
        channel_name = params["channel"][0]
        if not valid_channel_name(channel_name):
            raise HTTPErr(400, "INVALID_ARG_CHANNEL")
        topic = self.nsqd.topics.get(topic_name)
        if topic is None:
            raise HTTPErr(404, "TOPIC_NOT_FOUND")
        return topic, channel_name

    def _existing_channel(self, request: Request) -> Channel:
        topic, channel_name = self._existing_topic_channel(request)
        channel = topic.channels.get(channel_name)
        if channel is None:
            raise HTTPErr(404, "CHANNEL_NOT_FOUND")
        return channel

    # -- endpoints

    def ping(self, request: Request) -> Response:
        return Response(200, b"OK", {})

    def info(self, request: Request) -> Any:
        opts = self.nsqd.opts
        return {
            "version": VERSION,
            "broadcast_address": opts.broadcast_address,
            "hostname": socket.gethostname(),
            "http_port": self.nsqd.http_port,
            "tcp_port": self.nsqd.tcp_port,
            "start_time": self.nsqd.start_time,
            "max_heartbeat_interval": int(round(opts.max_heartbeat_interval * 1e9)),
            "max_output_buffer_size": opts.max_output_buffer_size,
            "max_output_buffer_timeout": int(round(opts.max_output_buffer_timeout * 1e9)),
            "max_deflate_level": opts.max_deflate_level,
        }

    def pub(self, request: Request) -> Any:
        opts = self.nsqd.opts
        if request.content_length > opts.max_msg_size:
            raise HTTPErr(413, "MSG_TOO_BIG")
        body = request.body
        if len(body) > opts.max_msg_size:
            raise HTTPErr(413, "MSG_TOO_BIG")
        if not body:
            raise HTTPErr(400, "MSG_EMPTY")
        params, topic = self._topic_from_query(request)
        deferred = 0.0
        if "defer" in params:
            try:
                ms = int(params["defer"][0], 10)
            except ValueError as exc:
                raise HTTPErr(400, "INVALID_DEFER") from exc
            if ms < 0 or ms * 1_000_000 > int(round(opts.max_req_timeout * 1e9)):
                raise HTTPErr(400, "INVALID_DEFER")
            deferred = ms / 1000
        msg = Message(self.nsqd.guid.new(), body)
        msg.deferred = deferred
        topic.put(msg)
        return "OK"

    def mpub(self, request: Request) -> Any:
        opts = self.nsqd.opts
        if request.content_length > opts.max_body_size:
            raise HTTPErr(413, "BODY_TOO_BIG")
        params, topic = self._topic_from_query(request)
        binary = False
        if "binary" in params:
            binary = _BOOL_PARAMS.get(params["binary"][0], True)
        body = request.body
        bodies: list[bytes] = []
        if binary:
            bodies = _read_binary_mpub(body, opts.max_msg_size, opts.max_body_size)
        else:
            if len(body) > opts.max_body_size:
                raise HTTPErr(413, "BODY_TOO_BIG")
            for block in body.split(b"\n"):
                if not block:
                    continue
                if len(block) > opts.max_msg_size:
                    raise HTTPErr(413, "MSG_TOO_BIG")
                bodies.append(block)
        ts = time.time_ns()
        ids = self.nsqd.guid.new_many(len(bodies))
        topic.put_many([Message(i, b, ts) for i, b in zip(ids, bodies, strict=True)])
        return "OK"

    def topic_create(self, request: Request) -> Any:
        self._topic_from_query(request)
        return None

    def topic_empty(self, request: Request) -> Any:
        name = self._valid_topic_name(self._params(request), "INVALID_TOPIC")
        topic = self.nsqd.topics.get(name)
        if topic is None:
            raise HTTPErr(404, "TOPIC_NOT_FOUND")
        topic.empty()
        return None

    def topic_delete(self, request: Request) -> Any:
        params = self._params(request)
        if "topic" not in params:
            raise HTTPErr(400, "MISSING_ARG_TOPIC")
        if not self.nsqd.delete_topic(params["topic"][0]):
            raise HTTPErr(404, "TOPIC_NOT_FOUND")
        return None

    def topic_pause(self, request: Request) -> Any:
        params = self._params(request)
        if "topic" not in params:
            raise HTTPErr(400, "MISSING_ARG_TOPIC")
        topic = self.nsqd.topics.get(params["topic"][0])
        if topic is None:
            raise HTTPErr(404, "TOPIC_NOT_FOUND")
        topic.set_paused("unpause" not in request.path)
        self.nsqd.persist_metadata()
        return None

    def channel_create(self, request: Request) -> Any:
        topic, channel_name = self._existing_topic_channel(request)
        topic.get_channel(channel_name)
        return None

    def channel_empty(self, request: Request) -> Any:
        self._existing_channel(request).empty()
        return None

    def channel_delete(self, request: Request) -> Any:
        topic, channel_name = self._existing_topic_channel(request)
        if not topic.delete_channel(channel_name):
            raise HTTPErr(404, "CHANNEL_NOT_FOUND")
        return None

    def channel_pause(self, request: Request) -> Any:
        channel = self._existing_channel(request)
        channel.set_paused("unpause" not in request.path)
        self.nsqd.persist_metadata()
        return None

    def config(self, request: Request) -> Any:
        opt = request.path[len("/config/") :]
        opts = self.nsqd.opts
        if request.method == "PUT":
            body = request.body
            if not body or len(body) > opts.max_msg_size:
                raise HTTPErr(413, "INVALID_VALUE")
            if opt == "nsqlookupd_tcp_addresses":
                try:
                    value = json.loads(body)
                    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                        raise ValueError
                except ValueError as exc:
                    raise HTTPErr(400, "INVALID_VALUE") from exc
                self.nsqd.set_lookupd_addresses(value)
            elif opt == "log_level":
                if body.decode("utf-8", "replace").lower() not in (
                    "debug",
                    "info",
                    "warn",
                    "error",
                    "fatal",
                ):
                    raise HTTPErr(400, "INVALID_VALUE")
            else:
                raise HTTPErr(400, "INVALID_OPTION")
        values = {
            "nsqlookupd_tcp_addresses": list(opts.lookupd_tcp_addresses),
            "msg_timeout": int(round(opts.msg_timeout * 1e9)),
            "max_msg_timeout": int(round(opts.max_msg_timeout * 1e9)),
            "max_req_timeout": int(round(opts.max_req_timeout * 1e9)),
            "max_msg_size": opts.max_msg_size,
            "max_body_size": opts.max_body_size,
            "max_rdy_count": opts.max_rdy_count,
            "max_heartbeat_interval": int(round(opts.max_heartbeat_interval * 1e9)),
            "max_output_buffer_size": opts.max_output_buffer_size,
            "max_output_buffer_timeout": int(round(opts.max_output_buffer_timeout * 1e9)),
            "mem_queue_size": opts.mem_queue_size,
            "snappy": opts.snappy,
            "deflate": opts.deflate,
            "max_deflate_level": opts.max_deflate_level,
            "broadcast_address": opts.broadcast_address,
            "tls_required": opts.tls_required,
            "auth_http_address": list(opts.auth_http_address or []),
            "log_level": "info",
        }
        if opt not in values:
            raise HTTPErr(400, "INVALID_OPTION")
        return values[opt]

    # -- stats

    def stats(self, request: Request) -> Any:
        params = self._params(request)

        def get(name: str) -> str:
            return params[name][0] if name in params else ""

        json_format = get("format") == "json"
        topic_name = get("topic")
        channel_name = get("channel")
        include_clients = _BOOL_PARAMS.get(get("include_clients"), True)
        include_mem = _BOOL_PARAMS.get(get("include_mem"), True)
        topics, producers = self.collect_stats(topic_name, channel_name, include_clients)
        nsqd = self.nsqd
        memory = _memory_stats() if include_mem else None
        if not json_format:
            return self._print_stats(topics, producers, memory)
        out: dict[str, Any] = {
            "version": VERSION,
            "health": "OK",
            "start_time": nsqd.start_time,
            "topics": topics,
        }
        if memory is not None:
            out["memory"] = memory
        out["producers"] = producers
        return out

    def collect_stats(
        self, topic_name: str, channel_name: str, include_clients: bool
    ) -> tuple[list[dict] | None, list[dict] | None]:
        """(topics, producers) as nsqd's GetStats builds them (None where Go has nil)."""
        nsqd = self.nsqd
        if topic_name:
            topic = nsqd.topics.get(topic_name)
            if topic is None:
                return None, None
            real_topics = [topic]
        else:
            real_topics = sorted(nsqd.topics.values(), key=lambda t: t.name)
        # nsqd keeps mem_queue_size messages per queue in memory, the rest on disk
        mem_queue_size = nsqd.opts.mem_queue_size
        topics = []
        for t in real_topics:
            if channel_name:
                ch = t.channels.get(channel_name)
                if ch is None:
                    continue
                real_channels = [ch]
            else:
                real_channels = sorted(t.channels.values(), key=lambda c: c.name)
            channels = []
            for c in real_channels:
                clients = (
                    [cl.stats(topic_name) for cl in c.clients.values()] if include_clients else None
                )
                channels.append(
                    {
                        "channel_name": c.name,
                        "depth": c.depth(),
                        "backend_depth": max(c.depth() - mem_queue_size, 0),
                        "in_flight_count": len(c.in_flight),
                        "deferred_count": len(c.deferred),
                        "message_count": c.message_count,
                        "requeue_count": c.requeue_count,
                        "timeout_count": c.timeout_count,
                        "client_count": len(c.clients),
                        "clients": clients,
                        "paused": c.paused,
                        "e2e_processing_latency": dict(_E2E_EMPTY),
                    }
                )
            topics.append(
                {
                    "topic_name": t.name,
                    "channels": channels,
                    "depth": t.depth(),
                    "backend_depth": max(t.depth() - mem_queue_size, 0),
                    "message_count": t.message_count,
                    "message_bytes": t.message_bytes,
                    "paused": t.paused,
                    "e2e_processing_latency": dict(_E2E_EMPTY),
                }
            )
        producers = None
        if include_clients:
            found = [c.stats(topic_name) for c in nsqd.producers()]
            producers = found or None
        return topics, producers

    def _print_stats(
        self, topics: list[dict] | None, producers: list[dict] | None, memory: dict | None
    ) -> bytes:
        nsqd = self.nsqd
        lines = [
            f"nsqd v{VERSION} (embedded nsqclient.testing)",
            "start_time " + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(nsqd.start_time)),
            "uptime " + duration_string(max(time.time() - nsqd.start_time, 0.0)),
            "",
            "Health: OK",
        ]
        out = "\n".join(lines) + "\n"
        if memory is not None:
            out += "\nMemory:\n"
            for key, value in memory.items():
                out += f"   {key:<25s}\t{value}\n"
        if not topics:
            out += "\nTopics: None\n"
        else:
            out += "\nTopics:"
        for t in topics or []:
            prefix = "*P " if t["paused"] else "   "
            out += (
                f"\n{prefix}[{t['topic_name']:<15s}] depth: {t['depth']:<5d} "
                f"be-depth: {t['backend_depth']:<5d} msgs: {t['message_count']:<8d} e2e%: \n"
            )
            for c in t["channels"]:
                prefix = "   *P " if c["paused"] else "      "
                out += (
                    f"{prefix}[{c['channel_name']:<25s}] depth: {c['depth']:<5d} "
                    f"be-depth: {c['backend_depth']:<5d} inflt: {c['in_flight_count']:<4d} "
                    f"def: {c['deferred_count']:<4d} re-q: {c['requeue_count']:<5d} "
                    f"timeout: {c['timeout_count']:<5d} msgs: {c['message_count']:<8d} e2e%: \n"
                )
                for cl in c["clients"] or []:
                    out += f"        {_client_line(cl)}\n"
        if not producers:
            out += "\nProducers: None\n"
        else:
            out += "\nProducers:\n"
            for p in producers:
                out += f"   {_client_line(p)}\n"
        return out.encode("utf-8")


def _client_line(s: dict) -> str:
    port = s["remote_address"].rsplit(":", 1)[-1]
    ident = f"{s['hostname']}:{port} {s['user_agent']}"
    connected = duration_string(max(int(time.time()) - s["connect_ts"], 0))
    if s.get("pub_counts"):
        total = sum(p["count"] for p in s["pub_counts"])
        topics = ",".join(f"{p['topic']}={p['count']}" for p in s["pub_counts"])
        return (
            f"[{s['version']} {ident:<21s}] msgs: {total:<8d} topics: {topics} "
            f"connected: {connected}"
        )
    return (
        f"[{s['version']} {ident:<21s}] state: {s['state']} inflt: {s['in_flight_count']:<4d} "
        f"rdy: {s['ready_count']:<4d} fin: {s['finish_count']:<8d} re-q: {s['requeue_count']:<8d} "
        f"msgs: {s['message_count']:<8d} connected: {connected}"
    )


_U32 = struct.Struct(">i")


def _read_binary_mpub(body: bytes, max_msg: int, max_body: int) -> list[bytes]:
    """nsqd's readMPUB over an HTTP body; errors as /mpub reports them (413, code minus E_)."""
    n = len(body)
    if n < 4:
        raise HTTPErr(413, "BAD_BODY")
    count = _U32.unpack_from(body, 0)[0]
    if count <= 0 or count > (max_body - 4) // 5:
        raise HTTPErr(413, "BAD_BODY")
    pos = 4
    out = []
    for _ in range(count):
        if n < pos + 4:
            raise HTTPErr(413, "BAD_MESSAGE")
        size = _U32.unpack_from(body, pos)[0]
        if size <= 0 or size > max_msg:
            raise HTTPErr(413, "BAD_MESSAGE")
        if n < pos + 4 + size:
            raise HTTPErr(413, "BAD_MESSAGE")
        out.append(body[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return out
