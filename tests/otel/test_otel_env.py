"""configure_from_env (what ``nsqclient tail`` and ``pub`` call) and examples/otel_console.py.

Both set up OpenTelemetry's global providers, which a process can do only once: each runs in a
subprocess of its own, against the broker of the session (embedded or real nsqd)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is not installed")
pytest.importorskip("opentelemetry.instrumentation", reason="nsqclient[otel] is not installed")

from nsqclient.otel import NSQInstrumentor, configure_from_env  # noqa: E402
from nsqclient.otel.env import exporter_names  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent.parent

#: a program publishing two messages after configure_from_env (argv: nsqd address, topic)
PUBLISHER = textwrap.dedent(
    """
    import sys
    from nsqclient import Producer
    from nsqclient.otel import configure_from_env

    print("configured" if configure_from_env(service_name="otel-env-test") else "not configured")
    with Producer(sys.argv[1]) as producer:
        producer.pub(sys.argv[2], b"one")
        producer.mpub(sys.argv[2], [b"two", b"three"])
    """
)


def run(code: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def json_objects(text: str) -> list[dict]:
    """The JSON objects printed one after another (the console exporters' output)."""
    decoder = json.JSONDecoder()
    found, i = [], 0
    while (start := text.find("{", i)) >= 0:
        try:
            value, i = decoder.raw_decode(text, start)
        except ValueError:
            i = start + 1
            continue
        found.append(value)
    return found


def test_exporter_names_read_the_standard_variables():
    assert exporter_names("traces", {}) == []
    assert exporter_names("traces", {"OTEL_TRACES_EXPORTER": "console"}) == ["console"]
    assert exporter_names("metrics", {"OTEL_METRICS_EXPORTER": " Console, otlp ,none"}) == [
        "console",
        "otlp",
    ]
    assert exporter_names("traces", {"OTEL_TRACES_EXPORTER": "none"}) == []
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    assert exporter_names("traces", endpoint) == ["otlp"]
    assert exporter_names("metrics", endpoint) == ["otlp"]
    only_traces = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}
    assert exporter_names("traces", only_traces) == ["otlp"]
    assert exporter_names("metrics", only_traces) == []


def test_configure_from_env_does_nothing_unless_asked():
    assert configure_from_env(environ={}) is False
    assert configure_from_env(environ={"OTEL_TRACES_EXPORTER": "none"}) is False
    disabled = {"OTEL_SDK_DISABLED": "True", "OTEL_TRACES_EXPORTER": "console"}
    assert configure_from_env(environ=disabled) is False
    assert not NSQInstrumentor().is_instrumented_by_opentelemetry


def test_the_console_exporters_print_spans_and_metrics_to_stderr(nsqd):
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "console"}
    result = run(PUBLISHER, env, nsqd.nsqd.tcp_address, "otel_env")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "configured\n"  # stdout stays the program's own
    printed = json_objects(result.stderr)
    spans = [o for o in printed if o.get("name") == "publish otel_env"]
    assert len(spans) == 2
    assert spans[0]["kind"] == "SpanKind.PRODUCER"
    assert spans[0]["attributes"]["messaging.system"] == "nsq"
    assert spans[1]["attributes"]["messaging.batch.message_count"] == 2
    assert spans[0]["resource"]["attributes"]["service.name"] == "otel-env-test"
    metrics = {
        m["name"]: m
        for o in printed
        for rm in o.get("resource_metrics", [])
        for sm in rm["scope_metrics"]
        for m in sm["metrics"]
    }
    (sent,) = metrics["messaging.client.sent.messages"]["data"]["data_points"]
    assert sent["value"] == 3
    assert "messaging.client.operation.duration" in metrics


#: a program that exits just after its last pub_async was answered (argv: nsqd address, topic)
ASYNC_PUBLISHER = textwrap.dedent(
    """
    import sys
    from nsqclient import Producer
    from nsqclient.otel import configure_from_env

    configure_from_env(service_name="otel-env-test")
    with Producer(sys.argv[1]) as producer:
        futures = [producer.pub_async(sys.argv[2], b"m%d" % i) for i in range(50)]
        for future in futures:
            future.result(timeout=20)
    """
)


def test_the_last_async_publishes_spans_are_exported_at_exit(nsqd):
    # Their spans end on nsq-otel just after their Futures completed; the SDK shuts its global
    # provider down at exit, and instrument()'s own exit hook runs first and waits for them.
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "none"}
    result = run(ASYNC_PUBLISHER, env, nsqd.nsqd.tcp_address, "otel_exit")
    assert result.returncode == 0, result.stderr
    spans = [o for o in json_objects(result.stderr) if o.get("name") == "publish otel_exit"]
    assert len(spans) == 50
    assert all(s["status"]["status_code"] == "UNSET" for s in spans)


def test_the_environment_names_the_service_and_may_disable_everything(nsqd):
    env = {
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_SERVICE_NAME": "from-env",
    }
    result = run(PUBLISHER, env, nsqd.nsqd.tcp_address, "otel_env2")
    assert result.returncode == 0, result.stderr
    spans = [o for o in json_objects(result.stderr) if o.get("name") == "publish otel_env2"]
    assert spans and spans[0]["resource"]["attributes"]["service.name"] == "from-env"
    assert "resource_metrics" not in result.stderr

    off = run(PUBLISHER, {**env, "OTEL_SDK_DISABLED": "true"}, nsqd.nsqd.tcp_address, "otel_env2")
    assert off.returncode == 0, off.stderr
    assert off.stdout == "not configured\n"
    assert "publish otel_env2" not in off.stderr


def test_an_exporter_that_is_not_installed_is_named_in_a_warning(nsqd):
    env = {"OTEL_TRACES_EXPORTER": "console,nosuchexporter"}
    result = run(PUBLISHER, env, nsqd.nsqd.tcp_address, "otel_env3")
    assert result.returncode == 0, result.stderr
    assert "no traces exporter named 'nosuchexporter' is installed" in result.stderr
    assert '"name": "publish otel_env3"' in result.stderr  # the console one still works


def test_the_console_example_runs(nsqd):
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "otel_console.py"),
            "--nsqd-tcp-address",
            nsqd.nsqd.tcp_address,
            "--timeout",
            "20",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    printed = json_objects(result.stdout)
    spans = [o for o in printed if "context" in o and "kind" in o]
    names = [s["name"] for s in spans]
    assert names.count("publish otel_demo") == 3
    assert names.count("process otel_demo") == 5  # four messages, one of them twice
    errors = [s for s in spans if s["status"]["status_code"] == "ERROR"]
    assert len(errors) == 1 and errors[0]["attributes"]["error.type"] == "RuntimeError"
    metric_names = {
        m["name"]
        for o in printed
        for rm in o.get("resource_metrics", [])
        for sm in rm["scope_metrics"]
        for m in sm["metrics"]
    }
    assert {
        "messaging.client.sent.messages",
        "messaging.client.consumed.messages",
        "messaging.client.operation.duration",
        "messaging.process.duration",
    } <= metric_names
