"""``nsqclient stat``: watch a topic/channel over every nsqd that has it (like ``nsq_stat``).

Every ``--interval`` the nsqd holding the topic are found (through nsqlookupd, or among the
``--nsqd-http-address`` given), their ``/stats`` for the channel are summed, and one row is
printed: the rates (messages a second into the channel and out of it since the previous row)
and the channel's depth (total, in memory, on disk), in-flight, deferred, requeued and timed
out counts, messages so far and clients.  A header is printed every 25 rows.  The first row
comes at once; its rates are ``-`` (there is nothing to compare with yet).

The table is plain text on stdout, one row per interval, as ``nsq_stat`` prints it: it works
in a terminal, a pipe, a log file and ``watch``, so no terminal library is used.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from ..errors import HTTPError
from ..http import LookupdClient, NsqdHTTPClient, TopicNotFoundError
from .common import (
    CLIError,
    StopSignals,
    TimeoutSession,
    UsageError,
    add_http_timeout_flags,
    add_lookupd_flag,
    channel_name,
    describe_error,
    finish_command,
    positive_duration,
    positive_int,
    setup_logging,
    topic_name,
)

__all__ = ["add_parser", "run", "ChannelTotals", "sum_channel", "format_row", "HEADER"]

logger = logging.getLogger("nsqclient.cli.stat")

HEADER = (
    "------rate------+----------------depth----------------+--------------metadata---------------\n"
    f"{'ingress':>7} {'egress':>7} | {'total':>7} {'mem':>7} {'disk':>7} {'inflt':>5} "
    f"{'def':>5} | {'req':>7} {'t-o':>7} {'msgs':>12} {'clients':>7}"
)
_HEADER_EVERY = 25


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "stat",
        help="watch a channel's depth, in-flight and rates over every nsqd",
        description="Print a channel's statistics, summed over every nsqd that has its topic, "
        "every interval.",
    )
    p.add_argument("--topic", type=topic_name, required=True, help="NSQ topic")
    p.add_argument("--channel", type=channel_name, required=True, help="NSQ channel")
    add_lookupd_flag(p)
    p.add_argument(
        "--nsqd-http-address",
        dest="nsqd_http_addresses",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="nsqd HTTP address (may be given multiple times)",
    )
    p.add_argument(
        "--interval",
        type=positive_duration,
        default=2.0,
        help="time between two rows: seconds or a Go duration like 2s, 500ms (default: 2s)",
    )
    p.add_argument(
        "--count",
        type=positive_int,
        default=0,
        metavar="N",
        help="print N rows and exit (default: until stopped)",
    )
    add_http_timeout_flags(p, "nsqd and nsqlookupd")
    return finish_command(p, "stat", run)


@dataclass
class ChannelTotals:
    """A channel's counters summed over nsqd."""

    depth: int = 0
    backend_depth: int = 0
    in_flight: int = 0
    deferred: int = 0
    requeued: int = 0
    timed_out: int = 0
    messages: int = 0
    clients: int = 0
    nsqd: int = 0

    @property
    def memory_depth(self) -> int:
        return self.depth - self.backend_depth


def sum_channel(stats: Iterable[dict[str, Any]], topic: str, channel: str) -> ChannelTotals | None:
    """The totals of ``topic``/``channel`` over nsqd ``/stats`` replies; None when no reply
    has the channel."""
    totals = ChannelTotals()
    found = False
    for reply in stats:
        for t in reply.get("topics") or []:
            if t.get("topic_name") != topic:
                continue
            for c in t.get("channels") or []:
                if c.get("channel_name") != channel:
                    continue
                found = True
                totals.nsqd += 1
                totals.depth += int(c.get("depth", 0))
                totals.backend_depth += int(c.get("backend_depth", 0))
                totals.in_flight += int(c.get("in_flight_count", 0))
                totals.deferred += int(c.get("deferred_count", 0))
                totals.requeued += int(c.get("requeue_count", 0))
                totals.timed_out += int(c.get("timeout_count", 0))
                totals.messages += int(c.get("message_count", 0))
                if "client_count" in c:
                    totals.clients += int(c["client_count"])
                else:
                    totals.clients += len(c.get("clients") or [])
    return totals if found else None


