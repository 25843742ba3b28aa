"""The flag helpers of nsqclient.cli.common that several subcommands share."""

from __future__ import annotations

import argparse
import socket

import pytest

from nsqclient.cli import common


def _parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(exit_on_error=False)


@pytest.mark.parametrize(
    ("check", "good", "bad", "words"),
    [
        (common.positive_int, ("1", 1), "0", "must be positive"),
        (common.non_negative_int, ("0", 0), "-1", "must not be negative"),
        (common.positive_duration, ("2s", 2.0), "0", "must be positive"),
        (common.non_negative_duration, ("0", 0.0), "-1s", "must not be negative"),
        (common.topic_name, ("t#ephemeral", "t#ephemeral"), "bad!", "invalid topic name"),
        (common.channel_name, ("c", "c"), "", "invalid channel name"),
    ],
)
def test_flag_types_keep_good_values_and_name_the_problem(check, good, bad, words):
    assert check(good[0]) == good[1]
    with pytest.raises(argparse.ArgumentTypeError, match=words):
        check(bad)


def test_add_source_flags():
    parser = _parser()
    common.add_source_flags(parser, "dflt", "the channel")
    args = parser.parse_args(
        ["--topic", "a", "--topic", "b", "--nsqd-tcp-address", "127.0.0.1:4150"]
    )
    assert args.topics == ["a", "b"]
    assert args.channel == "dflt"
    assert args.nsqd_tcp_addresses == ["127.0.0.1:4150"]
    assert args.lookupd_http_addresses == []
    assert _parser_without_channel_default().parse_args(["--topic", "a"]).channel is None


def _parser_without_channel_default() -> argparse.ArgumentParser:
    parser = _parser()
    common.add_source_flags(parser, None, "the channel")
    return parser


def test_add_count_flag():
    parser = _parser()
    common.add_count_flag(
        parser, "-n", "--total", default=0, help="h", kind=common.non_negative_int
    )
    common.add_count_flag(parser, "--size", default=200, help="h")
    assert vars(parser.parse_args([])) == {"total": 0, "size": 200}
    assert parser.parse_args(["-n", "3", "--size", "1"]).total == 3
    with pytest.raises(argparse.ArgumentError):
        parser.parse_args(["--size", "0"])


def test_check_reachable_names_the_nsqd_that_does_not_answer():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    args = argparse.Namespace(nsqd_tcp_addresses=[f"127.0.0.1:{port}"], lookupd_http_addresses=[])
    with pytest.raises(common.CLIError, match=f"cannot connect to nsqd 127.0.0.1:{port}"):
        common.check_reachable(args, {"dial_timeout": 0.5}, "t")
    common.check_reachable(
        argparse.Namespace(nsqd_tcp_addresses=[], lookupd_http_addresses=[]), {}, "t"
    )
