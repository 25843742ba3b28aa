"""nsqclient.addresses, the one parser of nsqd TCP and nsqlookupd HTTP addresses, and every entry
point that takes addresses through it: Producer, Consumer, pynsq's Reader and Writer, the CLI's
flags, the Spark options, the HTTP clients.  No broker: nothing here connects."""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable
from typing import Any

import pytest

from nsqclient import compat
from nsqclient.addresses import (
    AddressError,
    join_host_port,
    lookupd_addresses,
    lookupd_base_url,
    nsqd_addresses,
    producer_address,
    producer_http_address,
    split_host_port,
)
from nsqclient.cli import common, main
from nsqclient.consumer._consumer import Consumer
from nsqclient.http import LookupdClient, NsqdHTTPClient
from nsqclient.producer._producer import Producer

NSQD = "nsqd_tcp_addresses"
LOOKUPD = "lookupd_http_addresses"

# ---------------------------------------------------------------------------- the pure parser


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, []),
        ([], []),
        ("127.0.0.1:4150", ["127.0.0.1:4150"]),
        ("127.0.0.1:4150,127.0.0.1:4151", ["127.0.0.1:4150", "127.0.0.1:4151"]),
        (" a:1 ,\tb:2 ", ["a:1", "b:2"]),
        (["a:1", " b:2"], ["a:1", "b:2"]),
        (("a:1", "b:2"), ["a:1", "b:2"]),
        (["a:1,b:2", "c:3"], ["a:1", "b:2", "c:3"]),  # each str is a comma list
        (frozenset({"a:1"}), ["a:1"]),
        ("[::1]:4150", ["[::1]:4150"]),
        ("[fe80::1%eth0]:4150", ["[fe80::1%eth0]:4150"]),
        ("nsqd.example:1", ["nsqd.example:1"]),
        ("h:65535", ["h:65535"]),
    ],
)
def test_nsqd_addresses_normalise(value: Any, expected: list[str]) -> None:
    assert nsqd_addresses(value, NSQD) == expected


@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        ("nohost", AddressError, "invalid address 'nohost': expected host:port, e.g."),
        ("127.0.0.1", AddressError, "invalid address '127.0.0.1': expected host:port"),
        (":4150", AddressError, "invalid address ':4150'"),
        ("h:", AddressError, "invalid address 'h:'"),
        ("h:port", AddressError, "invalid address 'h:port'"),
        ("h:0", AddressError, "port must be a number from 1 to 65535"),
        ("h:65536", AddressError, "port must be a number from 1 to 65535"),
        ("a b:1", AddressError, "invalid address 'a b:1'"),
        ("::1:4150", AddressError, "an IPv6 host goes in brackets, e.g. '[::1]:4150'"),
        ("[::1]", AddressError, "invalid address '[::1]'"),
        ("http://h:4150", AddressError, "TCP addresses take no scheme; use 'h:4150'"),
        ("", AddressError, "empty address; pass 'host:port' strings, e.g. '127.0.0.1:4150'"),
        ("  ", AddressError, "empty address"),
        ("a:1,", AddressError, "empty address in 'a:1,'"),
        ("a:1,,b:2", AddressError, "empty address in 'a:1,,b:2'"),
        (["a:1", ""], AddressError, "empty address"),
        (
            ("127.0.0.1", 4150),
            TypeError,
            "('127.0.0.1', 4150) is a (host, port) pair, not addresses;"
            " pass 'host:port' strings, e.g. '127.0.0.1:4150'",
        ),
        (["::1", 4150], TypeError, "is a (host, port) pair"),
        (["a:1", 2], TypeError, "2 (int) is not a str; pass 'host:port' strings"),
        ([None], TypeError, "None (NoneType) is not a str"),
        (4150, TypeError, "expected a str or a list of str, not int 4150; pass 'host:port'"),
        (b"a:1", TypeError, "not bytes"),
        ({"a:1": 1}, TypeError, "not dict"),
        ((a for a in ["a:1"]), TypeError, "not generator"),
    ],
)
def test_nsqd_addresses_refuse_naming_the_argument_and_the_item(
    value: Any, error: type[Exception], words: str
) -> None:
    with pytest.raises(error) as info:
        nsqd_addresses(value, NSQD)
    assert str(info.value).startswith(f"{NSQD}: ")
    assert words in str(info.value)


