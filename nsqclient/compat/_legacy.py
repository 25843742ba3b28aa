"""pynsq 0.9.1's public names below Reader and Writer: its command encoders, frame decoding,
``BackoffTimer``, ``SyncConn`` and ``AsyncConn``.

``import nsqclient as nsq`` finds them at the top level with pynsq's signatures:

* The encoders (``identify``, ``subscribe``, ``ready``, ``finish``, ``touch``, ``requeue``,
  ``nop``, ``pub``, ``mpub``, ``dpub``) return the bytes pynsq's returned.  Unlike pynsq's, they
  refuse what nsqd would refuse (an invalid name, an empty body or MPUB, a message id that is not
  16 bytes) with ValueError/TypeError instead of sending it; ``str`` bodies are sent as UTF-8
  (pynsq raised AssertionError).
* ``unpack_response`` and ``decode_message`` read frames as pynsq's did.
* ``BackoffTimer`` computes pynsq's intervals exactly (seconds, Decimal arithmetic), for programs
  that used it for their own retries.  nsqclient's Reader does not use it (see
  :mod:`nsqclient.backoff`).
* ``SyncConn`` is pynsq's blocking socket connection, fully working: ``connect``, ``send``,
  ``read_response``, plus ``close``.
* ``AsyncConn`` was pynsq's tornado connection, driven by the IOLoop's callbacks.  Making one
  raises NotImplementedError naming what to use instead.

``__all__`` is the one list of these names: ``nsqclient.compat`` and the top level re-export
it.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from .. import protocol
from ..checks import check_float
from ..errors import ConnectionClosedError, ProtocolError
from ..message import Message
from ..protocol import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE, MAGIC_V2

#: pynsq's names below Reader and Writer (and DPUB's encoder), each at nsqclient's top level.
__all__ = [
    "FRAME_TYPE_RESPONSE",
    "FRAME_TYPE_ERROR",
    "FRAME_TYPE_MESSAGE",
    "unpack_response",
    "decode_message",
    "valid_topic_name",
    "valid_channel_name",
    "identify",
    "subscribe",
    "ready",
    "finish",
    "touch",
    "requeue",
    "nop",
    "pub",
    "mpub",
    "dpub",
    "BackoffTimer",
    "SyncConn",
    "AsyncConn",
]

_I32 = struct.Struct(">l")

# ============================================================================ frames


def unpack_response(data: bytes) -> tuple[int, bytes]:
    """A frame without its size prefix, ``[4B frame type][data]`` -> ``(frame type, data)``."""
    return _I32.unpack_from(data, 0)[0], data[4:]


def decode_message(data: bytes) -> Message:
    """A message frame's data, ``[8B timestamp ns][2B attempts][16B id][body]`` ->
    :class:`~nsqclient.Message` (attached to no connection: it cannot be finished)."""
    return Message(protocol.decode_message(data))


def valid_topic_name(topic: str) -> bool:
    """True for a name nsqd accepts as a topic (1-64 of ``.a-zA-Z0-9_-``, optional
    ``#ephemeral``)."""
    return protocol.valid_topic_name(topic)


def valid_channel_name(channel: str) -> bool:
    """True for a name nsqd accepts as a channel (same rule as topics)."""
    return protocol.valid_channel_name(channel)


# ============================================================================ commands


def identify(data: dict[str, Any]) -> bytes:
    """``IDENTIFY\\n[4B size][JSON]``, the JSON written as pynsq wrote it (``json.dumps``
    defaults), so the bytes are pynsq's."""
    if not isinstance(data, dict):
        raise TypeError(f"identify takes a dict, not {type(data).__name__}")
    body = json.dumps(data).encode("utf-8")
    return b"IDENTIFY\n" + _I32.pack(len(body)) + body


def subscribe(topic: str, channel: str) -> bytes:
    """``SUB <topic> <channel>\\n``; ValueError for an invalid name."""
    return protocol.sub(topic, channel)


def ready(count: int) -> bytes:
    """``RDY <count>\\n`` (count: messages, >= 0)."""
    return protocol.rdy(count)


def finish(id: bytes | str) -> bytes:  # noqa: A002 - pynsq's argument name
    """``FIN <id>\\n`` (id: the message's 16 bytes)."""
    return protocol.fin(id)


def touch(id: bytes | str) -> bytes:  # noqa: A002
    """``TOUCH <id>\\n``."""
    return protocol.touch(id)


def requeue(id: bytes | str, time_ms: int = 0) -> bytes:  # noqa: A002
    """``REQ <id> <time_ms>\\n`` (time_ms: MILLISECONDS before nsqd redelivers)."""
    return protocol.req(id, time_ms)


def nop() -> bytes:
    """``NOP\\n``."""
    return protocol.nop()


def pub(topic: str, data: bytes) -> bytes:
    """``PUB <topic>\\n[4B size][body]``."""
    return protocol.pub(topic, data)


def mpub(topic: str, data: Sequence[bytes]) -> bytes:
    """``MPUB <topic>\\n[4B size][4B count]([4B size][body])*``."""
    return protocol.mpub(topic, data)


def dpub(topic: str, delay_ms: int, data: bytes) -> bytes:
    """``DPUB <topic> <delay_ms>\\n[4B size][body]`` (delay_ms: MILLISECONDS)."""
    return protocol.dpub(topic, delay_ms, data)


# ============================================================================ BackoffTimer


def _decimal(value: Any, name: str) -> Decimal:
    if isinstance(value, Decimal):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, not {value!r}")
    return Decimal(str(value))


class BackoffTimer:
    """pynsq's BackoffTimer: an interval (seconds) between ``min_interval`` and ``max_interval``
    that grows with each :meth:`failure` and shrinks with each :meth:`success`.

    It is the sum of ``min_interval`` and two parts: a short one that takes ``short_length``
    failures to reach ``ratio`` of the range, and a long one that takes ``long_length`` failures
    to reach the rest.  A success takes one step off each part.  The values are pynsq's exactly.

    Args:
        min_interval: seconds, the interval with no failure.
        max_interval: seconds, the interval after enough failures.
        ratio: the share of the range the short part covers (0..1).
        short_length: failures to fill the short part.
        long_length: failures to fill the long part.
    """

    def __init__(
        self,
        min_interval: float | Decimal,
        max_interval: float | Decimal,
        ratio: float = 0.25,
        short_length: int = 10,
        long_length: int = 250,
    ):
        self.min_interval = _decimal(min_interval, "min_interval")
        self.max_interval = _decimal(max_interval, "max_interval")
        if self.max_interval < self.min_interval:
            raise ValueError(
                f"max_interval ({max_interval}) must be >= min_interval ({min_interval})"
            )
        share = _decimal(check_float(ratio, "ratio", min=0.0, max=1.0), "ratio")
        if short_length < 1 or long_length < 1:
            raise ValueError("short_length and long_length must be at least 1 failure")
        span = self.max_interval - self.min_interval
        self.max_short_timer = span * share
        self.max_long_timer = span * (1 - share)
        self.short_unit = self.max_short_timer / Decimal(short_length)
        self.long_unit = self.max_long_timer / Decimal(long_length)
        self.short_interval = Decimal(0)
        self.long_interval = Decimal(0)
        self.interval = 0.0
        self.update_interval()

    def success(self) -> None:
        """One step down; nothing when the interval is already 0."""
        if self.interval == 0.0:
            return
        self.short_interval = max(self.short_interval - self.short_unit, Decimal(0))
        self.long_interval = max(self.long_interval - self.long_unit, Decimal(0))
        self.update_interval()

    def failure(self) -> None:
        """One step up, each part capped at its share of the range."""
        self.short_interval = min(self.short_interval + self.short_unit, self.max_short_timer)
        self.long_interval = min(self.long_interval + self.long_unit, self.max_long_timer)
        self.update_interval()

    def update_interval(self) -> None:
        """Recompute ``self.interval`` (seconds, a float) from the two parts."""
        self.interval = float(self.min_interval + self.short_interval + self.long_interval)

    def get_interval(self) -> float:
        """The current interval in seconds."""
        return self.interval


# ============================================================================ SyncConn


class SyncConn:
    """pynsq's blocking connection to one nsqd: no threads, no handshake of its own.

    Args:
        timeout: seconds, for the connect and for each socket read and write.

    ``connect(host, port)`` sends the protocol magic; ``send(command)`` writes bytes made by the
    encoders above; ``read_response()`` returns one frame without its size prefix (give it to
    :func:`unpack_response`).  Heartbeats are the caller's to answer (``send(nop())``).
    """

    def __init__(self, timeout: float = 1.0):
        self.timeout = check_float(timeout, "timeout", "seconds", min=0.0)
        self.buffer = b""
        self.s: socket.socket | None = None

    def connect(self, host: str, port: int) -> None:
        """Connect to nsqd at ``host:port`` and send the magic ``"  V2"``."""
        if not isinstance(host, str):
            raise TypeError(f"host must be a str, not {host!r}")
        if isinstance(port, bool) or not isinstance(port, int):
            raise TypeError(f"port must be an int, not {port!r}")
        self.s = socket.create_connection((host, port), timeout=self.timeout)
        self.buffer = b""
        self.send(MAGIC_V2)

    def _socket(self) -> socket.socket:
        if self.s is None:
            raise ConnectionClosedError("SyncConn is not connected: call connect(host, port)")
        return self.s

    def send(self, data: bytes) -> None:
        """Write all of ``data`` (within ``timeout`` seconds)."""
        self._socket().sendall(data)

    def _readn(self, size: int) -> bytes:
        sock = self._socket()
        while len(self.buffer) < size:
            packet = sock.recv(max(4096, size - len(self.buffer)))
            if not packet:
                raise ConnectionClosedError(
                    f"nsqd closed the connection while {size} bytes were expected",
                    maybe_processed=True,
                )
            self.buffer += packet
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def read_response(self) -> bytes:
        """One frame, ``[4B frame type][data]``, without its size prefix."""
        size = _I32.unpack(self._readn(4))[0]
        if size < 4:
            raise ProtocolError(f"frame size {size} is smaller than its frame type")
        return self._readn(size)

    def close(self) -> None:
        """Close the socket (not pynsq API: pynsq left it to the garbage collector)."""
        if self.s is not None:
            self.s.close()
            self.s = None


# ============================================================================ AsyncConn


class AsyncConn:
    """pynsq's tornado connection (an event emitter driven by the IOLoop).  nsqclient has none:
    making one raises NotImplementedError that names what to use instead.  The signature is
    pynsq's, so that code that only names the class (``isinstance``, a subclass) still imports."""

    def __init__(
        self,
        host: str,
        port: int,
        timeout: float = 1.0,
        heartbeat_interval: int = 30,
        requeue_delay: int = 90,
        tls_v1: bool = False,
        tls_options: dict[str, Any] | None = None,
        snappy: bool = False,
        deflate: bool = False,
        deflate_level: int = 6,
        user_agent: str | None = None,
        output_buffer_size: int = 16 * 1024,
        output_buffer_timeout: int = 250,
        sample_rate: int = 0,
        auth_secret: str | None = None,
        msg_timeout: int | None = None,
        hostname: str | None = None,
    ):
        raise NotImplementedError(
            "nsq.AsyncConn is pynsq's tornado connection and has no nsqclient equivalent: use "
            "nsqclient.Reader/Writer (or Consumer/Producer) for consuming and publishing, "
            "nsqclient.conn.Connection for one threaded connection, or nsqclient.SyncConn for a "
            "blocking socket"
        )
