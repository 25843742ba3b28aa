#!/usr/bin/env python
"""Pull mode's two shapes on the same nsqd: ``take()`` (a Message object per message) against
``take_batches()`` (columnar: MessageBatch objects, no object per message).

For each run the parent fills a fresh topic's channel with N 200-byte messages, then consumes
it in this process: a pull-mode Consumer (``max_in_flight`` 5000) takes what arrived and
answers it in bulk (``finish_many`` / ``finish_batches``: one FIN write per connection), until
N were taken.  Per run it prints the CPU per message of this process (all threads) and the
rate; the runs alternate between the two shapes (``--repeat`` rounds), and nsqd's ``/stats``
must show the channel empty with nothing in flight after each.

    NSQ_BIN_DIR=/opt/nsq-bin .venv/bin/python bench/pull.py -n 200000 --repeat 3
"""

from __future__ import annotations

import sys
import time

import _common as common

CHANNEL = "pull"
SHAPES = ("take", "columnar")


def consume(address: str, topic: str, n: int, columnar: bool) -> tuple[float, float]:
    """CPU seconds and wall seconds to take and finish ``n`` messages."""
    from nsqclient import Consumer

    consumer = Consumer(
        topic, CHANNEL, None, columnar=columnar, nsqd_tcp_addresses=address, max_in_flight=5000
    )
    consumer.start()
    try:
        got = 0
        cpu = common.cpu_seconds()
        began = time.monotonic()
        while got < n:
            if columnar:
                batches = consumer.take_batches(timeout=1.0)
                got += sum(map(len, batches))
                consumer.finish_batches(batches)
            else:
                messages = consumer.take(timeout=1.0)
                got += len(messages)
                consumer.finish_many(messages)
        return common.cpu_seconds() - cpu, time.monotonic() - began
    finally:
        consumer.stop(10.0)


def main(argv: list[str]) -> int:
    parser = common.argument_parser(__doc__ or "", 200_000, "messages per run (default 200,000)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of both shapes (default 3)")
    args = parser.parse_args(argv)
    n = args.messages
    rows = []
    failed = False
    with common.open_broker(args, mem_queue_size=n + 1000) as broker:
        print(f"broker: {broker.description}; {common.describe_machine()}", file=sys.stderr)
        for round_ in range(args.repeat):
            for shape in SHAPES:
                topic = common.fresh_topic("pull", f"{shape}{round_}")
                common.fill_topic(broker, topic, CHANNEL, n)
                cpu, wall = consume(broker.tcp_address, topic, n, shape == "columnar")
                stats = common.channel_stats(broker.http_address, topic, CHANNEL) or {}
                left = stats.get("depth", 0) + stats.get("in_flight_count", 0)
                failed = failed or left != 0
                common.delete_topic(broker.http_address, topic)
                rows.append(
                    [
                        shape,
                        str(round_ + 1),
                        f"{1e6 * cpu / n:.2f}",
                        common.fmt_rate(n / wall),
                        "" if not left else f"{left} left on the channel",
                    ]
                )
    common.print_table(["shape", "round", "CPU us/msg", "msgs/s", ""], rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
