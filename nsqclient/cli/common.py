"""What the subcommands share: flag types, address flags, option passthrough, signals, checks.

Nothing here writes to stdout; errors meant for the user are raised as :class:`CLIError`
(exit status 1) or :class:`UsageError` (exit status 2) and printed by :mod:`.main`.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import re
import signal
import socket
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any, TypeVar

import requests

from .. import __version__
from ..addresses import AddressError, lookupd_addresses, nsqd_addresses, split_host_port
from ..config import OPTIONS, Config, check_owner
from ..consumer import Consumer
from ..durations import parse_duration
from ..errors import HTTPError
from ..http import LookupdClient, TopicNotFoundError
from ..platforms import stop_signals
from ..protocol import valid_channel_name, valid_topic_name

__all__ = [
    "run_until_stopped",
    "CLIError",
    "UsageError",
    "parse_duration",
    "positive_duration",
    "non_negative_duration",
    "positive_int",
    "non_negative_int",
    "parse_size",
    "topic_name",
    "channel_name",
    "add_nsqd_tcp_flag",
    "add_topics_flag",
    "add_source_flags",
    "add_count_flag",
    "add_lookupd_flag",
    "add_log_level_flag",
    "add_version_flag",
    "add_http_timeout_flags",
    "TimeoutSession",
    "add_options_flag",
    "client_options",
    "user_agent",
    "setup_logging",
    "StopSignals",
    "check_nsqd_reachable",
    "check_lookupd_reachable",
    "check_sources",
    "check_reachable",
    "describe_error",
    "tcp_addresses",
    "lookupd_http_addresses",
    "go_style_flags",
    "finish_command",
]

logger = logging.getLogger("nsqclient.cli.common")

_N = TypeVar("_N", int, float)


class CLIError(Exception):
    """A failure to report on stderr with exit status 1 (no traceback)."""

    exit_status = 1


class UsageError(CLIError):
    """A bad combination of flags found after parsing: reported with exit status 2."""

    exit_status = 2


# ------------------------------------------------------------------------------ flag types


def _positive(value: _N, text: str) -> _N:
    """``value`` (parsed from ``text``) when > 0."""
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {text!r}")
    return value


def _non_negative(value: _N, text: str) -> _N:
    """``value`` (parsed from ``text``) when >= 0."""
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, not {text!r}")
    return value


def positive_duration(text: str) -> float:
    """A duration that must be > 0."""
    return _positive(parse_duration(text), text)


def non_negative_duration(text: str) -> float:
    """A duration that must be >= 0 (0 usually means disabled)."""
    return _non_negative(parse_duration(text), text)


def _int(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None


def positive_int(text: str) -> int:
    """An integer > 0."""
    return _positive(_int(text), text)


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    return _non_negative(_int(text), text)


_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b)?\s*$", re.I)


def parse_size(text: str) -> int:
    """Bytes from ``"1048576"`` or ``"512k"``, ``"100M"``, ``"1GiB"`` (powers of 1024)."""
    match = _SIZE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"invalid size {text!r} (bytes, or like 512k, 100M, 1G)")
    scale = 1024 ** " kmgt".index(match.group(2).lower() or " ")
    return int(match.group(1)) * scale


def _valid_name(what: str, valid: Callable[[str], bool], text: str) -> str:
    if not valid(text):
        raise argparse.ArgumentTypeError(
            f"invalid {what} name {text!r}: 1-64 characters of [.a-zA-Z0-9_-], "
            "optionally ending in #ephemeral"
        )
    return text


def topic_name(text: str) -> str:
    """A valid NSQ topic name."""
    return _valid_name("topic", valid_topic_name, text)


def channel_name(text: str) -> str:
    """A valid NSQ channel name."""
    return _valid_name("channel", valid_channel_name, text)


def _address_list(parse: Callable[[str, str], list[str]], flag: str, text: str) -> list[str]:
    try:
        return parse(text, flag)
    except AddressError as exc:  # argparse names the flag itself
        raise argparse.ArgumentTypeError(exc.problem) from None


def tcp_addresses(text: str) -> list[str]:
    """``host:port`` (IPv6 hosts in brackets), or several separated by commas
    (:func:`nsqclient.addresses.nsqd_addresses`)."""
    return _address_list(nsqd_addresses, "--nsqd-tcp-address", text)


def lookupd_http_addresses(text: str) -> list[str]:
    """``host:port`` or ``http(s)://host:port[/path]``, or several separated by commas
    (:func:`nsqclient.addresses.lookupd_addresses`)."""
    return _address_list(lookupd_addresses, "--lookupd-http-address", text)


# ------------------------------------------------------------------------------ common flags


def _add_addresses_flag(
    parser: argparse.ArgumentParser,
    flag: str,
    dest: str,
    kind: Callable[[str], list[str]],
    help_text: str,
) -> None:
    """An address flag that may be repeated or hold a comma-separated list, into the list
    ``args.<dest>`` ([] when not given), each value read by ``kind``."""
    parser.add_argument(
        flag,
        dest=dest,
        action="extend",
        default=[],
        type=kind,
        metavar="HOST:PORT",
        help=help_text + " (may be given multiple times, or as a comma-separated list)",
    )


def add_nsqd_tcp_flag(parser: argparse.ArgumentParser, help_text: str) -> None:
    _add_addresses_flag(
        parser, "--nsqd-tcp-address", "nsqd_tcp_addresses", tcp_addresses, help_text
    )


def add_topics_flag(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """``--topic``, may be given multiple times (into ``args.topics``, [] when not given)."""
    parser.add_argument(
        "--topic",
        dest="topics",
        action="append",
        type=topic_name,
        required=required,
        default=None if required else [],
        metavar="TOPIC",
        help="NSQ topic (may be given multiple times)",
    )


def add_source_flags(
    parser: argparse.ArgumentParser,
    channel_default: str | None,
    channel_help: str,
    topic_required: bool = True,
) -> None:
    """What a consuming tool reads: ``--topic`` (repeatable), ``--channel``,
    ``--nsqd-tcp-address`` and ``--lookupd-http-address``."""
    add_topics_flag(parser, topic_required)
    parser.add_argument("--channel", type=channel_name, default=channel_default, help=channel_help)
    add_nsqd_tcp_flag(parser, "nsqd TCP address")
    add_lookupd_flag(parser)


def add_count_flag(
    parser: argparse.ArgumentParser,
    *flags: str,
    default: int,
    help: str,
    kind: Any = positive_int,
) -> None:
    """A whole-number flag (``N``): by default positive."""
    parser.add_argument(*flags, type=kind, default=default, metavar="N", help=help)


def add_lookupd_flag(
    parser: argparse.ArgumentParser,
    help_text: str = "nsqlookupd HTTP address to discover nsqd from",
) -> None:
    _add_addresses_flag(
        parser,
        "--lookupd-http-address",
        "lookupd_http_addresses",
        lookupd_http_addresses,
        help_text,
    )


def add_version_flag(parser: argparse.ArgumentParser, tool: str) -> None:
    """``--version`` (``-version`` too, as the Go tools spell it): print it and exit 0."""
    parser.add_argument(
        "--version",
        action="version",
        version=f"nsqclient {tool} {__version__}",
        help="print the version and exit",
    )


def add_http_timeout_flags(parser: argparse.ArgumentParser, what: str) -> None:
    """``--http-client-connect-timeout`` and ``--http-client-request-timeout`` (Go's names and
    defaults: 2s and 5s) for the HTTP requests of ``what``."""
    parser.add_argument(
        "--http-client-connect-timeout",
        type=positive_duration,
        default=2.0,
        metavar="DURATION",
        help=f"timeout for connecting to {what} (default: 2s)",
    )
    parser.add_argument(
        "--http-client-request-timeout",
        type=positive_duration,
        default=5.0,
        metavar="DURATION",
        help=f"timeout for {what} to answer a request, once connected (default: 5s)",
    )


class TimeoutSession(requests.Session):
    """A requests session that gives every request ``connect_timeout`` to connect and the
    timeout the request was made with (the HTTP clients' single timeout) for each read.

    The clients of :mod:`nsqclient.http` take one timeout for both; the Go tools' flags keep
    them apart, and a session passed to those clients is how the CLI does too."""

    def __init__(self, connect_timeout: float):
        super().__init__()
        self.connect_timeout = connect_timeout

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> Any:
        timeout = kwargs.get("timeout")
        if isinstance(timeout, int | float):
            kwargs["timeout"] = (self.connect_timeout, timeout)
        return super().request(method, url, *args, **kwargs)


def add_log_level_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-level",
        default="warn",
        choices=["debug", "info", "warn", "error"],
        help="verbosity of the log on stderr (default: warn)",
    )


def add_options_flag(parser: argparse.ArgumentParser, flag: str, what: str) -> None:
    parser.add_argument(
        flag,
        dest="client_options",
        action="append",
        default=[],
        metavar="NAME,VALUE",
        help=f"an nsqclient {what} option (see nsqclient.config, e.g. tls_v1,true or "
        "msg_timeout,30s or snappy=true); may be given multiple times",
    )


def _option_value(name: str, text: str) -> Any:
    opt = OPTIONS[name]
    kinds = opt.kind if isinstance(opt.kind, tuple) else (opt.kind,)
    if opt.nullable and text.lower() in ("", "none", "null"):
        return None
    if bool in kinds:
        lowered = text.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise UsageError(f"option {name}: expected true or false, not {text!r}")
    if float in kinds:
        try:
            return parse_duration(text)
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"option {name}: {exc}") from None
    if int in kinds:
        try:
            return int(text, 10)
        except ValueError:
            raise UsageError(f"option {name}: expected an integer, not {text!r}") from None
    return text


_OPTION_FLAGS = {"Consumer": "--consumer-opt", "Producer": "--producer-opt"}
_PAIR = re.compile(r"^\s*([^\s,=]+)\s*[,=](.*)$", re.S)


def _unknown_option(name: str, owner: str | None) -> UsageError:
    """The usage error for an option name that is not one: with the closest name (a dash for an
    underscore and capitals are the usual slips) and, when that one belongs to the other class,
    a word saying so."""
    normal = name.replace("-", "_").lower()
    if normal in OPTIONS:
        close = [normal]
    else:
        close = difflib.get_close_matches(normal, OPTIONS, n=1, cutoff=0.7)
    text = f"unknown option {name!r}"
    if close:
        text += f"; did you mean {close[0]!r}?"
        other = OPTIONS[close[0]].owner
        if owner is not None and other is not None and other != owner:
            text += f" (a {other} option, which {_OPTION_FLAGS[owner]} does not take)"
    return UsageError(text)


def client_options(
    pairs: Sequence[str], owner: str | None = None, **defaults: Any
) -> dict[str, Any]:
    """Options for Consumer/Producer from ``NAME,VALUE`` (go-nsq's form) or ``NAME=VALUE``
    strings, over ``defaults``; validated with :class:`~nsqclient.config.Config` so that a bad
    name or value is a usage error naming it.  With ``owner`` (``"Consumer"`` or
    ``"Producer"``) an option only the other class takes is a usage error too (see
    :func:`~nsqclient.config.check_owner`)."""
    options = dict(defaults)
    for pair in pairs:
        match = _PAIR.match(pair)
        if match is None:
            name = pair.strip()
            missing = " (the value is missing)" if name.replace("-", "_").lower() in OPTIONS else ""
            raise UsageError(f"option {pair!r}: expected NAME,VALUE or NAME=VALUE{missing}")
        name = match.group(1)
        if name not in OPTIONS:
            raise _unknown_option(name, owner)
        options[name] = _option_value(name, match.group(2).strip())
    try:
        if owner is not None:
            check_owner(options, owner)
        Config(**options)
    except (TypeError, ValueError) as exc:
        flag = _OPTION_FLAGS.get(owner or "")
        raise UsageError(f"{flag}: {exc}" if flag else str(exc)) from None
    return options


def user_agent(tool: str) -> str:
    return f"nsqclient-{tool}/{__version__}"


def setup_logging(level: str) -> None:
    """Log records (ours and the client's) go to stderr at ``level`` (unless the process has
    configured logging already, as a test runner calling :func:`~nsqclient.cli.main.main`
    in-process has)."""
    levels = {
        "debug": logging.DEBUG,
        "info": logging.INFO,
        "warn": logging.WARNING,
        "error": logging.ERROR,
    }
    logging.basicConfig(
        level=levels[level],
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


# ------------------------------------------------------------------------------ subcommands


def finish_command(
    parser: argparse.ArgumentParser,
    name: str,
    run: Callable[[argparse.Namespace], int],
    client: str | None = None,
) -> argparse.ArgumentParser:
    """Close the parser of the subcommand ``name`` (run by ``run``) with the flags every
    command ends with: the option passthrough of the ``client`` class when it has one
    (``"Consumer"``: ``--consumer-opt``, ``"Producer"``: ``--producer-opt``), ``--log-level``
    and ``--version``.  Returns ``parser``."""
    if client is not None:
        add_options_flag(parser, _OPTION_FLAGS[client], client)
    add_log_level_flag(parser)
    add_version_flag(parser, name)
    parser.set_defaults(run=run, subparser=parser)
    return parser


# ------------------------------------------------------------------------------ Go-style flags


def go_style_flags(argv: Sequence[str], long_options: set[str]) -> list[str]:
    """Rewrite Go's single-dash long flags (``-topic=x``, ``-print-topic``) as ``--topic=x``,
    ``--print-topic`` when they name one of ``long_options`` (given with their ``--``), so that
    a command line written for the Go tools works as it is.  Stops at ``--``."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        if arg == "--":
            out.extend(argv[i:])
            break
        if arg.startswith("-") and not arg.startswith("--") and len(arg) > 2:
            name = "-" + arg.split("=", 1)[0]
            if name in long_options:
                arg = "-" + arg
        out.append(arg)
    return out


# ------------------------------------------------------------------------------ signals


class StopSignals:
    """While active (a context manager, in the main thread), SIGINT and SIGTERM set
    :attr:`event` and record :attr:`signum` instead of raising KeyboardInterrupt, so that the
    tool stops at a point of its choosing.  A second signal falls back to the default
    behaviour (an impatient user can still kill a tool stuck in a stop)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            for sig, previous in self._previous.items():
                signal.signal(sig, previous)
            signal.raise_signal(signum)
            return
        self.signum = signum
        self.event.set()

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in stop_signals():
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()


# ------------------------------------------------------------------------------ errors


def describe_error(exc: BaseException) -> str:
    """A short text for ``exc``: for a transport failure under an HTTPError (status 0), the
    operating system's reason (``Connection refused``) rather than the whole chain."""
    if isinstance(exc, HTTPError) and exc.status == 0:
        seen: set[int] = set()
        cause: BaseException | None = exc
        while cause is not None and id(cause) not in seen:
            seen.add(id(cause))
            if isinstance(cause, OSError) and cause.strerror:
                return cause.strerror
            if isinstance(cause, TimeoutError) or "timed out" in str(cause).lower():
                return "timed out"
            cause = cause.__cause__ or cause.__context__
    return str(exc)


# ------------------------------------------------------------------------------ preflight


def check_nsqd_reachable(addresses: Sequence[str], timeout: float) -> None:
    """Raise CLIError when none of the nsqd TCP ``addresses`` accepts a connection (each that
    does not is named).  The consumer itself would keep retrying quietly: a tool started
    against a wrong address should say so and exit instead."""
    failures = []
    for address in addresses:
        try:
            with socket.create_connection(split_host_port(address), timeout=timeout):
                return
        except OSError as exc:
            failures.append(f"{address}: {exc.strerror or exc}")
    if failures:
        raise CLIError("cannot connect to nsqd " + "; ".join(failures))


def check_lookupd_reachable(
    addresses: Sequence[str],
    topic: str | None,
    timeout: float,
    session: requests.Session | None = None,
) -> None:
    """Raise CLIError when no nsqlookupd in ``addresses`` answers a lookup of ``topic`` (an
    unknown topic is an answer: nsqd may create it later), or, for ``topic`` None, a listing
    of the topics."""
    failures = []
    for address in addresses:
        try:
            with LookupdClient(address, timeout=timeout, session=session) as lookupd:
                if topic is None:
                    lookupd.topics()
                else:
                    lookupd.lookup(topic)
            return
        except TopicNotFoundError:
            return
        except (HTTPError, ValueError) as exc:
            failures.append(f"{address}: {describe_error(exc)}")
    if failures:
        raise CLIError("cannot query nsqlookupd " + "; ".join(failures))


def check_sources(args: argparse.Namespace) -> None:
    """The consuming tools need --nsqd-tcp-address or --lookupd-http-address."""
    if not args.nsqd_tcp_addresses and not args.lookupd_http_addresses:
        raise UsageError("--nsqd-tcp-address or --lookupd-http-address required")


def check_reachable(
    args: argparse.Namespace,
    options: dict[str, Any],
    topic: str | None,
    session: TimeoutSession | None = None,
) -> None:
    """The consuming tools' preflight: each --nsqd-tcp-address and --lookupd-http-address
    given must answer (within the dial timeout of ``options`` and a second; lookupd gets
    four more, or, with ``session``, the tool's --http-client-*-timeout), see
    :func:`check_nsqd_reachable` and :func:`check_lookupd_reachable`."""
    timeout = float(options.get("dial_timeout", 1.0)) + 1.0
    if args.nsqd_tcp_addresses:
        check_nsqd_reachable(args.nsqd_tcp_addresses, timeout)
    if args.lookupd_http_addresses:
        lookupd_timeout = timeout + 4.0
        if session is not None:
            lookupd_timeout = args.http_client_request_timeout
        check_lookupd_reachable(args.lookupd_http_addresses, topic, lookupd_timeout, session)


def run_until_stopped(
    stop: threading.Event,
    consumers: Sequence[Consumer] | Callable[[], Sequence[Consumer]],
) -> str | None:
    """Wait until ``stop`` is set (a signal, or the work is done) or a consumer stops by
    itself (e.g. an ordered topic subscribed without --ordered); the error text of the
    consumers that did, or None.  ``consumers`` may be a function giving the current ones
    (a tool that adds consumers while it runs)."""
    while not stop.wait(0.5):
        current = consumers() if callable(consumers) else consumers
        failed = [str(c.error) for c in current if c.error is not None]
        if failed:
            return "; ".join(failed)
    return None
