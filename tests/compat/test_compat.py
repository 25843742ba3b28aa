"""The pynsq drop-in (nsqclient.compat): legacy Reader/Writer/run programs against a broker."""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import signal
import socket
import ssl
import subprocess
import sys
import threading
from concurrent.futures import Future

import pytest

import nsqclient
from nsqclient import compat
from nsqclient.config import identify_payload
from nsqclient.errors import ConnectionClosedError, NSQError, ProtocolError, ServerError
from nsqclient.producer._producer import Producer
from nsqclient.testing import helpers
from nsqclient.testing.waiting import wait_for

EXAMPLE = os.path.join(
    os.path.dirname(__file__), os.pardir, os.pardir, "examples", "pynsq_reader.py"
)


# ---------------------------------------------------------------------------- helpers


@pytest.fixture(autouse=True)
def clean_registry():
    """Every test leaves no Reader or Writer registered and no run() state behind."""
    yield
    compat._shutdown(timeout=5.0)
    assert not compat._registry.running, "a test left nsq.run() running"
    compat._registry.stop_requested.clear()


def publish(cluster, topic, bodies):
    with Producer(cluster.nsqd.tcp_address) as producer:
        producer.mpub(topic, list(bodies))


def channel_stats(cluster, topic, channel):
    return helpers.channel_stats(cluster.nsqd, topic, channel)


def drained(cluster, topic, channel):
    """True once nsqd holds nothing for the channel: every message was FINished."""
    c = channel_stats(cluster, topic, channel)
    return (
        c is not None
        and c["depth"] == 0
        and c["in_flight_count"] == 0
        and (c["deferred_count"] == 0)
    )


class Runner:
    """nsq.run() on a thread (run() installs signal handlers only on the main thread)."""

    def __init__(self):
        self.error = None
        self.thread = threading.Thread(target=self._run, name="test-nsq-run", daemon=True)
        self.thread.start()

    def _run(self):
        try:
            # Threads mode, explicitly: this process may have imported tornado (pynsq's own
            # modules are imported for byte comparisons), which would make run() choose the
            # IOLoop.  The tornado mode is tested in compat/test_pynsq_tornado.py, in subprocesses.
            compat.run(tornado=False)
        except BaseException as exc:  # reported by join()
            self.error = exc

    def join(self, timeout=40.0):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "nsq.run() did not return"
        if self.error is not None:
            raise self.error


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------- Reader + run()


def test_legacy_reader_consumes_and_stop_ends_run(nsqd):
    bodies = [b"m%d" % i for i in range(10)]
    publish(nsqd, "legacy", bodies)
    got = []
    threads = set()

    def handler(message):
        got.append(message.body)
        threads.add(threading.current_thread().name)
        if len(got) == len(bodies):
            compat.stop()  # as a pynsq program stopped its IOLoop from a handler
        return True

    reader = compat.Reader(
        topic="legacy",
        channel="archive",
        message_handler=handler,
        nsqd_tcp_addresses=[nsqd.nsqd.tcp_address],
        max_in_flight=4,
    )
    runner = Runner()
    runner.join()
    assert sorted(got) == sorted(bodies)
    assert not any(name.startswith(("nsq-reader", "nsq-writer")) for name in threads), threads
    # run() stopped the Reader cleanly and unregistered it; every message was FINished.
    assert not reader.consumer.is_running
    assert compat._registry.snapshot() == ([], [])
    wait_for(lambda: drained(nsqd, "legacy", "archive"), message="messages left in nsqd")


def test_reader_via_lookupd_and_reader_made_while_running(nsqd):
    publish(nsqd, "early", [b"e"])
    publish(nsqd, "late", [b"l"])
    seen = queue.Queue()

    def handler(message):
        seen.put(message.body)
        return True

    compat.Reader("early", "c", handler, lookupd_http_addresses=[nsqd.lookupd.http_url])
    runner = Runner()
    assert seen.get(timeout=15) == b"e"
    # A Reader made after run() started is started by run() too (pynsq: IOLoop callback).
    compat.Reader("late", "c", handler, lookupd_http_addresses=nsqd.lookupd.http_address)
    assert seen.get(timeout=15) == b"l"
    compat.stop()
    runner.join()


