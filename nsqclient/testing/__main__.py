"""``python -m nsqclient.testing``: run embedded NSQ servers until SIGINT/SIGTERM.

One server each, with the real binary's flags and meanings (see :mod:`.scripts`)::

    python -m nsqclient.testing nsqlookupd --tcp-address=127.0.0.1:4160 --http-address=...
    python -m nsqclient.testing nsqd --lookupd-tcp-address=127.0.0.1:4160 --data-path=/tmp/d

(the same as the ``nsqclient-nsqlookupd`` and ``nsqclient-nsqd`` commands).  With
``--youzan``, youzan's partitioned NSQ: ``--nsqd-count`` nodes (the first on
``--tcp-address``) and ``--lookupd-count`` lookupds (the first on the ``--lookupd-*``
addresses, free ports otherwise); create topics with the lookupd's ``POST /topic/create``.
Without a server name, the older combined mode: one nsqd and, with ``--lookupd-tcp-address`` and
``--lookupd-http-address``, an nsqlookupd in the same process that it registers with::

    python -m nsqclient.testing --tcp-address 127.0.0.1:4150 --http-address 127.0.0.1:4151 \\
        --lookupd-tcp-address 127.0.0.1:4160 --lookupd-http-address 127.0.0.1:4161
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from ..durations import parse_duration
from ..platforms import stop_signals
from .cluster import EmbeddedNSQ
from .scripts import nsqd_main, nsqlookupd_main

log = logging.getLogger("nsqclient.testing")


def main(argv: list[str] | None = None) -> int:
    """Run ``nsqd ...`` or ``nsqlookupd ...`` (or the combined mode); return the exit status."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args and args[0] == "nsqd":
        return nsqd_main(args[1:], prog="python -m nsqclient.testing nsqd")
    if args and args[0] == "nsqlookupd":
        return nsqlookupd_main(args[1:], prog="python -m nsqclient.testing nsqlookupd")
    return combined_main(args)


PROG = "python -m nsqclient.testing"


def build_parser() -> argparse.ArgumentParser:
    """The combined mode's command line."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run an embedded nsqd (+ nsqlookupd) until SIGINT/SIGTERM.  For one server"
        " with the real binary's flags, run 'python -m nsqclient.testing nsqd -help' or"
        " '... nsqlookupd -help' instead.",
    )
    parser.add_argument(
        "--tcp-address",
        default="127.0.0.1:4150",
        metavar="HOST:PORT",
        help="nsqd's TCP listener (default %(default)s)",
    )
    parser.add_argument(
        "--http-address",
        default="127.0.0.1:4151",
        metavar="HOST:PORT",
        help="nsqd's HTTP listener (default %(default)s)",
    )
    parser.add_argument(
        "--lookupd-tcp-address",
        default=None,
        metavar="HOST:PORT",
        help="run an nsqlookupd in this process with its TCP listener here (the nsqd registers"
        " with it); goes with --lookupd-http-address",
    )
    parser.add_argument(
        "--lookupd-http-address",
        default=None,
        metavar="HOST:PORT",
        help="that nsqlookupd's HTTP listener",
    )
    parser.add_argument(
        "--msg-timeout",
        type=parse_duration,
        default=None,
        metavar="DURATION",
        help="default time nsqd waits for FIN/REQ/TOUCH: seconds (60), or a Go duration"
        " (1500ms, 1m30s) (default nsqd's 60s)",
    )
    parser.add_argument(
        "--max-rdy-count",
        type=int,
        default=None,
        metavar="MESSAGES",
        help="largest RDY a client may send, in messages (default nsqd's 2500)",
    )
    parser.add_argument(
        "--tls-cert", default=None, metavar="PATH", help="PEM certificate: offer TLS to clients"
    )
    parser.add_argument(
        "--tls-key", default=None, metavar="PATH", help="PEM private key for --tls-cert"
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warn", "warning", "error", "fatal"),
        help="log level on stderr (default %(default)s)",
    )
    parser.add_argument(
        "--youzan",
        action="store_true",
        help="youzan's partitioned NSQ (nsqlookupd always on: free ports unless given)",
    )
    parser.add_argument(
        "--nsqd-count", type=int, default=1, metavar="NODES", help="nsqd nodes (youzan mode)"
    )
    parser.add_argument(
        "--lookupd-count", type=int, default=1, metavar="LOOKUPDS", help="lookupds (youzan mode)"
    )
    parser.add_argument(
        "--registration-ttl",
        type=parse_duration,
        default=None,
        metavar="DURATION",
        help="youzan mode: how long a killed node's registration outlives it before its"
        " partitions get a new leader (default youzan's 20s)",
    )
    return parser


def describe(cluster: EmbeddedNSQ) -> list[str]:
    """Where the servers of a started ``cluster`` listen, a line each, and, when there are
    nsqlookupds, the --lookupd-http-address flags a client (or ``nsqclient``) takes."""
    lines = [f"nsqd: TCP {n.tcp_address} HTTP {n.http_address}" for n in cluster.nsqds]
    lines += [f"nsqlookupd: TCP {lk.tcp_address} HTTP {lk.http_address}" for lk in cluster.lookupds]
    if cluster.lookupds:
        flags = " ".join(f"--lookupd-http-address {lk.http_address}" for lk in cluster.lookupds)
        lines.append(f"lookupd HTTP addresses: {flags}")
    return lines


def combined_main(argv: list[str]) -> int:
    """The combined mode: parse arguments, run the cluster until a signal."""
    parser = build_parser()
    args = parser.parse_args(argv)

    logging.basicConfig(
        level=getattr(logging, args.log_level.upper(), logging.INFO),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    if bool(args.lookupd_tcp_address) != bool(args.lookupd_http_address):
        parser.error("--lookupd-tcp-address and --lookupd-http-address go together")
    tcp_host = args.tcp_address.rpartition(":")[0] or "127.0.0.1"
    options = {}
    if args.msg_timeout is not None:
        options["msg_timeout"] = args.msg_timeout
    if args.max_rdy_count is not None:
        options["max_rdy_count"] = args.max_rdy_count
    if args.tls_cert:
        options["tls_cert"] = args.tls_cert
        options["tls_key"] = args.tls_key
    use_lookupd = bool(args.lookupd_tcp_address)
    if args.youzan:
        options["youzan"] = True
        options["lookupd_count"] = args.lookupd_count
        if args.registration_ttl is not None:
            options["registration_ttl"] = args.registration_ttl
    elif args.nsqd_count != 1 or args.lookupd_count != 1 or args.registration_ttl is not None:
        parser.error("--nsqd-count, --lookupd-count and --registration-ttl need --youzan")
    cluster = EmbeddedNSQ(
        nsqd_count=args.nsqd_count,
        lookupd=use_lookupd or args.youzan,
        host=tcp_host,
        nsqd_addresses=[(args.tcp_address, args.http_address)],
        lookupd_addresses=(
            (args.lookupd_tcp_address, args.lookupd_http_address) if use_lookupd else None
        ),
        broadcast_address=tcp_host,
        **options,
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        log.info("signal %d received; exiting", signum)
        stop.set()

    for signum in stop_signals():
        signal.signal(signum, on_signal)
    try:
        cluster.start()  # closes what it started when it fails
    except OSError as exc:  # an address in use, or not ours
        print(f"{PROG}: cannot start: {exc}", file=sys.stderr)
        return 1
    for line in describe(cluster):
        log.info("%s", line)
        print(line, flush=True)  # on stdout whatever the log level: a script can read it
    try:
        while not stop.wait(1.0):
            pass
    finally:
        cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
