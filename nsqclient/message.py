"""Message: what a handler receives, and how it answers (finish, requeue, touch)."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Protocol

from .protocol import MESSAGE_HEADER, DecodedMessage

__all__ = ["Message", "MessageResponder", "RequeueMessage", "answer_lock", "claim_all"]

logger = logging.getLogger("nsqclient.message")

#: The lock that guards every message's answered flag (one for all messages, held for two
#: attribute operations, costs less than one per message).  Whoever claims a message's answer
#: sets ``message._responded`` under it (``Message._claim``, ``claim_all``, a Consumer's
#: worker).
answer_lock = threading.Lock()
_claim_lock = answer_lock


def claim_all(messages: list[Message], what: str) -> list[Message]:
    """Claim the one answer of each message (as :meth:`Message.finish` does for one), under one
    lock round; return those claimed.  A message already answered is left out with a warning."""
    claimed = []
    skipped = []
    with _claim_lock:
        for message in messages:
            if message._responded:
                skipped.append(message)
            else:
                message._responded = True
                claimed.append(message)
    for message in skipped:
        logger.warning("message %r already answered; ignoring %s", message.id, what)
    return claimed


class MessageResponder(Protocol):
    """Who sends a message's FIN/REQ/TOUCH: the consumer that received it."""

    def finish_message(self, message: Message) -> None: ...

    def requeue_message(self, message: Message, delay: float | None, backoff: bool) -> None: ...

    def touch_message(self, message: Message) -> None: ...


class RequeueMessage(Exception):  # noqa: N818 - named for what the handler asks, as pynsq does
    """Raise from a handler to requeue the message without logging an error.

    Args:
        delay: seconds before nsqd redelivers it (None: the consumer's default for this attempt).
        backoff: whether this counts as a failure for the consumer's backoff.
    """

    def __init__(self, delay: float | None = None, backoff: bool = True):
        super().__init__(f"requeue (delay={delay}, backoff={backoff})")
        self.delay = delay
        self.backoff = backoff


