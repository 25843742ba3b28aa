"""A tiny auth server of the kind nsqd's ``--auth-http-address`` queries.

nsqd (and the embedded NSQ) call ``GET /auth?remote_ip=..&tls=..&secret=..&common_name=..`` and
expect ``{"ttl": N, "identity": .., "identity_url": .., "authorizations": [{"topic": regex,
"channels": [regex, ..], "permissions": ["subscribe", "publish"]}]}``.  This server answers from a
fixed table of secrets; an unknown secret gets HTTP 403, which nsqd reports as E_AUTH_FAILED.

Example::

    grant = {"identity": "alice",
             "authorizations": [{"topic": "^allowed$", "channels": [".*"],
                                 "permissions": ["publish", "subscribe"]}]}
    with AuthServer({"s3cret": grant}) as server:
        cluster = EmbeddedNSQ(auth_http_address=server.address).start()
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["AuthServer", "ALLOW_ALL"]

log = logging.getLogger("nsqclient.testing.auth_server")

#: An authorization granting both permissions on every topic and channel.
ALLOW_ALL: dict[str, Any] = {
    "topic": ".*",
    "channels": [".*"],
    "permissions": ["subscribe", "publish"],
}


class AuthServer:
    """An HTTP auth server on ``host`` (loopback) and a free port.

    Args:
        secrets: secret -> grant.  A grant is a mapping with any of ``identity`` (default: the
            secret itself), ``identity_url`` (default ``""``), ``authorizations`` (default
            ``[ALLOW_ALL]``; an empty list means "known but authorized for nothing") and
            ``ttl`` (seconds, default ``ttl``).
        ttl: the default ``ttl`` in seconds of a grant.

    Attributes:
        requests: the query parameters of every ``/auth`` request received, oldest first (each
            a dict of str -> str), for tests to check what nsqd sent.
    """

    def __init__(
        self,
        secrets: Mapping[str, Mapping[str, Any]],
        host: str = "127.0.0.1",
        port: int = 0,
        ttl: int = 3600,
    ):
        self.secrets = {key: dict(value) for key, value in secrets.items()}
        self.ttl = ttl
        self.requests: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer((host, port), _make_handler(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        return str(self._httpd.server_address[0])

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def address(self) -> str:
        """``host:port``, the form nsqd's ``--auth-http-address`` takes."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def start(self) -> AuthServer:
        """Serve on a named background thread; returns self."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._httpd.serve_forever,
                kwargs={"poll_interval": 0.05},
                name=f"nsq-auth-server-{self.port}",
                daemon=True,
            )
            self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving and join the thread (waiting up to ``timeout`` seconds)."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout)
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> AuthServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def grant_for(self, secret: str) -> dict[str, Any] | None:
        """The JSON document returned for ``secret``, or None if it is unknown."""
        grant = self.secrets.get(secret)
        if grant is None:
            return None
        return {
            "ttl": int(grant.get("ttl", self.ttl)),
            "identity": grant.get("identity", secret),
            "identity_url": grant.get("identity_url", ""),
            "authorizations": list(grant.get("authorizations", [ALLOW_ALL])),
        }

    def _record(self, params: dict[str, str]) -> None:
        with self._lock:
            self.requests.append(params)


def _make_handler(server: AuthServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            parts = urlsplit(self.path)
            if parts.path != "/auth":
                self._reply(404, {"message": "NOT_FOUND"})
                return
            params = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
            server._record(params)
            grant = server.grant_for(params.get("secret", ""))
            if grant is None:
                self._reply(403, {"message": "NOT_AUTHORIZED"})
            else:
                self._reply(200, grant)

        def _reply(self, status: int, doc: dict[str, Any]) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            log.debug("%s - %s", self.address_string(), format % args)

    return Handler
