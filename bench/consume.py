#!/usr/bin/env python
"""Consume throughput and memory: nsqclient's Consumer against pynsq's Reader, gnsq's Consumer,
nsq-py's Reader and go-nsq's bench_reader on the same nsqd.

For every client (and every nsqclient ``concurrency`` asked for) the parent makes a fresh topic
and channel, fills the channel with N 200-byte messages (MPUB, before the consumer starts), then
runs the consumer in its own subprocess with a no-op handler and ``max_in_flight`` 2500.  The
rate is M-1 intervals over the time from the handler's first call to its M-th, M being 99% of
N: nsqd holds the last few kilobytes of a run for its ``output_buffer_timeout`` (250 ms) before
it sends them, which would add up to 250 ms to every run whatever the client (20% of a fast
200,000-message run), so the clock stops before that tail.  Beside it, the rate to the end:
N-1 intervals from the same first call until nsqd's ``/stats`` counts N FINs on the channel
(its clients' ``finish_count``, polled by the consumer's process from its N-th call on), tail
and FINs included.  The consumer
samples its own resident memory (``VmRSS`` from ``/proc/self/status``) before it starts, at the
first message, at 25/50/75/100% of N and after it stopped, plus the peak (``VmHWM``).  The parent
then checks nsqd's ``/stats``: the channel must be empty with nothing in flight, requeued or
timed out, i.e. every message was received and finished exactly once.

nsq-py's package is ``nsq``, as pynsq's is: its consumer runs from a virtualenv of its own
(``--peer-venvs``), made on first use; when it cannot be made nsq-py is not measured.

    .venv/bin/python bench/consume.py                      # 1,000,000 messages per client
    .venv/bin/python bench/consume.py --messages 200000 --concurrency 1,4
    .venv/bin/python bench/consume.py --nsqd 127.0.0.1:4150
"""

from __future__ import annotations

import argparse
import itertools
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import _common as common

CHANNEL = "bench"
CLIENTS = ("nsqclient", "pynsq", "gnsq", common.NSQ_PY, "bench_reader")
RSS_POINTS = ("before start", "first message", "25%", "50%", "75%", "100%", "after stop")


# ------------------------------------------------------------------------------ children


class _Tally:
    """Counts handler calls; records when the first and the N-th came and the RSS at the
    sampling points.  Safe to call from several handler threads (``next`` on an
    ``itertools.count`` is atomic under the GIL)."""

    def __init__(self, n: int, broker_pid: int | None):
        self.n = n
        #: the message that stops the clock (see the module docstring: nsqd's last flush)
        self.stop_at = n - n // 100 if n >= 1000 else n
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
        if i == self.stop_at:
            self.window.stop()
        if i == self.n:
            self.done.set()
            return True
        return False

    def stalled(self, now: float, stall_timeout: float) -> bool:
        """True when the count has not moved for ``stall_timeout`` seconds (call it
        periodically; ``now`` from time.monotonic)."""
        if self.seen != self._watch[0]:
            self._watch = (self.seen, now)
        return now - self._watch[1] > stall_timeout

    def stall_error(self, spec: dict[str, Any]) -> str:
        return (
            f"received {self.seen} of {spec['n']}, then nothing for "
            f"{spec['stall_timeout']}s (or the {spec['timeout']}s limit passed)"
        )

    def result(self, watch: _FinishWatch | None = None) -> dict[str, Any]:
        """What the parent gets; with ``watch``, the to-the-end time too (None when nsqd did
        not count N FINs in time)."""
        self.rss["after stop"] = common.proc_status_kib("VmRSS")
        result = {
            "received": self.seen,
            "timed": self.stop_at,
            **self.window.as_dict(),
            "rss_kib": self.rss,
            "peak_rss_kib": common.proc_status_kib("VmHWM"),
        }
        if watch is not None:
            started = self.window.started_at
            ended = watch.at
            result["to_end_seconds"] = None if ended is None or started is None else ended - started
            result["finish_polls"] = watch.polls
            result["finished_at_last_call"] = watch.first_count
        return result


