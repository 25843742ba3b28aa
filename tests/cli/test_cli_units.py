"""The pieces of the ``nsqclient`` command that need no broker: flag parsing, record splitting,
batching, pacing, file names, the stat table, the JSON of tail."""

from __future__ import annotations

import argparse
import json
import threading

import pytest

from nsqclient.cli import common, main, pub, stat, tail, to_file
from nsqclient.message import Message
from nsqclient.protocol import DecodedMessage


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("2", 2.0),
        ("0.5", 0.5),
        ("2s", 2.0),
        ("500ms", 0.5),
        ("1m30s", 90.0),
        ("1h", 3600.0),
        ("1.5s", 1.5),
        ("250us", 0.00025),
        ("-1s", -1.0),
    ],
)
def test_parse_duration_takes_seconds_and_go_durations(text, seconds):
    assert common.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "2x", "1m30", "inf", "nan", "two"])
def test_parse_duration_refuses_garbage(text):
    with pytest.raises(argparse.ArgumentTypeError):
        common.parse_duration(text)


@pytest.mark.parametrize(
    ("text", "size"), [("100", 100), ("1k", 1024), ("2M", 2 << 20), ("1GiB", 1 << 30)]
)
def test_parse_size(text, size):
    assert common.parse_size(text) == size


def test_go_style_single_dash_flags_become_double_dash():
    known = {"--topic", "--print-topic", "--nsqd-tcp-address"}
    argv = [
        "tail",
        "-topic=t",
        "-print-topic",
        "-nsqd-tcp-address",
        "h:1",
        "-n",
        "5",
        "--",
        "-topic",
    ]
    assert common.go_style_flags(argv, known) == [
        "tail",
        "--topic=t",
        "--print-topic",
        "--nsqd-tcp-address",
        "h:1",
        "-n",
        "5",
        "--",
        "-topic",
    ]
    assert common.go_style_flags(["-unknown"], known) == ["-unknown"]


def test_client_options_convert_by_the_options_kind():
    opts = common.client_options(
        ["msg_timeout,30s", "snappy=true", "max_in_flight,7", "client_id,x"], max_in_flight=1
    )
    assert opts == {"msg_timeout": 30.0, "snappy": True, "max_in_flight": 7, "client_id": "x"}


@pytest.mark.parametrize(
    ("pair", "words"),
    [
        ("max_in_flite,3", "did you mean 'max_in_flight'"),
        ("snappy,maybe", "true or false"),
        ("max_in_flight,-1", "max_in_flight"),
        ("nonsense", "NAME,VALUE"),
    ],
)
def test_client_options_errors_are_usage_errors(pair, words):
    with pytest.raises(common.UsageError, match=words):
        common.client_options([pair])


def test_parse_delimiter():
    assert pub.parse_delimiter("\n") == b"\n"
    assert pub.parse_delimiter(",") == b","
    assert pub.parse_delimiter("\\t") == b"\t"
    assert pub.parse_delimiter("\\0") == b"\0"
    assert pub.parse_delimiter("\\x1e") == b"\x1e"
    for bad in ("ab", "", "é€"[1], "\\xzz"):
        with pytest.raises(common.UsageError, match="single byte"):
            pub.parse_delimiter(bad)


def test_split_records_joins_chunks_and_keeps_a_last_record_without_delimiter():
    chunks = [b"a\nb", b"c\n\nd", b"e", b"\nf"]
    assert list(pub.split_records(iter(chunks), b"\n")) == [[b"a"], [b"bc", b""], [b"de"], [b"f"]]
    assert list(pub.split_records(iter([b"x;y;"]), b";")) == [[b"x", b"y"]]


