"""Messages kept as nsqd sent them: the columnar receive path of a pull-mode Consumer.

A Consumer made with ``columnar=True`` (and no handler) makes no Python object per message.
What one socket read brings on one connection becomes one :class:`MessageBatch`: the bytes
read and two lists of offsets into them.  :meth:`Consumer.take_batches
<nsqclient.Consumer.take_batches>` hands batches out; their fields come as lists on
request (:meth:`MessageBatch.bodies`, :meth:`~MessageBatch.ids`, ...) or straight from
:attr:`MessageBatch.buffer` for code that builds columns itself (the Spark source builds Arrow
columns this way); a whole batch is answered with one write (:meth:`MessageBatch.finish`,
:meth:`~MessageBatch.requeue`, :meth:`~MessageBatch.touch`, or
:meth:`Consumer.finish_batches <nsqclient.Consumer.finish_batches>` for many).

The layout of message ``i`` is ``buffer[starts[i]:ends[i]]``::

    [8B timestamp, ns][2B attempts][16B id]                       all NSQ
    [1B ext version]([2B ext size][ext] when the version is not 0) youzan, extend_support
    [8B disk queue offset][4B raw size]                            youzan, ordered (SUB_ORDERED)
    [body]

all numbers big-endian.  On classic nsqd the id is 16 ASCII hex characters; on youzan's it
is ``[8B internal id][8B trace id]``.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple, Protocol

from ..protocol import DecodedMessage, decode_message_at

__all__ = ["MessageBatch", "Origin", "BatchResponder", "HEADER_SIZE", "ID_OFFSET"]

#: bytes before the body of a classic message: timestamp, attempts, id
HEADER_SIZE = 26
#: where the 16-byte id starts in a message
ID_OFFSET = 10
_TIMESTAMP = struct.Struct(">q")
_ATTEMPTS = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_ORDERED_PREFIX = 12  # [8B disk queue offset][4B raw size]

#: answer states of a batch
HELD, ANSWERED, SPLIT = 0, 1, 2


class BatchResponder(Protocol):
    """What answers a batch's messages (a Consumer's responder)."""

    consumer: Any

    def answer_batches(
        self, batches: list[MessageBatch], action: str, delay: float | None, backoff: bool
    ) -> int: ...

    def split_batch(self, batch: MessageBatch, index: int) -> tuple[MessageBatch, MessageBatch]: ...


class Origin(NamedTuple):
    """Where a batch's messages come from and how they are laid out (one per connection)."""

    #: the connection's key (``host:port``, plus ``#partition`` on youzan)
    key: str
    #: the nsqd's ``host:port``
    nsqd_address: str
    #: youzan: the partition the connection consumes (None on classic NSQ)
    partition: int | None = None
    #: the ids are youzan's ``[8B internal id][8B trace id]``
    youzan: bool = False
    #: each message has youzan's ext header after its id
    extended: bool = False
    #: each message has youzan's disk queue offset and raw size before its body
    ordered: bool = False

    @classmethod
    def of(cls, conn: Any, youzan: bool) -> Origin:
        """The origin of what ``conn`` (a :class:`~nsqclient.conn.Connection`) reads."""
        return cls(conn.key, conn.address, conn.partition, youzan, conn.extended, conn.ordered)


