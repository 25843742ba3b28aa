"""``nsqclient pub``: publish lines of stdin or a file to a topic (like Go's ``to_nsq``).

The input is split on ``--delimiter`` (a newline by default); the delimiter is not part of
the message and empty records are skipped (nsqd refuses empty bodies).  Records read together
are sent as one MPUB of up to ``--batch-size`` messages, so a pipe is published in large
batches while a line typed on a terminal goes out at once.  As with ``to_nsq``, every message
goes to each ``--nsqd-tcp-address``.  The first publish that fails stops the tool (exit 1).
A summary goes to stderr at the end.
"""

from __future__ import annotations

import argparse
import codecs
import logging
import os
import queue
import select
import signal
import stat
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from ..errors import NSQError
from ..otel import configure_from_env
from ..producer import Producer
from .common import (
    CLIError,
    StopSignals,
    UsageError,
    add_count_flag,
    add_lookupd_flag,
    add_nsqd_tcp_flag,
    client_options,
    finish_command,
    non_negative_int,
    setup_logging,
    topic_name,
    user_agent,
)

__all__ = [
    "add_parser",
    "run",
    "parse_delimiter",
    "split_records",
    "batches",
    "Pacer",
    "Summary",
    "count_rest",
]

logger = logging.getLogger("nsqclient.cli.pub")

#: Bytes of message bodies in one MPUB at most (nsqd refuses an MPUB over --max-body-size,
#: 5 MiB by default; a single message over --max-msg-size, 1 MiB by default, fails anyway).
MAX_BATCH_BYTES = 1024 * 1024
_READ_SIZE = 64 * 1024
#: Seconds a read of what the input already holds waits for the reader thread (no select()).
_HELD_GRACE = 0.2
#: Bytes of a pipe's rest read at most, without waiting, to count the messages not sent after
#: a failure or a signal (a pipe's writer may never stop: ``yes | nsqclient pub``).
_PEEK_BYTES = 1024 * 1024


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "pub",
        help="publish lines of stdin or a file to a topic",
        description="Publish stdin (or FILE), one message per line, to a topic.",
    )
    p.add_argument("file", nargs="?", default="-", help="file to read (default: stdin)")
    p.add_argument("--topic", type=topic_name, required=True, help="NSQ topic to publish to")
    add_nsqd_tcp_flag(p, "destination nsqd TCP address, each message goes to every one")
    add_lookupd_flag(
        p,
        "nsqlookupd HTTP address to learn where the topic is written (youzan:"
        " each partition's leader)",
    )
    p.add_argument(
        "--partition",
        type=non_negative_int,
        default=None,
        metavar="N",
        help="youzan: publish to this partition",
    )
    p.add_argument(
        "--key",
        default=None,
        help="youzan: publish every message with this sharding key (all to one partition;"
        " needs --lookupd-http-address)",
    )
    p.add_argument(
        "--delimiter",
        default="\n",
        help="the single byte that ends a message (default: newline); escapes such as \\t, "
        "\\0 or \\x1e are understood",
    )
    add_count_flag(
        p,
        "--rate",
        default=0,
        kind=non_negative_int,
        help="publish at most N messages a second; 0: as fast as possible (default)",
    )
    add_count_flag(
        p,
        "--batch-size",
        default=200,
        help="messages in one MPUB at most; 1 publishes each with PUB (default: 200)",
    )
    return finish_command(p, "pub", run, "Producer")


def parse_delimiter(text: str) -> bytes:
    """The delimiter byte from a one-character string or an escape (``\\t``, ``\\0``,
    ``\\x1e``).  Raises UsageError for anything that is not exactly one byte."""
    value = text
    if len(text) > 1 and text.startswith("\\"):
        try:
            value = codecs.decode(text, "unicode_escape")
        except UnicodeDecodeError:
            value = text
    if len(value) != 1 or ord(value) > 255:
        raise UsageError(f"--delimiter must be a single byte, not {text!r}")
    return value.encode("latin-1")


def split_records(chunks: Iterator[bytes], delimiter: bytes) -> Iterator[list[bytes]]:
    """The records of a stream of chunks, in lists of those completed by each chunk (the
    last record may lack its delimiter).  Empty records are kept (the caller counts them)."""
    pending = bytearray()
    for chunk in chunks:
        pending.extend(chunk)
        end = pending.rfind(delimiter)
        if end < 0:
            continue
        complete = bytes(pending[:end])
        del pending[: end + 1]
        yield complete.split(delimiter)
    if pending:
        yield [bytes(pending)]


def batches(
    records: list[bytes], size: int, max_bytes: int = MAX_BATCH_BYTES
) -> Iterator[list[bytes]]:
    """``records`` cut into lists of at most ``size`` records and ``max_bytes`` of bodies
    (a single larger record makes a list by itself)."""
    batch: list[bytes] = []
    total = 0
    for record in records:
        if batch and (len(batch) >= size or total + len(record) > max_bytes):
            yield batch
            batch, total = [], 0
        batch.append(record)
        total += len(record)
    if batch:
        yield batch


