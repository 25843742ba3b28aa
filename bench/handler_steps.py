#!/usr/bin/env python
"""The handler path a step at a time: what each costs, in CPU per message.

No broker: N message frames of ``--size`` bytes (as real nsqd sends them) are cut into reads of
``--read`` bytes and go through a real Consumer (handler mode, a no-op handler) and a real
Connection that is never connected (what it would write is collected, not sent), one step after
the other, in this one thread, best of ``--repeat``:

* the floors of the reader's parts: ``split`` (FrameReader.feed_runs: frames found, offsets
  kept), ``decode`` (each frame's fields), ``message`` (a Message object per decoded frame);
* ``reader``: what the reader thread does per read, all of it (``Connection._process``: the
  split, the decode, the Messages, the Consumer's counts and RDY, the hand-off into the work
  queue);
* ``worker``: what a handler worker does for them (``Consumer._work_loop``: taking each from
  the queue, the checks, the handler call, the handler contract's FIN and its counts, the
  command queued for the writer);
* ``writer``: what the writer thread does with those commands (``Connection._write_loop``:
  taking them off its queue and joining them into writes, the socket's send left out);
* ``handler``: the no-op handler's own calls, the floor under ``worker``.

Threads are what this leaves out: in a real run the reader, the worker and the writer hand
messages and commands to each other across threads (locks, wake-ups, the GIL), which
``bench/handler_rate.py`` measures end to end on a real nsqd.

    .venv/bin/python bench/handler_steps.py -n 200000
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import _common as common


class _Transport:
    """What the writer writes to: counts the bytes."""

    def __init__(self) -> None:
        self.written = 0
        self.writes = 0

    def sendall(self, data: bytes) -> None:
        self.written += len(data)
        self.writes += 1


def subscribed_consumer(handler: Any) -> tuple[Any, Any]:
    """A Consumer (handler mode, ``handler``) that has one connection, subscribed, RDY 2500,
    nothing received yet; the connection writes to a :class:`_Transport`."""
    from nsqclient import Consumer
    from nsqclient.conn._connection import Connection, ConnectionState
    from nsqclient.consumer._rdy_balancer import send_rdy

    consumer = Consumer("t", "c", handler, nsqd_tcp_addresses="127.0.0.1:4150")
    conn = Connection("127.0.0.1:4150", consumer.config, consumer._delegate)
    conn.state = ConnectionState.CONNECTED
    conn._transport = _Transport()  # type: ignore[assignment]
    consumer._delegate.subscribed(conn)
    consumer._busy, consumer._current = [False], [None]  # what start() makes
    with consumer._lock:
        send_rdy(consumer._conns[conn.key], 2500)
    return consumer, conn


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    common.add_messages_argument(parser, 200_000, "messages (default 200,000)")
    parser.add_argument("--size", type=int, default=200, help="body bytes (default 200)")
    parser.add_argument("--read", type=int, default=65536, help="bytes per read (default 64 KiB)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per step (default 5)")
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=2500,
        help="messages read before the worker and the writer run (default 2500)",
    )
    args = parser.parse_args(argv)

    from nsqclient.conn._connection import _STOP
    from nsqclient.message import Message
    from nsqclient.protocol import FrameReader, MessageRun, decode_message_at

    n = args.messages
    data = common.message_frames(n, args.size)
    reads = [data[i : i + args.read] for i in range(0, len(data), args.read)]
    calls = [0]

    def handler(message: Any) -> None:
        calls[0] += 1

    # Groups of reads holding at most --max-in-flight messages: what a real Consumer holds at
    # once (the garbage collector's passes grow with what is alive).
    per_read = max(1, args.read // len(common.message_frames(1, args.size)))
    per_group = max(1, args.max_in_flight // per_read)
    groups = [reads[i : i + per_group] for i in range(0, len(reads), per_group)]

    class Conn:
        address = "127.0.0.1:4150"
        partition = None

    def floors() -> dict[str, float]:
        """split, decode and message, each alone, over every group."""
        spent = dict.fromkeys(("split", "decode", "message"), 0.0)
        reader = FrameReader()
        received, conn = Message._received, Conn()
        for group in groups:
            t0 = time.process_time()
            runs = [run for chunk in group for run in reader.feed_runs(chunk)]
            t1 = time.process_time()
            decoded = []
            for run in runs:
                assert type(run) is MessageRun
                pairs = zip(run.starts, run.ends, strict=True)
                decoded += [decode_message_at(run.buffer, s, e) for s, e in pairs]
            t2 = time.process_time()
            [received(d, None, conn, 0.0) for d in decoded]  # type: ignore[arg-type]
            t3 = time.process_time()
            spent["split"] += t1 - t0
            spent["decode"] += t2 - t1
            spent["message"] += t3 - t2
        return spent

    def path() -> dict[str, float]:
        """reader, worker and writer, group after group, as a Consumer runs them."""
        spent = dict.fromkeys(("reader", "worker", "writer"), 0.0)
        consumer, conn = subscribed_consumer(handler)
        consumer._intake.exit = True  # the worker returns once the queue is empty
        process = conn._process
        for group in groups:
            t0 = time.process_time()
            for chunk in group:
                process(chunk)
            t1 = time.process_time()
            consumer._work_loop(0)
            t2 = time.process_time()
            conn._queue.put(_STOP)
            conn._write_loop()
            t3 = time.process_time()
            spent["reader"] += t1 - t0
            spent["worker"] += t2 - t1
            spent["writer"] += t3 - t2
        written[:] = [conn._transport.writes, conn._transport.written]
        return spent

    def handler_only() -> dict[str, float]:
        t0 = time.process_time()
        for _ in range(n):
            handler(None)
        return {"handler": time.process_time() - t0}

    written = [0, 0]
    best: dict[str, float] = {}
    for _ in range(args.repeat):
        for measure in (floors, path, handler_only):
            for name, seconds in measure().items():
                best[name] = min(best.get(name, seconds), seconds)
    assert calls[0] == 2 * n * args.repeat, calls  # path() and handler_only()
    table = [[name, f"{1e6 * seconds / n:.3f}"] for name, seconds in best.items()]
    table.insert(
        3,
        [
            "(reader+worker+writer)",
            f"{1e6 * sum(best[k] for k in ('reader', 'worker', 'writer')) / n:.3f}",
        ],
    )
    writes, written_bytes = written
    print(
        f"{n:,} messages of {args.size} B in reads of {args.read:,} B; the writer made {writes:,}"
        f" writes of {written_bytes / max(writes, 1):,.0f} B; {common.describe_machine()}"
    )
    common.print_table(["step", "CPU us/msg"], table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
