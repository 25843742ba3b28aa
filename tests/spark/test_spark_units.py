"""The Spark data source's pure parts: options, the ledger, rows, MPUB chunking (no Spark)."""

from __future__ import annotations

import os
import stat
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from nsqclient.spark.ledger import Ledger
from nsqclient.spark.options import SinkOptions, SourceOptions, parse_config_value
from nsqclient.spark.rows import message_id_text, signed64

pa = pytest.importorskip("pyarrow")


# ---------------------------------------------------------------------------------- options


def source(**extra: str) -> SourceOptions:
    options = {"topic": "clicks", "channel": "spark", "nsqd_tcp_addresses": "127.0.0.1:4150"}
    options.update(extra)
    return SourceOptions.parse(options)


def test_source_options_defaults_and_addresses() -> None:
    opts = source(nsqd_tcp_addresses=" 127.0.0.1:4150, 127.0.0.1:4152 ")
    assert opts.nsqd_tcp_addresses == ["127.0.0.1:4150", "127.0.0.1:4152"]
    assert opts.lookupd_http_addresses == []
    assert opts.max_messages_per_batch is None
    assert opts.num_partitions == 1
    # The source's own defaults: a deep max_in_flight, and never give a message up.
    assert opts.consumer_options == {"max_in_flight": 5000, "max_tries": 0}


def test_source_options_are_case_insensitive_and_typed() -> None:
    # Spark lower-cases option keys; values are always strings.
    opts = source(
        maxmessagesperbatch="100",
        NUMPARTITIONS="3",
        max_in_flight="20",
        tls_v1="true",
        tls_verify="no",
        msg_timeout="2.5",
        auth_secret="s3cret",
        tls_ca_file="none",
    )
    assert opts.max_messages_per_batch == 100
    assert opts.num_partitions == 3
    assert opts.consumer_options == {
        "max_in_flight": 20,
        "max_tries": 0,
        "tls_v1": True,
        "tls_verify": False,
        "msg_timeout": 2.5,
        "auth_secret": "s3cret",
        "tls_ca_file": None,
    }