def test_stop_before_run_makes_run_return(nsqd):
    reader = compat.Reader("idle", "c", lambda m: True, nsqd_tcp_addresses=nsqd.nsqd.tcp_address)
    compat.stop()
    runner = Runner()
    runner.join()
    assert reader._closed
    assert compat._registry.snapshot() == ([], [])


def test_run_refuses_a_reader_without_handler(nsqd):
    compat.Reader("nohandler", "c", nsqd_tcp_addresses=nsqd.nsqd.tcp_address)
    runner = Runner()
    with pytest.raises(RuntimeError, match="no message_handler"):
        runner.join()


def test_example_program_exits_cleanly_on_sigterm(nsqd):
    publish(nsqd, "example", [b"first", b"second", b"third"])
    proc = subprocess.Popen(
        [
            sys.executable,
            "-u",
            EXAMPLE,
            "--topic",
            "example",
            "--nsqd-tcp-address",
            nsqd.nsqd.tcp_address,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = queue.Queue()

    def read_stdout():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)  # EOF

    reader = threading.Thread(target=read_stdout, name="test-stdout", daemon=True)
    reader.start()
    try:
        messages = []
        while len(messages) < 3:
            line = lines.get(timeout=20)
            assert line is not None, f"the example exited early: {proc.stderr.read()}"
            if line.startswith("message"):
                messages.append(line)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=40) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    reader.join(10)
    rest = []
    while not lines.empty():
        line = lines.get_nowait()
        if line is not None:
            rest.append(line)
    stderr = proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    assert sorted(m.split("body=")[1].strip() for m in messages) == ["first", "second", "third"]
    assert all("attempts=1" in m for m in messages)
    assert rest[-1:] == ["stopped\n"], (rest, stderr)
    assert "Traceback" not in stderr, stderr
    wait_for(lambda: drained(nsqd, "example", "pynsq_reader"), message="messages left in nsqd")


# ---------------------------------------------------------------------------- message handling


def test_giving_up_override(nsqd):
    publish(nsqd, "doomed", [b"poison"])
    attempts = []
    given_up = queue.Queue()

    class ArchiveReader(compat.Reader):
        def giving_up(self, message):
            given_up.put((message.body, message.attempts, threading.current_thread().name))

    def handler(message):
        attempts.append(message.attempts)
        message.requeue(time_ms=0, backoff=False)

    reader = ArchiveReader(
        "doomed", "c", handler, nsqd_tcp_addresses=nsqd.nsqd.tcp_address, max_tries=2
    )
    reader.start()
    body, attempt, thread = given_up.get(timeout=15)
    assert (body, attempt) == (b"poison", 3)
    assert attempts == [1, 2]
    assert thread.startswith("nsq-worker")
    # After giving_up the message is FINished, as pynsq does.
    wait_for(lambda: drained(nsqd, "doomed", "c"), message="the message was not finished")
    reader.close()


@pytest.mark.parametrize("how", ["requeue_time_ms_0", "return_false_requeue_delay_0"])
def test_requeue_redelivers_with_attempts_2(nsqd, how):
    publish(nsqd, "again", [b"retry-me"])
    seen = []
    done = threading.Event()

    def handler(message):
        seen.append((message.id, message.attempts))
        if message.attempts == 1:
            if how == "requeue_time_ms_0":
                message.requeue(time_ms=0)
                return None  # answered already: the return value is not looked at
            return False  # REQ with requeue_delay x attempts = 0 ms
        done.set()
        return True

    reader = compat.Reader(
        "again",
        "c",
        handler,
        nsqd_tcp_addresses=[nsqd.nsqd.tcp_address],
        max_backoff_duration=0.1,  # the requeue counts as a failure: keep its pause short
        requeue_delay=0,
    )
    reader.start()
    assert done.wait(15)
    assert [a for _, a in seen] == [1, 2]
    assert seen[0][0] == seen[1][0]
    wait_for(lambda: drained(nsqd, "again", "c"), message="the message was not finished")
    reader.close()


