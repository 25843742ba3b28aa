"""Connection: one TCP connection to one nsqd.

The handshake (magic, IDENTIFY, TLS/snappy/deflate upgrades, AUTH) runs in the thread that calls
:meth:`Connection.connect`.  After it, one thread at a time reads the socket: the reader thread,
or (caller-reads mode, epoll only) a blocking requester reading its own answer while the reader
sleeps (:meth:`read_until`).  A writer thread sends what other threads queue in one write; a
request made while no other is in flight is written by its caller under the same send lock (one
thread hand-off less per idle ``pub()``).  Writes stay whole, requests reach nsqd in the order of
their pending answers, and only one thread at a time is ever inside the transport's write path.
Any thread may send:

* :meth:`Connection.send` for commands nsqd does not answer on success (RDY, FIN, REQ, TOUCH, NOP);
  :meth:`Connection.queue_fin` for a consumer's FIN of one message, the FINs queued meanwhile
  joined into one command (written after every command queued before them), and
  :meth:`Connection.write_queued` for a worker that would rather write them itself than wait;
* :meth:`Connection.request` for commands it answers (PUB, MPUB, DPUB, SUB, CLS...): the returned
  Future resolves with the response bytes, or fails with the typed error nsqd sent.  Responses
  are matched to requests in order (FIFO), which is how nsqd answers them.  With
  ``Connection.join_limit`` set (a Producer sets it), PUBs of one topic that queue up one
  after another are written as one MPUB, whose answer is each of theirs.

Whichever thread reads (the reader thread, or a requester reading its own answer) answers
heartbeats itself (a NOP, queued for the writer), completes the requests answered, and hands
messages and connection events to a delegate.  Delegate callbacks run on that thread and must
not block; no handler or hook of a Consumer runs there, but a request Future's done callbacks
do (they run on the thread that completes the Future).
"""

from __future__ import annotations

import enum
import logging
import os
import queue
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol, overload

from .. import protocol
from ..addresses import split_host_port
from ..config import Config
from ..errors import (
    ConnectionClosedError,
    NSQError,
    NSQTimeoutError,
    ServerError,
    error_from_frame,
)
from ..platforms import HAS_EPOLL
from ..protocol import DecodedMessage, FrameReader
from ._answer_wait import answer_wait
from ._future_internals import deliver_all
from ._futures import AnyFuture, RequestFuture, Waiter, forwarding_to, wait_answered
from ._handshake import open_transport
from ._joined_pubs import join_pubs
from ._pending import Pending, expired_error
from ._transport import Transport

__all__ = [
    "Connection",
    "ConnectionDelegate",
    "ConnectionState",
    "RequestFuture",
    "Waiter",
]

logger = logging.getLogger("nsqclient.conn")

#: the reader's wait for answers to pile up (see _answer_wait.py); a name of its own for tests
_sleep = time.sleep

#: nsqd's refusals of an MPUB for its size, before it stores anything (see _joined_failed)
_JOIN_REFUSALS = frozenset({"E_BAD_BODY", "E_BAD_MESSAGE"})

_STOP = object()
#: queued for the writer: requests wait in the connection's Pending (see offer())
_REQUESTS = object()
#: queued for the writer: commands and message ids to FIN wait in the connection's deques
_WAKE = object()
#: bytes of queued requests joined into one socket write at most (one command may be more);
#: commands, which are small, are cut into writes of about this size when there are more
_WRITE_SIZE = 64 * 1024
# Error codes nsqd sends for FIN/REQ/TOUCH, which have no pending request of their own.
_UNSOLICITED = frozenset({"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"})


class ConnectionState(enum.Enum):
    INIT = "init"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    CLOSING = "closing"
    CLOSED = "closed"


_CONNECTED = ConnectionState.CONNECTED  # (an Enum member read is ~10x a global's)


class ConnectionDelegate(Protocol):
    """What a Connection tells its owner.  These methods run on the thread reading the socket
    (the reader thread; in caller-reads mode, possibly a requester reading its own answer)
    and must not block.  A delegate may also have ``on_state_change(conn, old, new)``
    (optional), called on whichever thread moved the connection from one
    :class:`ConnectionState` to the next, and ``on_messages(conn, messages)`` (optional),
    which takes every message of one socket read at once, in order, instead of one
    ``on_message`` call each, or ``on_message_run(conn, run)`` (optional), which takes them
    undecoded (a :class:`~nsqclient.protocol.MessageRun`)."""

    def on_message(self, conn: Connection, message: DecodedMessage) -> None: ...

    def on_server_error(self, conn: Connection, error: ServerError) -> None: ...

    def on_close(self, conn: Connection, reason: BaseException | None) -> None: ...


