"""The Futures a Producer hands out before their publish is on a connection
(nsqclient/producer/_outer_futures.py): kept until done, failed at their deadline saying whether
anything was sent, never sent once failed, and following the request written for them."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from nsqclient.conn._future_internals import deliver_all
from nsqclient.conn._futures import RequestFuture
from nsqclient.errors import ConnectionClosedError, NSQTimeoutError, ServerError
from nsqclient.producer._outer_futures import OuterFutures, ResendableFuture


class FakeConnection:
    def __init__(self) -> None:
        self.expired: list[Future] = []

    def expire_request(self, future: Future) -> bool:
        self.expired.append(future)
        future.set_exception(NSQTimeoutError("expired on its connection"))
        return True


@pytest.fixture
def parts() -> tuple[OuterFutures, list[RequestFuture], list[int], FakeConnection]:
    failed: list[RequestFuture] = []
    started: list[int] = []
    conn = FakeConnection()
    outers = OuterFutures(
        failed.append,
        3.0,
        lambda address: conn if address == "a:1" else None,  # type: ignore[arg-type,return-value]
        lambda: started.append(1),
    )
    return outers, failed, started, conn


def test_an_outer_future_is_kept_until_done_and_starts_the_keeper(parts):
    outers, _, started, _ = parts
    outer = outers.track(10.0)
    assert outer.running() and outers.pending() == [outer] and started == [1]
    outers.settle(outer, b"OK")
    assert outer.answer() == b"OK" and outers.pending() == []


def test_one_never_sent_fails_at_its_deadline_and_is_never_sent(parts):
    outers, failed, _, _ = parts
    outer = outers.track(10.0)
    assert outers.expire(9.0) is True and not outer.done()  # not due yet
    assert outers.expire(10.0) is True
    error = outer.failure()
    assert isinstance(error, NSQTimeoutError) and not error.maybe_processed
    assert "pub_timeout (3s)" in str(error)
    assert failed == [outer]  # nobody looked: the ledger has it
    assert outers.may_send(outer) is False  # too late to send it
    outers.settle(outer, b"OK")  # a late answer changes nothing
    assert isinstance(outer.failure(), NSQTimeoutError)
    assert outers.expire(11.0) is False  # none left


def test_one_sent_expires_with_its_request_on_the_connection(parts):
    outers, _, _, conn = parts
    outer = outers.track(10.0)
    assert outers.may_send(outer) is True
    inner = RequestFuture()
    inner.nsqd_address = "a:1"  # type: ignore[attr-defined]
    outer.inner = inner
    outers.chain(inner, outer)
    assert outer.nsqd_address == "a:1"
    outers.expire(10.0)
    assert conn.expired == [inner]
    assert isinstance(outer.failure(), NSQTimeoutError)  # followed its request


def test_a_chained_outer_future_takes_the_answer_or_the_error(parts):
    outers, _, _, _ = parts
    ok, refused = outers.track(10.0), outers.track(10.0)
    inner_ok, inner_refused = RequestFuture(), RequestFuture()
    outers.chain(inner_ok, ok)
    outers.chain(inner_refused, refused)
    inner_ok.set_result(b"OK")
    inner_refused.set_exception(ServerError("E_BAD_MESSAGE"))
    assert ok.result(0) == b"OK"
    assert isinstance(refused.exception(0), ServerError)
    assert outers.pending() == []


def test_an_outer_future_is_a_request_future_with_its_deadline(parts):
    outers, _, _, _ = parts
    outer = outers.track(7.5)
    assert isinstance(outer, RequestFuture)
    assert (outer.deadline, outer.sent, outer.inner, outer.nsqd_address) == (7.5, False, None, None)


def test_a_resendable_future_keeps_its_command_only_until_the_answer():
    resent: list[ResendableFuture] = []

    def resend(future: ResendableFuture) -> bool:
        resent.append(future)
        return True

    answered, batch, failed = (ResendableFuture(b"PUB t\n", resend, print) for _ in range(3))
    assert answered.command == b"PUB t\n"
    answered.deliver(b"OK")
    deliver_all([batch], b"OK")
    assert (answered.command, batch.command) == (None, None)  # the memory is not held
    assert answered.result(0) == b"OK" and batch.result(0) == b"OK"
    failed.set_exception(ServerError("E_BAD_TOPIC nope"))
    assert failed.command is None and not resent
    # A publish nsqd provably did not process (queued behind a fatal error) is resent.
    behind = ResendableFuture(b"PUB t\n", resend, print)
    closed = ConnectionClosedError("closed after a fatal error", maybe_processed=False)
    closed.__cause__ = ServerError("E_BAD_BODY too big")
    behind.set_exception(closed)
    assert resent == [behind] and behind.command == b"PUB t\n" and not behind.done()
