"""Legacy pynsq programs built on tornado, run unchanged but for ``import nsqclient as nsq``.

Each program is a script run in its own interpreter (as a user runs it), against the broker
fixture: the patterns of pynsq's documentation (a Writer driven by a ``PeriodicCallback``; a
``tornado.web`` handler publishing through ``self.application.nsq``), Readers whose handlers use
the IOLoop, and the clean stop on SIGINT/SIGTERM.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
import requests

from nsqclient.testing import helpers
from nsqclient.testing.waiting import wait_for

pytest.importorskip("tornado", reason="tornado is not installed (bench extra)")

ROOT = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)


class Program:
    """A Python program in a subprocess, its stdout lines collected on a thread."""

    def __init__(self, source: str, tmp_path, name: str = "program.py"):
        path = tmp_path / name
        path.write_text(textwrap.dedent(source))
        env = dict(os.environ, PYTHONPATH=os.path.abspath(ROOT))
        self.proc = subprocess.Popen(
            [sys.executable, "-u", str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self.stderr: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.lines.put)),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.stderr.append)),
        ]
        for t in self._readers:
            t.daemon = True
            t.start()

    @staticmethod
    def _read(stream, put) -> None:
        for line in stream:
            put(line.rstrip("\n"))

    def wait_line(self, predicate, timeout: float = 20.0) -> str:
        def found():
            while True:
                try:
                    line = self.lines.get_nowait()
                except queue.Empty:
                    break
                self.seen.append(line)
            return next((line for line in self.seen if predicate(line)), None)

        return wait_for(found, timeout, 0.02, lambda: f"no such line in {self.seen!r}")

    def finish(self, timeout: float = 30.0) -> tuple[int, str]:
        """Wait for the exit; return (status, stderr)."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(
                f"the program did not exit within {timeout}s; stderr:\n" + "\n".join(self.stderr)
            ) from None
        for t in self._readers:
            t.join(10)
        while not self.lines.empty():
            self.seen.append(self.lines.get_nowait())
        return self.proc.returncode, "\n".join(self.stderr)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def programs():
    made: list[Program] = []

    def make(source: str, tmp_path) -> Program:
        program = Program(source, tmp_path, f"program{len(made)}.py")
        made.append(program)
        return program

    yield make
    for program in made:
        program.kill()


def topic_count(cluster, topic: str) -> int:
    """Messages nsqd has received on ``topic`` (0 when it does not exist yet)."""
    reply = requests.get(
        f"{cluster.nsqd.http_url}/stats", params={"format": "json", "topic": topic}, timeout=5
    )
    reply.raise_for_status()
    data = reply.json()
    data = data.get("data", data)
    return sum(t["message_count"] for t in data.get("topics") or [] if t["topic_name"] == topic)


def channel_stats(cluster, topic: str, channel: str) -> dict | None:
    return helpers.channel_stats(cluster.nsqd, topic, channel)


def publish(cluster, topic: str, bodies: list[bytes]) -> None:
    from nsqclient import Producer

    with Producer(cluster.nsqd.tcp_address) as producer:
        producer.mpub(topic, bodies)


# ---------------------------------------------------------------------------- Writer programs


def test_periodic_callback_writer_publishes_and_sigterm_stops_it(nsqd, programs, tmp_path):
    # pynsq's first Writer example: a PeriodicCallback publishes every second, the callback
    # prints nsqd's answer, nsq.run() runs the IOLoop.
    program = programs(
        f"""
        import time

        import tornado.ioloop
        import nsqclient as nsq

        def pub_message():
            writer.pub("clock", time.strftime("%H:%M:%S"), finish_pub)

        def finish_pub(conn, data):
            print(data)

        writer = nsq.Writer(["{nsqd.nsqd.tcp_address}"])
        tornado.ioloop.PeriodicCallback(pub_message, 1000).start()
        nsq.run()
        print("run returned")
        """,
        tmp_path,
    )
    program.wait_line(lambda line: line == "b'OK'")
    wait_for(lambda: topic_count(nsqd, "clock") >= 2, 20, 0.1, "fewer than 2 publishes")
    program.proc.send_signal(signal.SIGTERM)
    status, err = program.finish()
    assert status == 0, err
    assert program.seen[-1] == "run returned"
    assert program.seen.count("b'OK'") >= 2
    assert "Traceback" not in err


