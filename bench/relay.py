#!/usr/bin/env python
"""Relay throughput: consume topic A and publish every message to topic B, on the same nsqd.

Cases, each relaying the same N 200-byte messages from a fresh topic A (its channel made before
the fill, so A's channel holds all N before the relay starts) to a fresh topic B:

* ``nsqclient pub_async``  docs/relay.rst's pub_async relay: a Consumer (``max_in_flight``
                           2500, concurrency 1) whose handler calls ``enable_async()`` and
                           ``Producer.pub_async()``, FIN (or REQ) in the Future's done-callback;
* ``nsqclient batching``   docs/relay.rst's batching relay, on the pull API: a Consumer with no
                           handler (``max_in_flight`` 2500) and one thread that takes up to 500
                           messages (``consumer.take(500, timeout=0.25)``: what has arrived),
                           publishes them with one ``mpub()``, then ``finish_many()`` (one FIN
                           write) or, on failure, ``requeue_many()``; every batch's size is
                           recorded;
* ``nsqclient batch fill`` (only with ``--cases``) the same, but taking again until the batch is
                           full, ``consumer.is_starved()`` or 0.25 s have passed;
* ``batching enable_async`` the batching relay docs/relay.rst gave before the pull API (pynsq's
                           idiom): the handler holds messages with ``enable_async()`` and
                           publishes them with one ``mpub()`` when 500 are held or
                           ``consumer.is_starved()``, a timer thread flushes every 0.25 s, then
                           every message of the batch is FINished one by one (``max_in_flight``
                           2500); every flush's size is recorded;
* ``pynsq``                an ``nsq.Reader`` (``max_in_flight`` 2500) whose handler calls
                           ``nsq.Writer.pub(B, body, callback)`` and FINishes (or REQueues) the
                           message in the callback, under tornado's IOLoop (``nsq.run()``);
* ``nsq_to_nsq``           Go's ``nsq_to_nsq`` (when NSQ_BIN_DIR holds it) with its defaults
                           and ``--max-in-flight=2500``, stopped once B has N messages.

The rate is M messages over the time from the first message the relay was given to the M-th
message nsqd acknowledged on B, M being 99% of N: nsqd holds the last few kilobytes it sends a
consumer for its ``output_buffer_timeout`` (250 ms) once the channel runs dry, which would add
up to 250 ms to every run whatever the client (see bench/consume.py).  The Python relays time
themselves (first handler call or first message taken, M-th publish acknowledged); for
nsq_to_nsq the parent polls nsqd's ``/stats`` (first message in flight on A's channel, B's
``message_count`` reaching M) and reads its CPU time from ``/proc``.  After each run the
parent checks nsqd's ``/stats``: A's channel drained (nothing left or in flight) and B holding N
messages (more: duplicates, which at-least-once delivery allows and the report counts).

    .venv/bin/python bench/relay.py --quick                # embedded NSQ, a smoke test
    NSQ_BIN_DIR=/opt/nsq-bin .venv/bin/python bench/relay.py --messages 100000 --repeat 3
    .venv/bin/python bench/relay.py --nsqd 127.0.0.1:4150 --cases batching,batching_async
"""

from __future__ import annotations

import argparse
import functools
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import _common as common

CHANNEL = "relay"
#: case key -> label in the report
CASES = {
    "pub_async": "nsqclient pub_async",
    "batching": "nsqclient batching",
    "batching_fill": "nsqclient batch fill",
    "batching_async": "batching enable_async",
    "pynsq": "pynsq",
    "nsq_to_nsq": "nsq_to_nsq",
}
#: the cases run unless --cases says otherwise
DEFAULT_CASES = ("pub_async", "batching", "batching_async", "pynsq", "nsq_to_nsq")
CASE_CLIENT = {
    "pub_async": "nsqclient",
    "batching": "nsqclient",
    "batching_fill": "nsqclient",
    "batching_async": "nsqclient",
    "pynsq": "pynsq",
    "nsq_to_nsq": "nsq_to_nsq",
}
#: the batching cases, whose batches are recorded and reported
BATCHING = ("batching", "batching_fill", "batching_async")
BATCH_SIZE = 500  # the batching relay's messages per MPUB (docs/relay.rst)
MAX_WAIT = 0.25  # the batching relay's timed flush, seconds (docs/relay.rst)
GO_POLL = 0.005  # seconds between the parent's /stats polls while nsq_to_nsq runs


