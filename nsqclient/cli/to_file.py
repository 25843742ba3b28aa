"""``nsqclient to-file``: archive topics to files (like Go's ``nsq_to_file``).

Each message body is written to the topic's current file followed by a newline.  The consumer
runs in pull mode: one writer thread a topic takes what has arrived, writes it (one write(2) a
line, so that a killed process leaves whole lines), and finishes (FIN) the messages only after
the data is flushed and fsynced, all those of a sync at once (one FIN write per connection):
when ``--max-in-flight`` messages are waiting, when the consumer is starved (nsqd will send no
more until some are answered), when the oldest unsynced message is ``--sync-interval`` old,
before a rotation, and at exit.  A crash (even SIGKILL or a power cut) therefore loses
nothing: what was not synced was not finished, and nsqd delivers it again (possibly after having
been written: duplicates are possible, loss is not).  With ``--gzip`` each sync ends a gzip
member, so a file is a valid concatenation of members up to the last sync.

File names come from ``--filename-format`` (``<TOPIC>``, ``<HOST>``, ``<PID>``, ``<DATETIME>``,
``<REV>``), as with ``nsq_to_file``.  A file is rotated when ``<DATETIME>`` changes, after
``--rotate-interval``, or when it grows past ``--rotate-size`` bytes (with gzip, the bytes before
compression, as ``nsq_to_file`` counts them); ``<REV>`` (``-000000``,
``-000001``...) keeps names unique and is required with gzip, rotation or ``--work-dir``.
Without them the same file is appended to across restarts.  With ``--work-dir``, files are
written there and moved to ``--output-dir`` (same name, or the next free ``<REV>``) once closed,
so that the output directory only ever holds finished files.

The topics are the ``--topic`` given or, with ``--topic-pattern`` and no ``--topic``, those
nsqlookupd lists (see :mod:`.topic_discovery`).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import errno
import gzip
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO

from ..consumer import Consumer
from ..http import LookupdClient
from ..message import Message
from .common import (
    CLIError,
    StopSignals,
    TimeoutSession,
    UsageError,
    add_count_flag,
    add_http_timeout_flags,
    add_source_flags,
    check_reachable,
    check_sources,
    client_options,
    finish_command,
    non_negative_duration,
    parse_size,
    positive_duration,
    run_until_stopped,
    setup_logging,
    user_agent,
)
from .topic_discovery import TopicDiscoverer, topic_matcher

__all__ = [
    "add_parser",
    "run",
    "consumer_options",
    "filename_format",
    "OutputFile",
    "TopicArchiver",
]

logger = logging.getLogger("nsqclient.cli.to_file")

#: nsq_to_file's /tmp on POSIX; Windows has none, so its temporary directory there
_DEFAULT_OUTPUT_DIR = "/tmp" if os.name == "posix" else tempfile.gettempdir()

#: nsqd's default --msg-timeout, seconds
_NSQD_MSG_TIMEOUT = 60.0
#: longest wait of an idle writer for messages, seconds: how soon it sees begin_close() (a
#: take() cannot be woken early) and a file due for rotation
_CLOSE_POLL = 0.1


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "to-file",
        help="archive topics to files, finishing messages only once they are on disk",
        description="Write the messages of one or more topics to files in a directory, one "
        "message a line; a message is finished only after its line is fsynced.",
    )
    add_source_flags(p, "nsq_to_file", "NSQ channel (default: nsq_to_file)", topic_required=False)
    p.add_argument(
        "--topic-pattern",
        default=None,
        metavar="REGEX",
        help="archive only the topics this regular expression matches (searched anywhere in "
        "the name); without --topic, every matching topic nsqlookupd lists",
    )
    p.add_argument(
        "--topic-refresh",
        type=positive_duration,
        default=60.0,
        metavar="DURATION",
        help="without --topic: how often to ask nsqlookupd for new topics (default: 1m)",
    )
    p.add_argument(
        "--output-dir",
        default=_DEFAULT_OUTPUT_DIR,
        help=f"directory to write files to (default: {_DEFAULT_OUTPUT_DIR})",
    )
    p.add_argument(
        "--work-dir",
        default=None,
        metavar="DIR",
        help="directory for the files being written; each is moved to --output-dir once "
        "closed (default: --output-dir itself)",
    )
    p.add_argument(
        "--filename-format",
        default="<TOPIC>.<HOST><REV>.<DATETIME>.log",
        help="file name: <TOPIC>, <HOST>, <PID>, <DATETIME> and <REV> are replaced; may hold "
        "subdirectories (default: <TOPIC>.<HOST><REV>.<DATETIME>.log)",
    )
    p.add_argument(
        "--datetime-format",
        default="%Y-%m-%d_%H",
        help="strftime format of <DATETIME>, local time (default: %%Y-%%m-%%d_%%H)",
    )
    p.add_argument(
        "--host-identifier",
        default="",
        help="<HOST> in file names instead of the short host name; <SHORT_HOST> and "
        "<HOSTNAME> are replaced in it",
    )
    p.add_argument(
        "--rotate-interval",
        type=non_negative_duration,
        default=0.0,
        metavar="DURATION",
        help="start a new file this long after opening one (seconds or 1h, 15m...); 0: never",
    )
    p.add_argument(
        "--rotate-size",
        type=parse_size,
        default=0,
        metavar="BYTES",
        help="start a new file when the current one is bigger than this (bytes, or 100M...); "
        "0: never",
    )
    p.add_argument("--gzip", action="store_true", help="gzip the files (a .gz suffix is added)")
    p.add_argument(
        "--gzip-level",
        type=int,
        default=6,
        choices=range(1, 10),
        metavar="1-9",
        help="gzip compression level, 1 fastest to 9 smallest (default: 6)",
    )
    p.add_argument(
        "--sync-interval",
        type=positive_duration,
        default=30.0,
        metavar="DURATION",
        help="fsync and finish written messages at least this often (default: 30s); must be "
        "shorter than the msg_timeout",
    )
    add_count_flag(
        p,
        "--max-in-flight",
        default=200,
        help="messages received and not yet finished, at most (default: 200)",
    )
    add_http_timeout_flags(p, "nsqlookupd (listing topics)")
    return finish_command(p, "to-file", run, "Consumer")


def filename_format(
    fmt: str,
    topic: str,
    host: str,
    pid: int,
    gzip_on: bool,
    needs_rev: bool,
) -> str:
    """``fmt`` with ``<TOPIC>``, ``<HOST>``, ``<PID>`` replaced (``<DATETIME>`` and ``<REV>``
    stay for each file).  ``<REV>`` is required when ``needs_rev`` (gzip, rotation or a work
    directory) and removed otherwise; gzip adds ``.gz`` when missing."""
    if "<REV>" not in fmt and needs_rev:
        raise UsageError(
            "--filename-format needs <REV> when --gzip, rotation or --work-dir is used"
        )
    if not needs_rev:
        fmt = fmt.replace("<REV>", "")
    fmt = fmt.replace("<TOPIC>", topic).replace("<HOST>", host).replace("<PID>", str(pid))
    if gzip_on and not fmt.endswith(".gz"):
        fmt += ".gz"
    if os.path.isabs(fmt) or ".." in fmt.split("/"):
        raise UsageError(f"--filename-format must name a file inside --output-dir, not {fmt!r}")
    return fmt


def host_identifier(template: str) -> str:
    hostname = socket.gethostname()
    short = hostname.split(".")[0]
    if not template:
        return short
    return template.replace("<SHORT_HOST>", short).replace("<HOSTNAME>", hostname)


#: POSIX opens a directory read-only for fsync(); Windows has no O_DIRECTORY and refuses it.
_CAN_OPEN_DIRECTORIES = hasattr(os, "O_DIRECTORY")


def _fsync_dir(path: str) -> None:
    """Make a directory's new entries durable where the platform can (POSIX: fsync the
    directory).  Windows opens no directory as a file, and its file system journals names by
    itself: nothing to do there."""
    if not _CAN_OPEN_DIRECTORIES:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def move_exclusive(src: str, dst: str) -> None:
    """Move the closed file ``src`` to ``dst``, which must not exist (FileExistsError
    otherwise, and ``src`` stays): a hard link then an unlink, or, across file systems, a copy
    to a new ``dst`` (fsynced) then an unlink.  ``dst``'s directory is fsynced."""
    try:
        os.link(src, dst)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        try:
            with open(src, "rb") as source, open(dst, "xb") as target:
                shutil.copyfileobj(source, target, 1024 * 1024)
                target.flush()
                os.fsync(target.fileno())
        except FileExistsError:
            raise
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(dst)
            raise
    _fsync_dir(os.path.dirname(dst) or ".")
    os.unlink(src)


