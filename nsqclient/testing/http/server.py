"""A minimal asyncio HTTP/1.1 server for the embedded nsqd and nsqlookupd (stdlib only).

It speaks just enough HTTP for ``requests``, ``curl`` and Go's ``net/http`` client: request line,
headers, ``Content-Length`` or chunked bodies, keep-alive (HTTP/1.1 default), and replies
laid out the way Go's ``net/http`` writes them (handler headers sorted by name, then ``Date``,
``Content-Length`` and, for a body with no declared type, a sniffed ``text/plain`` type).

Handlers are plain functions ``handler(request) -> Response`` run on the event loop.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import re
import urllib.parse
from collections.abc import Callable
from http import HTTPStatus
from typing import Protocol, cast

__all__ = [
    "Request",
    "Response",
    "Router",
    "HTTPServerProtocol",
    "HTTPOwner",
    "Dispatcher",
    "parse_query",
    "QueryError",
]

log = logging.getLogger("nsqclient.testing.http")

#: The largest request body accepted (bytes); nsqd's own limits are checked by the handlers.
MAX_REQUEST_BODY = 64 * 1024 * 1024
_MAX_HEADER_BYTES = 1024 * 1024
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


class QueryError(ValueError):
    """A query string Go's url.ParseQuery would refuse."""


_BAD_ESCAPE = re.compile(r"%(?![0-9a-fA-F]{2})")


def parse_query(raw: str) -> dict[str, list[str]]:
    """Parse a query string like Go's ``url.ParseQuery`` (first error aborts; ``;`` refused)."""
    values: dict[str, list[str]] = {}
    if not raw:
        return values
    for part in raw.split("&"):
        if not part:
            continue
        if ";" in part:
            raise QueryError("invalid semicolon separator in query")
        key, _, value = part.partition("=")
        if _BAD_ESCAPE.search(key) or _BAD_ESCAPE.search(value):
            raise QueryError("invalid URL escape")
        key = urllib.parse.unquote_plus(key)
        value = urllib.parse.unquote_plus(value)
        values.setdefault(key, []).append(value)
    return values


class Request:
    """One parsed HTTP request."""

    __slots__ = (
        "method",
        "target",
        "path",
        "raw_query",
        "version",
        "headers",
        "body",
        "peer",
        "tls",
    )

    def __init__(
        self,
        method: str,
        target: str,
        version: str,
        headers: dict[str, str],
        body: bytes,
        peer: str,
        tls: bool = False,
    ):
        self.method = method
        self.target = target
        path, _, query = target.partition("?")
        self.path = urllib.parse.unquote(path)
        self.raw_query = query
        self.version = version
        self.headers = headers  # lower-cased names
        self.body = body
        self.peer = peer
        #: the request came over TLS (nsqd's HTTPS listener)
        self.tls = tls

    @property
    def content_length(self) -> int:
        """The declared Content-Length (-1 when absent, like Go)."""
        value = self.headers.get("content-length")
        if value is None:
            return -1
        try:
            return int(value)
        except ValueError:
            return -1


class Response:
    """A reply: status, headers set by the handler (canonical names), body bytes."""

    __slots__ = ("status", "headers", "body", "close")

    def __init__(
        self,
        status: int = 200,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        close: bool = False,
    ):
        self.status = status
        self.body = body
        self.headers = headers if headers is not None else {}
        #: close the connection after this reply (Go does when a large body went unread)
        self.close = close


Handler = Callable[[Request], Response]


class Dispatcher(Protocol):
    """Anything that answers a request (a :class:`Router` or an API object wrapping one)."""

    def dispatch(self, request: Request) -> Response:
        """The reply to ``request``."""


class HTTPOwner(Protocol):
    """What an HTTP connection needs of the server it belongs to."""

    stalled: bool
    http_conns: set[HTTPServerProtocol]

    @property
    def router(self) -> Dispatcher:
        """Routes requests to handlers."""


class Router:
    """Method + exact path routing with Go httprouter's 404/405 behaviour."""

    def __init__(
        self, not_found: Handler, method_not_allowed: Callable[[Request, list[str]], Response]
    ):
        self._routes: dict[str, dict[str, Handler]] = {}
        self._not_found = not_found
        self._method_not_allowed = method_not_allowed

    def add(self, method: str, path: str, handler: Handler) -> None:
        """Route ``method path`` to ``handler``."""
        self._routes.setdefault(path, {})[method] = handler

    def dispatch(self, request: Request) -> Response:
        """Run the handler for ``request`` (404/405 replies as httprouter builds them)."""
        methods = self._routes.get(request.path)
        if methods is None:
            return self._not_found(request)
        handler = methods.get(request.method)
        if handler is None:
            if request.method == "OPTIONS":
                allow = ", ".join(sorted(set(methods) | {"OPTIONS"}))
                return Response(200, b"", {"Allow": allow})
            return self._method_not_allowed(request, sorted(set(methods) | {"OPTIONS"}))
        return handler(request)


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return f"status code {status}"


def render_response(response: Response, close: bool = False, version: str = "HTTP/1.1") -> bytes:
    """Serialise ``response`` the way Go's net/http lays it out."""
    lines = [f"{version} {response.status} {_reason(response.status)}"]
    headers = response.headers
    for name in sorted(headers):
        lines.append(f"{name}: {headers[name]}")
    lines.append("Date: " + email.utils.formatdate(usegmt=True))
    lines.append(f"Content-Length: {len(response.body)}")
    if close:
        lines.append("Connection: close")
    if "Content-Type" not in headers and response.body:
        lines.append("Content-Type: text/plain; charset=utf-8")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + response.body