#: pause between two polls of nsqd's /stats by the to-the-end clock (a poll itself takes about
#: a millisecond: a fresh HTTP connection, nsqd's stats of the one channel)
FINISH_POLL_PAUSE = 0.001


class _FinishWatch:
    """The to-the-end clock's stop: once the handler has run N times, poll nsqd's ``/stats``
    until the channel's finish count (summed over every nsqd of the run) reaches N, and keep
    when the first answer saying so came (``at``, ``time.perf_counter``; None if it did not
    come within ``timeout`` seconds).

    :meth:`wait` polls in the calling thread (nsqclient: its own threads write the FINs);
    :meth:`start` in a thread of its own, for a client whose FINs are written by the loop the
    caller must keep running meanwhile (pynsq's IOLoop, gnsq's hub, nsq-py's select loop).
    Polling starts only after the N-th message was handled, so that it takes nothing from the
    run before; it ends the clock a poll late at most (a millisecond or two)."""

    def __init__(self, spec: dict[str, Any], timeout: float):
        self.http_list: list[str] = spec.get("http_list") or [spec["http"]]
        self.topic = spec["topic"]
        self.n = spec["n"]
        self.timeout = timeout
        self.at: float | None = None
        self.finished = 0
        #: the count of the first poll: what nsqd had FINished when the handler had run N times
        self.first_count: int | None = None
        self.polls = 0
        self.done = threading.Event()

    def start(self, then: Any = None) -> None:
        """Poll in a daemon thread; call ``then()`` (from that thread) when done."""

        def run() -> None:
            self.wait()
            if then is not None:
                then()

        threading.Thread(target=run, name="bench-finish-watch", daemon=True).start()

    def wait(self) -> bool:
        """Poll until nsqd counts N FINs (True) or ``timeout`` passes (False)."""
        deadline = time.monotonic() + self.timeout
        pause = threading.Event()
        try:
            while True:
                try:
                    count = sum(
                        common.channel_finish_count(http, self.topic, CHANNEL)
                        for http in self.http_list
                    )
                except (OSError, ValueError):
                    count = self.finished
                now = time.perf_counter()
                self.polls += 1
                self.finished = count
                if self.first_count is None:
                    self.first_count = count
                if count >= self.n:
                    self.at = now
                    return True
                if time.monotonic() > deadline:
                    return False
                pause.wait(FINISH_POLL_PAUSE)
        finally:
            self.done.set()

    def error(self) -> str | None:
        """Why there is no to-the-end time (None when there is one)."""
        if self.at is not None:
            return None
        return (
            f"nsqd counted {self.finished} of {self.n} FINs {self.timeout}s after the "
            f"handler's {self.n}-th call"
        )


def run_prefill(spec: dict[str, Any]) -> dict[str, Any]:
    """Fill the topic with MPUBs, several in flight at a time (setup, not measured);
    ``spec["fill"]`` lists ``[tcp address, message count]`` for each nsqd."""
    from nsqclient.producer import Producer

    body = common.message_body(spec["size"])
    batch, window = 500, 16
    start = time.perf_counter()
    for tcp, n in spec["fill"]:
        with Producer([tcp]) as producer:
            pending = []
            for offset in range(0, n, batch):
                bodies = [body] * min(batch, n - offset)
                pending.append(producer.mpub_async(spec["topic"], bodies))
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
        nsqd_tcp_addresses=spec["tcp_list"],
        max_in_flight=spec["max_in_flight"],
        concurrency=spec["concurrency"],
    )
    watch = _FinishWatch(spec, spec["stall_timeout"])
    with common.maybe_profile(spec):  # started first, so the consumer's threads are profiled
        consumer.start()
        deadline = time.monotonic() + spec["timeout"]
        while not tally.done.wait(1.0):
            now = time.monotonic()
            if now > deadline or tally.stalled(now, spec["stall_timeout"]):
                break
        finished = tally.done.is_set()
        if finished:
            watch.wait()  # the consumer's threads write the FINs
        consumer.stop(timeout=30.0)
    result = tally.result(watch)
    result["client_stats"] = {
        k: v for k, v in consumer.stats().items() if k in ("received", "finished", "requeued")
    }
    if not finished:
        result["error"] = tally.stall_error(spec)
    elif watch.error():
        result["error"] = watch.error()
    return result


