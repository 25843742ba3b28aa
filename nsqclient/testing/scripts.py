"""The embedded servers as stand-ins for the real binaries: the console scripts ``nsqclient-nsqd``
and ``nsqclient-nsqlookupd`` (also ``python -m nsqclient.testing nsqd ...`` / ``... nsqlookupd
...``): each server's flag table, the options it makes of them, and a main that runs the server.

Each takes the real binary's flags with their meanings and units, in Go's flag syntax (read by
:mod:`.gostyle.flags`): ``-flag``
or ``--flag``, ``-flag=value`` or ``-flag value`` (booleans only as ``-flag`` or
``-flag=false``), durations as Go writes them (``60s``, ``1m30s``, ``250ms``), repeatable flags
given several times.  A duration may also be a plain number of seconds (``60``), which the real
binaries refuse.  A flag the embedded server does not implement is refused with exit status
2, never ignored; ``-help`` lists every flag it does implement.  SIGINT or SIGTERM stops the
server cleanly (exit status 0), saving its data path if it has one.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from ..platforms import stop_signals
from .gostyle.flags import (
    Flag,
    FlagError,
    go_bool,
    go_duration_seconds,
    go_int,
    parse_go_flags,
    usage,
)
from .gostyle.text import VERSION
from .lookupd.node import Lookupd
from .nsqd.node import NSQD
from .nsqd.options import NSQDOptions

__all__ = ["nsqd_main", "nsqlookupd_main", "nsqd_options", "NSQD_FLAGS", "NSQLOOKUPD_FLAGS"]

log = logging.getLogger("nsqclient.testing.cli")

_LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
}


def _tls_required(text: str) -> int:
    if text == "tcp-https":
        return 1
    return 2 if go_bool(text) else 0


def _log_level(text: str) -> str:
    if text.lower() not in _LOG_LEVELS:
        raise ValueError(f"invalid log level {text!r} (debug, info, warn, error or fatal)")
    return text.lower()


def _b(name: str, default: bool, text: str) -> Flag:
    return Flag(name, go_bool, default, text, is_bool=True)


NSQD_FLAGS: list[Flag] = [
    _b("version", False, "print version string"),
    Flag("log-level", _log_level, "info", "log verbosity: debug, info, warn, error or fatal"),
    Flag("log-prefix", str, "[nsqd] ", "log message prefix"),
    _b("verbose", False, "[deprecated] has no effect, use --log-level (as in nsqd)"),
    Flag("node-id", go_int, None, "unique part for message IDs, integer in [0,1024)"),
    Flag("tcp-address", str, "0.0.0.0:4150", "<addr>:<port> to listen on for TCP clients"),
    Flag("http-address", str, "0.0.0.0:4151", "<addr>:<port> to listen on for HTTP clients"),
    Flag(
        "https-address",
        str,
        "0.0.0.0:4152",
        "<addr>:<port> to listen on for HTTPS clients (with --tls-cert; empty: none)",
    ),
    Flag(
        "broadcast-address",
        str,
        None,
        "address registered with nsqlookupd (default: the OS hostname)",
    ),
    Flag(
        "lookupd-tcp-address",
        str,
        [],
        "nsqlookupd TCP <addr>:<port> to register with (may be given multiple times)",
        repeated=True,
    ),
    Flag(
        "auth-http-address",
        str,
        [],
        "<addr>:<port> or full URL of an auth server to ask on AUTH (may be given multiple "
        "times); clients must AUTH before SUB/PUB",
        repeated=True,
    ),
    Flag(
        "http-client-connect-timeout",
        go_duration_seconds,
        2.0,
        "duration: timeout for connecting to auth servers and nsqlookupd's HTTP API",
    ),
    Flag(
        "http-client-request-timeout",
        go_duration_seconds,
        5.0,
        "duration: timeout for a request to auth servers and nsqlookupd's HTTP API",
    ),
    Flag(
        "data-path",
        str,
        None,
        "directory keeping topics, channels (and pause flags) and queued messages across "
        "restarts (default: memory only)",
    ),
    Flag(
        "mem-queue-size",
        go_int,
        10000,
        "messages (per topic/channel) counted as in memory; the rest show as backend_depth",
    ),
    Flag(
        "msg-timeout",
        go_duration_seconds,
        60.0,
        "duration before an unanswered message is requeued",
    ),
    Flag(
        "max-msg-timeout",
        go_duration_seconds,
        900.0,
        "duration: the longest msg timeout a client may ask for",
    ),
    Flag("max-msg-size", go_int, 1048576, "bytes: the largest single message"),
    Flag("max-req-timeout", go_duration_seconds, 3600.0, "duration: the longest REQ/DPUB delay"),
    Flag(
        "max-body-size", go_int, 5242880, "bytes: the largest command body (MPUB, IDENTIFY, AUTH)"
    ),
    Flag(
        "max-heartbeat-interval",
        go_duration_seconds,
        60.0,
        "duration: the longest heartbeat interval a client may ask for",
    ),
    Flag("max-rdy-count", go_int, 2500, "messages: the largest RDY a client may send"),
    Flag(
        "max-output-buffer-size",
        go_int,
        65536,
        "bytes: the largest output buffer a client may ask for",
    ),
    Flag(
        "max-output-buffer-timeout",
        go_duration_seconds,
        30.0,
        "duration: the longest output buffer timeout a client may ask for",
    ),
    Flag(
        "min-output-buffer-timeout",
        go_duration_seconds,
        0.025,
        "duration: the shortest output buffer timeout a client may ask for",
    ),
    Flag(
        "output-buffer-timeout",
        go_duration_seconds,
        0.25,
        "duration: the default output buffer timeout (reported in IDENTIFY)",
    ),
    Flag(
        "max-channel-consumers",
        go_int,
        0,
        "consumer connections per channel (0: unlimited)",
    ),
    Flag("tls-cert", str, None, "path to the server certificate file (PEM)"),
    Flag("tls-key", str, None, "path to the server key file (PEM)"),
    Flag(
        "tls-client-auth-policy",
        str,
        "",
        "client certificate policy: 'require' or 'require-verify' (implies --tls-required)",
    ),
    Flag("tls-root-ca-file", str, None, "path to the CA file client certificates verify against"),
    Flag(
        "tls-required",
        _tls_required,
        0,
        "require TLS for client connections: true, false or tcp-https",
        is_bool=True,
    ),
    Flag(
        "tls-min-version",
        str,
        None,
        "minimum TLS version: ssl3.0, tls1.0, tls1.1, tls1.2 or tls1.3",
    ),
    _b("deflate", True, "enable deflate feature negotiation (client compression)"),
    Flag("max-deflate-level", go_int, 6, "the highest deflate level a client may ask for (1-9)"),
    _b("snappy", True, "enable snappy feature negotiation (client compression)"),
]

NSQLOOKUPD_FLAGS: list[Flag] = [
    _b("version", False, "print version string"),
    Flag("log-level", _log_level, "info", "log verbosity: debug, info, warn, error or fatal"),
    Flag("log-prefix", str, "[nsqlookupd] ", "log message prefix"),
    _b("verbose", False, "[deprecated] has no effect, use --log-level (as in nsqlookupd)"),
    Flag("tcp-address", str, "0.0.0.0:4160", "<addr>:<port> to listen on for nsqd registrations"),
    Flag("http-address", str, "0.0.0.0:4161", "<addr>:<port> to listen on for HTTP clients"),
    Flag(
        "broadcast-address",
        str,
        None,
        "address of this nsqlookupd, told to nsqd nodes (default: the OS hostname)",
    ),
    Flag(
        "inactive-producer-timeout",
        go_duration_seconds,
        300.0,
        "duration an nsqd stays in /lookup answers after its last ping",
    ),
    Flag(
        "tombstone-lifetime",
        go_duration_seconds,
        45.0,
        "duration an nsqd stays tombstoned for a topic",
    ),
]


def _split_address(flag: str, address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise FlagError(f"invalid value {address!r} for flag -{flag}: want <addr>:<port>")
    return host.strip("[]") or "0.0.0.0", int(port)


def _setup_logging(level: str, prefix: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(prefix.replace("%", "%%") + "%(asctime)s %(levelname)s: %(message)s")
    )
    root = logging.getLogger("nsqclient.testing")
    root.handlers[:] = [handler]
    root.setLevel(_LOG_LEVELS[level])
    root.propagate = False


def _fail(prog: str, flags: list[Flag], message: str) -> NoReturn:
    sys.stderr.write(f"{prog}: {message}\n")
    sys.stderr.write(f"run '{prog} -help' for the flags the embedded server implements\n")
    raise SystemExit(2)


def _parse(prog: str, flags: list[Flag], argv: list[str]) -> dict[str, Any]:
    try:
        values = parse_go_flags(flags, argv)
    except FlagError as exc:
        _fail(prog, flags, str(exc))
    if values.get("help"):
        usage(prog, flags, sys.stdout)
        raise SystemExit(0)
    if values["version"]:
        sys.stdout.write(f"{prog} v{VERSION} (embedded, nsqclient.testing)\n")
        raise SystemExit(0)
    return values


async def _serve(start: Callable[[], Any], stop: Callable[[], Any]) -> None:
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    for signum in stop_signals():
        try:
            loop.add_signal_handler(signum, done.set)
        except NotImplementedError:  # Windows' event loops: the plain handler, into the loop
            signal.signal(signum, lambda _signum, _frame: loop.call_soon_threadsafe(done.set))
    await start()
    try:
        await done.wait()
        log.info("signal received; exiting")
    finally:
        await stop()


def nsqd_options(
    values: dict[str, Any],
) -> tuple[NSQDOptions, tuple[str, int], tuple[str, int], tuple[str, int] | None]:
    """NSQDOptions and the (host, port) of the TCP, HTTP and HTTPS listeners (None: no HTTPS
    listener) for parsed nsqd flags."""
    tcp = _split_address("tcp-address", values["tcp_address"])
    http = _split_address("http-address", values["http_address"])
    https = (
        _split_address("https-address", values["https_address"])
        if values["https_address"]
        else None
    )
    for address in values["lookupd_tcp_address"]:
        _split_address("lookupd-tcp-address", address)
    node_id = values["node_id"]
    if node_id is not None and not 0 <= node_id < 1024:
        raise FlagError(f"--node-id must be [0,1024), got {node_id}")
    kwargs: dict[str, Any] = {
        "node_id": node_id,
        "broadcast_address": values["broadcast_address"] or socket.gethostname(),
        "lookupd_tcp_addresses": list(values["lookupd_tcp_address"]),
        "auth_http_address": list(values["auth_http_address"]),
        "data_path": values["data_path"],
    }
    for name in (
        "http_client_connect_timeout",
        "http_client_request_timeout",
        "mem_queue_size",
        "msg_timeout",
        "max_msg_timeout",
        "max_msg_size",
        "max_req_timeout",
        "max_body_size",
        "max_heartbeat_interval",
        "max_rdy_count",
        "max_output_buffer_size",
        "max_output_buffer_timeout",
        "min_output_buffer_timeout",
        "output_buffer_timeout",
        "max_channel_consumers",
        "tls_cert",
        "tls_key",
        "tls_client_auth_policy",
        "tls_root_ca_file",
        "tls_required",
        "tls_min_version",
        "deflate",
        "max_deflate_level",
        "snappy",
    ):
        kwargs[name] = values[name]
    if kwargs["tls_client_auth_policy"] not in ("", "require", "require-verify"):
        raise FlagError(
            "--tls-client-auth-policy must be 'require' or 'require-verify', "
            f"got {kwargs['tls_client_auth_policy']!r}"
        )
    try:
        opts = NSQDOptions.from_kwargs(**kwargs)
    except (TypeError, ValueError) as exc:
        raise FlagError(str(exc)) from exc
    return opts, tcp, http, https


def nsqd_main(argv: list[str] | None = None, prog: str = "nsqclient-nsqd") -> int:
    """Run an embedded nsqd with nsqd's flags until SIGINT/SIGTERM; return the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    values = _parse(prog, NSQD_FLAGS, argv)
    try:
        opts, (tcp_host, tcp_port), (http_host, http_port), https = nsqd_options(values)
    except FlagError as exc:
        _fail(prog, NSQD_FLAGS, str(exc))
    _setup_logging(values["log_level"], values["log_prefix"])
    holder: dict[str, NSQD] = {}

    async def start() -> None:
        node = NSQD(
            asyncio.get_running_loop(),
            opts,
            host=tcp_host,
            tcp_port=tcp_port,
            http_port=http_port,
            http_host=http_host,
            https_host=https[0] if https else None,
            https_port=https[1] if https else None,
        )
        holder["node"] = node
        await node.start()

    async def stop() -> None:
        if "node" in holder:
            await holder["node"].stop()

    return _run(prog, start, stop)