def stop_count(n: int) -> int:
    """The message whose acknowledgement on B stops the clock: 99% of ``n`` (all of a small
    run), so that nsqd's last output-buffer flush on A does not count."""
    return n - n // 100 if n >= 1000 else n


# ------------------------------------------------------------------------------ children


class _Relayed:
    """Counts messages relayed (acknowledged on B); the clock and the CPU window run from the
    first message the relay was given to the ``stop_count``-th acknowledgement.  Safe to call
    from any thread."""

    def __init__(self, n: int, broker_pid: int | None):
        self.n = n
        self.stop_at = stop_count(n)
        self.window = common.CpuWindow(broker_pid)
        self.first_at: float | None = None  # perf_counter() of the first message given
        self.count = 0
        self.failed = 0  # publishes that failed (their messages requeued)
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._watch = (-1, 0.0)  # (count, when it was last seen to change)

    def given(self) -> None:
        """A message reached the relay's handler (starts the clock on the first)."""
        if self.first_at is None:
            with self._lock:
                if self.first_at is None:
                    self.window.start()
                    self.first_at = time.perf_counter()

    def relayed(self, k: int = 1) -> bool:
        """``k`` more messages acknowledged on B; True when that made N."""
        with self._lock:
            before = self.count
            self.count = after = before + k
        if before < self.stop_at <= after:
            self.window.stop()
        if before < self.n <= after:
            self.done.set()
            return True
        return False

    def stalled(self, now: float, stall_timeout: float) -> bool:
        if self.count != self._watch[0]:
            self._watch = (self.count, now)
        return now - self._watch[1] > stall_timeout

    def wait(self, spec: dict[str, Any]) -> str | None:
        """Block until N are relayed; an error text if the relay stalled or ran out of time."""
        deadline = time.monotonic() + spec["timeout"]
        while not self.done.wait(0.5):
            now = time.monotonic()
            if now > deadline or self.stalled(now, spec["stall_timeout"]):
                return self.stall_text(spec)
        return None

    def stall_text(self, spec: dict[str, Any]) -> str:
        return (
            f"relayed {self.count} of {self.n} ({self.failed} publishes failed), then nothing "
            f"for {spec['stall_timeout']}s (or the {spec['timeout']}s limit passed)"
        )

    def result(self) -> dict[str, Any]:
        return {
            "relayed": self.count,
            "failed": self.failed,
            "timed": self.stop_at,
            **self.window.as_dict(),
        }


def run_prefill(spec: dict[str, Any]) -> dict[str, Any]:
    """Fill topic A with MPUBs of 500, 16 in flight (setup, not measured)."""
    import nsqclient

    body = common.message_body(spec["size"])
    n, batch, window = spec["n"], 500, 16
    start = time.perf_counter()
    with nsqclient.Producer([spec["tcp"]]) as producer:
        pending = []
        for offset in range(0, n, batch):
            pending.append(producer.mpub_async(spec["topic_a"], [body] * min(batch, n - offset)))
            if len(pending) >= window:
                pending.pop(0).result(60.0)
        for future in pending:
            future.result(60.0)
    return {"seconds": time.perf_counter() - start}


def _warm_producer(producer: Any, spec: dict[str, Any]) -> None:
    """Connect the Producer before the relay starts (a publish to a topic of its own)."""
    producer.pub(spec["warmup"], common.message_body(spec["size"]))


def run_pub_async(spec: dict[str, Any]) -> dict[str, Any]:
    """docs/relay.rst, "The pub_async relay"."""
    import nsqclient

    tally = _Relayed(spec["n"], spec["broker_pid"])
    topic_b = spec["topic_b"]
    with common.maybe_profile(spec):
        producer = nsqclient.Producer([spec["tcp"]])
        _warm_producer(producer, spec)

        def relay(message: Any) -> None:
            tally.given()
            message.enable_async()  # answered in the callback below, not when relay() returns

            def published(future: Any) -> None:
                if future.exception() is None:
                    message.finish()
                    tally.relayed()
                else:
                    message.requeue()
                    tally.failed += 1

            producer.pub_async(topic_b, message.body).add_done_callback(published)

        consumer = nsqclient.Consumer(
            spec["topic_a"],
            CHANNEL,
            relay,
            nsqd_tcp_addresses=[spec["tcp"]],
            max_in_flight=spec["max_in_flight"],
            concurrency=1,
        )
        consumer.start()
        error = tally.wait(spec)
        consumer.stop(timeout=30.0)
        producer.close()
    result = tally.result()
    if error:
        result["error"] = error
    return result


