#!/usr/bin/env python
"""The pipelined publish path (``pub_async``) a step at a time: the CPU of each, per message.

No broker: a Producer whose one endpoint holds a Connection on an in-memory transport (every
write goes to a list; no reader or writer thread runs), so each step runs alone, in this
process, on N 200-byte bodies (``--size``), best of ``--repeat``:

* ``future``: the Future ``pub_async`` returns (a ``ResendableFuture`` with the Producer's
  hooks), beside a stock ``concurrent.futures.Future`` made RUNNING, for comparison;
* ``encode``: the PUB command, as ``pub_async`` makes it (the topic's command line cached, the
  body's size checked against the limit), beside ``protocol.pub`` (topic and body checked);
* ``size check``: the limit check alone (``Limits.check_message`` of a body under the limit);
* ``hand-off``: ``NsqdPool.write_ready`` (the connection takes the request: FIFO, counters,
  the writer's queue) for commands and Futures made beforehand;
* ``writer``: the writer thread's part, one pass of its loop over everything queued (joined
  into writes of up to 64 KiB);
* ``answer``: the reader's part, N ``OK`` frames read at once and answered in order;
* ``wait``: ``concurrent.futures.wait()`` over the N answered Futures, as a caller does;
* ``pub_async``: the whole call as a user makes it (future, encode, size check, hand-off),
  the sum the steps above split.

The garbage collector runs as usual (the Futures in flight are what it walks).

    .venv/bin/python bench/publish_steps.py -n 200000
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import Any

import _common as common


class MemoryTransport:
    """What a Connection writes to and closes: writes are kept (their sizes only)."""

    plain = True
    tls_version = None
    compression = None
    bytes_in = 0
    bytes_out = 0

    def __init__(self) -> None:
        self.writes: list[int] = []

    def sendall(self, data: bytes) -> None:
        self.writes.append(len(data))

    def shutdown(self) -> None:
        pass

    def close(self) -> None:
        pass


def connected_producer() -> tuple[Any, Any]:
    """A Producer whose endpoint holds a connected Connection on a MemoryTransport."""
    from nsqclient.conn._connection import Connection, ConnectionState
    from nsqclient.producer._producer import Producer

    producer = Producer(["127.0.0.1:4150"], pub_timeout=3600.0)
    endpoint = producer._pool.given[0]
    conn = Connection(endpoint.address, producer.config)
    conn._transport = MemoryTransport()  # type: ignore[assignment]
    conn.state = ConnectionState.CONNECTED
    conn.on_request_failed = producer._ledger.note
    endpoint.conn = conn
    return producer, conn


def best(repeat: int, setup: Callable[[], Any], step: Callable[[Any], Any]) -> tuple[float, Any]:
    """The least CPU seconds of ``repeat`` runs of ``step(setup())``, and its last result."""
    times = []
    result = None
    for _ in range(repeat):
        given = setup()
        gc.collect()
        began = time.process_time()
        result = step(given)
        times.append(time.process_time() - began)
    return min(times), result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_messages_argument(parser, 200_000, "messages (default 200,000)")
    parser.add_argument("--size", type=int, default=200, help="body bytes (default 200)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per step (default 5)")
    args = parser.parse_args(argv)

    from nsqclient import protocol
    from nsqclient.conn._connection import _STOP
    from nsqclient.producer._outer_futures import ResendableFuture

    n, topic = args.messages, "publish_steps"
    body = common.message_body(args.size)
    producer, conn = connected_producer()
    pool, limits = producer._pool, producer._limits
    command = producer._pub_command(topic, body)
    ok_frames = protocol.encode_frame(protocol.FRAME_TYPE_RESPONSE, protocol.OK) * n
    table: list[list[str]] = []

    def measure(name: str, setup: Callable[[], Any], step: Callable[[Any], Any]) -> None:
        t, _ = best(args.repeat, setup, step)
        table.append([name, f"{1e6 * t / n:.3f}"])
        drain()

    def drain() -> None:
        """Forget what a step left on the connection: queued writes, unanswered requests."""
        while not conn._queue.empty():
            conn._queue.get_nowait()
        pending = conn._pending
        pending.clear()

    def nothing() -> None:
        return None

    def futures() -> list[Any]:
        return [ResendableFuture(command, producer._resend_future, producer._note_failure)
                for _ in range(n)]  # fmt: skip

    def stock_futures(_: None) -> list[Future]:
        made = [Future() for _ in range(n)]
        for future in made:
            future.set_running_or_notify_cancel()
        return made

    def handed_off() -> list[Any]:
        made = futures()
        for future in made:
            pool.write_ready(command, future)
        return made

    def queued() -> None:
        handed_off()
        conn._queue.put(_STOP)

    def answered() -> list[Any]:
        made = handed_off()
        drain_queue_only()
        conn._answer_oks(n)
        return made

    def drain_queue_only() -> None:
        while not conn._queue.empty():
            conn._queue.get_nowait()
        conn._pending.unsent = []  # as if the writer wrote them

    def answer(_: None) -> None:
        drain_queue_only()
        count, _ = conn._frames.leading_oks(ok_frames)
        conn._answer_oks(count)

    def handed_then_answerable() -> None:
        handed_off()

    measure("future (ResendableFuture)", nothing, lambda _: futures())
    measure("future (stock Future, for comparison)", nothing, stock_futures)
    measure("encode (pub_async's)", nothing,
            lambda _: [producer._pub_command(topic, body) for _ in range(n)])  # fmt: skip
    measure("encode (protocol.pub, for comparison)", nothing,
            lambda _: [protocol.pub(topic, body) for _ in range(n)])  # fmt: skip
    size = len(body)
    measure("size check", nothing,
            lambda _: [limits.check_message(size, "PUB") for _ in range(n)])  # fmt: skip
    measure("hand-off (write_ready)", futures,
            lambda made: [pool.write_ready(command, f) for f in made])  # fmt: skip
    measure("writer (its loop over what is queued)", queued, lambda _: conn._write_loop())
    measure("answer (reader: OK frames answered)", handed_then_answerable, answer)
    measure("wait (concurrent.futures.wait, answered)", answered, lambda made: wait(made))
    measure("pub_async (the whole call)", nothing,
            lambda _: [producer.pub_async(topic, body) for _ in range(n)])  # fmt: skip
    print(
        f"{n:,} publishes of {args.size} B, in-process, no broker; best of {args.repeat};"
        f" {common.describe_machine()}; pid {os.getpid()}"
    )
    common.print_table(["step", "CPU us/msg"], table)
    producer._pool.closed = True
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