def format_row(now: ChannelTotals, before: ChannelTotals | None, seconds: float) -> str:
    """One row of the table; the rates compare with ``before``, ``seconds`` earlier."""
    if before is None or seconds <= 0:
        ingress = egress = "-"
    else:
        came = now.messages - before.messages
        went = came - (now.depth - before.depth)
        ingress = str(int(came / seconds))
        egress = str(int(went / seconds))
    return (
        f"{ingress:>7} {egress:>7} | {now.depth:>7} {now.memory_depth:>7} "
        f"{now.backend_depth:>7} {now.in_flight:>5} {now.deferred:>5} | "
        f"{now.requeued:>7} {now.timed_out:>7} {now.messages:>12} {now.clients:>7}"
    )


class _Source:
    """Where the nsqd of a topic are, and their stats."""

    def __init__(
        self,
        lookupd_addresses: Sequence[str],
        nsqd_addresses: Sequence[str],
        timeout: float,
        connect_timeout: float,
    ):
        self.timeout = timeout
        self.session = TimeoutSession(connect_timeout)
        try:
            self.lookupds = [self._client(LookupdClient, a) for a in lookupd_addresses]
            self.fixed = [self._client(NsqdHTTPClient, a) for a in nsqd_addresses]
        except ValueError:
            self.session.close()
            raise
        self.found: dict[str, NsqdHTTPClient] = {}

    def _client(self, kind: Any, address: str) -> Any:
        return kind(address, timeout=self.timeout, session=self.session)

    def close(self) -> None:
        self.session.close()

    def nsqd(self, topic: str) -> list[NsqdHTTPClient]:
        if not self.lookupds:
            return self.fixed
        addresses: set[str] = set()
        errors = []
        for lookupd in self.lookupds:
            try:
                result = lookupd.lookup(topic)
            except TopicNotFoundError:
                continue
            except HTTPError as exc:
                errors.append(f"{lookupd.base_url}: {describe_error(exc)}")
                continue
            for producer in result["producers"]:
                host = producer.get("broadcast_address")
                port = producer.get("http_port")
                if host and port:
                    addresses.add(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
        if errors and len(errors) == len(self.lookupds):
            raise CLIError("cannot query nsqlookupd " + "; ".join(errors))
        if not addresses:
            raise CLIError(f"topic {topic!r} not found: no nsqd has it according to nsqlookupd")
        for address in addresses - self.found.keys():
            self.found[address] = self._client(NsqdHTTPClient, address)
        return [self.found[a] for a in sorted(addresses)]

    def totals(self, topic: str, channel: str) -> ChannelTotals:
        replies = []
        for client in self.nsqd(topic):
            try:
                replies.append(client.stats(topic, channel, include_clients=False))
            except HTTPError as exc:
                raise CLIError(
                    f"cannot get stats from nsqd {client.base_url}: {describe_error(exc)}"
                ) from None
        totals = sum_channel(replies, topic, channel)
        if totals is None:
            raise CLIError(
                f"channel {channel!r} of topic {topic!r} not found on any of {len(replies)} nsqd"
            )
        return totals


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    setup_logging(args.log_level)
    out = out or sys.stdout
    if not args.nsqd_http_addresses and not args.lookupd_http_addresses:
        raise UsageError("--nsqd-http-address or --lookupd-http-address required")
    if args.nsqd_http_addresses and args.lookupd_http_addresses:
        raise UsageError("use --nsqd-http-address or --lookupd-http-address, not both")
    try:
        source = _Source(
            args.lookupd_http_addresses,
            args.nsqd_http_addresses,
            args.http_client_request_timeout,
            args.http_client_connect_timeout,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    rows = 0
    before: ChannelTotals | None = None
    before_at = 0.0
    started = time.monotonic()
    try:
        with StopSignals() as signals:
            while True:
                try:
                    totals = source.totals(args.topic, args.channel)
                except CLIError as exc:
                    if before is None:
                        raise  # nothing works: say so and exit
                    print(f"nsqclient stat: {exc}", file=sys.stderr)
                    totals = None
                taken_at = time.monotonic()
                if totals is not None:
                    if rows % _HEADER_EVERY == 0:
                        print(HEADER, file=out)
                    print(format_row(totals, before, taken_at - before_at), file=out, flush=True)
                    rows += 1
                    before, before_at = totals, taken_at
                if args.count and rows >= args.count:
                    break
                # Rows on a fixed schedule: a slow poll does not shift the next ones.
                ticks = int((time.monotonic() - started) / args.interval) + 1
                delay = started + ticks * args.interval - time.monotonic()
                if signals.event.wait(max(delay, 0.0)):
                    break
    finally:
        source.close()
    return 0
