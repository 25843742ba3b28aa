"""HTTP clients for nsqd and nsqlookupd, built on :mod:`requests`.

:class:`NsqdHTTPClient` publishes over HTTP and administers topics and channels on one nsqd;
:class:`LookupdClient` asks one nsqlookupd where a topic lives.  Both speak every dialect a
client meets in the field:

* nsqd/nsqlookupd 1.x: plain JSON; errors as ``{"message": "TEXT"}`` with a meaningful status;
* pre-1.0 and youzan's servers when the request does not ask for version 1.0: JSON wrapped in
  ``{"status_code": N, "status_txt": "TEXT", "data": ...}`` (errors come back as HTTP 500);
* youzan's nsqlookupd: ``partitions`` and ``meta`` in lookups, ``/listlookup`` with
  capitalised Go field names and ports as strings.

Every request carries ``Accept: application/vnd.nsq; version=1.0`` so that servers able to
negotiate answer plain 1.x JSON; the wrapped shape is still parsed when a server ignores it.

Every failure raises :class:`~nsqclient.errors.HTTPError` (or its subclass
:class:`TopicNotFoundError`): a non-2xx reply carries its status; a failure before any reply has
status 0, a message saying what happened and where (``connection refused by 127.0.0.1:4161``,
``connecting to ... timed out after 5 s``, ``cannot resolve the host name ...``) and is chained
from the requests exception; a 2xx reply that should be JSON but is not raises with
``"invalid JSON: ..."``.

Bad input (an invalid topic or channel name, a body that is not bytes or str, an empty MPUB)
raises ValueError/TypeError before any request is made.

All timeouts are seconds (float).  Each applies to the connect and to each read of the reply
(requests' semantics), not to the request as a whole.  Clients are safe to share between
threads: the session is configured once at construction and never mutated afterwards.
"""

from __future__ import annotations

import json
import logging
import re
import socket
from collections.abc import Iterable, Mapping
from typing import Any, Self
from urllib.parse import urlsplit

import requests

from .addresses import join_host_port, lookupd_base_url, reply_port
from .checks import check_float
from .errors import HTTPError
from .protocol import (
    check_body_list,
    check_channel_name,
    check_topic_name,
    mpub_payload,
    to_bytes,
)

__all__ = [
    "NsqdHTTPClient",
    "LookupdClient",
    "TopicNotFoundError",
    "HTTPError",
    "DEFAULT_TIMEOUT",
]

logger = logging.getLogger("nsqclient.http")

#: Default timeout of every request, in seconds.
DEFAULT_TIMEOUT = 5.0

#: The Accept header that makes nsqlookupd/nsqd (pre-1.0 and youzan's) answer unwrapped JSON.
ACCEPT_V1 = "application/vnd.nsq; version=1.0"

_HEADERS = {"Accept": ACCEPT_V1}
_MAX_TEXT = 500  # characters of a non-JSON error body kept in the exception message
# youzan builds some V1 error bodies with Sprintf, so a message holding a quote is not JSON.
_LOOSE_MESSAGE = re.compile(r'^\s*\{\s*"message"\s*:\s*"(.*)"\s*\}\s*$', re.S)


class TopicNotFoundError(HTTPError):
    """The server does not know the topic (``TOPIC_NOT_FOUND``).

    nsqlookupd 1.x answers 404 ``{"message":"TOPIC_NOT_FOUND"}`` to a lookup of a topic no
    nsqd has registered; pre-1.0 versions answer HTTP 500 with ``status_txt`` TOPIC_NOT_FOUND.
    nsqd answers the same to deleting, emptying or pausing a topic it does not have.
    """


# --------------------------------------------------------------------------------------------
# Helpers


def _base_url(address: str, port_required: bool = False) -> str:
    """``"host:port"``, ``"http://host:port"`` or ``"https://host:port"`` -> base URL
    (:func:`nsqclient.addresses.lookupd_base_url`, the one parser of HTTP addresses)."""
    if not isinstance(address, str) or not address.strip():
        raise ValueError(f"HTTP address must be a non-empty str like 'host:port', not {address!r}")
    return lookupd_base_url(address, "address", port_required=port_required)