def test_the_first_wrong_type_is_reported_before_any_address_is_parsed() -> None:
    # ("::1", 4150): "::1" alone would be a bad address; the pair is what is wrong
    with pytest.raises(TypeError, match="pair"):
        nsqd_addresses(("::1", 4150), NSQD)
    with pytest.raises(TypeError, match=r"3 \(int\)"):
        nsqd_addresses(["nohost", "a:1", 3], NSQD)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, []),
        ("127.0.0.1:4161", ["127.0.0.1:4161"]),
        ("http://127.0.0.1:4161/", ["http://127.0.0.1:4161"]),
        ("https://lookupd.example:4161/base/", ["https://lookupd.example:4161/base"]),
        ("a:1, http://b:2", ["a:1", "http://b:2"]),
        (["a:1", "[::1]:4161"], ["a:1", "[::1]:4161"]),
        ("http://user:secret@h:4161", ["http://user:secret@h:4161"]),
    ],
)
def test_lookupd_addresses_normalise(value: Any, expected: list[str]) -> None:
    assert lookupd_addresses(value, LOOKUPD) == expected


@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        ("127.0.0.1", AddressError, "'127.0.0.1': a port is required, e.g. '127.0.0.1:4161'"),
        ("http://127.0.0.1", AddressError, "a port is required, e.g. 'http://127.0.0.1:4161'"),
        ("http://127.0.0.1/", AddressError, "a port is required, e.g. 'http://127.0.0.1:4161'"),
        ("https://h/base", AddressError, "a port is required, e.g. 'https://h:4161/base'"),
        ("[::1]", AddressError, "a port is required, e.g. '[::1]:4161'"),
        ("h:port", AddressError, "port must be a number from 1 to 65535"),
        ("h:0", AddressError, "port must be a number from 1 to 65535"),
        ("h:70000", AddressError, "port must be a number from 1 to 65535"),
        ("ftp://h:1", AddressError, "the scheme must be http or https"),
        ("http://", AddressError, "expected host:port or http://host:port, e.g."),
        ("::1:4161", AddressError, "an IPv6 host in brackets"),
        ("h:4161?x=1", AddressError, "no query or fragment"),
        ("a:1,", AddressError, "empty address in 'a:1,'"),
        ("", AddressError, "empty address"),
        (("127.0.0.1", 4161), TypeError, "is a (host, port) pair"),
        (4161, TypeError, "expected a str or a list of str, not int"),
    ],
)
def test_lookupd_addresses_refuse_naming_the_argument_and_the_item(
    value: Any, error: type[Exception], words: str
) -> None:
    with pytest.raises(error) as info:
        lookupd_addresses(value, LOOKUPD)
    assert str(info.value).startswith(f"{LOOKUPD}: ")
    assert words in str(info.value)


def test_address_error_keeps_the_argument_and_the_problem_apart() -> None:
    with pytest.raises(AddressError) as info:
        nsqd_addresses("a:1,nohost", "--nsqd-tcp-address")
    assert isinstance(info.value, ValueError)
    assert info.value.argument == "--nsqd-tcp-address"
    assert info.value.problem.startswith("invalid address 'nohost'")
    assert str(info.value) == f"--nsqd-tcp-address: {info.value.problem}"


def test_split_and_join_host_port() -> None:
    assert split_host_port(" 127.0.0.1:4150 ") == ("127.0.0.1", 4150)
    assert split_host_port("[::1]:4150") == ("::1", 4150)
    assert join_host_port("::1", 4150) == "[::1]:4150"
    assert join_host_port("[::1]", 4150) == "[::1]:4150"
    assert join_host_port("h", "4150") == "h:4150"
    with pytest.raises(AddressError, match="^address: invalid address 'h'"):
        split_host_port("h")
    with pytest.raises(TypeError, match="^address: expected a 'host:port' str"):
        split_host_port(4150)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no scheme"):
        split_host_port("http://h:4150")


def test_lookupd_base_url() -> None:
    assert lookupd_base_url("h:4161") == "http://h:4161"
    assert lookupd_base_url(" https://h:4161/x/ ") == "https://h:4161/x"
    assert lookupd_base_url("h", port_required=False) == "http://h"
    with pytest.raises(AddressError, match="^lookupd: invalid address 'h': a port is required"):
        lookupd_base_url("h", "lookupd")


# ---------------------------------------------------------------------------- the entry points


@pytest.fixture
def no_new_threads() -> Any:
    """A refused construction leaves no thread behind (it fails before anything starts)."""
    before = set(threading.enumerate())
    yield
    assert set(threading.enumerate()) <= before


def _producer(**kwargs: Any) -> Producer:
    return Producer(**kwargs)


def _consumer(**kwargs: Any) -> Consumer:
    return Consumer("t", "c", lambda m: None, **kwargs)


def _reader(**kwargs: Any) -> compat.Reader:
    return compat.Reader("t", "c", lambda m: True, **kwargs)


