#!/usr/bin/env python
"""Publish throughput: nsqclient's Producer against pynsq's Writer on the same nsqd.

Cases (200-byte messages, a fresh topic for every client and case):

* ``pub x1``     one publisher, each publish waits for nsqd's OK before the next;
* ``pub x8``     eight publishers at once (nsqclient: 8 threads sharing one Producer; pynsq:
                 8 chains of callbacks on one IOLoop, i.e. 8 PUBs outstanding at a time);
* ``mpub x200``  one publisher, MPUB of 200 messages, waiting for each OK.

Two more clients are not libraries but floors, shown so that the targets can be read against
what is possible at all on this machine and broker:

* ``socket``: one thread on a plain blocking socket, sending commands and reading answers itself
  (``pub x8``: eight commands in flight), with no reader or writer thread and nothing to answer
  heartbeats while idle: the floor under any Python client;
* ``threads``: nsqclient's threading shape with nothing else: publishers wait on a plain lock
  each, a reader thread releases them in order, an idle publisher writes the socket itself and a
  writer thread sends the rest; no timeouts, errors, heartbeats or validation: the floor under a
  client whose ``pub()`` blocks in the calling thread.

Each client runs in its own subprocess.  The rate is messages acknowledged per second, from the
first publish to the last OK, with the connection already made; afterwards the parent checks
that nsqd's ``/stats`` counts exactly the messages published.

    .venv/bin/python bench/publish.py                     # NSQ_BIN_DIR set: real nsqd
    .venv/bin/python bench/publish.py --broker embedded   # the embedded NSQ
    .venv/bin/python bench/publish.py --nsqd 127.0.0.1:4150 -n 50000
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

import _common as common

CASES = {
    # name: (publishers, batch size)
    "pub x1": (1, 1),
    "pub x8": (8, 1),
    "mpub x200": (1, 200),
}
TARGETS = {"pub x1": 2.0, "pub x8": 2.0, "mpub x200": 1.0}
CLIENTS = ("nsqclient", "pynsq", "socket", "threads")


# ------------------------------------------------------------------------------ children


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def run_nsqclient(spec: dict[str, Any]) -> dict[str, Any]:
    # Profiling (when asked) starts before the Producer connects, so that the connection's
    # reader and writer threads are profiled too.
    with common.maybe_profile(spec):
        return _nsqclient_publish(spec)


def _nsqclient_publish(spec: dict[str, Any]) -> dict[str, Any]:
    from nsqclient.producer import Producer

    body = common.message_body(spec["size"])
    topic, n, publishers, batch = spec["topic"], spec["n"], spec["publishers"], spec["batch"]
    producer = Producer([spec["tcp"]])
    errors: list[BaseException] = []
    go = threading.Event()

    def publish(count: int) -> None:
        go.wait(30.0)
        try:
            for _ in range(count):
                producer.pub(topic, body)
        except BaseException as exc:  # reported, not swallowed
            errors.append(exc)

    window = common.CpuWindow(spec["broker_pid"])
    try:
        producer.pub(topic + "_warmup", body)  # connect before the clock starts
        if batch > 1:
            batches = [[body] * size for size in _split_batches(n, batch)]
            window.start()
            for bodies in batches:
                producer.mpub(topic, bodies)
        elif publishers == 1:
            window.start()
            for _ in range(n):
                producer.pub(topic, body)
        else:
            threads = [
                threading.Thread(target=publish, args=(count,), name=f"bench-pub-{i}")
                for i, count in enumerate(_split(n, publishers))
            ]
            for t in threads:
                t.start()
            window.start()
            go.set()
            for t in threads:
                t.join(600.0)
        window.stop()
        if errors:
            return {"error": f"{len(errors)} publisher(s) failed, first: {errors[0]!r}"}
        return {**window.as_dict(), "published": n}
    finally:
        producer.close()


def _split_batches(n: int, batch: int) -> list[int]:
    sizes = [batch] * (n // batch)
    if n % batch:
        sizes.append(n % batch)
    return sizes


def run_pynsq(spec: dict[str, Any]) -> dict[str, Any]:
    import nsq
    import tornado.ioloop

    body = common.message_body(spec["size"])
    topic, n, chains, batch = spec["topic"], spec["n"], spec["publishers"], spec["batch"]
    loop = tornado.ioloop.IOLoop.current()
    writer = nsq.Writer([spec["tcp"]])
    state: dict[str, Any] = {"sent": 0, "acked": 0, "error": None}
    window = common.CpuWindow(spec["broker_pid"])
    sizes = _split_batches(n, batch) if batch > 1 else None
    batches = [[body] * size for size in sizes] if sizes else None

    def finish(error: str | None = None) -> None:
        window.stop()
        state["error"] = state["error"] or error
        loop.stop()

    def send_next() -> None:
        if batches is not None:
            index = state["sent"]
            if index >= len(batches):
                return
            state["sent"] += 1
            writer.mpub(topic, batches[index], callback=on_ack)
        else:
            if state["sent"] >= n:
                return
            state["sent"] += 1
            writer.pub(topic, body, callback=on_ack)

    def on_ack(conn: Any, data: Any) -> None:
        if isinstance(data, nsq.Error):
            finish(f"publish failed: {data!r}")
            return
        state["acked"] += 1  # one OK per PUB or per MPUB
        total = len(batches) if batches is not None else n
        if state["acked"] >= total:
            finish()
        else:
            send_next()

    def start_timed(conn: Any, data: Any) -> None:
        if isinstance(data, nsq.Error):
            finish(f"warm-up publish failed: {data!r}")
            return
        window.start()
        for _ in range(chains):
            send_next()

    deadline = time.monotonic() + 30.0

    def wait_connected() -> None:
        if any(c.connected() for c in writer.conns.values()):
            writer.pub(topic + "_warmup", body, callback=start_timed)
        elif time.monotonic() > deadline:
            finish("pynsq Writer did not connect within 30s")
        else:
            loop.call_later(0.01, wait_connected)

    loop.call_later(600.0, lambda: finish("timed out after 600s"))
    loop.add_callback(wait_connected)
    with common.maybe_profile(spec):
        loop.start()
    if state["error"]:
        return {"error": state["error"]}
    return {**window.as_dict(), "published": n}


def run_socket(spec: dict[str, Any]) -> dict[str, Any]:
    """The floor: one thread, one blocking socket, ``publishers`` commands in flight."""
    import socket

    from nsqclient import protocol

    host, _, port = spec["tcp"].rpartition(":")
    body = common.message_body(spec["size"])
    topic, n, window_size, batch = spec["topic"], spec["n"], spec["publishers"], spec["batch"]
    if batch > 1:
        commands = [protocol.mpub(topic, [body] * size) for size in _split_batches(n, batch)]
    else:
        commands = [protocol.pub(topic, body)] * n
    sock = socket.create_connection((host, int(port)), timeout=30.0)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    frames = protocol.FrameReader()

    def answers() -> list[protocol.Frame]:
        while True:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("nsqd closed the connection")
            got = []
            for frame in frames.feed(data):
                if frame.data == protocol.HEARTBEAT:
                    sock.sendall(protocol.nop())
                elif frame.type != protocol.FRAME_TYPE_RESPONSE:
                    raise ConnectionError(f"nsqd answered {frame.data!r}")
                else:
                    got.append(frame)
            if got:
                return got

    sock.sendall(protocol.MAGIC_V2 + protocol.identify({}) + protocol.pub(topic + "_warmup", body))
    acked = -2  # the IDENTIFY and warm-up answers come first
    while acked < 0:
        acked += len(answers())
    window = common.CpuWindow(spec["broker_pid"])
    window.start()
    sent = min(window_size, len(commands))
    sock.sendall(b"".join(commands[:sent]))
    while acked < len(commands):
        got = len(answers())
        acked += got
        more = commands[sent : sent + got]
        if more:
            sock.sendall(b"".join(more))
            sent += len(more)
    window.stop()
    sock.close()
    return {**window.as_dict(), "published": n}


def run_threads(spec: dict[str, Any]) -> dict[str, Any]:
    """The floor of the threaded shape: see the module docstring."""
    import queue
    import socket
    from collections import deque

    from nsqclient import protocol

    host, _, port = spec["tcp"].rpartition(":")
    body = common.message_body(spec["size"])
    topic, n, publishers, batch = spec["topic"], spec["n"], spec["publishers"], spec["batch"]
    sock = socket.create_connection((host, int(port)), timeout=30.0)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(protocol.MAGIC_V2 + protocol.identify({}))
    frames = protocol.FrameReader()
    while not frames.feed(sock.recv(4096)):
        pass
    sock.settimeout(None)
    pending: deque[threading.Lock] = deque()
    state_lock, send_lock = threading.Lock(), threading.Lock()
    outbox: queue.SimpleQueue = queue.SimpleQueue()
    queued = [0]

    def reader() -> None:
        while data := sock.recv(262144):
            for _ in frames.feed(data):
                with state_lock:
                    waiter = pending.popleft()
                waiter.release()

    def writer() -> None:
        while (item := outbox.get()) is not None:
            items = [item]
            while not outbox.empty():
                items.append(outbox.get())
            with send_lock:
                sock.sendall(b"".join(items))
            with state_lock:
                queued[0] -= len(items)

    def request(command: bytes) -> None:
        waiter = threading.Lock()
        waiter.acquire()
        with state_lock:
            pending.append(waiter)
            direct = not queued[0] and len(pending) == 1 and send_lock.acquire(False)
            if not direct:
                queued[0] += 1
                outbox.put(command)
        if direct:
            sock.sendall(command)
            send_lock.release()
        waiter.acquire()

    threads = [threading.Thread(target=reader), threading.Thread(target=writer)]
    for t in threads:
        t.start()
    request(protocol.pub(topic + "_warmup", body))
    go = threading.Event()

    def publish(count: int) -> None:
        go.wait(30.0)
        for _ in range(count):
            request(protocol.pub(topic, body))

    window = common.CpuWindow(spec["broker_pid"])
    if batch > 1:
        window.start()
        for size in _split_batches(n, batch):
            request(protocol.mpub(topic, [body] * size))
    else:
        workers = [threading.Thread(target=publish, args=(c,)) for c in _split(n, publishers)]
        for t in workers:
            t.start()
        window.start()
        go.set()
        for t in workers:
            t.join(600.0)
    window.stop()
    outbox.put(None)
    sock.shutdown(socket.SHUT_RDWR)
    for t in threads:
        t.join(30.0)
    sock.close()
    return {**window.as_dict(), "published": n}


def child_main(spec: dict[str, Any]) -> None:
    run = {
        "nsqclient": run_nsqclient,
        "pynsq": run_pynsq,
        "socket": run_socket,
        "threads": run_threads,
    }[spec["client"]]
    common.emit_result(run(spec))


# ------------------------------------------------------------------------------ parent


def measure(args: argparse.Namespace, broker: common.Broker, case: str, client: str) -> float:
    publishers, batch = CASES[case]
    n = args.mpub_messages if batch > 1 else args.messages
    topic = common.fresh_topic(case.replace(" ", ""), client)
    spec = {
        "client": client,
        "case": case.replace(" ", ""),
        "tcp": broker.tcp_address,
        "topic": topic,
        "n": n,
        "publishers": publishers,
        "batch": batch,
        "size": args.size,
        **common.profile_spec(args, client),
        "broker_pid": broker.pid,
    }
    result = common.run_child(__file__, spec, timeout=args.child_timeout)
    counted = common.wait_for(
        f"nsqd to count {n} messages on {topic}",
        lambda: common.topic_message_count(broker.http_address, topic),
        lambda c: c >= n,
        timeout=10.0,
    )
    if counted != n:
        raise common.ChildError(f"{client} {case}: nsqd counts {counted} messages, expected {n}")
    common.delete_topic(broker.http_address, topic)
    common.delete_topic(broker.http_address, topic + "_warmup")
    rate = n / result["seconds"]
    print(
        f"  {case:10} {client:9} {n:>9,} msgs in {result['seconds']:7.2f}s = "
        f"{rate:>10,.0f} msg/s, {common.describe_cpu(result, n)}; nsqd counted {counted:,}",
        file=sys.stderr,
    )
    return rate


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = common.argument_parser(
        __doc__, 50_000, "messages per client in the pub cases (default 50000)"
    )
    parser.add_argument(
        "--mpub-messages",
        type=int,
        default=1_000_000,
        help="messages per client in the mpub case (default 1000000)",
    )
    parser.add_argument("--size", type=int, default=common.MESSAGE_SIZE, help="body bytes")
    parser.add_argument(
        "--cases", default=",".join(CASES), help=f"comma-separated subset of {list(CASES)}"
    )
    parser.add_argument(
        "--clients",
        default=",".join(CLIENTS),
        help=f"comma-separated subset of {','.join(CLIENTS)}",
    )
    common.add_profile_arguments(parser)
    parser.add_argument("--child-timeout", type=float, default=900.0, help="seconds per child")
    common.add_repeat_argument(parser)
    args = parser.parse_args(argv)
    args.case_list = [c.strip() for c in args.cases.split(",") if c.strip()]
    for c in args.case_list:
        if c not in CASES:
            parser.error(f"unknown case {c!r}; choose from {list(CASES)}")
    args.client_list = [c.strip() for c in args.clients.split(",") if c.strip()]
    for c in args.client_list:
        if c not in CLIENTS:
            parser.error(f"unknown client {c!r}")
    if args.messages < 1 or args.mpub_messages < 1 or args.repeat < 1:
        parser.error("message counts and --repeat must be positive")
    return args


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--child":
        child_main(json.loads(argv[1]))
        return 0
    args = parse_args(argv)
    results: dict[tuple[str, str], list[float]] = {}
    mem_queue = args.mem_queue_size or max(args.messages, args.mpub_messages) + 1000
    with common.open_broker(args, mem_queue_size=mem_queue) as broker:
        print(
            f"publish benchmark: {broker.description}; {common.describe_machine()}; "
            f"{args.size}-byte messages; pub n={args.messages:,}, mpub n={args.mpub_messages:,}",
            file=sys.stderr,
        )
        for _ in range(args.repeat):
            for case in args.case_list:
                for client in args.client_list:
                    rate = measure(args, broker, case, client)
                    results.setdefault((case, client), []).append(rate)
    print()
    best = f" (best of {args.repeat} runs each)" if args.repeat > 1 else ""
    print(f"publish, {args.size}-byte messages{best}, broker: {broker.description}")
    rows = []
    for case in args.case_list:
        ours = max(results.get((case, "nsqclient"), []), default=None)
        theirs = max(results.get((case, "pynsq"), []), default=None)
        floor = max(results.get((case, "socket"), []), default=None)
        threads_floor = max(results.get((case, "threads"), []), default=None)
        rows.append(
            [
                case,
                common.fmt_rate(ours),
                common.fmt_rate(theirs),
                common.fmt_ratio(ours, theirs),
                f">= {TARGETS[case]:.0f}x",
                common.fmt_rate(threads_floor),
                common.fmt_ratio(threads_floor, theirs),
                common.fmt_rate(floor),
                common.fmt_ratio(floor, theirs),
            ]
        )
    common.print_table(
        [
            "case",
            "nsqclient msg/s",
            "pynsq msg/s",
            "ratio",
            "target",
            "threads floor",
            "/pynsq",
            "socket floor",
            "/pynsq",
        ],
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