def run_pynsq(spec: dict[str, Any]) -> dict[str, Any]:
    import nsq
    import tornado.ioloop

    loop = tornado.ioloop.IOLoop.current()
    tally = _Tally(spec["n"], spec["broker_pid"])
    watch = _FinishWatch(spec, spec["stall_timeout"])
    deadline = time.monotonic() + spec["timeout"]
    state: dict[str, Any] = {"error": None}

    def all_finished() -> None:  # on the IOLoop, once the watch is done
        state["error"] = watch.error()
        reader.close()
        loop.stop()

    def handler(message: Any) -> bool:
        if tally.tick():
            # The FINs are written by the IOLoop: it runs on until nsqd counts them all.
            watch.start(then=lambda: loop.add_callback(all_finished))
        return True

    def watchdog() -> None:
        now = time.monotonic()
        if tally.done.is_set():
            return
        if now > deadline or tally.stalled(now, spec["stall_timeout"]):
            state["error"] = tally.stall_error(spec)
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
    result = tally.result(watch)
    if state["error"]:
        result["error"] = state["error"]
    return result


def run_gnsq(spec: dict[str, Any]) -> dict[str, Any]:
    """gnsq's Consumer (gevent): the handler is a receiver of its ``on_message`` signal; gnsq
    finishes the message when the receiver returns."""
    import logging

    import gevent
    import gnsq

    logging.getLogger("gnsq").setLevel(logging.ERROR)  # "connection lost" when we close it
    tally = _Tally(spec["n"], spec["broker_pid"])
    consumer = gnsq.Consumer(
        spec["topic"],
        CHANNEL,
        nsqd_tcp_addresses=[spec["tcp"]],
        max_in_flight=spec["max_in_flight"],
    )

    @consumer.on_message.connect
    def handler(sender: Any, message: Any) -> None:
        tally.tick()

    error = None
    watch = _FinishWatch(spec, spec["stall_timeout"])
    with common.maybe_profile(spec):
        consumer.start(block=False)
        deadline = time.monotonic() + spec["timeout"]
        while not tally.done.is_set():
            gevent.sleep(0.1)
            now = time.monotonic()
            if now > deadline or tally.stalled(now, spec["stall_timeout"]):
                error = tally.stall_error(spec)
                break
        if error is None:
            # the FINs are written by gnsq's greenlets: the hub runs on until nsqd has them
            # (gnsq does not monkey-patch: the watch is an OS thread)
            watch.start()
            while not watch.done.is_set():
                gevent.sleep(0.001)
            error = watch.error()
        consumer.close()
        consumer.join(10.0)
    result = tally.result(watch)
    if error:
        result["error"] = error
    return result


