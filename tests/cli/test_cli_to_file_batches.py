"""``nsqclient to-file`` on the Consumer's pull API: each sync finishes its messages as one batch
(one ``finish_many``: one FIN write per connection), and only after they are durably in the file.

The gzip cases make "durably written" visible: each sync ends a gzip member, while the lines of
an open member sit in the compressor, inside the process.  A member that ends cleanly is on disk
(it was fsynced before any of its messages was finished); a SIGKILL loses what the compressor
held, so a message finished before its sync would be missing from the file and from nsqd.
"""

from __future__ import annotations

import threading
import zlib
from pathlib import Path
from typing import Any

from nsqclient import Consumer
from nsqclient.cli import to_file
from nsqclient.cli.main import build_parser
from nsqclient.message import Message
from nsqclient.testing.helpers import channel_stats, drained, publish
from nsqclient.testing.waiting import wait_for

TIMEOUT = 30.0
CHANNEL = "nsq_to_file"


def durable_lines(directory: Path) -> list[bytes]:
    """The lines of the complete gzip members of every file under ``directory`` (a member cut
    short, as a killed writer leaves it, is not durable and is left out)."""
    lines: list[bytes] = []
    for path in sorted(p for p in directory.rglob("*.gz") if p.is_file()):
        data = path.read_bytes()
        while data:
            member = zlib.decompressobj(wbits=31)
            text = member.decompress(data)
            if not member.eof:
                break  # the open member: not synced
            lines.extend(text.splitlines())
            data = member.unused_data
    return lines


