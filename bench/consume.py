#!/usr/bin/env python
"""Consume throughput and memory: nsqclient's Consumer against pynsq's Reader on the same nsqd.

For every client (and every nsqclient ``concurrency`` asked for) the parent makes a fresh topic
and channel, fills the channel with N 200-byte messages (MPUB, before the consumer starts), then
runs the consumer in its own subprocess with a no-op handler and ``max_in_flight`` 2500.  The
rate is N-1 intervals over the time from the handler's first call to its N-th.  The consumer
samples its own resident memory (``VmRSS`` from ``/proc/self/status``) before it starts, at the
first message, at 25/50/75/100% of N and after it stopped, plus the peak (``VmHWM``).  The parent
then checks nsqd's ``/stats``: the channel must be empty with nothing in flight, requeued or
timed out, i.e. every message was received and finished exactly once.

    .venv/bin/python bench/consume.py                      # 1,000,000 messages per client
    .venv/bin/python bench/consume.py --messages 200000 --concurrency 1,4
    .venv/bin/python bench/consume.py --nsqd 127.0.0.1:4150
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import threading
import time
from typing import Any

import _common as common

CHANNEL = "bench"
TARGET = 3.0
RSS_POINTS = ("before start", "first message", "25%", "50%", "75%", "100%", "after stop")


# ------------------------------------------------------------------------------ children


class _Tally:
    """Counts handler calls; records when the first and the N-th came and the RSS at the
    sampling points.  Safe to call from several handler threads (``next`` on an
    ``itertools.count`` is atomic under the GIL)."""

    def __init__(self, n: int, broker_pid: int | None):
        self.n = n
        self.window = common.CpuWindow(broker_pid)
        self.marks = {max(1, n * q // 4): f"{25 * q}%" for q in (1, 2, 3, 4)}
        self.counter = itertools.count(1)
        self.seen = 0  # the latest count, for the stall watchdog
        self._watch = (-1, 0.0)  # (count, when it was last seen to change)
        self.rss: dict[str, int] = {"before start": common.proc_status_kib("VmRSS")}
        self.done = threading.Event()

    def tick(self) -> bool:
        """Count one message; True when it was the N-th."""
        i = self.seen = next(self.counter)
        if i == 1:
            self.window.start()
            self.rss["first message"] = common.proc_status_kib("VmRSS")
        label = self.marks.get(i)
        if label is not None:
            self.rss[label] = common.proc_status_kib("VmRSS")
        if i == self.n:
            self.window.stop()
            self.done.set()
            return True
        return False

    def stalled(self, now: float, stall_timeout: float) -> bool:
        """True when the count has not moved for ``stall_timeout`` seconds (call it
        periodically; ``now`` from time.monotonic)."""
        if self.seen != self._watch[0]:
            self._watch = (self.seen, now)
        return now - self._watch[1] > stall_timeout

    def result(self) -> dict[str, Any]:
        self.rss["after stop"] = common.proc_status_kib("VmRSS")
        return {
            "received": self.seen,
            **self.window.as_dict(),
            "rss_kib": self.rss,
            "peak_rss_kib": common.proc_status_kib("VmHWM"),
        }


def run_prefill(spec: dict[str, Any]) -> dict[str, Any]:
    """Fill the topic with MPUBs, several in flight at a time (setup, not measured)."""
    from nsqclient.producer import Producer

    body = common.message_body(spec["size"])
    n, batch, window = spec["n"], 500, 16
    start = time.perf_counter()
    with Producer([spec["tcp"]]) as producer:
        pending = []
        for offset in range(0, n, batch):
            pending.append(producer.mpub_async(spec["topic"], [body] * min(batch, n - offset)))
            if len(pending) >= window:
                pending.pop(0).result(60.0)
        for future in pending:
            future.result(60.0)
    return {"seconds": time.perf_counter() - start}


def run_nsqclient(spec: dict[str, Any]) -> dict[str, Any]:
    from nsqclient.consumer import Consumer

    tally = _Tally(spec["n"], spec["broker_pid"])

    def handler(message: Any) -> None:
        tally.tick()

    consumer = Consumer(
        spec["topic"],
        CHANNEL,
        handler,
        nsqd_tcp_addresses=[spec["tcp"]],
        max_in_flight=spec["max_in_flight"],
        concurrency=spec["concurrency"],
    )
    with common.maybe_profile(spec):  # started first, so the consumer's threads are profiled
        consumer.start()
        deadline = time.monotonic() + spec["timeout"]
        while not tally.done.wait(1.0):
            now = time.monotonic()
            if now > deadline or tally.stalled(now, spec["stall_timeout"]):
                break
        finished = tally.done.is_set()
        consumer.stop(timeout=30.0)
    result = tally.result()
    result["client_stats"] = {
        k: v for k, v in consumer.stats().items() if k in ("received", "finished", "requeued")
    }
    if not finished:
        result["error"] = (
            f"received {result['received']} of {spec['n']}, then nothing for "
            f"{spec['stall_timeout']}s (or the {spec['timeout']}s limit passed)"
        )
    return result


def run_pynsq(spec: dict[str, Any]) -> dict[str, Any]:
    import nsq
    import tornado.ioloop

    loop = tornado.ioloop.IOLoop.current()
    tally = _Tally(spec["n"], spec["broker_pid"])
    deadline = time.monotonic() + spec["timeout"]
    state: dict[str, Any] = {"error": None}

    def stop_when_finished() -> None:
        # The FINs are written by the IOLoop: keep it running until nsqd has them all.
        try:
            ch = common.channel_stats(spec["http"], spec["topic"], CHANNEL) or {}
        except OSError:
            ch = {}
        if ch.get("depth") == 0 and ch.get("in_flight_count") == 0:
            reader.close()
            loop.stop()
        elif time.monotonic() > deadline:
            state["error"] = f"nsqd still has messages in flight: {ch}"
            loop.stop()
        else:
            loop.call_later(0.05, stop_when_finished)

    def handler(message: Any) -> bool:
        if tally.tick():
            loop.add_callback(stop_when_finished)
        return True

    def watchdog() -> None:
        now = time.monotonic()
        if tally.done.is_set():
            return
        if now > deadline or tally.stalled(now, spec["stall_timeout"]):
            state["error"] = (
                f"received {tally.seen} of {spec['n']}, then nothing for "
                f"{spec['stall_timeout']}s (or the {spec['timeout']}s limit passed)"
            )
            loop.stop()
        else:
            loop.call_later(1.0, watchdog)

    reader = nsq.Reader(
        topic=spec["topic"],
        channel=CHANNEL,
        message_handler=handler,
        nsqd_tcp_addresses=[spec["tcp"]],
        max_in_flight=spec["max_in_flight"],
    )
    loop.call_later(1.0, watchdog)
    with common.maybe_profile(spec):
        loop.start()
    result = tally.result()
    if state["error"]:
        result["error"] = state["error"]
    return result


def child_main(spec: dict[str, Any]) -> None:
    run = {"prefill": run_prefill, "nsqclient": run_nsqclient, "pynsq": run_pynsq}[spec["client"]]
    common.emit_result(run(spec))


# ------------------------------------------------------------------------------ parent


def measure(
    args: argparse.Namespace, broker: common.Broker, client: str, concurrency: int
) -> dict[str, Any]:
    n = args.messages
    label = f"{client} c={concurrency}" if client == "nsqclient" else client
    case = f"c{concurrency}" if client == "nsqclient" else "consume"
    topic = common.fresh_topic(f"consume_{case}", client)
    common.create_channel(broker.http_address, topic, CHANNEL)
    base = {
        "tcp": broker.tcp_address,
        "http": broker.http_address,
        "topic": topic,
        "n": n,
        "broker_pid": broker.pid,
    }
    filled = common.run_child(
        __file__,
        {**base, "client": "prefill", "case": "prefill", "size": args.size},
        timeout=args.child_timeout,
    )
    depth = common.wait_for(
        f"{n} messages in {topic}/{CHANNEL}",
        lambda: (common.channel_stats(broker.http_address, topic, CHANNEL) or {}).get("depth"),
        lambda d: d == n,
        timeout=60.0,
    )
    if depth != n:
        raise common.ChildError(f"prefill: channel depth {depth}, expected {n}")
    print(
        f"  {label:15} prefilled {n:,} messages in {filled['seconds']:.1f}s; consuming...",
        file=sys.stderr,
    )
    spec = {
        **base,
        "client": client,
        "case": f"consume-{case}",
        "concurrency": concurrency,
        "max_in_flight": args.max_in_flight,
        "timeout": args.child_timeout - 60.0,
        "stall_timeout": args.stall_timeout,
        **common.profile_spec(args, client),
    }
    result = common.run_child(__file__, spec, timeout=args.child_timeout)
    channel = common.wait_for(
        f"nsqd to see every message of {topic} finished",
        lambda: common.channel_stats(broker.http_address, topic, CHANNEL),
        lambda ch: bool(ch) and ch["depth"] == 0 and ch["in_flight_count"] == 0,
        timeout=30.0,
    )
    problems = []
    if result["received"] != n:
        problems.append(f"handler ran {result['received']} times")
    for key, want in (
        ("message_count", n),
        ("depth", 0),
        ("in_flight_count", 0),
        ("deferred_count", 0),
        ("requeue_count", 0),
        ("timeout_count", 0),
    ):
        if not isinstance(channel, dict) or channel.get(key) != want:
            got = channel.get(key) if isinstance(channel, dict) else channel
            problems.append(f"{key}={got} (expected {want})")
    if problems:
        raise common.ChildError(f"{label}: nsqd /stats disagrees: {', '.join(problems)}")
    common.delete_topic(broker.http_address, topic)
    rate = (n - 1) / result["seconds"] if result["seconds"] > 0 else None
    result["rate"] = rate
    print(
        f"  {label:15} {n:>9,} msgs in {result['seconds']:7.2f}s = {rate:>9,.0f} msg/s, "
        f"{common.describe_cpu(result, n)}; nsqd: all {n:,} finished, none requeued",
        file=sys.stderr,
    )
    return result


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = common.argument_parser(
        __doc__, 1_000_000, "messages each consumer receives (default 1000000)"
    )
    parser.add_argument("--size", type=int, default=common.MESSAGE_SIZE, help="body bytes")
    parser.add_argument("--max-in-flight", type=int, default=2500, help="(default 2500)")
    parser.add_argument(
        "--concurrency",
        default="1,4",
        help="nsqclient handler thread counts to try, comma-separated (default 1,4)",
    )
    parser.add_argument(
        "--clients", default="nsqclient,pynsq", help="comma-separated subset of nsqclient,pynsq"
    )
    common.add_profile_arguments(parser)
    parser.add_argument("--child-timeout", type=float, default=900.0, help="seconds per child")
    common.add_repeat_argument(parser)
    parser.add_argument(
        "--stall-timeout",
        type=float,
        default=30.0,
        help="a consumer that receives nothing for this many seconds fails (default 30)",
    )
    args = parser.parse_args(argv)
    args.concurrency_list = [int(c) for c in args.concurrency.split(",") if c.strip()]
    args.client_list = [c.strip() for c in args.clients.split(",") if c.strip()]
    for c in args.client_list:
        if c not in ("nsqclient", "pynsq"):
            parser.error(f"unknown client {c!r}")
    if args.messages < 4:
        parser.error("--messages must be at least 4")
    if args.repeat < 1:
        parser.error("--repeat must be positive")
    return args


def _mib(kib: int | None) -> str:
    return "-" if kib is None else f"{kib / 1024:.1f}"


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--child":
        child_main(json.loads(argv[1]))
        return 0
    args = parse_args(argv)
    configs: list[tuple[str, str, int]] = []
    if "nsqclient" in args.client_list:
        configs += [(f"nsqclient c={c}", "nsqclient", c) for c in args.concurrency_list]
    if "pynsq" in args.client_list:
        configs.append(("pynsq", "pynsq", 1))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in configs}
    mem_queue = args.mem_queue_size or args.messages + 1000
    with common.open_broker(args, mem_queue_size=mem_queue) as broker:
        print(
            f"consume benchmark: {broker.description}; {common.describe_machine()}; "
            f"{args.messages:,} x {args.size}-byte messages per consumer; "
            f"max_in_flight {args.max_in_flight}",
            file=sys.stderr,
        )
        for _ in range(args.repeat):
            for name, client, concurrency in configs:
                runs[name].append(measure(args, broker, client, concurrency))
    # The best run of each configuration (the one least disturbed by other work).
    best = {name: max(results, key=lambda r: r["rate"] or 0) for name, results in runs.items()}

    print()
    of = f" (best of {args.repeat} runs each)" if args.repeat > 1 else ""
    print(
        f"consume{of}, no-op handler, max_in_flight {args.max_in_flight}, {args.messages:,} x "
        f"{args.size}-byte messages, broker: {broker.description}"
    )
    pynsq_rate = best["pynsq"]["rate"] if "pynsq" in best else None
    rows = []
    for name, r in best.items():
        if name == "pynsq":
            continue
        rows.append(
            [
                f"consume ({name.split()[1]})",
                common.fmt_rate(r["rate"]),
                common.fmt_rate(pynsq_rate),
                common.fmt_ratio(r["rate"], pynsq_rate),
                f">= {TARGET:.0f}x",
            ]
        )
    if not rows and pynsq_rate:
        rows.append(["consume", "-", common.fmt_rate(pynsq_rate), "-", f">= {TARGET:.0f}x"])
    common.print_table(["case", "nsqclient msg/s", "pynsq msg/s", "ratio", "target"], rows)
    print()
    print("resident memory of the consumer process, MiB (VmRSS; peak = VmHWM)")
    headers = ["client", *RSS_POINTS, "peak", "25%->100%"]
    mem_rows = []
    for name, r in best.items():
        rss = r["rss_kib"]
        growth = (
            f"{(rss['100%'] - rss['25%']) / 1024:+.1f}" if "100%" in rss and "25%" in rss else "-"
        )
        mem_rows.append(
            [name, *(_mib(rss.get(p)) for p in RSS_POINTS), _mib(r["peak_rss_kib"]), growth]
        )
    common.print_table(headers, mem_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