class Pacer:
    """Holds publishing to ``rate`` messages a second: message number i (from 0) is not sent
    before ``start + i / rate``.  ``rate`` 0 never waits."""

    def __init__(self, rate: int, stop: threading.Event, clock: Any = time.monotonic):
        self.rate = rate
        self.stop = stop
        self.clock = clock
        self.start = clock()

    def batch_limit(self, batch_size: int) -> int:
        """Messages per batch so that batches go out at least ten times a second."""
        if not self.rate:
            return batch_size
        return max(1, min(batch_size, self.rate // 10))

    def wait(self, sent: int) -> bool:
        """Wait until message number ``sent`` may go; False when stopped meanwhile."""
        if not self.rate:
            return not self.stop.is_set()
        due = self.start + sent / self.rate
        delay = due - self.clock()
        if delay > 0:
            return not self.stop.wait(delay)
        return not self.stop.is_set()


class _Input:
    """The chunks of ``fd``: read until its end or ``stop`` (checked at least twice a second
    while the input is idle), or after :meth:`no_wait` only what is there already.
    ``ended`` tells whether the end of the input was read.

    A regular file is read as it is; other input is waited on with ``select()`` where the
    platform can select it, else (a pipe or a console on Windows) read by a thread of its own
    that hands chunks over, so that a signal is still seen while the input is idle."""

    def __init__(self, fd: int, stop: threading.Event):
        self.fd = fd
        self.stop = stop
        self.ended = False
        #: bytes still to read without waiting (None: wait for more)
        self._budget: int | None = None
        self._chunks: queue.Queue[bytes | BaseException] | None = None
        self._regular = _is_regular_file(fd)

    def no_wait(self, limit: int) -> None:
        """From now on read only what the input already holds, up to ``limit`` bytes, and
        stop there (even after ``stop``): a pipe whose writer is still there is left alone."""
        self._budget = limit

    def chunks(self) -> Iterator[bytes]:
        while True:
            budget = self._budget
            if budget is None and self.stop.is_set():
                return
            if budget is not None and budget <= 0:
                return
            chunk = self._next(0.5 if budget is None else 0.0)
            if chunk is None:
                if budget is None:
                    continue
                return
            if not chunk:
                self.ended = True
                return
            if self._budget is not None:
                self._budget -= len(chunk)
            yield chunk

    def _next(self, wait: float) -> bytes | None:
        """The next chunk, ``b""`` at the end, or None when nothing came within ``wait``
        seconds."""
        if self._chunks is not None:
            return self._from_thread(wait)
        if not self._regular:
            try:
                ready, _, _ = select.select([self.fd], [], [], wait)
            except (OSError, ValueError):
                # Not selectable here (Windows selects sockets only): a thread reads instead.
                self._chunks = _start_reader_thread(self.fd)
                return self._from_thread(wait)
            if not ready:
                return None
        return os.read(self.fd, _READ_SIZE)

    def _from_thread(self, wait: float) -> bytes | None:
        assert self._chunks is not None
        try:
            # What the input already holds reaches the thread's hands within microseconds;
            # a short grace tells that from an idle input without a way to peek into it.
            item = self._chunks.get(timeout=max(wait, _HELD_GRACE))
        except queue.Empty:
            return None
        if isinstance(item, BaseException):
            raise item
        return item


def _start_reader_thread(fd: int) -> queue.Queue[bytes | BaseException]:
    """Read ``fd`` to its end on a daemon thread, a few chunks ahead at most; the end is
    ``b""``, a read error the exception.  The thread cannot be joined while it waits for input
    (a blocking read cannot be interrupted portably): it ends with the input or the process."""
    chunks: queue.Queue[bytes | BaseException] = queue.Queue(maxsize=4)

    def read() -> None:
        while True:
            try:
                chunk = os.read(fd, _READ_SIZE)
            except OSError as exc:
                chunks.put(exc)
                return
            chunks.put(chunk)
            if not chunk:
                return

    threading.Thread(target=read, name="nsq-stdin", daemon=True).start()
    return chunks


class Summary:
    """What ``pub`` did, for the line it prints at the end."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self.clock = clock
        self.published = 0
        #: messages of the batch whose publish failed
        self.failed = 0
        self.skipped = 0
        #: messages never sent after the failed batch (or after a stop by a signal)
        self.after = 0
        #: whether ``after`` counts the input to its end (False: the rest was not read, the
        #: input had not ended)
        self.after_complete = True
        self.started = clock()
        self.error: str | None = None

    @property
    def not_sent(self) -> int:
        """Messages of the input that were not published: the failed batch and those after."""
        return self.failed + self.after

    def line(self, topic: str, nsqd_count: int, interrupted: str | None) -> str:
        elapsed = max(self.clock() - self.started, 1e-9)
        rate = self.published / elapsed
        text = (
            f"nsqclient pub: published {self.published} messages to {topic!r} "
            f"({nsqd_count} nsqd) in {elapsed:.2f}s, {rate:.0f} msgs/s; "
            f"failed {self.failed}, empty skipped {self.skipped}"
        )
        if not (self.error or interrupted):
            return text
        at_least = "" if self.after_complete else "at least "
        text += f"; not sent {at_least}{self.not_sent}"
        if self.error:
            text += f" (the failed batch of {self.failed} and {at_least}{self.after} after it)"
        if interrupted:
            text += f"; stopped by {interrupted} before the end of the input"
        if not self.after_complete:
            text += "; the rest of the input was not read"
        return text


def count_rest(records: Iterator[list[bytes]], stop: threading.Event) -> tuple[int, bool]:
    """The messages (non-empty records) left in ``records``, and whether that is all of them
    (False when ``stop`` was set before their end)."""
    count = 0
    for chunk in records:
        count += sum(1 for r in chunk if r)
    return count, not stop.is_set()


def _is_regular_file(fd: int) -> bool:
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        return False


def _publish(producers: list[Producer], topic: str, batch: list[bytes], **where: Any) -> str | None:
    """Publish ``batch`` to every producer (``where``: partition= or key=); the error text of
    the first failure, or None."""
    for producer in producers:
        try:
            if len(batch) == 1:
                producer.pub(topic, batch[0], **where)
            else:
                producer.mpub(topic, batch, **where)
        except (NSQError, OSError, ValueError) as exc:
            nsqd = ", ".join(str(s["address"]) for s in producer.stats()["nsqd"])
            return f"publishing to {nsqd or 'the nsqd lookupd names'} failed: {exc}"
    return None


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    configure_from_env(service_name="nsqclient-pub")  # OTEL_* environment, when the SDK is there
    if not args.nsqd_tcp_addresses and not args.lookupd_http_addresses:
        raise UsageError("--nsqd-tcp-address or --lookupd-http-address required")
    if args.key is not None and args.partition is not None:
        raise UsageError("--key chooses the partition: give --key or --partition, not both")
    if args.key is not None and (args.nsqd_tcp_addresses or not args.lookupd_http_addresses):
        raise UsageError("--key needs --lookupd-http-address (and no --nsqd-tcp-address)")
    where: dict[str, Any] = {}
    if args.key is not None:
        where["key"] = args.key
    if args.partition is not None:
        where["partition"] = args.partition
    delimiter = parse_delimiter(args.delimiter)
    options = client_options(args.client_options, "Producer", user_agent=user_agent("pub"))
    if args.file == "-":
        fd = sys.stdin.fileno()
        close_fd = False
    else:
        try:
            fd = os.open(args.file, os.O_RDONLY)
        except OSError as exc:
            raise CLIError(f"cannot read {args.file}: {exc.strerror}") from None
        close_fd = True

    addresses = list(dict.fromkeys(args.nsqd_tcp_addresses))
    producers = [Producer(address, **options) for address in addresses]
    if args.lookupd_http_addresses:
        producers.append(Producer(lookupd_http_addresses=args.lookupd_http_addresses, **options))
    summary = Summary()
    signals = StopSignals()
    try:
        with signals:
            pacer = Pacer(args.rate, signals.event)
            limit = pacer.batch_limit(args.batch_size)
            source = _Input(fd, signals.event)
            records_read = split_records(source.chunks(), delimiter)
            stopped_early = False  # by a failure or a signal, with messages read not sent
            for records in records_read:
                bodies = [r for r in records if r]
                summary.skipped += len(records) - len(bodies)
                done = 0
                for batch in batches(bodies, limit):
                    if not pacer.wait(summary.published):
                        break
                    error = _publish(producers, args.topic, batch, **where)
                    done += len(batch)
                    if error is not None:
                        summary.failed += len(batch)
                        summary.error = error
                        break
                    summary.published += len(batch)
                if summary.error or signals.event.is_set():
                    summary.after = len(bodies) - done
                    stopped_early = True
                    break
            if stopped_early:
                # What is left: a file is counted to its end after a failure; other input (a
                # pipe, a terminal) may never end, so only what it already holds is counted.
                # The summary says the rest was not read unless the input's end was.
                if not (summary.error and _is_regular_file(fd)):
                    source.no_wait(_PEEK_BYTES)
                rest, _ = count_rest(records_read, signals.event)
                summary.after += rest
                summary.after_complete = source.ended
    finally:
        for producer in producers:
            producer.close()
        if close_fd:
            os.close(fd)
    interrupted = signal.Signals(signals.signum).name if signals.signum else None
    if summary.error:
        print(f"nsqclient pub: error: {summary.error}", file=sys.stderr)
    print(summary.line(args.topic, len(producers), interrupted), file=sys.stderr)
    if summary.error:
        return 1
    if signals.signum:
        return 128 + signals.signum
    return 0
