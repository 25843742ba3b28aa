"""``nsqclient tail``: print the messages of one or more topics (like Go's ``nsq_tail``).

Each message is written to stdout (the body and a newline, or one JSON object a line with
``--json``) and flushed before it is finished (FIN); a message that could not be printed, or
that arrives after ``-n`` messages were printed or after SIGINT/SIGTERM, is requeued at once
(REQ) so that another consumer of the channel gets it.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import sys
import threading
from typing import Any, BinaryIO

from ..consumer import Consumer
from ..message import Message
from ..otel import configure_from_env
from .common import (
    CLIError,
    StopSignals,
    UsageError,
    add_count_flag,
    add_source_flags,
    check_reachable,
    check_sources,
    client_options,
    finish_command,
    non_negative_int,
    run_until_stopped,
    setup_logging,
    user_agent,
)

__all__ = ["add_parser", "run", "message_json", "Printer"]

_YOUZAN_FIELDS = ("partition", "internal_id", "trace_id", "offset", "raw_size", "ext_version")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "tail",
        help="print the messages of a topic",
        description="Print the messages of one or more topics to stdout, one a line.",
    )
    add_source_flags(
        p, None, "NSQ channel (default: a new ephemeral channel, tailNNNNNN#ephemeral)"
    )
    add_count_flag(
        p,
        "-n",
        "--total",
        default=0,
        kind=non_negative_int,
        help="exit after printing N messages in all (waits for them); 0: run until stopped",
    )
    add_count_flag(
        p,
        "--max-in-flight",
        default=200,
        help="messages nsqd may send before they are printed (default: 200)",
    )
    p.add_argument(
        "--print-topic",
        action="store_true",
        help="prefix each body with its topic and ' | '",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object a line: topic, id, attempts, timestamp (ns), nsqd, body "
        "(or body_base64 when it is not UTF-8), and youzan's fields when present",
    )
    p.add_argument(
        "--partition",
        type=non_negative_int,
        default=None,
        metavar="N",
        help="youzan: consume this partition only (default: every partition lookupd names)",
    )
    p.add_argument(
        "--ordered",
        action="store_true",
        help="youzan: subscribe with SUB_ORDERED (topics created ordered need it)",
    )
    return finish_command(p, "tail", run, "Consumer")


def message_json(message: Message, topic: str) -> dict[str, Any]:
    """The ``--json`` object of one message."""
    if message.internal_id is not None:
        text_id = message.id.hex()  # youzan's ids are 16 raw bytes
    else:
        text_id = message.id.decode("ascii", "backslashreplace")
    out: dict[str, Any] = {
        "topic": topic,
        "id": text_id,
        "attempts": message.attempts,
        "timestamp": message.timestamp,
        "nsqd": message.nsqd_address,
    }
    try:
        out["body"] = message.body.decode("utf-8")
    except UnicodeDecodeError:
        out["body_base64"] = base64.b64encode(message.body).decode("ascii")
    for field in _YOUZAN_FIELDS:
        value = getattr(message, field)
        if value is not None:
            out[field] = value
    if message.ext is not None:
        out["ext"] = message.ext
    elif message.ext_raw:
        out["ext_base64"] = base64.b64encode(message.ext_raw).decode("ascii")
    return out


class Printer:
    """Prints messages for every topic's consumer (their handlers share it) and counts them.

    Args:
        out: a binary stream (stdout's buffer).
        total: stop after this many messages (0: never).
        print_topic, as_json: the output format.
    """

    def __init__(
        self,
        out: BinaryIO,
        total: int,
        print_topic: bool,
        as_json: bool,
        done: threading.Event | None = None,
    ):
        self.out = out
        self.total = total
        self.print_topic = print_topic
        self.as_json = as_json
        self.printed = 0
        self.requeued = 0
        #: set when nothing more is to be printed (``done`` may be shared with StopSignals)
        self.done = done or threading.Event()
        self.broken_pipe = False
        self._lock = threading.Lock()

    def handler(self, topic: str) -> Any:
        def handle(message: Message) -> None:
            self.handle(topic, message)

        return handle

    def format(self, topic: str, message: Message) -> bytes:
        if self.as_json:
            line = json.dumps(message_json(message, topic), ensure_ascii=False)
            return line.encode("utf-8") + b"\n"
        prefix = topic.encode("utf-8") + b" | " if self.print_topic else b""
        return prefix + message.body + b"\n"

    def handle(self, topic: str, message: Message) -> None:
        data = self.format(topic, message)
        with self._lock:
            if self.done.is_set():
                self.requeued += 1
                message.requeue(delay=0, backoff=False)
                return
            try:
                self.out.write(data)
                self.out.flush()
            except BrokenPipeError:
                # The reader went away (``| head``): a normal end for a tail.
                self.broken_pipe = True
                self.done.set()
                self.requeued += 1
                message.requeue(delay=0, backoff=False)
                return
            self.printed += 1
            if self.total and self.printed >= self.total:
                self.done.set()
        message.finish()

    def stop(self) -> None:
        """Print nothing more: later messages are requeued.  (No lock: a handler blocked in a
        write to a full pipe holds it.)"""
        self.done.set()


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    configure_from_env(service_name="nsqclient-tail")  # OTEL_* environment, when the SDK is there
    check_sources(args)
    if args.json and args.print_topic:
        raise UsageError("--json already holds the topic; --print-topic does not apply")
    if args.ordered and args.nsqd_tcp_addresses and args.partition is None:
        raise UsageError("--ordered with --nsqd-tcp-address needs --partition")
    channel = args.channel or f"tail{random.randrange(1_000_000):06d}#ephemeral"
    max_in_flight = args.max_in_flight
    if args.total and args.total < max_in_flight:
        max_in_flight = args.total  # ask for no more than we will print
    options = client_options(
        args.client_options,
        "Consumer",
        max_in_flight=max_in_flight,
        max_tries=0,  # print every message, however often it was delivered before
        user_agent=user_agent("tail"),
    )
    check_reachable(args, options, args.topics[0])

    signals = StopSignals()
    printer = Printer(
        sys.stdout.buffer, args.total, args.print_topic, args.json, done=signals.event
    )
    consumers = [
        Consumer(
            topic,
            channel,
            printer.handler(topic),
            nsqd_tcp_addresses=args.nsqd_tcp_addresses,
            lookupd_http_addresses=args.lookupd_http_addresses,
            partition=args.partition,
            ordered=args.ordered,
            **options,
        )
        for topic in dict.fromkeys(args.topics)
    ]
    with signals:
        try:
            for consumer in consumers:
                consumer.start()
            error = run_until_stopped(signals.event, consumers)
        finally:
            printer.stop()
            for consumer in consumers:
                consumer.stop(timeout=10.0)
    if printer.broken_pipe:
        # Nothing more can be written; keep the interpreter's final flush from complaining.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    if error is not None:
        raise CLIError(error)
    return 0