def run_batching(spec: dict[str, Any]) -> dict[str, Any]:
    """docs/relay.rst, "The batching relay" (pull mode), recording each batch (when, how many,
    what ended it)."""
    import nsqclient

    tally = _Relayed(spec["n"], spec["broker_pid"])
    topic_b = spec["topic_b"]
    fill = spec["mode"] == "batching_fill"
    flushes: list[tuple[float, int, str]] = []  # (seconds after the first message, size, why)
    clock = time.perf_counter

    with common.maybe_profile(spec):
        producer = nsqclient.Producer([spec["tcp"]])
        _warm_producer(producer, spec)
        consumer = nsqclient.Consumer(
            spec["topic_a"],
            CHANNEL,
            None,  # pull mode
            nsqd_tcp_addresses=[spec["tcp"]],
            max_in_flight=spec["max_in_flight"],
        )

        def next_batch() -> tuple[list[Any], str]:
            """The recipe's take: up to BATCH_SIZE of what has arrived.  ``batching_fill``
            then keeps taking until the batch is full, the consumer is starved or MAX_WAIT
            has passed (the handler relay's three flush causes)."""
            batch = consumer.take(BATCH_SIZE, timeout=MAX_WAIT)
            if batch:
                tally.given()
            if not fill or not batch:
                return batch, "full" if len(batch) >= BATCH_SIZE else "arrived"
            deadline = time.monotonic() + MAX_WAIT
            while len(batch) < BATCH_SIZE:
                if consumer.is_starved():
                    return batch, "starved"
                remaining = deadline - time.monotonic()
                more = consumer.take(BATCH_SIZE - len(batch), timeout=max(remaining, 0.0))
                if not more:
                    return batch, "timer"
                batch += more
            return batch, "full"

        def relay() -> None:
            while consumer.is_running:
                batch, why = next_batch()
                if not batch:
                    continue
                flushes.append((clock() - (tally.first_at or clock()), len(batch), why))
                try:
                    producer.mpub(topic_b, [m.body for m in batch])
                except nsqclient.NSQError:
                    consumer.requeue_many(batch)
                    tally.failed += len(batch)
                else:
                    consumer.finish_many(batch)
                    tally.relayed(len(batch))

        relayer = threading.Thread(target=relay, name="relay")
        consumer.start()
        relayer.start()
        error = tally.wait(spec)
        consumer.stop(timeout=30.0)
        relayer.join()
        producer.close()
    result = tally.result()
    result["flushes"] = flush_summary(flushes)
    if error:
        result["error"] = error
    return result


def run_batching_async(spec: dict[str, Any]) -> dict[str, Any]:
    """The batching relay docs/relay.rst gave before pull mode (pynsq's idiom: the handler
    holds messages with ``enable_async()`` and a flush publishes them when 500 are held, the
    consumer is starved, or a timer fires), recording each flush (when, how many, why)."""
    import nsqclient

    tally = _Relayed(spec["n"], spec["broker_pid"])
    topic_b = spec["topic_b"]
    batch: list[Any] = []
    lock = threading.Lock()
    stopping = threading.Event()
    flushes: list[tuple[float, int, str]] = []  # (seconds after the first message, size, why)
    clock = time.perf_counter

    with common.maybe_profile(spec):
        producer = nsqclient.Producer([spec["tcp"]])
        _warm_producer(producer, spec)

        def flush(why: str) -> None:
            """Publish the batch with one MPUB, then answer its messages.  Called with the
            lock."""
            if not batch:
                return
            flushes.append((clock() - (tally.first_at or clock()), len(batch), why))
            try:
                producer.mpub(topic_b, [m.body for m in batch])
            except nsqclient.NSQError:
                for m in batch:
                    m.requeue()
                tally.failed += len(batch)
            else:
                for m in batch:
                    m.finish()
                tally.relayed(len(batch))
            batch.clear()

        def relay(message: Any) -> None:
            tally.given()
            message.enable_async()
            with lock:
                batch.append(message)
                if len(batch) >= BATCH_SIZE:
                    flush("full")
                elif consumer.is_starved():
                    flush("starved")

        def flush_on_time() -> None:
            while not stopping.wait(MAX_WAIT):
                with lock:
                    flush("timer")

        consumer = nsqclient.Consumer(
            spec["topic_a"],
            CHANNEL,
            relay,
            nsqd_tcp_addresses=[spec["tcp"]],
            max_in_flight=spec["max_in_flight"],
        )
        flusher = threading.Thread(target=flush_on_time, name="batch-flusher")
        flusher.start()
        consumer.start()
        error = tally.wait(spec)
        consumer.stop(timeout=30.0)
        stopping.set()
        flusher.join()
        producer.close()
    result = tally.result()
    result["flushes"] = flush_summary(flushes)
    if error:
        result["error"] = error
    return result


