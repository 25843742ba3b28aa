"""OpenTelemetry tracing and metrics for nsqclient (the ``nsqclient[otel]`` extra).

.. code-block:: python

    from nsqclient.otel import NSQInstrumentor

    NSQInstrumentor().instrument(tracer_provider=..., meter_provider=...)

See ``docs/observability.rst`` for what is traced and measured.  Importing this package
imports nothing of OpenTelemetry: :class:`NSQInstrumentor` does, when it is first asked for,
and :func:`configure_from_env` only when the environment asks for telemetry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .env import configure_from_env
    from .instrumentor import NSQInstrumentor

__all__ = ["NSQInstrumentor", "configure_from_env"]


def __getattr__(name: str) -> Any:
    if name == "NSQInstrumentor":
        try:
            from .instrumentor import NSQInstrumentor
        except ModuleNotFoundError as exc:
            if not (exc.name or "").startswith("opentelemetry"):
                raise
            raise ModuleNotFoundError(
                f"nsqclient.otel needs opentelemetry-api and opentelemetry-instrumentation"
                f" ({exc}): pip install 'nsqclient[otel]'",
                name=exc.name,
            ) from exc
        return NSQInstrumentor
    if name == "configure_from_env":
        from .env import configure_from_env

        return configure_from_env
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
