"""``python -m nsqclient.testing``: a standalone embedded nsqd + nsqlookupd process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest
import requests

from nsqclient import protocol as p
from nsqclient.testing.waiting import wait_for

TIMEOUT = 5.0


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def ping(url: str) -> bool:
    try:
        return requests.get(url + "/ping", timeout=1).text == "OK"
    except requests.RequestException:
        return False


def frames(sock: socket.socket, reader: p.FrameReader, count: int) -> list[p.Frame]:
    out: list[p.Frame] = []
    while len(out) < count:
        data = sock.recv(65536)
        assert data, "connection closed"
        out.extend(f for f in reader.feed(data) if f.data != p.HEARTBEAT)
    return out


@pytest.fixture
def standalone(tmp_path):
    tcp, http, ltcp, lhttp = free_ports(4)
    log_path = tmp_path / "stderr.txt"
    log_file = open(log_path, "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nsqclient.testing",
            "--tcp-address",
            f"127.0.0.1:{tcp}",
            "--http-address",
            f"127.0.0.1:{http}",
            "--lookupd-tcp-address",
            f"127.0.0.1:{ltcp}",
            "--lookupd-http-address",
            f"127.0.0.1:{lhttp}",
        ],  # fmt: skip
        stderr=log_file,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        yield proc, (tcp, http, ltcp, lhttp), log_path
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(TIMEOUT)
        log_file.close()


def test_standalone_serves_and_exits_cleanly_on_sigterm(standalone):
    proc, (tcp, http, ltcp, lhttp), log_path = standalone
    wait_for(
        lambda: ping(f"http://127.0.0.1:{http}") or proc.poll() is not None,
        timeout=20,
        message=lambda: f"standalone never answered /ping: {log_path.read_text()}",
    )
    assert proc.poll() is None, log_path.read_text()
    assert ping(f"http://127.0.0.1:{lhttp}")

    sock = socket.create_connection(("127.0.0.1", tcp), timeout=TIMEOUT)
    reader = p.FrameReader()
    sock.sendall(p.MAGIC_V2 + p.pub("solo", b"hello") + p.sub("solo", "c") + p.rdy(1))
    got = frames(sock, reader, 3)
    assert got[:2] == [(p.FRAME_TYPE_RESPONSE, b"OK")] * 2
    assert p.decode_message(got[2].data).body == b"hello"
    sock.close()

    lookup = wait_for(
        lambda: (
            requests.get(f"http://127.0.0.1:{lhttp}/lookup?topic=solo", timeout=1).json()
            if requests.get(f"http://127.0.0.1:{lhttp}/lookup?topic=solo", timeout=1).ok
            else None
        )
    )
    assert lookup["producers"][0]["tcp_port"] == tcp

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    text = log_path.read_text()
    for port in (tcp, http, ltcp, lhttp):
        assert f"127.0.0.1:{port}" in text