def flush_summary(flushes: list[tuple[float, int, str]]) -> dict[str, Any]:
    """The batching relay's flushes in a few figures."""
    sizes = [size for _, size, _ in flushes]
    first_full = next((at for at, size, _ in flushes if size >= BATCH_SIZE), None)
    why: dict[str, int] = {}
    for _, _, reason in flushes:
        why[reason] = why.get(reason, 0) + 1
    return {
        "count": len(sizes),
        "median": statistics.median(sizes) if sizes else None,
        "mean": statistics.fmean(sizes) if sizes else None,
        "ones": sizes.count(1),
        "first10": sizes[:10],
        "first_full_ms": None if first_full is None else first_full * 1000.0,
        "why": why,
    }


def run_pynsq(spec: dict[str, Any]) -> dict[str, Any]:
    """pynsq's relay: Reader + Writer.pub with a callback that FINs, on one IOLoop."""
    import nsq
    import tornado.ioloop

    loop = tornado.ioloop.IOLoop.current()
    tally = _Relayed(spec["n"], spec["broker_pid"])
    topic_b = spec["topic_b"]
    deadline = time.monotonic() + spec["timeout"]
    state: dict[str, Any] = {"error": None, "reader": None}
    writer = nsq.Writer([spec["tcp"]])

    def stop(error: str | None = None) -> None:
        state["error"] = state["error"] or error
        if state["reader"] is not None:
            state["reader"].close()
        loop.stop()

    def stop_when_finished() -> None:
        # The FINs are written by the IOLoop: keep it running until nsqd has them all.
        try:
            ch = common.channel_stats(spec["http"], spec["topic_a"], CHANNEL) or {}
        except OSError:
            ch = {}
        if ch.get("depth") == 0 and ch.get("in_flight_count") == 0:
            stop()
        elif time.monotonic() > deadline:
            stop(f"nsqd still has messages in flight: {ch}")
        else:
            loop.call_later(0.05, stop_when_finished)

    def published(message: Any, conn: Any, data: Any) -> None:
        if isinstance(data, nsq.Error):
            message.requeue()
            tally.failed += 1
        else:
            message.finish()
            if tally.relayed():
                loop.add_callback(stop_when_finished)

    def relay(message: Any) -> None:
        tally.given()
        message.enable_async()
        writer.pub(topic_b, message.body, callback=functools.partial(published, message))

    def start_reader(conn: Any, data: Any) -> None:
        if isinstance(data, nsq.Error):
            stop(f"warm-up publish failed: {data!r}")
            return
        state["reader"] = nsq.Reader(
            topic=spec["topic_a"],
            channel=CHANNEL,
            message_handler=relay,
            nsqd_tcp_addresses=[spec["tcp"]],
            max_in_flight=spec["max_in_flight"],
        )
        loop.call_later(0.5, watchdog)

    connect_deadline = time.monotonic() + 30.0

    def wait_connected() -> None:
        # connect the Writer (and publish once) before the Reader starts
        if any(c.connected() for c in writer.conns.values()):
            writer.pub(spec["warmup"], common.message_body(spec["size"]), callback=start_reader)
        elif time.monotonic() > connect_deadline:
            stop("pynsq Writer did not connect within 30s")
        else:
            loop.call_later(0.01, wait_connected)

    def watchdog() -> None:
        if tally.done.is_set():
            return
        now = time.monotonic()
        if now > deadline or tally.stalled(now, spec["stall_timeout"]):
            stop(tally.stall_text(spec))
        else:
            loop.call_later(0.5, watchdog)

    loop.add_callback(wait_connected)
    with common.maybe_profile(spec):
        nsq.run()
    result = tally.result()
    if state["error"]:
        result["error"] = state["error"]
    return result


