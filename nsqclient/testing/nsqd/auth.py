"""nsqd's side of authorization: asking an auth server (``--auth-http-address``) about a secret,
the answer it keeps per client (identity, permissions, TTL), and what a client may do with it.

Follows nsqd's ``internal/auth``: ``GET /auth?remote_ip=&tls=&secret=&common_name=`` against
each address in turn (starting at a random one) until one answers 200 with a valid document;
and ``client_v2.go``'s Auth / IsAuthorized (:class:`ClientAuth`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import urllib.parse
from typing import Any

from ..gostyle.text import go_quote
from ..http.client import http_get_json
from .options import NSQDOptions
from .protocol_v2 import FatalClientError

__all__ = ["AuthState", "ClientAuth", "query_auth"]

log = logging.getLogger("nsqclient.testing.protocol_v2")


class AuthState:
    """The answer of an auth server, as nsqd keeps it per client."""

    def __init__(self, data: dict[str, Any], now: float):
        self.ttl = int(data.get("ttl") or 0)
        self.identity = str(data.get("identity") or "")
        self.identity_url = str(data.get("identity_url") or "")
        self.authorizations: list[tuple[re.Pattern, list[re.Pattern], list[str]]] = []
        for auth in data.get("authorizations") or []:
            perms = list(auth.get("permissions") or [])
            for p in perms:
                if p not in ("subscribe", "publish"):
                    raise ValueError(f"unknown permission {p}")
            try:
                topic_re = re.compile(auth.get("topic") or "")
                chan_res = [re.compile(c) for c in auth.get("channels") or []]
            except re.error as exc:
                raise ValueError(f"unable to compile regex {exc}") from exc
            self.authorizations.append((topic_re, chan_res, perms))
        if self.ttl <= 0:
            raise ValueError(f"invalid TTL {self.ttl} (must be >0)")
        self.expires = now + self.ttl

    def is_allowed(self, topic: str, channel: str) -> bool:
        for topic_re, chan_res, perms in self.authorizations:
            if channel:
                if "subscribe" not in perms:
                    continue
            elif "publish" not in perms:
                continue
            if not topic_re.search(topic):
                continue
            if any(c.search(channel) for c in chan_res):
                return True
        return False


async def query_auth(
    addresses: list[str],
    *,
    remote_ip: str,
    secret: str,
    tls: bool,
    common_name: str,
    connect_timeout: float,
    request_timeout: float,
    now: float,
) -> AuthState:
    """Ask the auth servers at ``addresses`` (``host:port`` or a full URL) about ``secret``.

    ``connect_timeout`` and ``request_timeout`` are seconds; ``now`` is the loop time the answer's
    TTL counts from.  Raises ValueError naming every failure when no server gave an answer.
    """
    params = urllib.parse.urlencode(
        {
            "common_name": common_name,
            "remote_ip": remote_ip,
            "secret": secret,
            "tls": "true" if tls else "false",
        }
    )
    start = random.randrange(len(addresses)) if addresses else 0
    errors = []
    for i in range(len(addresses)):
        addr = addresses[(start + i) % len(addresses)]
        url = f"{addr}?{params}" if "://" in addr else f"http://{addr}/auth?{params}"
        try:
            data = await http_get_json(url, connect_timeout, request_timeout)
            return AuthState(data if isinstance(data, dict) else {}, now)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            errors.append(f"failed to auth against {addr} - {exc}")
    raise ValueError("; ".join(errors) or "no auth server")


class ClientAuth:
    """One client's authorization, as nsqd's client keeps it: the secret it sent with AUTH, the
    auth server's answer while it is valid, and an answer fetched but not taken yet.

    The connection runs :meth:`fetch` (holding the client's commands meanwhile), then runs
    again the command that needed it: AUTH takes the answer (:meth:`take`), and a PUB or SUB
    after the answer expired takes the fresh one in :meth:`check`.
    """

    def __init__(self, opts: NSQDOptions):
        self.opts = opts
        self.secret = ""
        self.state: AuthState | None = None
        self._answer: AuthState | Exception | None = None

    @property
    def authorized(self) -> bool:
        """AUTH gave the client permissions."""
        return self.state is not None and bool(self.state.authorizations)

    @property
    def answered(self) -> bool:
        """An answer was fetched and is waiting to be taken."""
        return self._answer is not None

    async def fetch(self, remote_ip: str, tls: bool, common_name: str, now: float) -> None:
        """Ask the auth servers about :attr:`secret` (``now``: the loop time the TTL counts
        from); the answer, or the failure, waits for :meth:`take`."""
        opts = self.opts
        answer: AuthState | Exception
        try:
            answer = await query_auth(
                list(opts.auth_http_address or []),
                remote_ip=remote_ip,
                secret=self.secret,
                tls=tls,
                common_name=common_name,
                connect_timeout=opts.http_client_connect_timeout,
                request_timeout=opts.http_client_request_timeout,
                now=now,
            )
        except ValueError as exc:
            answer = exc
        self._answer = answer

    def take(self, remote: str) -> AuthState:
        """The fetched answer, which becomes the client's state; E_AUTH_FAILED when no auth
        server answered (``remote`` names the client in the log line)."""
        answer = self._answer
        self._answer = None
        if isinstance(answer, Exception) or answer is None:
            log.info("[%s] AUTH failed %s", remote, answer)
            raise FatalClientError("E_AUTH_FAILED", "AUTH failed")
        self.state = answer
        return answer

    def check(self, cmd: str, topic: str, channel: str, now: float, remote: str) -> bool:
        """True when the client may ``cmd`` (SUB with a ``channel``, a publish without) on
        ``topic``; False when its answer expired and a fresh one must be fetched first (then
        run the command again).  E_AUTH_FIRST, E_AUTH_FAILED and E_UNAUTHORIZED otherwise."""
        state = self.state
        if state is None or not state.authorizations:
            raise FatalClientError("E_AUTH_FIRST", f"AUTH required before {cmd}")
        if state.expires <= now:
            if self._answer is None:
                return False
            state = self.take(remote)
        if not state.is_allowed(topic, channel):
            raise FatalClientError(
                "E_UNAUTHORIZED",
                f"AUTH failed for {cmd} on {go_quote(topic.encode())} {go_quote(channel.encode())}",
            )
        return True
