"""The ``nsqclient`` tools run as subprocesses against the test broker (embedded NSQ, or real
nsqd/nsqlookupd with NSQ_BIN_DIR)."""

from __future__ import annotations

import gzip
import json
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from nsqclient import LookupdClient, NsqdHTTPClient, Producer
from nsqclient.testing.helpers import channel_stats
from nsqclient.testing.waiting import wait_for

TIMEOUT = 20.0


def publish(node: Any, topic: str, bodies: list[bytes]) -> None:
    with Producer(node.tcp_address) as producer:
        for i in range(0, len(bodies), 500):
            producer.mpub(topic, bodies[i : i + 500])


def topic_message_count(node: Any, topic: str) -> int:
    with NsqdHTTPClient(node.http_address) as client:
        stats = client.stats(topic, include_clients=False)
    return sum(t["message_count"] for t in stats.get("topics") or [] if t["topic_name"] == topic)


def lines_in(directory: Path) -> list[bytes]:
    out: list[bytes] = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        out.extend(path.read_bytes().splitlines())
    return out


# ------------------------------------------------------------------------------------------------
# pub and tail


def test_seq_10000_through_pub_then_tail_n_gives_every_line(nsqd, cli):
    node = nsqd.nsqd
    seq = b"".join(b"%d\n" % i for i in range(1, 10001))
    pub = cli.run("pub", "--topic", "cli_seq", "--nsqd-tcp-address", node.tcp_address, input=seq)
    assert pub.returncode == 0, pub.stderr
    assert b"published 10000 messages" in pub.stderr
    assert b"failed 0" in pub.stderr
    assert pub.stdout == b""

    # No channel existed: the topic kept every message for the first one, tail's.
    tail = cli.run(
        "tail", "--topic", "cli_seq", "--nsqd-tcp-address", node.tcp_address, "-n", "10000"
    )
    assert tail.returncode == 0, tail.stderr
    lines = tail.stdout.splitlines()
    assert len(lines) == 10000
    assert sorted(int(x) for x in lines) == list(range(1, 10001))


def test_pub_reads_a_file_with_a_delimiter_and_tail_prints_json(nsqd, cli, tmp_path):
    node = nsqd.nsqd
    source = tmp_path / "records"
    source.write_bytes(b"one\0two\0\0three\nstill three")
    pub = cli.run(
        "pub", str(source), "--topic", "cli_file", "--delimiter", "\\0",
        "--nsqd-tcp-address", node.tcp_address, "--batch-size", "1",
    )  # fmt: skip
    assert pub.returncode == 0, pub.stderr
    assert b"published 3 messages" in pub.stderr
    assert b"empty skipped 1" in pub.stderr

    started_ns = time.time_ns()
    tail = cli.run(
        "tail", "--topic", "cli_file", "--nsqd-tcp-address", node.tcp_address, "-n", "3", "--json"
    )
    assert tail.returncode == 0, tail.stderr
    records = [json.loads(line) for line in tail.stdout.splitlines()]
    assert sorted(r["body"] for r in records) == ["one", "three\nstill three", "two"]
    for r in records:
        assert r["topic"] == "cli_file"
        assert len(r["id"]) == 16 and int(r["id"], 16) >= 0
        assert r["attempts"] == 1
        assert 0 < started_ns - r["timestamp"] < 120 * 10**9
        assert r["nsqd"] == node.tcp_address


def test_tail_several_topics_with_print_topic_through_lookupd(nsqd, cli):
    node = nsqd.nsqd
    publish(node, "cli_ta", [b"a1", b"a2"])
    publish(node, "cli_tb", [b"b1"])
    with LookupdClient(nsqd.lookupd.http_address) as lookupd:
        wait_for(lambda: all(lookupd_has(lookupd, t) for t in ("cli_ta", "cli_tb")), TIMEOUT)
    tail = cli.run(
        "tail", "--topic", "cli_ta", "--topic", "cli_tb", "--print-topic", "-n", "3",
        "--lookupd-http-address", nsqd.lookupd.http_address,
    )  # fmt: skip
    assert tail.returncode == 0, tail.stderr
    assert sorted(tail.stdout.splitlines()) == [b"cli_ta | a1", b"cli_ta | a2", b"cli_tb | b1"]


