#!/usr/bin/env python
"""Publish throughput: nsqclient's Producer against pynsq's Writer, gnsq's Producer and nsq-py's
Client on the same nsqd.

Cases (200-byte messages, a fresh topic for every client and case):

* ``pipelined``  one thread publishes N without waiting, then waits for every answer
                 (nsqclient: ``pub_async`` x N then ``concurrent.futures.wait``; pynsq: N
                 ``Writer.pub`` with callbacks from one IOLoop callback; gnsq: N
                 ``publish(raise_error=False)`` then every ``AsyncResult.get()``);
* ``pub x1``     one publisher, each publish waits for nsqd's OK before the next; the
                 latency of every publish is kept (p50/p99) (nsq-py: ``Client.pub``, which
                 waits so itself; it is in this case and ``mpub x200`` only, having no
                 pipelined publish and no Client for several threads);
* ``pub x8``     eight publishers at once (nsqclient: 8 threads sharing one Producer; pynsq:
                 8 chains of callbacks on one IOLoop, i.e. 8 PUBs outstanding at a time;
                 gnsq: 8 greenlets);
* ``mpub x200``  one publisher, MPUB of 200 messages, waiting for each OK (go-nsq's
                 ``bench_writer --batch-size=200`` beside it when NSQ_BIN_DIR holds it);
* ``mpub x200 xC``  bench_writer's own shape: C publishers (C = this machine's CPU count, as
                 bench_writer runs one connection per CPU), each MPUBing 200 messages and
                 waiting for its OK (nsqclient: C threads sharing one Producer; pynsq: C
                 chains of callbacks; gnsq: C greenlets; socket: C MPUBs in flight).

After the repeats, one more nsqclient run of ``--rss-messages`` ``pub_async`` (at most 10,000
unanswered at a time) samples the publisher's resident memory at 25/50/75/100%.

Two more clients are not libraries but floors, shown so that the targets can be read against
what is possible at all on this machine and broker:

* ``socket``: one thread on a plain blocking socket, sending commands and reading answers itself
  (``pub x8``: eight commands in flight), with no reader or writer thread and nothing to answer
  heartbeats while idle: the floor under any Python client (MPUB: each batch encoded as it is
  sent, with nsqclient's encoder, since a client is handed bodies, not a command);
* ``threads``: nsqclient's threading shape with nothing else: publishers wait on a plain lock
  each, a reader thread releases them in order, a publisher writes the socket itself when no
  command waits for the writer thread, which sends the rest; no timeouts, errors, heartbeats,
  caller-side reading or validation: the floor under a client whose ``pub()`` blocks in the
  calling thread.

Each client runs in its own subprocess (nsq-py's from a virtualenv of its own, ``--peer-venvs``:
its package is ``nsq``, as pynsq's is).  The rate is messages acknowledged per second, from the
first publish to the last OK, with the connection already made; afterwards the parent checks
that nsqd's ``/stats`` counts exactly the messages published.

    .venv/bin/python bench/publish.py                     # NSQ_BIN_DIR set: real nsqd
    .venv/bin/python bench/publish.py --broker embedded   # the embedded NSQ
    .venv/bin/python bench/publish.py --nsqd 127.0.0.1:4150 -n 50000
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import _common as common

CPUS = os.cpu_count() or 1
MPUB_PER_CPU = f"mpub x200 x{CPUS}"  # bench_writer's shape: one publisher per CPU
CASES = {
    # name: (publishers, batch size); publishers 0: pipelined, every publish sent at once
    "pipelined": (0, 1),
    "pub x1": (1, 1),
    "pub x8": (8, 1),
    "mpub x200": (1, 200),
    MPUB_PER_CPU: (CPUS, 200),
}
NSQ_PY = common.NSQ_PY
CLIENTS = ("nsqclient", "pynsq", "gnsq", NSQ_PY, "socket", "threads", "bench_writer")
# which clients each case runs (the threaded floor has no pipelined form; bench_writer only MPUBs;
# nsq-py publishes one command at a time from one thread: no pipelined form, no shared Client)
CASE_CLIENTS = {
    "pipelined": ("nsqclient", "pynsq", "gnsq", "socket"),
    "pub x1": ("nsqclient", "pynsq", "gnsq", NSQ_PY, "socket", "threads"),
    "pub x8": ("nsqclient", "pynsq", "gnsq", "socket", "threads"),
    "mpub x200": ("nsqclient", "pynsq", "gnsq", NSQ_PY, "socket", "threads", "bench_writer"),
    MPUB_PER_CPU: ("nsqclient", "pynsq", "gnsq", "socket", "threads", "bench_writer"),
}
SOCKET_PIPELINE_WINDOW = 1000  # the socket floor's commands in flight in the pipelined case
MEMORY_WINDOW = 10_000  # unanswered pub_async at most in the memory run
RSS_POINTS = ("before start", "25%", "50%", "75%", "100%")


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
        batches = _share_batches(count, batch, body) if batch > 1 else []
        go.wait(30.0)
        try:
            if batches:
                for bodies in batches:
                    producer.mpub(topic, bodies)
            else:
                for _ in range(count):
                    producer.pub(topic, body)
        except BaseException as exc:  # reported, not swallowed
            errors.append(exc)

    window = common.CpuWindow(spec["broker_pid"])
    extra: dict[str, Any] = {}
    try:
        producer.pub(topic + "_warmup", body)  # connect before the clock starts
        if spec.get("memory"):
            extra = _nsqclient_memory(producer, topic, body, n, window)
        elif batch > 1 and publishers == 1:
            batches = _share_batches(n, batch, body)
            window.start()
            for bodies in batches:
                producer.mpub(topic, bodies)
        elif publishers == 0:
            from concurrent.futures import wait

            window.start()
            futures = [producer.pub_async(topic, body) for _ in range(n)]
            _, not_done = wait(futures, timeout=600.0)
            window.stop()
            failed = [f for f in futures if f.done() and f.exception() is not None]
            if not_done or failed:
                first = failed[0].exception() if failed else None
                return {"error": f"{len(not_done)} unanswered, {len(failed)} failed: {first!r}"}
        elif publishers == 1:
            extra = _one_at_a_time(window, n, producer.pub, topic, body)
        else:
            threads = [
                threading.Thread(target=publish, args=(count,), name=f"bench-pub-{i}")
                for i, count in enumerate(_split_publishers(n, publishers, batch))
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
        return {**window.as_dict(), "published": n, **extra}
    finally:
        producer.close()


def _nsqclient_memory(
    producer: Any, topic: str, body: bytes, n: int, window: common.CpuWindow
) -> dict[str, Any]:
    """``pub_async`` n times, at most MEMORY_WINDOW unanswered (waiting for the oldest beyond
    that), sampling the resident set at 25/50/75/100% of n."""
    from collections import deque

    rss = {"before start": common.proc_status_kib("VmRSS")}
    marks = {max(1, n * q // 4): f"{25 * q}%" for q in (1, 2, 3, 4)}
    pending: deque[Any] = deque()
    window.start()
    for i in range(1, n + 1):
        pending.append(producer.pub_async(topic, body))
        if len(pending) > MEMORY_WINDOW:
            pending.popleft().result(60.0)
        label = marks.get(i)
        if label is not None:
            rss[label] = common.proc_status_kib("VmRSS")
    while pending:
        pending.popleft().result(60.0)
    window.stop()
    return {"rss_kib": rss}


def _one_at_a_time(
    window: common.CpuWindow, n: int, publish: Callable[[str, bytes], Any], topic: str, body: bytes
) -> dict[str, float]:
    """Start ``window`` and ``publish`` n times, each after the last returned: the latency
    summary of the calls."""
    latencies = []
    clock = time.perf_counter
    window.start()
    for _ in range(n):
        t0 = clock()
        publish(topic, body)
        latencies.append(clock() - t0)
    return common.latency_summary(latencies)


def _split_batches(n: int, batch: int) -> list[int]:
    sizes = [batch] * (n // batch)
    if n % batch:
        sizes.append(n % batch)
    return sizes


def _split_publishers(n: int, publishers: int, batch: int) -> list[int]:
    """Each publisher's share of n messages, in whole batches (the last share takes the rest)."""
    if batch == 1:
        return _split(n, publishers)
    shares = [batch * k for k in _split(n // batch, publishers)]
    shares[-1] += n % batch
    return shares


def _share_batches(count: int, batch: int, body: bytes) -> list[list[bytes]]:
    """``count`` messages as MPUB batches of ``batch`` bodies (the last one smaller)."""
    return [[body] * size for size in _split_batches(count, batch)]


def run_pynsq(spec: dict[str, Any]) -> dict[str, Any]:
    import nsq
    import tornado.ioloop

    body = common.message_body(spec["size"])
    topic, n, chains, batch = spec["topic"], spec["n"], spec["publishers"], spec["batch"]
    loop = tornado.ioloop.IOLoop.current()
    writer = nsq.Writer([spec["tcp"]])
    state: dict[str, Any] = {"sent": 0, "acked": 0, "error": None}
    window = common.CpuWindow(spec["broker_pid"])
    if chains == 0:  # pipelined: every publish sent from one IOLoop callback
        chains = n
    latencies: list[float] = []
    sent_at = [0.0]
    clock = time.perf_counter
    batches = _share_batches(n, batch, body) if batch > 1 else None

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
            sent_at[0] = clock()
            writer.pub(topic, body, callback=on_ack)

    def on_ack(conn: Any, data: Any) -> None:
        if isinstance(data, nsq.Error):
            finish(f"publish failed: {data!r}")
            return
        if chains == 1 and batches is None:
            latencies.append(clock() - sent_at[0])
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
    extra = common.latency_summary(latencies) if latencies else {}
    return {**window.as_dict(), "published": n, **extra}


def run_gnsq(spec: dict[str, Any]) -> dict[str, Any]:
    """gnsq's Producer (gevent): blocking ``publish``/``multipublish``; pipelined:
    ``publish(raise_error=False)`` returns an AsyncResult; eight publishers are greenlets."""
    import logging

    import gevent
    import gnsq

    logging.getLogger("gnsq").setLevel(logging.ERROR)
    body = common.message_body(spec["size"])
    topic, n, publishers, batch = spec["topic"], spec["n"], spec["publishers"], spec["batch"]
    producer = gnsq.Producer([spec["tcp"]])
    window = common.CpuWindow(spec["broker_pid"])
    extra: dict[str, Any] = {}
    with common.maybe_profile(spec):
        producer.start()
        try:
            producer.publish(topic + "_warmup", body, timeout=30.0)
            if batch > 1:
                shares = [
                    _share_batches(c, batch, body) for c in _split_publishers(n, publishers, batch)
                ]

                def multipublish(batches: list[list[bytes]]) -> None:
                    for bodies in batches:
                        producer.multipublish(topic, bodies)

                window.start()
                if publishers == 1:
                    multipublish(shares[0])
                else:
                    greenlets = [gevent.spawn(multipublish, share) for share in shares]
                    gevent.joinall(greenlets, timeout=600.0, raise_error=True)
            elif publishers == 0:
                window.start()
                results = [producer.publish(topic, body, raise_error=False) for _ in range(n)]
                for result in results:
                    result.get(timeout=600.0)
            elif publishers == 1:
                extra = _one_at_a_time(window, n, producer.publish, topic, body)
            else:

                def publish(count: int) -> None:
                    for _ in range(count):
                        producer.publish(topic, body)

                greenlets = [gevent.spawn(publish, c) for c in _split(n, publishers)]
                window.start()
                gevent.joinall(greenlets, timeout=600.0, raise_error=True)
            window.stop()
        finally:
            producer.close()
            producer.join(10.0)
    return {**window.as_dict(), "published": n, **extra}


def run_nsq_py(spec: dict[str, Any]) -> dict[str, Any]:
    """nsq-py's Client, in its own virtualenv: ``pub(topic, body)`` and ``mpub(topic, *bodies)``
    queue the command and run the client's select() loop until an answer comes, so each waits
    for its OK.  nsq-py has no pipelined publish, and a Client is not for several threads at
    once (an answer goes to whichever caller's loop reads it): one publisher only."""
    import logging

    import nsq
    from nsq.client import Client
    from nsq.response import Error

    if getattr(nsq, "__version__", None) != spec["nsq_py_version"]:
        return {"error": f"nsq is {nsq.__file__} {getattr(nsq, '__version__', '?')}, not nsq-py"}
    logging.getLogger("nsq").setLevel(logging.WARNING)
    body = common.message_body(spec["size"])
    # nsq-py 0.1.12 puts the topic into the command as it is given: bytes
    topic, n, publishers, batch = (
        spec["topic"].encode(),
        spec["n"],
        spec["publishers"],
        spec["batch"],
    )
    if publishers != 1:
        return {"error": f"{NSQ_PY}: one publisher only, not {publishers}"}

    def checked(answers: list[Any]) -> None:
        if not answers or isinstance(answers[0], Error) or answers[0].data != b"OK":
            raise RuntimeError(f"publish answered {[str(a) for a in answers]}")

    def pub(topic: bytes, body: bytes) -> None:
        checked(client.pub(topic, body))

    client = Client(nsqd_tcp_addresses=[spec["tcp"]])  # connects here
    window = common.CpuWindow(spec["broker_pid"])
    extra: dict[str, Any] = {}
    try:
        with common.maybe_profile(spec):
            pub(topic + b"_warmup", body)
            if batch > 1:
                batches = _share_batches(n, batch, body)
                window.start()
                for bodies in batches:
                    checked(client.mpub(topic, *bodies))
            else:
                extra = _one_at_a_time(window, n, pub, topic, body)  # type: ignore[arg-type]
            window.stop()
    except RuntimeError as exc:
        return {"error": str(exc)}
    finally:
        # Client.close() is map(self.remove, ...): lazy under Python 3, it closes nothing
        for conn in client.connections():
            conn.close()
    return {**window.as_dict(), "published": n, **extra}


def run_socket(spec: dict[str, Any]) -> dict[str, Any]:
    """The floor: one thread, one blocking socket, ``publishers`` commands in flight."""
    import socket

    from nsqclient import protocol

    host, _, port = spec["tcp"].rpartition(":")
    body = common.message_body(spec["size"])
    topic, n, window_size, batch = spec["topic"], spec["n"], spec["publishers"], spec["batch"]
    if window_size == 0:  # pipelined: many commands in flight
        window_size = SOCKET_PIPELINE_WINDOW
    # MPUB batches are encoded as they are sent (a client is handed bodies, not a command)
    items: list[Any]
    if batch > 1:
        items = _share_batches(n, batch, body)
    else:
        items = [protocol.pub(topic, body)] * n

    def encoded(chunk: list[Any]) -> bytes:
        if batch > 1:
            return b"".join([protocol.mpub(topic, bodies) for bodies in chunk])
        return b"".join(chunk)

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
    if window_size == 1 and batch == 1:  # one at a time: keep every latency
        latencies = []
        clock = time.perf_counter
        command = items[0]
        window.start()
        for _ in range(n):
            t0 = clock()
            sock.sendall(command)
            answers()
            latencies.append(clock() - t0)
        window.stop()
        sock.close()
        return {**window.as_dict(), "published": n, **common.latency_summary(latencies)}
    window.start()
    sent = min(window_size, len(items))
    sock.sendall(encoded(items[:sent]))
    while acked < len(items):
        got = len(answers())
        acked += got
        more = items[sent : sent + got]
        if more:
            sock.sendall(encoded(more))
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
            direct = not queued[0] and send_lock.acquire(False)
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

    latencies: list[float] = []

    def publish(count: int) -> None:
        batches = _share_batches(count, batch, body) if batch > 1 else []
        go.wait(30.0)
        if batches:
            for bodies in batches:
                request(protocol.mpub(topic, bodies))
            return
        command = protocol.pub(topic, body)
        if publishers == 1:
            clock = time.perf_counter
            for _ in range(count):
                t0 = clock()
                request(command)
                latencies.append(clock() - t0)
            return
        for _ in range(count):
            request(command)

    window = common.CpuWindow(spec["broker_pid"])
    if batch > 1 and publishers == 1:
        batches = _share_batches(n, batch, body)
        window.start()
        for bodies in batches:
            request(protocol.mpub(topic, bodies))
    else:
        workers = [
            threading.Thread(target=publish, args=(c,))
            for c in _split_publishers(n, publishers, batch)
        ]
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
    extra = common.latency_summary(latencies) if latencies else {}
    return {**window.as_dict(), "published": n, **extra}


def child_main(spec: dict[str, Any]) -> None:
    run = {
        "nsqclient": run_nsqclient,
        "pynsq": run_pynsq,
        "socket": run_socket,
        "threads": run_threads,
        "gnsq": run_gnsq,
        NSQ_PY: run_nsq_py,
    }[spec["client"]]
    common.emit_result(run(spec))


# ------------------------------------------------------------------------------ parent


def case_messages(args: argparse.Namespace, case: str) -> int:
    return {
        "pipelined": args.pipelined_messages,
        "pub x1": args.messages,
        "pub x8": args.messages,
        "mpub x200": args.mpub_messages,
        MPUB_PER_CPU: args.mpub_messages,
    }[case]


def measure(
    args: argparse.Namespace,
    broker: common.Broker,
    case: str,
    client: str,
    python: str | None = None,
) -> dict[str, Any]:
    """One client, one case, in a child (run by ``python``, a peer's virtualenv, when given);
    nsqd's /stats must count every message."""
    if client == "bench_writer":
        return measure_bench_writer(args, broker, case)
    publishers, batch = CASES.get(case, (0, 1))  # "memory": pub_async, windowed
    memory = case == "memory"
    n = args.rss_messages if memory else case_messages(args, case)
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
        "memory": memory,
        "nsq_py_version": common.NSQ_PY_VERSION,
        **common.profile_spec(args, client),
        "broker_pid": broker.pid,
    }
    result = common.run_child(__file__, spec, timeout=args.child_timeout, python=python)
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
    result["rate"] = n / result["seconds"]
    result["us_per_msg"] = result["cpu"] / n * 1e6
    latency = (
        f"; latency p50 {result['p50_us']:.0f} us, p99 {result['p99_us']:.0f} us"
        if "p50_us" in result
        else ""
    )
    print(
        f"  {case:10} {client:12} {n:>9,} msgs in {result['seconds']:7.2f}s = "
        f"{result['rate']:>10,.0f} msg/s, {common.describe_cpu(result, n)}{latency}; "
        f"nsqd counted {counted:,}",
        file=sys.stderr,
    )
    return result


def measure_bench_writer(args: argparse.Namespace, broker: common.Broker, case: str) -> dict:
    """go-nsq's bench_writer (one connection per CPU, each MPUBing batches and waiting for the
    OK) for ``--go-runfor`` seconds."""
    tool = common.go_tool(args, "bench_writer")
    assert tool is not None
    batch = CASES[case][1]
    topic = common.fresh_topic(case.replace(" ", ""), "bench_writer")
    out = common.run_go_tool(
        [
            tool,
            f"--nsqd-tcp-address={broker.tcp_address}",
            f"--topic={topic}",
            f"--runfor={args.go_runfor}s",
            f"--size={args.size}",
            f"--batch-size={batch}",
        ],
        timeout=args.go_runfor + 60.0,
    )
    counted = common.topic_message_count(broker.http_address, topic)
    common.delete_topic(broker.http_address, topic)
    result = common.go_tool_result(out, args.go_runfor, counted)
    print(
        f"  {case:10} {'bench_writer':12} {counted:>9,} msgs in {args.go_runfor:7.2f}s = "
        f"{out['rate']:>10,.0f} msg/s, {result['us_per_msg'] or 0:5.1f} us CPU/msg (whole "
        f"process); nsqd counted {counted:,}",
        file=sys.stderr,
    )
    return result


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = common.argument_parser(
        __doc__, 20_000, "messages per client in the pub x1 and pub x8 cases (default 20000)"
    )
    parser.add_argument(
        "--pipelined-messages",
        type=int,
        default=100_000,
        help="messages per client in the pipelined case (default 100000)",
    )
    parser.add_argument(
        "--mpub-messages",
        type=int,
        default=1_000_000,
        help="messages per client in the mpub case (default 1000000)",
    )
    common.add_go_tool_arguments(
        parser,
        "bench_writer",
        "one more nsqclient run of this many pub_async (at most 10,000 unanswered) for the "
        "resident memory growth, once after the repeats; 0: none",
    )
    common.add_size_argument(parser)
    common.add_cases_argument(parser, CASES, f"comma-separated subset of {list(CASES)}")
    common.add_clients_argument(parser, CLIENTS, "bench_writer")
    common.add_peer_venv_argument(parser)
    common.add_run_arguments(parser)
    args = parser.parse_args(argv)
    common.apply_quick(args, messages=500, pipelined_messages=2000, mpub_messages=4000)
    args.case_list = common.choice_list(parser, args.cases, CASES, "case")
    args.client_list = common.choice_list(parser, args.clients, CLIENTS, "client")
    if min(args.messages, args.pipelined_messages, args.mpub_messages, args.repeat) < 1:
        parser.error("message counts and --repeat must be positive")
    return args


def _latency(r: dict[str, Any] | None) -> str:
    if not r or "p50_us" not in r:
        return "-"
    return f"{r['p50_us']:.0f} / {r['p99_us']:.0f} us"


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest run; for latencies, the lowest p50 and the lowest p99 over the runs."""
    best = dict(max(runs, key=lambda r: r["rate"]))
    for key in ("p50_us", "p90_us", "p99_us", "max_us"):
        values = [r[key] for r in runs if key in r]
        if values:
            best[key] = min(values)
    return best


def main(argv: list[str]) -> int:
    if common.run_as_child(argv, child_main):
        return 0
    args = parse_args(argv)
    skipped: list[str] = []
    clients = list(args.client_list)
    if "gnsq" in clients and (problem := common.gnsq_problem()):
        clients.remove("gnsq")
        skipped.append(f"gnsq: {problem}")
    if "bench_writer" in clients and not common.go_tool(args, "bench_writer"):
        clients.remove("bench_writer")
        skipped.append("go-nsq bench_writer: not in NSQ_BIN_DIR / --bin-dir")
    pythons: dict[str, str] = {}
    if NSQ_PY in clients and {"pub x1", "mpub x200"} & set(args.case_list):
        python, problem = common.nsq_py_python(args)
        if python is None:
            clients.remove(NSQ_PY)
            skipped.append(f"{NSQ_PY} {common.NSQ_PY_VERSION}: {problem}")
        else:
            pythons[NSQ_PY] = python
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    mem_queue = args.mem_queue_size or (
        max(args.messages, args.pipelined_messages, args.mpub_messages, args.rss_messages) + 1000
    )
    with common.open_broker(args, mem_queue_size=mem_queue) as broker:
        print(
            f"publish benchmark: {broker.description}; {common.describe_machine()}; "
            f"{args.size}-byte messages; pipelined n={args.pipelined_messages:,}, pub "
            f"n={args.messages:,}, mpub n={args.mpub_messages:,}; best of {args.repeat}, "
            "interleaved",
            file=sys.stderr,
        )
        common.print_not_measured(skipped)
        for _ in range(args.repeat):
            for case in args.case_list:
                for client in CASE_CLIENTS[case]:
                    if client in clients:
                        runs.setdefault((case, client), []).append(
                            measure(args, broker, case, client, pythons.get(client))
                        )
        memory = None
        if args.rss_messages and "nsqclient" in clients:
            print(
                f"  memory run: nsqclient, {args.rss_messages:,} pub_async",
                file=sys.stderr,
            )
            memory = measure(args, broker, "memory", "nsqclient")
    best = {key: _best(results) for key, results in runs.items()}

    def get(case: str, client: str) -> dict[str, Any] | None:
        return best.get((case, client))

    def rate(case: str, client: str) -> float | None:
        r = get(case, client)
        return r["rate"] if r else None

    def row(
        case: str, label: str, cell: Any, tool: str, compared: str, target: str, met: str
    ) -> list[str]:
        """A row of the table: ``cell`` of each client's best run of ``case``."""
        clients = [cell(get(case, client)) for client in ("nsqclient", "pynsq", "gnsq", NSQ_PY)]
        floor = f"socket {cell(get(case, 'socket'))}"
        return [label, *clients, tool, floor, compared, target, met]

    common.print_report_intro(
        f"### publish: {args.size}-byte messages, best of {args.repeat} (interleaved); "
        f"pipelined x{args.pipelined_messages:,}, pub x{args.messages:,}, "
        f"MPUB {args.mpub_messages:,} messages",
        broker,
        "cells: msg/s (CPU us/msg = publisher process CPU time / messages, all its threads); "
        "latency: best p50 / best p99 over the runs",
    )
    cell = common.rate_cell
    rows = []
    if "pipelined" in args.case_list:
        r = common.ratio(rate("pipelined", "nsqclient"), rate("pipelined", "pynsq"))
        rg = common.ratio(rate("pipelined", "nsqclient"), rate("pipelined", "gnsq"))
        rows.append(
            row(
                "pipelined",
                f"pipelined from one thread (pub_async x{args.pipelined_messages:,}, then wait)",
                cell,
                "-",
                f"{common.fmt_x(r)} pynsq, {common.fmt_x(rg)} gnsq",
                ">= 4x pynsq",
                common.target_check(r, 4.0),
            )
        )
    if "pub x1" in args.case_list:
        ours, floor = get("pub x1", "nsqclient"), get("pub x1", "socket")
        p50 = common.ratio(ours and ours["p50_us"], floor and floor["p50_us"])
        p99 = common.ratio(ours and ours["p99_us"], floor and floor["p99_us"])
        met = "-"
        if p50 is not None and p99 is not None:
            met = "ok" if p50 <= 1.5 and p99 <= 2.0 else "MISS"
        rows.append(
            row(
                "pub x1",
                "one blocking pub() at a time: latency p50 / p99",
                _latency,
                "-",
                f"p50 {common.fmt_x(p50)}, p99 {common.fmt_x(p99)} socket",
                "p50 <= 1.5x, p99 <= 2x socket",
                met,
            )
        )
        r = common.ratio(rate("pub x1", "nsqclient"), rate("pub x1", "pynsq"))
        rn = common.ratio(rate("pub x1", "nsqclient"), rate("pub x1", NSQ_PY))
        rows.append(
            row(
                "pub x1",
                "one blocking pub() at a time: rate",
                cell,
                "-",
                f"{common.fmt_x(r)} pynsq, {common.fmt_x(rn)} {NSQ_PY}",
                "-",
                "-",
            )
        )
    if "pub x8" in args.case_list:
        r = common.ratio(rate("pub x8", "nsqclient"), rate("pub x8", "pynsq"))
        rows.append(
            row(
                "pub x8",
                "8 threads sharing one Producer, pub() (pynsq: 8 callback chains)",
                cell,
                "-",
                f"{common.fmt_x(r)} pynsq",
                ">= 1x pynsq",
                common.target_check(r, 1.0),
            )
        )
    mpub_labels = {
        "mpub x200": "MPUB x200, one publisher",
        MPUB_PER_CPU: f"MPUB x200, {CPUS} publishers (bench_writer's one per CPU)",
    }
    for case, label in mpub_labels.items():
        if case not in args.case_list:
            continue
        r = common.ratio(rate(case, "nsqclient"), rate(case, "bench_writer"))
        rp = common.ratio(rate(case, "nsqclient"), rate(case, "pynsq"))
        rn = common.ratio(rate(case, "nsqclient"), rate(case, NSQ_PY))
        rows.append(
            row(
                case,
                label,
                cell,
                "bench_writer " + cell(get(case, "bench_writer")),
                f"{common.fmt_x(r)} bench_writer, {common.fmt_x(rp)} pynsq"
                + (f", {common.fmt_x(rn)} {NSQ_PY}" if NSQ_PY in CASE_CLIENTS[case] else ""),
                ">= 0.85x bench_writer",
                common.target_check(r, 0.85),
            )
        )
    headers = common.comparison_headers("go-nsq tool", "floor", "ratio", "target", "met")
    print(common.markdown_table(headers, rows))
    common.print_not_measured(skipped, report=True)
    print()
    print("every client, msg/s (best run); latency p50/p99 where kept")
    print()
    matrix = []
    for case in args.case_list:
        for client in CASE_CLIENTS[case]:
            r = get(case, client)
            if r:
                matrix.append([case, client, cell(r), _latency(r)])
    print(common.markdown_table(["case", "client", "msg/s (CPU us/msg)", "p50 / p99"], matrix))
    if memory is not None:
        rss = memory["rss_kib"]
        print()
        print(
            f"resident memory of the publisher over {args.rss_messages:,} pub_async "
            f"(at most {MEMORY_WINDOW:,} unanswered), MiB; {memory['rate']:,.0f} msg/s"
        )
        print()
        points = [p for p in RSS_POINTS if p in rss]
        growth = (rss["100%"] - rss["before start"]) / 1024
        steady = (rss["100%"] - rss["25%"]) / 1024
        print(
            common.markdown_table(
                [*points, "before->100%", "25%->100%"],
                [[*(f"{rss[p] / 1024:.1f}" for p in points), f"{growth:+.1f}", f"{steady:+.1f}"]],
            )
        )
        common.print_rss_growth(f"{args.rss_messages:,} pub_async", "before", growth)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