CONSTRUCTORS: dict[str, Callable[..., Any]] = {
    "Producer": _producer,
    "Consumer": _consumer,
    "Reader": _reader,
}


def _close(client: Any) -> None:
    if isinstance(client, Consumer):
        client.stop(timeout=5.0)
    else:
        client.close()


@pytest.mark.parametrize("kind", list(CONSTRUCTORS))
def test_a_comma_string_is_two_addresses(kind: str) -> None:
    client = CONSTRUCTORS[kind](nsqd_tcp_addresses="127.0.0.1:4150, 127.0.0.1:4151")
    try:
        if isinstance(client, Producer):
            addresses = [entry["address"] for entry in client.stats()["nsqd"]]
        else:
            addresses = client.nsqd_tcp_addresses
        assert addresses == ["127.0.0.1:4150", "127.0.0.1:4151"]
    finally:
        _close(client)
    client = CONSTRUCTORS[kind](lookupd_http_addresses="127.0.0.1:4161,http://127.0.0.1:4162/")
    try:
        if isinstance(client, Producer):
            found = client._router.pool.addresses()  # type: ignore[union-attr]
        else:
            found = client.lookupd_http_addresses
        assert sorted(found) == ["127.0.0.1:4161", "http://127.0.0.1:4162"]  # Reader shuffles
    finally:
        _close(client)


def test_writer_takes_a_comma_string() -> None:
    writer = compat.Writer("127.0.0.1:4150,[::1]:4151")
    try:
        assert writer.nsqd_tcp_addresses == ["127.0.0.1:4150", "[::1]:4151"]
        assert writer.name == "127.0.0.1:4150"
    finally:
        writer.close()


BAD = [
    ({"nsqd_tcp_addresses": "127.0.0.1:4150,"}, AddressError, NSQD, "empty address"),
    ({"nsqd_tcp_addresses": "127.0.0.1"}, AddressError, NSQD, "'127.0.0.1': expected host:port"),
    ({"nsqd_tcp_addresses": ("127.0.0.1", 4150)}, TypeError, NSQD, "pass 'host:port' strings"),
    ({"nsqd_tcp_addresses": 4150}, TypeError, NSQD, "not int"),
    ({"lookupd_http_addresses": "127.0.0.1"}, AddressError, LOOKUPD, "a port is required"),
    ({"lookupd_http_addresses": "http://127.0.0.1"}, AddressError, LOOKUPD, "port is required"),
    ({"lookupd_http_addresses": "a:4161,,b:4161"}, AddressError, LOOKUPD, "empty address"),
    ({"lookupd_http_addresses": ("127.0.0.1", 4161)}, TypeError, LOOKUPD, "(host, port) pair"),
]


@pytest.mark.parametrize("kind", list(CONSTRUCTORS))
@pytest.mark.parametrize(("kwargs", "error", "name", "words"), BAD)
def test_bad_addresses_fail_at_construction_naming_the_argument(
    kind: str,
    kwargs: dict[str, Any],
    error: type[Exception],
    name: str,
    words: str,
    no_new_threads: None,
) -> None:
    with pytest.raises(error) as info:
        CONSTRUCTORS[kind](**kwargs)
    assert str(info.value).startswith(f"{name}: ")
    assert words in str(info.value)
    assert compat._registry.snapshot() == ([], [])  # no half-made Reader registered


@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        ("127.0.0.1:4150,", AddressError, "empty address in '127.0.0.1:4150,'"),
        (("127.0.0.1", 4150), TypeError, "pass 'host:port' strings, e.g. '127.0.0.1:4150'"),
        (["127.0.0.1:4150", "nohost"], AddressError, "invalid address 'nohost'"),
    ],
)
def test_writer_refuses_bad_addresses_naming_the_argument(
    value: Any, error: type[Exception], words: str, no_new_threads: None
) -> None:
    with pytest.raises(error, match=f"^{NSQD}: ") as info:
        compat.Writer(value)
    assert words in str(info.value)
    assert compat._registry.snapshot() == ([], [])


def test_http_clients_parse_with_the_same_rules() -> None:
    with pytest.raises(ValueError, match="a port is required, e.g. '127.0.0.1:4161'"):
        LookupdClient("127.0.0.1")
    with pytest.raises(ValueError, match="a port is required"):
        LookupdClient("http://127.0.0.1")
    with NsqdHTTPClient("127.0.0.1") as nsqd:  # nsqd's HTTP API: port 80 is a real choice
        assert nsqd.base_url == "http://127.0.0.1"


# ---------------------------------------------------------------------------- CLI and Spark