def lookupd_has(lookupd: LookupdClient, topic: str) -> bool:
    try:
        return bool(lookupd.lookup(topic)["producers"])
    except Exception:
        return False


def test_tail_sigint_requeues_what_it_did_not_print_and_exits_0(nsqd, cli):
    node = nsqd.nsqd
    total = 60
    tail = cli.start(
        "tail", "--topic", "cli_int", "--channel", "c", "--max-in-flight", "20",
        "--nsqd-tcp-address", node.tcp_address, read_stdout=False,
    )  # fmt: skip
    # Each line is more than the pipe holds and nobody reads the tail's stdout: the first
    # write blocks, so the tail holds 20 messages in flight (one printing, the others waiting) and
    # finishes none of them until the pipe is drained.
    fcntl = pytest.importorskip("fcntl", reason="the pipe's size is asked with fcntl (POSIX)")
    line = fcntl.fcntl(tail.proc.stdout.fileno(), fcntl.F_GETPIPE_SZ) + 1000
    publish(node, "cli_int", [b"%04d" % i + b"x" * line for i in range(total)])
    wait_for(
        lambda: (channel_stats(node, "cli_int", "c") or {}).get("in_flight_count") == 20,
        TIMEOUT,
        message=lambda: f"in flight: {channel_stats(node, 'cli_int', 'c')}; {tail.stderr}",
    )
    tail.signal(signal.SIGINT)
    # Drain only once the tail has acted on the signal (its CLS sets its RDY to 0 on nsqd):
    # drained earlier, it could print everything before it sees the signal.
    wait_for(
        lambda: [c["ready_count"] for c in channel_stats(node, "cli_int", "c")["clients"]] == [0],
        TIMEOUT,
        message=lambda: f"not closing: {channel_stats(node, 'cli_int', 'c')}; {tail.stderr}",
    )
    printed = tail.proc.stdout.read().splitlines()  # drains the pipe; ends when tail exits
    assert tail.wait() == 0, tail.stderr
    assert "Traceback" not in tail.stderr
    # nsqd may still be reading the REQs the tail wrote just before it closed: wait for them
    # (a message left in flight would stay so until msg_timeout, 60 s, and fail this wait)
    stats = wait_for(
        lambda: (c := channel_stats(node, "cli_int", "c")) and c["in_flight_count"] == 0 and c,
        TIMEOUT,
        message=lambda: f"left in flight: {channel_stats(node, 'cli_int', 'c')}",
    )
    assert stats["in_flight_count"] == 0  # nothing left waiting for a timeout
    assert len(printed) <= 1  # the line it was writing when the signal came, if any
    assert stats["requeue_count"] == 20 - len(printed)  # the rest: handed back at once
    assert stats["depth"] + len(printed) == total


def test_tail_exits_0_when_its_reader_goes_away(nsqd, cli):
    node = nsqd.nsqd
    # 200 KB: more than a pipe holds, so the tail is still writing when the reader goes.
    publish(node, "cli_pipe", [b"m%03d" % i + b"x" * 2000 for i in range(100)])
    tail = cli.start(
        "tail", "--topic", "cli_pipe", "--channel", "c", "--max-in-flight", "1",
        "--nsqd-tcp-address", node.tcp_address, read_stdout=False,
    )  # fmt: skip
    first = tail.proc.stdout.readline()
    assert first.startswith(b"m")
    tail.proc.stdout.close()  # like `| head -1`
    assert tail.wait() == 0, tail.stderr
    assert "Traceback" not in tail.stderr
    stats = wait_for(
        lambda: (c := channel_stats(node, "cli_pipe", "c")) and c["in_flight_count"] == 0 and c,
        TIMEOUT,
        message=lambda: f"left in flight: {channel_stats(node, 'cli_pipe', 'c')}",
    )
    assert stats["in_flight_count"] == 0
    assert stats["requeue_count"] >= 1  # the message it could not print went back at once
    assert stats["depth"] >= 1


