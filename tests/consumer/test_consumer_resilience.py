"""Consumer threads that must not fail quietly or hold each other up: a hung nsqd beside a
healthy one, unexpected errors inside the discovery and RDY loops, a second Ctrl-C during the
drain, and nsqd refusing a FIN.

Waiting is on conditions with deadlines; ``Event.wait(timeout)`` in a handler is its load.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from nsqclient.consumer import _discovery as discovery_module
from nsqclient.consumer import _rdy_balancer as rdy_balancer_module
from nsqclient.message import Message
from nsqclient.testing.helpers import channel_stats, publish, wait_drained
from nsqclient.testing.waiting import wait_for

#: Seconds: the bound of every wait; reached only when something is broken.
TIMEOUT = 10.0


@pytest.fixture
def hung_nsqd() -> Iterator[str]:
    """``host:port`` of a peer that accepts and never answers the handshake."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"127.0.0.1:{s.getsockname()[1]}"


def test_a_hung_nsqd_does_not_delay_a_healthy_one(nsqd, consumers, hung_nsqd):
    node = nsqd.nsqd
    bodies = [b"%d" % i for i in range(10)]
    publish(node, "c_hung", bodies)
    got: list[bytes] = []
    # The hung peer comes first and its handshake may take 60 s: connecting to it must not
    # hold up the healthy nsqd.
    consumers(
        "c_hung",
        "ch",
        lambda m: got.append(m.body),
        nsqd_tcp_addresses=[hung_nsqd, node.tcp_address],
        handshake_timeout=60.0,
        max_in_flight=10,
    )
    wait_for(lambda: sorted(got) == sorted(bodies), TIMEOUT, message=lambda: f"got {got}")


def test_an_unexpected_error_in_discovery_is_logged_and_discovery_goes_on(
    nsqd, consumers, monkeypatch, caplog
):
    node = nsqd.nsqd
    publish(node, "c_disc_err", [b"x"])
    original = discovery_module.Discovery._due_reconnects
    failures = iter([RuntimeError("discovery bug")])

    def due_reconnects(self: Any, now: float) -> list[str]:
        for exc in failures:
            raise exc
        return original(self, now)

    monkeypatch.setattr(discovery_module.Discovery, "_due_reconnects", due_reconnects)
    got: list[bytes] = []
    consumers("c_disc_err", "ch", lambda m: got.append(m.body), nsqd_tcp_addresses=node.tcp_address)
    wait_for(lambda: got == [b"x"], TIMEOUT)
    [record] = [r for r in caplog.records if "discovery" in r.getMessage()]
    assert record.levelno == logging.ERROR and record.exc_info is not None
    assert "discovery bug" in str(record.exc_info[1])


