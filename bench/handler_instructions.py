#!/usr/bin/env python
"""The handler path in machine instructions per message, counted by valgrind: figures that do
not move with the load of a shared machine, to compare two versions of the code.

The steps are bench/handler_steps.py's, on its Consumer and Connection (no broker, no threads:
a no-op handler, 200-byte messages in reads of 64 KiB).  Each runs in a child process under
``valgrind --tool=callgrind`` twice, with 2,500 messages and with 2,500 + N (``-n``, default
20,000); the difference over N is what one message costs (the interpreter's start, the imports,
the frames' making and the set-up cancel out).  The collector is off in the child.

* ``reader``: ``Connection._process`` on every read (the split, the Messages, the Consumer's
  counts and RDY, the hand-off into the work queue);
* ``worker``: ``Consumer._work_loop`` on what the reader queued (taking each message, the
  checks, the handler, the FIN queued for the writer and its counts), less ``reader``;
* ``writer``: ``Connection._write_loop`` on those commands (joined into writes), less the
  two before.

    .venv/bin/python bench/handler_instructions.py            # needs valgrind on PATH
    PYTHONPATH=/path/to/other/checkout .venv/bin/python bench/handler_instructions.py
"""

from __future__ import annotations

import gc
import os
import sys

import _common as common

STEPS = ("frames", "reader", "worker", "writer")
#: messages of the shorter run: enough for RDY's refills and the writer's joins to be steady
_BASE = 2_500
_READ = 65_536


def child(step: str, n: int) -> None:
    """Run the handler path up to ``step`` on ``n`` messages, then leave without the exit's
    collection (``frames``: only make the reads)."""
    import handler_steps

    from nsqclient.conn._connection import _STOP

    data = common.message_frames(n, 200)
    reads = [data[i : i + _READ] for i in range(0, len(data), _READ)]
    consumer, conn = handler_steps.subscribed_consumer(lambda message: None)
    consumer._intake.exit = True  # the worker returns once the queue is empty
    gc.disable()
    if step != "frames":
        for chunk in reads:
            conn._process(chunk)
    if step in ("worker", "writer"):
        consumer._work_loop(0)
    if step == "writer":
        conn._queue.put(_STOP)
        conn._write_loop()
    os._exit(0)


def main(argv: list[str]) -> int:
    found = common.step_instructions(
        __file__, STEPS, child, argv, default=20_000, base=_BASE, what="message"
    )
    if found is None:
        return 0
    n, totals = found
    import nsqclient

    print(f"instructions per message, {n:,} messages, nsqclient from {nsqclient.__file__}")
    previous = totals["frames"]
    for step in STEPS[1:]:
        print(f"  {step:<8} {totals[step] - previous:>9,.0f}")
        previous = totals[step]
    print(f"  {'total':<8} {totals['writer'] - totals['frames']:>9,.0f}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main(sys.argv[1:]))
