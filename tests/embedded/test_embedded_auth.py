"""The embedded nsqd's per-client authorization (ClientAuth), without a connection: AUTH first,
what the answer allows, asking again when it expires, a failed query."""

from __future__ import annotations

import asyncio

import pytest

from nsqclient.testing.nsqd.auth import AuthState, ClientAuth
from nsqclient.testing.nsqd.options import NSQDOptions
from nsqclient.testing.nsqd.protocol_v2 import FatalClientError

ANSWER = {
    "ttl": 60,
    "identity": "me",
    "authorizations": [{"topic": "^t$", "channels": ["^c$"], "permissions": ["subscribe"]}],
}


def code(call) -> str:
    with pytest.raises(FatalClientError) as info:
        call()
    return info.value.code


def test_nothing_is_allowed_before_auth_and_the_answer_decides_after():
    auth = ClientAuth(NSQDOptions())
    assert not auth.authorized and not auth.answered
    assert code(lambda: auth.check("SUB", "t", "c", 0.0, "peer")) == "E_AUTH_FIRST"
    auth.state = AuthState(ANSWER, now=0.0)
    assert auth.authorized
    assert auth.check("SUB", "t", "c", 1.0, "peer")
    assert code(lambda: auth.check("PUB", "t", "", 1.0, "peer")) == "E_UNAUTHORIZED"


def test_an_expired_answer_is_asked_again_and_a_failed_query_fails_the_command():
    auth = ClientAuth(NSQDOptions(auth_http_address=[]))
    auth.state = AuthState(ANSWER, now=0.0)
    assert auth.check("SUB", "t", "c", 60.0, "peer") is False  # expired: fetch first
    asyncio.run(auth.fetch("127.0.0.1", tls=False, common_name="", now=60.0))
    assert auth.answered  # no auth server: the failure waits to be taken
    assert code(lambda: auth.check("SUB", "t", "c", 60.0, "peer")) == "E_AUTH_FAILED"
    assert not auth.answered
