"""The embedded servers as drop-ins: Go flag syntax, refusing unknown flags, write boundaries
and the write-splitting fault control.  (The processes themselves are exercised, against the
real binaries too, in tests/conformance/test_conformance_binaries.py.)"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
import snappy

from nsqclient import protocol
from nsqclient.testing.gostyle.flags import FlagError, go_duration_seconds, parse_go_flags
from nsqclient.testing.nsqd.writes import Output, WriteSplitter, snappy_writes
from nsqclient.testing.scripts import NSQD_FLAGS, NSQLOOKUPD_FLAGS, nsqd_options

OK_FRAME = protocol.encode_frame(protocol.FRAME_TYPE_RESPONSE, b"OK")

# every flag the issue lists as passed by other projects' test suites
SUITE_FLAGS = [
    "--auth-http-address=127.0.0.1:1",
    "--tls-root-ca-file=ca.pem",
    "--tls-client-auth-policy=require-verify",
    "--tls-cert=c.pem",
    "--tls-key=k.pem",
    "--data-path=/tmp/x",
    "--mem-queue-size=100",
    "--max-msg-size=2048",
    "--max-body-size=4096",
    "--msg-timeout=5s",
    "--max-msg-timeout=10m",
    "--max-req-timeout=1h",
    "--max-rdy-count=50",
    "--max-heartbeat-interval=30s",
    "--broadcast-address=127.0.0.1",
    "--snappy",
    "--deflate",
    "--verbose",
    "-log-level=debug",
]


def test_go_flag_syntax():
    values = parse_go_flags(
        NSQD_FLAGS,
        ["-msg-timeout", "1m30s", "--max-rdy-count=7", "-snappy=false", "-deflate"]
        + ["--lookupd-tcp-address", "a:1", "-lookupd-tcp-address=b:2", "--node-id=0x10"],
    )
    assert values["msg_timeout"] == 90.0
    assert values["max_rdy_count"] == 7
    assert values["snappy"] is False and values["deflate"] is True
    assert values["lookupd_tcp_address"] == ["a:1", "b:2"]
    assert values["node_id"] == 16
    assert parse_go_flags(NSQD_FLAGS, ["-h"]) == {"help": True}
    assert go_duration_seconds("250ms") == 0.25
    assert go_duration_seconds("1h2m3.5s") == 3723.5
    assert go_duration_seconds("0") == 0.0


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["--statsd-address=127.0.0.1:8125"], "flag provided but not defined: -statsd-address"),
        (["--msg-timeout=60x"], "invalid value '60x' for flag -msg-timeout"),
        (["--max-rdy-count"], "flag needs an argument: -max-rdy-count"),
        (["--snappy", "false"], "unexpected argument 'false'"),
        (["---tcp-address=x"], "bad flag syntax"),
        (["-log-level=loud"], "invalid value 'loud' for flag -log-level"),
    ],
)
def test_bad_command_lines_are_refused(argv, text):
    with pytest.raises(FlagError, match=text.replace("(", r"\(").replace(")", r"\)")):
        parse_go_flags(NSQD_FLAGS, argv)


def test_the_flags_test_suites_pass_are_understood():
    values = parse_go_flags(NSQD_FLAGS, SUITE_FLAGS)
    values["tls_cert"] = values["tls_key"] = None  # (no files here; TLS is tested elsewhere)
    values["tls_client_auth_policy"] = ""
    opts, tcp, http, https = nsqd_options(values)
    assert opts.auth_http_address == ["127.0.0.1:1"]
    assert opts.msg_timeout == 5.0 and opts.max_msg_timeout == 600.0
    assert opts.max_req_timeout == 3600.0 and opts.max_heartbeat_interval == 30.0
    assert (opts.max_msg_size, opts.max_body_size, opts.max_rdy_count) == (2048, 4096, 50)
    assert opts.mem_queue_size == 100 and opts.data_path == "/tmp/x"
    assert opts.broadcast_address == "127.0.0.1"
    assert tcp == ("0.0.0.0", 4150) and http == ("0.0.0.0", 4151) and https == ("0.0.0.0", 4152)


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nsqclient.testing", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_an_unsupported_flag_exits_2_with_a_clear_message():
    done = _run("nsqd", "--e2e-processing-latency-percentile=0.99")
    assert done.returncode == 2
    assert "flag provided but not defined: -e2e-processing-latency-percentile" in done.stderr
    done = _run("nsqlookupd", "--tcp-address=127.0.0.1:4160", "--bogus")
    assert done.returncode == 2 and "-bogus" in done.stderr


@pytest.mark.parametrize(
    ("binary", "flags"), [("nsqd", NSQD_FLAGS), ("nsqlookupd", NSQLOOKUPD_FLAGS)]
)
def test_help_describes_every_flag(binary, flags):
    done = _run(binary, "-help")
    assert done.returncode == 0, done.stderr
    for flag in flags:
        assert f"  -{flag.name}" in done.stdout
        assert flag.help in done.stdout
    # durations and sizes say their unit
    if binary == "nsqd":
        assert "-msg-timeout value\n        duration" in done.stdout
        assert "-max-msg-size value\n        bytes" in done.stdout


def test_snappy_writes_are_cut_like_gos_snappy_writer():
    stream = snappy.StreamCompressor()
    first = snappy_writes(stream.compress(OK_FRAME))
    # stream identifier + chunk header, then the (uncompressed) body: 18 + 10
    assert [len(p) for p in first] == [18, 10]
    assert first[1] == OK_FRAME
    later = snappy_writes(stream.compress(OK_FRAME))
    assert [len(p) for p in later] == [8, 10]
    big = b"abc" * 50_000  # compressible: three chunks, each one write
    data = stream.compress(big)
    pieces = snappy_writes(data)
    assert b"".join(pieces) == data
    assert len(pieces) == 3


def test_the_splitter_cuts_into_small_pieces_in_order():
    data = bytes(range(256)) * 100
    pieces = WriteSplitter(7).cut(data)
    assert b"".join(pieces) == data
    assert sum(1 for p in pieces if len(p) <= 16) >= len(pieces) // 4
    assert max(len(p) for p in pieces) <= 4096
    assert WriteSplitter(7).cut(data) == pieces  # a seed replays the same cuts


class _Recorder(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return False


def test_output_writes_one_piece_per_loop_pass_and_drains_on_demand():
    async def scenario() -> None:
        transport = _Recorder()
        out = Output(asyncio.get_running_loop(), transport, WriteSplitter(3))
        out.write([b"x" * 5000, b"y" * 10])
        assert transport.writes == []  # nothing before the loop runs
        await asyncio.sleep(0)
        assert len(transport.writes) == 1
        out.drain_now()
        assert b"".join(transport.writes) == b"x" * 5000 + b"y" * 10
        assert len(transport.writes) > 2

        plain = _Recorder()
        Output(asyncio.get_running_loop(), plain).write([b"head", b"body"])
        assert plain.writes == [b"head", b"body"]

    asyncio.run(scenario())


def test_combined_mode_help_describes_every_flag():
    import re
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "nsqclient.testing", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    options = out[out.index("options:") :]
    # Each flag's entry: the flag (and metavar) then its help text, on the same line or the next.
    entries = re.split(r"\n  (?=-)", options)[1:]
    flags = {re.match(r"(--?[\w-]+)", e).group(1) for e in entries}
    assert {"--tcp-address", "--msg-timeout", "--max-rdy-count", "--log-level"} <= flags
    for entry in entries:
        words = entry.split()
        described = [w for w in words[1:] if not w.isupper() and not w.startswith(("-", "{"))]
        assert described, f"no help text for {words[0]}"
    assert "seconds" in options and "messages" in options and "HOST:PORT" in options
