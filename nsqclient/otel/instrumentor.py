"""NSQInstrumentor: turn nsqclient's OpenTelemetry spans and metrics on and off.

``instrument()`` replaces a few methods of :class:`~nsqclient.Producer` and
:class:`~nsqclient.Consumer` (on the classes, so every instance, made before or after, and
pynsq's Reader and Writer built on them are covered) by wrappers that trace and measure;
``uninstrument()`` puts the very same functions back.  Until ``instrument()`` nothing of
OpenTelemetry is imported by nsqclient and nothing is wrapped: not instrumented costs nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from typing import Any

from opentelemetry import metrics, trace

# (untyped: no py.typed in opentelemetry-instrumentation)
from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)

from .._version import __version__
from ..consumer import Consumer
from ..producer import Producer
from . import gauges
from . import names as n
from .process import ProcessInstrumentation
from .publish import INJECT_MODES, PublishInstrumentation

__all__ = ["NSQInstrumentor", "SCOPE", "INJECT_MODES"]

#: the instrumentation scope of every span and metric (nsqclient instruments itself)
SCOPE = "nsqclient"

#: (method, NSQ command, asynchronous) of the Producer's wrapped publishing methods
_PUBLISHERS = (
    ("pub", "PUB", False),
    ("mpub", "MPUB", False),
    ("dpub", "DPUB", False),
    ("pub_async", "PUB", True),
    ("mpub_async", "MPUB", True),
    ("dpub_async", "DPUB", True),
)


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
      span whose context its ext header carries.

    A second ``instrument()`` without an ``uninstrument()`` between does nothing (it logs a
    warning); ``uninstrument()`` restores every method it replaced.  The class is a singleton,
    as every contrib instrumentor: ``NSQInstrumentor()`` is always the same object.
    """

    #: (class, method name, what to put back) of every method replaced
    _originals: list[tuple[type, str, Any]] = []
    #: the publish wrappers' maker (its thread is joined on uninstrument)
    _publish: PublishInstrumentation | None = None

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
        sent, consumed = gauges.register(meter, meter_provider)
        publish = PublishInstrumentation(
            tracer,
            sent,
            _duration(
                meter,
                n.OPERATION_DURATION,
                "Duration of messaging operation initiated by a producer or consumer client.",
            ),
            inject,
        )
        process = ProcessInstrumentation(
            tracer,
            consumed,
            _duration(meter, n.PROCESS_DURATION, "Duration of processing operation."),
            bool(kwargs.get("extract", True)),
        )
        plan: list[tuple[type, str, Callable[[Any], Any]]] = [
            (Producer, name, functools.partial(publish.wrap, command=command, asynchronous=a))
            for name, command, a in _PUBLISHERS
        ]
        plan += [
            (Producer, "_submit_to", publish.wrap_submit),
            (Consumer, "_handle", process.wrap_handle),
            (Consumer, "_finish_message", process.wrap_finish),
            (Consumer, "_requeue_message", process.wrap_requeue),
            (Consumer, "_touch_message", process.wrap_touch),
            (Consumer, "__init__", gauges.wrap_init),
            (Consumer, "_subscribe", gauges.wrap_subscribe),
        ]
        # Every wrapper is made before any is installed: a method gone missing fails here,
        # with nothing half done.
        ready = []
        for cls, name, make in plan:
            original, own = _method(cls, name)
            ready.append((cls, name, make(original), original if own else _INHERITED))
        for cls, name, wrapper, _ in ready:
            setattr(cls, name, wrapper)
        self._originals = [(cls, name, restore) for cls, name, _, restore in ready]
        self._publish = publish
        gauges.activate(meter_provider)

    def _uninstrument(self, **kwargs: Any) -> None:
        gauges.activate(None)
        for cls, name, original in reversed(self._originals):
            if original is _INHERITED:
                delattr(cls, name)  # the base class's method shows through again
            else:
                setattr(cls, name, original)
        self._originals = []
        publish, self._publish = self._publish, None
        if publish is not None:
            publish.close(timeout=5.0)


#: stands for "the class had no method of its own": uninstrument deletes the wrapper
_INHERITED = object()


def _method(cls: type, name: str) -> tuple[Any, bool]:
    """The function ``cls.name`` runs (its own, or a base class's) and whether it is its own."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name], klass is cls
    raise AttributeError(f"{cls.__qualname__} has no method {name!r} to instrument")


def _duration(meter: metrics.Meter, name: str, description: str) -> metrics.Histogram:
    return meter.create_histogram(
        name,
        unit="s",
        description=description,
        explicit_bucket_boundaries_advisory=list(n.DURATION_BUCKETS),
    )