def run_nsq_py(spec: dict[str, Any]) -> dict[str, Any]:
    """nsq-py's Reader in its own virtualenv: ``for message in reader: message.fin()``, one
    select() loop in the calling thread that reads, answers heartbeats, sends RDY and writes
    the queued FINs (its connection checker is a second thread, idle here)."""
    import logging
    import os

    import nsq
    from nsq.reader import Reader
    from nsq.response import Message

    if getattr(nsq, "__version__", None) != spec["nsq_py_version"]:
        return {"error": f"nsq is {nsq.__file__} {getattr(nsq, '__version__', '?')}, not nsq-py"}
    logging.getLogger("nsq").setLevel(logging.WARNING)  # it logs every RDY at INFO on stderr
    tally = _Tally(spec["n"], spec["broker_pid"])
    watch = _FinishWatch(spec, spec["stall_timeout"])
    deadline = time.monotonic() + spec["timeout"]

    def watchdog() -> None:
        # The Reader's loop never returns while no message comes: end the process from here.
        while not tally.done.wait(1.0):
            now = time.monotonic()
            if now > deadline or tally.stalled(now, spec["stall_timeout"]):
                common.emit_result({**tally.result(), "error": tally.stall_error(spec)})
                os._exit(0)

    threading.Thread(target=watchdog, name="bench-watchdog", daemon=True).start()
    # nsq-py 0.1.12 sends SUB's topic and channel as they are given: bytes
    reader = Reader(
        spec["topic"].encode(),
        CHANNEL.encode(),
        nsqd_tcp_addresses=[spec["tcp"]],
        max_in_flight=spec["max_in_flight"],
    )
    extra = 0
    with common.maybe_profile(spec):
        for message in reader:
            message.fin()
            if tally.tick():
                break  # closes the generator: its connection checker stops
        # The FINs queued since the last select() are written by the next Reader.read(): it
        # runs on (each call waits up to 0.1 s in select()) until nsqd counts them all.
        watch.start()
        while not watch.done.is_set():
            extra += sum(1 for r in reader.read() if isinstance(r, Message))
    # Client.close() is map(self.remove, ...): lazy under Python 3, it closes nothing
    for conn in reader.connections():
        conn.close()
    result = tally.result(watch)
    if extra:
        result["error"] = f"{extra} messages more than the {spec['n']} of the channel"
    elif watch.error():
        result["error"] = watch.error()
    return result


def child_main(spec: dict[str, Any]) -> None:
    run = {
        "prefill": run_prefill,
        "nsqclient": run_nsqclient,
        "pynsq": run_pynsq,
        "gnsq": run_gnsq,
        common.NSQ_PY: run_nsq_py,
    }[spec["client"]]
    common.emit_result(run(spec))


# ------------------------------------------------------------------------------ parent


@dataclass
class Config:
    """One consumer configuration: its label, the client, handler threads, how many nsqd."""

    name: str
    client: str  # nsqclient, pynsq, gnsq, nsq-py, bench_reader
    concurrency: int = 1
    nodes: int = 1
    #: the interpreter of the child when not this one (nsq-py's virtualenv)
    python: str | None = None