def _check_timeout(timeout: float) -> float:
    return check_float(timeout, "timeout", "seconds", min=0, min_exclusive=True)


def _is_wrapped(data: Any) -> bool:
    """True for the pre-1.0 envelope ``{"status_code": N, "status_txt": "...", "data": ...}``."""
    return (
        isinstance(data, dict)
        and "status_code" in data
        and "data" in data
        and "status_txt" in data
        and len(data) == 3
    )


def _normalise_producer(p: Any) -> Any:
    """A copy of a producer entry with ``broadcast_address`` filled in and ports as ints."""
    if not isinstance(p, dict):
        return p
    out = dict(p)
    if not out.get("broadcast_address") and out.get("address"):
        out["broadcast_address"] = out["address"]
    for key in ("tcp_port", "http_port"):
        if key in out:
            out[key] = reply_port(out[key])
    return out


def _error_message(response: requests.Response) -> str:
    """The error text of a non-2xx reply: 1.x ``message``, pre-1.0 ``status_txt``, or the body."""
    text = _text(response)
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        if isinstance(data.get("message"), str):
            return data["message"]
        if isinstance(data.get("status_txt"), str):
            return data["status_txt"]
    match = _LOOSE_MESSAGE.match(text)
    if match:
        return match.group(1)
    text = text.strip()
    if len(text) > _MAX_TEXT:
        text = text[:_MAX_TEXT] + "..."
    return text or (response.reason or "")


def _text(response: requests.Response) -> str:
    return response.content.decode("utf-8", "replace")


