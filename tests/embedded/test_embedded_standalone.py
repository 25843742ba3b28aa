"""``python -m nsqclient.testing``: a standalone embedded nsqd + nsqlookupd process."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading

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


def _start(args: list[str], stdout: object = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "nsqclient.testing", *args],
        stdout=stdout,  # type: ignore[arg-type]
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(TIMEOUT)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


@pytest.mark.parametrize("which", ["tcp", "http", "lookupd-http"])
def test_an_address_in_use_is_one_clear_line_and_exit_status_1(which):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    taken_port = busy.getsockname()[1]
    taken = f"127.0.0.1:{taken_port}"
    tcp, http, ltcp, lhttp = (f"127.0.0.1:{p}" for p in free_ports(4))
    addresses = {"tcp": tcp, "http": http, "lookupd-http": lhttp}
    addresses[which] = taken
    try:
        done = subprocess.run(
            [sys.executable, "-m", "nsqclient.testing", "--tcp-address", addresses["tcp"],
             "--http-address", addresses["http"], "--lookupd-tcp-address", ltcp,
             "--lookupd-http-address", addresses["lookupd-http"]],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        busy.close()
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "in use" in line]
    assert len(errors) == 1, done.stderr
    assert errors[0].startswith("python -m nsqclient.testing: cannot start: ")
    assert str(taken_port) in errors[0]
    assert done.stdout == ""  # no server was announced


def _identify_msg_timeout(tcp_address: str) -> int:
    host, _, port = tcp_address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=TIMEOUT) as sock:
        sock.sendall(p.MAGIC_V2 + p.identify({"feature_negotiation": True}))
        reply = frames(sock, p.FrameReader(), 1)[0]
    assert reply.type == p.FRAME_TYPE_RESPONSE, reply
    return int(json.loads(reply.data)["msg_timeout"])


@pytest.mark.parametrize(
    ("argv", "ms"),
    [
        (["--msg-timeout", "1m30s"], 90000),
        (["--msg-timeout", "45"], 45000),
        (["nsqd", "--msg-timeout=75"], 75000),
        (["nsqd", "-msg-timeout", "2500ms"], 2500),
    ],
)
def test_msg_timeout_takes_go_durations_and_plain_seconds_in_both_modes(argv, ms):
    tcp, http = (f"127.0.0.1:{port}" for port in free_ports(2))
    if argv[0] == "nsqd":
        argv = [*argv, f"--tcp-address={tcp}", f"--http-address={http}", "--https-address="]
    else:
        argv = [*argv, "--tcp-address", tcp, "--http-address", http]
    proc = _start(argv)
    try:
        wait_for(
            lambda: ping(f"http://{http}") or proc.poll() is not None,
            timeout=20,
            message="the server never answered /ping",
        )
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert _identify_msg_timeout(tcp) == ms
    finally:
        _stop(proc)


def test_youzan_mode_prints_every_address_lookupds_included():
    tcp, http = (f"127.0.0.1:{port}" for port in free_ports(2))
    proc = _start(
        ["--youzan", "--nsqd-count", "2", "--lookupd-count", "2", "--log-level", "error",
         "--registration-ttl", "5s", "--tcp-address", tcp, "--http-address", http],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            lines.append(raw.decode().rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(
            lambda: (
                any(line.startswith("lookupd HTTP addresses:") for line in lines)
                or proc.poll() is not None
            ),
            timeout=20,
            message=lambda: f"printed so far: {lines}",
        )
        assert proc.poll() is None, lines
        assert lines[0] == f"nsqd: TCP {tcp} HTTP {http}"
        lookupds = [line for line in lines if line.startswith("nsqlookupd: ")]
        assert len(lookupds) == 2 and sum(line.startswith("nsqd: ") for line in lines) == 2
        http_addresses = [line.rsplit(" HTTP ", 1)[1] for line in lookupds]
        assert lines[-1] == "lookupd HTTP addresses: " + " ".join(
            f"--lookupd-http-address {a}" for a in http_addresses
        )
        for address in http_addresses:  # what it prints is where the lookupds answer
            assert ping(f"http://{address}")
    finally:
        _stop(proc)
        reader.join(TIMEOUT)
