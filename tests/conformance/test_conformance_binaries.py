"""The embedded servers as drop-ins for the real binaries: separate processes started through
``nsqclient-nsqlookupd`` / ``python -m nsqclient.testing nsqd`` with the real flags.

Every scenario runs against the embedded servers, and also against the real ``nsqd`` and
``nsqlookupd`` when ``NSQ_BIN_DIR`` names them, so the expectations are the real binaries'.
Processes listen on loopback on free ports and are always killed at teardown.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from rawclient import RawConn

from nsqclient import protocol
from nsqclient.testing import EmbeddedNSQ
from nsqclient.testing.auth_server import AuthServer
from nsqclient.testing.nodes import free_ports
from nsqclient.testing.pytest_plugin import real_bin_dir
from nsqclient.testing.waiting import wait_for

CERTS = Path(__file__).resolve().parent.parent / "certs"
START_TIMEOUT = 20.0
STOP_TIMEOUT = 20.0

KINDS = ["embedded"] + (["real"] if real_bin_dir() else [])


def command(kind: str, binary: str) -> list[str]:
    """The command line starting ``binary`` (nsqd or nsqlookupd) of ``kind``."""
    if kind == "real":
        return [os.path.join(str(real_bin_dir()), binary)]
    script = Path(sys.executable).with_name(f"nsqclient-{binary}")
    if binary == "nsqlookupd" and script.exists():
        return [str(script)]  # the console script
    return [sys.executable, "-m", "nsqclient.testing", binary]


class Server:
    """One server process, its ports and its log."""

    def __init__(self, argv: list[str], tcp_port: int, http_port: int, log_path: Path):
        self.argv = argv
        self.tcp_port = tcp_port
        self.http_port = http_port
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def tcp_address(self) -> str:
        return f"127.0.0.1:{self.tcp_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self) -> Server:
        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.argv[0]} exited: {self.log()}")
            try:
                # any answer will do: with --tls-required even /ping is a 403 over plain HTTP
                return requests.get(self.http_url + "/ping", timeout=1).status_code in (200, 403)
            except requests.RequestException:
                return False

        wait_for(up, START_TIMEOUT, message=lambda: f"no /ping answer: {self.log()}")
        return self

    def stop(self) -> int:
        """SIGTERM and wait; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(STOP_TIMEOUT)
        finally:
            self._log.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT)
        self._log.close()


