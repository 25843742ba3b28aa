"""How the embedded nsqd's bytes leave a client connection: in the pieces real nsqd writes them,
and, as a fault control, cut into small random pieces.

Write boundaries decide what a client's reads return (and, under TLS, which bytes share a
record), so they are part of what a client must cope with:

- Snappy: nsqd wraps the connection in Go's ``snappy.Writer``, which writes each chunk with a
  separate ``Write`` for its header (with the stream identifier before the first one) and, when
  the chunk is stored uncompressed, another for its body.  :func:`snappy_writes` cuts
  python-snappy's framed output the same way: an ``OK`` response after the upgrade leaves as 18
  bytes then 10, two TLS records over TLS.
- Splitting (``NSQDOptions.split_writes``; on by default when the environment variable
  ``NSQCLIENT_TESTING_SPLIT_WRITES`` is ``1``): every write is cut into random pieces (many of
  1 to 16 bytes, the rest up to 4 KiB), each handed to the transport on its own pass of the event
  loop, so that the client's reads (and TLS records) end anywhere in a frame.  Set
  ``NSQCLIENT_TESTING_SPLIT_WRITES_SEED`` to replay the same cuts.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections import deque

__all__ = [
    "Output",
    "WriteSplitter",
    "snappy_writes",
    "SPLIT_WRITES_ENV",
    "SPLIT_WRITES_SEED_ENV",
    "split_writes_from_env",
    "split_seed_from_env",
]

#: Environment variable that turns write splitting on for every embedded nsqd (``1``).
SPLIT_WRITES_ENV = "NSQCLIENT_TESTING_SPLIT_WRITES"
#: Environment variable with an integer seed for the cuts (random when unset).
SPLIT_WRITES_SEED_ENV = "NSQCLIENT_TESTING_SPLIT_WRITES_SEED"

_SNAPPY_STREAM_ID = 0xFF
_SNAPPY_UNCOMPRESSED = 0x01


def split_writes_from_env() -> bool:
    """True when :data:`SPLIT_WRITES_ENV` asks for split writes (``1``, ``true``, ``on``)."""
    return os.environ.get(SPLIT_WRITES_ENV, "").strip().lower() in ("1", "true", "on", "yes")


def split_seed_from_env() -> int | None:
    """The seed in :data:`SPLIT_WRITES_SEED_ENV`, or None."""
    text = os.environ.get(SPLIT_WRITES_SEED_ENV, "").strip()
    return int(text) if text else None


def snappy_writes(stream: bytes) -> list[bytes]:
    """The writes Go's ``snappy.Writer`` makes for the framed-stream bytes ``stream``.

    Each chunk is ``[type][3-byte length][4-byte CRC][body]``.  A compressed chunk is one write;
    an uncompressed one is two (its 8-byte header, then its body); the stream identifier goes
    out with the header that follows it.
    """
    pieces: list[bytes] = []
    head = b""
    pos = 0
    n = len(stream)
    while pos + 4 <= n:
        kind = stream[pos]
        end = pos + 4 + int.from_bytes(stream[pos + 1 : pos + 4], "little")
        if kind == _SNAPPY_STREAM_ID:
            head += stream[pos:end]
        elif kind == _SNAPPY_UNCOMPRESSED and end > pos + 8:
            pieces.append(head + stream[pos : pos + 8])
            pieces.append(stream[pos + 8 : end])
            head = b""
        else:
            pieces.append(head + stream[pos:end])
            head = b""
        pos = end
    if head or pos < n:
        pieces.append(head + stream[pos:])
    return pieces


class WriteSplitter:
    """Cuts byte strings into random pieces: half of them 1-16 bytes, the rest up to 4 KiB."""

    def __init__(self, seed: int | str):
        self.rng = random.Random(seed)

    def cut(self, data: bytes) -> list[bytes]:
        """``data`` in pieces, in order (their concatenation is ``data``)."""
        out = []
        pos = 0
        rng = self.rng
        while pos < len(data):
            size = rng.randint(1, 16) if rng.random() < 0.5 else rng.randint(17, 4096)
            out.append(data[pos : pos + size])
            pos += size
        return out


class Output:
    """A connection's way out: each piece goes to the transport as one ``write``, in order.

    With a :class:`WriteSplitter`, pieces are cut further and written one per pass of the event
    loop; :meth:`drain_now` writes whatever is still pending at once (before closing the
    connection or starting TLS on it).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        transport: asyncio.Transport,
        splitter: WriteSplitter | None = None,
    ):
        self.loop = loop
        self.transport = transport
        self.splitter = splitter
        self._pending: deque[bytes] = deque()
        self._scheduled = False

    def write(self, pieces: list[bytes]) -> None:
        """Send ``pieces`` after everything written before."""
        splitter = self.splitter
        if splitter is None:
            for piece in pieces:
                self.transport.write(piece)
            return
        for piece in pieces:
            self._pending.extend(splitter.cut(piece))
        if self._pending and not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._write_one)

    def _write_one(self) -> None:
        self._scheduled = False
        if not self._pending:
            return
        if self.transport.is_closing():
            self._pending.clear()
            return
        self.transport.write(self._pending.popleft())
        if self._pending:
            self._scheduled = True
            self.loop.call_soon(self._write_one)

    def drain_now(self) -> None:
        """Write every pending piece now (still one ``write`` each)."""
        while self._pending:
            piece = self._pending.popleft()
            if not self.transport.is_closing():
                self.transport.write(piece)

    def discard(self) -> None:
        """Forget pending pieces (the connection is gone)."""
        self._pending.clear()
