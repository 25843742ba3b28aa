#!/usr/bin/env python
"""The pipelined publish path in machine instructions per call, counted by valgrind: figures
that do not move with the load of a shared machine, to compare two versions of the code.

Each step runs in a child process under ``valgrind --tool=callgrind`` twice, once with 1 call
and once with N + 1 (``-n``, default 10,000); the difference over N is the instructions one
call costs (the interpreter's start, the imports and the set-up cancel out).  The collector is
off in the child, so these are the calls' own instructions (bench/publish_steps.py has the
collector's share).  No broker: a Producer whose one endpoint holds a Connection on an
in-memory transport (bench/publish_steps.py's), no reader or writer thread.

* ``future``: a ``ResendableFuture`` made (as ``pub_async`` makes it);
* ``encode``: the PUB command as ``pub_async`` makes it (``Producer._pub_command``);
* ``offer``: a future made and handed to ``Connection.offer``;
* ``write_ready``: a future made and handed to ``NsqdPool.write_ready``;
* ``answer``: a future made, offered, and answered by the reader's ``_answer_oks`` (a read's
  OKs at once), less ``offer``;
* ``pub_async``: the whole call, as a user makes it.

    .venv/bin/python bench/publish_instructions.py            # needs valgrind on PATH
    PYTHONPATH=/path/to/other/checkout .venv/bin/python bench/publish_instructions.py
"""

from __future__ import annotations

import gc
import os
import sys
from typing import Any

import _common as common

STEPS = ("future", "encode", "offer", "write_ready", "answer", "pub_async")


def child(step: str, n: int) -> None:
    """Run ``step`` ``n`` times in this process, then leave without the exit's collection."""
    import publish_steps

    from nsqclient.producer._outer_futures import ResendableFuture

    producer, conn = publish_steps.connected_producer()
    body = b"x" * 200
    producer.pub_async("t", body)  # the topic's command line is cached from here on
    command = producer._pub_command("t", body)
    resend, note = producer._resend_future, producer._note_failure
    kept: list[Any]
    gc.disable()
    if step == "pub_async":
        kept = [producer.pub_async("t", body) for _ in range(n)]
    elif step == "encode":
        kept = [producer._pub_command("t", body) for _ in range(n)]
    else:
        kept = [ResendableFuture(command, resend, note) for _ in range(n)]
        if step in ("offer", "answer"):
            for future in kept:
                conn.offer(command, future, 1)
        elif step == "write_ready":
            for future in kept:
                producer._pool.write_ready(command, future, None, 1)
        if step == "answer":
            pending = conn._pending
            pending.unsent = type(pending.unsent)()  # as if the writer wrote them (0 before)
            conn._answer_oks(n)
    del kept
    os._exit(0)  # no collection at exit: it would count the objects kept


def main(argv: list[str]) -> int:
    found = common.step_instructions(
        __file__, STEPS, child, argv, default=10_000, base=1, what="call"
    )
    if found is None:
        return 0
    n, counts = found
    counts["answer"] -= counts["offer"]
    import nsqclient

    print(f"instructions per call, {n:,} calls, nsqclient from {nsqclient.__file__}")
    for step, count in counts.items():
        print(f"  {step:<12} {count:>9,.0f}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main(sys.argv[1:]))