@pytest.fixture(params=KINDS)
def spawn(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """``spawn("nsqd" | "nsqlookupd", *flags) -> Server`` (ready); all killed at teardown."""
    kind = request.param
    made: list[Server] = []

    def make(binary: str, *flags: str, ports: tuple[int, int] | None = None) -> Server:
        tcp, http = ports or tuple(free_ports(2))
        if binary == "nsqd" and not any(f.startswith("--data-path=") for f in flags):
            # nsqd's default data path is the working directory, locked by one process
            own = tmp_path / f"data-{len(made)}"
            own.mkdir()
            flags = (*flags, f"--data-path={own}")
        argv = command(kind, binary) + [
            f"--tcp-address=127.0.0.1:{tcp}",
            f"--http-address=127.0.0.1:{http}",
            "--broadcast-address=127.0.0.1",
            *flags,
        ]
        server = Server(argv, tcp, http, tmp_path / f"{binary}-{len(made)}.log")
        made.append(server)
        return server.wait_ready()

    make.kind = kind  # type: ignore[attr-defined]
    yield make
    for server in made:
        server.kill()


def stats(server: Server, topic: str) -> dict[str, Any] | None:
    doc = requests.get(
        server.http_url + "/stats", params={"format": "json", "topic": topic}, timeout=5
    ).json()
    topics = doc.get("topics") or []
    return topics[0] if topics else None


def channel_names(server: Server, topic: str) -> list[str]:
    found = stats(server, topic)
    return sorted(c["channel_name"] for c in found["channels"]) if found else []


# ------------------------------------------------------------------------------ lookupd


def test_nsqd_registers_with_a_lookupd_in_another_process_and_learns_its_channels(spawn):
    lookupd = spawn("nsqlookupd")
    # a channel another nsqd would have registered
    requests.post(
        lookupd.http_url + "/channel/create",
        params={"topic": "learn", "channel": "elsewhere"},
        timeout=5,
    ).raise_for_status()
    nsqd = spawn("nsqd", f"--lookupd-tcp-address={lookupd.tcp_address}")

    def identified() -> bool:
        nodes = requests.get(lookupd.http_url + "/nodes", timeout=5).json()["producers"]
        return any(n["tcp_port"] == nsqd.tcp_port for n in nodes)

    wait_for(identified, 10, message=lambda: f"nsqd never identified: {nsqd.log()}")

    conn = RawConn(nsqd.tcp_address)
    conn.pub("learn", b"for every channel")
    # nsqd asked the lookupd which channels "learn" has before the message flowed
    assert channel_names(nsqd, "learn") == ["elsewhere"]
    assert stats(nsqd, "learn")["channels"][0]["depth"] == 1

    def lookup() -> list[int]:
        r = requests.get(lookupd.http_url + "/lookup", params={"topic": "learn"}, timeout=5)
        return [p["tcp_port"] for p in r.json()["producers"]] if r.ok else []

    assert wait_for(lookup, 10) == [nsqd.tcp_port]
    conn.sub("learn", "elsewhere", rdy=1)
    assert conn.expect_message().body == b"for every channel"
    assert nsqd.stop() == 0

    def forgotten() -> bool:
        return lookup() == []

    wait_for(forgotten, 10, message="the lookupd still lists the stopped nsqd")
    assert lookupd.stop() == 0


# ------------------------------------------------------------------------------ auth


def test_auth_http_address_is_enforced(spawn):
    grant = {
        "identity": "alice",
        "authorizations": [
            {"topic": "^mine$", "channels": [".*"], "permissions": ["publish", "subscribe"]}
        ],
    }
    with AuthServer({"s3cret": grant}) as auth:
        nsqd = spawn("nsqd", f"--auth-http-address={auth.address}")

        anonymous = RawConn(nsqd.tcp_address)
        reply = anonymous.negotiate()
        assert reply["auth_required"] is True
        anonymous.send(protocol.pub("mine", b"x"))
        anonymous.expect_error("E_AUTH_FIRST AUTH required before PUB")
        anonymous.expect_closed()

        wrong = RawConn(nsqd.tcp_address)
        wrong.send(protocol.auth("nope"))
        wrong.expect_error("E_AUTH_FAILED AUTH failed")
        wrong.expect_closed()

        conn = RawConn(nsqd.tcp_address)
        conn.send(protocol.auth("s3cret"))
        answer, _ = conn.expect_json()
        assert answer == {"identity": "alice", "identity_url": "", "permission_count": 1}
        conn.pub("mine", b"allowed")
        conn.send(protocol.pub("theirs", b"x"))
        conn.expect_fatal('E_UNAUTHORIZED AUTH failed for PUB on "theirs" ""')

        asked = [r for r in auth.requests if r.get("secret") == "s3cret"]
        assert asked and asked[0]["remote_ip"] == "127.0.0.1" and asked[0]["tls"] == "false"


# ------------------------------------------------------------------------------ TLS


def _other_certificate(directory: Path) -> tuple[str, str]:
    """A self-signed certificate no CA of the tests vouches for (made with openssl)."""
    cert, key = directory / "other-cert.pem", directory / "other-key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key)]
        + ["-out", str(cert), "-days", "2", "-subj", "/CN=stranger"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return str(cert), str(key)


def _tls_handshake(nsqd: Server, cert: tuple[str, str] | None) -> bool:
    """Negotiate TLS presenting ``cert``; True when nsqd then answered OK, False when it
    refused the connection."""
    sock = socket.create_connection(("127.0.0.1", nsqd.tcp_port), timeout=10)
    try:
        sock.sendall(
            protocol.MAGIC_V2 + protocol.identify({"feature_negotiation": True, "tls_v1": True})
        )
        reader = protocol.FrameReader()
        frames: list[protocol.Frame] = []
        while not frames:
            data = sock.recv(4096)
            assert data, "closed before the IDENTIFY reply"
            frames.extend(reader.feed(data))
        assert b'"tls_v1":true' in frames[0].data
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        if cert is not None:
            context.load_cert_chain(*cert)
        try:
            tls = context.wrap_socket(sock)
            data = tls.recv(4096)
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
            return False
        if not data:
            return False
        assert data == protocol.encode_frame(protocol.FRAME_TYPE_RESPONSE, b"OK")
        return True
    finally:
        sock.close()


@pytest.mark.skipif(not os.path.exists("/usr/bin/openssl"), reason="needs the openssl CLI")
def test_client_certificate_policies(spawn, tmp_path):
    ours = (str(CERTS / "cert.pem"), str(CERTS / "key.pem"))
    tls_flags = [f"--tls-cert={ours[0]}", f"--tls-key={ours[1]}", f"--tls-root-ca-file={ours[0]}"]

    def https() -> str:
        return f"--https-address=127.0.0.1:{free_ports(1)[0]}"

    stranger = _other_certificate(tmp_path)

    verify = spawn("nsqd", *tls_flags, https(), "--tls-client-auth-policy=require-verify")
    assert _tls_handshake(verify, ours) is True
    assert _tls_handshake(verify, None) is False
    assert _tls_handshake(verify, stranger) is False
    # the policy implies --tls-required: nothing but IDENTIFY before TLS
    plain = RawConn(verify.tcp_address)
    plain.send(protocol.pub("t", b"x"))
    plain.expect_error("E_INVALID cannot PUB in current state (TLS required)")

    require = spawn("nsqd", *tls_flags, https(), "--tls-client-auth-policy=require")
    assert _tls_handshake(require, ours) is True
    assert _tls_handshake(require, None) is False

    anyone = spawn("nsqd", *tls_flags, "--https-address=")
    assert _tls_handshake(anyone, None) is True


# ------------------------------------------------------------------------------ data path


def test_a_restart_with_a_data_path_keeps_topics_channels_and_messages(spawn, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    nsqd = spawn("nsqd", f"--data-path={data}")

    def post(path: str, **params: str) -> None:
        requests.post(nsqd.http_url + path, params=params, timeout=5).raise_for_status()

    post("/topic/create", topic="kept")
    post("/channel/create", topic="kept", channel="work")
    post("/channel/create", topic="kept", channel="idle")
    post("/channel/pause", topic="kept", channel="idle")
    post("/topic/create", topic="empty")
    conn = RawConn(nsqd.tcp_address)
    conn.mpub("kept", [b"one", b"two", b"three"])
    conn.send(protocol.dpub("kept", 600_000, b"later"))
    conn.expect_response()

    reader = RawConn(nsqd.tcp_address)
    reader.sub("kept", "work", rdy=1)
    first = reader.expect_message()  # in flight, never finished
    assert first.body == b"one" and first.attempts == 1
    assert nsqd.stop() == 0

    again = spawn("nsqd", f"--data-path={data}", ports=(nsqd.tcp_port, nsqd.http_port))
    kept = stats(again, "kept")
    assert kept is not None
    channels = {c["channel_name"]: c for c in kept["channels"]}
    assert set(channels) == {"idle", "work"}
    assert channels["idle"]["paused"] is True and channels["work"]["paused"] is False
    assert channels["idle"]["depth"] == 4 and channels["work"]["depth"] == 4
    assert stats(again, "empty") is not None

    reader = RawConn(again.tcp_address)
    reader.sub("kept", "work", rdy=10)
    got = {m.body: m for m in reader.expect_messages(4)}
    assert set(got) == {b"one", b"two", b"three", b"later"}
    assert got[b"one"].attempts == 2 and got[b"one"].id == first.id  # the in-flight one, requeued
    assert got[b"two"].attempts == 1
    assert again.stop() == 0


# ------------------------------------------------------------------------------ split writes


@pytest.mark.embedded_only
def test_a_cluster_with_split_writes_still_speaks_nsq():
    with EmbeddedNSQ(lookupd=False, split_writes=True, split_writes_seed=11) as cluster:
        server = cluster.server(0)
        conn = RawConn(cluster.nsqd)
        conn.negotiate(snappy=True)
        assert cluster.run(lambda: all(c.output.splitter for c in server.conns))
        bodies = [bytes([i]) * (i * 997) for i in range(1, 30)]
        conn.mpub("split", bodies)
        conn.sub("split", "c", rdy=100)
        assert [m.body for m in conn.expect_messages(len(bodies))] == bodies