def test_handler_returning_none_is_requeued_after_msg_timeout(nsqd, caplog):
    publish(nsqd, "ambiguous", [b"x"])
    handled = threading.Event()

    def handler(message):
        handled.set()
        return None  # pynsq: "ambiguous return value", the message stays in flight

    reader = compat.Reader(
        "ambiguous", "c", handler, nsqd_tcp_addresses=nsqd.nsqd.tcp_address, msg_timeout=30
    )
    with caplog.at_level(logging.ERROR, logger="nsqclient.compat"):
        reader.start()
        assert handled.wait(10)
        wait_for(lambda: reader.consumer.stats()["requeued"] == 1)
    assert any("returned None" in r.getMessage() for r in caplog.records)
    # the delay is the msg_timeout nsqd gave the connection (IDENTIFY asked for 30 s)
    assert any("requeueing it in 30.0s" in r.getMessage() for r in caplog.records)
    assert reader.consumer.stats()["backoff_level"] == 0  # requeued without backoff
    # nsqd holds it deferred (for msg_timeout), not in flight: the slot was freed at once.
    wait_for(
        lambda: (channel_stats(nsqd, "ambiguous", "c") or {}).get("deferred_count") == 1,
        message=lambda: f"not deferred: {channel_stats(nsqd, 'ambiguous', 'c')}",
    )
    assert channel_stats(nsqd, "ambiguous", "c")["in_flight_count"] == 0
    reader.close()


def test_preprocess_and_validate_hooks(nsqd):
    publish(nsqd, "hooks", [b"skip", b"keep"])
    processed = queue.Queue()
    validated = []

    class Hooked(compat.Reader):
        def preprocess_message(self, message):
            return message.body.upper()

        def validate_message(self, preprocessed):
            validated.append(preprocessed)
            return preprocessed != b"SKIP"

        def process_message(self, message):
            processed.put(message.body)  # the original message, as pynsq passes it
            return True

    reader = Hooked("hooks", "c", nsqd_tcp_addresses=nsqd.nsqd.tcp_address, max_in_flight=2)
    reader.start()  # no message_handler needed: process_message is overridden
    assert processed.get(timeout=10) == b"keep"
    wait_for(lambda: drained(nsqd, "hooks", "c"), message="skip was not finished")
    assert sorted(validated) == [b"KEEP", b"SKIP"]
    assert processed.empty()
    reader.close()


def test_coroutine_handler_and_future_handler(nsqd):
    publish(nsqd, "coro", [b"a"])
    publish(nsqd, "fut", [b"b"])
    ran = queue.Queue()

    async def coroutine_handler(message):
        await asyncio.sleep(0)
        ran.put(("coro", message.body))
        return True

    pool_done = []

    def future_handler(message):
        ran.put(("future", message.body))
        future = Future()
        threading.Thread(
            target=lambda: (pool_done.append(1), future.set_result(True)), name="test-completer"
        ).start()
        return future

    r1 = compat.Reader("coro", "c", coroutine_handler, nsqd_tcp_addresses=nsqd.nsqd.tcp_address)
    r2 = compat.Reader("fut", "c", future_handler, nsqd_tcp_addresses=nsqd.nsqd.tcp_address)
    r1.start()
    r2.start()
    assert sorted([ran.get(timeout=10), ran.get(timeout=10)]) == [
        ("coro", b"a"),
        ("future", b"b"),
    ]
    wait_for(lambda: drained(nsqd, "coro", "c") and drained(nsqd, "fut", "c"))
    r1.close()
    r2.close()


def test_close_from_inside_a_handler(nsqd):
    publish(nsqd, "selfclose", [b"only"])
    handled = threading.Event()
    holder = {}

    def handler(message):
        holder["reader"].close()  # must not deadlock joining its own worker
        handled.set()
        return True

    holder["reader"] = reader = compat.Reader(
        "selfclose", "c", handler, nsqd_tcp_addresses=nsqd.nsqd.tcp_address
    )
    reader.start()
    assert handled.wait(10)
    reader.wait_closed(30)
    assert not reader.consumer.is_running
    assert reader not in compat._registry.snapshot()[0]
    wait_for(lambda: drained(nsqd, "selfclose", "c"))