def test_pub_rate_spaces_the_messages(nsqd, cli):
    node = nsqd.nsqd
    started = time.monotonic()
    pub = cli.run(
        "pub", "--topic", "cli_rate", "--rate", "100", "--nsqd-tcp-address", node.tcp_address,
        input=b"".join(b"%d\n" % i for i in range(21)),
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert pub.returncode == 0, pub.stderr
    assert b"published 21 messages" in pub.stderr
    assert elapsed >= 0.2  # message 20 may not leave before 20/100 s
    assert topic_message_count(node, "cli_rate") == 21


def test_pub_sigint_stops_and_reports_with_status_130(nsqd, cli):
    node = nsqd.nsqd
    pub = cli.start(
        "pub", "--topic", "cli_pint", "--nsqd-tcp-address", node.tcp_address, stdin=subprocess.PIPE
    )
    pub.proc.stdin.write(b"a\nb\nc\n")
    pub.proc.stdin.flush()
    wait_for(
        lambda: topic_message_count(node, "cli_pint") == 3, TIMEOUT, message=lambda: pub.stderr
    )
    pub.signal(signal.SIGINT)
    assert pub.wait() == 130
    assert "published 3 messages" in pub.stderr
    assert "stopped by SIGINT" in pub.stderr


def test_pub_to_two_nsqd_sends_every_message_to_each(nsq_cluster_factory, cli):
    cluster = nsq_cluster_factory(nsqd_count=2)
    a, b = cluster.nsqds
    pub = cli.run(
        "pub", "--topic", "cli_fan", "--nsqd-tcp-address", a.tcp_address,
        "--nsqd-tcp-address", b.tcp_address, input=b"x\ny\n",
    )  # fmt: skip
    assert pub.returncode == 0, pub.stderr
    assert topic_message_count(a, "cli_fan") == 2
    assert topic_message_count(b, "cli_fan") == 2


# ------------------------------------------------------------------------------------------------
# stat


def test_stat_shows_the_depth_summed_over_every_nsqd_found_by_lookupd(nsq_cluster_factory, cli):
    cluster = nsq_cluster_factory(nsqd_count=2)
    a, b = cluster.nsqds
    for node in (a, b):
        with NsqdHTTPClient(node.http_address) as client:
            client.create_topic("cli_stat")
            client.create_channel("cli_stat", "c")
    publish(a, "cli_stat", [b"m"] * 100)
    publish(b, "cli_stat", [b"m"] * 23)
    with LookupdClient(cluster.lookupd.http_address) as lookupd:
        wait_for(lambda: len(lookupd.lookup("cli_stat")["producers"]) == 2, TIMEOUT)
    result = cli.run(
        "stat", "--topic", "cli_stat", "--channel", "c", "--count", "2", "--interval", "0.2",
        "--lookupd-http-address", cluster.lookupd.http_address,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode().splitlines()
    assert lines[0].startswith("------rate------+")
    assert lines[1].split()[:3] == ["ingress", "egress", "|"]
    rows = [line.split() for line in lines[2:]]
    assert len(rows) == 2
    for row in rows:
        # ingress egress | total mem disk inflt def | req t-o msgs clients
        assert row[3:6] == ["123", "123", "0"]
        assert row[11] == "123"
    assert rows[0][:2] == ["-", "-"]
    assert rows[1][:2] == ["0", "0"]

    direct = cli.run(
        "stat", "--topic", "cli_stat", "--channel", "c", "--count", "1",
        "--nsqd-http-address", b.http_address,
    )  # fmt: skip
    assert direct.returncode == 0, direct.stderr
    assert direct.stdout.decode().splitlines()[2].split()[3] == "23"


def test_stat_unknown_channel_fails_with_a_message(nsqd, cli):
    node = nsqd.nsqd
    publish(node, "cli_stat2", [b"m"])
    result = cli.run(
        "stat", "--topic", "cli_stat2", "--channel", "nope", "--count", "1",
        "--nsqd-http-address", node.http_address,
    )  # fmt: skip
    assert result.returncode == 1
    assert b"channel 'nope' of topic 'cli_stat2' not found" in result.stderr


# ------------------------------------------------------------------------------------------------
# to-file


def to_file_args(node: Any, topic: str, out: Path, *extra: str) -> list[str]:
    return [
        "to-file", "--topic", topic, "--nsqd-tcp-address", node.tcp_address,
        "--output-dir", str(out), "--sync-interval", "0.05", *extra,
    ]  # fmt: skip


def test_to_file_killed_mid_run_and_restarted_loses_nothing(nsqd, cli, tmp_path):
    node = nsqd.nsqd
    total = 10000
    expected = {b"msg-%05d" % i for i in range(total)}
    publish(node, "cli_kill", sorted(expected))
    out = tmp_path / "out"
    # msg_timeout 1s: what the killed run had in flight comes back after a second.
    args = to_file_args(
        node, "cli_kill", out, "--max-in-flight", "50", "--consumer-opt", "msg_timeout,1s"
    )
    first = cli.start(*args)
    wait_for(
        lambda: out.exists() and len(lines_in(out)) >= 300, TIMEOUT, message=lambda: first.stderr
    )
    first.proc.kill()
    assert first.wait() == -9  # Popen.kill(): SIGKILL (every simulation is Linux underneath)
    written_by_first = len(lines_in(out))
    assert written_by_first < total, "the first run finished before it was killed"

    second = cli.start(*args)
    wait_for(
        lambda: set(lines_in(out)) >= expected,
        TIMEOUT,
        message=lambda: f"{len(set(lines_in(out)) & expected)} of {total}; {second.stderr}",
    )
    stats = wait_for(
        lambda: (s := channel_stats(node, "cli_kill", "nsq_to_file")) and s["depth"] == 0
        and s["in_flight_count"] == 0 and s,
        TIMEOUT,
    )  # fmt: skip
    second.signal(signal.SIGINT)
    assert second.wait() == 0, second.stderr
    lines = lines_in(out)
    assert set(lines) == expected  # nothing lost, nothing garbled
    duplicates = len(lines) - total
    # Only messages written by the killed run and not yet finished can come twice.
    assert 0 <= duplicates <= 50
    assert stats["message_count"] == total
    assert "wrote" in second.stderr


def test_to_file_sigint_syncs_finishes_and_exits_0(nsqd, cli, tmp_path):
    node = nsqd.nsqd
    publish(node, "cli_tf", [b"line%d" % i for i in range(500)])
    out = tmp_path / "o"
    run = cli.start(*to_file_args(node, "cli_tf", out, "--sync-interval", "30s"))
    # With a 30s sync interval, messages are finished only when the consumer starves: wait
    # until everything is written, then SIGINT must sync and finish the rest.
    wait_for(
        lambda: out.exists() and len(lines_in(out)) == 500, TIMEOUT, message=lambda: run.stderr
    )
    run.signal(signal.SIGINT)
    assert run.wait() == 0, run.stderr
    stats = channel_stats(node, "cli_tf", "nsq_to_file")
    assert stats is not None
    assert (stats["depth"], stats["in_flight_count"], stats["requeue_count"]) == (0, 0, 0)
    assert sorted(lines_in(out)) == sorted(b"line%d" % i for i in range(500))
    files = list(out.iterdir())
    assert len(files) == 1
    host = socket.gethostname().split(".")[0]
    assert files[0].name.startswith(f"cli_tf.{host}.") and files[0].name.endswith(".log")
    assert "cli_tf: wrote 500 messages (500 finished, 0 requeued) to 1 file(s)" in run.stderr


def test_to_file_gzip_and_size_rotation(nsqd, cli, tmp_path):
    node = nsqd.nsqd
    bodies = [b"%04d-" % i + b"z" * 100 for i in range(400)]
    publish(node, "cli_gz", bodies)
    out = tmp_path / "gz"
    run = cli.start(
        *to_file_args(
            node, "cli_gz", out, "--gzip", "--rotate-size", "2k",
            "--filename-format", "<TOPIC>/<DATETIME><REV>.log", "--datetime-format", "%Y",
        )
    )  # fmt: skip
    wait_for(
        lambda: (
            (channel_stats(node, "cli_gz", "nsq_to_file") or {}).get("message_count") == 400
            and channel_stats(node, "cli_gz", "nsq_to_file")["in_flight_count"] == 0
            and channel_stats(node, "cli_gz", "nsq_to_file")["depth"] == 0
        ),
        TIMEOUT,
        message=lambda: run.stderr,
    )
    run.signal(signal.SIGINT)
    assert run.wait() == 0, run.stderr
    files = sorted((out / "cli_gz").iterdir())
    assert len(files) > 1  # rotated
    year = time.strftime("%Y")
    assert [f.name for f in files[:2]] == [f"{year}-000000.log.gz", f"{year}-000001.log.gz"]
    lines = []
    for f in files:
        lines.extend(gzip.decompress(f.read_bytes()).splitlines())
    assert sorted(lines) == sorted(bodies)


def test_to_file_appends_to_the_same_file_across_runs_and_mends_a_cut_line(nsqd, cli, tmp_path):
    node = nsqd.nsqd
    out = tmp_path / "app"
    out.mkdir()
    fmt = ["--filename-format", "<TOPIC>.log"]
    (out / "cli_app.log").write_bytes(b"old\npartial")  # as a power cut might leave it
    publish(node, "cli_app", [b"new1", b"new2"])
    run = cli.start(*to_file_args(node, "cli_app", out, *fmt))
    wait_for(lambda: len(lines_in(out)) == 4, TIMEOUT, message=lambda: run.stderr)
    run.signal(signal.SIGINT)
    assert run.wait() == 0, run.stderr
    assert (out / "cli_app.log").read_bytes() in (
        b"old\npartial\nnew1\nnew2\n",
        b"old\npartial\nnew2\nnew1\n",
    )


# ------------------------------------------------------------------------------------------------
# failures and usage


def test_every_tool_exits_1_with_a_message_when_nsqd_is_down(cli, free_port, tmp_path):
    tcp = f"127.0.0.1:{free_port()}"
    http = f"127.0.0.1:{free_port()}"
    pub = cli.start("pub", "--topic", "t", "--nsqd-tcp-address", tcp, stdin=subprocess.PIPE)
    pub.proc.stdin.write(b"x\n")
    pub.proc.stdin.close()
    runs = {  # all at once: each is a Python start-up
        "tail": cli.start("tail", "--topic", "t", "--nsqd-tcp-address", tcp),
        "tail-lookupd": cli.start("tail", "--topic", "t", "--lookupd-http-address", http),
        "pub": pub,
        "stat": cli.start("stat", "--topic", "t", "--channel", "c", "--nsqd-http-address", http),
        "to-file": cli.start(*to_file_args_for(tcp, tmp_path)),
    }
    for name, run in runs.items():
        assert run.wait() == 1, (name, run.stderr)
        assert "error:" in run.stderr and "refused" in run.stderr.lower(), (name, run.stderr)
        assert "Traceback" not in run.stderr, name
        assert run.lines() == [], name
    assert "published 0 messages" in runs["pub"].stderr


def to_file_args_for(tcp: str, tmp_path: Path) -> list[str]:
    return ["to-file", "--topic", "t", "--nsqd-tcp-address", tcp, "--output-dir", str(tmp_path)]


def test_go_style_flags_and_version(cli):
    result = cli.run("--version")
    assert result.returncode == 0
    assert result.stdout.startswith(b"nsqclient ")
    result = cli.run("tail", "-topic=t")
    assert result.returncode == 2
    assert b"--nsqd-tcp-address or --lookupd-http-address required" in result.stderr


def test_the_console_script_is_installed():
    import sys

    script = Path(sys.executable).parent / "nsqclient"
    if not script.exists():
        pytest.skip("the package is not installed as a console script in this environment")
    result = subprocess.run([str(script), "--help"], capture_output=True, timeout=30)
    assert result.returncode == 0
    assert b"tail" in result.stdout and b"to-file" in result.stdout