def test_an_unexpected_error_in_the_rdy_loop_is_logged_and_it_goes_on(
    nsqd, consumers, monkeypatch, caplog
):
    node = nsqd.nsqd
    original = rdy_balancer_module.rdy_targets
    calls = {"n": 0}

    def rdy_targets(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("rdy bug")
        return original(*args, **kwargs)

    monkeypatch.setattr(rdy_balancer_module, "rdy_targets", rdy_targets)
    got: list[bytes] = []
    consumers(
        "c_rdy_err",
        "ch",
        lambda m: got.append(m.body),
        nsqd_tcp_addresses=node.tcp_address,
        rdy_redistribute_interval=0.05,
    )
    publish(node, "c_rdy_err", [b"y"])
    wait_for(lambda: got == [b"y"], TIMEOUT)
    [record] = [r for r in caplog.records if "RDY" in r.getMessage()]
    assert record.levelno == logging.ERROR and "rdy bug" in str(record.exc_info[1])


def test_unexpected_errors_connecting_are_logged_and_retried(nsqd, consumers, monkeypatch, caplog):
    node = nsqd.nsqd
    publish(node, "c_conn_err", [b"z"])
    original = discovery_module.Discovery._subscribe
    failures = iter([ValueError("connect bug")])

    def subscribe(self: Any, conn: Any, direct: bool) -> None:
        for exc in failures:
            raise exc
        original(self, conn, direct)

    monkeypatch.setattr(discovery_module.Discovery, "_subscribe", subscribe)
    got: list[bytes] = []
    consumers(
        "c_conn_err",
        "ch",
        lambda m: got.append(m.body),
        nsqd_tcp_addresses=node.tcp_address,
        reconnect_interval=0.01,
    )
    wait_for(lambda: got == [b"z"], TIMEOUT)
    [record] = [r for r in caplog.records if "unexpected error connecting" in r.getMessage()]
    assert "connect bug" in str(record.exc_info[1])


# ------------------------------------------------------------------------------------------------
# A FIN nsqd refuses


def test_a_refused_fin_is_counted_apart_and_logged_once(nsqd, consumers, caplog):
    node = nsqd.nsqd
    release = threading.Event()
    deliveries: list[Message] = []

    def handler(message: Message) -> None:
        deliveries.append(message)
        if len(deliveries) == 1:
            release.wait(TIMEOUT * 2)  # load: held past msg_timeout, until nsqd redelivered it

    c = consumers(
        "c_fin_failed",
        "ch",
        handler,
        nsqd_tcp_addresses=node.tcp_address,
        msg_timeout=1.0,
        concurrency=2,
        max_in_flight=2,
    )
    publish(node, "c_fin_failed", [b"slow"])
    wait_for(lambda: len(deliveries) == 2, TIMEOUT * 2, message=lambda: f"{deliveries}")
    wait_for(lambda: c.stats()["finished"] == 1, TIMEOUT)
    release.set()
    wait_for(lambda: c.stats()["finish_failed"] == 1, TIMEOUT)
    stats = c.stats()
    assert stats["finished"] == 1 and stats["received"] == 2
    logged = [r for r in caplog.records if "E_FIN_FAILED" in r.getMessage()]
    assert len(logged) == 1, [r.getMessage() for r in logged]
    wait_drained(node, "c_fin_failed", "ch")


# ------------------------------------------------------------------------------------------------
# Ctrl-C twice


RUN_SCRIPT = """
import logging, sys, threading
import nsqclient
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
never = threading.Event()
say = threading.Lock()  # two handlers print at once: keep each line whole

def handler(message):
    with say:
        print("handling", message.body.decode(), flush=True)
    never.wait(600)   # a handler that does not finish by itself

consumer = nsqclient.Consumer(
    "c_sigint", "ch", handler, nsqd_tcp_addresses=[sys.argv[1]], max_in_flight=10,
    concurrency=2,
)
consumer.run()
print("run returned", flush=True)
"""


def test_a_second_sigint_requeues_everything_and_exits_without_a_traceback(nsqd):
    node = nsqd.nsqd
    publish(node, "c_sigint", [b"%d" % i for i in range(10)])
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(RUN_SCRIPT), node.tcp_address],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        handling = [proc.stdout.readline(), proc.stdout.readline()]
        assert all(line.startswith("handling") for line in handling), handling
        wait_for(
            lambda: (channel_stats(node, "c_sigint", "ch") or {}).get("in_flight_count") == 10,
            TIMEOUT,
        )
        os.kill(proc.pid, signal.SIGINT)
        stderr_lines: list[str] = []
        while True:
            line = proc.stderr.readline()
            assert line, "".join(stderr_lines)
            stderr_lines.append(line)
            if "draining" in line:
                break
        assert "draining 10 messages" in line and "SIGINT again" in line
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(TIMEOUT)
    err = "".join(stderr_lines) + err
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "run returned" in out
    stats = wait_drained(node, "c_sigint", "ch", depth=10)
    assert stats["requeue_count"] == 10


def test_stop_from_a_hook_before_start_has_started_every_thread(nsqd, consumers, monkeypatch):
    # The connection (and its on_connect hook) may come before start() has started the RDY
    # thread: stop() from the hook must wait for start() rather than join an unstarted thread.
    node = nsqd.nsqd
    hook_called = threading.Event()
    outcome: list[BaseException | None] = []
    holder: list[Any] = []
    original_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        if self.name.startswith("nsq-rdy-"):
            assert hook_called.wait(TIMEOUT), "the hook never ran"
        original_start(self)

    def hook(address: str) -> None:
        hook_called.set()
        try:
            holder[0].stop(timeout=TIMEOUT)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - checked below
            outcome.append(exc)

    monkeypatch.setattr(threading.Thread, "start", start)
    consumer = consumers(
        "c_early_stop",
        "ch",
        lambda m: None,
        start=False,
        nsqd_tcp_addresses=node.tcp_address,
        on_connect=hook,
    )
    holder.append(consumer)
    consumer.start()
    wait_for(lambda: outcome, TIMEOUT)
    assert outcome == [None]
    assert not consumer.is_running


def test_stop_waits_for_messages_taken_over_with_enable_async(nsqd, consumers):
    node = nsqd.nsqd
    held: list[Message] = []

    def handler(message: Message) -> None:
        message.enable_async()
        held.append(message)

    c = consumers(
        "c_async_stop", "ch", handler, nsqd_tcp_addresses=node.tcp_address, max_in_flight=10
    )
    publish(node, "c_async_stop", [b"%d" % i for i in range(5)])
    wait_for(lambda: len(held) == 5, TIMEOUT)
    stopper = threading.Thread(target=c.stop, kwargs={"timeout": TIMEOUT * 2})
    stopper.start()
    wait_for(lambda: c._stopping.is_set(), TIMEOUT)
    # stop() is under way and must keep the connection open while the batch is held.
    [conn] = c.connections()
    assert not conn.wait_closed(0.5), "stop() closed the connection under held messages"
    assert stopper.is_alive()
    for message in held:
        message.finish()
    stopper.join(TIMEOUT)
    assert not stopper.is_alive()
    assert c.stats()["finished"] == 5
    stats = wait_drained(node, "c_async_stop", "ch")
    assert stats["requeue_count"] == 0 and stats["timeout_count"] == 0
