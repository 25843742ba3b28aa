"""The Cluster interface both brokers implement, the pytest plugin, the auth server and the
helpers behind them."""

from __future__ import annotations

import os

import pytest
import requests
from rawclient import Closed, RawConn, assert_alive

from nsqclient.testing.auth_server import ALLOW_ALL, AuthServer
from nsqclient.testing.gostyle.flags import duration_flag
from nsqclient.testing.real import RealNSQ, RealNSQError, nsqd_flags
from nsqclient.testing.waiting import wait_for

# ------------------------------------------------------------------------ the Cluster interface


def ping(url: str) -> bool:
    try:
        return requests.get(f"{url}/ping", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def registered_ports(cluster) -> set[int]:
    doc = requests.get(f"{cluster.lookupd.http_url}/nodes", timeout=5).json()
    return {p["tcp_port"] for p in doc["producers"]}


def test_cluster_attributes(nsq_cluster, nsq_broker_kind):
    assert nsq_cluster.kind == nsq_broker_kind
    assert len(nsq_cluster.nsqds) == 3
    assert nsq_cluster.nsqd is nsq_cluster.nsqds[0]
    for node in nsq_cluster.nsqds + [nsq_cluster.lookupd]:
        assert node.tcp_address == f"127.0.0.1:{node.tcp_port}"
        assert node.http_address == f"127.0.0.1:{node.http_port}"
        assert node.http_url == f"http://127.0.0.1:{node.http_port}"
        assert ping(node.http_url)
    ports = [p for n in nsq_cluster.nsqds for p in (n.tcp_port, n.http_port)]
    assert len(set(ports)) == 6
    # every nsqd is registered by the time start() returns
    assert registered_ports(nsq_cluster) == {n.tcp_port for n in nsq_cluster.nsqds}


def test_cluster_without_lookupd(nsq_cluster_factory):
    cluster = nsq_cluster_factory(nsqd_count=2, lookupd=False)
    assert cluster.lookupd is None
    assert len(cluster.nsqds) == 2
    with RawConn(cluster.nsqds[1]) as conn:
        assert_alive(conn)


def test_stop_and_start_nsqd_keeps_ports_and_data(nsqd):
    node = nsqd.nsqd
    with RawConn(node) as conn:
        conn.pub("kept", b"survives a restart")
        conn.sub("other", "c")
        nsqd.stop_nsqd(0)
        with pytest.raises(Closed):  # connections drop
            conn.read_frame(timeout=5)
    assert not ping(node.http_url)
    assert registered_ports(nsqd) == set()
    nsqd.start_nsqd(0)
    assert nsqd.nsqd.tcp_port == node.tcp_port
    assert nsqd.nsqd.http_port == node.http_port
    assert registered_ports(nsqd) == {node.tcp_port}
    with RawConn(nsqd.nsqd) as conn:
        conn.sub("kept", "c", rdy=1)
        assert conn.expect_message().body == b"survives a restart"


def test_add_nsqd_registers_with_lookupd(nsqd):
    node = nsqd.add_nsqd(max_rdy_count=7)
    assert nsqd.nsqds[-1] is node
    assert len(nsqd.nsqds) == 2
    assert node.tcp_port in registered_ports(nsqd)
    with RawConn(node) as conn:
        assert conn.negotiate()["max_rdy_count"] == 7


def test_stop_and_start_lookupd_keeps_ports(nsqd):
    lookupd = nsqd.lookupd
    nsqd.stop_lookupd()
    assert not ping(lookupd.http_url)
    nsqd.start_lookupd()
    assert nsqd.lookupd.http_port == lookupd.http_port
    assert nsqd.lookupd.tcp_port == lookupd.tcp_port
    assert ping(nsqd.lookupd.http_url)


def test_a_stalled_lookupd_answers_nothing_until_unstalled(nsqd):
    url = f"{nsqd.lookupd.http_url}/ping"
    nsqd.stall_lookupd()
    try:
        with pytest.raises(requests.exceptions.ReadTimeout):
            requests.get(url, timeout=0.3)
    finally:
        nsqd.unstall_lookupd()
    assert ping(nsqd.lookupd.http_url)


@pytest.mark.real_only
def test_real_only_marker_runs_only_on_real(nsq_broker_kind):
    assert nsq_broker_kind == "real"


@pytest.mark.embedded_only
def test_embedded_only_marker_runs_only_on_embedded(nsq_broker_kind):
    assert nsq_broker_kind == "embedded"


@pytest.mark.real_only
def test_real_fault_controls_are_embedded_only(nsqd):
    # stall_nsqd/unstall_nsqd work on real nsqd too (SIGSTOP/SIGCONT)
    for call in (
        lambda: nsqd.drop_connections(0),
        lambda: nsqd.inject_frame(0, b""),
    ):
        with pytest.raises(NotImplementedError):
            call()


@pytest.mark.real_only
def test_real_log_tail_names_each_process(nsq_cluster):
    tail = nsq_cluster.log_tail(5)
    assert "nsqlookupd" in tail
    assert tail.count("--- nsqd") == 3


def test_broker_kind_follows_nsq_bin_dir(nsq_broker_kind):
    bin_dir = os.environ.get("NSQ_BIN_DIR")
    has_binaries = bool(bin_dir) and all(
        os.access(os.path.join(bin_dir, b), os.X_OK) for b in ("nsqd", "nsqlookupd")
    )
    assert nsq_broker_kind == ("real" if has_binaries else "embedded")


# ------------------------------------------------------------------------ real runner helpers


@pytest.mark.parametrize(
    "seconds, text",
    [
        (1, "1000ms"),
        (0.5, "500ms"),
        (1.5, "1500ms"),
        (0, "0ms"),
        (0.0005, "500us"),
        (3600, "3600000ms"),
    ],
)
def test_duration_flag(seconds, text):
    assert duration_flag(seconds) == text


@pytest.mark.parametrize("bad", [-1, "1s", None, True])
def test_duration_flag_rejects(bad):
    with pytest.raises(ValueError):
        duration_flag(bad)


def test_nsqd_flags():
    flags = nsqd_flags(
        {
            "msg_timeout": 1.5,
            "max_rdy_count": 5,
            "snappy": False,
            "deflate": True,
            "tls_required": 1,
            "auth_http_address": ["127.0.0.1:1", "127.0.0.1:2"],
            "lookupd_legacy_json": True,  # embedded-only: dropped
            "tls_cert": None,  # None: dropped
        }
    )
    assert flags == [
        "--msg-timeout=1500ms",
        "--max-rdy-count=5",
        "--snappy=false",
        "--deflate=true",
        "--tls-required=tcp-https",
        "--auth-http-address=127.0.0.1:1",
        "--auth-http-address=127.0.0.1:2",
    ]
    assert nsqd_flags({"tls_required": 0}) == ["--tls-required=false"]
    assert nsqd_flags({"tls_required": 2}) == ["--tls-required=true"]
    with pytest.raises(ValueError):
        nsqd_flags({"tcp_address": "0.0.0.0:4150"})  # the runner owns the addresses


def test_real_runner_needs_binaries(tmp_path, monkeypatch):
    monkeypatch.delenv("NSQ_BIN_DIR", raising=False)
    with pytest.raises(RealNSQError):
        RealNSQ()
    with pytest.raises(RealNSQError):
        RealNSQ(bin_dir=tmp_path)


# ------------------------------------------------------------------------ auth server


def test_auth_server_answers_like_nsqd_expects(auth_server):
    server = auth_server({"s": {"identity": "me", "ttl": 5}, "none": {"authorizations": []}})
    resp = requests.get(
        f"{server.url}/auth",
        params={"remote_ip": "1.2.3.4", "tls": "false", "secret": "s"},
        timeout=5,
    )
    assert resp.status_code == 200
    assert resp.json() == {
        "ttl": 5,
        "identity": "me",
        "identity_url": "",
        "authorizations": [ALLOW_ALL],
    }
    assert (
        requests.get(f"{server.url}/auth", params={"secret": "none"}, timeout=5).json()[
            "authorizations"
        ]
        == []
    )
    assert requests.get(f"{server.url}/auth", params={"secret": "x"}, timeout=5).status_code == 403
    assert requests.get(f"{server.url}/other", timeout=5).status_code == 404
    assert [r["secret"] for r in server.requests] == ["s", "none", "x"]
    assert server.requests[0]["remote_ip"] == "1.2.3.4"


def test_auth_server_close_joins_its_thread():
    server = AuthServer({}).start()
    thread = server._thread
    server.close()
    assert thread is not None and not thread.is_alive()


# ------------------------------------------------------------------------ wait_for


def test_wait_for_returns_the_truthy_value():
    calls = []

    def predicate():
        calls.append(1)
        return len(calls) >= 3 and "done"

    assert wait_for(predicate, timeout=5, interval=0.001) == "done"
    assert len(calls) == 3


def test_wait_for_raises_with_the_message():
    with pytest.raises(AssertionError, match="never true"):
        wait_for(lambda: False, timeout=0.05, interval=0.01, message="never true")
    with pytest.raises(AssertionError, match="state was 42"):
        wait_for(lambda: 0, timeout=0.05, message=lambda: "state was 42")