def nsqlookupd_main(argv: list[str] | None = None, prog: str = "nsqclient-nsqlookupd") -> int:
    """Run an embedded nsqlookupd with nsqlookupd's flags until SIGINT/SIGTERM."""
    argv = sys.argv[1:] if argv is None else argv
    values = _parse(prog, NSQLOOKUPD_FLAGS, argv)
    try:
        tcp_host, tcp_port = _split_address("tcp-address", values["tcp_address"])
        http_host, http_port = _split_address("http-address", values["http_address"])
    except FlagError as exc:
        _fail(prog, NSQLOOKUPD_FLAGS, str(exc))
    _setup_logging(values["log_level"], values["log_prefix"])
    holder: dict[str, Lookupd] = {}

    async def start() -> None:
        lookupd = Lookupd(
            asyncio.get_running_loop(),
            host=tcp_host,
            tcp_port=tcp_port,
            http_port=http_port,
            http_host=http_host,
            broadcast_address=values["broadcast_address"] or socket.gethostname(),
            inactive_producer_timeout=values["inactive_producer_timeout"],
            tombstone_lifetime=values["tombstone_lifetime"],
        )
        holder["lookupd"] = lookupd
        await lookupd.start()

    async def stop() -> None:
        if "lookupd" in holder:
            await holder["lookupd"].stop()

    return _run(prog, start, stop)


def _run(prog: str, start: Callable[[], Any], stop: Callable[[], Any]) -> int:
    try:
        asyncio.run(_serve(start, stop))
    except OSError as exc:  # e.g. the address is in use
        log.critical("%s: %s", prog, exc)
        return 1
    return 0
