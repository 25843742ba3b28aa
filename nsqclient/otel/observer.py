"""The instrumentation's observer: what :meth:`NSQInstrumentor.instrument` registers with
:func:`nsqclient.observe.add_observer`, so that every Consumer and Producer, made before or
after, tells it what it does (see :mod:`nsqclient.observe`).

It is made of three parts, each listening to its own events: :class:`PublishTelemetry`
(the Producer's), :class:`ConsumeTelemetry` (the Consumer's) and :class:`Watched` (which clients
exist and the connections they make, for the gauges).  Its event methods are the parts' own
bound methods, so that a client's call goes straight to the code that records it.
"""

from __future__ import annotations

from typing import Any

from .gauges import Watched
from .process import ConsumeTelemetry
from .publish import PublishTelemetry

__all__ = ["TelemetryObserver"]


class TelemetryObserver:
    """An observer (in the sense of :class:`nsqclient.observe.Observer`) recording spans and
    metrics with OpenTelemetry."""

    def __init__(self, publish: PublishTelemetry, consume: ConsumeTelemetry, watched: Watched):
        self.publish = publish
        self.consume = consume
        self.watched = watched
        # -- Producer
        self.publish_started = publish.publish_started
        self.publish_ended = publish.publish_ended
        # -- Consumer
        self.handler_started = consume.handler_started
        self.handler_ended = consume.handler_ended
        self.message_given_up = consume.message_given_up
        self.message_out_of_order = consume.message_out_of_order
        self.messages_answered = consume.messages_answered
        self.messages_taken = consume.messages_taken
        self.batches_taken = consume.batches_taken
        self.batches_answered = consume.batches_answered
        self.connection_made = watched.connection_made

    # -- both

    def attached(self, client: Any) -> None:
        self.watched.attached(client)

    def detached(self, client: Any) -> None:
        self.watched.detached(client)
        self.consume.detached(client)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until the spans of the asynchronous publishes answered so far have ended (they
        end on the ``nsq-otel`` thread); return True if they have within ``timeout``
        seconds."""
        return self.publish.finisher.flush(timeout)

    def close(self, timeout: float) -> None:
        """Removed: end the asynchronous publishes' spans it still holds, and join its
        thread."""
        self.publish.close(timeout)

    def __repr__(self) -> str:
        return "<nsqclient.otel observer>"
