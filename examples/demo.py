"""`make demo`: 100,000 messages through an embedded NSQ cluster, one nsqd restarted halfway.

Starts the embedded NSQ (3 nsqd and an nsqlookupd, written in Python, on free loopback ports),
publishes from several threads through one shared Producer, consumes with a Consumer that finds
the nsqd through the lookupd, and halfway through stops one nsqd (its connections drop, it leaves
the lookupd, its queue is kept) and starts it again.  A live progress bar shows the consumption
and its rate (tqdm, when stdout is a terminal; plain lines otherwise).  The summary counts what
was published, consumed, delivered twice (at-least-once: messages in flight on the stopped nsqd
come back) and lost, which must be 0.

    python examples/demo.py [--count 100000] [--publishers 4]
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from collections.abc import Callable

import nsqclient
from nsqclient.testing import EmbeddedNSQ

TOPIC = "demo"
CHANNEL = "counter"
BATCH = 100  # messages per MPUB


class Progress:
    """The consumption's progress: a tqdm bar on a terminal, a plain line every 10% otherwise."""

    def __init__(self, total: int, interactive: bool):
        self.total = total
        self.started = time.monotonic()
        self._bar = None
        self._next_line = 0.1
        if interactive:
            try:
                from tqdm import tqdm
            except ImportError:  # installed by make (the dev extra); plain lines without it
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=total, unit="msg", unit_scale=True, file=sys.stdout)
        self._shown = 0

    def show(self, done: int) -> None:
        """Called about every 0.1 s with the number consumed so far."""
        if self._bar is not None:
            self._bar.update(done - self._shown)
            self._shown = done
            return
        if done < self._next_line * self.total or self._next_line > 1.0:
            return
        elapsed = time.monotonic() - self.started
        print(
            f"consumed {done:>8}/{self.total} ({done / self.total:4.0%})  "
            f"{done / max(elapsed, 1e-9):>9.0f} msgs/s",
            flush=True,
        )
        while self._next_line <= done / self.total:
            self._next_line += 0.1

    def note(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def publish(
    producer: nsqclient.Producer,
    first: int,
    count: int,
    published: set[int],
    lock: threading.Lock,
    errors: list[str],
) -> None:
    """Publish ids ``first .. first+count-1`` in MPUBs; record the ids nsqd acknowledged."""
    for start in range(first, first + count, BATCH):
        ids = range(start, min(start + BATCH, first + count))
        try:
            producer.mpub(TOPIC, [b"%d" % i for i in ids])
        except nsqclient.NSQError as exc:  # said, never hidden: the summary counts these
            errors.append(f"{type(exc).__name__}: {exc}")
            continue
        with lock:
            published.update(ids)


def run_demo(count: int, publishers: int, show: Callable[[str], None] = print) -> dict[str, float]:
    """Run the whole demo; return the summary's figures."""
    interactive = sys.stdout.isatty()
    with EmbeddedNSQ(nsqd_count=3) as cluster:
        assert cluster.lookupd is not None
        show(f"nsqlookupd  {cluster.lookupd.http_url}")
        for node in cluster.nsqds:
            show(f"nsqd        tcp={node.tcp_address}  http={node.http_url}")
        addresses = [node.tcp_address for node in cluster.nsqds]

        received: dict[int, int] = {}
        lock = threading.Lock()

        def handle(message: nsqclient.Message) -> None:
            key = int(message.body)
            with lock:
                received[key] = received.get(key, 0) + 1

        consumer = nsqclient.Consumer(
            TOPIC,
            CHANNEL,
            handle,
            lookupd_http_addresses=[cluster.lookupd.http_url],
            lookupd_poll_interval=0.5,  # seconds: find the restarted nsqd quickly
            max_in_flight=600,
            concurrency=1,  # the handler only counts: one worker is the fastest (GIL)
        )
        # The channel exists on every nsqd before the first publish, so no message waits in a
        # topic without channels.
        for node in cluster.nsqds:
            http = nsqclient.NsqdHTTPClient(node.http_address)
            http.create_topic(TOPIC)
            http.create_channel(TOPIC, CHANNEL)

        published: set[int] = set()
        errors: list[str] = []
        share = -(-count // publishers)
        started = time.monotonic()
        with nsqclient.Producer(addresses, pub_retries=2) as producer:
            threads = [
                threading.Thread(
                    target=publish,
                    args=(
                        producer,
                        i * share,
                        min(share, count - i * share),
                        published,
                        lock,
                        errors,
                    ),
                    name=f"demo-publisher-{i}",
                )
                for i in range(publishers)
                if i * share < count
            ]
            consumer.start()
            for t in threads:
                t.start()
            progress = Progress(count, interactive)
            restarted = False
            deadline = time.monotonic() + 120.0
            while time.monotonic() < deadline:
                with lock:
                    done = len(received)
                    all_published = not any(t.is_alive() for t in threads)
                    target = len(published)
                progress.show(done)
                if not restarted and done >= count // 2:
                    progress.note(f"-- halfway: stopping nsqd {addresses[1]}")
                    cluster.stop_nsqd(1)
                    cluster.start_nsqd(1)
                    progress.note(f"-- nsqd {addresses[1]} is back")
                    restarted = True
                if all_published and done >= target:
                    break
                time.sleep(0.1)  # the display's refresh period, not a synchronisation
            for t in threads:
                t.join(30)
        consumer.stop(timeout=10)
        elapsed = time.monotonic() - started
        progress.show(len(received))
        progress.close()

    consumed = sum(received.values())
    unique = len(received)
    lost = len(published - received.keys())
    summary = {
        "published": len(published),
        "consumed": consumed,
        "duplicates": consumed - unique,
        "lost": lost,
        "publish_errors": len(errors),
        "seconds": elapsed,
        "msgs_per_s": consumed / elapsed,
    }
    show(
        f"published {summary['published']}  consumed {consumed}  "
        f"duplicates {summary['duplicates']}  lost {lost}  "
        f"in {elapsed:.1f}s ({summary['msgs_per_s']:.0f} msgs/s)"
    )
    for error in errors[:5]:
        show(f"publish error: {error}")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=100_000, help="messages to publish")
    parser.add_argument("--publishers", type=int, default=4, help="publishing threads")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    summary = run_demo(args.count, args.publishers)
    if summary["lost"] or summary["published"] != args.count:
        print("demo FAILED: every published message must be consumed", file=sys.stderr)
        return 1
    print("demo OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
