"""A Consumer's message on its way to user code: the checks every message passes first, a
handler's or a taker's (the trace log, youzan's ordered-offset check, the give-up at
``max_tries``), then in handler mode the handler contract (None/True -> FIN, False or an
exception -> REQ with backoff, :class:`~nsqclient.message.RequeueMessage`; a warning past
nsqd's msg_timeout), told to observers.

Everything here runs on the thread that hands the message over: a handler worker
(``nsq-worker-*``) or the caller of ``take()``; never a connection's reader or writer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..backoff import BackoffState
from ..message import Message, RequeueMessage, answer_lock
from ..observe import ObserverSet, tell
from ._batch import MessageBatch
from ._discovery import run_hook
from ._fin_tally import FinTally

__all__ = ["Handling"]

logger = logging.getLogger("nsqclient.consumer")
trace_logger = logging.getLogger("nsqclient.trace")


class Handling:
    """How one Consumer hands its messages to user code (see the module doc).

    Args:
        consumer: the Consumer (told to observers; its ``topic``, ``giving_up`` and
            ``on_out_of_order`` are read when needed).
        handler: the handler (None: pull mode, :meth:`prepare` only).
        ordered, max_tries, tracing: the Consumer's settings (``tracing`` may change).
        observers: the Consumer's observers.
        finish: FIN a message whose answer was claimed (the Consumer's responder).
        count: add one to a counter of the Consumer's (``handler_errors``,
            ``timed_out_locally``, ``given_up``).
        tally, settle, backoff: the FINs workers wrote and have not counted yet, what counts
            them (under the Consumer's lock), and the backoff state (above level 0 each FIN
            goes through ``finish``, which records the success at once).
        idle: set when a worker ends a message while the Consumer stops (its drain waits
            on it).
    """

    def __init__(
        self,
        consumer: Any,
        handler: Callable[[Message], Any] | None,
        *,
        ordered: bool,
        max_tries: int,
        tracing: bool,
        observers: ObserverSet,
        finish: Callable[[Message], None],
        count: Callable[[str], None],
        tally: FinTally,
        settle: Callable[[], None],
        backoff: BackoffState,
        idle: threading.Event | None = None,
    ):
        self._consumer = consumer
        self.handler = handler
        self.ordered = ordered
        self.max_tries = max_tries
        #: while True every message received is logged on ``nsqclient.trace``
        self.tracing = tracing
        self._observers = observers
        self._finish = finish
        self._count = count
        #: youzan, ordered: the highest disk queue offset seen per partition
        self._offsets: dict[int, int] = {}
        self._offsets_lock = threading.Lock()
        self._idle = idle or threading.Event()
        self._tally = tally
        self._settle = settle
        self._backoff = backoff
        #: set when the Consumer stops: a worker ending a message sets ``idle`` then
        self.stopping = False

    def handle_run(self, run: Any, current: list[Message | None], slot: int) -> None:
        """Handler mode, on a worker: :meth:`handle` each message of ``run`` (taken with
        ``run.popleft()``: other workers may take from it too) until it is empty;
        ``current[slot]`` holds the message being handled.

        With no observer, no tracing and no ordered consumption (the common case) the checks
        and the handler contract of :meth:`handle` run here inline, the same step for step:
        a call less per message, and the FIN of each queued as its handler returns.  Out of
        backoff such a FIN is counted in the worker's slot of the tally and moves into the
        books once the run is done (see consumer/_fin_tally.py)."""
        popleft = run.popleft
        finish = self._finish
        fin = run.flow.fin
        backoff = self._backoff
        tally = self._tally
        written = tally.written
        tally.flows[slot] = run.flow  # nothing of this slot waits to be counted
        monotonic = time.monotonic
        observers = self._observers
        claim, claimed_all = answer_lock.acquire, answer_lock.release
        # A handler starts when the step before it ended: one clock read per message.
        now = monotonic()
        while True:
            try:
                message = popleft()
            except IndexError:
                run.flow.flush()  # the run's last FINs, without waking the writer for them
                if written[slot] != tally.counted[slot]:
                    self._settle()
                return
            current[slot] = message
            handler = self.handler
            try:
                if observers.active or self.tracing or self.ordered or handler is None:
                    self.handle(message)
                    now = monotonic()
                elif self.max_tries and message.attempts > self.max_tries:
                    self._give_up(message)
                    now = monotonic()
                else:
                    started = now
                    try:
                        result = handler(message)
                    except Exception as exc:
                        self._failed(message, exc)
                    else:
                        if not message._async and not message._responded:
                            if result is False:
                                message.requeue(backoff=True)
                            else:
                                claim()  # not a with statement: two method objects less
                                claimed = not message._responded
                                message._responded = True
                                claimed_all()
                                if not claimed:
                                    message._claim("finish")  # warns: answered meanwhile
                                elif backoff.level:
                                    finish(message)  # records the success at once
                                else:
                                    # finish(message) without its lock round (see above)
                                    fin(message.id)
                                    written[slot] += 1
                    now = monotonic()
                    held = now - (message.touched_at or message.received_at)
                    if held >= 1.0:  # below any msg_timeout nsqd allows: decided here
                        self._late(message, held, now - started)
            except Exception:
                logger.exception("unexpected error handling message %r", message.id)
                now = monotonic()
            current[slot] = None
            if self.stopping:
                self._idle.set()

    def handle(self, message: Message) -> None:
        """Handler mode, on a worker: :meth:`prepare`, then the handler, told to observers."""
        observers = self._observers.active
        if observers:
            tell(observers, "handler_started", self._consumer, message)
        error: BaseException | None = None
        try:
            if self.prepare([message]):
                error = self.run_handler(message)
        finally:
            if observers:
                tell(observers, "handler_ended", self._consumer, message, error)

    def run_handler(self, message: Message) -> BaseException | None:
        """Run the handler on ``message`` and answer for it as the handler contract says;
        return what it raised (None when it returned)."""
        started = time.monotonic()
        error: BaseException | None = None
        handler = self.handler
        assert handler is not None  # workers run only in handler mode
        try:
            result = handler(message)
        except Exception as exc:
            error = exc
            self._failed(message, exc)
        else:
            if not message._async and not message._responded:
                if result is False:
                    message.requeue(backoff=True)
                elif message._claim("finish"):
                    self._finish(message)
        now = time.monotonic()
        # nsqd's timer runs from delivery, and restarts at each TOUCH.
        held = now - (message.touched_at or message.received_at)
        if held >= 1.0:  # below any msg_timeout nsqd allows: the common case, decided here
            self._late(message, held, now - started)
        return error

    def _failed(self, message: Message, exc: Exception) -> None:
        """The handler raised ``exc``: requeue as the contract says (RequeueMessage: its
        delay and backoff, quietly; anything else: logged, counted, with backoff)."""
        if isinstance(exc, RequeueMessage):
            if not message.has_responded():
                message.requeue(exc.delay, exc.backoff)
            return
        logger.error("handler failed on message %r; requeueing", message.id, exc_info=exc)
        self._count("handler_errors")
        if not message.has_responded():
            message.requeue(backoff=True)

    def _late(self, message: Message, held: float, elapsed: float) -> None:
        """``message`` was held ``held`` seconds since nsqd delivered (or last touched) it,
        the handler ``elapsed`` of them: past nsqd's msg_timeout, warn and count."""
        conn = message._conn
        if conn is not None and held > conn.msg_timeout:
            self._count("timed_out_locally")
            logger.warning(
                "handler took %.1fs on message %r, past nsqd's msg_timeout of %.1fs: nsqd has "
                "probably redelivered it; call message.touch() in long handlers",
                elapsed,
                message.id,
                conn.msg_timeout,
            )

    def prepare(self, messages: list[Message]) -> list[Message]:
        """What every message goes through before user code sees it, a handler's or a
        taker's: the trace log, youzan's ordered-offset check, and the give-up at
        ``max_tries`` (those given up on are answered here and left out of what it returns).
        Checks per message only what is switched on."""
        if self.tracing:
            for message in messages:
                self._trace(message)
        if self.ordered:
            for message in messages:
                self.check_offset(message)
            return messages  # ordered: never given up on (nothing behind it may be skipped)
        max_tries = self.max_tries
        if not max_tries:
            return messages
        if not any(m.attempts > max_tries for m in messages):
            return messages
        kept = []
        for message in messages:
            if message.attempts > max_tries:
                self._give_up(message)
            else:
                kept.append(message)
        return kept

    def prepare_batches(self, batches: list[MessageBatch], responder: Any) -> list[MessageBatch]:
        """:meth:`prepare` for a columnar taker's batches: a Message object is made only for
        what is switched on (the trace log, the ordered-offset check) and for a message given
        up on, which is answered here and taken out of its batch (an emptied batch is left
        out)."""
        tracing, ordered, max_tries = self.tracing, self.ordered, self.max_tries
        if not (tracing or ordered or max_tries):
            return batches
        kept = []
        for batch in batches:
            messages: list[Message] | None = None
            if tracing or ordered:
                messages = messages_of(batch, responder)
                for message in messages:
                    if tracing:
                        self._trace(message)
                    if ordered:
                        self.check_offset(message)
            if ordered or not max_tries:
                kept.append(batch)  # ordered: never given up on
                continue
            attempts = batch.attempts()
            if max(attempts, default=0) <= max_tries:
                kept.append(batch)
                continue
            over = {i for i, a in enumerate(attempts) if a > max_tries}
            messages = messages or messages_of(batch, responder)
            rest = batch._without(over)
            for i in sorted(over):
                self._give_up(messages[i])
            if len(rest):
                kept.append(rest)
        return kept

    def _trace(self, message: Message) -> None:
        trace_logger.info(
            "received topic=%s partition=%s nsqd=%s message_id=%s trace_id=%s offset=%s"
            " attempts=%d at=%.6f",
            self._consumer.topic,
            message.partition,
            message.nsqd_address,
            message.internal_id if message.internal_id is not None else message.id,
            message.trace_id,
            message.offset,
            message.attempts,
            time.time() - (time.monotonic() - message.received_at),
        )

    def _give_up(self, message: Message) -> None:
        """``message`` came more than ``max_tries`` times: tell, run ``giving_up``, FIN."""
        self._count("given_up")
        observers = self._observers.active
        if observers:
            tell(observers, "message_given_up", self._consumer, message)
        giving_up = self._consumer.giving_up
        try:
            if giving_up is not None:
                giving_up(message)
            else:
                logger.warning(
                    "giving up on message %r after %d attempts", message.id, message.attempts
                )
        except Exception:
            logger.exception("giving_up callback failed")
        if not message.has_responded():
            message.finish()

    def check_offset(self, message: Message) -> None:
        """Ordered consumption: a partition's offsets never go down (a redelivery repeats
        the same offset).  When one does (youzan's nsqd sent the partition from an earlier
        offset: a leader back with a shorter queue than it had acknowledged, see
        docs/youzan.rst), log a WARNING, count it (``stats()["out_of_order"]``), tell the
        observers (``message_out_of_order``) and run on_out_of_order."""
        offset, partition = message.offset, message.partition
        if offset is None or partition is None:
            return
        with self._offsets_lock:
            last = self._offsets.get(partition)
            self._offsets[partition] = offset
            if last is None or offset >= last:
                return
        consumer = self._consumer
        logger.warning(
            "topic %s partition %d went backwards: offset %d after offset %d (from %s;"
            " youzan's nsqd sends this partition again from an earlier offset)",
            consumer.topic,
            partition,
            offset,
            last,
            message.nsqd_address,
        )
        self._count("out_of_order")
        observers = self._observers.active
        if observers:
            tell(observers, "message_out_of_order", consumer, message, last)
        run_hook(consumer.on_out_of_order, message, last)


def messages_of(batch: MessageBatch, responder: Any) -> list[Message]:
    """A Message object for each message of ``batch``, answerable one by one."""
    received = Message._received
    return [received(d, responder, batch.conn, batch.received_at) for d in batch.decoded()]
