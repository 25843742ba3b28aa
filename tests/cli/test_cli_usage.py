"""What the ``nsqclient`` command says when it is used wrongly, and the flags every subcommand
shares: option names and owners, unknown flags, ``--version``, durations, HTTP timeouts."""

from __future__ import annotations

import errno
import os
import threading
from typing import Any

import pytest
import requests

from nsqclient import __version__, durations
from nsqclient.cli import common, main, pub, to_file
from nsqclient.cli.topic_discovery import TopicDiscoverer, topic_matcher


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``nsqclient ARGS`` in this process: (exit status, stdout, stderr)."""
    try:
        status = main.main(list(args))
    except SystemExit as exc:  # argparse's own exits
        status = int(exc.code or 0)
    out, err = capsys.readouterr()
    return status, out, err


# ------------------------------------------------------------------------------ option names


@pytest.mark.parametrize(
    ("pair", "owner", "words"),
    [
        ("max-in-flight,5", "Consumer",
         "unknown option 'max-in-flight'; did you mean 'max_in_flight'?"),
        ("Snappy=true", None, "did you mean 'snappy'?"),
        ("max_in_flite,3", "Consumer", "did you mean 'max_in_flight'?"),
        ("max-in-flight,5", "Producer",
         "did you mean 'max_in_flight'? (a Consumer option, which --producer-opt does not take)"),
        ("max_in_flight,5", "Producer", "--producer-opt: max_in_flight is a Consumer option"),
        ("pub_timeout,5s", "Consumer", "--consumer-opt: pub_timeout is a Producer option"),
        ("snappy", None, "expected NAME,VALUE or NAME=VALUE (the value is missing)"),
        ("nonsense", None, "expected NAME,VALUE"),
    ],
)  # fmt: skip
def test_option_names_are_checked_with_a_suggestion_and_their_class(pair, owner, words):
    with pytest.raises(common.UsageError) as info:
        common.client_options([pair], owner)
    assert words in str(info.value)


def test_options_of_the_right_class_pass():
    assert common.client_options(["pub_timeout,2s"], "Producer") == {"pub_timeout": 2.0}
    assert common.client_options(["max_in_flight=3"], "Consumer", max_in_flight=1) == {
        "max_in_flight": 3
    }


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["pub", "--topic", "t", "--nsqd-tcp-address", "127.0.0.1:1",
          "--producer-opt", "max_in_flight,5"], "max_in_flight is a Consumer option"),
        (["pub", "--topic", "t", "--nsqd-tcp-address", "127.0.0.1:1",
          "--producer-opt", "max-in-flight,5"], "did you mean 'max_in_flight'?"),
        (["tail", "--topic", "t", "--nsqd-tcp-address", "127.0.0.1:1",
          "--consumer-opt", "pub_timeout,5"], "pub_timeout is a Producer option"),
        (["to-file", "--topic", "t", "--nsqd-tcp-address", "127.0.0.1:1",
          "--consumer-opt", "pub_retries,2"], "pub_retries is a Producer option"),
    ],
)  # fmt: skip
def test_an_option_of_the_other_class_is_a_usage_error(capsys, tmp_path, args, words):
    if args[0] == "to-file":
        args = [*args, "--output-dir", str(tmp_path)]
    status, out, err = run_main(capsys, *args)
    assert status == 2, err
    assert words in err
    assert f"usage: nsqclient {args[0]}" in err
    assert out == ""


# ------------------------------------------------------------------------------ unknown flags


@pytest.mark.parametrize("command", ["tail", "pub", "stat", "to-file"])
def test_an_unknown_flag_shows_the_subcommands_usage(capsys, command):
    required = {
        "tail": ["--topic", "t"],
        "pub": ["--topic", "t"],
        "stat": ["--topic", "t", "--channel", "c"],
        "to-file": ["--topic", "t"],
    }[command]
    status, _, err = run_main(capsys, command, *required, "--bogus", "-also-bogus=1")
    assert status == 2
    assert f"usage: nsqclient {command} [-h]" in err
    assert f"nsqclient {command}: error: unrecognized arguments: --bogus -also-bogus=1" in err


def test_an_unknown_flag_before_the_subcommand_shows_the_top_level_usage(capsys):
    status, _, err = run_main(capsys, "--bogus", "tail", "--topic", "t")
    assert status == 2
    assert "usage: nsqclient [-h]" in err
    assert "nsqclient: error: unrecognized arguments: --bogus" in err


# ------------------------------------------------------------------------------ --version


@pytest.mark.parametrize("command", ["tail", "pub", "stat", "to-file"])
@pytest.mark.parametrize("flag", ["--version", "-version"])
def test_every_subcommand_takes_version(capsys, command, flag):
    status, out, _ = run_main(capsys, command, flag)
    assert status == 0
    assert out == f"nsqclient {command} {__version__}\n"


# ------------------------------------------------------------------------------ durations


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("60", 60.0), ("0", 0.0), ("0.25", 0.25), ("60s", 60.0), ("1m30s", 90.0), ("250ms", 0.25)],
)
def test_one_duration_parser_for_the_cli_and_the_embedded_servers(text, seconds):
    from nsqclient.testing.__main__ import build_parser
    from nsqclient.testing.gostyle.flags import go_duration_seconds, parse_go_flags
    from nsqclient.testing.scripts import NSQD_FLAGS

    assert durations.parse_duration(text) == pytest.approx(seconds)
    assert common.parse_duration(text) == pytest.approx(seconds)
    assert go_duration_seconds(text) == pytest.approx(seconds)
    assert parse_go_flags(NSQD_FLAGS, [f"--msg-timeout={text}"])["msg_timeout"] == pytest.approx(
        seconds
    )
    assert build_parser().parse_args(["--msg-timeout", text]).msg_timeout == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "1m30", "60x", "inf", "s"])
def test_what_is_not_a_duration_is_refused_the_same_way_everywhere(text):
    from nsqclient.testing.gostyle.flags import FlagError, parse_go_flags
    from nsqclient.testing.scripts import NSQD_FLAGS

    with pytest.raises(durations.DurationError, match="invalid duration") as info:
        durations.parse_duration(text)
    assert isinstance(info.value, ValueError)
    with pytest.raises(FlagError, match="invalid duration"):
        parse_go_flags(NSQD_FLAGS, [f"--msg-timeout={text}"])


# ------------------------------------------------------------------------------ HTTP timeouts


def test_timeout_session_keeps_the_connect_timeout_apart(monkeypatch):
    seen: list[Any] = []

    def fake_request(self: Any, method: str, url: str, *args: Any, **kwargs: Any) -> str:
        seen.append(kwargs.get("timeout"))
        return "answer"

    monkeypatch.setattr(requests.Session, "request", fake_request)
    with common.TimeoutSession(0.75) as session:
        assert session.request("GET", "http://127.0.0.1:1/ping", timeout=5.0) == "answer"
        session.request("GET", "http://127.0.0.1:1/ping", timeout=(1.0, 2.0))
    assert seen == [(0.75, 5.0), (1.0, 2.0)]


@pytest.mark.parametrize("command", ["stat", "to-file"])
def test_http_timeout_flags(capsys, tmp_path, command):
    from nsqclient.cli.main import build_parser

    base = {
        "stat": ["stat", "--topic", "t", "--channel", "c", "--nsqd-http-address", "h:1"],
        "to-file": ["to-file", "--topic", "t", "--nsqd-tcp-address", "h:1"],
    }[command]
    args = build_parser().parse_args(base)
    assert (args.http_client_connect_timeout, args.http_client_request_timeout) == (2.0, 5.0)
    args = build_parser().parse_args(
        [*base, "--http-client-connect-timeout", "250ms", "--http-client-request-timeout", "3"]
    )
    assert (args.http_client_connect_timeout, args.http_client_request_timeout) == (0.25, 3.0)
    status, _, err = run_main(capsys, *base, "--http-client-connect-timeout", "0")
    assert status == 2 and "must be positive" in err


# ------------------------------------------------------------------------------ pub's summary


def test_pub_summary_says_what_was_not_sent():
    clock = iter([0.0, 2.0]).__next__
    summary = pub.Summary(clock)
    summary.published, summary.failed, summary.after, summary.skipped = 3, 1, 5, 2
    summary.error = "publishing to 127.0.0.1:4150 failed: E_BAD_MESSAGE"
    assert summary.line("t", 1, None) == (
        "nsqclient pub: published 3 messages to 't' (1 nsqd) in 2.00s, 2 msgs/s; "
        "failed 1, empty skipped 2; not sent 6 (the failed batch of 1 and 5 after it)"
    )
    summary = pub.Summary(iter([0.0, 1.0]).__next__)
    summary.published, summary.after, summary.after_complete = 10, 4, False
    assert summary.line("t", 1, "SIGINT").endswith(
        "; not sent at least 4; stopped by SIGINT before the end of the input; "
        "the rest of the input was not read"
    )
    untroubled = pub.Summary(iter([0.0, 1.0]).__next__)
    untroubled.published = 7
    assert "not sent" not in untroubled.line("t", 1, None)


def test_count_rest_counts_messages_not_empty_records():
    records = pub.split_records(iter([b"a\n\nb", b"c\nd\n", b"\n", b"e"]), b"\n")
    next(records)  # the part already handled
    assert pub.count_rest(records, threading.Event()) == (3, True)


# ------------------------------------------------------------------------------ to-file's flags


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--nsqd-tcp-address", "h:1"], "--topic or --topic-pattern required"),
        (["--topic-pattern", "^a", "--nsqd-tcp-address", "h:1"],
         "--topic-pattern without --topic needs --lookupd-http-address"),
        (["--topic-pattern", "(", "--lookupd-http-address", "h:1"],
         "--topic-pattern '(' is not a regular expression"),
        (["--topic", "b", "--topic-pattern", "^a", "--nsqd-tcp-address", "h:1"],
         "no --topic matches --topic-pattern '^a'"),
        (["--topic", "a", "--nsqd-tcp-address", "h:1", "--work-dir", "WORK",
          "--filename-format", "<TOPIC>.log"], "needs <REV> when --gzip, rotation or --work-dir"),
        (["--topic", "a", "--nsqd-tcp-address", "h:1", "--topic-refresh", "0"],
         "must be positive"),
    ],
)  # fmt: skip
def test_to_file_topic_and_work_dir_usage_errors(capsys, tmp_path, extra, words):
    extra = [str(tmp_path / "work") if a == "WORK" else a for a in extra]
    status, out, err = run_main(capsys, "to-file", "--output-dir", str(tmp_path / "out"), *extra)
    assert status == 2, err
    assert words in err
    assert out == ""


def test_topic_matcher_searches_like_go_regexp_matchstring():
    assert topic_matcher(None)("anything")
    assert topic_matcher("")("anything")
    match = topic_matcher("log")
    assert match("applog") and match("log_x") and not match("metrics")
    anchored = topic_matcher("^log$")
    assert anchored("log") and not anchored("applog")


class FakeLookupd:
    def __init__(self, topics: list[str], base_url: str = "http://fake:4161"):
        self.result: list[str] | Exception = topics
        self.base_url = base_url

    def topics(self) -> list[str]:
        if isinstance(self.result, Exception):
            raise self.result
        return list(self.result)


class FakeArchiver:
    def __init__(self, topic: str):
        self.topic = topic
        self.started = False
        self.consumer: Any = object()

    def start(self) -> None:
        self.started = True


def test_discoverer_adds_matching_topics_once_and_none_after_close():
    from nsqclient.errors import HTTPError

    first = FakeLookupd(["app_a", "other"])
    second = FakeLookupd(["app_b", "app_a"], "http://down:4161")
    made: list[str] = []

    def make(topic: str) -> FakeArchiver:
        if topic == "app_bad":
            raise ValueError("not for us")
        made.append(topic)
        return FakeArchiver(topic)

    disco = TopicDiscoverer(make, topic_matcher("^app_"), [first, second], 60.0)  # type: ignore[list-item]
    assert disco.refresh() == ["app_a", "app_b"]
    assert [a.topic for a in disco.archivers()] == ["app_a", "app_b"]
    assert all(a.started for a in disco.archivers())
    second.result = HTTPError(0, "connection refused", "http://down:4161/topics")
    first.result = ["app_a", "app_c", "app_bad"]
    assert disco.refresh() == ["app_c"]  # one lookupd down: the other still counts
    first.result = HTTPError(0, "connection refused", "http://fake:4161/topics")
    assert disco.list_topics() is None and disco.refresh() == []
    assert disco.close(1.0) == disco.archivers()
    first.result = ["app_d"]
    assert disco.refresh() == []
    assert made == ["app_a", "app_b", "app_c"]


def test_discoverer_start_raises_for_a_given_topic_it_cannot_archive():
    def make(topic: str) -> FakeArchiver:
        raise ValueError(f"cannot archive {topic}")

    disco: TopicDiscoverer[FakeArchiver] = TopicDiscoverer(make, topic_matcher(None), [], 1.0)
    with pytest.raises(ValueError, match="cannot archive t"):
        disco.start(["t"])


def test_move_exclusive_never_overwrites_and_copies_across_file_systems(tmp_path, monkeypatch):
    src = tmp_path / "work.log"
    src.write_bytes(b"new\n")
    taken = tmp_path / "taken.log"
    taken.write_bytes(b"old\n")
    with pytest.raises(FileExistsError):
        to_file.move_exclusive(str(src), str(taken))
    assert src.read_bytes() == b"new\n" and taken.read_bytes() == b"old\n"

    def no_link(a: str, b: str) -> None:
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(os, "link", no_link)
    with pytest.raises(FileExistsError):
        to_file.move_exclusive(str(src), str(taken))
    assert src.read_bytes() == b"new\n" and taken.read_bytes() == b"old\n"
    target = tmp_path / "sub" / "moved.log"
    target.parent.mkdir()
    to_file.move_exclusive(str(src), str(target))
    assert target.read_bytes() == b"new\n" and not src.exists()