def child_main(spec: dict[str, Any]) -> None:
    run = {
        "prefill": run_prefill,
        "pub_async": run_pub_async,
        "batching": run_batching,
        "batching_fill": run_batching,
        "batching_async": run_batching_async,
        "pynsq": run_pynsq,
    }[spec["mode"]]
    common.emit_result(run(spec))


# ------------------------------------------------------------------------------ nsq_to_nsq


def run_nsq_to_nsq(
    args: argparse.Namespace, broker: common.Broker, topic_a: str, topic_b: str, n: int
) -> dict[str, Any]:
    """Run Go's nsq_to_nsq from A to B, watching nsqd's /stats: the clock starts when A's
    channel first has a message in flight (or fewer than N waiting), stops when B counts 99%
    of N; the tool's CPU time over the same interval comes from /proc."""
    tool = common.go_tool(args, "nsq_to_nsq")
    assert tool is not None
    argv = [
        tool,
        f"--nsqd-tcp-address={broker.tcp_address}",
        f"--topic={topic_a}",
        f"--channel={CHANNEL}",
        f"--destination-nsqd-tcp-address={broker.tcp_address}",
        f"--destination-topic={topic_b}",
        f"--max-in-flight={args.max_in_flight}",
    ]
    stop_at = stop_count(n)
    http = broker.http_address
    clock = time.perf_counter

    def channel() -> dict[str, Any]:
        return common.channel_stats(http, topic_a, CHANNEL) or {}

    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)

        def fail(what: str) -> common.ChildError:
            log.seek(0)
            tail = log.read()[-2000:].decode(errors="replace")
            return common.ChildError(f"nsq_to_nsq: {what}; its output: {tail}")

        try:
            deadline = time.monotonic() + args.child_timeout
            while True:  # 1: the first message leaves A's channel
                ch = channel()
                if ch.get("in_flight_count", 0) > 0 or ch.get("depth", n) < n:
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise fail("took no message from A")
            t0 = clock()
            cpu0 = common.process_cpu_seconds(proc.pid)
            broker0 = common.process_cpu_seconds(broker.pid)
            count, watch = 0, (0, time.monotonic())
            while True:  # 2: B counts 99% of N
                count = common.topic_message_count(http, topic_b)
                if count >= stop_at:
                    break
                now = time.monotonic()
                if count != watch[0]:
                    watch = (count, now)
                if proc.poll() is not None:
                    raise fail(f"exited after {count} of {n} messages")
                if now > deadline or now - watch[1] > args.stall_timeout:
                    raise fail(f"relayed {count} of {n}, then stalled")
                time.sleep(GO_POLL)
            t1 = clock()
            cpu1 = common.process_cpu_seconds(proc.pid)
            broker1 = common.process_cpu_seconds(broker.pid)
            common.wait_for(
                f"nsq_to_nsq to relay all {n} messages and FIN them",
                lambda: (common.topic_message_count(http, topic_b), channel()),
                lambda v: v[0] >= n and v[1].get("depth") == 0 and v[1].get("in_flight_count") == 0,
                timeout=args.stall_timeout,
            )
        finally:
            common.stop_process(proc)
    return {
        "relayed": count,
        "failed": 0,
        "timed": stop_at,
        "seconds": t1 - t0,
        "cpu": (cpu1 or 0.0) - (cpu0 or 0.0),
        "broker_cpu": None if broker0 is None or broker1 is None else broker1 - broker0,
    }


# ------------------------------------------------------------------------------ parent