def test_source_options_ignore_what_spark_adds() -> None:
    assert source(checkpointlocation="/tmp/x", path="ignored").topic == "clicks"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_in_flite": "5"}, "did you mean 'max_in_flight'"),
        ({"maxMessagesPerBatch": "0"}, "maxMessagesPerBatch must be >= 1"),
        ({"maxMessagesPerBatch": "many"}, "maxMessagesPerBatch must be an integer"),
        ({"max_in_flight": "-1"}, "max_in_flight must be >= 0"),
        ({"max_in_flight": "0"}, "max_in_flight must be >= 1"),
        ({"tls_v1": "maybe"}, "not a boolean"),
        ({"topic": "bad topic!"}, "topic"),
        ({"topic": ""}, "needs the 'topic' option"),
        ({"nsqd_tcp_addresses": ""}, "needs 'nsqd_tcp_addresses' or 'lookupd_http_addresses'"),
        # the Consumer's rule (nsqclient.addresses): an empty item is an error, not skipped
        ({"nsqd_tcp_addresses": "127.0.0.1:4150,"}, "nsqd_tcp_addresses: empty address"),
        ({"lookupd_http_addresses": "127.0.0.1"}, "lookupd_http_addresses: .* a port is required"),
        ({"availableNowIdleTimeout": "0"}, "availableNowIdleTimeout must be > 0"),
    ],
)
def test_source_options_refuse_bad_values(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        source(**options)


def test_source_needs_a_channel() -> None:
    with pytest.raises(ValueError, match="'channel'"):
        SourceOptions.parse({"topic": "t", "nsqd_tcp_addresses": "127.0.0.1:4150"})


def test_sink_options() -> None:
    opts = SinkOptions.parse(
        {
            "topic": "out",
            "lookupd_http_addresses": "http://127.0.0.1:4161",
            "maxmessagespermpub": "10",
            "pub_timeout": "3",
            "checkpointLocation": "/tmp/ck",
        }
    )
    assert opts.lookupd_http_addresses == ["http://127.0.0.1:4161"]
    assert opts.max_messages_per_mpub == 10
    assert opts.max_bytes_per_mpub == 4 * 1024 * 1024
    assert opts.producer_options == {"pub_timeout": 3.0}
    with pytest.raises(ValueError, match="did you mean 'maxMessagesPerMpub'"):
        SinkOptions.parse({"topic": "out", "nsqd_tcp_addresses": "h:1", "maxMessagesPerMpb": "1"})


def test_parse_config_value() -> None:
    assert parse_config_value("max_in_flight", " 7 ") == 7
    assert parse_config_value("snappy", "ON") is True
    assert parse_config_value("dial_timeout", "0.5") == 0.5
    assert parse_config_value("client_id", "") is None
    with pytest.raises(ValueError, match="option max_in_flight"):
        parse_config_value("max_in_flight", "1.5")
    with pytest.raises(ValueError, match="unknown option"):
        parse_config_value("nope", "1")


# ---------------------------------------------------------------------------------- ledger


class FakeBatch:
    """What the ledger needs of a MessageBatch: its messages (numbers here), a split."""

    def __init__(self, items: list[int], address: str = "a:1", received_at: float = 0.0):
        self.items = items
        self.nsqd_address = address
        self.received_at = received_at
        self.touched_at: float | None = None
        self.split_count = 0

    def __len__(self) -> int:
        return len(self.items)

    def split(self, index: int) -> tuple[FakeBatch, FakeBatch]:
        self.split_count += 1
        assert self.split_count == 1, "a batch is split once"
        head = FakeBatch(self.items[:index], self.nsqd_address, self.received_at)
        return head, FakeBatch(self.items[index:], self.nsqd_address, self.received_at)


def numbers(batches: list[FakeBatch]) -> list[int]:
    return [n for batch in batches for n in batch.items]


def ledger_with(count: int, session: str = "s1", per: int = 3) -> Ledger:
    """``count`` messages numbered 0.. in batches of ``per``."""
    ledger = Ledger(session)
    for i in range(0, count, per):
        items = list(range(i, min(i + per, count)))
        assert ledger.add_many([FakeBatch(items)]) == items[-1] + 1
    return ledger


def test_ledger_cuts_batches_by_limit_and_serves_ranges() -> None:
    ledger = ledger_with(10)
    start = {"session": "s1", "seq": 0}
    end = ledger.latest(start, 4)  # inside the second batch: it is split there
    assert end == {"session": "s1", "seq": 4}
    assert numbers(ledger.slice(start, end)) == [0, 1, 2, 3]
    # Asked twice (Spark may plan a batch again): the same rows.
    assert numbers(ledger.slice(start, end)) == [0, 1, 2, 3]
    end2 = ledger.latest(end, None)
    assert end2 == {"session": "s1", "seq": 10}
    assert numbers(ledger.slice(end, end2)) == list(range(4, 10))
    # Nothing after the end: the start comes back unchanged (Spark plans no batch).
    assert ledger.latest(end2, None) == end2
    assert len(ledger) == 10


def test_ledger_releases_committed_prefix_only() -> None:
    ledger = ledger_with(6)
    released = ledger.release_through(4)  # splits the batch [3, 4, 5]
    assert numbers(released) == [0, 1, 2, 3]
    assert len(ledger) == 2
    assert ledger.release_through(4) == []
    # A batch starting at the committed offset starts after it.
    start = {"session": "s1", "seq": 4}
    assert ledger.available(start) == 2
    assert numbers(ledger.slice(start, ledger.latest(start, None))) == [4, 5]
    ledger.add_many([FakeBatch([6])])
    assert ledger.last_seq == 7
    assert numbers(ledger.release_all()) == [4, 5, 6]
    assert len(ledger) == 0
    assert ledger.add_many([FakeBatch([7]), FakeBatch([])]) == 8


def test_ledger_offsets_of_an_earlier_run() -> None:
    ledger = ledger_with(3, session="new")
    old_start = {"session": "old", "seq": 40}
    old_end = {"session": "old", "seq": 50}
    # Re-running the old run's last batch: its messages are not here (nsqd redelivers them).
    assert ledger.slice(old_start, old_end) == []
    assert ledger.seq_of(old_end) is None
    # A batch from the old run's end takes everything this run holds.
    end = ledger.latest(old_end, None)
    assert end == {"session": "new", "seq": 3}
    assert numbers(ledger.slice(old_end, end)) == [0, 1, 2]
    # And with nothing held, the old offset is returned as it is.
    empty = Ledger("new")
    assert empty.latest(old_end, None) == old_end


def test_ledger_seq_of_rejects_malformed_offsets() -> None:
    ledger = Ledger("s")
    assert ledger.seq_of({"session": "s", "seq": 3}) == 3
    assert ledger.seq_of({"session": "s", "seq": True}) is None
    assert ledger.seq_of({"session": "s"}) is None
    assert ledger.seq_of(None) is None


def test_ledger_due_for_touch() -> None:
    ledger = Ledger("s")
    old = FakeBatch([0], "a:1", received_at=100.0)
    touched = FakeBatch([1], "a:1", received_at=100.0)
    touched.touched_at = 125.0
    other = FakeBatch([2, 3], "b:2", received_at=100.0)
    ledger.add_many([old, touched, other])
    # a:1 has msg_timeout 50 s (touch after 25 s); b:2 is unknown: the default of 60 s.
    due = ledger.due_for_touch(126.0, {"a:1": 50.0}, 60.0)
    assert due == [old]
    assert ledger.due_for_touch(131.0, {"a:1": 50.0}, 60.0) == [old, other]


def wait_args(**overrides: object) -> dict[str, object]:
    args: dict[str, object] = {
        "deadline": time.monotonic() + 30.0,
        "gap": 30.0,
        "empty_wait": 0.0,
        "full": lambda: False,
        "stop": threading.Event(),
        "poll": 0.005,
    }
    args.update(overrides)
    return args


def test_ledger_add_many_numbers_in_order() -> None:
    ledger = Ledger("s")
    assert ledger.add_many([FakeBatch([0, 1]), FakeBatch([2])]) == 3
    assert ledger.add_many([FakeBatch([3])]) == 4
    start = {"session": "s", "seq": 0}
    assert numbers(ledger.slice(start, ledger.latest(start, None))) == [0, 1, 2, 3]


def test_wait_for_batch_returns_when_the_limit_is_held() -> None:
    ledger = Ledger("s")
    start = {"session": "s", "seq": 0}
    adder = threading.Thread(target=lambda: [ledger.add_many([FakeBatch([i])]) for i in range(5)])
    adder.start()
    ledger.wait_for_batch(start, 5, **wait_args())  # type: ignore[arg-type]
    adder.join()
    assert ledger.available(start) == 5


def test_wait_for_batch_returns_when_nsqd_will_send_no_more() -> None:
    ledger = ledger_with(2)
    start = {"session": "s1", "seq": 0}
    saturated = threading.Event()
    threading.Thread(target=saturated.set).start()
    began = time.monotonic()
    ledger.wait_for_batch(start, None, **wait_args(full=saturated.is_set))  # type: ignore[arg-type]
    assert time.monotonic() - began < 10
    assert saturated.is_set()


def test_wait_for_batch_cuts_after_a_quiet_gap_and_at_the_deadline() -> None:
    ledger = ledger_with(2)
    start = {"session": "s1", "seq": 0}
    began = time.monotonic()
    ledger.wait_for_batch(start, None, **wait_args(gap=0.05))  # type: ignore[arg-type]
    assert 0.04 <= time.monotonic() - began < 10
    # A stream that keeps coming is cut at the deadline.
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(0.005):
            ledger.add_many([FakeBatch([0])])

    adder = threading.Thread(target=trickle)
    adder.start()
    try:
        began = time.monotonic()
        ledger.wait_for_batch(start, None, **wait_args(gap=5.0, deadline=began + 0.2))  # type: ignore[arg-type]
        assert 0.19 <= time.monotonic() - began < 5
    finally:
        stop.set()
        adder.join()


def test_wait_for_batch_with_nothing_held() -> None:
    start = {"session": "q", "seq": 0}
    quiet = Ledger("q")
    began = time.monotonic()
    quiet.wait_for_batch(start, None, **wait_args(empty_wait=0.0))  # type: ignore[arg-type]
    quiet.wait_for_batch(start, None, **wait_args(empty_wait=0.05))  # type: ignore[arg-type]
    assert 0.04 <= time.monotonic() - began < 10
    # The first message ends the empty wait; a quiet gap after it ends the batch.
    adder = threading.Timer(0.05, lambda: quiet.add_many([FakeBatch([1])]))
    adder.start()
    quiet.wait_for_batch(start, None, **wait_args(empty_wait=30.0, gap=0.05))  # type: ignore[arg-type]
    adder.join()
    assert quiet.available(start) == 1
    stopped = threading.Event()
    stopped.set()
    quiet.wait_for_batch(start, 10, **wait_args(empty_wait=30.0, stop=stopped))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------- rows


def test_message_ids_and_trace_ids() -> None:
    assert message_id_text(b"0a1b2c3d4e5f6789") == "0a1b2c3d4e5f6789"
    raw = bytes(range(16))
    assert message_id_text(raw) == raw.hex()
    assert signed64(None) is None
    assert signed64(5) == 5
    assert signed64((1 << 64) - 1) == -1


class RowMessage:
    def __init__(self, body: bytes, **youzan: int):
        self.body = body
        self.id = b"0000000000000001"
        self.timestamp = 1_700_000_000_123_456_789
        self.attempts = 2
        self.nsqd_address = "127.0.0.1:4150"
        for name, value in youzan.items():
            setattr(self, name, value)


def test_record_batch_classic_and_youzan() -> None:
    from nsqclient.spark.rows import to_record_batch

    batch = to_record_batch(
        [RowMessage(b"a"), RowMessage(b"b", partition=3, offset=77, trace_id=(1 << 63) + 1)],
        "clicks",
    )
    rows = batch.to_pylist()
    assert [r["body"] for r in rows] == [b"a", b"b"]
    assert rows[0]["topic"] == "clicks"
    assert rows[0]["message_id"] == "0000000000000001"
    assert rows[0]["attempts"] == 2
    assert rows[0]["timestamp"].timestamp() == pytest.approx(1_700_000_000.123456)
    assert (rows[0]["partition"], rows[0]["offset"], rows[0]["trace_id"]) == (None, None, None)
    assert (rows[1]["partition"], rows[1]["offset"]) == (3, 77)
    assert rows[1]["trace_id"] == -(1 << 63) + 1


# ---------------------------------------------------------------------------------- sink


def test_mpub_chunks_by_count_and_bytes() -> None:
    from nsqclient.spark.sink import _chunks

    bodies = [b"x" * 10] * 7
    assert [len(c) for c in _chunks(iter(bodies), 3, 10_000)] == [3, 3, 1]
    # 14 bytes each with the size prefix: two fit in 30 bytes, three do not.
    assert [len(c) for c in _chunks(iter(bodies), 100, 30)] == [2, 2, 2, 1]
    # A body bigger than the byte limit still goes, alone (nsqd judges it).
    assert [len(c) for c in _chunks(iter([b"y" * 50, b"z"]), 100, 30)] == [1, 1]
    with pytest.raises(ValueError, match="null body"):
        list(_chunks(iter([b"a", None]), 10, 100))  # type: ignore[list-item]


def test_body_column() -> None:
    from nsqclient.spark.sink import body_column

    assert body_column(["key", "Body"]) == "Body"
    assert body_column(["value", "key"]) == "value"
    assert body_column(["body", "value"]) == "body"
    with pytest.raises(ValueError, match="'body' or 'value'"):
        body_column(["payload"])


def test_routing_columns_and_frame_checks() -> None:
    from nsqclient.spark.sink import check_frame, routing_columns

    assert routing_columns(["body", "Key", "PARTITION"]) == ("Key", "PARTITION")
    assert routing_columns(["value"]) == (None, None)
    direct = SinkOptions.parse({"topic": "out", "nsqd_tcp_addresses": "127.0.0.1:4150"})
    check_frame(["body", "partition"], direct)
    with pytest.raises(ValueError, match="needs the 'lookupd_http_addresses' option"):
        check_frame(["body", "key"], direct)
    looked_up = SinkOptions.parse({"topic": "out", "lookupd_http_addresses": "127.0.0.1:4161"})
    check_frame(["body", "key"], looked_up)
    with pytest.raises(ValueError, match="'body' or 'value'"):
        check_frame(["key"], looked_up)


def test_partitioned_chunks_keep_each_partitions_order() -> None:
    from nsqclient.spark.sink import _partitioned_chunks

    rows = [(i % 3 if i % 4 else None, f"m{i}".encode()) for i in range(20)]
    chunks = list(_partitioned_chunks(iter(rows), 3, 10_000))
    assert all(len(chunk) <= 3 for _, chunk in chunks)
    for partition in (None, 0, 1, 2):
        sent = [body for p, chunk in chunks if p == partition for body in chunk]
        assert sent == [body for p, body in rows if p == partition]
    with pytest.raises(ValueError, match="null body"):
        list(_partitioned_chunks(iter([(1, None)]), 3, 100))  # type: ignore[list-item]


# ---------------------------------------------------------------------------------- preflight


def python_without_site_packages(tmp_path: Any) -> str:
    """An interpreter like Spark's python3 on a machine where nsqclient's dependencies are
    not installed: this Python without its site-packages, nsqclient's sources on its path."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = tmp_path / "python-bare"
    script.write_text(f'#!/bin/sh\nPYTHONPATH={root} exec {sys.executable} -S "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_register_names_pyspark_python_when_spark_python_lacks_dependencies(
    tmp_path: Any, monkeypatch: Any
) -> None:
    pytest.importorskip("pyspark")
    import nsqclient.spark
    from nsqclient.spark.preflight import check_worker_python

    bare = python_without_site_packages(tmp_path)
    monkeypatch.setenv("PYSPARK_PYTHON", bare)
    registered: list[Any] = []
    spark = SimpleNamespace(
        sparkContext=SimpleNamespace(pythonExec=bare),
        dataSource=SimpleNamespace(register=registered.append),
    )
    with pytest.raises(nsqclient.spark.WorkerPythonError) as failure:
        nsqclient.spark.register(spark)
    text = str(failure.value)
    assert "PYSPARK_PYTHON" in text and bare in text
    assert "No module named" in text  # what that Python lacks (snappy, here)
    assert f"PYSPARK_PYTHON={sys.executable}" in text
    assert registered == []
    # This interpreter (the normal case) passes at no cost; so does skipping the check.
    check_worker_python(sys.executable)
    nsqclient.spark.register(spark, check_python=False)
    assert registered == [nsqclient.spark.NSQDataSource]
    missing = str(tmp_path / "no-such-python")
    with pytest.raises(nsqclient.spark.WorkerPythonError, match="cannot be started"):
        check_worker_python(missing)


def test_the_gc_is_relaxed_only_in_sparks_source_process(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    from nsqclient.spark import source

    assert not source.in_spark_source_runner()  # pytest's process is the user's: untouched
    runner = SimpleNamespace(__spec__=SimpleNamespace(name=source.SPARK_SOURCE_RUNNER))
    monkeypatch.setitem(sys.modules, "__main__", runner)
    assert source.in_spark_source_runner()

    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        assert source.relax_gc() == (700, 10, 10)
        assert gc.get_threshold() == source.READER_GC_THRESHOLD
        # Thresholds someone set higher already are kept.
        gc.set_threshold(80_000, 5, 500)
        source.relax_gc()
        assert gc.get_threshold() == (80_000, 20, 500)
    finally:
        gc.set_threshold(*saved)