def test_batches_respect_count_and_bytes():
    records = [b"x" * 10] * 7
    assert [len(b) for b in pub.batches(records, 3)] == [3, 3, 1]
    assert [len(b) for b in pub.batches(records, 100, max_bytes=25)] == [2, 2, 2, 1]
    assert [len(b) for b in pub.batches([b"y" * 50, b"z"], 100, max_bytes=25)] == [1, 1]


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class RecordingStop(threading.Event):
    """An Event whose wait() records the delay and advances the fake clock instead of waiting."""

    def __init__(self, clock: FakeClock):
        super().__init__()
        self.clock = clock
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waits.append(timeout)
        self.clock.now += timeout
        return self.is_set()


def test_pacer_spaces_messages_at_the_rate():
    clock = FakeClock()
    stop = RecordingStop(clock)
    pacer = pub.Pacer(10, stop, clock)
    assert pacer.batch_limit(200) == 1
    assert pacer.wait(0) and stop.waits == []
    assert pacer.wait(1) and stop.waits == [pytest.approx(0.1)]
    clock.now += 1.0  # late: no wait
    assert pacer.wait(2) and len(stop.waits) == 1
    stop.set()
    assert not pacer.wait(50)
    assert pub.Pacer(0, stop, clock).batch_limit(200) == 200
    assert pub.Pacer(1000, stop, clock).batch_limit(200) == 100


def test_filename_format():
    fmt = to_file.filename_format("<TOPIC>.<HOST><REV>.<DATETIME>.log", "t", "h", 42, False, False)
    assert fmt == "t.h.<DATETIME>.log"
    fmt = to_file.filename_format("<TOPIC>/<PID><REV>.log", "t", "h", 42, True, True)
    assert fmt == "t/42<REV>.log.gz"
    with pytest.raises(common.UsageError, match="<REV>"):
        to_file.filename_format("<TOPIC>.log", "t", "h", 1, True, True)
    with pytest.raises(common.UsageError, match="inside --output-dir"):
        to_file.filename_format("../<TOPIC>.log", "t", "h", 1, False, False)


def test_sum_channel_adds_up_every_nsqd_and_ignores_other_channels():
    def reply(depth: int, backend: int, messages: int, clients: int) -> dict:
        return {
            "topics": [
                {
                    "topic_name": "t",
                    "channels": [
                        {"channel_name": "other", "depth": 1000, "message_count": 1000},
                        {
                            "channel_name": "c",
                            "depth": depth,
                            "backend_depth": backend,
                            "in_flight_count": 1,
                            "deferred_count": 2,
                            "requeue_count": 3,
                            "timeout_count": 4,
                            "message_count": messages,
                            "client_count": clients,
                        },
                    ],
                }
            ]
        }

    totals = stat.sum_channel(
        [reply(10, 4, 100, 1), reply(5, 0, 50, 2), {"topics": None}], "t", "c"
    )
    assert totals == stat.ChannelTotals(15, 4, 2, 4, 6, 8, 150, 3, 2)
    assert totals.memory_depth == 11
    assert stat.sum_channel([reply(1, 0, 1, 1)], "t", "nope") is None


def test_format_row_rates_and_alignment():
    before = stat.ChannelTotals(depth=10, messages=100)
    now = stat.ChannelTotals(depth=30, backend_depth=5, messages=140, clients=2)
    row = stat.format_row(now, before, 2.0)
    # 40 messages came in over 2s; 40 - (30 - 10) = 20 went out.
    assert row.split() == ["20", "10", "|", "30", "25", "5", "0", "0", "|", "0", "0", "140", "2"]
    first = stat.format_row(now, None, 0.0)
    assert first.split()[:2] == ["-", "-"]
    header_columns = stat.HEADER.splitlines()[1]
    assert len(row) == len(header_columns) == len(first)


