#!/usr/bin/env python
"""The Spark sink's own share of a Python worker: CPU per message of its write(), without Spark.

An executor's Python worker runs the sink's ``write()`` on the Arrow record batches Spark gives
it: the body column becomes Python ``bytes``, is cut into MPUB chunks and published (a Producer
per task, ``max_mpubs_in_flight`` MPUBs in flight, closed at the end).  This script calls that
function (``nsqclient.spark.sink.publish_batches``) on record batches of ``--batch-rows`` rows of
200-byte bodies and prints, best of ``--repeat``, this process's CPU per message (all threads)
of the whole write, and nsqd's ``message_count`` to show every message arrived.  What a Python
worker costs beyond that is pyspark's (Arrow IPC to and from the JVM): compare with the "Python
workers" column of ``bench/spark.py``.

    NSQ_BIN_DIR=/opt/nsq-bin .venv/bin/python bench/spark_sink.py -n 200000
"""

from __future__ import annotations

import time

import _common as common


def main() -> None:
    parser = common.argument_parser(__doc__ or "", 200_000, "messages per write (default 200,000)")
    parser.add_argument("--batch-rows", type=int, default=10_000, help="rows per record batch")
    parser.add_argument("--repeat", type=int, default=3, help="writes; the best is reported")
    args = parser.parse_args()

    import pyarrow as pa

    from nsqclient.spark.options import SinkOptions
    from nsqclient.spark.sink import publish_batches

    n, rows = args.messages, min(args.batch_rows, args.messages)
    body = common.message_body()
    batch = pa.record_batch([pa.array([body] * rows, type=pa.binary())], names=["value"])
    batches = [batch] * (n // rows) + ([batch.slice(0, n % rows)] if n % rows else [])
    with common.open_broker(args, mem_queue_size=n * args.repeat + 1000) as broker:
        print(f"broker: {broker.description}; {n:,} messages of {len(body)} bytes a write")
        topic = common.fresh_topic("sink", "nsqclient")
        options = SinkOptions.parse({"topic": topic, "nsqd_tcp_addresses": broker.tcp_address})
        best_write = float("inf")
        for _ in range(args.repeat):
            c1, t1 = common.cpu_seconds(), time.perf_counter()
            published = publish_batches(options, iter(batches))
            c2, t2 = common.cpu_seconds(), time.perf_counter()
            if published.messages != n:
                raise SystemExit(f"published {published.messages} of {n}")
            best_write = min(best_write, (c2 - c1) / n)
            print(f"  write: {n / (t2 - t1):,.0f} msgs/s, {published.mpubs} MPUBs")
        count = common.topic_message_count(broker.http_address, topic)
        print(f"nsqd holds {count:,} messages of the topic ({n * args.repeat:,} published)")
        print(f"sink CPU per message, best of {args.repeat}: {best_write * 1e6:.2f} us")
        print("  (the whole write: bodies out of Arrow, MPUB chunks and framing, socket, acks)")
        if broker.kind == "embedded":
            print(
                "  (the embedded nsqd runs in this process: its CPU is counted too; use real nsqd)"
            )


if __name__ == "__main__":
    main()