class MessageBatch:
    """Messages one connection received in one socket read (or part of them), undecoded.

    Attributes:
        buffer: the bytes read (shared by the batches cut from one read; never changed).
        starts, ends: message ``i`` is ``buffer[starts[i]:ends[i]]`` (see the module doc).
        origin: an :class:`Origin`: where they come from and their layout; its fields are
            also the batch's attributes (``key``, ``nsqd_address``, ``partition``,
            ``youzan``, ``extended``, ``ordered``).
        contiguous: the messages are adjacent frames (``starts[i + 1] == ends[i] + 8``):
            true unless a message was taken out (one given up on at ``max_tries``).
        received_at: ``time.monotonic()`` when it was read.
        touched_at: ``time.monotonic()`` of the last :meth:`touch` (None: never).
        conn: the connection it came on (None for a batch made by hand).

    A batch made by hand (``MessageBatch(buffer, starts, ends, nsqd_address=..., youzan=...)``)
    reads its fields like any other; only a Consumer's batches can be answered.
    """

    __slots__ = (
        "buffer",
        "starts",
        "ends",
        "origin",
        "contiguous",
        "received_at",
        "touched_at",
        "state",
        "conn",
        "notes",
        "_responder",
    )

    def __init__(
        self,
        buffer: bytes,
        starts: list[int],
        ends: list[int],
        origin: Origin | None = None,
        received_at: float = 0.0,
        responder: BatchResponder | None = None,
        conn: Any = None,
        *,
        contiguous: bool = True,
        **layout: Any,
    ):
        if len(starts) != len(ends):
            raise ValueError(f"{len(starts)} starts but {len(ends)} ends")
        if origin is None:
            layout.setdefault("nsqd_address", "")
            origin = Origin(layout.pop("key", "") or layout["nsqd_address"], **layout)
        elif layout:
            raise TypeError(f"give the layout in origin or as keywords, not both: {layout}")
        self.buffer = buffer
        self.starts = starts
        self.ends = ends
        self.origin = origin
        self.contiguous = contiguous
        self.received_at = received_at
        self.touched_at: float | None = None
        #: HELD (to be answered), ANSWERED, or SPLIT (its parts are answered instead)
        self.state = HELD
        self.conn = conn
        #: observers' own data about the batch (None until one sets it); the parts of a split
        #: batch share it
        self.notes: dict[str, Any] | None = None
        self._responder = responder

    key = property(lambda self: self.origin.key, doc="``origin.key``")
    nsqd_address = property(lambda self: self.origin.nsqd_address, doc="``origin.nsqd_address``")
    partition = property(lambda self: self.origin.partition, doc="``origin.partition``")
    youzan = property(lambda self: self.origin.youzan, doc="``origin.youzan``")
    extended = property(lambda self: self.origin.extended, doc="``origin.extended``")
    ordered = property(lambda self: self.origin.ordered, doc="``origin.ordered``")

    @property
    def consumer(self) -> Any:
        """The :class:`~nsqclient.Consumer` that received the batch (answer it there, e.g.
        ``batch.consumer.finish_batches(...)``); None for a batch made by hand."""
        return None if self._responder is None else self._responder.consumer

    def __len__(self) -> int:
        return len(self.starts)

    def __repr__(self) -> str:
        return f"<MessageBatch {len(self.starts)} messages from {self.key or '?'}>"

    def _copy(self, starts: list[int], ends: list[int], contiguous: bool) -> MessageBatch:
        part = MessageBatch.__new__(MessageBatch)
        for name in MessageBatch.__slots__:
            setattr(part, name, getattr(self, name))
        part.starts, part.ends, part.contiguous = starts, ends, contiguous
        part.state = HELD
        return part

    # ------------------------------------------------------------------ layout

    @property
    def header_size(self) -> int | None:
        """Bytes from a message's start to its body when the same for every message (None
        with youzan's ext header, whose size varies)."""
        if self.extended:
            return None
        return HEADER_SIZE + (_ORDERED_PREFIX if self.ordered else 0)

    def body_starts(self) -> list[int]:
        """Where each body starts in :attr:`buffer`."""
        size = self.header_size
        if size is not None:
            return [start + size for start in self.starts]
        buf = self.buffer
        out = []
        for start in self.starts:
            pos = start + HEADER_SIZE
            version = buf[pos]
            pos += 1 if version == 0 else 3 + int.from_bytes(buf[pos + 1 : pos + 3])
            out.append(pos + (_ORDERED_PREFIX if self.ordered else 0))
        return out

    # ------------------------------------------------------------------ fields

    def ids(self) -> list[bytes]:
        """The 16-byte ids, as nsqd sent them (what FIN, REQ and TOUCH echo)."""
        buf = self.buffer
        return [buf[start + 10 : start + 26] for start in self.starts]

    def bodies(self) -> list[bytes]:
        """The bodies."""
        buf = self.buffer
        return [buf[s:e] for s, e in zip(self.body_starts(), self.ends, strict=True)]

    def timestamps(self) -> list[int]:
        """When nsqd received each message, nanoseconds since the epoch."""
        unpack = _TIMESTAMP.unpack_from
        buf = self.buffer
        return [unpack(buf, start)[0] for start in self.starts]

    def attempts(self) -> list[int]:
        """How many times nsqd has sent each message (1 the first time)."""
        unpack = _ATTEMPTS.unpack_from
        buf = self.buffer
        return [unpack(buf, start + 8)[0] for start in self.starts]

    def trace_ids(self) -> list[int | None]:
        """youzan: each message's trace id (the id's last 8 bytes); None each elsewhere."""
        if not (self.youzan or self.extended or self.ordered):
            return [None] * len(self.starts)
        unpack = _U64.unpack_from
        buf = self.buffer
        return [unpack(buf, start + 18)[0] for start in self.starts]

    def offsets(self) -> list[int | None]:
        """youzan, ordered: each message's disk queue offset; None each elsewhere."""
        if not self.ordered:
            return [None] * len(self.starts)
        unpack = _U64.unpack_from
        buf = self.buffer
        return [unpack(buf, body - _ORDERED_PREFIX)[0] for body in self.body_starts()]

    def decoded(self) -> list[DecodedMessage]:
        """Every field of each message (a :class:`~nsqclient.protocol.DecodedMessage`)."""
        buf, youzan, extended, ordered = self.buffer, self.youzan, self.extended, self.ordered
        return [
            decode_message_at(buf, start, end, youzan, extended, ordered)
            for start, end in zip(self.starts, self.ends, strict=True)
        ]

    # ------------------------------------------------------------------ cutting

    def split(self, index: int) -> tuple[MessageBatch, MessageBatch]:
        """This batch as two: its first ``index`` messages and the rest, each to be answered
        on its own; this one is answered by answering both.

        Raises:
            ValueError: the batch was answered or split already.
        """
        if self._responder is not None:
            return self._responder.split_batch(self, index)
        return self._cut(index)

    def _cut(self, index: int) -> tuple[MessageBatch, MessageBatch]:
        """:meth:`split` without the Consumer's bookkeeping (for the Consumer's own use, under
        its lock or before the batch is handed out)."""
        if self.state != HELD:
            raise ValueError(f"{self!r} was {'split' if self.state == SPLIT else 'answered'}")
        index = max(0, min(index, len(self.starts)))
        head = self._copy(self.starts[:index], self.ends[:index], self.contiguous)
        tail = self._copy(self.starts[index:], self.ends[index:], self.contiguous)
        self.state = SPLIT
        return head, tail

    def _without(self, indexes: set[int]) -> MessageBatch:
        """A batch of the messages but those at ``indexes`` (this one is then split); for the
        Consumer's own use, before the batch is handed out."""
        keep = [i for i in range(len(self.starts)) if i not in indexes]
        part = self._copy(
            [self.starts[i] for i in keep],
            [self.ends[i] for i in keep],
            self.contiguous and not indexes,
        )
        self.state = SPLIT
        return part

    # ------------------------------------------------------------------ answers

    def has_responded(self) -> bool:
        """True once the batch was answered (or split: its parts are answered instead)."""
        return self.state != HELD

    def finish(self) -> int:
        """FIN every message, one write; return how many (0 if answered already)."""
        return self._answer("finish", None, False)

    def requeue(self, delay: float | None = 0.0, backoff: bool = False) -> int:
        """REQ every message, one write; ``delay`` in seconds (None: each message's default,
        as ``message.requeue()``); ``backoff``: count each as a failure.  Return how many."""
        return self._answer("requeue", delay, backoff)

    def touch(self) -> int:
        """TOUCH every message (nsqd restarts their timeout), one write; return how many."""
        return self._answer("touch", None, False)

    def _answer(self, action: str, delay: float | None, backoff: bool) -> int:
        if self._responder is None:
            raise RuntimeError(f"{self!r} was not received by a Consumer")
        return self._responder.answer_batches([self], action, delay, backoff)
