"""An embedded nsqlookupd in youzan's mode (``nsqlookupd/http.go`` of youzan/nsq), answering
from the cluster's metadata (:mod:`.meta`).

``/lookup?topic=&access=r|w&metainfo=true`` gives ``channels``, ``producers`` and
``partitions`` (partition -> its leader's peer info) and, with ``metainfo``, the topic's
``meta``.  ``access=w`` leaves out partitions that refuse writes or have no channel yet, and
answers "Topic has no channel, should init at least one for the new topic" when that leaves
nothing.  A partition refusing writes (switched off, or its ISR short of a majority) is one
whose leader unregistered it, as youzan's nsqd does (``nsqdserver/lookup.go``); when none of
the asked partitions is registered, ``access=w`` still names their leaders from the cluster's
metadata (``tryFindRegsFromRegister``) and a PUB there gets E_FAILED_ON_NOT_WRITABLE.  A
partition whose leader is down is never listed: its registration went with its connection.

``/listlookup`` names every lookupd of the cluster (keys capitalised, ports as strings).
``POST /topic/create?topic=&partition_num=&replicator=&orderedmulti=&extend=``
creates a topic.

Replies are negotiated as youzan's are: a request with ``Accept: application/vnd.nsq;
version=1.0`` gets the bare JSON (errors ``{"message": ...}`` with their own status); any other
gets ``{"status_code", "status_txt", "data"}``, and every error as HTTP 500.  ``/topic/create``
always answers the bare form.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Any

from ...protocol import valid_topic_name
from ..gostyle.text import go_json
from ..http.replies import JSON_CONTENT_TYPE, NSQ_V1
from ..http.server import HTTPServerProtocol, QueryError, Request, Response, Router, parse_query
from ..lookupd.db import RegistrationDB
from ..lookupd.node import LookupdListeners
from ..lookupd.tcp import LookupConn
from .meta import MAX_PARTITION_NUM, MAX_REPLICATOR, Coordinator, TopicMeta
from .protocol import YOUZAN_VERSION

__all__ = ["YouzanLookupd", "YouzanLookupdHTTP", "ACCEPT_V1"]

log = logging.getLogger("nsqclient.testing.youzan_lookupd")

#: the Accept header that asks for bare (version 1.0) replies
ACCEPT_V1 = "application/vnd.nsq; version=1.0"
NO_CHANNEL = "Topic has no channel, should init at least one for the new topic"

Handler = Callable[[dict[str, list[str]]], Any]


class _Err(Exception):
    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status = status
        self.text = text


def _get(params: dict[str, list[str]], name: str) -> str:
    """Go's ``url.Values.Get``: the first value or ""."""
    values = params.get(name)
    return values[0] if values else ""


def _atoi(text: str) -> int | None:
    try:
        return int(text) if text.strip() == text and text else None
    except ValueError:
        return None


def _topic_arg(params: dict[str, list[str]]) -> str:
    """The ``topic`` parameter; MISSING_ARG_TOPIC without one."""
    topic = _get(params, "topic")
    if not topic:
        raise _Err(400, "MISSING_ARG_TOPIC")
    return topic


def _count_arg(params: dict[str, list[str]], name: str, limit: int, code: str) -> int:
    """The parameter ``name``, a whole number in 1..``limit``; MISSING_ARG_<code> without it,
    INVALID_ARG_<code> when it is anything else."""
    text = _get(params, name)
    if not text:
        raise _Err(400, f"MISSING_ARG_{code}")
    value = _atoi(text)
    if value is None or not 0 < value <= limit:
        raise _Err(400, f"INVALID_ARG_{code}")
    return value


