"""Starting a span whose per-call attributes cost something to build.

The SDK takes attributes cheapest when the span starts; building them for a span that will not
record (sampled out) is wasted.  :class:`SpanStarter` guesses from the last span it started:
when that one recorded, the attributes go in at the start; when it did not, they are built
only if the new span records."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind

__all__ = ["SpanStarter"]


class SpanStarter:
    """Starts spans of one tracer (one per telemetry object; not locked: a wrong guess costs
    only time)."""

    def __init__(self, tracer: trace.Tracer):
        self.tracer = tracer
        #: whether the last span started recorded
        self.recorded = True

    def start(
        self,
        name: str,
        kind: SpanKind,
        context: otel_context.Context | None,
        attributes: dict[str, Any],
        extra: Callable[[Any], dict[str, Any]],
        item: Any,
        start_time: int | None = None,
    ) -> trace.Span:
        """A span with ``attributes`` and ``extra(item)`` (built only when it records)."""
        if self.recorded:
            span = self.tracer.start_span(
                name,
                context=context,
                kind=kind,
                attributes={**attributes, **extra(item)},
                start_time=start_time,
            )
            if not span.is_recording():
                self.recorded = False
        else:
            span = self.tracer.start_span(
                name, context=context, kind=kind, attributes=attributes, start_time=start_time
            )
            if span.is_recording():
                span.set_attributes(extra(item))
                self.recorded = True
        return span
