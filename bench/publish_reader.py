#!/usr/bin/env python
"""The reader under a pipelined publish: the reads nsqd's answers take, and each thread's CPU.

One process, one Producer: per round, ``-n`` ``pub_async`` (200-byte bodies) then a wait for
all of them, as ``bench/publish.py``'s pipelined case does; printed per round are the rate,
the process's CPU per message, each of its threads' CPU time (Linux: ``/proc/self/task``;
elsewhere left out), how many reads the connection's reader made (``Connection._process``
calls, counted by a wrapper), how many writes the writer made (its rounds, counted the same
way) and the collector's passes per generation.  nsqd writes each
answer on its own: this shows what a read of a few answers costs the reader against one of a
few hundred.  Compare two versions of the code with PYTHONPATH:

    NSQ_BIN_DIR=/opt/nsq-bin .venv/bin/python bench/publish_reader.py --repeat 5
    PYTHONPATH=../checkout-before NSQ_BIN_DIR=/opt/nsq-bin .venv/bin/python bench/publish_reader.py
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from concurrent.futures import wait
from typing import Any

import _common as common


def thread_ticks() -> dict[int, int]:
    """Each thread's CPU time so far, in clock ticks, by native id (empty without /proc)."""
    ticks: dict[int, int] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return ticks
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # the thread ended meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()
        ticks[int(tid)] = int(fields[11]) + int(fields[12])  # utime + stime
    return ticks


def main() -> None:
    parser = common.argument_parser(__doc__, 100_000, "pub_async per round (default 100,000)")
    parser.add_argument("--repeat", type=int, default=5, help="rounds (default 5)")
    args = parser.parse_args()

    import nsqclient
    from nsqclient.conn import _connection

    reads = [0]
    process = _connection.Connection._process

    def counted(self: Any, data: bytes) -> None:
        reads[0] += 1
        process(self, data)

    _connection.Connection._process = counted  # type: ignore[method-assign]
    writes = [0]
    send_items = _connection._send_items

    def counted_writes(transport: Any, items: list[bytes]) -> None:
        writes[0] += 1
        send_items(transport, items)

    _connection._send_items = counted_writes
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    body = common.message_body()
    mem_queue = args.mem_queue_size or args.messages + 1000  # nsqd's disk queue left out
    with common.open_broker(args, mem_queue_size=mem_queue) as broker:
        print(f"broker: {broker.description}; {common.describe_machine()}")
        producer = nsqclient.Producer(broker.tcp_address)
        n = args.messages
        for _ in range(args.repeat):
            topic = common.fresh_topic("pipelined", "reader")
            producer.pub(topic, body)  # the topic made, the connection ready
            gc.collect()
            stats0 = gc.get_stats()
            ticks0, reads[0], writes[0] = thread_ticks(), 0, 0
            began, cpu0 = time.perf_counter(), time.process_time()
            wait([producer.pub_async(topic, body) for _ in range(n)])
            took, cpu = time.perf_counter() - began, time.process_time() - cpu0
            ticks1, stats1 = thread_ticks(), gc.get_stats()
            names = {t.native_id: t.name for t in threading.enumerate()}
            threads = ", ".join(
                f"{names.get(tid, tid)} {(t - ticks0.get(tid, 0)) / tick * 1e6 / n:.2f}"
                for tid, t in sorted(ticks1.items())
                if t > ticks0.get(tid, 0)
            )
            passes = [
                b["collections"] - a["collections"] for a, b in zip(stats0, stats1, strict=True)
            ]
            print(
                f"  {n / took:9,.0f} msg/s, {cpu / n * 1e6:.2f} us CPU/msg; threads (us/msg): "
                f"{threads or '-'}; reads {reads[0]:,} ({n / max(reads[0], 1):,.0f} answers "
                f"each), the writer's writes {writes[0]:,}; collector passes {passes}",
                flush=True,
            )
        producer.close()


if __name__ == "__main__":
    sys.exit(main())
