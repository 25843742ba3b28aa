#!/usr/bin/env python
"""The Spark source's receive path a step at a time: the floor of each, in CPU per message.

No broker and no Spark: N message frames of ``--size`` bytes (as real nsqd sends them) are cut
into reads of ``--read`` bytes, and each step of the path runs alone, in this process, best of
``--repeat``:

* driver side (the reader's process): ``split`` (FrameReader.feed_runs: frames found, offsets
  kept), ``batches`` (a MessageBatch per read), ``ship`` (numPartitions Frames cut and pickled,
  what Spark sends to the executors), ``fin`` (the FIN commands of every message, what
  ``finish_batches`` writes);
* executors: ``rows`` (unpickle a partition and build its Arrow record batch), ``ipc`` (that
  record batch as an Arrow IPC stream: what a Python worker hands the JVM);
* the message-object path the columnar one replaced, for comparison: ``decode`` (frames
  decoded into Message objects, as ``take()`` gets them), ``rows from objects`` (the Arrow
  record batch built from those objects on the driver).

The garbage collector's thresholds are raised as the source raises them in Spark's process.

    .venv/bin/python bench/spark_steps.py -n 200000
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from collections.abc import Callable
from typing import Any

import _common as common


def best(repeat: int, step: Callable[[], Any]) -> tuple[float, Any]:
    """The least CPU seconds of ``repeat`` runs of ``step``, and its last result."""
    times = []
    result = None
    for _ in range(repeat):
        began = time.process_time()
        result = step()
        times.append(time.process_time() - began)
    return min(times), result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_messages_argument(parser, 200_000, "messages (default 200,000)")
    parser.add_argument("--size", type=int, default=200, help="body bytes (default 200)")
    parser.add_argument("--read", type=int, default=65536, help="bytes per read (default 64 KiB)")
    parser.add_argument("--partitions", type=int, default=2, help="numPartitions (default 2)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per step (default 5)")
    args = parser.parse_args(argv)

    import pyarrow as pa

    from nsqclient.consumer import MessageBatch, Origin
    from nsqclient.message import Message
    from nsqclient.protocol import FrameReader, MessageRun, decode_message_at
    from nsqclient.spark.frames import frames_of, to_rows
    from nsqclient.spark.rows import to_record_batch
    from nsqclient.spark.source import relax_gc

    relax_gc()  # as in Spark's source process

    n = args.messages
    data = common.message_frames(n, args.size)
    reads = [data[i : i + args.read] for i in range(0, len(data), args.read)]
    origin = Origin("127.0.0.1:4150", "127.0.0.1:4150")

    def split() -> list[Any]:
        reader = FrameReader()
        return [run for chunk in reads for run in reader.feed_runs(chunk)]

    def batches() -> list[MessageBatch]:
        return [MessageBatch(r.buffer, r.starts, r.ends, origin) for r in runs]

    def ship() -> list[bytes]:
        return [pickle.dumps(part) for part in frames_of(held, args.partitions)]

    def fin() -> list[bytes]:
        return [b"FIN " + b"\nFIN ".join(b.ids()) + b"\n" for b in held]

    def rows() -> list[Any]:
        return [to_rows(pickle.loads(blob), "t") for blob in shipped]

    def ipc() -> list[bytes]:
        out = []
        for table in tables:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_batch(table)
            out.append(sink.getvalue())
        return out

    class Conn:
        address = "127.0.0.1:4150"
        partition = None

    def decode() -> list[Message]:
        received, conn = Message._received, Conn()
        out = []
        for run in runs:
            assert type(run) is MessageRun
            pairs = zip(run.starts, run.ends, strict=True)
            decoded = [decode_message_at(run.buffer, s, e) for s, e in pairs]
            out += [received(d, None, conn, 0.0) for d in decoded]  # type: ignore[arg-type]
        return out

    def rows_from_objects() -> Any:
        return to_record_batch(messages, "t")

    table: list[list[str]] = []

    def measure(where: str, name: str, step: Callable[[], Any]) -> Any:
        """Time ``step`` (best of --repeat), add its row; return its result."""
        t, result = best(args.repeat, step)
        table.append([where, name, f"{1e6 * t / n:.3f}"])
        return result

    runs = measure("driver", "split", split)
    to_rows(frames_of(batches()[:1], 1)[0], "t")  # imports pyarrow.compute first
    held = measure("driver", "batches", batches)
    shipped = measure("driver", "ship", ship)
    measure("driver", "fin", fin)
    tables = measure("executors", "rows", rows)
    measure("executors", "ipc", ipc)
    messages = measure("(objects)", "decode", decode)
    measure("(objects)", "rows from objects", rows_from_objects)
    print(
        f"{n:,} messages of {args.size} B in reads of {args.read:,} B; {common.describe_machine()}"
    )
    common.print_table(["where", "step", "CPU us/msg"], table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
