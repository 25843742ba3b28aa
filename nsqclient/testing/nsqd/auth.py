"""nsqd's side of authorization: asking an auth server (``--auth-http-address``) about a secret,
and the answer it keeps per client (identity, permissions, TTL).

Follows nsqd's ``internal/auth``: ``GET /auth?remote_ip=&tls=&secret=&common_name=`` against
each address in turn (starting at a random one) until one answers 200 with a valid document.
"""

from __future__ import annotations

import asyncio
import random
import re
import urllib.parse
from typing import Any

from ..http.client import http_get_json

__all__ = ["AuthState", "query_auth"]


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