def test_max_in_flight_knobs_and_introspection(nsqd):
    publish(nsqd, "knobs", [b"first"])
    handled = threading.Event()

    def handler(message):
        handled.set()
        return True

    reader = compat.Reader(
        "knobs", "c", handler, nsqd_tcp_addresses=nsqd.nsqd.tcp_address, max_in_flight=6
    )
    assert reader.max_in_flight == 6
    reader.start()
    conns = wait_for(lambda: reader.conns, message="no connection")
    assert list(conns) == [nsqd.nsqd.tcp_address]
    assert reader.connection_max_in_flight() == 6
    assert reader._connection_max_in_flight() == 6
    # RDY 1 until the first message, then the full share (as pynsq).
    assert handled.wait(10)
    wait_for(lambda: reader.total_rdy == 6, message="RDY was not raised")
    assert reader.is_starved() is False
    reader.set_max_in_flight(0)
    assert reader.max_in_flight == 0
    wait_for(lambda: reader.total_rdy == 0, message="RDY 0 was not sent")
    reader.max_in_flight = 3  # some legacy code assigns the attribute
    wait_for(lambda: reader.total_rdy == 3)
    with pytest.raises(TypeError):
        reader.set_message_handler("not callable")
    reader.close()


def test_disabled_hook_pauses_and_resumes(nsqd, caplog):
    flag = {"disabled": False}

    class Switchable(compat.Reader):
        disabled_poll_interval = 0.02

        def disabled(self):
            return flag["disabled"]

    publish(nsqd, "switch", [b"first"])
    reader = Switchable(
        "switch", "c", lambda m: True, nsqd_tcp_addresses=nsqd.nsqd.tcp_address, max_in_flight=3
    )
    with caplog.at_level(logging.WARNING, logger="nsqclient.compat"):
        runner = Runner()
        wait_for(lambda: reader.total_rdy == 3, message="not started")
        flag["disabled"] = True
        wait_for(lambda: reader.max_in_flight == 0 and reader.total_rdy == 0)
        flag["disabled"] = False
        wait_for(lambda: reader.max_in_flight == 3 and reader.total_rdy == 3)
        compat.stop()
        runner.join()
    assert any("deprecated" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------------------- options


def test_pynsq_kwargs_reach_identify_in_nsqclient_units(nsqd):
    reader = compat.Reader(
        "units",
        "c",
        lambda m: True,
        nsqd_tcp_addresses=nsqd.nsqd.tcp_address,
        heartbeat_interval=7,  # seconds in pynsq and here
        output_buffer_timeout=150,  # MILLISECONDS in pynsq
        output_buffer_size=8192,
        msg_timeout=12,  # seconds in pynsq and here
        requeue_delay=3,
        sample_rate=10,
        timeout=2.5,
        user_agent="legacy-app/1.0",
        hostname="legacyhost.example.com",
        lookupd_poll_interval=30,
        low_rdy_idle_timeout=20,
    )
    cfg = reader.consumer.config
    assert cfg.heartbeat_interval == 7.0
    assert cfg.output_buffer_timeout == 0.15
    assert cfg.msg_timeout == 12.0
    assert cfg.default_requeue_delay == 3.0
    assert cfg.dial_timeout == 2.5
    assert cfg.lookupd_poll_interval == 30.0
    assert cfg.low_rdy_idle_timeout == 20.0
    assert cfg.client_id == "legacyhost"  # pynsq derived client_id from hostname
    reader.start()
    conn = wait_for(lambda: list(reader.conns.values()), message="no connection")[0]
    wire = identify_payload(conn.config, nsqclient.__version__)
    assert wire["heartbeat_interval"] == 7000
    assert wire["output_buffer_timeout"] == 150
    assert wire["msg_timeout"] == 12000
    # What nsqd negotiated, from its IDENTIFY reply and its /stats.
    assert conn.identify_response["msg_timeout"] == 12000
    assert conn.identify_response["output_buffer_timeout"] == 150
    assert conn.identify_response["output_buffer_size"] == 8192
    assert conn.identify_response["sample_rate"] == 10
    client = wait_for(lambda: (channel_stats(nsqd, "units", "c") or {}).get("clients"))[0]
    assert client["user_agent"] == "legacy-app/1.0"
    assert client["hostname"] == "legacyhost.example.com"
    assert client["client_id"] == "legacyhost"
    assert client["sample_rate"] == 10
    reader.close()


def test_unknown_and_ignored_kwargs(caplog):
    address = "127.0.0.1:4150"  # nothing connects: these Readers are never started
    with pytest.raises(TypeError, match="bogus"):
        compat.Reader("t", "c", lambda m: True, nsqd_tcp_addresses=address, bogus=1)
    with pytest.raises(TypeError, match="bogus"):
        compat.Writer([address], bogus=1)
    with pytest.raises(TypeError, match="tls_options key 'server_side'"):
        compat.Writer([address], tls_v1=True, tls_options={"server_side": True})
    assert compat._registry.snapshot() == ([], [])  # nothing half-made was registered
    with caplog.at_level(logging.WARNING, logger="nsqclient.compat"):
        reader = compat.Reader(
            "t",
            "c",
            lambda m: True,
            nsqd_tcp_addresses=address,
            io_loop=object(),  # older pynsq's argument: meaningless here
            tls_v1=True,
            tls_options={
                "ca_certs": "/etc/ca.pem",
                "certfile": "/etc/client.pem",
                "keyfile": "/etc/client.key",
                "cert_reqs": ssl.CERT_NONE,
                "ssl_version": ssl.PROTOCOL_TLSv1_2,
                "ciphers": "HIGH",
            },
            concurrency=2,  # nsqclient's own option (its units) is accepted too
        )
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "io_loop" in warned and "ciphers" in warned and "ssl_version" not in warned
    cfg = reader.consumer.config
    assert (cfg.tls_v1, cfg.tls_ca_file, cfg.tls_cert_file, cfg.tls_key_file, cfg.tls_verify) == (
        True,
        "/etc/ca.pem",
        "/etc/client.pem",
        "/etc/client.key",
        False,
    )
    assert cfg.concurrency == 2
    assert reader in compat._registry.snapshot()[0]


def test_tls_options_without_tls_v1_are_ignored_as_in_pynsq(caplog):
    # pynsq used tls_options only when tls_v1 was set; nsqclient's Config refuses TLS settings
    # without tls_v1, so the drop-in drops them (with a warning) for a legacy program.
    address = "127.0.0.1:4150"  # never started
    with caplog.at_level(logging.WARNING, logger="nsqclient.compat"):
        writer = compat.Writer([address], tls_options={"ca_certs": "/etc/ca.pem"})
    assert "tls_options ignored because tls_v1 is not set" in caplog.text
    cfg = writer.producer.config
    assert (cfg.tls_v1, cfg.tls_ca_file) == (False, None)
    writer.close()
    with pytest.raises(TypeError, match="tls_options key 'server_side'"):
        compat.Writer([address], tls_options={"server_side": True})
    # nsqclient's own names are not pynsq's: those fail at the call site, naming tls_v1.
    with pytest.raises(ValueError, match="tls_v1=True"):
        compat.Writer([address], tls_ca_file="/etc/ca.pem")


def test_errors_map_to_nsqclient_hierarchy():
    assert compat.Error is NSQError
    assert issubclass(ServerError, compat.Error)
    assert issubclass(compat.SendError, compat.Error)
    assert issubclass(compat.SendError, ConnectionClosedError)
    assert compat.ConnectionClosedError is ConnectionClosedError
    assert compat.IntegrityError is ProtocolError
    err = compat.SendError("no open connections", OSError("refused"))
    assert (err.msg, str(err.error)) == ("no open connections", "refused")
    assert err.maybe_processed is False


# ---------------------------------------------------------------------------- Writer


def test_writer_pub_mpub_dpub_callbacks_on_callback_thread(nsqd, monkeypatch):
    address = nsqd.nsqd.tcp_address
    bodies = queue.Queue()
    reader = compat.Reader(
        "written",
        "c",
        lambda m: bodies.put(m.body) or True,
        nsqd_tcp_addresses=address,
        max_in_flight=10,
    )
    reader.start()
    wait_for(lambda: reader.conns, message="the Reader did not subscribe")
    dpub_delays = []
    real_dpub = nsqclient.protocol.dpub

    def spy_dpub(topic, delay_ms, body):
        dpub_delays.append(delay_ms)
        return real_dpub(topic, delay_ms, body)

    monkeypatch.setattr(nsqclient.protocol, "dpub", spy_dpub)
    writer = compat.Writer([address])
    answers = queue.Queue()

    def callback(tag):
        def cb(conn, data):
            answers.put((tag, threading.current_thread().name, conn.id if conn else None, data))

        return cb

    futures = [
        writer.pub("written", b"one", callback=callback("pub")),
        writer.mpub("written", [b"two", b"three"], callback("mpub")),
        writer.mpub("written", b"four", callback("mpub-single")),
        writer.dpub("written", 60000, b"later", callback("dpub")),  # delay in MILLISECONDS
    ]
    got = sorted(answers.get(timeout=10) for _ in futures)
    assert [tag for tag, *_ in got] == ["dpub", "mpub", "mpub-single", "pub"]
    for _, thread_name, conn_id, data in got:
        assert thread_name == writer.callback_thread.name == f"nsq-callbacks-{address}"
        assert conn_id == address
        assert data == b"OK"
    assert [f.result(timeout=5) for f in futures] == [b"OK"] * 4
    assert dpub_delays == [60000]
    assert sorted(bodies.get(timeout=10) for _ in range(4)) == [b"four", b"one", b"three", b"two"]
    # The DPUB message waits in nsqd for its minute.
    wait_for(lambda: channel_stats(nsqd, "written", "c")["deferred_count"] == 1)
    assert bodies.empty()
    writer.close()
    with pytest.raises(ConnectionClosedError):
        writer.pub("written", b"after close")
    reader.close()


def test_writer_server_error_reaches_the_callback(nsq_cluster_factory):
    cluster = nsq_cluster_factory(nsqd_count=1, lookupd=False, max_msg_size=1024)
    writer = compat.Writer(cluster.nsqd.tcp_address)
    answers = queue.Queue()
    writer.pub("big", b"x" * 2048, lambda conn, data: answers.put(data))
    data = answers.get(timeout=10)
    assert isinstance(data, compat.Error)  # the pynsq idiom
    assert isinstance(data, ServerError) and data.code == "E_BAD_MESSAGE"
    # nsqd closed that connection; the next publish reconnects.
    writer.pub("big", b"small", lambda conn, data: answers.put(data))
    assert answers.get(timeout=10) == b"OK"


def test_writer_unreachable_nsqd(caplog):
    address = f"127.0.0.1:{free_port()}"
    writer = compat.Writer(address, reconnect_interval=0.1)
    answers = queue.Queue()
    future = writer.pub(
        "t", b"x", lambda conn, data: answers.put((conn, data, threading.current_thread().name))
    )
    conn, data, thread_name = answers.get(timeout=10)
    assert conn is None
    assert isinstance(data, compat.SendError) and isinstance(data, compat.Error)
    assert thread_name == writer.callback_thread.name
    with pytest.raises(compat.SendError):
        future.result(timeout=1)
    # Without a callback, the failure is logged (pynsq's _finish_pub).
    with caplog.at_level(logging.ERROR, logger="nsqclient.compat"):
        writer.pub("t", b"y")
        wait_for(lambda: any("failed to pub" in r.getMessage() for r in caplog.records))


def _failed(exc, address="127.0.0.1:4150"):
    """A publish's future that failed after it was written on the connection to ``address``
    (the Producer names the nsqd on every future it wrote)."""
    future = Future()
    future.nsqd_address = address
    future.set_exception(exc)
    return future


def test_writer_resends_what_nsqd_provably_did_not_process_through_the_producer(nsqd, monkeypatch):
    """A publish queued behind another one's fatal error (nsqd processed nothing after it) is
    handed to the Producer's own blocking publish, which stores it: one resend policy."""
    from nsqclient.testing.helpers import message_count

    writer = compat.Writer([nsqd.nsqd.tcp_address])
    producer = writer.producer
    behind_fatal = ConnectionClosedError("queued behind E_BAD_MESSAGE", maybe_processed=False)
    monkeypatch.setattr(producer, "pub_async", lambda topic, body: _failed(behind_fatal))
    resent = []
    real_pub = producer.pub
    monkeypatch.setattr(
        producer,
        "pub",
        lambda topic, body: resent.append(threading.current_thread().name) or real_pub(topic, body),
    )
    answers = queue.Queue()
    future = writer.pub("resent", b"x", lambda conn, data: answers.put((conn, data)))
    conn, data = answers.get(timeout=10)
    assert data == b"OK" and conn.id == nsqd.nsqd.tcp_address
    assert future.result(timeout=1) == b"OK"
    assert resent == [f"nsq-resend-{writer.name}_0"]
    assert message_count(nsqd.nsqd, "resent") == 1
    writer.close()


def test_writer_never_resends_a_publish_whose_outcome_is_unknown(nsqd, monkeypatch):
    # As in pynsq: the connection died with the publish in flight; the callback decides.
    writer = compat.Writer([nsqd.nsqd.tcp_address])
    producer = writer.producer
    unknown = ConnectionClosedError("connection reset", maybe_processed=True)
    monkeypatch.setattr(producer, "pub_async", lambda topic, body: _failed(unknown))
    monkeypatch.setattr(producer, "pub", lambda *a: pytest.fail("resent a maybe-stored publish"))
    answers = queue.Queue()
    writer.pub("t", b"x", lambda conn, data: answers.put(data))
    assert answers.get(timeout=10) is unknown
    writer.close()
    with pytest.raises(TypeError, match="does not take pub_retries"):
        compat.Writer([nsqd.nsqd.tcp_address], pub_retries=2)


def test_writer_resend_that_cannot_reach_nsqd_is_a_send_error(monkeypatch):
    address = f"127.0.0.1:{free_port()}"
    writer = compat.Writer(address, reconnect_interval=0.1)
    behind_fatal = ConnectionClosedError("queued behind E_BAD_MESSAGE", maybe_processed=False)
    monkeypatch.setattr(writer.producer, "pub_async", lambda topic, body: _failed(behind_fatal))
    answers = queue.Queue()
    writer.pub("t", b"x", lambda conn, data: answers.put(data))
    data = answers.get(timeout=10)
    assert isinstance(data, compat.SendError) and "could not reach any nsqd" in str(data)
    writer.close()


def test_writer_bad_input_raises_at_the_call_site(nsqd):
    writer = compat.Writer([nsqd.nsqd.tcp_address])
    answers = queue.Queue()

    def cb(conn, data):
        answers.put(data)

    with pytest.raises(ValueError, match="topic"):
        writer.pub("bad!topic", b"x", cb)
    with pytest.raises(ValueError, match="empty"):
        writer.pub("t", b"", cb)
    with pytest.raises(ValueError):
        writer.mpub("t", [], cb)
    with pytest.raises(ValueError, match="delay_ms"):
        writer.dpub("t", -1, b"x", cb)
    with pytest.raises(TypeError):
        writer.pub("t", 42, cb)
    with pytest.raises(TypeError):
        writer.pub("t", b"x", callback="not callable")
    # No callback ran for any of them: the next answer is the good publish's.
    writer.pub("t", "str bodies are sent as UTF-8", cb)
    assert answers.get(timeout=10) == b"OK"
    assert answers.empty()


# ---------------------------------------------------------------------------- module surface


def test_encoders_match_pynsq():
    nsq = pytest.importorskip("nsq.protocol", reason="pynsq is not installed (bench extra)")
    mid = b"0123456789abcdef"
    assert compat.pub("t", b"body") == nsq.pub("t", b"body")
    assert compat.mpub("t", [b"a", b"bc"]) == nsq.mpub("t", [b"a", b"bc"])
    assert compat.dpub("t", 1500, b"x") == nsq.dpub("t", 1500, b"x")
    assert compat.subscribe("t", "c") == nsq.subscribe("t", "c")
    assert compat.ready(7) == nsq.ready(7)
    assert compat.finish(mid) == nsq.finish(mid)
    assert compat.touch(mid) == nsq.touch(mid)
    assert compat.requeue(mid, 250) == nsq.requeue(mid, 250)
    assert compat.requeue(mid) == nsq.requeue(mid)
    assert compat.nop() == nsq.nop()
    frame = (2).to_bytes(4, "big") + (5).to_bytes(8, "big") + (1).to_bytes(2, "big") + mid + b"hi"
    assert compat.unpack_response(frame) == nsq.unpack_response(frame)
    ours, theirs = compat.decode_message(frame[4:]), nsq.decode_message(frame[4:])
    assert (ours.id, ours.body, ours.timestamp, ours.attempts) == (
        theirs.id,
        theirs.body,
        theirs.timestamp,
        theirs.attempts,
    )


def test_top_level_exports():
    nsq = nsqclient  # a legacy program does `import nsqclient as nsq`
    assert nsq.Reader is compat.Reader
    assert nsq.Writer is compat.Writer
    assert nsq.run is compat.run
    assert nsq.stop is compat.stop
    assert nsq.Error is NSQError
    assert nsq.Message is compat.Message
    assert nsq.valid_topic_name("good") and not nsq.valid_topic_name("bad topic")
    assert nsq.valid_channel_name("c#ephemeral")