class Message:
    """A message delivered by nsqd.

    Attributes:
        id: the 16-byte id as nsqd sent it (ASCII hex on classic nsqd, raw on youzan's).
        body: the payload (bytes).
        timestamp: nanoseconds since the epoch when nsqd received it.
        attempts: delivery attempts so far, this one included (1 on first delivery).
        nsqd_address: ``host:port`` of the nsqd it came from.
        partition, internal_id, trace_id, offset, raw_size: youzan's fields (None otherwise;
            ``offset`` and ``raw_size`` only on messages of an ordered subscription).
        ext: youzan, extend-support topics: the message's JSON header as a dict (None when it
            has none, or it is not a JSON object); ``ext_raw`` holds its bytes as sent.

    A handler answers by returning (FIN) or raising/returning False (REQ).  After
    :meth:`enable_async` the handler's return is ignored and the message must be answered
    exactly once with :meth:`finish` or :meth:`requeue`, from any thread.
    """

    __slots__ = (
        "id",
        "body",
        "timestamp",
        "attempts",
        "nsqd_address",
        "partition",
        "internal_id",
        "trace_id",
        "offset",
        "raw_size",
        "ext_version",
        "ext_raw",
        "ext",
        "received_at",
        "touched_at",
        "_responder",
        "_conn",
        "_responded",
        "_async",
    )

    def __init__(
        self,
        decoded: DecodedMessage | bytes,
        body: bytes | None = None,
        timestamp: int = 0,
        attempts: int = 1,
        *,
        responder: MessageResponder | None = None,
        nsqd_address: str = "",
        partition: int | None = None,
        conn: Any = None,
    ):
        if not isinstance(decoded, DecodedMessage):
            # pynsq's form: Message(id, body, timestamp, attempts)
            decoded = DecodedMessage(timestamp, attempts, decoded, body or b"")
        self.id = decoded.id
        self.body = decoded.body
        self.timestamp = decoded.timestamp
        self.attempts = decoded.attempts
        self.internal_id = decoded.internal_id
        self.trace_id = decoded.trace_id
        self.offset = decoded.offset
        self.raw_size = decoded.raw_size
        self.ext_version = decoded.ext_version
        self.ext_raw = decoded.ext
        self.ext = None if decoded.ext is None else _json_header(decoded.ext)
        self.nsqd_address = nsqd_address
        self.partition = partition
        self.received_at = time.monotonic()
        #: monotonic time of the last touch() (None: never touched)
        self.touched_at: float | None = None
        self._responder = responder
        # the Connection it arrived on (the Consumer's; a leaf does not know its type)
        self._conn = conn
        self._responded = False
        self._async = False

    @classmethod
    def _received(
        cls,
        decoded: DecodedMessage,
        responder: MessageResponder,
        conn: Any,
        received_at: float,
    ) -> Message:
        """A message as a Consumer builds it on a reader thread: the constructor's work
        without its argument handling (this runs once per message received)."""
        self = cls.__new__(cls)
        (
            self.timestamp,
            self.attempts,
            self.id,
            self.body,
            self.internal_id,
            self.trace_id,
            self.offset,
            self.raw_size,
            self.ext_version,
            self.ext_raw,
        ) = decoded
        self.ext = None if self.ext_raw is None else _json_header(self.ext_raw)
        self.nsqd_address = conn.address
        self.partition = conn.partition
        self.received_at = received_at
        self.touched_at = None
        self._responder = responder
        self._conn = conn
        self._responded = False
        self._async = False
        return self

    @classmethod
    def _run(
        cls,
        buffer: bytes,
        starts: list[int],
        ends: list[int],
        responder: MessageResponder,
        conn: Any,
        received_at: float,
    ) -> list[Message]:
        """The messages of a run of classic NSQ message frames (``buffer[starts[i]:ends[i]]``,
        see :class:`~nsqclient.protocol.MessageRun`), as a Consumer builds them on a reader
        thread: each decoded straight into its Message, with no tuple in between and no
        youzan field to read (this runs once per message received)."""
        new = cls.__new__
        unpack = MESSAGE_HEADER.unpack_from
        body_at = MESSAGE_HEADER.size
        address, partition = conn.address, conn.partition
        out: list[Message] = []
        append = out.append
        for start, end in zip(starts, ends, strict=True):
            self = new(cls)
            self.timestamp, self.attempts, self.id = unpack(buffer, start)
            self.body = buffer[start + body_at : end]
            self.internal_id = self.trace_id = self.offset = self.raw_size = None
            self.ext_version = self.ext_raw = self.ext = self.touched_at = None
            self.nsqd_address = address
            self.partition = partition
            self.received_at = received_at
            self._responder = responder
            self._conn = conn
            self._responded = self._async = False
            append(self)
        return out

    @property
    def tag(self) -> str | None:
        """The dispatch tag in the message's youzan JSON header
        (``"##client_dispatch_tag"``), or None."""
        if not self.ext:
            return None
        tag = self.ext.get(DISPATCH_TAG_KEY)
        return tag if isinstance(tag, str) and tag else None

    def __repr__(self) -> str:
        return (
            f"<Message id={self.id!r} attempts={self.attempts} "
            f"body={self.body[:32]!r}{'...' if len(self.body) > 32 else ''}>"
        )

    # -- pynsq-compatible surface

    def enable_async(self) -> None:
        """Take over answering: the handler's return value no longer FINs/REQs the message."""
        self._async = True

    def is_async(self) -> bool:
        return self._async

    def has_responded(self) -> bool:
        """True once finish() or requeue() was called."""
        return self._responded

    def _claim(self, what: str) -> bool:
        _claim_lock.acquire()  # not a with statement: two method objects less per answer
        responded = self._responded
        self._responded = True
        _claim_lock.release()
        if responded:
            logger.warning("message %r already answered; ignoring %s", self.id, what)
            return False
        return True

    def finish(self) -> None:
        """Tell nsqd the message is done (FIN).  A second answer is ignored with a warning."""
        if self._claim("finish") and self._responder is not None:
            self._responder.finish_message(self)

    def requeue(self, delay: float | None = None, backoff: bool = True, **kwargs) -> None:
        """Hand the message back to nsqd (REQ) for redelivery after ``delay`` seconds.

        ``delay=None`` uses the consumer's default (default_requeue_delay x attempts, capped).
        ``backoff=True`` counts this as a failure for backoff.  pynsq's ``time_ms`` keyword is
        accepted too (milliseconds).
        """
        if "time_ms" in kwargs:
            time_ms = kwargs.pop("time_ms")
            delay = None if time_ms is None or time_ms < 0 else time_ms / 1000.0
        if kwargs:
            raise TypeError(f"unexpected arguments: {sorted(kwargs)}")
        if delay == -1:  # pynsq's "compute it from the attempts"
            delay = None
        if delay is not None and delay < 0:
            raise ValueError(f"requeue delay must be >= 0 seconds (or -1), not {delay}")
        if self._claim("requeue") and self._responder is not None:
            self._responder.requeue_message(self, delay, backoff)

    def touch(self) -> None:
        """Ask nsqd for more time (resets its msg_timeout for this message)."""
        if self._responded:
            logger.warning("message %r already answered; ignoring touch", self.id)
            return
        self.touched_at = time.monotonic()
        if self._responder is not None:
            self._responder.touch_message(self)


#: the key of youzan's dispatch tag in a message's JSON header
DISPATCH_TAG_KEY = "##client_dispatch_tag"


def _json_header(raw: bytes) -> dict[str, Any] | None:
    """A youzan message header as a dict, or None when it is empty or not a JSON object."""
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
