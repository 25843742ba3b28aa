"""The connection layer: one TCP connection to one nsqd, under both clients.

A :class:`Connection` owns its socket, a reader thread and a writer thread; its transport
(TCP, TLS, snappy, deflate), the IDENTIFY/AUTH handshake, the FIFO of pending requests and the
Futures they answer.  Most programs never use it directly: a Producer and a Consumer make and
own theirs.
"""

from ._awaiting import aresult
from ._connection import Connection, ConnectionDelegate, ConnectionState
from ._futures import AnyFuture, RequestFuture, Waiter, failure_of, wait_answered

__all__ = [
    "AnyFuture",
    "Connection",
    "ConnectionDelegate",
    "ConnectionState",
    "RequestFuture",
    "Waiter",
    "aresult",
    "failure_of",
    "wait_answered",
]
