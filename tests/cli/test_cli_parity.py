"""The Go tools' flags that ``nsqclient`` took over later, run against the test broker:
``to-file --topic-pattern/--topic-refresh/--work-dir``, ``stat``'s HTTP timeouts, and what
``pub`` says of the lines it never sent."""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Any

from nsqclient import LookupdClient, NsqdHTTPClient, Producer
from nsqclient.testing.waiting import wait_for

TIMEOUT = 20.0


def publish(node: Any, topic: str, bodies: list[bytes]) -> None:
    with Producer(node.tcp_address) as producer:
        producer.mpub(topic, bodies)


def files_in(directory: Path) -> list[Path]:
    if not directory.exists():
        return []
    return sorted(p for p in directory.rglob("*") if p.is_file())


def lines_by_topic(directory: Path) -> dict[str, set[bytes]]:
    """The lines of each topic's files (named ``<TOPIC>...``)."""
    out: dict[str, set[bytes]] = {}
    for path in files_in(directory):
        out.setdefault(path.name.split(".")[0], set()).update(path.read_bytes().splitlines())
    return out


def listed(lookupd_address: str, topics: list[str]) -> bool:
    with LookupdClient(lookupd_address, timeout=2.0) as lookupd:
        return set(topics) <= set(lookupd.topics())


def test_to_file_topic_pattern_archives_matching_topics_found_later_too(nsqd, cli, tmp_path):
    node, lookupd = nsqd.nsqd, nsqd.lookupd.http_address
    publish(node, "arch_a", [b"a1", b"a2"])
    publish(node, "arch_b", [b"b1"])
    publish(node, "other_c", [b"c1"])
    wait_for(lambda: listed(lookupd, ["arch_a", "arch_b", "other_c"]), TIMEOUT)
    out = tmp_path / "out"
    run = cli.start(
        "to-file", "--topic-pattern", "^arch_", "--topic-refresh", "200ms",
        "--lookupd-http-address", lookupd, "--output-dir", str(out),
        "--filename-format", "<TOPIC>.log", "--sync-interval", "0.1", "--log-level", "info",
    )  # fmt: skip
    wait_for(
        lambda: lines_by_topic(out) == {"arch_a": {b"a1", b"a2"}, "arch_b": {b"b1"}},
        TIMEOUT,
        message=lambda: f"{lines_by_topic(out)}; {run.stderr}",
    )
    # A topic created while it runs is found at a later refresh; one that does not match, never.
    publish(node, "arch_new", [b"n1"])
    publish(node, "other_d", [b"d1"])
    wait_for(
        lambda: lines_by_topic(out).get("arch_new") == {b"n1"},
        TIMEOUT,
        message=lambda: f"{lines_by_topic(out)}; {run.stderr}",
    )
    run.signal(signal.SIGINT)
    assert run.wait() == 0, run.stderr
    assert set(lines_by_topic(out)) == {"arch_a", "arch_b", "arch_new"}
    for topic, count in (("arch_a", 2), ("arch_b", 1), ("arch_new", 1)):
        assert f"{topic}: wrote {count} messages ({count} finished" in run.stderr


def test_to_file_topic_pattern_filters_the_topics_given(nsqd, cli, tmp_path):
    node = nsqd.nsqd
    publish(node, "keep_me", [b"k"])
    publish(node, "drop_me", [b"d"])
    out = tmp_path / "out"
    run = cli.start(
        "to-file", "--topic", "keep_me", "--topic", "drop_me", "--topic-pattern", "^keep",
        "--nsqd-tcp-address", node.tcp_address, "--output-dir", str(out),
        "--filename-format", "<TOPIC>.log", "--sync-interval", "0.1",
    )  # fmt: skip
    wait_for(
        lambda: lines_by_topic(out) == {"keep_me": {b"k"}}, TIMEOUT, message=lambda: run.stderr
    )
    run.signal(signal.SIGINT)
    assert run.wait() == 0, run.stderr
    assert "skipping topic drop_me: it does not match --topic-pattern" in run.stderr
    assert "drop_me: wrote" not in run.stderr