def _full_url(method: str, url: str, params: Mapping[str, Any] | None) -> str:
    try:
        return requests.Request(method, url, params=params).prepare().url or url
    except Exception:  # an unpreparable URL already failed the request; report it as given
        return url


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and every exception inside it: requests wraps urllib3's MaxRetryError (in
    ``args``), whose ``reason`` wraps the socket error (as ``__cause__`` or ``__context__``)."""
    seen: list[BaseException] = []
    todo = [exc]
    while todo:
        e = todo.pop()
        if any(e is s for s in seen):
            continue
        seen.append(e)
        inner = [getattr(e, "reason", None), e.__cause__, e.__context__, *e.args]
        todo.extend(i for i in inner if isinstance(i, BaseException))
    return seen


def _no_reply(exc: requests.RequestException, url: str, timeout: float) -> str:
    """What went wrong before any HTTP reply, in words, naming ``host:port``."""
    parts = urlsplit(url)
    where = parts.netloc or url
    causes = _causes(exc)
    if isinstance(exc, requests.ConnectTimeout):
        return f"connecting to {where} timed out after {timeout:g} s"
    if isinstance(exc, requests.Timeout):
        return (
            f"timed out after {timeout:g} s waiting for {where} to answer"
            " (it accepted the connection)"
        )
    if any(isinstance(e, socket.gaierror) for e in causes) or any(
        type(e).__name__ == "NameResolutionError" for e in causes
    ):
        return f"cannot resolve the host name {parts.hostname!r} (port {parts.port})"
    if any(isinstance(e, ConnectionRefusedError) for e in causes):
        return f"connection refused by {where} (is nsqd or nsqlookupd listening on that port?)"
    if any(isinstance(e, ConnectionResetError) for e in causes):
        return f"{where} reset the connection before answering"
    if isinstance(exc, requests.ConnectionError):
        return f"cannot connect to {where}: {exc}"
    return f"request to {where} failed: {exc}"


def _http_error(status: int, message: str, url: str) -> HTTPError:
    if message.strip() == "TOPIC_NOT_FOUND":
        return TopicNotFoundError(status, message.strip(), url)
    return HTTPError(status, message, url)


# --------------------------------------------------------------------------------------------
# The common part


class _Client:
    #: refuse an address without a port (an nsqlookupd's: go-nsq would silently use port 80)
    _port_required = False

    def __init__(
        self,
        address: str,
        timeout: float = DEFAULT_TIMEOUT,
        session: requests.Session | None = None,
    ):
        self.base_url = _base_url(address, self._port_required)
        self.address = address
        self.timeout = _check_timeout(timeout)
        self._own_session = session is None
        self.session = session if session is not None else requests.Session()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r})"

    def close(self) -> None:
        """Close the session's pooled connections (only when this client created it)."""
        if self._own_session:
            self.session.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- transport -------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any] | None = None,
        data: bytes | None = None,
        timeout: float | None = None,
    ) -> requests.Response:
        """Send one request; return the 2xx response or raise HTTPError."""
        timeout = self.timeout if timeout is None else _check_timeout(timeout)
        url = self.base_url + path
        logger.debug("%s %s params=%r (%d body bytes)", method, url, params, len(data or b""))
        try:
            response = self.session.request(
                method,
                url,
                params=params,
                data=data,
                headers=_HEADERS,
                timeout=timeout,
                allow_redirects=False,
            )
        except requests.RequestException as exc:
            full = _full_url(method, url, params)
            raise HTTPError(0, _no_reply(exc, full, timeout), full) from exc
        if not 200 <= response.status_code < 300:
            raise _http_error(response.status_code, _error_message(response), response.url)
        return response

    def _json(
        self, path: str, params: Mapping[str, Any] | None = None, timeout: float | None = None
    ) -> Any:
        """GET ``path`` and return its JSON, unwrapped from the pre-1.0 envelope if need be."""
        response = self._request("GET", path, params=params, timeout=timeout)
        return self._parse(response)

    def _parse(self, response: requests.Response) -> Any:
        try:
            data = json.loads(response.content)
        except ValueError as exc:
            snippet = _text(response)[:100]
            raise HTTPError(
                response.status_code, f"invalid JSON: {exc}: {snippet!r}", response.url
            ) from exc
        return self._unwrap(data, response)

    @staticmethod
    def _unwrap(data: Any, response: requests.Response) -> Any:
        if not _is_wrapped(data):
            return data
        code = data["status_code"]
        if not isinstance(code, int) or not 200 <= code < 300:
            status = code if isinstance(code, int) else response.status_code
            raise _http_error(status, str(data["status_txt"]), response.url)
        return data["data"]

    def _post(
        self, path: str, params: Mapping[str, Any], data: bytes | None, timeout: float | None
    ) -> str:
        """POST; return the reply text (a wrapped envelope is checked and its status_txt used)."""
        response = self._request("POST", path, params=params, data=data, timeout=timeout)
        text = _text(response)
        if text.lstrip().startswith("{"):
            try:
                parsed = json.loads(text)
            except ValueError:
                return text
            if _is_wrapped(parsed):
                self._unwrap(parsed, response)
                inner = parsed["data"]
                return inner if isinstance(inner, str) else str(parsed["status_txt"])
        return text

    def _ping(self, timeout: float | None) -> bool:
        response = self._request("GET", "/ping", timeout=timeout)
        text = _text(response).strip()
        if text != "OK":
            raise HTTPError(response.status_code, text or "empty /ping reply", response.url)
        return True

    def _info(self, timeout: float | None) -> dict[str, Any]:
        data = self._json("/info", timeout=timeout)
        if not isinstance(data, dict):
            raise HTTPError(200, f"unexpected /info reply: {data!r}", self.base_url + "/info")
        return data


# --------------------------------------------------------------------------------------------
# nsqd