def measure(args: argparse.Namespace, broker: common.Broker, case: str) -> dict[str, Any]:
    """Prefill a fresh topic A, relay it to a fresh topic B, check nsqd's /stats; the result
    with ``rate``, ``us_per_msg`` and ``duplicates`` added."""
    n = args.messages
    http = broker.http_address
    client = CASE_CLIENT[case]
    topic_a = common.fresh_topic("relay_a", case)
    topic_b = common.fresh_topic("relay_b", case)
    warmup = topic_b + "_w"
    common.create_channel(http, topic_a, CHANNEL)
    base = {
        "tcp": broker.tcp_address,
        "http": http,
        "topic_a": topic_a,
        "topic_b": topic_b,
        "warmup": warmup,
        "n": n,
        "size": args.size,
        "broker_pid": broker.pid,
    }
    filled = common.run_child(
        __file__,
        {**base, "mode": "prefill", "client": "prefill", "case": "prefill"},
        timeout=args.child_timeout,
    )
    depth = common.wait_for(
        f"{n} messages in {topic_a}/{CHANNEL}",
        lambda: (common.channel_stats(http, topic_a, CHANNEL) or {}).get("depth"),
        lambda d: d == n,
        timeout=60.0,
    )
    if depth != n:
        raise common.ChildError(f"prefill: channel depth {depth}, expected {n}")
    label = CASES[case]
    print(
        f"  {label:20} prefilled {n:,} messages in {filled['seconds']:.1f}s; relaying...",
        file=sys.stderr,
    )
    if case == "nsq_to_nsq":
        result = run_nsq_to_nsq(args, broker, topic_a, topic_b, n)
    else:
        spec = {
            **base,
            "mode": case,
            "client": client,
            "case": f"relay-{case}",
            "max_in_flight": args.max_in_flight,
            "timeout": args.child_timeout - 60.0,
            "stall_timeout": args.stall_timeout,
            **common.profile_spec(args, client),
        }
        result = common.run_child(__file__, spec, timeout=args.child_timeout)
    # nsqd's word: A's channel drained, B holding N (or more: duplicates)
    channel = common.wait_for(
        f"nsqd to see every message of {topic_a}/{CHANNEL} finished",
        lambda: common.channel_stats(http, topic_a, CHANNEL),
        lambda ch: bool(ch) and ch["depth"] == 0 and ch["in_flight_count"] == 0,
        timeout=30.0,
    )
    counted = common.wait_for(
        f"nsqd to count {n} messages on {topic_b}",
        lambda: common.topic_message_count(http, topic_b),
        lambda c: c >= n,
        timeout=30.0,
    )
    problems = []
    if not isinstance(channel, dict):
        problems.append(f"channel {topic_a}/{CHANNEL}: {channel!r}")
    else:
        for key in ("depth", "in_flight_count", "deferred_count"):
            if channel.get(key) != 0:
                problems.append(f"A {key}={channel.get(key)} (expected 0)")
    if not isinstance(counted, int) or counted < n:
        problems.append(f"B message_count={counted} (expected {n})")
    if problems:
        raise common.ChildError(f"{label}: nsqd /stats disagrees: {', '.join(problems)}")
    for topic in (topic_a, topic_b, warmup):
        common.delete_topic(http, topic)
    timed = result["timed"]
    result["rate"] = timed / result["seconds"] if result["seconds"] > 0 else None
    result["us_per_msg"] = result["cpu"] / timed * 1e6
    result["duplicates"] = counted - n
    result["requeued"] = channel.get("requeue_count", 0)
    result["timed_out"] = channel.get("timeout_count", 0)
    extra = ""
    if result["duplicates"] or result["requeued"] or result["timed_out"]:
        extra = (
            f"; {result['duplicates']} duplicates on B, A requeued {result['requeued']}, "
            f"timed out {result['timed_out']}"
        )
    print(
        f"  {label:20} {timed:>9,} msgs in {result['seconds']:7.2f}s = "
        f"{result['rate']:>9,.0f} msg/s, {common.describe_cpu(result, timed)}; nsqd: A drained, "
        f"B has {counted:,}{extra}",
        file=sys.stderr,
    )
    if "flushes" in result:
        print(f"  {'':20} flushes: {describe_flushes(result['flushes'])}", file=sys.stderr)
    return result