class OutputFile:
    """One open output file: buffered writes and :meth:`sync` (end the gzip member, flush,
    fsync).

    Args:
        path: the file.
        exclusive: create it (FileExistsError if it exists) rather than append to it.
        gzip_level: compress at this level; None: plain.
    """

    def __init__(self, path: str, exclusive: bool, gzip_level: int | None):
        self.path = path
        self.gzip_level = gzip_level
        # Unbuffered: each plain message is one write(2), so a killed process leaves whole
        # lines (a power cut may still cut the last one; see below).
        self._raw: BinaryIO = open(path, "xb" if exclusive else "ab", buffering=0)  # noqa: SIM115
        self._gz: gzip.GzipFile | None = None
        end = self._raw.seek(0, os.SEEK_END)
        #: the size at opening plus the (uncompressed) bytes written since, as nsq_to_file counts
        self.size = end
        if end and gzip_level is None:
            # A crash may have cut the last line; never glue the next one onto it.
            with open(path, "rb") as f:
                f.seek(end - 1)
                if f.read(1) != b"\n":
                    self._write_all(b"\n")

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = self._raw.write(view)
            if not written:
                raise OSError(f"cannot write to {self.path}")
            view = view[written:]

    def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.gzip_level is not None:
            if self._gz is None:
                self._gz = gzip.GzipFile(
                    filename="", fileobj=self._raw, mode="wb", compresslevel=self.gzip_level
                )
            self._gz.write(data)
        else:
            self._write_all(data)

    def write_lines(self, bodies: list[bytes]) -> None:
        """Write each of ``bodies`` followed by a newline: plain, one write(2) a line (so that
        a killed process leaves whole lines, as :meth:`write` of one line does); gzip, all of
        them through the compressor at once."""
        if self.gzip_level is None:
            for body in bodies:
                self.write(body + b"\n")
        else:
            self.write(b"\n".join([*bodies, b""]))

    def sync(self) -> None:
        """Make everything written so far durable."""
        if self._gz is not None:
            self._gz.close()  # ends the member; leaves the file open
            self._gz = None
        os.fsync(self._raw.fileno())

    def close(self) -> None:
        try:
            self.sync()
        finally:
            self._raw.close()


