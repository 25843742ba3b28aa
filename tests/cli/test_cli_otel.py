"""``nsqclient pub`` and ``tail`` honour the standard OTEL_* environment (when the SDK is
installed): spans go to the exporter it names, and nothing changes without it."""

from __future__ import annotations

import pytest

pytest.importorskip("opentelemetry.sdk")


def test_pub_with_otel_traces_exporter_console_prints_its_publish_spans(nsqd, cli, monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    done = cli.run("pub", "--nsqd-tcp-address", nsqd.nsqd.tcp_address, "--topic", "cli_otel",
                   input=b"one\ntwo\n")  # fmt: skip
    assert done.returncode == 0, done.stderr
    err = done.stderr.decode()
    assert err.count('"name": "publish cli_otel"') >= 1, err
    assert '"messaging.system": "nsq"' in err
    assert b"publish cli_otel" not in done.stdout  # the command's own output stays clean


def test_pub_without_otel_environment_exports_nothing(nsqd, cli, monkeypatch):
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_LOGS_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    done = cli.run("pub", "--nsqd-tcp-address", nsqd.nsqd.tcp_address, "--topic", "cli_otel2",
                   input=b"one\n")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert b"publish cli_otel2" not in done.stderr + done.stdout
