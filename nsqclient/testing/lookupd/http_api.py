"""nsqlookupd's HTTP API (``nsqlookupd/http.go``): lookups, topic and channel listings, the
node list, create/delete/tombstone, answered from the registration database.

With ``legacy_json`` every JSON reply is wrapped in ``{"status_code", "status_txt", "data"}`` as
nsqlookupd did before 1.0.  The node is seen through the :class:`Directory` protocol.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from ...protocol import valid_channel_name, valid_topic_name
from ..gostyle.text import VERSION, go_json
from ..http.replies import JSON_CONTENT_TYPE, NSQ_V1
from ..http.server import QueryError, Request, Response, Router, parse_query
from .db import RegistrationDB, active

__all__ = ["LookupdHTTP", "Directory"]


class Directory(Protocol):
    """What the HTTP API needs of its nsqlookupd."""

    db: RegistrationDB
    legacy_json: bool
    inactive_producer_timeout: float
    tombstone_lifetime: float


class LookupdHTTP:
    """Routes and handlers for one embedded nsqlookupd."""

    def __init__(self, lookupd: Directory):
        self.lookupd = lookupd
        r = Router(self._not_found, self._method_not_allowed)
        r.add("GET", "/ping", self.ping)
        r.add("GET", "/info", self._v1(self.info))
        r.add("GET", "/debug", self._v1(self.debug))
        r.add("GET", "/lookup", self._v1(self.lookup))
        r.add("GET", "/topics", self._v1(self.topics))
        r.add("GET", "/channels", self._v1(self.channels))
        r.add("GET", "/nodes", self._v1(self.nodes))
        r.add("POST", "/topic/create", self._v1(self.topic_create))
        r.add("POST", "/topic/delete", self._v1(self.topic_delete))
        r.add("POST", "/channel/create", self._v1(self.channel_create))
        r.add("POST", "/channel/delete", self._v1(self.channel_delete))
        r.add("POST", "/topic/tombstone", self._v1(self.topic_tombstone))
        self.router = r

    def _respond(self, status: int, text: str, data: Any) -> Response:
        if self.lookupd.legacy_json:
            body = go_json({"status_code": status, "status_txt": text, "data": data})
            return Response(status, body, {"Content-Type": JSON_CONTENT_TYPE})
        if status != 200:
            return Response(
                status,
                go_json({"message": text}),
                {"Content-Type": JSON_CONTENT_TYPE, "X-Nsq-Content-Type": NSQ_V1},
            )
        if data is None:
            return Response(200, b"", {"X-Nsq-Content-Type": NSQ_V1})
        return Response(
            200, go_json(data), {"Content-Type": JSON_CONTENT_TYPE, "X-Nsq-Content-Type": NSQ_V1}
        )

    def _v1(self, fn):
        def handler(request: Request) -> Response:
            try:
                params = parse_query(request.raw_query)
            except QueryError:
                return self._respond(400, "INVALID_REQUEST", None)
            result = fn(params)
            if isinstance(result, tuple):
                return self._respond(result[0], result[1], None)
            return self._respond(200, "OK", result)

        return handler

    def _not_found(self, request: Request) -> Response:
        return self._respond(404, "NOT_FOUND", None)

    def _method_not_allowed(self, request: Request, allowed: list[str]) -> Response:
        response = self._respond(405, "METHOD_NOT_ALLOWED", None)
        response.headers["Allow"] = ", ".join(allowed)
        return response

    def ping(self, request: Request) -> Response:
        return Response(200, b"OK", {})

    def info(self, params):
        return {"version": VERSION}

    def topics(self, params):
        return {"topics": [k[1] for k in self.lookupd.db.find_registrations("topic", "*", "")]}

    def channels(self, params):
        if "topic" not in params:
            return 400, "MISSING_ARG_TOPIC"
        topic = params["topic"][0]
        return {"channels": self.lookupd.db.channels_of(topic)}

    def lookup(self, params):
        if "topic" not in params:
            return 400, "MISSING_ARG_TOPIC"
        topic = params["topic"][0]
        if not self.lookupd.db.find_registrations("topic", topic, ""):
            return 404, "TOPIC_NOT_FOUND"
        channels = self.lookupd.db.channels_of(topic)
        producers = active(
            self.lookupd.db.find_producers("topic", topic, ""),
            self.lookupd.inactive_producer_timeout,
            self.lookupd.tombstone_lifetime,
        )
        return {"channels": channels, "producers": [p.peer.as_json() for p in producers]}

    def topic_create(self, params):
        if "topic" not in params:
            return 400, "MISSING_ARG_TOPIC"
        topic = params["topic"][0]
        if not valid_topic_name(topic):
            return 400, "INVALID_ARG_TOPIC"
        self.lookupd.db.add_registration(("topic", topic, ""))
        return None

    def topic_delete(self, params):
        if "topic" not in params:
            return 400, "MISSING_ARG_TOPIC"
        topic = params["topic"][0]
        for k in self.lookupd.db.find_registrations("channel", topic, "*"):
            self.lookupd.db.remove_registration(k)
        for k in self.lookupd.db.find_registrations("topic", topic, ""):
            self.lookupd.db.remove_registration(k)
        return None

    def topic_tombstone(self, params):
        if "topic" not in params:
            return 400, "MISSING_ARG_TOPIC"
        if "node" not in params:
            return 400, "MISSING_ARG_NODE"
        topic = params["topic"][0]
        node = params["node"][0]
        for p in self.lookupd.db.find_producers("topic", topic, ""):
            if f"{p.peer.broadcast_address}:{p.peer.http_port}" == node:
                p.tombstoned = True
                p.tombstoned_at = time.monotonic()
        return None

    @staticmethod
    def _topic_channel(params) -> tuple[str, str] | tuple[int, str]:
        if "topic" not in params:
            return 400, "MISSING_ARG_TOPIC"
        topic = params["topic"][0]
        if not valid_topic_name(topic):
            return 400, "INVALID_ARG_TOPIC"
        if "channel" not in params:
            return 400, "MISSING_ARG_CHANNEL"
        channel = params["channel"][0]
        if not valid_channel_name(channel):
            return 400, "INVALID_ARG_CHANNEL"
        return topic, channel

    def channel_create(self, params):
        res = self._topic_channel(params)
        if isinstance(res[0], int):
            return res
        topic, channel = res
        self.lookupd.db.add_registration(("channel", topic, channel))
        self.lookupd.db.add_registration(("topic", topic, ""))
        return None

    def channel_delete(self, params):
        res = self._topic_channel(params)
        if isinstance(res[0], int):
            return res
        topic, channel = res
        keys = self.lookupd.db.find_registrations("channel", topic, channel)
        if not keys:
            return 404, "CHANNEL_NOT_FOUND"
        for k in keys:
            self.lookupd.db.remove_registration(k)
        return None

    def nodes(self, params):
        producers = active(
            self.lookupd.db.find_producers("client", "", ""),
            self.lookupd.inactive_producer_timeout,
            0.0,
        )
        nodes = []
        for p in producers:
            topics = [
                k[1]
                for k in self.lookupd.db.lookup_registrations(p.peer.id)
                if k[0] == "topic" and k[2] == ""
            ]
            tombstones = []
            for t in topics:
                flag = False
                for tp in self.lookupd.db.find_producers("topic", t, ""):
                    if tp.peer is p.peer:
                        flag = tp.is_tombstoned(self.lookupd.tombstone_lifetime)
                        break
                tombstones.append(flag)
            info = p.peer.as_json()
            info["tombstones"] = tombstones
            info["topics"] = topics
            nodes.append(info)
        return {"producers": nodes}

    def debug(self, params):
        data: dict[str, list] = {}
        for k, producers in self.lookupd.db.map.items():
            key = ":".join(k)
            for p in producers.values():
                data.setdefault(key, []).append(
                    {
                        "id": p.peer.id,
                        "hostname": p.peer.hostname,
                        "broadcast_address": p.peer.broadcast_address,
                        "tcp_port": p.peer.tcp_port,
                        "http_port": p.peer.http_port,
                        "version": p.peer.version,
                        "last_update": int(p.peer.last_update * 1e9),
                        "tombstoned": p.tombstoned,
                        "tombstoned_at": int(p.tombstoned_at * 1e9),
                    }
                )
        return data
