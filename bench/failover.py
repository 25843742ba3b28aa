#!/usr/bin/env python
"""youzan failover lag: how long after lookupd names a dead leader's successor the Producer's
first publish is acknowledged by it and the ordered Consumer receives its first message from it.

An embedded youzan cluster (three nsqd, one topic of one partition, replicator 3, ordered) with
a registration TTL (youzan's etcd TTL, 20 s in production; ``--ttl``).  One thread publishes
keyed messages with a blocking ``pub()`` at ``--rate`` per second; an ordered Consumer reads them
with the default 60 s lookupd poll.  Mid-stream the leader is killed (``--death kill``: SIGKILL,
replaced after the TTL) or terminated (``terminate``: SIGTERM, handed over at once).  Printed,
in seconds after the death: when lookupd named the new leader, the first publish acknowledged
by it, the consumer's first message from it; then the publish errors seen, and what was lost
(acknowledged but never consumed) and out of order.

    .venv/bin/python bench/failover.py --death kill --ttl 20
    .venv/bin/python bench/failover.py --death terminate
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections import defaultdict

from nsqclient import Consumer, Message, Producer
from nsqclient.errors import NSQError
from nsqclient.testing import EmbeddedNSQ

TOPIC = "failover"
KEYS = 16


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--death", choices=("kill", "terminate"), default="kill")
    parser.add_argument("--ttl", type=float, default=20.0, help="registration TTL, seconds")
    parser.add_argument("--rate", type=float, default=500.0, help="publishes per second")
    parser.add_argument("--before", type=float, default=2.0, help="seconds before the death")
    parser.add_argument("--after", type=float, default=5.0, help="seconds after the new leader")
    args = parser.parse_args(argv)

    with EmbeddedNSQ(youzan=True, nsqd_count=3, registration_ttl=args.ttl) as cluster:
        cluster.create_topic(TOPIC, partitions=1, replica=3, ordered=True)
        cluster.create_channel(TOPIC, "ch")
        lookupd = [cluster.lookupd.http_address]
        lock = threading.Lock()
        acked: dict[bytes, tuple[float, str | None]] = {}
        errors: list[str] = []
        received: dict[int, list[int]] = defaultdict(list)
        first_from: dict[str, float] = {}
        stop = threading.Event()
        producer = Producer(lookupd_http_addresses=lookupd, pub_timeout=args.ttl + 15)

        def handler(message: Message) -> None:
            key, seq = map(int, message.body.split(b":"))
            with lock:
                received[key].append(seq)
                first_from.setdefault(message.nsqd_address or "", time.monotonic())

        consumer = Consumer(TOPIC, "ch", handler, lookupd_http_addresses=lookupd, ordered=True)
        consumer.start()

        def publish() -> None:
            i = 0
            period = 1.0 / args.rate
            next_at = time.monotonic()
            while not stop.is_set():
                body = b"%d:%d" % (i % KEYS, i // KEYS)
                try:
                    # traced: the result names the nsqd that acknowledged it
                    result = producer.pub(TOPIC, body, key=str(i % KEYS), trace_id=i)
                except NSQError as exc:
                    with lock:
                        errors.append(type(exc).__name__)
                else:
                    leader = result.nsqd_address if result is not None else None
                    with lock:
                        acked[body] = (time.monotonic(), leader)
                i += 1
                next_at += period
                stop.wait(max(next_at - time.monotonic(), 0.0))  # the publishing rate

        publisher = threading.Thread(target=publish, name="bench-publisher")
        publisher.start()
        stop.wait(args.before)
        old = cluster.partition_leader(TOPIC, 0)
        old_address = cluster.nsqds[old].tcp_address
        died = time.monotonic()
        getattr(cluster, f"{args.death}_nsqd")(old)
        new = cluster.wait_leader(TOPIC, 0, not_node=old, timeout=args.ttl + 30)
        named = time.monotonic()
        new_address = cluster.nsqds[new].tcp_address
        stop.wait(args.after)
        stop.set()
        publisher.join()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with lock:
                consumed = {b"%d:%d" % (k, s) for k, seqs in received.items() for s in seqs}
            if set(acked) <= consumed:
                break
            time.sleep(0.05)  # a measurement script polling for the consumer to catch up
        consumer.stop()
        producer.close()

    first_pub = min((t for t, leader in acked.values() if leader == new_address and t > died),
                    default=None)  # fmt: skip
    first_msg = first_from.get(new_address)
    lost = len(set(acked) - consumed)
    disorder = 0
    for seqs in received.values():
        collapsed = [s for i, s in enumerate(seqs) if i == 0 or s != seqs[i - 1]]
        disorder += collapsed != sorted(set(collapsed))

    def since(t: float | None) -> str:
        return "never" if t is None else f"{t - died:.2f}s ({t - named:+.2f}s after lookupd)"

    print(f"death: {args.death} of node {old} ({old_address}); ttl {args.ttl:g}s")
    print(f"lookupd named node {new} ({new_address}): {named - died:.2f}s after the death")
    print(f"first publish acknowledged by it:        {since(first_pub)}")
    print(f"consumer's first message from it:        {since(first_msg)}")
    print(f"publishes acknowledged {len(acked):,}; errors {len(errors)} {sorted(set(errors))}")
    print(f"lost (acknowledged, never consumed) {lost}; keys out of order {disorder}")
    return 0 if lost == 0 and disorder == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
