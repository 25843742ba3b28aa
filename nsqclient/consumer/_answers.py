"""The Consumer's answers to nsqd for its messages: FIN, REQ and TOUCH, of one message or of many
at once (one write per connection), and what each answer moves: the counters, the connection's
in-flight count, backoff, and the messages pull mode holds.

An answer is written on the connection's command queue from the thread that answers (a handler
worker, the caller of ``message.finish()`` or of ``finish_many()``); it never blocks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sized
from typing import Any

from .. import protocol
from ..config import Config
from ..errors import NSQError, ServerError
from ..message import Message, claim_all
from ..observe import ObserverSet, tell
from ._batch import ANSWERED, HELD, MessageBatch
from ._rdy_balancer import ConnFlow
from ._shared_state import SharedState

__all__ = ["Responder"]

logger = logging.getLogger("nsqclient.consumer")

#: Unsolicited errors nsqd sends for a FIN/REQ/TOUCH it could not apply, and the counters
#: they move: (counted apart, taken back from).
_ANSWER_FAILED = {
    "E_FIN_FAILED": ("finish_failed", "finished"),
    "E_REQ_FAILED": ("requeue_failed", "requeued"),
    "E_TOUCH_FAILED": ("touch_failed", None),
}


class Responder:
    """The :class:`~nsqclient.message.MessageResponder` of one Consumer's messages.

    Args:
        consumer: the Consumer (named in errors, told to observers).
        config, ordered: the Consumer's (a requeue's default delay; ordered: no delay).
        books: the Consumer's bookkeeping: its lock (which also guards :attr:`held`), the
            counters, each connection's in-flight count, the backoff state (``rdy_wake`` is
            set when an answer changes it).
        observers: the Consumer's observers (``messages_answered``).
        pull: pull mode: messages taken are :attr:`held` until answered.
        idle: set when the last held message is answered while stopping (pull mode).
    """

    def __init__(
        self,
        consumer: Any,
        config: Config,
        ordered: bool,
        books: SharedState,
        *,
        observers: ObserverSet,
        pull: bool,
        idle: threading.Event,
    ):
        self._consumer = consumer
        #: the Consumer (a batch's ``consumer``)
        self.consumer = consumer
        self._config = config
        self._ordered = ordered
        self._lock, self._stats = books.lock, books.stats
        self._backoff, self._rdy_wake = books.backoff, books.rdy_wake
        self._observers = observers
        self._pull = pull
        self._idle = idle
        #: pull mode: messages taken and not answered yet (stop() requeues what is left)
        self.held: set[Message] = set()
        #: columnar pull mode: the batches taken and not answered yet
        self.held_batches: set[MessageBatch] = set()
        #: set by the Consumer's stop(): answers then wake its drain (pull mode)
        self.stopping = False

    # ================================================================ one message

    def _answered(self, message: Message, counter: str, success: bool | None) -> None:
        flow = message._conn
        assert flow is not None  # a Consumer's messages always carry their connection
        with self._lock:
            self._stats[counter] += 1
            if flow.in_flight > 0:
                flow.in_flight -= 1
            if self._pull:
                self.held.discard(message)
                if self.stopping:
                    self._idle.set()
            # At level 0 a success changes nothing (BackoffState.record returns None).
            if success is not None and (self._backoff.level or not success):
                decision = self._backoff.record(success, time.monotonic())
                if decision is not None:
                    logger.info("backoff: %s (level %d)", decision.mode.value, decision.level)
                    self._rdy_wake.set()

    def finish_message(self, message: Message) -> None:
        flow = message._conn
        assert flow is not None  # a Consumer's messages always carry their connection
        # The id came from nsqd in this message: no need to check it as protocol.fin does.  On a
        # closed connection the FIN is dropped (nsqd sends the message again).
        flow.fin(message.id)
        # _answered(message, "finished", True), inline: this runs once per message handled.
        # Not a with statement: it makes two method objects a call.
        lock = self._lock
        lock.acquire()
        try:
            self._stats["finished"] += 1
            if flow.in_flight > 0:
                flow.in_flight -= 1
            if self._pull:
                self.held.discard(message)
                if self.stopping:
                    self._idle.set()
            if self._backoff.level:  # at level 0 a success changes nothing
                decision = self._backoff.record(True, time.monotonic())
                if decision is not None:
                    logger.info("backoff: %s (level %d)", decision.mode.value, decision.level)
                    self._rdy_wake.set()
        finally:
            lock.release()
        observers = self._observers.active
        if observers:
            tell(observers, "messages_answered", self._consumer, (message,), "finish", None, None)

    def requeue_delay(self, message: Message, delay: float | None) -> float:
        """Seconds a requeue of ``message`` asks nsqd for (ordered: 0, nothing may pass it)."""
        return self._delay(message.attempts, delay)

    def _delay(self, attempts: int, delay: float | None) -> float:
        if self._ordered:
            return 0.0
        if delay is None:
            cfg = self._config
            return min(cfg.default_requeue_delay * attempts, cfg.max_requeue_delay)
        return delay

    def requeue_message(self, message: Message, delay: float | None, backoff: bool) -> None:
        conn = message._conn
        assert conn is not None  # a Consumer's messages always carry their connection
        delay = self.requeue_delay(message, delay)
        try:
            conn.send(protocol.req(message.id, int(round(delay * 1000))))
        except NSQError:
            logger.debug("cannot REQ %r: connection closed; nsqd will redeliver it", message.id)
        self._answered(message, "requeued", False if backoff else None)
        observers = self._observers.active
        if observers:
            tell(
                observers,
                "messages_answered",
                self._consumer,
                (message,),
                "requeue",
                delay,
                backoff,
            )

    def touch_message(self, message: Message) -> None:
        conn = message._conn
        assert conn is not None  # a Consumer's messages always carry their connection
        try:
            conn.send(protocol.touch(message.id))
        except NSQError:
            logger.debug("cannot TOUCH %r: connection closed", message.id)
        observers = self._observers.active
        if observers:
            tell(observers, "messages_answered", self._consumer, (message,), "touch", None, None)

    def answer_failed(self, conn: Any, error: ServerError) -> bool:
        """nsqd could not apply a FIN, REQ or TOUCH (the message had probably timed out):
        count it apart and log it; False when ``error`` is no such error."""
        counters = _ANSWER_FAILED.get(error.code)
        if counters is None:
            return False
        failed, taken_back = counters
        # Logged before it is counted: whoever sees the count finds the log line too.
        logger.warning(
            "nsqd %s: %s (the message had probably timed out and been redelivered)",
            conn.address,
            error,
        )
        with self._lock:
            self._stats[failed] += 1
            if taken_back is not None:
                self._stats[taken_back] -= 1
        return True

    # ================================================================ many at once

    def finish_many(self, messages: Iterable[Message]) -> int:
        """See :meth:`Consumer.finish_many <nsqclient.Consumer.finish_many>`."""
        groups = self._claim_many(messages, "finish")
        for conn, group in groups.items():
            _send(conn, b"FIN " + b"\nFIN ".join([m.id for m in group]) + b"\n", "FIN", group)
        return self._answered_many(groups, "finish", None, None)

    def requeue_many(self, messages: Iterable[Message], delay: float | None, backoff: bool) -> int:
        """See :meth:`Consumer.requeue_many <nsqclient.Consumer.requeue_many>`."""
        groups = self._claim_many(messages, "requeue")
        delay_of = self.requeue_delay
        for conn, group in groups.items():
            reqs = [protocol.req(m.id, int(round(delay_of(m, delay) * 1000))) for m in group]
            _send(conn, b"".join(reqs), "REQ", group)
        return self._answered_many(groups, "requeue", delay, backoff)

    def _claim_many(self, messages: Iterable[Message], what: str) -> dict[ConnFlow, list[Message]]:
        """Claim each message's one answer (as Message.finish() does), grouped by connection."""
        messages = list(messages)
        for message in messages:
            if message._responder is not self:
                raise ValueError(f"message {message.id!r} was not received by {self._consumer!r}")
        groups: dict[ConnFlow, list[Message]] = {}
        for message in claim_all(messages, what):
            conn = message._conn
            assert conn is not None  # a Consumer's messages always carry their connection
            group = groups.get(conn)
            if group is None:
                groups[conn] = [message]
            else:
                group.append(message)
        return groups

    def _answered_many(
        self,
        groups: dict[ConnFlow, list[Any]],
        action: str,
        delay: float | None,
        backoff: bool | None,
        batches: bool = False,
    ) -> int:
        """:meth:`_answered` for the messages (``batches``: the MessageBatch objects) of a
        bulk FIN or REQ, in one lock round."""
        sizes = {c: sum(map(len, g)) if batches else len(g) for c, g in groups.items()}
        count = sum(sizes.values())
        if not count:
            return 0
        success = True if action == "finish" else (False if backoff else None)
        held = self.held_batches if batches else self.held
        with self._lock:
            self._stats["finished" if action == "finish" else "requeued"] += count
            for conn, group in groups.items():
                conn.in_flight = max(conn.in_flight - sizes[conn], 0)
                if self._pull:
                    held.difference_update(group)
            if self._pull and self.stopping:
                self._idle.set()
            if success is not None and (self._backoff.level or not success):
                now = time.monotonic()
                decision = None
                for _ in range(count):
                    decision = self._backoff.record(success, now) or decision
                if decision is not None:
                    logger.info("backoff: %s (level %d)", decision.mode.value, decision.level)
                    self._rdy_wake.set()
        observers = self._observers.active
        if observers:
            answered = [m for group in groups.values() for m in group]
            event = "batches_answered" if batches else "messages_answered"
            tell(observers, event, self._consumer, answered, action, delay, backoff)
        return count

    # ================================================================ batches (columnar)

    def answer_batches(
        self, batches: list[MessageBatch], action: str, delay: float | None, backoff: bool
    ) -> int:
        """FIN, REQ or TOUCH (``action``: ``"finish"``, ``"requeue"``, ``"touch"``) every
        message of ``batches``, one write per connection; a batch answered or split already
        is skipped (with a warning).  Return how many messages."""
        for batch in batches:
            if batch._responder is not self:
                raise ValueError(f"{batch!r} was not received by {self._consumer!r}")
        groups: dict[ConnFlow, list[MessageBatch]] = {}
        skipped = 0
        with self._lock:
            for batch in batches:
                if batch.state != HELD:
                    skipped += 1
                    continue
                if action != "touch":
                    batch.state = ANSWERED
                if len(batch):
                    groups.setdefault(batch.conn, []).append(batch)
                elif action != "touch":
                    self.held_batches.discard(batch)  # an empty part: nothing to send
        if skipped and action != "touch":  # a touch may come after the answer: nothing to do
            logger.warning("%d message batches were answered or split already: skipped", skipped)
        for conn, group in groups.items():
            ids = [i for batch in group for i in batch.ids()]
            if action == "requeue":
                attempts = [a for batch in group for a in batch.attempts()]
                data = b"".join(
                    [
                        protocol.req(i, int(round(self._delay(a, delay) * 1000)))
                        for i, a in zip(ids, attempts, strict=True)
                    ]
                )
            else:
                verb = b"FIN " if action == "finish" else b"TOUCH "
                data = verb + (b"\n" + verb).join(ids) + b"\n"
            _send(conn, data, verb_of(action), ids)
        if action != "touch":
            return self._answered_many(groups, action, delay, backoff, batches=True)
        now = time.monotonic()
        for group in groups.values():
            for batch in group:
                batch.touched_at = now
        observers = self._observers.active
        answered = [b for group in groups.values() for b in group]
        if observers and answered:
            tell(observers, "batches_answered", self._consumer, answered, "touch", None, None)
        return sum(map(len, answered))

    def split_batch(self, batch: MessageBatch, index: int) -> tuple[MessageBatch, MessageBatch]:
        """``batch.split(index)``: the two parts replace it among the batches held."""
        with self._lock:
            head, tail = batch._cut(index)
            if batch in self.held_batches:
                self.held_batches.discard(batch)
                self.held_batches.update((head, tail))
        return head, tail

    def requeue_held(self) -> None:
        """Pull mode, at the end of stop(): requeue what was taken and is still unanswered."""
        with self._lock:
            held = [m for m in self.held if not m.has_responded()]
            batches = [b for b in self.held_batches if not b.has_responded()]
        count = len(held) + sum(map(len, batches))
        if count:
            logger.warning(
                "%s/%s: %d messages taken were not answered by stop()'s deadline; requeueing them",
                self._consumer.topic,
                self._consumer.channel,
                count,
            )
        if held:
            self.requeue_many(held, delay=0, backoff=False)
        if batches:
            self.answer_batches(batches, "requeue", 0.0, False)


def verb_of(action: str) -> str:
    """The command an answer sends: ``"finish"`` -> ``"FIN"``, ..."""
    return {"finish": "FIN", "requeue": "REQ", "touch": "TOUCH"}[action]


def _send(conn: ConnFlow, data: bytes, verb: str, group: Sized) -> None:
    """Write the answers to ``group`` in one go; when the connection is closed, nsqd sends
    those messages again (nothing else to do)."""
    try:
        conn.send(data)
    except NSQError:
        logger.debug(
            "cannot %s %d messages: connection to %s closed; nsqd will redeliver them",
            verb,
            len(group),
            conn.address,
        )