class HTTPServerProtocol(asyncio.Protocol):
    """One HTTP connection: parse requests, answer them in order, keep alive.

    ``owner`` supplies ``router`` (a :class:`Router`), ``stalled`` (bool attribute: accept but
    never answer) and ``http_conns`` (a set this connection adds itself to).
    """

    def __init__(self, owner: HTTPOwner):
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.closed = False
        self.peer = ""
        self.tls = False
        self._continued = False  # "100 Continue" already sent for the pending request

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        self.tls = transport.get_extra_info("sslcontext") is not None
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
        self.owner.http_conns.add(self)
        if self.owner.stalled:
            transport.pause_reading()

    def connection_lost(self, exc):
        self.closed = True
        self.owner.http_conns.discard(self)

    def data_received(self, data):
        self.buf += data
        if not self.owner.stalled:
            self.process()

    def resume(self) -> None:
        """Continue after an unstall."""
        if self.closed or self.transport is None:
            return
        self.transport.resume_reading()
        self.process()

    def close(self) -> None:
        """Close the connection now."""
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True

    def _bad_request(self, text: str = "Bad Request") -> None:
        """Go's reply to an unparseable request, then hang up."""
        if self.transport is not None:
            self.transport.write(
                (
                    f"HTTP/1.1 400 {text}\r\nContent-Type: text/plain; charset=utf-8\r\n"
                    f"Connection: close\r\n\r\n400 {text}"
                ).encode("latin-1")
            )
            self.transport.close()
        self.closed = True

    def process(self) -> None:
        """Answer every complete request in the buffer."""
        buf = self.buf
        while not self.closed and not self.owner.stalled:
            # the request line is checked as soon as it is complete (Go answers a
            # malformed one at once, e.g. an NSQ client that dialled the HTTP port)
            while buf[:2] == b"\r\n" or buf[:1] == b"\n":
                del buf[: 2 if buf[:1] == b"\r" else 1]
            first = buf.find(b"\n")
            if first < 0:
                if len(buf) > _MAX_HEADER_BYTES:
                    self._bad_request()
                return
            parts = bytes(buf[:first]).rstrip(b"\r").decode("latin-1").split(" ")
            if (
                len(parts) != 3
                or not parts[0]
                or not _TOKEN.match(parts[0])
                or parts[2] not in ("HTTP/1.0", "HTTP/1.1")
            ):
                self._bad_request()
                return
            method, target, version = parts
            # then the headers, up to an empty line
            headers: dict[str, str] = {}
            pos = first + 1
            while True:
                nl = buf.find(b"\n", pos)
                if nl < 0:
                    if len(buf) > _MAX_HEADER_BYTES:
                        self._bad_request()
                    return
                line = bytes(buf[pos:nl]).rstrip(b"\r").decode("latin-1")
                pos = nl + 1
                if not line:
                    break
                name, sep, value = line.partition(":")
                if not sep or not name or name != name.strip():
                    self._bad_request()
                    return
                headers[name.lower()] = value.strip()
            if version == "HTTP/1.1" and "host" not in headers:
                self._bad_request("Bad Request: missing required Host header")
                return
            if "chunked" in headers.get("transfer-encoding", "").lower():
                body_parts = []
                while True:
                    nl = buf.find(b"\r\n", pos)
                    if nl < 0:
                        return
                    try:
                        size = int(bytes(buf[pos:nl]).split(b";")[0], 16)
                    except ValueError:
                        self._bad_request()
                        return
                    if size == 0:
                        trailer_end = buf.find(b"\r\n\r\n", nl)
                        if buf[nl : nl + 4] == b"\r\n\r\n":
                            pos = nl + 4
                        elif trailer_end >= 0:
                            pos = trailer_end + 4
                        else:
                            return
                        break
                    if len(buf) < nl + 2 + size + 2:
                        return
                    body_parts.append(bytes(buf[nl + 2 : nl + 2 + size]))
                    pos = nl + 2 + size + 2
                body = b"".join(body_parts)
            else:
                try:
                    length = int(headers.get("content-length", "0") or "0")
                except ValueError:
                    self._bad_request()
                    return
                if length < 0 or length > MAX_REQUEST_BODY:
                    self._bad_request()
                    return
                if len(buf) < pos + length:
                    if (
                        not self._continued
                        and headers.get("expect", "").lower() == "100-continue"
                        and self.transport is not None
                    ):
                        self._continued = True
                        self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    return
                body = bytes(buf[pos : pos + length])
                pos += length
            del buf[:pos]
            self._continued = False
            request = Request(method, target, version, headers, body, self.peer, self.tls)
            conn_hdr = headers.get("connection", "").lower()
            close = conn_hdr == "close" or (version == "HTTP/1.0" and conn_hdr != "keep-alive")
            try:
                response = self.owner.router.dispatch(request)
            except Exception:  # pragma: no cover - a bug in a handler
                log.exception("HTTP handler failed for %s %s", method, target)
                response = Response(
                    500,
                    b'{"message":"INTERNAL_ERROR"}',
                    {
                        "Content-Type": "application/json; charset=utf-8",
                        "X-Nsq-Content-Type": "nsq; version=1.0",
                    },
                )
            close = close or response.close
            if self.transport is None:
                return
            self.transport.write(
                render_response(response, close=close and version == "HTTP/1.1", version=version)
            )
            if close:
                self.transport.close()
                self.closed = True
                return
