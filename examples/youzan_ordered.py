#!/usr/bin/env python
"""Keyed publishing and ordered consumption on youzan's partitioned NSQ, against the embedded
youzan cluster (two nsqd, one nsqlookupd), with a partition leader moved halfway.

    .venv/bin/python examples/youzan_ordered.py [--messages N] [--keys K]

Prints how many messages were published and handled, how many arrived twice (a message in
flight when its leader moved is delivered again), and whether every key's messages were
handled in the order they were published.  Exits 1 if any key's order was broken or a message
was lost.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections import defaultdict

import nsqclient
from nsqclient.testing import EmbeddedNSQ


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="messages (default 20000)")
    parser.add_argument("--keys", type=int, default=50, help="sharding keys (default 50)")
    args = parser.parse_args(argv)
    total = args.messages - args.messages % args.keys
    topic, channel = "orders", "billing"

    with EmbeddedNSQ(youzan=True, nsqd_count=2) as cluster:
        cluster.create_topic(topic, partitions=4, replica=2, ordered=True)
        cluster.create_channel(topic, channel)  # youzan's lookupd lists no writer before one
        lookupd = [cluster.lookupd.http_address]

        lock = threading.Lock()
        handled: dict[str, list[int]] = defaultdict(list)
        seen: set[bytes] = set()
        all_seen = threading.Event()

        def handle(message: nsqclient.Message) -> None:
            key, seq = message.body.decode().split(":")
            with lock:
                handled[key].append(int(seq))
                seen.add(message.body)
                if len(seen) == total:
                    all_seen.set()

        consumer = nsqclient.Consumer(
            topic, channel, handle, lookupd_http_addresses=lookupd,
            ordered=True, concurrency=4, max_in_flight=16, lookupd_poll_interval=1.0,
        )  # fmt: skip
        consumer.start()
        started = time.monotonic()
        with nsqclient.Producer(lookupd_http_addresses=lookupd) as producer:
            for seq in range(total // args.keys):
                if seq == total // args.keys // 2:
                    old = cluster.partition_leader(topic, 0)
                    cluster.move_leader(topic, 0, 1 - old)
                    print(f"moved partition 0's leader from nsqd {old} to nsqd {1 - old}")
                for k in range(args.keys):
                    key = f"customer-{k}"
                    producer.pub(topic, f"{key}:{seq}".encode(), key=key)
        print(f"published {total:,} messages with {args.keys} keys over 4 partitions")
        complete = all_seen.wait(60.0)
        consumer.stop()
        elapsed = time.monotonic() - started

    handled_count = sum(len(v) for v in handled.values())
    broken = []
    for key, seqs in handled.items():
        collapsed = [s for i, s in enumerate(seqs) if i == 0 or s != seqs[i - 1]]
        if collapsed != list(range(total // args.keys)):
            broken.append(key)
    print(
        f"handled {handled_count:,} ({handled_count - len(seen):,} delivered again) in "
        f"{elapsed:.1f}s; lost {total - len(seen):,}; keys out of order: {len(broken)}"
    )
    return 0 if complete and not broken else 1


if __name__ == "__main__":
    sys.exit(main())