class FinWatch:
    """An observer of the archiver's Consumer: records each answer, and at each FIN checks
    that every message it finishes is in a complete gzip member on disk already."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.finish_batches: list[int] = []
        self.taken_batches: list[int] = []
        self.other_answers: list[str] = []
        self.missing: list[bytes] = []
        self._lock = threading.Lock()

    def messages_taken(self, consumer: Any, messages: list[Message]) -> None:
        with self._lock:
            self.taken_batches.append(len(messages))

    def messages_answered(
        self, consumer: Any, messages: list[Message], action: str, delay: Any, backoff: Any
    ) -> None:
        if action != "finish":
            with self._lock:
                self.other_answers.append(action)
            return
        on_disk = set(durable_lines(self.directory))
        with self._lock:
            self.finish_batches.append(len(messages))
            self.missing.extend(m.body for m in messages if m.body not in on_disk)


def to_file_argv(node: Any, topic: str, out: Path, *extra: str) -> list[str]:
    return [
        "to-file", "--topic", topic, "--nsqd-tcp-address", node.tcp_address,
        "--output-dir", str(out), *extra,
    ]  # fmt: skip


def test_each_sync_finishes_its_messages_in_one_batch_after_the_gzip_member_is_on_disk(
    nsqd, tmp_path
):
    node = nsqd.nsqd
    topic = "tf_batch"
    total = 3000
    bodies = [b"batch-%05d" % i for i in range(total)]
    publish(node, topic, bodies)
    out = tmp_path / "out"
    args = build_parser().parse_args(
        to_file_argv(node, topic, out, "--gzip", "--max-in-flight", "200", "--sync-interval", "1s")
    )
    fmt = to_file.filename_format(args.filename_format, topic, "h", 1, True, True)
    failed = threading.Event()
    archiver = to_file.TopicArchiver(
        topic, args.channel, fmt, args, to_file.consumer_options(args), failed
    )
    watch = FinWatch(out)
    archiver.consumer.add_observer(watch)
    archiver.start()
    try:
        wait_for(
            lambda: archiver.finished >= total or failed.is_set(),
            TIMEOUT,
            message=lambda: f"finished {archiver.finished} of {total}; error {archiver.error}",
        )
        # nsqd's own count, from the connection that is still open: every message FINished once.
        stats = wait_for(lambda: drained(node, topic, CHANNEL), TIMEOUT)
        (client,) = stats["clients"]
        assert (client["finish_count"], client["requeue_count"]) == (total, 0)
    finally:
        archiver.begin_close()
        archiver.join(TIMEOUT)
        archiver.consumer.stop(timeout=10.0)
    assert archiver.error is None and not failed.is_set()
    assert watch.missing == []  # no message was finished before its member was on disk
    assert watch.other_answers == []
    # One finish_many a sync, holding what the sync made durable: far fewer FIN writes than
    # messages (with 200 in flight, a sync comes when 85% of the RDY is held).
    assert sum(watch.finish_batches) == total == archiver.finished == archiver.written
    assert len(watch.finish_batches) == archiver.syncs
    assert len(watch.finish_batches) <= total // 50, watch.finish_batches
    assert max(watch.taken_batches) > 1  # take() hands over what arrived, not one at a time
    consumer_stats = archiver.consumer.stats()
    assert (consumer_stats["finished"], consumer_stats["requeued"]) == (total, 0)
    assert sorted(durable_lines(out)) == bodies


def test_sigkill_mid_run_loses_nothing_finished_and_leaves_the_rest_on_nsqd(nsqd, cli, tmp_path):
    node = nsqd.nsqd
    topic = "tf_kill_gz"
    total = 20000
    bodies = {b"k-%05d" % i for i in range(total)}
    publish(node, topic, sorted(bodies))
    out = tmp_path / "out"
    # msg_timeout 1s: what the killed run had in flight goes back to the channel a second later.
    run = cli.start(
        *to_file_argv(
            node, topic, out, "--gzip", "--max-in-flight", "50", "--sync-interval", "50ms",
            "--consumer-opt", "msg_timeout,1s",
        )
    )  # fmt: skip
    wait_for(
        lambda: len(durable_lines(out)) >= 1000 if out.exists() else False,
        TIMEOUT,
        message=lambda: run.stderr,
    )
    run.proc.kill()
    assert run.wait() == -9  # Popen.kill(): SIGKILL (every simulation is Linux underneath)
    durable = set(durable_lines(out))
    assert len(durable) < total, "the run finished before it was killed"

    # nsqd takes back what the killed run had in flight; what it finished is gone from nsqd.
    stats = wait_for(
        lambda: (s := channel_stats(node, topic, CHANNEL))
        and s["in_flight_count"] == 0 and s["deferred_count"] == 0 and s,
        TIMEOUT,
    )  # fmt: skip
    left = stats["depth"]
    assert 0 < left < total
    remaining = take_all(node, topic, left)
    assert len(remaining) == left
    # Every message is in the file or still on nsqd: so every message nsqd had FINished
    # (total - left of them) was in a complete, synced member of the file.
    assert bodies - durable <= remaining
    assert len(bodies - remaining) == total - left
    assert bodies - remaining <= durable
    # What the killed run wrote and had not finished comes back: at most its max-in-flight.
    assert len(durable & remaining) <= 50


def take_all(node: Any, topic: str, count: int) -> set[bytes]:
    """Take and FIN ``count`` messages of ``topic``/nsq_to_file (a pull-mode Consumer)."""
    consumer = Consumer(
        topic, CHANNEL, None, nsqd_tcp_addresses=node.tcp_address, max_in_flight=2500
    )
    got: list[Message] = []
    consumer.start()
    try:

        def more() -> bool:
            batch = consumer.take(timeout=0.5)
            consumer.finish_many(batch)
            got.extend(batch)
            return len(got) >= count

        wait_for(more, TIMEOUT, 0.0, message=lambda: f"took {len(got)} of {count}")
        wait_for(lambda: drained(node, topic, CHANNEL), TIMEOUT)
    finally:
        consumer.stop(timeout=10.0)
    return {m.body for m in got}


def test_a_write_error_requeues_what_was_taken_and_exits_1(nsqd, cli, tmp_path):
    node = nsqd.nsqd
    topic = "tf_full"
    total = 300
    publish(node, topic, [b"f-%03d" % i for i in range(total)])
    out = tmp_path / "out"
    out.mkdir()
    (out / f"{topic}.log").symlink_to("/dev/full")  # every write: ENOSPC
    run = cli.start(*to_file_argv(node, topic, out, "--filename-format", "<TOPIC>.log"))
    assert run.wait() == 1, run.stderr
    assert "No space left on device" in run.stderr
    assert f"{topic}: wrote 0 messages (0 finished, " in run.stderr
    # Nothing finished, nothing lost: every message is back in the channel.
    stats = wait_for(
        lambda: drained(node, topic, CHANNEL, depth=total),
        TIMEOUT,
        message=lambda: f"{channel_stats(node, topic, CHANNEL)}",
    )
    assert stats["requeue_count"] >= 1
    assert stats["message_count"] == total