def describe_flushes(f: dict[str, Any]) -> str:
    first_full = "never" if f["first_full_ms"] is None else f"{f['first_full_ms']:.0f} ms"
    why = ", ".join(f"{k} {v}" for k, v in sorted(f["why"].items()))
    return (
        f"{f['count']} (median {f['median']:g}, mean {f['mean']:.0f}, {f['ones']} of one "
        f"message; {why}); first 10: {f['first10']}; first full flush {first_full} after the "
        "first message"
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = common.argument_parser(
        __doc__, 100_000, "messages each relay moves from A to B (default 100000)"
    )
    common.add_size_argument(parser)
    common.add_max_in_flight_argument(
        parser, "every relay's max_in_flight (nsq_to_nsq: --max-in-flight; default 2500)"
    )
    common.add_cases_argument(
        parser,
        DEFAULT_CASES,
        f"comma-separated subset of {','.join(CASES)} (default: {','.join(DEFAULT_CASES)}; "
        "nsq_to_nsq is left out when NSQ_BIN_DIR has no nsq_to_nsq)",
    )
    common.add_run_arguments(parser)
    common.add_stall_timeout_argument(parser, "a relay that moves")
    args = parser.parse_args(argv)
    common.apply_quick(args, messages=3000)
    args.case_list = common.choice_list(parser, args.cases, CASES, "case")
    if args.messages < 1 or args.repeat < 1:
        parser.error("--messages and --repeat must be positive")
    return args


def main(argv: list[str]) -> int:
    if common.run_as_child(argv, child_main):
        return 0
    args = parse_args(argv)
    cases = list(args.case_list)
    skipped: list[str] = []
    if "nsq_to_nsq" in cases and not common.go_tool(args, "nsq_to_nsq"):
        cases.remove("nsq_to_nsq")
        skipped.append("nsq_to_nsq: not in NSQ_BIN_DIR / --bin-dir")
    mem_queue = args.mem_queue_size or args.messages + 1000
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    with common.open_broker(args, mem_queue_size=mem_queue) as broker:
        print(
            f"relay benchmark: {broker.description}; {common.describe_machine()}; "
            f"{args.messages:,} x {args.size}-byte messages per relay; max_in_flight "
            f"{args.max_in_flight}; best of {args.repeat}, interleaved",
            file=sys.stderr,
        )
        common.print_not_measured(skipped)
        for _ in range(args.repeat):
            for case in cases:
                runs[case].append(measure(args, broker, case))
    best = {case: max(results, key=lambda r: r["rate"] or 0) for case, results in runs.items()}
    common.print_report_intro(
        f"### relay: topic A -> topic B on one nsqd, max_in_flight {args.max_in_flight}, "
        f"{args.messages:,} x {args.size}-byte messages, best of {args.repeat} (interleaved)",
        broker,
        "msg/s: 99% of the messages over the time from the first given to the relay to the "
        "99%-th acknowledged on B; CPU: the relay process's CPU time (all threads) over that "
        "time / messages",
    )
    ours = best.get("pub_async")
    go = best.get("nsq_to_nsq")
    handler_batching = best.get("batching_async")
    rows = []
    for case, r in best.items():
        broker_cpu = (
            f"{100 * r['broker_cpu'] / r['seconds']:.0f}%"
            if r.get("broker_cpu") is not None and r["seconds"] > 0
            else "-"
        )
        row = [
            CASES[case],
            common.fmt_rate(r["rate"]),
            f"{r['us_per_msg']:.1f}",
            broker_cpu,
            common.fmt_ratio(r["rate"], ours["rate"] if ours else None),
            common.fmt_ratio(r["rate"], go["rate"] if go else None),
        ]
        if handler_batching:
            row.append(common.fmt_ratio(r["rate"], handler_batching["rate"]))
        rows.append([*row, str(sum(x["duplicates"] for x in runs[case]))])
    headers = ["case", "msg/s", "CPU us/msg", "nsqd CPU", "vs pub_async", "vs nsq_to_nsq"]
    if handler_batching:
        headers.append("vs enable_async batching")
    headers.append("duplicates (all runs)")
    print(common.markdown_table(headers, rows))
    common.print_not_measured(skipped, report=True)
    batching = [case for case in BATCHING if runs.get(case)]
    if batching:
        print()
        print(
            f"the batching relays' batches (at most {BATCH_SIZE}; MAX_WAIT {MAX_WAIT} s), every "
            "run:"
        )
        print()
        flush_rows = []
        for case in batching:
            for i, r in enumerate(runs[case], 1):
                f = r["flushes"]
                flush_rows.append(
                    [
                        CASES[case],
                        f"run {i}" + (" (best)" if r is best[case] else ""),
                        common.fmt_rate(r["rate"]),
                        str(f["count"]),
                        f"{f['median']:g}",
                        str(f["ones"]),
                        ", ".join(f"{k} {v}" for k, v in sorted(f["why"].items())),
                        " ".join(str(s) for s in f["first10"]),
                        "never" if f["first_full_ms"] is None else f"{f['first_full_ms']:.0f} ms",
                    ]
                )
        print(
            common.markdown_table(
                [
                    "case",
                    "run",
                    "msg/s",
                    "batches",
                    "median size",
                    "of 1 msg",
                    "why",
                    "first 10 sizes",
                    "first full batch",
                ],
                flush_rows,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
