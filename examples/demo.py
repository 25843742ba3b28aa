"""`make demo`: start the embedded NSQ, publish, consume, and print what happened.

Runs on a fresh clone with nothing but the package installed: an nsqd and an nsqlookupd written
in Python start on free loopback ports, a Producer publishes through TCP, a Consumer finds the
nsqd through the lookupd and handles every message on worker threads.
"""

from __future__ import annotations

import threading
import time

import nsqclient
from nsqclient.testing import EmbeddedNSQ

TOPIC = "demo"
CHANNEL = "printer"
COUNT = 1000


def main() -> None:
    with EmbeddedNSQ(nsqd_count=2) as cluster:
        print(f"embedded nsqlookupd  http={cluster.lookupd.http_url}")
        for node in cluster.nsqds:
            print(f"embedded nsqd        tcp={node.tcp_address}  http={node.http_url}")
        http = nsqclient.NsqdHTTPClient(cluster.nsqd.http_address)
        print(f"GET /ping -> {http.ping()}")

        addresses = [n.tcp_address for n in cluster.nsqds]
        started = time.monotonic()
        with nsqclient.Producer(addresses) as producer:
            producer.pub(TOPIC, b"hello from nsqclient")
            producer.mpub(TOPIC, [f"batch {i}".encode() for i in range(COUNT - 2)])
            producer.dpub(TOPIC, b"deferred by 0.5 s", delay=0.5)
        print(
            f"published {COUNT} messages round-robin over {len(addresses)} nsqd "
            f"in {time.monotonic() - started:.2f}s"
        )

        received: list[bytes] = []
        lock = threading.Lock()
        done = threading.Event()

        def handler(message: nsqclient.Message) -> None:
            with lock:
                received.append(message.body)
                if len(received) >= COUNT:
                    done.set()

        consumer = nsqclient.Consumer(
            TOPIC,
            CHANNEL,
            handler,
            lookupd_http_addresses=[cluster.lookupd.http_url],
            max_in_flight=100,
            concurrency=4,
            lookupd_poll_interval=1.0,
        )
        started = time.monotonic()
        consumer.start()
        finished = done.wait(30)
        elapsed = time.monotonic() - started
        consumer.stop(timeout=10)

        stats = consumer.stats()
        print(
            f"consumed {len(received)} messages in {elapsed:.2f}s through the lookupd "
            f"(finished={stats['finished']}, requeued={stats['requeued']})"
        )
        print(f"first: {received[0]!r}  last: {received[-1]!r}")
        for node in cluster.nsqds:
            topics = nsqclient.NsqdHTTPClient(node.http_address).stats(topic=TOPIC)["topics"]
            for topic in topics or []:
                for ch in topic["channels"]:
                    print(
                        f"{node.tcp_address}: {topic['topic_name']}/{ch['channel_name']} "
                        f"messages={ch['message_count']} depth={ch['depth']} "
                        f"in_flight={ch['in_flight_count']}"
                    )
        if not finished:
            raise SystemExit("demo failed: not every message arrived")
        print("demo OK")


if __name__ == "__main__":
    main()