def test_tornado_web_handler_publishes_and_answers_200(nsqd, programs, tmp_path):
    # pynsq's second Writer example: a tornado.web handler publishes through the application's
    # Writer (pub, mpub, dpub in MILLISECONDS, pub with its own callback), then answers.  The
    # program takes a port of its own and says which (a port picked here could be taken by
    # another process before the program listens on it).
    program = programs(
        f"""
        import functools
        import socket

        import tornado.httpserver
        import tornado.netutil
        import tornado.web
        import nsqclient as nsq

        class MainHandler(tornado.web.RequestHandler):
            @property
            def nsq(self):
                return self.application.nsq

            def get(self):
                topic = "log"
                text = "Hello world"
                text_cn = "Hello 世界"
                self.nsq.pub(topic, text)
                self.nsq.mpub(topic, [text, text_cn])
                self.nsq.dpub(topic, 60, text)
                callback = functools.partial(self.finish_pub, topic=topic, msg=text)
                self.nsq.pub(topic, text, callback=callback)
                self.write(text)

            def finish_pub(self, conn, data, topic, msg):
                print("callback", data, flush=True)
                if isinstance(data, nsq.Error):
                    self.nsq.pub(topic, msg)

        application = tornado.web.Application([(r"/", MainHandler)])
        application.nsq = nsq.Writer(["{nsqd.nsqd.tcp_address}"])

        if __name__ == "__main__":
            [listening] = tornado.netutil.bind_sockets(0, "127.0.0.1", socket.AF_INET)
            tornado.httpserver.HTTPServer(application).add_sockets([listening])
            print("listening", listening.getsockname()[1], flush=True)
            nsq.run()
            print("run returned")
        """,
        tmp_path,
    )

    port = int(program.wait_line(lambda line: line.startswith("listening ")).split()[1])
    for _ in range(2):
        reply = requests.get(f"http://127.0.0.1:{port}/", timeout=10)
        assert reply.status_code == 200
        assert reply.text == "Hello world"
    # 5 messages a request: pub, mpub of 2, dpub, pub with callback.
    wait_for(lambda: topic_count(nsqd, "log") == 10, 20, 0.05, "not 10 messages on nsqd")
    program.wait_line(lambda line: line == "callback b'OK'")
    program.proc.send_signal(signal.SIGINT)
    status, err = program.finish()
    assert status == 0, err
    assert program.seen.count("callback b'OK'") == 2
    assert program.seen[-1] == "run returned"
    assert "Traceback" not in err


# ---------------------------------------------------------------------------- Reader programs


def test_reader_handlers_run_on_the_ioloop_and_ioloop_stop_ends_run(nsqd, programs, tmp_path):
    bodies = [b"r%d" % i for i in range(20)]
    publish(nsqd, "onloop", bodies)
    program = programs(
        f"""
        import json
        import threading

        import tornado.ioloop
        import nsqclient as nsq

        seen = []
        on_main = []

        def handler(message):
            seen.append(message.body.decode())
            on_main.append(threading.current_thread() is threading.main_thread())
            # tornado code works in a handler: the loop is the one nsq.run() runs
            assert tornado.ioloop.IOLoop.current().asyncio_loop.is_running()
            if len(seen) == {len(bodies)}:
                tornado.ioloop.IOLoop.current().stop()
            return True

        r = nsq.Reader(topic="onloop", channel="c", message_handler=handler,
                       nsqd_tcp_addresses=["{nsqd.nsqd.tcp_address}"], max_in_flight=5)
        nsq.run()
        print(json.dumps({{"seen": sorted(seen), "all_on_main": all(on_main)}}))
        """,
        tmp_path,
    )
    status, err = program.finish()
    assert status == 0, err
    summary = json.loads(program.seen[-1])
    assert summary["seen"] == sorted(b.decode() for b in bodies)
    assert summary["all_on_main"] is True
    # run() finished every message it had handled before returning: nothing left in flight.
    wait_for(
        lambda: (
            (c := channel_stats(nsqd, "onloop", "c")) is not None
            and c["depth"] == 0
            and c["in_flight_count"] == 0
        ),
        15,
        0.05,
        lambda: f"channel not drained: {channel_stats(nsqd, 'onloop', 'c')}",
    )