class YouzanLookupdHTTP:
    """Routes and handlers of one embedded youzan nsqlookupd."""

    def __init__(self, lookupd: YouzanLookupd):
        self.lookupd = lookupd
        self.coordinator = lookupd.coordinator
        r = Router(self._not_found, self._method_not_allowed)
        r.add("GET", "/ping", lambda request: Response(200, b"OK", {}))
        r.add("GET", "/info", self._negotiate(self.info))
        r.add("GET", "/lookup", self._negotiate(self.lookup))
        r.add("GET", "/topics", self._negotiate(self.topics))
        r.add("GET", "/channels", self._negotiate(self.channels))
        r.add("GET", "/nodes", self._negotiate(self.nodes))
        r.add("GET", "/listlookup", self._negotiate(self.listlookup))
        r.add("POST", "/topic/create", self._v1(self.topic_create))
        r.add("PUT", "/topic/create", self._v1(self.topic_create))
        self.router = r

    # -- reply shapes

    @staticmethod
    def _bare(status: int, data: Any) -> Response:
        headers = {"X-Nsq-Content-Type": NSQ_V1}
        if status != 200:
            headers["Content-Type"] = JSON_CONTENT_TYPE
            return Response(status, b'{"message":"' + str(data).encode() + b'"}', headers)
        if data is None:
            return Response(200, b"", headers)
        headers["Content-Type"] = JSON_CONTENT_TYPE
        return Response(200, go_json(data), headers)

    @staticmethod
    def _wrapped(status: int, text: str, data: Any) -> Response:
        body = go_json({"status_code": status, "status_txt": text, "data": data})
        return Response(status, body, {"Content-Type": JSON_CONTENT_TYPE})

    def _call(self, fn: Handler, request: Request) -> Any:
        try:
            params = parse_query(request.raw_query)
        except QueryError as exc:
            raise _Err(400, "INVALID_REQUEST") from exc
        return fn(params)

    def _negotiate(
        self, fn: Callable[[dict[str, list[str]]], Any]
    ) -> Callable[[Request], Response]:
        def handler(request: Request) -> Response:
            v1 = request.headers.get("accept") == ACCEPT_V1
            try:
                data = self._call(fn, request)
            except _Err as err:
                if v1:
                    return self._bare(err.status, err.text)
                return self._wrapped(500, err.text, None)  # always 500, for old clients
            return self._bare(200, data) if v1 else self._wrapped(200, "OK", data)

        return handler

    def _v1(self, fn: Handler) -> Callable[[Request], Response]:
        def handler(request: Request) -> Response:
            try:
                data = self._call(fn, request)
            except _Err as err:
                return self._bare(err.status, err.text)
            return self._bare(200, data)

        return handler

    def _not_found(self, request: Request) -> Response:
        return self._bare(404, "NOT_FOUND")

    def _method_not_allowed(self, request: Request, allowed: list[str]) -> Response:
        response = self._bare(405, "METHOD_NOT_ALLOWED")
        response.headers["Allow"] = ", ".join(allowed)
        return response

    # -- handlers

    def info(self, params: dict[str, list[str]]) -> Any:
        return {"version": YOUZAN_VERSION, "ha_support": True}

    def _leaders(self, topic: str, partition: str, writable_only: bool) -> list[tuple[int, int]]:
        """(partition, leader node) of the partitions whose leader is up."""
        yt = self.coordinator.topics.get(topic)
        if yt is None:
            return []
        out = []
        for p, state in enumerate(yt.partitions):
            if partition != "*" and str(p) != partition:
                continue
            if not self.coordinator.node_running(state.leader):
                continue
            if writable_only and not self.coordinator.accepts_writes(state):
                continue
            out.append((p, state.leader))
        return out

    def _channels(self, topic: str, partition: str) -> list[str]:
        yt = self.coordinator.topics.get(topic)
        names: list[str] = []
        if yt is None:
            return names
        for p, state in enumerate(yt.partitions):
            if partition == "*" or str(p) == partition:
                names.extend(n for n in state.data.channels if n not in names)
        return names

    def lookup(self, params: dict[str, list[str]]) -> Any:
        topic = _topic_arg(params)
        partition = _get(params, "partition") or "*"
        access = _get(params, "access") or "r"
        if access not in ("r", "w"):
            raise _Err(400, "INVALID_ACCESS_MODE")
        # what the nodes registered: the leaders of the partitions that take writes
        regs = self._leaders(topic, partition, writable_only=True)
        found = bool(regs)
        if access == "w" and not regs:
            if topic not in self.coordinator.topics:
                raise _Err(404, "Key not found")
            regs = self._leaders(topic, partition, writable_only=False)
        if access == "r":
            regs = self._leaders(topic, partition, writable_only=False)
        partitions: dict[str, Any] = {}
        producers: dict[str, Any] = {}
        filtered = False
        for p, leader in regs:
            if access == "w" and not self._channels(topic, str(p)):
                filtered = True
                continue
            info = self.coordinator.nodes[leader].peer_info()
            partitions[str(p)] = info
            producers.setdefault(info["id"], info)
        if found and filtered and not partitions:
            raise _Err(404, NO_CHANNEL)
        out: dict[str, Any] = {"channels": self._channels(topic, partition)}
        if _get(params, "metainfo"):
            yt = self.coordinator.topics.get(topic)
            meta = yt.meta if yt is not None else TopicMeta(0, 0)
            out["meta"] = meta.as_json()
        out["partitions"] = dict(sorted(partitions.items()))
        out["producers"] = list(producers.values())
        return out

    def topics(self, params: dict[str, list[str]]) -> Any:
        names = [t for t in self.coordinator.topics if self._leaders(t, "*", True)]
        return {"topics": names}

    def channels(self, params: dict[str, list[str]]) -> Any:
        topic = _topic_arg(params)
        return {"channels": self._channels(topic, _get(params, "partition") or "*")}

    def nodes(self, params: dict[str, list[str]]) -> Any:
        out = []
        for index, node in enumerate(self.coordinator.nodes):
            if not node.running:
                continue
            info = node.peer_info()
            partitions: dict[str, list[str]] = {}
            for name, yt in self.coordinator.topics.items():
                for p, state in enumerate(yt.partitions):
                    if state.leader == index and self.coordinator.accepts_writes(state):
                        partitions.setdefault(name, []).append(str(p))
            out.append(
                {
                    "remote_address": info["remote_address"],
                    "hostname": info["hostname"],
                    "broadcast_address": info["broadcast_address"],
                    "tcp_port": info["tcp_port"],
                    "http_port": info["http_port"],
                    "version": info["version"],
                    "tombstones": [False] * len(partitions),
                    "topics": list(partitions),
                    "partitions": partitions,
                }
            )
        return {"producers": out}

    def listlookup(self, params: dict[str, list[str]]) -> Any:
        nodes = [lk.node_info() for lk in self.coordinator.lookupds if lk.running]
        leader = nodes[0] if nodes else self.lookupd.node_info()
        return {"lookupdleader": leader, "lookupdnodes": nodes}

    def topic_create(self, params: dict[str, list[str]]) -> Any:
        topic = _topic_arg(params)
        if not valid_topic_name(topic):
            raise _Err(400, "INVALID_ARG_TOPIC")
        pnum = _count_arg(params, "partition_num", MAX_PARTITION_NUM, "TOPIC_PARTITION_NUM")
        replica = _count_arg(params, "replicator", MAX_REPLICATOR, "TOPIC_REPLICATOR")
        if self.coordinator.lookupds and self.coordinator.lookupds[0] is not self.lookupd:
            raise _Err(400, "E_FAILED_ON_NOT_LEADER")
        meta = TopicMeta(
            partition_num=pnum,
            replica=replica,
            ordered=_get(params, "orderedmulti") == "true",
            ext=_get(params, "extend") == "true",
            multi_part=_get(params, "multipart") == "true",
            disable_channel_auto_create=_get(params, "disable_channel_auto_create") == "true",
        )
        error = self.coordinator.create_topic(topic, meta)
        if error is not None:
            raise _Err(400, error)
        return None