class Connection:
    """A connection to one nsqd.  See the module docstring for the threading model.

    Args:
        address: ``"host:port"`` of the nsqd TCP port.
        config: a :class:`~nsqclient.config.Config` (timeouts in seconds).
        delegate: receives messages, unsolicited errors and the close event.
    """

    def __init__(
        self,
        address: str,
        config: Config | None = None,
        delegate: Any = None,
        caller_reads: bool = False,
    ):
        self.host, self.port = split_host_port(address)
        self.address = f"{self.host}:{self.port}"
        self.config = config or Config()
        self.delegate = delegate
        self.state = ConnectionState.INIT
        self.identify_response: dict[str, Any] = {}
        self.auth_response: dict[str, Any] | None = None
        self.extended = False
        #: set by a consumer that subscribed with SUB_ORDERED/SUB_ADVANCED
        self.ordered = False
        #: the youzan partition a consumer subscribed to on this connection (None: classic)
        self.partition: int | None = None
        #: the consumer's name for this connection: the address, plus ``#partition``
        self.key = self.address
        #: when the last message frames were read (``time.monotonic()``)
        self.last_message_at = 0.0
        self.close_reason: BaseException | None = None
        self._fatal_error: ServerError | None = None
        self._write_error: BaseException | None = None
        self.messages_received = 0
        #: messages in the PUB/MPUB/DPUB written (counted as queued, as the caller said)
        self.messages_sent = 0
        #: bytes: PUBs of one topic queued one after another are written as one MPUB with a
        #: body of at most this size, answered once for all of them (0: each PUB on its own)
        self.join_limit = 0
        #: PUB requests written inside such MPUBs
        self.pubs_joined = 0
        #: nsqd's fatal error to a joined MPUB (its PUBs fail as not processed, so that their
        #: owner may send them again, one by one); None: none refused
        self.join_refused: ServerError | None = None
        self._refused: list[RequestFuture | Waiter] = []
        self.pid = os.getpid()
        self._transport: Transport | None = None
        #: what wakes the writer: _WAKE, _REQUESTS and _STOP (the data waits elsewhere)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        #: the commands queued (RDY, TOUCH, REQ, NOP...), and the ids queue_fin() was given;
        #: taken only with the send lock held, so whoever holds it writes them in order
        self._out: deque[bytes] = deque()
        self._fins: deque[bytes] = deque()
        #: a _WAKE is in the queue for them (cleared by the writer before it takes them)
        self._woken = False
        #: :meth:`send` without its check of the state: what is queued once the connection is
        #: closed is dropped (a Consumer's FIN per message: nsqd sends that message again)
        self.queue_command: Callable[[bytes], None] = self._queue_out
        #: requests awaiting nsqd's answer, oldest first (guarded by _lock)
        self._pending = Pending()
        self._lock = threading.Lock()
        # Held by whoever writes the socket: the writer thread or a caller writing directly.
        self._send_lock = threading.Lock()
        #: called with a RequestFuture that failed with nobody looking (a Producer's ledger)
        self.on_request_failed: Callable[[RequestFuture], None] | None = None
        self._closed_event = threading.Event()
        self._abort = threading.Event()
        self._sock: socket.socket | None = None
        self._reader: threading.Thread | None = None
        self._writer: threading.Thread | None = None
        #: a blocking requester may read its own answer (see read_until); plain transports only
        self._caller_reads = caller_reads
        # Held by whichever thread reads the socket, in caller-reads mode (see _poll_read_loop).
        self._read_lock = threading.Lock()
        self._frames = FrameReader(self.config.max_frame_size, peer=self.address)
        self._last_read = 0.0
        self._read_error: BaseException | None = None
        self._epoll: Any = None  # the reader's select.epoll, in caller-reads mode

    def __repr__(self) -> str:
        return f"<Connection {self.address} {self.state.value}>"

    # ---------------------------------------------------------------- negotiated values

    @property
    def max_rdy_count(self) -> int:
        """The largest RDY this nsqd accepts (2500 when it did not say)."""
        return int(self.identify_response.get("max_rdy_count", 2500))

    @property
    def msg_timeout(self) -> float:
        """Seconds nsqd waits for FIN/REQ/TOUCH on this connection (60 when it did not say)."""
        return self.identify_response.get("msg_timeout", 60000) / 1000.0

    @property
    def max_msg_timeout(self) -> float:
        """Seconds: the most TOUCH can extend a message's timeout."""
        return self.identify_response.get("max_msg_timeout", 900000) / 1000.0

    @property
    def is_connected(self) -> bool:
        """True while requests can be sent (not after nsqd sent a fatal error)."""
        return self.state is ConnectionState.CONNECTED and self._fatal_error is None

    @property
    def is_closed(self) -> bool:
        return self.state is ConnectionState.CLOSED

    # ---------------------------------------------------------------- handshake

    def connect(self, deadline: float | None = None, deadline_name: str = "deadline") -> None:
        """Dial, handshake, start the reader and writer threads.

        The dial is bounded by ``dial_timeout`` and the whole handshake (magic, IDENTIFY, TLS
        and compression upgrades, AUTH) by ``handshake_timeout``, whatever the peer does
        (a peer dripping one byte a second included).  ``deadline``, a ``time.monotonic()``
        value, bounds both together when it comes first (a publish's own timeout); a timeout
        error names the limit that fired: ``dial_timeout``, ``handshake_timeout`` or
        ``deadline_name``.

        Raises:
            NSQError: nsqd refused or broke the handshake (a subclass says how:
                ServerError, AuthRequiredError, ProtocolError, NSQTimeoutError).
            OSError: the connection cannot be made.

        Nothing is left open on failure.
        """
        if self.state is not ConnectionState.INIT:
            raise NSQError(f"connect() called on a connection in state {self.state.value}")
        self._set_state(ConnectionState.CONNECTING)
        try:
            opened = open_transport(
                self.address,
                self.host,
                self.port,
                self.config,
                deadline,
                deadline_name,
                self._abort,
                self._keep_socket,
            )
        except BaseException as exc:
            self.close_reason = exc
            self._set_state(ConnectionState.CLOSED)
            self._closed_event.set()
            raise
        self._transport = transport = opened.transport
        self.identify_response = opened.identify_response
        self.auth_response = opened.auth_response
        self.extended = bool(self.config.extend_support)
        transport.set_timeouts(self._read_deadline(), self.config.write_timeout)
        # TLS may need to send records while reading; the reader never writes.
        transport.set_output_callback(lambda: self._queue_out(b""))
        self._set_state(ConnectionState.CONNECTED)
        assert self._transport is not None
        self._caller_reads = self._caller_reads and self._transport.plain and HAS_EPOLL
        if self._caller_reads:
            self._epoll = select.epoll()
            self._epoll.register(self._transport.fileno(), select.EPOLLIN | select.EPOLLPRI)
        self._last_read = time.monotonic()
        self._reader = threading.Thread(
            target=self._poll_read_loop if self._caller_reads else self._read_loop,
            name=f"nsq-reader-{self.address}",
            daemon=True,
        )
        self._writer = threading.Thread(
            target=self._write_loop, name=f"nsq-writer-{self.address}", daemon=True
        )
        self._writer.start()
        self._reader.start()
        logger.debug("connected to %s: %s", self.address, self.identify_response)

    def _set_state(self, new: ConnectionState) -> None:
        old, self.state = self.state, new
        self._report_state(old, new)

    def _report_state(self, old: ConnectionState, new: ConnectionState) -> None:
        """Log a state change and tell the delegate; never called under ``self._lock``."""
        logger.debug("%s: %s -> %s", self.address, old.value, new.value)
        hook = getattr(self.delegate, "on_state_change", None)
        if hook is not None:
            try:
                hook(self, old, new)
            except Exception:
                logger.exception("on_state_change delegate of %s failed", self.address)

    def abort_connect(self) -> None:
        """From another thread: make a :meth:`connect` in progress fail at once (its socket is
        shut down) instead of waiting out a handshake that a hung nsqd never answers.  The
        dial itself is bounded by ``dial_timeout``."""
        self._abort.set()
        self._shutdown_socket()

    def _keep_socket(self, sock: socket.socket) -> None:
        self._sock = sock

    def _shutdown_socket(self) -> None:
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _read_deadline(self) -> float:
        """Seconds of silence after which nsqd is taken for dead."""
        cfg = self.config
        deadline = cfg.read_timeout
        if cfg.heartbeat_interval > 0:
            deadline = min(deadline, 2 * cfg.heartbeat_interval + min(cfg.heartbeat_interval, 5.0))
        return deadline

    # ---------------------------------------------------------------- commands

    def send(self, command: bytes) -> None:
        """Queue a command nsqd answers only on failure (RDY, FIN, REQ, TOUCH, NOP).

        Raises ConnectionClosedError if the connection is closed.
        """
        if self.state is ConnectionState.CLOSED:
            raise ConnectionClosedError(f"connection to {self.address} is closed")
        self._queue_out(command)

    def _queue_out(self, command: bytes) -> None:
        self._out.append(command)
        if not self._woken:
            self._woken = True
            self._queue.put(_WAKE)

    def queue_fin(self, message_id: bytes) -> None:
        """Queue FIN for ``message_id`` (as nsqd sent it: not checked), as
        ``queue_command(protocol.fin(message_id))`` does: dropped once the connection is
        closed (nsqd sends the message again).  The ids queued meanwhile go out joined into
        one command, after every command queued before them, so that a message's TOUCH never
        reaches nsqd after its FIN; the join costs less than a command per FIN."""
        self._fins.append(message_id)
        if not self._woken:
            self._woken = True
            self._queue.put(_WAKE)

    def write_queued(self) -> None:
        """Write the commands and FINs queued so far on the caller's thread, unless another
        thread is writing (the writer, woken for them, takes them then): for a consumer's
        worker done with a run of messages, whose FINs then go out without a thread hand-off.
        Only while connected: closing, the writer writes them before it stops; once closed
        they are dropped.  A failed write closes the connection."""
        lock = self._send_lock
        if not (self._fins or self._out) or not lock.acquire(blocking=False):
            return
        try:
            # Under the send lock: close() marks the connection closing before the writer's
            # last write, so nothing is written here once that write is made.
            state, transport = self.state, self._transport
            if state is _CONNECTED and transport is not None:
                _send_items(transport, self._take_queued())
            elif state is ConnectionState.CLOSED:
                self._fins.clear()
                self._out.clear()
        except (OSError, NSQError, ValueError) as exc:
            self._write_failed(exc)
        finally:
            lock.release()

    def _take_queued(self) -> list[bytes]:
        """The commands queued, then one FIN for the ids queued; the send lock is held."""
        fins = self._fins
        # The ids first: every command queued before them is in self._out by now.
        ids = [fins.popleft() for _ in range(len(fins))] if fins else None
        out = self._out
        items = [out.popleft() for _ in range(len(out))] if out else []
        if ids:
            items.append(b"FIN " + b"\nFIN ".join(ids) + b"\n")
        return items

    @overload
    def request(self, command: bytes, future: None = None, messages: int = 0) -> Future: ...

    @overload
    def request(self, command: bytes, future: AnyFuture, messages: int = 0) -> AnyFuture: ...

    def request(
        self, command: bytes, future: Future | Waiter | None = None, messages: int = 0
    ) -> Future | Waiter:
        """Queue a command nsqd answers (PUB, MPUB, DPUB, SUB, CLS...); return its Future
        (``future`` if given: a fresh Future or :class:`~nsqclient.conn.Waiter`).
        ``messages``: how many messages the command publishes, for :meth:`stats`.

        The Future's result is the response bytes (``b"OK"``, the 30-byte traced reply...), or
        it fails with the ServerError nsqd sent, or ConnectionClosedError when the connection
        closes first.  Never left waiting forever once the connection is gone.
        """
        given = future
        if future is None:
            future = RequestFuture()
        elif not isinstance(future, RequestFuture | Waiter):
            future = forwarding_to(future)
        if not self.offer(command, future, messages):
            self._fail_request(
                future,
                ConnectionClosedError(
                    f"connection to {self.address} is {self.state.value}", False, self.address
                ),
            )
        return future if given is None or given is future else given

    def offer(self, command: bytes, future: RequestFuture | Waiter, messages: int = 0) -> bool:
        """:meth:`request` for a ``future`` that is already running: False, and ``future``
        left as it is (it may go to another connection), when this connection does not take
        requests any more (not connected, or after nsqd's fatal error)."""
        lock = self._lock
        lock.acquire()  # not a with statement: it costs a lookup and two method objects
        try:
            if self.state is not _CONNECTED or self._fatal_error is not None:
                return False
            pending = self._pending
            pending.items.append(future)
            self.messages_sent += messages
            unsent = pending.unsent
            if unsent:  # the writer has been woken for those: it takes this one too
                unsent.append(command)
                return True
            # Every earlier request written and no one writing: write it here rather than wake
            # the writer, when the caller is about to block on the answer anyway (a Waiter) or
            # nothing else is in flight; a caller pipelining futures leaves the writing to the
            # writer, which joins them.  Otherwise the writer takes it from self._pending, in
            # the order of the answers.  It may pass queued FIN/RDY/NOP, which get no answer
            # and need no order relative to it.
            direct = (
                type(future) is Waiter or len(pending.items) - pending.head == 1
            ) and self._send_lock.acquire(blocking=False)
            if not direct:
                unsent.append(command)
        finally:
            lock.release()
        if direct:
            self._write_direct(command, future)
        else:
            self._queue.put(_REQUESTS)
        return True

    def _write_direct(self, command: bytes, future: RequestFuture | Waiter) -> None:
        """Write a request on the caller's thread; the send lock is held (and released here)."""
        if self._caller_reads and type(future) is Waiter:
            # Its caller will wait for this answer: claim the reading before writing, so
            # that the reader thread is not woken for it (see read_until).
            future.reading = self._claim_reading()
        try:
            self._transport.sendall(command)  # type: ignore[union-attr]
        except (OSError, NSQError, ValueError) as exc:
            self._write_failed(exc)  # the reader then fails the pending request
        finally:
            self._send_lock.release()

    def pending_count(self) -> int:
        """Requests sent and not answered yet."""
        with self._lock:
            return self._pending.count()

    def pending_requests(self) -> list[RequestFuture | Waiter]:
        """The futures of the requests sent and not answered yet, oldest first."""
        with self._lock:
            return self._pending.waiting()

    def _answer_oks(self, count: int) -> None:
        """``count`` OK responses at once: the oldest ``count`` pending requests get ``b"OK"``
        (one lock round for all, where :meth:`_dispatch` takes one each)."""
        with self._lock:
            futures = self._pending.take(count)
        ok = protocol.OK
        if len(futures) == 1:
            futures[0].deliver(ok)  # a blocking pub()'s answer, most often
        else:
            deliver_all(futures, ok)
        if len(futures) < count:
            extra = count - len(futures)
            logger.warning("unexpected response from %s: %r x %d", self.address, ok, extra)

    def _pop_pending(self) -> tuple[RequestFuture | Waiter | None, list[Any] | None]:
        """The future of the oldest request, now answered (None when none waits), and the
        others that answer is for (written with it as one command), or None."""
        with self._lock:
            pending = self._pending
            if not pending.shared:
                return pending.pop(), None
            futures = pending.take(1)
        if not futures:
            return None, None
        return futures[0], futures[1:] or None

    # ---------------------------------------------------------------- threads

    def _write_loop(self) -> None:
        transport = self._transport
        assert transport is not None
        q = self._queue
        pending = self._pending
        #: requests were left in self._pending by the last write (it was full): no waiting
        more = False
        #: _STOP was taken: what is left is written, then the loop ends
        stop = False
        try:
            while True:
                if not (more or stop):
                    try:
                        stop = q.get(timeout=1.0) is _STOP
                    except queue.Empty:
                        if self.state is ConnectionState.CLOSED:
                            return
                        continue
                while not q.empty():  # this write answers the markers queued meanwhile too
                    if q.get_nowait() is _STOP:
                        stop = True
                with self._send_lock:
                    self._woken = False  # before taking: what is queued later wakes it again
                    items = self._take_queued()
                    # Taken, they count as written as far as expire_before() is concerned.
                    with self._lock:
                        if pending.unsent:
                            size = sum(map(len, items))
                            if size < _WRITE_SIZE:
                                items += self._take_requests(_WRITE_SIZE - size)
                        more = bool(pending.unsent)
                    if items:
                        _send_items(transport, items)
                if stop and not more:
                    return
        except (OSError, NSQError, ValueError) as exc:
            self._write_failed(exc)

    def _take_requests(self, size: int) -> list[bytes]:
        """The commands of the oldest requests not written yet, about ``size`` bytes of them
        (see :meth:`Pending.take_unsent`), PUBs joined when ``join_limit`` says so; the
        lock is held."""
        pending = self._pending
        start = len(pending.items) - len(pending.unsent)
        commands = pending.take_unsent(size)
        limit = self.join_limit
        if not limit:
            return commands
        commands, counts = join_pubs(commands, limit)
        if counts is not None:
            pending.join(start, counts)
            self.pubs_joined += sum(count for count in counts if count > 1)
        return commands

    def request_mark(self) -> int:
        """A mark for "every request sent so far": pass it later to :meth:`expire_before`."""
        with self._lock:
            return self._pending.mark()

    def expire_before(self, mark: int) -> int:
        """Fail with NSQTimeoutError every request sent before ``mark`` (from
        :meth:`request_mark`) and still unanswered, but a blocking caller's
        :class:`~nsqclient.conn.Waiter`; return how many.  A written one keeps its place
        (nsqd's late answer is dropped): ``maybe_processed`` True; one still queued is never
        written: False."""
        with self._lock:
            expired = self._pending.expire_before(mark)
        for future, written in expired:
            self._fail_request(future, expired_error(self.address, written))
        return len(expired)

    def expire_request(self, future: Future | Waiter) -> bool:
        """:meth:`expire_before` for one request, now; False when it is not pending here."""
        if not isinstance(future, RequestFuture | Waiter):
            return False  # a plain Future given to request() is never pending itself
        with self._lock:
            written = self._pending.expire(future)
        if written is not None:
            self._fail_request(future, expired_error(self.address, written))
        return written is not None

    def _fail_request(self, future: Future | Waiter, error: BaseException) -> None:
        """Fail a request's future (unless answered meanwhile) and tell ``on_request_failed``
        of a RequestFuture whose outcome nobody has taken yet."""
        if future.done():
            return
        future.set_exception(error)
        hook = self.on_request_failed
        if hook is not None and type(future) is RequestFuture and not future.observed:
            hook(future)

    def _write_failed(self, exc: BaseException) -> None:
        """A write failed or timed out (``write_timeout``): part of a command may be on the
        wire, so the connection is unusable.  Shutting the socket down makes the reader close it
        and fail every pending request."""
        logger.debug("write to %s failed: %s", self.address, exc)
        # Not the close reason yet: nsqd may have explained itself (a fatal error frame, read
        # after this, when it closed the socket under the write); see _close_reason.
        if self.state is not ConnectionState.CLOSED:
            self._write_error = self._write_error or exc
        if self._transport is not None:
            self._transport.shutdown()

    def _read_loop(self) -> None:
        transport = self._transport
        assert transport is not None
        reason: BaseException | None = None
        try:
            while True:
                data = transport.recv(262144)
                if not data:
                    if self.state is not ConnectionState.CLOSING:
                        reason = ConnectionClosedError(f"{self.address} closed the connection")
                    break
                self._process(data)
                self._wait_for_answers(len(data))
        except Exception as exc:
            reason = self._read_failure(exc)
        finally:
            self._finish_close(self._close_reason(reason))

    def _poll_read_loop(self) -> None:
        """The reader in caller-reads mode: wait for data without holding the read lock, so
        that a blocking requester may take the lock and read its own answer (one thread
        hand-off less per blocking publish); read only what is waiting, under the lock."""
        transport = self._transport
        assert transport is not None
        poller = self._epoll
        silence = self._read_deadline()
        reason: BaseException | None = None
        try:
            while True:
                wait = self._last_read + silence - time.monotonic()
                if wait <= 0:
                    raise TimeoutError
                if not poller.poll(wait):
                    continue  # a requester may have read meanwhile: recompute the silence
                with self._read_lock:
                    data = transport.recv_nowait(262144)
                    if data is None:
                        continue  # a requester read it
                    if not data:
                        if self.state is not ConnectionState.CLOSING:
                            reason = self._read_error or ConnectionClosedError(
                                f"{self.address} closed the connection"
                            )
                        break
                    self._last_read = time.monotonic()
                    self._process(data)
                # Outside the read lock: a blocking requester may read its own answer meanwhile.
                self._wait_for_answers(len(data))
        except Exception as exc:
            reason = self._read_failure(exc)
        finally:
            self._finish_close(self._close_reason(reason))
            poller.close()

    def _wait_for_answers(self, read_size: int) -> None:
        """After a read of ``read_size`` bytes, let nsqd's answers pile up a moment when many
        requests are unanswered (see _answer_wait.py); on a reader, after each read."""
        # Without the lock: a count a moment old is enough for a wait of half a millisecond.
        wait = answer_wait(read_size, self._pending.count())
        if wait:
            _sleep(wait)

    def _read_failure(self, exc: Exception) -> BaseException | None:
        """Why a reader loop ended on ``exc``: silence past the read deadline, the stream
        failing (unless we were closing it), or a bug (logged: a delegate's bug must not leave
        futures hanging)."""
        if isinstance(exc, TimeoutError):
            return self._silence_error()
        if isinstance(exc, OSError | NSQError | ValueError):
            return exc if self.state is not ConnectionState.CLOSING else None
        logger.exception("unexpected error on the reader of %s", self.address)
        return exc

    def _close_reason(self, seen: BaseException | None) -> BaseException | None:
        """Why the stream ended: what nsqd said beats a failed write, which beats what the
        reader saw last.  A failed write is logged only when nsqd did not explain it (a 6 MB
        PUB gets E_BAD_MESSAGE, then a reset under the rest of the write: the error says it)."""
        if self._fatal_error is not None:
            return self._fatal_error
        if self._write_error is not None:
            logger.warning("write to %s failed: %s", self.address, self._write_error)
            return self._write_error
        return seen

    def read_until(self, future: Future | Waiter, deadline: float) -> None:
        """Caller-reads mode: read and handle what nsqd sends in the calling thread until
        ``future`` is done, ``deadline`` (``time.monotonic()``) passes, or the stream fails,
        when the reading is this caller's (claimed by :meth:`request` for a
        :class:`~nsqclient.conn.Waiter`) or free; otherwise return at once.  Either way
        the caller then waits on ``future`` as usual: the reader thread handles whatever this
        left.  A caller whose Waiter holds the
        reading must call this (a past ``deadline`` just gives it back)."""
        if type(future) is Waiter and future.reading:
            future.reading = False
        elif not self._caller_reads or not self._claim_reading():
            return
        transport = self._transport
        assert transport is not None
        try:
            while not future.done():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                data = transport.recv_within(262144, remaining)
                if not data:
                    return  # end of stream: the reader thread sees it too and closes
                self._last_read = time.monotonic()
                self._process(data)
        except TimeoutError:
            return
        except Exception as exc:
            # The stream is unusable; let the reader thread close with this reason.
            self._read_error = exc
            transport.shutdown()
        finally:
            self._end_reading()

    def _claim_reading(self) -> bool:
        """Take the reading from the reader thread (which sleeps); False if one is reading."""
        if not self._read_lock.acquire(blocking=False):
            return False
        try:
            self._epoll.modify(self._transport.fileno(), 0)  # type: ignore[union-attr]
        except (OSError, ValueError):
            self._read_lock.release()
            return False  # closing
        return True

    def _end_reading(self) -> None:
        try:
            self._epoll.modify(self._transport.fileno(), select.EPOLLIN | select.EPOLLPRI)  # type: ignore[union-attr]
        except (OSError, ValueError):
            pass  # closed meanwhile: the reader thread has gone or is going
        self._read_lock.release()

    def _silence_error(self) -> NSQTimeoutError:
        return NSQTimeoutError(
            f"no data from {self.address} for {self._read_deadline():.1f}s "
            "(heartbeats missed); closing"
        )

    def _process(self, data: bytes) -> None:
        """Handle one read's bytes in order: a run of message frames at once, others each."""
        oks, used = self._frames.leading_oks(data)
        if oks:
            self._answer_oks(oks)
            if used == len(data):
                return
            data = data[used:]
        run_type = protocol.MessageRun
        for item in self._frames.feed_runs(data):
            if type(item) is run_type:
                self._deliver(item)
            else:
                self._dispatch(item)  # type: ignore[arg-type]

    def _deliver(self, run: protocol.MessageRun) -> None:
        """A run of message frames to the delegate: undecoded to ``on_message_run`` when it has
        one (a columnar consumer), else decoded to ``on_messages`` or ``on_message`` each."""
        self.messages_received += len(run.starts)
        self.last_message_at = time.monotonic()
        delegate = self.delegate
        if delegate is None:
            return
        on_run = getattr(delegate, "on_message_run", None)
        if on_run is not None:
            on_run(self, run)
            return
        decode, buf = protocol.decode_message_at, run.buffer
        youzan, extended, ordered = self.config.youzan, self.extended, self.ordered
        pairs = zip(run.starts, run.ends, strict=True)
        decoded = [decode(buf, start, end, youzan, extended, ordered) for start, end in pairs]
        on_messages = getattr(delegate, "on_messages", None)
        if on_messages is not None:
            on_messages(self, decoded)
        else:
            for message in decoded:
                delegate.on_message(self, message)

    def _dispatch(self, frame: protocol.Frame) -> None:
        """A response or error frame (messages go to :meth:`_deliver`)."""
        ftype, data = frame
        if ftype == protocol.FRAME_TYPE_RESPONSE:
            if data == protocol.HEARTBEAT:
                self._queue_out(protocol.nop())
                return
            future, others = self._pop_pending()
            if future is None:
                logger.warning("unexpected response from %s: %r", self.address, data[:100])
            else:
                # one shared b"OK" rather than one per answer held by every finished future
                answer = protocol.OK if data == protocol.OK else data
                future.deliver(answer)
                if others:
                    deliver_all(others, answer)
            return
        error = error_from_frame(data)
        if error.code in _UNSOLICITED:
            if self.delegate is not None:
                self.delegate.on_server_error(self, error)  # the delegate reports it
            else:
                logger.warning("%s: %s", self.address, error)
            return
        future, others = self._pop_pending()
        if others:
            self._joined_failed([future, *others], error)  # type: ignore[list-item]
        elif future is not None and not future.done():
            self._fail_request(future, error)
        else:
            logger.error("%s sent an error: %s", self.address, error)
            if self.delegate is not None:
                self.delegate.on_server_error(self, error)
        if error.fatal:
            # nsqd closes the connection after this error; remember it as the reason.
            self._fatal_error = error

    def _joined_failed(self, futures: list[RequestFuture | Waiter], error: ServerError) -> None:
        """nsqd answered the MPUB that ``futures``' PUBs were joined into with ``error``.
        A size it does not take (E_BAD_BODY, E_BAD_MESSAGE: refused before anything is
        stored, and fatal) is the joining's fault: they fail at the close as not processed,
        as the requests behind it do, and ``join_refused`` tells the owner.  Any other
        error is each one's, as it would have been a PUB's."""
        if error.code in _JOIN_REFUSALS:
            self.join_refused = error
            self._refused = futures
            logger.warning(
                "%s refused %d publishes joined into one MPUB: %s", self.address, len(futures),
                error,
            )  # fmt: skip
            return
        for future in futures:
            joined = type(error)(
                f"{error.message} (nsqd's answer to one MPUB of {len(futures)} publishes)",
                error.code,
            )
            self._fail_request(future, joined)

    def _finish_close(self, reason: BaseException | None) -> None:
        with self._lock:
            old = self.state
            self.state = ConnectionState.CLOSED
            pending = self._refused + self._pending.clear()
            self._refused = []
        if old is ConnectionState.CLOSED:
            return
        if reason is not None and self.close_reason is None:
            self.close_reason = reason
        reason = self.close_reason if reason is None else reason
        # nsqd handles commands in order and stops at a fatal error: whatever was queued
        # behind the request that caused it was not processed.
        after_fatal = self._fatal_error is not None or isinstance(reason, ServerError)
        for future in pending:
            if not future.done():
                exc = ConnectionClosedError(
                    f"connection to {self.address} closed before nsqd answered"
                    + (f": {reason}" if reason else ""),
                    not after_fatal,
                    self.address,
                )
                exc.__cause__ = reason
                self._fail_request(future, exc)
        self._queue.put(_STOP)
        if self._transport is not None:
            self._transport.shutdown()
        self._closed_event.set()
        self._report_state(old, ConnectionState.CLOSED)
        if reason is not None:
            logger.info("connection to %s closed: %s", self.address, reason)
        if self.delegate is not None:
            try:
                self.delegate.on_close(self, reason)
            except Exception:
                logger.exception("on_close delegate of %s failed", self.address)

    # ---------------------------------------------------------------- closing

    def send_cls(self) -> Future:
        """Send CLS: nsqd stops sending messages and answers CLOSE_WAIT (the connection stays
        open so in-flight messages can still be finished)."""
        return self.request(protocol.cls())

    def close(self, timeout: float = 5.0) -> None:
        """Close: wait up to ``timeout`` seconds for pending requests to be answered, flush what
        is queued, close the socket and join both threads.  Safe to call twice, from any thread
        but the connection's own."""
        deadline = time.monotonic() + max(timeout, 0.0)
        with self._lock:
            closing = self.state is ConnectionState.CONNECTED
            if closing:
                self.state = ConnectionState.CLOSING
            pending = self._pending.waiting()
        if closing:
            self._report_state(ConnectionState.CONNECTED, ConnectionState.CLOSING)
        for future in pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not wait_answered(future, remaining):
                break
        current = threading.current_thread()
        self._queue.put(_STOP)
        if self._writer is not None and self._writer is not current:
            self._writer.join(max(deadline - time.monotonic(), 0.1))
        if self._transport is not None:
            self._transport.shutdown()
        if self._reader is not None and self._reader is not current:
            self._reader.join(max(deadline - time.monotonic(), 1.0))
        if self.state is not ConnectionState.CLOSED:
            self._finish_close(None)
        if self._transport is not None:
            self._transport.close()

    def wait_closed(self, timeout: float | None = None) -> bool:
        """Block until the connection is closed; False on timeout."""
        return self._closed_event.wait(timeout)

    # ---------------------------------------------------------------- stats

    def stats(self) -> dict[str, Any]:
        """This connection's figures: ``address``, ``state``, ``messages_received``,
        ``messages_sent``, ``pubs_joined`` (PUBs written joined into MPUBs, see
        ``join_limit``), ``pending_requests``, ``bytes_in``, ``bytes_out`` (raw socket
        bytes), ``tls`` (version or None), ``compression`` and ``max_rdy_count``.  (A
        Consumer's ``stats()`` adds its flow-control counts: ``rdy``, ``in_flight``,
        ``queued``.)"""
        t = self._transport
        return {
            "address": self.address,
            "state": self.state.value,
            "messages_received": self.messages_received,
            "messages_sent": self.messages_sent,
            "pubs_joined": self.pubs_joined,
            "pending_requests": self.pending_count(),
            "bytes_in": t.bytes_in if t else 0,
            "bytes_out": t.bytes_out if t else 0,
            "tls": t.tls_version if t else None,
            "compression": t.compression if t else None,
            "max_rdy_count": self.max_rdy_count,
        }


def _send_items(transport: Transport, items: list[bytes]) -> None:
    """Write ``items`` in order: joined, in writes of about _WRITE_SIZE bytes once they are
    more than twice that (one large buffer per write would make glibc keep freed megabytes
    around: its mmap threshold grows with them)."""
    if len(items) == 1:
        transport.sendall(items[0])
    elif sum(map(len, items)) <= 2 * _WRITE_SIZE:
        transport.sendall(b"".join(items))
    else:
        start = size = 0
        for i, item in enumerate(items):
            size += len(item)
            if size >= _WRITE_SIZE:
                transport.sendall(b"".join(items[start : i + 1]))
                start, size = i + 1, 0
        if start < len(items):
            transport.sendall(b"".join(items[start:]))