def test_to_file_work_dir_holds_open_files_and_output_dir_only_closed_ones(nsqd, cli, tmp_path):
    node = nsqd.nsqd
    work, out = tmp_path / "work", tmp_path / "out"
    out.mkdir()
    # <REV> 0's name is taken in the output directory: the file is opened as <REV> 1.
    (out / "wd-000000.log").write_bytes(b"older archive\n")
    publish(node, "wd", [b"m%d" % i for i in range(20)])
    run = cli.start(
        "to-file", "--topic", "wd", "--nsqd-tcp-address", node.tcp_address,
        "--output-dir", str(out), "--work-dir", str(work),
        "--filename-format", "<TOPIC><REV>.log", "--sync-interval", "0.1",
    )  # fmt: skip
    open_file = work / "wd-000001.log"
    wait_for(
        lambda: open_file.exists() and len(open_file.read_bytes().splitlines()) == 20,
        TIMEOUT,
        message=lambda: f"{files_in(work)}; {run.stderr}",
    )
    assert files_in(out) == [out / "wd-000000.log"]  # nothing half-written in the output
    # Meanwhile another archiver takes <REV> 1 in the output: the move takes <REV> 2.
    (out / "wd-000001.log").write_bytes(b"someone else\n")
    run.signal(signal.SIGINT)
    assert run.wait() == 0, run.stderr
    assert files_in(work) == []
    assert (out / "wd-000000.log").read_bytes() == b"older archive\n"
    assert (out / "wd-000001.log").read_bytes() == b"someone else\n"
    moved = (out / "wd-000002.log").read_bytes().splitlines()
    assert sorted(moved) == sorted(b"m%d" % i for i in range(20))
    assert f"wd: wrote 20 messages (20 finished, 0 requeued) to 1 file(s) in {out}" in run.stderr


def test_to_file_work_dir_moves_each_rotated_file_while_running(nsqd, cli, tmp_path):
    node = nsqd.nsqd
    work, out = tmp_path / "work", tmp_path / "out"
    bodies = [b"rotating-%03d" % i for i in range(60)]
    run = cli.start(
        "to-file", "--topic", "wr", "--nsqd-tcp-address", node.tcp_address,
        "--output-dir", str(out), "--work-dir", str(work), "--rotate-size", "100",
        "--sync-interval", "0.1",
    )  # fmt: skip
    publish(node, "wr", bodies)
    # Every file but the one still open reaches the output directory while the tool runs.
    wait_for(
        lambda: sum(len(p.read_bytes().splitlines()) for p in files_in(out)) >= 50,
        TIMEOUT,
        message=lambda: f"{files_in(out)} {files_in(work)}; {run.stderr}",
    )
    assert len(files_in(work)) <= 1
    run.signal(signal.SIGINT)
    assert run.wait() == 0, run.stderr
    assert files_in(work) == []
    written = [line for p in files_in(out) for line in p.read_bytes().splitlines()]
    assert sorted(written) == bodies
    assert all(re.search(r"-\d{6}\.", p.name) for p in files_in(out))


def test_stat_with_both_http_timeouts(nsqd, cli):
    node = nsqd.nsqd
    with NsqdHTTPClient(node.http_address) as client:
        client.create_topic("st_to")
        client.create_channel("st_to", "c")  # the channel exists before the messages come
    publish(node, "st_to", [b"x", b"y"])
    result = cli.run(
        "stat", "--topic", "st_to", "--channel", "c", "--nsqd-http-address", node.http_address,
        "--count", "1", "--http-client-connect-timeout", "500ms",
        "--http-client-request-timeout", "2s",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    row = result.stdout.decode().splitlines()[-1]
    assert row.split("|")[1].split()[0] == "2"  # the depth: both messages wait in the channel


def test_pub_says_how_many_lines_it_never_sent(nsqd, cli, tmp_path):
    node = nsqd.nsqd
    source = tmp_path / "lines"
    big = b"x" * (1024 * 1024 + 10)  # over nsqd's --max-msg-size: refused
    after = b"".join(b"after-%d\n" % i for i in range(20000))  # several reads' worth
    source.write_bytes(b"a\nb\n\nc\n" + big + b"\n" + after)
    result = cli.run(
        "pub", str(source), "--topic", "pub_stop", "--nsqd-tcp-address", node.tcp_address
    )
    assert result.returncode == 1, result.stderr
    err = result.stderr.decode()
    assert "nsqclient pub: error: publishing to" in err
    assert "published 3 messages" in err
    assert "failed 1, empty skipped 1" in err
    assert "not sent 20001 (the failed batch of 1 and 20000 after it)" in err


def test_pub_from_an_ended_pipe_counts_exactly_what_was_not_sent(nsqd, cli):
    # The input ended (the pipe closed) before the failure: the count is exact, and nothing
    # claims unread input.  (Open pipes: tests/cli/test_cli_pub_dead.py.)
    node = nsqd.nsqd
    big = b"y" * (1024 * 1024 + 10)
    result = cli.run(
        "pub", "--topic", "pub_stop_pipe", "--nsqd-tcp-address", node.tcp_address,
        input=b"a\n" + big + b"\nz\n",
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    err = result.stderr.decode()
    assert "not sent 2 (the failed batch of 1 and 1 after it)" in err
    assert "the rest of the input was not read" not in err