class TopicArchiver:
    """One topic's consumer (pull mode: no handler, no worker thread) and the thread that
    takes its messages, writes them to files, syncs and then finishes them.

    The writer thread takes what has arrived (:meth:`Consumer.take`) and writes it, and at
    each sync fsyncs the file and finishes every message written since the last one with one
    :meth:`Consumer.finish_many` (one FIN write per connection).
    After :meth:`begin_close` it writes what has already arrived, syncs, finishes, closes the
    file and ends; what arrives later is requeued by ``consumer.stop()``.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        fmt: str,
        args: argparse.Namespace,
        consumer_options: dict[str, Any],
        failed: threading.Event,
    ):
        self.topic = topic
        self.fmt = fmt
        self.output_dir = args.output_dir
        #: where files are written while open (moved to output_dir when closed)
        self.work_dir = args.work_dir or args.output_dir
        self.moves = not _same_dir(self.work_dir, self.output_dir)
        self.datetime_format = args.datetime_format
        self.rotate_interval = args.rotate_interval
        self.rotate_size = args.rotate_size
        self.gzip_level = args.gzip_level if args.gzip else None
        self.exclusive = bool(args.gzip or args.rotate_interval)
        self.sync_interval = args.sync_interval
        self.max_in_flight = args.max_in_flight
        self.failed = failed
        self.error: str | None = None
        self.written = 0
        #: messages finished (after their sync), and the syncs that finished some
        self.finished = 0
        self.syncs = 0
        #: messages this archiver requeued itself (after a write error); see :attr:`requeued`
        self._requeued = 0
        self.files: list[str] = []
        self.consumer = Consumer(
            topic,
            channel,
            None,  # pull mode: the writer thread takes the messages
            nsqd_tcp_addresses=args.nsqd_tcp_addresses,
            lookupd_http_addresses=args.lookupd_http_addresses,
            **consumer_options,
        )
        self._closing = threading.Event()
        self._file: OutputFile | None = None
        self._filename = ""
        self._rev = 0
        self._file_rev = 0
        self._opened_at = 0.0
        #: written to the current file, not synced (nor finished) yet, oldest first
        self._pending: list[Message] = []
        self._oldest_pending = 0.0
        #: the batch being written (its messages move to _pending as they are written)
        self._batch: list[Message] = []
        self._thread = threading.Thread(target=self._run, name=f"nsq-to-file-{topic}", daemon=True)

    @property
    def requeued(self) -> int:
        """Messages given back to nsqd: by this archiver after a write error, and, once the
        consumer has stopped, every requeue it counted (what arrived after :meth:`begin_close`
        included)."""
        if self.consumer.is_running:
            return self._requeued
        return max(self.consumer.stats()["requeued"], self._requeued)

    def start(self) -> None:
        self.consumer.start()  # first: the writer's take() refuses a Consumer not started
        self._thread.start()

    def begin_close(self) -> None:
        """Receive nothing more (RDY 0) and let the writer write what has arrived, sync,
        finish and close."""
        self.consumer.set_max_in_flight(0)
        self._closing.set()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.error("[%s] the writer did not finish within %.0fs", self.topic, timeout)

    # -- writer thread

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # an OSError (disk full...) or a bug: stop, lose nothing
            self.error = f"topic {self.topic}: writing {self._filename or 'a file'} failed: {exc}"
            logger.error("%s", self.error, exc_info=not isinstance(exc, OSError))
            self._fail()

    def _fail(self) -> None:
        """Requeue everything taken and not durably written, receive nothing more, and stop
        the tool (what was not taken is requeued by ``consumer.stop()``)."""
        self._closing.set()
        self.consumer.set_max_in_flight(0)
        unanswered = [
            m for m in dict.fromkeys([*self._pending, *self._batch]) if not m.has_responded()
        ]
        self._pending.clear()
        self._batch = []
        if unanswered:
            self._requeued += self.consumer.requeue_many(unanswered, delay=0, backoff=False)
        if self._file is not None:
            path = self._file.path
            try:
                self._close_file()
            except OSError as exc:
                logger.error("[%s] closing %s failed: %s", self.topic, path, exc)
            self._file = None
        self.failed.set()

    def _loop(self) -> None:
        consumer = self.consumer
        while True:
            closing = self._closing.is_set()
            now = time.monotonic()
            wait = 0.0 if closing else _CLOSE_POLL
            if self._pending:
                wait = min(wait, max(self._oldest_pending + self.sync_interval - now, 0.0))
            batch = consumer.take(timeout=wait)
            now = time.monotonic()
            if batch:
                self._batch = batch
                self._write(batch, now)
                self._batch = []
            if closing:
                # What had arrived when begin_close() was called is written now.
                self._sync()
                self._close_file()
                return
            if not batch and self._file is not None and self._needs_rotation(now):
                # Idle: close a file that is due for rotation; the next message opens one.
                self._sync()
                self._close_file()
            if self._pending and (
                len(self._pending) >= self.max_in_flight
                or now - self._oldest_pending >= self.sync_interval
                or consumer.is_starved()
            ):
                self._sync()

    def _write(self, batch: list[Message], now: float) -> None:
        """Write ``batch``, a line a message, rotating where a message finds the file due
        (before a rotation the file is synced and its messages finished)."""
        name = self._current_filename()
        chunk: list[bytes] = []
        start = 0  # the first message of batch in chunk
        size = 0  # the bytes in chunk
        for i, message in enumerate(batch):
            if self._file is None or self._due(name, now, self._file.size + size):
                if chunk:
                    self._write_chunk(chunk, batch[start:i], now)
                    chunk, size = [], 0
                self._sync()
                self._close_file()
                self._open_file(now, name)
                start = i
            body = message.body
            chunk.append(body)
            size += len(body) + 1
        if chunk:
            self._write_chunk(chunk, batch[start:], now)

    def _write_chunk(self, bodies: list[bytes], messages: list[Message], now: float) -> None:
        assert self._file is not None
        self._file.write_lines(bodies)
        self.written += len(messages)
        if not self._pending:
            self._oldest_pending = now
        self._pending.extend(messages)

    def _sync(self) -> None:
        """fsync the file, then finish the messages written to it (one FIN write per
        connection)."""
        if not self._pending:
            return
        assert self._file is not None
        self._file.sync()
        logger.debug(
            "[%s] synced %d messages to %s", self.topic, len(self._pending), self._file.path
        )
        pending, self._pending = self._pending, []
        self.finished += self.consumer.finish_many(pending)
        self.syncs += 1

    def _current_filename(self) -> str:
        stamp = datetime.datetime.now().strftime(self.datetime_format)
        return self.fmt.replace("<DATETIME>", stamp)

    def _due(self, name: str, now: float, size: int) -> bool:
        """Is the open file due for rotation (``name``: the file name now; ``size``: its size
        with what is about to be written before the next line)?"""
        if name != self._filename:
            return True
        if self.rotate_interval and now - self._opened_at >= self.rotate_interval:
            return True
        return bool(self.rotate_size and size > self.rotate_size)

    def _needs_rotation(self, now: float) -> bool:
        assert self._file is not None
        return self._due(self._current_filename(), now, self._file.size)

    def _open_file(self, now: float, name: str) -> None:
        if name != self._filename:
            self._rev = 0
        else:
            self._rev += 1
        self._filename = name
        while True:
            relative = name.replace("<REV>", f"-{self._rev:06d}")
            if self.moves and os.path.lexists(os.path.join(self.output_dir, relative)):
                self._rev += 1  # its name is taken where it would be moved to
                continue
            path = os.path.join(self.work_dir, relative)
            directory = os.path.dirname(path)
            os.makedirs(directory, exist_ok=True)
            existed = os.path.exists(path)
            try:
                out = OutputFile(path, self.exclusive, self.gzip_level)
            except FileExistsError:
                self._rev += 1
                continue
            if self.rotate_size and out.size > self.rotate_size:
                out.close()
                self._rev += 1
                continue
            break
        if not existed:
            _fsync_dir(directory)  # the new name itself must survive a crash
        logger.info("[%s] writing to %s", self.topic, path)
        self._file = out
        self._file_rev = self._rev
        self._opened_at = now
        if not self.moves and path not in self.files:
            self.files.append(path)

    def _close_file(self) -> None:
        if self._file is None:
            return
        file, self._file = self._file, None
        file.close()
        if self.moves:
            self._move_to_output(file.path)

    def _move_to_output(self, path: str) -> None:
        """Move the closed file ``path`` from the work directory to the output directory under
        the same name, or the next free <REV> when that one was taken meanwhile."""
        rev = self._file_rev
        while True:
            relative = self._filename.replace("<REV>", f"-{rev:06d}")
            target = os.path.join(self.output_dir, relative)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            try:
                move_exclusive(path, target)
            except FileExistsError:
                logger.warning("[%s] %s exists already: trying the next <REV>", self.topic, target)
                rev += 1
                continue
            break
        logger.info("[%s] moved %s to %s", self.topic, path, target)
        self.files.append(target)


def _same_dir(a: str, b: str) -> bool:
    return os.path.normpath(os.path.abspath(a)) == os.path.normpath(os.path.abspath(b))


def _writable_dir(flag: str, path: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise CLIError(f"cannot create {flag} {path}: {exc.strerror}") from None
    if not os.access(path, os.W_OK):
        raise CLIError(f"cannot write to {flag} {path}")


def _check_topic_flags(args: argparse.Namespace) -> None:
    """nsq_to_file's rules: --topic or --topic-pattern; without --topic the topics come from
    nsqlookupd."""
    if not args.topics and not args.topic_pattern:
        raise UsageError("--topic or --topic-pattern required")
    if not args.topics and not args.lookupd_http_addresses:
        raise UsageError(
            "--topic-pattern without --topic needs --lookupd-http-address (to list the topics)"
        )


def consumer_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options of each topic's Consumer: ``--consumer-opt`` and ``--max-in-flight``, with
    give-ups off (a message is never finished without being written)."""
    return client_options(
        args.client_options,
        "Consumer",
        max_in_flight=args.max_in_flight,
        max_tries=0,  # never finish a message without writing it
        user_agent=user_agent("to-file"),
    )


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    check_sources(args)
    _check_topic_flags(args)
    allowed = topic_matcher(args.topic_pattern)
    topics = [t for t in dict.fromkeys(args.topics) if allowed(t)]
    if args.topics and not topics:
        raise UsageError(f"no --topic matches --topic-pattern {args.topic_pattern!r}")
    for topic in dict.fromkeys(args.topics):
        if topic not in topics:
            logger.warning("skipping topic %s: it does not match --topic-pattern", topic)
    _writable_dir("--output-dir", args.output_dir)
    if args.work_dir:
        _writable_dir("--work-dir", args.work_dir)
    try:
        datetime.datetime.now().strftime(args.datetime_format)
    except ValueError as exc:
        raise UsageError(f"--datetime-format: {exc}") from None
    options = consumer_options(args)
    msg_timeout = options.get("msg_timeout") or _NSQD_MSG_TIMEOUT
    if args.sync_interval >= msg_timeout:
        raise UsageError(
            f"--sync-interval ({args.sync_interval:g}s) must be shorter than the msg_timeout "
            f"({msg_timeout:g}s), or nsqd redelivers messages waiting for their sync"
        )
    moves = bool(args.work_dir) and not _same_dir(args.work_dir, args.output_dir)
    needs_rev = bool(args.gzip or args.rotate_interval or args.rotate_size or moves)
    host = host_identifier(args.host_identifier)

    def fmt(topic: str) -> str:
        return filename_format(args.filename_format, topic, host, os.getpid(), args.gzip, needs_rev)

    for topic in topics or ["topic"]:
        fmt(topic)  # a bad --filename-format is a usage error now, not a log line later
    session = TimeoutSession(args.http_client_connect_timeout)
    try:
        check_reachable(args, options, topics[0] if topics else None, session)
        return _archive(args, topics, allowed, fmt, options, session)
    finally:
        session.close()


