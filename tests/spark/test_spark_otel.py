"""Telemetry of the source's reader in the Python process Spark starts for it: switched on by
the standard ``OTEL_*`` environment (nsqclient.otel.configure_from_env), nothing of
OpenTelemetry imported otherwise, and never in a process the user owns.

Each case runs a child process that drives ``NSQDataSource(options).streamReader(schema)`` the
way Spark's source process does (initialOffset, latestOffset, partitions, commit, stop; see
bench/spark_reader.py), against the session's broker (embedded or real nsqd).  Spark runs that
process as ``python -m pyspark.sql.streaming.python_streaming_source_runner``, which leaves
that module's spec in ``__main__.__spec__``, where the source looks
(nsqclient.spark.source.in_spark_source_runner): the child puts the same spec there, and ends
as Spark 4.3 ends that process, with SIGTERM (which runs no atexit hook: the reader flushes
the telemetry itself).  The SDK's console exporters write the spans and metrics to the child's
stderr, read back here."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import channel_stats, publish_numbered

from nsqclient.testing.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent.parent

#: argv: nsqd address, topic, messages, "spark" (Spark's source process) or "user" (a process
#: of the user's).  Prints one JSON line on stdout.
READER = textwrap.dedent(
    """
    import importlib.util, json, os, pickle, signal, sys, threading

    address, topic, count, where = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    if where == "spark":
        from nsqclient.spark.source import SPARK_SOURCE_RUNNER
        sys.modules["__main__"].__spec__ = importlib.util.find_spec(SPARK_SOURCE_RUNNER)

    from pyspark.sql.streaming.datasource import ReadAllAvailable
    from nsqclient.spark import SCHEMA_DDL, NSQDataSource
    from nsqclient.spark.source import in_spark_source_runner

    assert in_spark_source_runner() == (where == "spark")
    imported_before = "opentelemetry" in sys.modules
    source = NSQDataSource(
        {"topic": topic, "channel": "spark", "nsqd_tcp_addresses": address, "max_in_flight": "40"}
    )
    reader = source.streamReader(SCHEMA_DDL)
    start = reader.initialOffset()
    rows = batches = 0
    while rows < count:
        end = reader.latestOffset(start, ReadAllAvailable())
        if end == start:
            continue
        parts = [pickle.loads(pickle.dumps(p)) for p in reader.partitions(start, end)]
        rows += sum(p.count for p in parts)
        batches += 1
        start = end
    reader.commit(start)
    print(json.dumps({
        "rows": rows,
        "batches": batches,
        "imported_before": imported_before,
        "imported_after": "opentelemetry" in sys.modules,
    }), flush=True)
    if where == "spark":
        # Spark ends its source process with SIGTERM (no atexit hook runs): the reader's
        # handler stops it, then the process dies of the signal.
        os.kill(os.getpid(), signal.SIGTERM)
        threading.Event().wait(60)
        sys.exit("still alive 60 s after SIGTERM")
    reader.stop()
    """
)

CONSOLE = {"OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "console"}


def run_reader(address: str, topic: str, count: int, where: str, otel: dict[str, str]) -> Any:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    proc = subprocess.run(
        [sys.executable, "-c", READER, address, topic, str(count), where],
        env={**clean, **otel},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    expected = -signal.SIGTERM if where == "spark" else 0
    assert proc.returncode == expected, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["rows"] == count
    return result, proc.stderr


def json_objects(text: str) -> list[dict[str, Any]]:
    """The JSON objects printed one after another in ``text`` (the console exporters')."""
    decoder = json.JSONDecoder()
    found, i = [], 0
    while (start := text.find("{", i)) >= 0:
        try:
            value, i = decoder.raw_decode(text, start)
        except ValueError:
            i = start + 1
            continue
        if isinstance(value, dict):
            found.append(value)
    return found


def wait_all_finished(node: Any, topic: str) -> None:
    def finished() -> bool:
        stats = channel_stats(node, topic, "spark")
        return stats is not None and stats["depth"] == 0 and stats["in_flight_count"] == 0

    wait_for(finished, timeout=10, message=lambda: f"{channel_stats(node, topic, 'spark')}")


@pytest.mark.timeout(180)
def test_otel_environment_instruments_the_reader_in_sparks_source_process(nsqd: Any) -> None:
    pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is not installed")
    pytest.importorskip("opentelemetry.instrumentation", reason="nsqclient[otel] is not installed")
    node = nsqd.nsqd
    publish_numbered(node.tcp_address, "otel_spark", 200)
    result, stderr = run_reader(node.tcp_address, "otel_spark", 200, "spark", CONSOLE)
    assert not result["imported_before"]
    wait_all_finished(node, "otel_spark")
    found = json_objects(stderr)

    # The pull-mode batches' receive spans: one per take, 200 messages in all.
    receives = [o for o in found if o.get("name") == "receive otel_spark" and "attributes" in o]
    assert receives, stderr[-3000:]
    for span in receives:
        assert span["kind"] == "SpanKind.CONSUMER"
        assert span["attributes"]["messaging.operation.type"] == "receive"
        assert span["attributes"]["messaging.consumer.group.name"] == "spark"
        assert span["resource"]["attributes"]["service.name"] == "nsqclient-spark-source"
    assert sum(s["attributes"]["messaging.batch.message_count"] for s in receives) == 200

    # messaging.client.consumed.messages, cumulative: its last export counts every message.
    consumed = [
        metric
        for export in found
        for resource in export.get("resource_metrics", [])
        for scope in resource["scope_metrics"]
        for metric in scope["metrics"]
        if metric["name"] == "messaging.client.consumed.messages"
    ]
    assert consumed, stderr[-3000:]
    points = consumed[-1]["data"]["data_points"]
    assert {p["attributes"]["messaging.destination.name"] for p in points} == {"otel_spark"}
    assert sum(p["value"] for p in points) == 200


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("where", "otel"),
    [("spark", {}), ("spark", {"OTEL_SDK_DISABLED": "true", **CONSOLE}), ("user", CONSOLE)],
    ids=["spark-no-otel-env", "spark-sdk-disabled", "user-process"],
)
def test_no_telemetry_unless_the_environment_asks_in_sparks_process(
    nsqd: Any, where: str, otel: dict[str, str]
) -> None:
    # No OTEL_* exporter (or the SDK disabled): nothing of OpenTelemetry is imported.  In a
    # process of the user's, OTEL_* is the user's business: the reader sets nothing up there.
    node = nsqd.nsqd
    topic = f"otel_off_{where}_{len(otel)}"
    publish_numbered(node.tcp_address, topic, 30)
    result, stderr = run_reader(node.tcp_address, topic, 30, where, otel)
    assert not result["imported_after"]
    assert not [o for o in json_objects(stderr) if "resource_metrics" in o or "context" in o]
    wait_all_finished(node, topic)