class YouzanLookupd(LookupdListeners):
    """One embedded youzan nsqlookupd (HTTP answers from the metadata; a TCP listener)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        coordinator: Coordinator,
        host: str = "127.0.0.1",
        tcp_port: int = 0,
        http_port: int = 0,
        broadcast_address: str = "127.0.0.1",
    ):
        self.loop = loop
        self.coordinator = coordinator
        self.host = host
        self.tcp_port = tcp_port
        self.http_port = http_port
        self.rpc_port = 0
        self.broadcast_address = broadcast_address
        self.db = RegistrationDB()
        self.conns: set[LookupConn] = set()
        self.http_conns: set[HTTPServerProtocol] = set()
        self.stalled = False
        self.running = False
        self.epoch = 1
        self._servers: list[asyncio.AbstractServer] = []
        coordinator.lookupds.append(self)
        self.http = YouzanLookupdHTTP(self)
        self.router = self.http.router

    def node_info(self) -> dict[str, Any]:
        """This lookupd as ``/listlookup`` names it (youzan's NsqLookupdNodeInfo)."""
        ip = self.broadcast_address
        return {
            "ID": f"{ip}:{self.rpc_port}:{self.tcp_port}:nsqlookup",
            "NodeIP": ip,
            "TcpPort": str(self.tcp_port),
            "HttpPort": str(self.http_port),
            "RpcPort": str(self.rpc_port),
            "Epoch": self.epoch,
        }

    async def start(self) -> None:
        """Listen (again on the same ports after a restart)."""
        if self.running:
            return
        await self._listen()
        if not self.rpc_port:
            self.rpc_port = self.http_port + 1 if self.http_port < 65535 else self.http_port
        self.running = True
        log.info(
            "youzan nsqlookupd: TCP %s HTTP %s (%s)",
            self.tcp_address,
            self.http_address,
            socket.gethostname(),
        )

    async def stop(self) -> None:
        """Close listeners and connections."""
        if not self.running:
            return
        self.running = False
        self.stalled = False
        await self._close_listeners()