def test_reader_writer_and_periodic_callback_in_one_process(nsqd, programs, tmp_path):
    # A PeriodicCallback publishes through a Writer, a Reader consumes, a coroutine handler
    # awaits tornado's sleep; nsq.stop(), once all 12 are published and handled, ends it all.
    program = programs(
        f"""
        import json
        import threading

        import tornado.gen
        import tornado.ioloop
        import nsqclient as nsq

        sent, published, consumed, where = [], [], [], set()

        def tick():
            if len(sent) < 12:
                sent.append(1)
                writer.pub("mixed", b"m%d" % (len(sent) - 1), on_published)

        def stop_when_done():
            # Both sides answered: no publish is left whose callback could come after the
            # loop stopped (such a callback runs on the Writer's callback thread).
            if len(published) == 12 and len(consumed) == 12:
                nsq.stop()

        def on_published(conn, data):
            where.add(threading.current_thread() is threading.main_thread())
            if data == b"OK":
                published.append(1)
            stop_when_done()

        async def handler(message):
            where.add(threading.current_thread() is threading.main_thread())
            await tornado.gen.sleep(0.01)
            consumed.append(message.body.decode())
            stop_when_done()
            return True

        writer = nsq.Writer(["{nsqd.nsqd.tcp_address}"])
        reader = nsq.Reader(topic="mixed", channel="c", message_handler=handler,
                            nsqd_tcp_addresses=["{nsqd.nsqd.tcp_address}"], max_in_flight=4)
        tornado.ioloop.PeriodicCallback(tick, 20).start()
        nsq.run()
        print(json.dumps({{"published": len(published), "consumed": sorted(consumed),
                          "where": sorted(where)}}))
        """,
        tmp_path,
    )
    status, err = program.finish()
    assert status == 0, err
    summary = json.loads(program.seen[-1])
    assert summary["published"] == 12
    assert summary["consumed"] == sorted(f"m{i}" for i in range(12))
    assert summary["where"] == [True], "a handler or callback ran off the IOLoop's thread"


def test_without_tornado_run_never_imports_it(nsqd, programs, tmp_path):
    publish(nsqd, "plain", [b"x"])
    program = programs(
        f"""
        import sys
        import threading

        import nsqclient as nsq

        names = []

        def handler(message):
            names.append(threading.current_thread().name)
            nsq.stop()
            return True

        nsq.Reader(topic="plain", channel="c", message_handler=handler,
                   nsqd_tcp_addresses=["{nsqd.nsqd.tcp_address}"])
        nsq.run()
        print("tornado" in sys.modules, names[0] != threading.main_thread().name)
        """,
        tmp_path,
    )
    status, err = program.finish()
    assert status == 0, err
    assert program.seen[-1] == "False True"


def test_run_tornado_true_without_tornado_installed_says_so(programs, tmp_path):
    program = programs(
        """
        import sys

        sys.modules["tornado"] = None  # as if it were not installed
        sys.modules["tornado.ioloop"] = None
        import nsqclient as nsq

        try:
            nsq.run(tornado=True)
        except RuntimeError as exc:
            print(exc)
        """,
        tmp_path,
    )
    status, err = program.finish()
    assert status == 0, err
    assert "needs tornado" in program.seen[-1]