def _archive(
    args: argparse.Namespace,
    topics: list[str],
    allowed: Callable[[str], bool],
    fmt: Callable[[str], str],
    options: dict[str, Any],
    session: TimeoutSession,
) -> int:
    """Run the archivers of ``topics`` (or, without, of the topics discovered) until a signal
    or a failure; print a summary a topic; the exit status."""
    signals = StopSignals()

    def make(topic: str) -> TopicArchiver:
        return TopicArchiver(topic, args.channel, fmt(topic), args, options, signals.event)

    lookupds = []
    if not topics:
        timeout = args.http_client_request_timeout
        lookupds = [
            LookupdClient(a, timeout=timeout, session=session) for a in args.lookupd_http_addresses
        ]
    discoverer = TopicDiscoverer(make, allowed, lookupds, args.topic_refresh)
    with signals:
        try:
            discoverer.start(topics)
            stopped = run_until_stopped(signals.event, discoverer.consumers)
        finally:
            per_lookupd = args.http_client_connect_timeout + args.http_client_request_timeout
            archivers = discoverer.close(per_lookupd * max(len(lookupds), 1) + 1.0)
            for archiver in archivers:
                archiver.begin_close()
            for archiver in archivers:
                archiver.join(30.0)
            for archiver in archivers:
                archiver.consumer.stop(timeout=10.0)
    errors = [a.error for a in archivers if a.error]
    if stopped is not None:
        errors.append(stopped)
    if not archivers:
        print("nsqclient to-file: no topic matched --topic-pattern", file=sys.stderr)
    for archiver in archivers:
        print(
            f"nsqclient to-file: {archiver.topic}: wrote {archiver.written} messages "
            f"({archiver.finished} finished, {archiver.requeued} requeued) "
            f"to {len(archiver.files)} file(s) in {args.output_dir}",
            file=sys.stderr,
        )
    if errors:
        raise CLIError("; ".join(errors))
    return 0