class NsqdHTTPClient(_Client):
    """The HTTP API of one nsqd.

    Args:
        address: ``"host:port"`` of nsqd's HTTP port, or ``"http://host:port"`` /
            ``"https://host:port"``.
        timeout: default timeout of every call, in seconds (connect and each read).
        session: a :class:`requests.Session` to use (shared, not closed by :meth:`close`);
            by default the client creates its own.

    Every method also takes ``timeout`` (seconds) to override the default for that call.
    Topic and channel names are validated before any request (ValueError).
    """

    # -- publishing ------------------------------------------------------------------------

    def pub(self, topic: str, body: bytes | str, *, timeout: float | None = None) -> str:
        """Publish one message (``POST /pub?topic=``).

        ``body`` is bytes (or str, UTF-8 encoded); anything else raises TypeError.
        Returns the reply text (``"OK"``); raises HTTPError otherwise.
        """
        topic = check_topic_name(topic)
        data = to_bytes(body)
        return self._post("/pub", {"topic": topic}, data, timeout)

    def mpub(
        self, topic: str, bodies: Iterable[bytes | str], *, timeout: float | None = None
    ) -> str:
        """Publish several messages atomically (``POST /mpub?topic=&binary=true``).

        ``bodies`` is a non-empty list (any iterable) of bytes or str; the batch is sent in
        the binary format ``[4B count]([4B size][body])*``, so bodies may hold newlines.
        Returns the reply text (``"OK"``).
        """
        topic = check_topic_name(topic)
        check_body_list(bodies, "mpub")
        payload = mpub_payload([to_bytes(b) for b in bodies], "mpub")
        return self._post("/mpub", {"topic": topic, "binary": "true"}, payload, timeout)

    def dpub(
        self, topic: str, body: bytes | str, delay: float, *, timeout: float | None = None
    ) -> str:
        """Publish one message delivered after ``delay`` seconds (``POST /pub?topic=&defer=ms``).

        ``delay`` is a non-negative number of seconds, sent rounded to whole milliseconds
        (nsqd refuses more than its ``--max-req-timeout`` with 400 INVALID_DEFER).
        Returns the reply text (``"OK"``).
        """
        topic = check_topic_name(topic)
        delay = check_float(delay, "dpub delay", "seconds", min=0)
        data = to_bytes(body)
        defer_ms = int(round(delay * 1000))
        return self._post("/pub", {"topic": topic, "defer": str(defer_ms)}, data, timeout)

    # -- introspection ---------------------------------------------------------------------

    def stats(
        self,
        topic: str | None = None,
        channel: str | None = None,
        include_clients: bool = True,
        *,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """nsqd's statistics (``GET /stats?format=json``), optionally for one topic/channel.

        Returns the parsed JSON as nsqd 1.x sends it (unwrapped from a pre-1.0 envelope):
        ``{"version", "health", "start_time", "topics": [...] or None, "producers", ...}``.
        Each topic has ``topic_name, depth, message_count, paused, channels: [...]``; each
        channel ``channel_name, depth, in_flight_count, deferred_count, paused, clients``.
        nsqd 1.x sends ``"topics": null`` when ``topic`` names a topic it does not have.
        """
        params: dict[str, str] = {"format": "json"}
        if topic is not None:
            params["topic"] = check_topic_name(topic)
        if channel is not None:
            if topic is None:
                raise ValueError("stats: a channel filter needs a topic")
            params["channel"] = check_channel_name(channel)
        params["include_clients"] = "true" if include_clients else "false"
        data = self._json("/stats", params, timeout)
        if not isinstance(data, dict):
            raise HTTPError(200, f"unexpected /stats reply: {data!r}", self.base_url + "/stats")
        return data

    def ping(self, *, timeout: float | None = None) -> bool:
        """``GET /ping``: True when nsqd answers ``OK``; raises HTTPError otherwise
        (an unhealthy nsqd answers 500 ``NOK - <reason>``)."""
        return self._ping(timeout)

    def info(self, *, timeout: float | None = None) -> dict[str, Any]:
        """``GET /info``: version, broadcast_address, hostname, tcp_port, http_port,
        start_time (unix seconds), and limits; durations there are Go NANOSECONDS."""
        return self._info(timeout)

    def config(self, option: str, *, timeout: float | None = None) -> Any:
        """``GET /config/<option>``: the value of one nsqd option, as JSON (``max_msg_size``
        -> ``1048576``; durations in Go nanoseconds); HTTPError 400 ``INVALID_OPTION`` for a
        name nsqd does not know."""
        if not option or not option.replace("_", "").isalnum():
            raise ValueError(f"config: not an nsqd option name: {option!r}")
        return self._json(f"/config/{option}", timeout=timeout)

    # -- topics ----------------------------------------------------------------------------

    def _topic_op(self, op: str, topic: str, timeout: float | None) -> None:
        self._post(f"/topic/{op}", {"topic": check_topic_name(topic)}, None, timeout)

    def create_topic(self, topic: str, *, timeout: float | None = None) -> None:
        """Create ``topic`` (``POST /topic/create``); no error if it exists. Returns None."""
        self._topic_op("create", topic, timeout)

    def delete_topic(self, topic: str, *, timeout: float | None = None) -> None:
        """Delete ``topic`` with its channels and messages; TopicNotFoundError if absent."""
        self._topic_op("delete", topic, timeout)

    def empty_topic(self, topic: str, *, timeout: float | None = None) -> None:
        """Drop every message queued in ``topic`` (not in its channels). Returns None."""
        self._topic_op("empty", topic, timeout)

    def pause_topic(self, topic: str, *, timeout: float | None = None) -> None:
        """Stop ``topic`` from passing messages to its channels. Returns None."""
        self._topic_op("pause", topic, timeout)

    def unpause_topic(self, topic: str, *, timeout: float | None = None) -> None:
        """Resume a paused ``topic``. Returns None."""
        self._topic_op("unpause", topic, timeout)

    # -- channels --------------------------------------------------------------------------

    def _channel_op(self, op: str, topic: str, channel: str, timeout: float | None) -> None:
        params = {"topic": check_topic_name(topic), "channel": check_channel_name(channel)}
        self._post(f"/channel/{op}", params, None, timeout)

    def create_channel(self, topic: str, channel: str, *, timeout: float | None = None) -> None:
        """Create ``channel`` on an existing ``topic`` (nsqd 1.x: TopicNotFoundError if the
        topic does not exist). Returns None."""
        self._channel_op("create", topic, channel, timeout)

    def delete_channel(self, topic: str, channel: str, *, timeout: float | None = None) -> None:
        """Delete ``channel`` and its messages. Returns None."""
        self._channel_op("delete", topic, channel, timeout)

    def empty_channel(self, topic: str, channel: str, *, timeout: float | None = None) -> None:
        """Drop every message queued in ``channel``. Returns None."""
        self._channel_op("empty", topic, channel, timeout)

    def pause_channel(self, topic: str, channel: str, *, timeout: float | None = None) -> None:
        """Stop delivering ``channel``'s messages to consumers. Returns None."""
        self._channel_op("pause", topic, channel, timeout)

    def unpause_channel(self, topic: str, channel: str, *, timeout: float | None = None) -> None:
        """Resume a paused ``channel``. Returns None."""
        self._channel_op("unpause", topic, channel, timeout)


# --------------------------------------------------------------------------------------------
# nsqlookupd


def _list(value: Any) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise TypeError(f"expected a JSON list, got {type(value).__name__}")
    return value


def _squash(key: str) -> str:
    return key.replace("_", "").lower()


class LookupdClient(_Client):
    """The HTTP API of one nsqlookupd (classic 1.x, pre-1.0, or youzan's).

    Args:
        address: ``"host:port"`` of nsqlookupd's HTTP port, or ``"http://host:port"`` /
            ``"https://host:port"``.
        timeout: default timeout of every call, in seconds (connect and each read).
        session: a :class:`requests.Session` to use (shared, not closed by :meth:`close`);
            by default the client creates its own.

    Every method also takes ``timeout`` (seconds) to override the default for that call.
    The port is required (ValueError without one).
    """

    _port_required = True

    def lookup(
        self,
        topic: str,
        access: str | None = None,
        metainfo: bool = False,
        *,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Where ``topic`` lives (``GET /lookup?topic=``).

        Args:
            access: youzan only: ``"r"`` (consumers) or ``"w"`` (producers: writable nodes).
            metainfo: youzan only: ask for the partition count and replica number.

        Returns ``{"channels": [str], "producers": [dict]}`` whatever shape the server used,
        plus, when youzan's server sent them, ``"partitions": {"<partition>": producer}`` and
        ``"meta": {"partition_num", "replica", ...}``.  Producer entries keep the server's keys,
        with ``broadcast_address`` filled in from legacy ``address`` and ports as ints; pass
        one to :func:`~nsqclient.addresses.producer_address` for its ``"host:tcp_port"``.

        Raises TopicNotFoundError when no nsqd has the topic (classic nsqlookupd: 404
        TOPIC_NOT_FOUND; 0.3.x without version negotiation: 500 TOPIC_NOT_FOUND; before
        0.2.31: 500 INVALID_ARG_TOPIC; youzan's answers with empty producers instead),
        HTTPError for any other failure.
        """
        params: dict[str, str] = {"topic": check_topic_name(topic)}
        if access is not None:
            if access not in ("r", "w"):
                raise ValueError(f"lookup access must be 'r' or 'w', not {access!r}")
            params["access"] = access
        if metainfo:
            params["metainfo"] = "true"
        try:
            data = self._json("/lookup", params, timeout)
        except HTTPError as exc:
            # nsqlookupd before 0.2.31 answered an unknown topic with 500 INVALID_ARG_TOPIC;
            # the name was validated above, so here that can only mean "not found".
            if exc.status != 0 and exc.message == "INVALID_ARG_TOPIC":
                raise TopicNotFoundError(exc.status, exc.message, exc.url) from exc
            raise
        url = self.base_url + "/lookup"
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise HTTPError(200, f"unexpected /lookup reply: {data!r}", url)
        try:
            result: dict[str, Any] = {
                "channels": _list(data.get("channels")),
                "producers": [_normalise_producer(p) for p in _list(data.get("producers"))],
            }
        except TypeError as exc:
            raise HTTPError(200, f"unexpected /lookup reply: {exc}", url) from None
        if "partitions" in data:
            partitions = data["partitions"] or {}
            if not isinstance(partitions, dict):
                raise HTTPError(200, f"unexpected /lookup partitions: {partitions!r}", url)
            result["partitions"] = {str(k): _normalise_producer(v) for k, v in partitions.items()}
        if "meta" in data and data["meta"] is not None:
            result["meta"] = data["meta"]
        return result

    def topics(self, *, timeout: float | None = None) -> list[str]:
        """Every topic registered (``GET /topics``), as a list of names."""
        data = self._json("/topics", timeout=timeout)
        return self._field_list(data, "topics", "/topics")

    def channels(self, topic: str, *, timeout: float | None = None) -> list[str]:
        """The channels registered for ``topic`` (``GET /channels``); [] for an unknown topic."""
        data = self._json("/channels", {"topic": check_topic_name(topic)}, timeout)
        return self._field_list(data, "channels", "/channels")

    def nodes(self, *, timeout: float | None = None) -> list[dict[str, Any]]:
        """Every nsqd registered (``GET /nodes``): dicts with broadcast_address, tcp_port,
        http_port, version, topics and tombstones (youzan adds partitions)."""
        data = self._json("/nodes", timeout=timeout)
        return [_normalise_producer(p) for p in self._field_list(data, "producers", "/nodes")]

    def _field_list(self, data: Any, key: str, path: str) -> list[Any]:
        if data is None:
            return []
        if not isinstance(data, dict):
            raise HTTPError(200, f"unexpected {path} reply: {data!r}", self.base_url + path)
        try:
            return _list(data.get(key))
        except TypeError as exc:
            raise HTTPError(200, f"unexpected {path} reply: {exc}", self.base_url + path) from None

    def ping(self, *, timeout: float | None = None) -> bool:
        """``GET /ping``: True when nsqlookupd answers ``OK``; raises HTTPError otherwise."""
        return self._ping(timeout)

    def info(self, *, timeout: float | None = None) -> dict[str, Any]:
        """``GET /info``: ``{"version": ...}`` (youzan adds ``ha_support``)."""
        return self._info(timeout)

    def create_topic(self, topic: str, *, timeout: float | None = None) -> None:
        """Register ``topic`` with no producers (``POST /topic/create``). Returns None."""
        self._post("/topic/create", {"topic": check_topic_name(topic)}, None, timeout)

    def delete_topic(self, topic: str, *, timeout: float | None = None) -> None:
        """Forget ``topic`` and its channels (``POST /topic/delete``). Returns None."""
        self._post("/topic/delete", {"topic": check_topic_name(topic)}, None, timeout)

    def tombstone_topic(self, topic: str, node: str, *, timeout: float | None = None) -> None:
        """Hide producer ``node`` (``"broadcast_address:http_port"``) from lookups of
        ``topic`` for nsqlookupd's tombstone lifetime (``POST /topic/tombstone``)."""
        topic = check_topic_name(topic)
        if not isinstance(node, str) or ":" not in node or not node.rpartition(":")[2].isdigit():
            raise ValueError(f"tombstone node must be 'broadcast_address:http_port', not {node!r}")
        self._post("/topic/tombstone", {"topic": topic, "node": node}, None, timeout)

    def create_channel(self, topic: str, channel: str, *, timeout: float | None = None) -> None:
        """Register ``channel`` (and its topic) (``POST /channel/create``). Returns None."""
        params = {"topic": check_topic_name(topic), "channel": check_channel_name(channel)}
        self._post("/channel/create", params, None, timeout)

    def delete_channel(self, topic: str, channel: str, *, timeout: float | None = None) -> None:
        """Forget ``channel`` (``POST /channel/delete``); HTTPError 404 if unknown."""
        params = {"topic": check_topic_name(topic), "channel": check_channel_name(channel)}
        self._post("/channel/delete", params, None, timeout)

    def listlookup(self, *, timeout: float | None = None) -> list[str]:
        """The HTTP addresses (``"host:http_port"``) of every nsqlookupd in a youzan cluster.

        youzan's ``GET /listlookup`` answers ``{"lookupdleader": {...}, "lookupdnodes":
        [{"NodeIP": ..., "HttpPort": "4161", ...}]}`` (Go field names, ports as strings).
        Raises HTTPError when the server has no such endpoint (classic nsqlookupd: 404) or
        no cluster list (youzan without a coordinator answers 200 with an empty body).
        """
        response = self._request("GET", "/listlookup", timeout=timeout)
        if not response.content.strip():
            raise HTTPError(
                response.status_code, "listlookup not supported: empty reply", response.url
            )
        data = self._parse(response)
        nodes = None
        if isinstance(data, dict):
            squashed = {_squash(k): v for k, v in data.items()}
            nodes = squashed.get("lookupdnodes")
        if not isinstance(nodes, list):
            raise HTTPError(
                response.status_code,
                f"listlookup not supported: no lookupdnodes in {str(data)[:200]!r}",
                response.url,
            )
        addresses: list[str] = []
        for node in nodes:
            if not isinstance(node, dict):
                continue
            fields = {_squash(k): v for k, v in node.items()}
            host = fields.get("nodeip")
            port = reply_port(fields.get("httpport"))
            if not host or port in (None, ""):
                logger.warning("listlookup: skipping node without NodeIP/HttpPort: %r", node)
                continue
            address = join_host_port(host, port)
            if address not in addresses:
                addresses.append(address)
        return addresses
