"""configure_from_env: the OpenTelemetry SDK set up from the standard ``OTEL_*`` environment,
for programs that do not set it up themselves (the ``nsqclient tail`` and ``pub`` commands).

Nothing of OpenTelemetry is imported unless the environment asks for telemetry.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["configure_from_env", "exporter_names"]

logger = logging.getLogger("nsqclient.otel")

_SIGNALS = {"traces": "OTEL_TRACES_EXPORTER", "metrics": "OTEL_METRICS_EXPORTER"}


def exporter_names(signal: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """The exporters the environment names for ``signal`` ("traces" or "metrics").

    ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER``: a comma-separated list (``none``
    means none).  Unset, it is ``otlp`` when an OTLP endpoint is configured
    (``OTEL_EXPORTER_OTLP_ENDPOINT`` or the signal's own), and nothing otherwise: a command
    line tool exports nothing unless asked to.
    """
    env = os.environ if environ is None else environ
    value = env.get(_SIGNALS[signal])
    if value is None:
        specific = f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT"
        if env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(specific):
            return ["otlp"]
        return []
    names = [name.strip().lower() for name in value.split(",")]
    return [name for name in dict.fromkeys(names) if name and name != "none"]


def configure_from_env(
    service_name: str | None = None, environ: Mapping[str, str] | None = None
) -> bool:
    """Set up OpenTelemetry's SDK from the ``OTEL_*`` environment and instrument nsqclient.

    Does nothing and returns False when ``OTEL_SDK_DISABLED`` is true or the environment
    names no exporter (see ``exporter_names``), or (with a warning) when the SDK is not
    installed.  Otherwise sets the global tracer and meter providers (unless something has set
    them already: then they are used as they are), with a batch span processor and a periodic
    metric reader per exporter named, and calls ``NSQInstrumentor().instrument()``; returns
    True.  Exporters are found by name as the SDK's own set-up finds them (the
    ``opentelemetry_traces_exporter`` and ``opentelemetry_metrics_exporter`` entry points:
    ``console`` comes with the SDK, ``otlp`` with ``opentelemetry-exporter-otlp``); ``console``
    writes to stderr, so that a command's output on stdout stays its own.  The SDK reads the rest
    of the environment itself: ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``,
    ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``, ``OTEL_METRIC_EXPORT_INTERVAL``, the exporters'
    endpoints and headers, ``OTEL_PROPAGATORS``.

    Args:
        service_name: ``service.name`` when the environment gives none.
        environ: the environment to read (default: ``os.environ``).
    """
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    wanted = {signal: exporter_names(signal, env) for signal in _SIGNALS}
    if not any(wanted.values()):
        return False
    try:
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from .instrumentor import NSQInstrumentor
    except ImportError as exc:
        logger.warning(
            "the environment asks for OpenTelemetry (%s), but it is not installed (%s):"
            " pip install 'nsqclient[otel]' opentelemetry-sdk",
            ", ".join(f"{_SIGNALS[s]}={','.join(v)}" for s, v in wanted.items() if v),
            exc,
        )
        return False
    instrumentor = NSQInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        return True  # opentelemetry-instrument (or the program) did it all already
    resource = Resource.create()
    if service_name and str(resource.attributes.get("service.name", "")).startswith(
        "unknown_service"
    ):
        resource = resource.merge(Resource({"service.name": service_name}))

    tracer_provider: Any = trace.get_tracer_provider()
    if wanted["traces"] and not isinstance(tracer_provider, TracerProvider):
        tracer_provider = TracerProvider(resource=resource)
        for exporter in _exporters("traces", wanted["traces"]):
            tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(tracer_provider)

    meter_provider: Any = metrics.get_meter_provider()
    if wanted["metrics"] and not isinstance(meter_provider, MeterProvider):
        readers = [
            PeriodicExportingMetricReader(exporter)
            for exporter in _exporters("metrics", wanted["metrics"])
        ]
        meter_provider = MeterProvider(resource=resource, metric_readers=readers)
        metrics.set_meter_provider(meter_provider)

    instrumentor.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
    return True


def _exporters(signal: str, names: list[str]) -> list[Any]:
    """An exporter of each name that is installed (a warning for each that is not)."""
    from importlib.metadata import entry_points

    group = f"opentelemetry_{signal}_exporter"
    found = {ep.name: ep for ep in entry_points(group=group)}
    exporters = []
    for name in names:
        entry = found.get(name)
        if entry is None:
            hint = " (pip install opentelemetry-exporter-otlp)" if name.startswith("otlp") else ""
            logger.warning("no %s exporter named %r is installed%s", signal, name, hint)
            continue
        try:
            cls = entry.load()
            exporters.append(cls(out=sys.stderr) if name == "console" else cls())
        except Exception:
            logger.exception("cannot make the %s exporter %r", signal, name)
    return exporters
