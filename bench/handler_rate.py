#!/usr/bin/env python
"""Handler mode against its peers, to nsqd's N-th FIN: issue 35's figures in one run.

For each run the parent fills a fresh topic's channel with N 200-byte messages (MPUB, before
the consumer starts), then one consumer drains it in a process of its own with
``max_in_flight`` 2500 (``--max-in-flight``).  The clients, interleaved (every other round in
reverse order), best of ``--repeat``:

``c1``, ``c4``
    nsqclient's ``Consumer`` with a handler that counts (``concurrency`` 1 and 4); the
    Consumer FINs each message when its handler returns.
``take``
    nsqclient's pull mode: ``take(timeout=1.0)`` then ``finish_many()`` on what it took.
``batches``
    nsqclient's columnar pull mode: ``take_batches(timeout=1.0)`` then ``finish_batches()``.
``nsq-py``
    nsq-py 0.1.12's Reader, its own idiom: ``for message in reader: message.fin()`` (one
    select() loop in the main thread), run by the interpreter of ``--nsq-py-python`` (its
    package is ``nsq``, as pynsq's is: it needs a virtualenv of its own).
``bench_reader``
    go-nsq's ``bench_reader`` from ``NSQ_BIN_DIR`` (RDY ``--max-in-flight``, one connection
    per CPU) for ``--go-runfor`` seconds: its rate is what it prints.

The rate of a Python client is N-1 intervals over the time from the first message handed to
user code until nsqd's ``/stats`` counts N FINs on the channel (its clients' ``finish_count``):
the consumer's process polls it from the N-th message on (every 2 ms), while the client goes
on writing its FINs.  ``@99%`` is the rate to the 99th percent of messages handed over (nsqd
holds the last kilobytes of a run for its 250 ms ``output_buffer_timeout``, for every client
alike).  CPU per message is the consumer process's CPU time (all its threads) from the first
message to the N-th, over N (the table gives the least of the runs, the rate the best).
After each run the parent checks that the channel is empty with
nothing in flight, requeued or timed out.

    NSQ_BIN_DIR=/opt/nsq-bin .venv/bin/python bench/handler_rate.py -n 500000 --repeat 3 \\
        --nsq-py-python /tmp/nsqpy-venv/bin/python
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
import urllib.parse
from typing import Any

import _common as common

CHANNEL = "rate"
CLIENTS = ("c1", "c4", "take", "batches", "nsq-py", "bench_reader")


# ------------------------------------------------------------------------------ children


def finish_count(http_list: list[str], topic: str) -> int:
    """The FINs nsqd counts on the channel: its clients' ``finish_count``, over every nsqd."""
    total = 0
    query = urllib.parse.urlencode(
        {"format": "json", "topic": topic, "channel": CHANNEL, "include_mem": "false"}
    )
    for http in http_list:
        data = common._http_json(f"http://{http}/stats?{query}")
        for entry in data.get("topics") or []:
            for ch in entry.get("channels") or []:
                if entry.get("topic_name") == topic and ch.get("channel_name") == CHANNEL:
                    total += sum(int(c.get("finish_count", 0)) for c in ch.get("clients") or [])
    return total


