"""nsqclient.aresult(): awaiting a pub_async() Future on an event loop.  Its outcome comes to a
task that waits for it; a task cancelled meanwhile (the HTTP client went away) leaves the
outcome untaken, so a failure still reaches the Producer's undelivered ledger.
asyncio.wrap_future, by contrast, takes the outcome at once and drops it on cancellation."""

from __future__ import annotations

import asyncio
import queue
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import Future

import pytest

import nsqclient
from nsqclient.conn._futures import RequestFuture, failure_of, wait_answered
from nsqclient.errors import ConnectionClosedError, UndeliveredError
from nsqclient.producer._undelivered import Ledger

TIMEOUT = 10.0


def gone() -> ConnectionClosedError:
    return ConnectionClosedError("the connection closed", maybe_processed=True)


async def cancelled_while_waiting(waiter: asyncio.Future | asyncio.Task) -> None:
    """Run ``waiter`` until it waits, then cancel it the way a server cancels a request's task
    when its client disconnects."""
    task = asyncio.ensure_future(waiter)
    for _ in range(3):  # let it reach its await
        await asyncio.sleep(0)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_the_result_and_the_error_come_to_the_awaiting_task():
    ledger = Ledger()

    async def main() -> None:
        ok: RequestFuture = RequestFuture(ledger.note)
        task = asyncio.ensure_future(nsqclient.aresult(ok))
        await asyncio.sleep(0)
        threading.Thread(target=ok.set_result, args=(b"OK",)).start()  # as a reader thread
        assert await asyncio.wait_for(task, TIMEOUT) == b"OK"

        failed: RequestFuture = RequestFuture(ledger.note)
        task = asyncio.ensure_future(nsqclient.aresult(failed))
        await asyncio.sleep(0)
        threading.Thread(target=failed.set_exception, args=(gone(),)).start()
        with pytest.raises(ConnectionClosedError, match="the connection closed"):
            await asyncio.wait_for(task, TIMEOUT)

        done: RequestFuture = RequestFuture(ledger.note)
        done.set_result(b"already")  # done before the await: returned without waiting
        assert await nsqclient.aresult(done) == b"already"
        plain: Future[int] = Future()  # any concurrent.futures.Future
        plain.set_running_or_notify_cancel()
        asyncio.get_running_loop().call_later(0.01, plain.set_result, 7)
        assert await nsqclient.aresult(plain) == 7

    asyncio.run(main())
    assert ledger.take() == ([], 0)  # the failure was raised to its task: not reported again


def test_a_cancelled_await_leaves_the_failure_to_the_ledger_but_wrap_future_loses_it():
    ledger = Ledger()
    ours: RequestFuture = RequestFuture(ledger.note)
    wrapped: RequestFuture = RequestFuture(ledger.note)

    async def main() -> None:
        await cancelled_while_waiting(nsqclient.aresult(ours))
        await cancelled_while_waiting(asyncio.wrap_future(wrapped))
        # The publishes fail afterwards, on a connection's thread.
        for future in (ours, wrapped):
            thread = threading.Thread(target=future.set_exception, args=(gone(),))
            thread.start()
            thread.join(TIMEOUT)
        await asyncio.sleep(0.01)  # whatever the loop was handed runs

    asyncio.run(main())
    assert not ours.observed
    assert wrapped.observed  # wrap_future's done callback took it, and asyncio dropped it
    failed, extra = ledger.take()
    assert failed == [ours] and extra == 0


def test_a_future_completing_after_its_loop_closed_still_reaches_the_ledger():
    ledger = Ledger()
    future: RequestFuture = RequestFuture(ledger.note)

    async def main() -> None:
        await cancelled_while_waiting(nsqclient.aresult(future))

    asyncio.run(main())  # the loop is closed now
    future.set_exception(gone())  # no RuntimeError from the closed loop on this thread
    assert ledger.take() == ([future], 0)


@pytest.fixture
def hung() -> Iterator[tuple[str, queue.Queue[socket.socket]]]:
    """A listener that accepts and never answers (an nsqd hung before the handshake): its
    address, and a queue of the sockets it accepted (closing one fails that handshake)."""
    accepted: queue.Queue[socket.socket] = queue.Queue()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.settimeout(0.05)  # a close() does not wake an accept() everywhere
        stop = threading.Event()

        def accept() -> None:
            while not stop.is_set():
                try:
                    peer, _ = listener.accept()
                except TimeoutError:
                    continue
                except OSError:
                    return
                peer.settimeout(None)
                accepted.put(peer)

        thread = threading.Thread(target=accept, name="test-hung-nsqd", daemon=True)
        thread.start()
        yield f"127.0.0.1:{listener.getsockname()[1]}", accepted
        stop.set()
        thread.join(TIMEOUT)
        while not accepted.empty():
            accepted.get().close()


def test_a_request_gone_before_its_publish_failed_is_reported_by_close(hung):
    address, accepted = hung
    producer = nsqclient.Producer(address, handshake_timeout=30.0, pub_timeout=30.0)
    futures = []

    async def request() -> None:
        futures.append(producer.pub_async("asgi_gone", b"x"))
        await nsqclient.aresult(futures[0])

    async def main() -> None:
        await cancelled_while_waiting(request())  # the client went away
        # Only now does the publish fail: its nsqd closes the connection in the handshake.
        accepted.get(timeout=TIMEOUT).close()
        assert await asyncio.to_thread(wait_answered, futures[0], TIMEOUT)

    asyncio.run(main())
    assert isinstance(failure_of(futures[0]), ConnectionClosedError)  # (takes no outcome)
    with pytest.raises(UndeliveredError) as info:
        producer.close(0)
    assert info.value.count == 1 and info.value.futures == futures