def _source_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    common.add_source_flags(parser, "c", "the channel")
    return parser


def test_cli_flags_take_comma_lists_and_repeats() -> None:
    args = _source_parser().parse_args(
        [
            "--topic", "t",
            "--nsqd-tcp-address", "a:1, b:2",
            "--nsqd-tcp-address", "[::1]:3",
            "--lookupd-http-address", "l:4161,http://m:4161/",
        ]
    )  # fmt: skip
    assert args.nsqd_tcp_addresses == ["a:1", "b:2", "[::1]:3"]
    assert args.lookupd_http_addresses == ["l:4161", "http://m:4161"]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--nsqd-tcp-address", "a:1,"], "argument --nsqd-tcp-address: empty address in 'a:1,'"),
        (
            ["--nsqd-tcp-address", "nohost"],
            "argument --nsqd-tcp-address: invalid address 'nohost': expected host:port",
        ),
        (
            ["--lookupd-http-address", "127.0.0.1"],
            "argument --lookupd-http-address: invalid address '127.0.0.1': a port is required",
        ),
        (
            ["--lookupd-http-address", "http://127.0.0.1"],
            "argument --lookupd-http-address: invalid address 'http://127.0.0.1': a port is",
        ),
    ],
)
def test_cli_refuses_bad_addresses_naming_the_flag(
    capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    for tool in (["tail", "--topic", "t"], ["pub", "--topic", "t"]):
        try:
            status = main.main([*tool, *argv])
        except SystemExit as exc:  # argparse's own errors
            status = exc.code  # type: ignore[assignment]
        err = capsys.readouterr().err
        assert status == 2, err
        assert words in err
        assert "--nsqd-tcp-address: --nsqd-tcp-address" not in err  # the flag named once


def test_spark_options_parse_like_the_consumer() -> None:
    pytest.importorskip("pyspark")  # nsqclient.spark needs the spark extra
    from nsqclient.spark.options import SinkOptions, SourceOptions

    source = SourceOptions.parse(
        {
            "topic": "t",
            "channel": "c",
            "nsqd_tcp_addresses": "a:1, b:2",
            "lookupd_http_addresses": "l:4161",
        }
    )
    assert source.nsqd_tcp_addresses == ["a:1", "b:2"]
    assert source.lookupd_http_addresses == ["l:4161"]
    sink = SinkOptions.parse(
        {"topic": "t", "nsqd_tcp_addresses": " ", "lookupd_http_addresses": "l:1"}
    )
    assert (sink.nsqd_tcp_addresses, sink.lookupd_http_addresses) == ([], ["l:1"])
    with pytest.raises(AddressError, match="^nsqd_tcp_addresses: empty address in 'a:1,'"):
        SinkOptions.parse({"topic": "t", "nsqd_tcp_addresses": "a:1,"})
    with pytest.raises(AddressError, match="^lookupd_http_addresses: .* a port is required"):
        SinkOptions.parse({"topic": "t", "lookupd_http_addresses": "http://l"})


# ---------------------------------------------------------------------------- lookup replies


@pytest.mark.parametrize(
    ("entry", "address"),
    [
        ({"broadcast_address": "h", "tcp_port": 4150, "http_port": 4151}, "h:4150"),
        ({"broadcast_address": "h", "tcp_port": "4150"}, "h:4150"),
        ({"address": "old", "tcp_port": 4150}, "old:4150"),
        ({"broadcast_address": "", "address": "old", "tcp_port": 1}, "old:1"),
        ({"broadcast_address": "::1", "tcp_port": 4150}, "[::1]:4150"),
        ({"broadcast_address": "[::1]", "tcp_port": 4150}, "[::1]:4150"),
    ],
)
def test_producer_address(entry: dict[str, Any], address: str) -> None:
    assert producer_address(entry) == address


@pytest.mark.parametrize(
    "entry",
    [
        {"tcp_port": 4150},
        {"broadcast_address": "h"},
        {"broadcast_address": "h", "tcp_port": "x"},
        {"broadcast_address": "h", "tcp_port": 0},
        {"broadcast_address": "h", "tcp_port": True},
    ],
)
def test_producer_address_rejects(entry: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        producer_address(entry)


def test_producer_http_address() -> None:
    assert producer_http_address({"broadcast_address": "h", "http_port": "4151"}) == "h:4151"
    assert producer_http_address({"address": "::1", "http_port": 4151}) == "[::1]:4151"
    assert producer_http_address({"broadcast_address": "h", "tcp_port": 4150}) is None
    assert producer_http_address({"broadcast_address": "h", "http_port": 70000}) is None
    assert producer_http_address({"http_port": 4151}) is None
