"""NSQInstrumentor: turn nsqclient's OpenTelemetry spans and metrics on and off.

``instrument()`` registers one observer with :func:`nsqclient.observe.add_observer`: every
:class:`~nsqclient.Producer` and :class:`~nsqclient.Consumer`, made before or after (and so
pynsq's Reader and Writer, which run on them), tells it what it does, and it records spans and
metrics.  Nothing of nsqclient is replaced or patched.  ``uninstrument()`` removes the observer.
Until ``instrument()`` nothing of OpenTelemetry is imported by nsqclient, and a client with no
observer makes one empty check per event: not instrumented costs nothing measurable.
"""

from __future__ import annotations

import atexit
from collections.abc import Collection
from typing import Any

from opentelemetry import metrics, trace

# (untyped: no py.typed in opentelemetry-instrumentation)
from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)

from .. import __version__, observe
from . import gauges
from . import names as n
from .observer import TelemetryObserver
from .process import ConsumeTelemetry
from .publish import INJECT_MODES, PublishTelemetry

__all__ = ["NSQInstrumentor", "SCOPE", "INJECT_MODES"]

#: the instrumentation scope of every span and metric (nsqclient instruments itself)
SCOPE = "nsqclient"


class NSQInstrumentor(BaseInstrumentor):
    """OpenTelemetry instrumentation of nsqclient (OpenTelemetry's contrib convention).

    .. code-block:: python

        from nsqclient.otel import NSQInstrumentor

        NSQInstrumentor().instrument()     # global providers; or tracer_provider=, meter_provider=
        ...
        NSQInstrumentor().uninstrument()

    ``instrument()`` takes:

    * ``tracer_provider``, ``meter_provider``: where spans and metrics go (default: the global
      ones, which the SDK's set-up or ``opentelemetry-instrument`` set);
    * ``inject``: where a publish's trace context goes: ``"extend_topics"`` (default: into
      the ext header of every publish to a youzan topic with extend support, a copy of the
      one given or a new one), ``"given"`` (only into an ext header the caller gave),
      ``"never"``;
    * ``extract`` (default True): make a message's process span the child of the publish
      span whose context its ext header carries (and link a batch's receive span to those);
    * ``finish_events`` (default False): record every FIN as an event ``nsq.finish`` on the
      message's process span (without it, only a FIN after another event: a span event costs
      about a sixth of what the SDK takes per message; a process span with status UNSET was
      finished).

    A second ``instrument()`` without an ``uninstrument()`` between does nothing (it logs a
    warning); ``uninstrument()`` removes the observer ``instrument()`` added (``observer``;
    its ``flush(timeout)`` waits until the spans of the asynchronous publishes answered so far
    have ended).  The class is a singleton, as every contrib instrumentor:
    ``NSQInstrumentor()`` is always the same object.
    """

    #: the observer registered while instrumented (None otherwise)
    observer: TelemetryObserver | None = None

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()  # nsqclient instruments itself: nothing else must be installed

    def _instrument(self, **kwargs: Any) -> None:
        inject = kwargs.get("inject", "extend_topics")
        if inject not in INJECT_MODES:
            raise ValueError(f"inject must be one of {INJECT_MODES}, not {inject!r}")
        tracer_provider = kwargs.get("tracer_provider")
        meter_provider = kwargs.get("meter_provider") or metrics.get_meter_provider()
        tracer = trace.get_tracer(SCOPE, __version__, tracer_provider)
        meter = metrics.get_meter(SCOPE, __version__, meter_provider)
        sent, consumed, out_of_order = gauges.register(meter, meter_provider)
        publish = PublishTelemetry(
            tracer,
            sent,
            _duration(
                meter,
                n.OPERATION_DURATION,
                "Duration of messaging operation initiated by a producer or consumer client.",
            ),
            inject,
        )
        consume = ConsumeTelemetry(
            tracer,
            consumed,
            _duration(meter, n.PROCESS_DURATION, "Duration of processing operation."),
            bool(kwargs.get("extract", True)),
            bool(kwargs.get("finish_events", False)),
            out_of_order,
        )
        watched = gauges.Watched()
        observer = TelemetryObserver(publish, consume, watched)
        gauges.activate(meter_provider, watched)
        self.observer = observer
        observe.add_observer(observer)  # every client alive is told "attached" now
        # atexit runs the last registered first: moved to the end at every instrument(), the
        # hook runs before the SDK's shutdown of any provider made before it (which would drop
        # the spans still to end)
        atexit.unregister(_flush_at_exit)
        atexit.register(_flush_at_exit)

    def _uninstrument(self, **kwargs: Any) -> None:
        observer, self.observer = self.observer, None
        if observer is None:
            return
        observe.remove_observer(observer)
        gauges.activate(None)
        observer.close(timeout=5.0)


#: seconds a program's exit waits for the spans of its last asynchronous publishes
EXIT_FLUSH_TIMEOUT = 5.0


def _flush_at_exit() -> None:
    """At interpreter exit, end the spans of the asynchronous publishes answered so far (their
    Futures completed; ``nsq-otel`` ends their spans just after), so that a program that relies
    on the SDK's own shutdown at exit does not lose its last ``pub_async`` spans."""
    observer = NSQInstrumentor().observer
    if observer is not None:
        observer.flush(EXIT_FLUSH_TIMEOUT)


def _duration(meter: metrics.Meter, name: str, description: str) -> metrics.Histogram:
    return meter.create_histogram(
        name,
        unit="s",
        description=description,
        explicit_bucket_boundaries_advisory=list(n.DURATION_BUCKETS),
    )