def kernel_counts() -> dict[str, int]:
    """This process's context switches so far (all its threads)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"switches": usage.ru_nvcsw + usage.ru_nivcsw}


class Clock:
    """The child's clock: :meth:`tick` per message handed over; after the N-th, :meth:`wait_fins`
    polls nsqd until it counts N FINs."""

    def __init__(self, spec: dict[str, Any]):
        self.n = spec["n"]
        self.spec = spec
        self.at99 = self.n - self.n // 100
        self.counter = itertools.count(1)
        self.seen = 0
        self.t0 = self.c0 = 0.0
        self.t99 = self.tn = self.cn = 0.0
        self.t_end: float | None = None
        self.done = threading.Event()

    def tick(self) -> None:
        """One message handed to a handler (any thread)."""
        self._at(next(self.counter), 1)

    def took(self, count: int) -> None:
        """``count`` messages taken (pull mode: one thread)."""
        self._at(self.seen + count, count)

    def _at(self, i: int, count: int) -> None:
        self.seen = i
        if i == count:
            self.t0 = time.perf_counter()
            self.c0 = time.process_time()
            self.k0 = kernel_counts()
        if i >= self.at99 and not self.t99:
            self.t99 = time.perf_counter()
        if i >= self.n and not self.tn:
            self.tn = time.perf_counter()
            self.cn = time.process_time()
            self.kn = kernel_counts()
            self.done.set()

    def wait_fins(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        pause = threading.Event()
        while time.monotonic() < deadline:
            try:
                count = finish_count(self.spec["http_list"], self.spec["topic"])
            except (OSError, ValueError):
                count = 0
            if count >= self.n:
                self.t_end = time.perf_counter()
                return
            pause.wait(0.002)

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {"received": self.seen}
        if self.t_end is None:
            out["error"] = f"nsqd did not count {self.n} FINs"
            return out
        out["end_seconds"] = self.t_end - self.t0
        out["s99"] = self.t99 - self.t0
        out["cpu"] = self.cn - self.c0
        out["kernel"] = {k: self.kn[k] - self.k0[k] for k in self.k0}
        return out


def run_nsqclient(spec: dict[str, Any]) -> dict[str, Any]:
    from nsqclient import Consumer

    clock = Clock(spec)
    mode = spec["client"]
    tick = clock.tick
    if mode in ("c1", "c4"):

        def handler(message: Any) -> None:
            tick()

        consumer = Consumer(
            spec["topic"],
            CHANNEL,
            handler,
            nsqd_tcp_addresses=spec["tcp_list"],
            max_in_flight=spec["max_in_flight"],
            concurrency=int(mode[1:]),
        )
        with common.maybe_profile(spec):
            consumer.start()
            clock.done.wait(spec["timeout"])
            clock.wait_fins()
    else:
        consumer = Consumer(
            spec["topic"],
            CHANNEL,
            None,
            nsqd_tcp_addresses=spec["tcp_list"],
            max_in_flight=spec["max_in_flight"],
            columnar=mode == "batches",
        )
        deadline = time.monotonic() + spec["timeout"]
        with common.maybe_profile(spec):
            consumer.start()
            while clock.seen < clock.n and time.monotonic() < deadline:
                if mode == "batches":
                    batches = consumer.take_batches(timeout=1.0)
                    count = sum(map(len, batches))
                    consumer.finish_batches(batches)
                else:
                    messages = consumer.take(timeout=1.0)
                    count = len(messages)
                    consumer.finish_many(messages)
                if count:
                    clock.took(count)
            clock.wait_fins()
    consumer.stop(30.0)
    return clock.result()


def run_nsq_py(spec: dict[str, Any]) -> dict[str, Any]:
    import logging

    import nsq
    from nsq.reader import Reader
    from nsq.response import Message

    if getattr(nsq, "__version__", None) != "0.1.12":
        return {"error": f"nsq is {nsq.__file__}, not nsq-py 0.1.12"}
    logging.getLogger("nsq").setLevel(logging.WARNING)
    clock = Clock(spec)
    # nsq-py 0.1.12 puts the topic and channel into its commands as given: bytes
    reader = Reader(
        spec["topic"].encode(),
        CHANNEL.encode(),
        nsqd_tcp_addresses=spec["tcp_list"],
        max_in_flight=spec["max_in_flight"],
    )
    tick = clock.tick
    with common.maybe_profile(spec):
        for message in reader:
            message.fin()
            tick()
            if clock.done.is_set():
                break
        # the FINs queued since its last select() go out in the next read()s
        watch = threading.Thread(target=clock.wait_fins, daemon=True)
        watch.start()
        while watch.is_alive():
            for item in reader.read():
                if isinstance(item, Message):
                    return {"error": "a message more than N"}
    for conn in reader.connections():
        conn.close()
    return clock.result()


def child_main(spec: dict[str, Any]) -> None:
    run = run_nsq_py if spec["client"] == "nsq-py" else run_nsqclient
    common.emit_result(run(spec))


# ------------------------------------------------------------------------------ parent


def run_child(
    spec: dict[str, Any], python: str | None, path: str | None, timeout: float
) -> dict[str, Any]:
    """Run the child with ``python`` (None: this one), nsqclient from ``path`` (None: this
    process's PYTHONPATH; nsq-py's child gets none)."""
    if python is None and path is None:
        return common.run_child(__file__, spec, timeout)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if path is not None:
        env["PYTHONPATH"] = path
    proc = subprocess.run(
        [python or sys.executable, __file__, "--child", common.json.dumps(spec)],
        stdout=subprocess.PIPE,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    for line in proc.stdout.splitlines():
        if line.startswith(common.RESULT_MARK):
            result = common.json.loads(line[len(common.RESULT_MARK) :])
            if result.get("error"):
                raise common.ChildError(f"{spec['client']}: {result['error']}")
            return result
    raise common.ChildError(f"{spec['client']}: exited {proc.returncode}: {proc.stdout[-2000:]}")


def measure(args: Any, broker: common.Broker, client: str) -> dict[str, Any]:
    n = args.messages
    topic = common.fresh_topic("rate", client)
    if client == "bench_reader":
        return measure_go(args, broker, topic)
    common.fill_topic(broker, topic, CHANNEL, n)
    spec = {
        "client": client,
        "case": "rate",
        "topic": topic,
        "n": n,
        "tcp_list": [broker.tcp_address],
        "http_list": [broker.http_address],
        "max_in_flight": args.max_in_flight,
        "timeout": 300.0,
        **common.profile_spec(args, "nsqclient" if client != "nsq-py" else client),
    }
    python = args.nsq_py_python if client == "nsq-py" else None
    path = None
    prefix, _, mode = client.rpartition(":")
    if prefix:
        spec["client"] = mode
        path = args.variants[prefix]
    result = run_child(spec, python, path, 400.0)
    ch = common.wait_for(
        f"{topic} drained",
        lambda: common.channel_stats(broker.http_address, topic, CHANNEL),
        lambda c: bool(c) and c["depth"] == 0 and c["in_flight_count"] == 0,
        30.0,
    )
    bad = {
        k: ch.get(k)
        for k in ("depth", "in_flight_count", "deferred_count", "requeue_count", "timeout_count")
        if not isinstance(ch, dict) or ch.get(k)
    }
    if bad or result["received"] != n:
        raise common.ChildError(f"{client}: received {result['received']}, nsqd says {bad}")
    common.delete_topic(broker.http_address, topic)
    result["rate"] = (n - 1) / result["end_seconds"]
    result["rate99"] = (n - n // 100 - 1) / result["s99"]
    result["us"] = result["cpu"] / n * 1e6
    print(
        f"  {client:12} {result['rate']:>9,.0f} msg/s to the N-th FIN "
        f"({result['end_seconds']:.3f} s), @99% {result['rate99']:>9,.0f}, "
        f"{result['us']:.2f} us CPU/msg; per 1,000 messages: "
        + ", ".join(f"{k} {1000 * v / n:.1f}" for k, v in result.get("kernel", {}).items()),
        file=sys.stderr,
    )
    return result


def measure_go(args: Any, broker: common.Broker, topic: str) -> dict[str, Any]:
    tool = common.go_tool(args, "bench_reader")
    assert tool is not None
    n = args.go_messages
    common.fill_topic(broker, topic, CHANNEL, n)
    out = common.run_go_tool(
        [
            tool,
            f"--nsqd-tcp-address={broker.tcp_address}",
            f"--topic={topic}",
            f"--channel={CHANNEL}",
            f"--runfor={args.go_runfor}s",
            "--size=200",
            f"--rdy={args.max_in_flight}",
        ],
        timeout=args.go_runfor + 60.0,
    )
    left = (common.channel_stats(broker.http_address, topic, CHANNEL) or {}).get("depth")
    common.delete_topic(broker.http_address, topic)
    result = {
        "rate": out["rate"],
        "rate99": out["rate"],
        "us": out["cpu"] / (out["rate"] * args.go_runfor) * 1e6,
        "drained": left == 0,
    }
    print(
        f"  bench_reader {out['rate']:>9,.0f} msg/s, {result['us']:.2f} us CPU/msg"
        + (" (ran dry: a lower bound)" if left == 0 else ""),
        file=sys.stderr,
    )
    return result


def main(argv: list[str]) -> int:
    if common.run_as_child(argv, child_main):
        return 0
    parser = common.argument_parser(__doc__ or "", 500_000, "messages per run (default 500,000)")
    common.add_max_in_flight_argument(parser)
    parser.add_argument("--clients", default=",".join(CLIENTS), help="any of " + ",".join(CLIENTS))
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--nsq-py-python", help="the python of nsq-py 0.1.12's virtualenv")
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        help="also run c1, c4, take and batches (as base:c1...) with nsqclient from DIR (a "
        "checkout of the code before a change), interleaved with the others",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="as --baseline, named NAME (NAME:c1...); may be given several times",
    )
    parser.add_argument("--go-runfor", type=float, default=1.0, help="bench_reader's --runfor")
    parser.add_argument(
        "--go-messages", type=int, default=1_500_000, help="bench_reader's channel (1,500,000)"
    )
    common.add_profile_arguments(parser)
    args = parser.parse_args(argv)
    clients = common.choice_list(parser, args.clients, CLIENTS, "client")
    if "nsq-py" in clients and not args.nsq_py_python:
        clients.remove("nsq-py")
        print("  (not measured) nsq-py: no --nsq-py-python", file=sys.stderr)
    if "bench_reader" in clients and not common.go_tool(args, "bench_reader"):
        clients.remove("bench_reader")
        print("  (not measured) bench_reader: not in NSQ_BIN_DIR", file=sys.stderr)
    args.variants = dict(v.split("=", 1) for v in args.variant)
    if args.baseline:
        args.variants["base"] = args.baseline
    clients = [
        x
        for c in clients
        for x in ([c, *(f"{v}:{c}" for v in args.variants)] if c in CLIENTS[:4] else [c])
    ]
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in clients}
    mem = max(args.messages, args.go_messages) + 1000
    with common.open_broker(args, mem_queue_size=mem) as broker:
        print(f"broker: {broker.description}; {common.describe_machine()}", file=sys.stderr)
        for round_ in range(args.repeat):
            # every other round in reverse order: no client always runs right after another
            for client in clients if round_ % 2 == 0 else clients[::-1]:
                runs[client].append(measure(args, broker, client))
    best = {c: max(rs, key=lambda r: r["rate"]) for c, rs in runs.items()}
    # CPU per message: the least of the runs (the one least disturbed by other work)
    for c, rs in runs.items():
        best[c] = {**best[c], "us": min(r["us"] for r in rs)}
    print(
        f"\n{args.messages:,} x 200-byte messages, max_in_flight {args.max_in_flight}, best of "
        f"{args.repeat} (interleaved); {common.describe_machine()}\n"
    )
    peer = best.get("nsq-py")
    go = best.get("bench_reader")
    rows = []
    for client, r in best.items():
        rows.append(
            [
                client,
                f"{r['rate']:,.0f}",
                f"{r['rate99']:,.0f}",
                f"{r['us']:.2f}",
                common.fmt_x(common.ratio(r["rate"], peer["rate"] if peer else None)),
                common.fmt_x(common.ratio(r["rate"], go["rate"] if go else None)),
                common.fmt_x(common.ratio(r["us"], peer["us"] if peer else None)),
            ]
        )
    headers = [
        "client",
        "msg/s to N-th FIN",
        "@99%",
        "CPU us/msg",
        "vs nsq-py",
        "vs Go",
        "CPU/nsq-py",
    ]
    print(common.markdown_table(headers, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