def test_message_json_classic_and_binary_body():
    msg = Message(
        DecodedMessage(1700000000123456789, 2, b"0a1b2c3d4e5f6789", b"hello"),
        nsqd_address="127.0.0.1:4150",
    )
    out = tail.message_json(msg, "t")
    assert out == {
        "topic": "t",
        "id": "0a1b2c3d4e5f6789",
        "attempts": 2,
        "timestamp": 1700000000123456789,
        "nsqd": "127.0.0.1:4150",
        "body": "hello",
    }
    raw = Message(
        DecodedMessage(
            1,
            1,
            b"\x00" * 8 + b"\x01" * 8,
            b"\xff\xfe",
            internal_id=0,
            trace_id=72340172838076673,
            offset=10,
            raw_size=20,
        )
    )
    out = tail.message_json(raw, "t")
    assert out["id"] == "00" * 8 + "01" * 8
    assert out["body_base64"] == "//4="
    assert "body" not in out
    assert (out["internal_id"], out["trace_id"], out["offset"], out["raw_size"]) == (
        0,
        72340172838076673,
        10,
        20,
    )
    json.dumps(out)  # serialisable as it is


def test_every_subcommand_has_help_and_the_go_flag_names():
    parser = main.build_parser()
    names = main._long_options(parser)
    for flag in [
        "--topic",
        "--channel",
        "--nsqd-tcp-address",
        "--lookupd-http-address",
        "--print-topic",
        "--delimiter",
        "--rate",
        "--nsqd-http-address",
        "--interval",
        "--count",
        "--output-dir",
        "--filename-format",
        "--datetime-format",
        "--rotate-interval",
        "--rotate-size",
        "--gzip",
        "--gzip-level",
        "--sync-interval",
        "--max-in-flight",
        "--consumer-opt",
        "--producer-opt",
        "--host-identifier",
        "--http-client-request-timeout",
    ]:
        assert flag in names, flag


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "required"),
        (["tail"], "--topic"),
        (["tail", "--topic", "t"], "--nsqd-tcp-address or --lookupd-http-address required"),
        (["tail", "--topic", "bad topic", "--nsqd-tcp-address", "h:1"], "invalid topic name"),
        (["tail", "--topic", "t", "--nsqd-tcp-address", "nohost"], "expected host:port"),
        (["tail", "--topic", "t", "--nsqd-tcp-address", "h:1", "-n", "-3"], "must not be negative"),
        (["tail", "--topic", "t", "--nsqd-tcp-address", "h:1", "--consumer-opt", "max_in_flite,2"],
         "did you mean 'max_in_flight'"),
        (["pub", "--topic", "t"], "--nsqd-tcp-address or --lookupd-http-address required"),
        (["pub", "--topic", "t", "--nsqd-tcp-address", "h:1", "--delimiter", "ab"], "single byte"),
        (["stat", "--topic", "t", "--channel", "c"], "--nsqd-http-address or --lookupd-http"),
        (["stat", "--topic", "t", "--channel", "c", "--nsqd-http-address", "h:1",
          "--lookupd-http-address", "h:2"], "not both"),
        (["stat", "--topic", "t", "--channel", "c", "--nsqd-http-address", "h:1",
          "--interval", "0"], "must be positive"),
        (["to-file", "--topic", "t", "--nsqd-tcp-address", "h:1", "--gzip",
          "--filename-format", "<TOPIC>.log"], "needs <REV>"),
        (["to-file", "--topic", "t", "--nsqd-tcp-address", "h:1", "--sync-interval", "90s"],
         "shorter than the msg_timeout"),
        (["to-file", "--topic", "t", "--nsqd-tcp-address", "h:1", "--gzip-level", "12"],
         "invalid choice: 12"),
        (["frobnicate"], "invalid choice"),
    ],
)  # fmt: skip
def test_usage_errors_exit_2_with_a_message(capsys, tmp_path, args, message):
    if args[:1] == ["to-file"]:
        args = [*args, "--output-dir", str(tmp_path)]
    try:
        status = main.main(args)
    except SystemExit as exc:  # argparse's own errors
        status = exc.code
    out, err = capsys.readouterr()
    assert status == 2, err
    assert message in err
    assert "usage: nsqclient" in err
    assert out == ""