def measure(
    args: argparse.Namespace, broker: common.Broker, config: Config, n: int | None = None
) -> dict[str, Any]:
    """Fill a fresh topic with ``n`` messages (spread over ``config.nodes`` nsqd), consume them
    in a child, check nsqd's /stats; return the child's result with ``rate`` added."""
    if config.client == "bench_reader":
        return measure_bench_reader(args, broker, config)
    n = n or args.messages
    nodes = broker.nodes[: config.nodes]
    label = config.name
    case = "".join(c if c.isalnum() else "_" for c in label)
    topic = common.fresh_topic(f"consume_{case}", config.client)
    shares = [n // len(nodes) + (1 if i < n % len(nodes) else 0) for i in range(len(nodes))]
    for node in nodes:
        common.create_channel(node.http_address, topic, CHANNEL)
    base = {
        "tcp": nodes[0].tcp_address,
        "tcp_list": [node.tcp_address for node in nodes],
        "http": nodes[0].http_address,
        "http_list": [node.http_address for node in nodes],
        "topic": topic,
        "n": n,
        "broker_pid": broker.pid,
    }
    filled = common.run_child(
        __file__,
        {
            **base,
            "client": "prefill",
            "case": "prefill",
            "size": args.size,
            "fill": [[node.tcp_address, share] for node, share in zip(nodes, shares, strict=True)],
        },
        timeout=args.child_timeout,
    )
    for node, share in zip(nodes, shares, strict=True):
        depth = common.wait_for(
            f"{share} messages in {topic}/{CHANNEL} on {node.tcp_address}",
            lambda node=node: (common.channel_stats(node.http_address, topic, CHANNEL) or {}).get(
                "depth"
            ),
            lambda d, share=share: d == share,
            timeout=60.0,
        )
        if depth != share:
            raise common.ChildError(f"prefill: channel depth {depth}, expected {share}")
    print(
        f"  {label:22} prefilled {n:,} messages in {filled['seconds']:.1f}s; consuming...",
        file=sys.stderr,
    )
    spec = {
        **base,
        "client": config.client,
        "case": f"consume-{case}",
        "concurrency": config.concurrency,
        "max_in_flight": args.max_in_flight,
        "timeout": args.child_timeout - 60.0,
        "stall_timeout": args.stall_timeout,
        "nsq_py_version": common.NSQ_PY_VERSION,
        **common.profile_spec(args, config.client),
    }
    result = common.run_child(__file__, spec, timeout=args.child_timeout, python=config.python)
    problems = []
    if result["received"] != n:
        problems.append(f"handler ran {result['received']} times")
    for node, share in zip(nodes, shares, strict=True):
        channel = common.wait_for(
            f"nsqd {node.tcp_address} to see every message of {topic} finished",
            lambda node=node: common.channel_stats(node.http_address, topic, CHANNEL),
            lambda ch: bool(ch) and ch["depth"] == 0 and ch["in_flight_count"] == 0,
            timeout=30.0,
        )
        for key, want in (
            ("message_count", share),
            ("depth", 0),
            ("in_flight_count", 0),
            ("deferred_count", 0),
            ("requeue_count", 0),
            ("timeout_count", 0),
        ):
            if not isinstance(channel, dict) or channel.get(key) != want:
                got = channel.get(key) if isinstance(channel, dict) else channel
                problems.append(f"{node.tcp_address} {key}={got} (expected {want})")
    if problems:
        raise common.ChildError(f"{label}: nsqd /stats disagrees: {', '.join(problems)}")
    for node in nodes:
        common.delete_topic(node.http_address, topic)
    timed = result.get("timed", n)
    rate = (timed - 1) / result["seconds"] if result["seconds"] > 0 else None
    result["rate"] = rate
    result["us_per_msg"] = result["cpu"] / timed * 1e6
    to_end = result.get("to_end_seconds")
    result["end_rate"] = (n - 1) / to_end if to_end else None
    print(
        f"  {label:22} {timed:>9,} msgs in {result['seconds']:7.2f}s = {rate:>9,.0f} msg/s, "
        f"{common.describe_cpu(result, timed)}; to the end (nsqd's {n:,}-th FIN): "
        f"{to_end or 0:.2f}s = {result['end_rate'] or 0:,.0f} msg/s (nsqd had "
        f"{result.get('finished_at_last_call') or 0:,} FINs at the N-th call); nsqd: all "
        f"{n:,} finished, none requeued",
        file=sys.stderr,
    )
    return result


def measure_bench_reader(
    args: argparse.Namespace, broker: common.Broker, config: Config
) -> dict[str, Any]:
    """go-nsq's bench_reader (one connection per CPU, RDY 2500, FIN written in batches) for
    ``--go-runfor`` seconds on a channel prefilled with ``--go-messages``."""
    tool = common.go_tool(args, "bench_reader")
    assert tool is not None
    n = args.go_messages
    topic = common.fresh_topic("consume_go", "bench_reader")
    common.create_channel(broker.http_address, topic, CHANNEL)
    common.run_child(
        __file__,
        {
            "client": "prefill",
            "case": "prefill",
            "size": args.size,
            "topic": topic,
            "fill": [[broker.tcp_address, n]],
        },
        timeout=args.child_timeout,
    )
    common.wait_for(
        f"{n} messages in {topic}/{CHANNEL}",
        lambda: (common.channel_stats(broker.http_address, topic, CHANNEL) or {}).get("depth"),
        lambda d: d == n,
        timeout=60.0,
    )
    out = common.run_go_tool(
        [
            tool,
            f"--nsqd-tcp-address={broker.tcp_address}",
            f"--topic={topic}",
            f"--channel={CHANNEL}",
            f"--runfor={args.go_runfor}s",
            f"--size={args.size}",
            f"--rdy={args.max_in_flight}",
        ],
        timeout=args.go_runfor + 60.0,
    )
    left = (common.channel_stats(broker.http_address, topic, CHANNEL) or {}).get("depth")
    common.delete_topic(broker.http_address, topic)
    messages = out["rate"] * args.go_runfor
    result = {**common.go_tool_result(out, args.go_runfor, messages), "drained": left == 0}
    note = (
        "; the channel ran dry before --go-runfor ended: the rate is a lower bound "
        "(raise --go-messages)"
        if left == 0
        else ""
    )
    print(
        f"  {config.name:22} ~{messages:>8,.0f} msgs in {args.go_runfor:7.2f}s = "
        f"{out['rate']:>9,.0f} msg/s, {result['us_per_msg']:5.1f} us CPU/msg (whole process, "
        f"incl. connecting){note}",
        file=sys.stderr,
    )
    return result


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = common.argument_parser(
        __doc__, 200_000, "messages each consumer receives (default 200000)"
    )
    common.add_size_argument(parser)
    common.add_max_in_flight_argument(parser)
    parser.add_argument(
        "--concurrency",
        default="1,4",
        help="nsqclient handler thread counts to try, comma-separated (default 1,4)",
    )
    parser.add_argument(
        "--spread",
        type=int,
        default=3,
        help="the 'N nsqd at once' case: nsqclient (concurrency 1) consumes one topic spread "
        "over this many nsqd, beside the same on one; 0 or 1: no such case (default 3)",
    )
    common.add_clients_argument(parser, CLIENTS, "bench_reader")
    parser.add_argument(
        "--go-messages",
        type=int,
        default=1_000_000,
        help="messages in the channel bench_reader reads (more than it can read in "
        "--go-runfor; default 1000000)",
    )
    common.add_go_tool_arguments(
        parser,
        "bench_reader",
        "one more nsqclient run (concurrency 1) of this many messages for the resident memory "
        "growth, run once after the repeats; 0: none",
    )
    common.add_peer_venv_argument(parser)
    common.add_run_arguments(parser)
    common.add_stall_timeout_argument(parser, "a consumer that receives")
    args = parser.parse_args(argv)
    common.apply_quick(args, messages=3000)
    args.concurrency_list = [int(c) for c in common.comma_list(args.concurrency)]
    args.client_list = common.choice_list(parser, args.clients, CLIENTS, "client")
    if args.messages < 4:
        parser.error("--messages must be at least 4")
    if args.repeat < 1:
        parser.error("--repeat must be positive")
    return args


def _mib(kib: int | None) -> str:
    return "-" if kib is None else f"{kib / 1024:.1f}"


def _growth(rss: dict[str, int], since: str) -> str:
    if "100%" not in rss or since not in rss:
        return "-"
    return f"{(rss['100%'] - rss[since]) / 1024:+.1f}"


def plan(args: argparse.Namespace, broker: common.Broker) -> tuple[list[Config], list[str]]:
    """The configurations to run, and notes on the ones that cannot run here."""
    configs: list[Config] = []
    skipped: list[str] = []
    wanted = args.client_list
    if "nsqclient" in wanted:
        configs += [Config(f"nsqclient c{c}", "nsqclient", c) for c in args.concurrency_list]
        if args.spread > 1:
            if len(broker.nodes) >= args.spread:
                if 1 not in args.concurrency_list:
                    configs.append(Config("nsqclient c1", "nsqclient", 1))
                configs.append(
                    Config(f"nsqclient c1, {args.spread} nsqd", "nsqclient", 1, args.spread)
                )
            else:
                skipped.append(
                    f"{args.spread} nsqd at once: needs a broker this script starts "
                    f"(--nsqd/--lookupd give one nsqd)"
                )
    if "pynsq" in wanted:
        configs.append(Config("pynsq", "pynsq"))
    if "gnsq" in wanted:
        problem = common.gnsq_problem()
        if problem:
            skipped.append(f"gnsq: {problem}")
        else:
            configs.append(Config("gnsq", "gnsq"))
    if common.NSQ_PY in wanted:
        python, problem = common.nsq_py_python(args)
        if python is None:
            skipped.append(f"{common.NSQ_PY} {common.NSQ_PY_VERSION}: {problem}")
        else:
            configs.append(Config(common.NSQ_PY, common.NSQ_PY, python=python))
    if "bench_reader" in wanted:
        if common.go_tool(args, "bench_reader"):
            configs.append(Config("bench_reader", "bench_reader"))
        else:
            skipped.append("go-nsq bench_reader: not in NSQ_BIN_DIR / --bin-dir")
    return configs, skipped


def _end_rate(results: list[dict[str, Any]]) -> float | None:
    """The best to-the-end rate of a configuration's runs (None: none has one)."""
    return max((r["end_rate"] for r in results if r.get("end_rate")), default=None)


def print_to_end(
    args: argparse.Namespace,
    runs: dict[str, list[dict[str, Any]]],
    best: dict[str, dict[str, Any]],
) -> None:
    """Every configuration's rate at 99% of N and to the end (nsqd's N-th FIN), each the best
    of the runs, against nsq-py's; then issue 35's targets for the handler."""
    print()
    print(
        f"every client: the rate to 99% of N (the table above) and to the end, i.e. until "
        f"nsqd's finish count reaches N = {args.messages:,} (each the best of the runs)"
    )
    print()
    ends = {name: _end_rate(results) for name, results in runs.items()}
    nq = best.get(common.NSQ_PY)
    nq_end = ends.get(common.NSQ_PY)
    rows = []
    for name, r in best.items():
        end = ends.get(name)
        rows.append(
            [
                name,
                common.rate_cell(r),
                "n/a (*)" if name == "bench_reader" else f"{common.fmt_rate(end)}/s",
                common.fmt_x(common.ratio(end, r["rate"])),
                common.fmt_x(common.ratio(r["rate"], nq["rate"] if nq else None)),
                common.fmt_x(common.ratio(end, nq_end)),
            ]
        )
    headers = [
        "client",
        "@99%: msg/s (CPU us/msg)",
        "to the end: msg/s",
        "end / @99%",
        f"x {common.NSQ_PY} @99%",
        f"x {common.NSQ_PY} to the end",
    ]
    print(common.markdown_table(headers, rows))
    if "bench_reader" in best:
        print(
            "\n(*) bench_reader reads for --go-runfor seconds and buffers its FINs until it "
            "exits: its rate is its own, over a channel it does not empty"
        )
    c1, c4, go = best.get("nsqclient c1"), best.get("nsqclient c4"), best.get("bench_reader")
    if c1 is None:
        return
    c1_end = ends.get("nsqclient c1")
    targets = []
    if nq is not None:
        r = common.ratio(c1_end, nq_end)
        targets.append(
            [
                "handler c1 to the end vs nsq-py's",
                common.fmt_x(r),
                ">= 1.0x",
                common.target_check(r, 1.0),
            ]
        )
        r = common.ratio(c1["us_per_msg"], nq["us_per_msg"])
        targets.append(
            [
                "handler c1 CPU us/msg vs nsq-py's",
                f"{c1['us_per_msg']:.2f} / {nq['us_per_msg']:.2f} = {common.fmt_x(r)}",
                "<= 1.0x",
                common.target_check(r, 1.0, at_most=True),
            ]
        )
    if go is not None:
        r = common.ratio(c1_end, go["rate"])
        targets.append(
            [
                "handler c1 to the end vs bench_reader",
                common.fmt_x(r),
                ">= 0.6x",
                common.target_check(r, 0.6),
            ]
        )
    if c4 is not None:
        r = common.ratio(ends.get("nsqclient c4"), c1_end)
        targets.append(
            ["handler c4 to the end vs c1", common.fmt_x(r), ">= 1.0x", common.target_check(r, 1.0)]
        )
    if targets:
        print()
        print("issue 35's targets for the handler (one run's ratios)")
        print()
        print(common.markdown_table(["target", "measured", "wanted", "met"], targets))


def main(argv: list[str]) -> int:
    if common.run_as_child(argv, child_main):
        return 0
    args = parse_args(argv)
    mem_queue = args.mem_queue_size or (
        max(args.messages, args.rss_messages, args.go_messages) + 1000
    )
    nsqd_count = max(1, args.spread)
    with common.open_broker(args, nsqd_count=nsqd_count, mem_queue_size=mem_queue) as broker:
        configs, skipped = plan(args, broker)
        runs: dict[str, list[dict[str, Any]]] = {c.name: [] for c in configs}
        print(
            f"consume benchmark: {broker.description}; {common.describe_machine()}; "
            f"{args.messages:,} x {args.size}-byte messages per consumer; "
            f"max_in_flight {args.max_in_flight}; best of {args.repeat}, interleaved",
            file=sys.stderr,
        )
        common.print_not_measured(skipped)
        for _ in range(args.repeat):
            for config in configs:
                runs[config.name].append(measure(args, broker, config))
        rss_run = None
        if args.rss_messages and "nsqclient" in args.client_list:
            print(
                f"  memory run: nsqclient c1, {args.rss_messages:,} messages",
                file=sys.stderr,
            )
            rss_run = measure(
                args, broker, Config("nsqclient c1 (memory)", "nsqclient"), args.rss_messages
            )
    # The best run of each configuration (the one least disturbed by other work).
    best = {name: max(results, key=lambda r: r["rate"] or 0) for name, results in runs.items()}
    common.print_report_intro(
        f"### consume: no-op handler, max_in_flight {args.max_in_flight}, {args.messages:,} x "
        f"{args.size}-byte messages, best of {args.repeat} (interleaved)",
        broker,
        "cells: msg/s (CPU us/msg = consumer process CPU time / messages, all its threads)",
    )
    cell = common.rate_cell
    py, gn, go = best.get("pynsq"), best.get("gnsq"), best.get("bench_reader")
    nq = best.get(common.NSQ_PY)
    rows = []
    for c, target in ((1, 8.0), (4, 6.0)):
        ours = best.get(f"nsqclient c{c}")
        if ours is None:
            continue
        r = common.ratio(ours["rate"], py["rate"] if py else None)
        against = ", ".join(
            f"{common.fmt_x(common.ratio(ours['rate'], peer['rate']))} {name}"
            for name, peer in (("gnsq", gn), (common.NSQ_PY, nq), ("Go", go))
            if peer
        )
        rows.append(
            [
                f"consume, concurrency {c}",
                cell(ours),
                cell(py),
                cell(gn),
                cell(nq),
                cell(go),
                f"{common.fmt_x(r)} pynsq" + (f", {against}" if against else ""),
                f">= {target:.0f}x pynsq",
                common.target_check(r, target),
            ]
        )
    spread = best.get(f"nsqclient c1, {args.spread} nsqd")
    if spread is not None:
        one = best.get("nsqclient c1")
        r = common.ratio(spread["rate"], one["rate"] if one else None)
        rows.append(
            [
                f"consume, concurrency 1, {args.spread} nsqd at once",
                cell(spread),
                "-",
                "-",
                "-",
                "-",
                f"{common.fmt_x(r)} of one nsqd",
                ">= 1x",
                common.target_check(r, 1.0),
            ]
        )
    headers = common.comparison_headers("go-nsq bench_reader", "ratio", "target", "met")
    print(common.markdown_table(headers, rows))
    common.print_not_measured(skipped, report=True)
    print_to_end(args, runs, best)
    print()
    print("resident memory of the consumer process, MiB (VmRSS; peak = VmHWM; best runs)")
    print()
    headers = ["client", *RSS_POINTS, "peak", "first->100%", "25%->100%"]
    mem_rows = []
    shown = {k: v for k, v in best.items() if "rss_kib" in v}
    if rss_run is not None:
        shown[f"nsqclient c1, {args.rss_messages:,} msgs"] = rss_run
    for name, r in shown.items():
        rss = r["rss_kib"]
        mem_rows.append(
            [
                name,
                *(_mib(rss.get(p)) for p in RSS_POINTS),
                _mib(r["peak_rss_kib"]),
                _growth(rss, "first message"),
                _growth(rss, "25%"),
            ]
        )
    print(common.markdown_table(headers, mem_rows))
    if rss_run is not None:
        rss = rss_run["rss_kib"]
        growth_mib = (rss["100%"] - rss["first message"]) / 1024
        common.print_rss_growth(
            f"{args.rss_messages:,} messages consumed", "first message", growth_mib
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
