"""A Producer inside a threaded WSGI server: the way a Django or Flask app publishes.

One module-level Producer, as an application would hold it, shared by every request thread of
a wsgiref server with ThreadingMixIn.  Twenty concurrent requests must all answer 200, every
message must reach nsqd once, and all of it over the single shared connection.
"""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
import requests

from nsqclient.errors import NSQError
from nsqclient.producer._producer import Producer
from nsqclient.testing.helpers import consume, nsqd_stats

TIMEOUT = 10.0
TOPIC = "wsgi_events"
REQUESTS = 20

#: The application's Producer, made at "import time" of the app (here: by the fixture, once the
#: broker's address is known) and used by every request thread.
PRODUCER: Producer | None = None


def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    """POST /publish: the request body becomes one message."""
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length)
    try:
        assert PRODUCER is not None
        PRODUCER.pub(TOPIC, body)
    except (NSQError, ValueError, TypeError) as exc:
        start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
        return [f"{type(exc).__name__}: {exc}".encode()]
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"published"]


class ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    block_on_close = True
    request_queue_size = 64  # 20 simultaneous connects must not overflow the listen backlog


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


@pytest.fixture
def wsgi_url(nsqd: Any) -> Iterator[str]:
    global PRODUCER
    PRODUCER = Producer(nsqd.nsqd.tcp_address)
    server = make_server(
        "127.0.0.1", 0, app, server_class=ThreadingWSGIServer, handler_class=QuietHandler
    )
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="test-wsgi-server"
    )
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(TIMEOUT)
        server.server_close()
        PRODUCER.close(timeout=TIMEOUT)
        PRODUCER = None
    assert not thread.is_alive()


def test_concurrent_requests_publish_through_one_producer(nsqd, wsgi_url):
    node = nsqd.nsqd
    bodies = [f"event {i} ✓".encode() for i in range(REQUESTS)]
    # A barrier in the client threads makes the first requests race to open the connection.
    barrier = threading.Barrier(REQUESTS, timeout=TIMEOUT)

    def post(body: bytes) -> tuple[int, str]:
        with requests.Session() as session:
            barrier.wait()
            reply = session.post(f"{wsgi_url}/publish", data=body, timeout=TIMEOUT)
            return reply.status_code, reply.text

    with ThreadPoolExecutor(max_workers=REQUESTS, thread_name_prefix="test-client") as pool:
        replies = list(pool.map(post, bodies, timeout=TIMEOUT * 2))

    assert replies == [(200, "published")] * REQUESTS
    [topic] = nsqd_stats(node, topic=TOPIC)["topics"]
    assert topic["message_count"] == REQUESTS
    assert sorted(consume(node, TOPIC, REQUESTS)) == sorted(bodies)
    # Every request thread shared the one connection of the module-level Producer.
    publishers = nsqd_stats(node)["producers"]
    assert len(publishers) == 1
    assert publishers[0]["pub_counts"] == [{"topic": TOPIC, "count": REQUESTS}]


def test_a_second_wave_reuses_the_connection(nsqd, wsgi_url):
    node = nsqd.nsqd
    for wave in range(2):
        with ThreadPoolExecutor(max_workers=REQUESTS, thread_name_prefix="test-client") as pool:
            replies = list(
                pool.map(
                    lambda i, wave=wave: (
                        requests.post(
                            f"{wsgi_url}/publish", data=b"w%d-%d" % (wave, i), timeout=TIMEOUT
                        ).status_code
                    ),
                    range(REQUESTS),
                    timeout=TIMEOUT * 2,
                )
            )
        assert replies == [200] * REQUESTS
    [topic] = nsqd_stats(node, topic=TOPIC)["topics"]
    assert topic["message_count"] == 2 * REQUESTS
    assert len(nsqd_stats(node)["producers"]) == 1
