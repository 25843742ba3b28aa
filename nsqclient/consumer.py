"""Consumer: subscribe to a topic/channel on many nsqd and run a handler on each message.

Threads (all named, all joined by :meth:`Consumer.stop`):

* per connection, a reader and a writer (see :mod:`nsqclient.conn`);
* ``nsq-discovery``: queries nsqlookupd (first at once, then every ``lookupd_poll_interval``
  plus jitter), connects new nsqd, reconnects direct addresses after a growing delay, and runs
  the user's connection hooks;
* ``nsq-rdy``: applies the RDY policy (:mod:`nsqclient.rdy`) periodically and whenever
  something changes (a connection comes or goes, backoff, ``set_max_in_flight``);
* ``nsq-worker-N`` (``concurrency`` of them): run the handler.  A handler that blocks for minutes
  stops nothing else: heartbeats are answered by the reader threads.

Handler contract: return None or True -> FIN; return False or raise -> REQ (and backoff);
raise :class:`~nsqclient.message.RequeueMessage` to choose the delay and whether to back off;
call ``message.enable_async()`` to answer later from any thread.
"""

from __future__ import annotations

import logging
import queue
import random
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from . import protocol
from .backoff import BackoffMode, BackoffState, reconnect_delay
from .checks import check_int
from .config import Config
from .conn import Connection, parse_address
from .errors import NSQError, ServerError
from .http import LookupdClient, producer_address
from .message import Message, RequeueMessage
from .rdy import ConnView, is_starved, needs_refill, rdy_targets

__all__ = ["Consumer"]

logger = logging.getLogger("nsqclient.consumer")

Handler = Callable[[Message], Any]


class _ConnInfo:
    """The consumer's bookkeeping for one connection (guarded by Consumer._lock)."""

    __slots__ = ("conn", "remaining", "rdy_since", "waiting_since", "direct", "first_message")

    def __init__(self, conn: Connection, direct: bool, now: float):
        self.conn = conn
        self.remaining = 0
        self.rdy_since: float | None = None
        self.waiting_since = now
        self.direct = direct
        self.first_message = True


class _Delegate:
    """What a Connection and a Message call back (see :class:`~nsqclient.conn.ConnectionDelegate`
    and :class:`~nsqclient.message.MessageResponder`), kept off the Consumer's public face."""

    __slots__ = ("_consumer",)

    def __init__(self, consumer: Consumer):
        self._consumer = consumer

    def on_message(self, conn: Connection, decoded: protocol.DecodedMessage) -> None:
        self._consumer._on_messages(conn, [decoded])

    def on_messages(self, conn: Connection, decoded: list[protocol.DecodedMessage]) -> None:
        self._consumer._on_messages(conn, decoded)

    def on_server_error(self, conn: Connection, error: ServerError) -> None:
        self._consumer._on_server_error(conn, error)

    def on_close(self, conn: Connection, reason: BaseException | None) -> None:
        self._consumer._on_close(conn, reason)

    def finish_message(self, message: Message) -> None:
        self._consumer._finish_message(message)

    def requeue_message(self, message: Message, delay: float | None, backoff: bool) -> None:
        self._consumer._requeue_message(message, delay, backoff)

    def touch_message(self, message: Message) -> None:
        self._consumer._touch_message(message)


#: Unsolicited errors nsqd sends for a FIN/REQ/TOUCH it could not apply, and the counters
#: they move: (counted apart, taken back from).
_ANSWER_FAILED = {
    "E_FIN_FAILED": ("finish_failed", "finished"),
    "E_REQ_FAILED": ("requeue_failed", "requeued"),
    "E_TOUCH_FAILED": ("touch_failed", None),
}


class Consumer:
    """Consume ``topic``/``channel`` with ``handler``.

    Args:
        topic, channel: names (``#ephemeral`` allowed); validated here.
        handler: ``handler(message)``; runs on a worker thread.
        nsqd_tcp_addresses: nsqd to connect to directly (``"host:port"``); reconnected with
            exponential backoff when they drop.
        lookupd_http_addresses: nsqlookupd HTTP addresses (``"http://host:4161"`` or
            ``"host:4161"``) to discover nsqd from.
        giving_up: ``giving_up(message)`` called (on a worker) for a message whose attempts
            exceed ``max_tries``, before it is FINished; the default logs a warning.
        on_connect, on_disconnect: ``hook(address)`` / ``hook(address, reason)``, run on the
            consumer's own threads (that address's connect thread, the discovery thread; never
            a connection's reader or writer) when a connection is made or lost.
        **options: :class:`~nsqclient.config.Config` options: ``max_in_flight``,
            ``concurrency``, ``max_tries``, ``default_requeue_delay``, ``max_backoff_duration``,
            ``lookupd_poll_interval``, ``msg_timeout``, TLS/compression/auth... (seconds).
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        handler: Handler,
        nsqd_tcp_addresses: str | Sequence[str] | None = None,
        lookupd_http_addresses: str | Sequence[str] | None = None,
        giving_up: Callable[[Message], Any] | None = None,
        on_connect: Callable[[str], Any] | None = None,
        on_disconnect: Callable[[str, BaseException | None], Any] | None = None,
        **options: Any,
    ):
        self.topic = protocol.check_topic_name(topic)
        self.channel = protocol.check_channel_name(channel)
        if not callable(handler):
            raise TypeError(f"handler must be callable, not {type(handler).__name__}")
        self.handler = handler
        self.config = Config(**options)
        if isinstance(nsqd_tcp_addresses, str):
            nsqd_tcp_addresses = [nsqd_tcp_addresses]
        if isinstance(lookupd_http_addresses, str):
            lookupd_http_addresses = [lookupd_http_addresses]
        self.nsqd_tcp_addresses = [
            f"{h}:{p}" for h, p in map(parse_address, nsqd_tcp_addresses or [])
        ]
        self.lookupd_http_addresses = list(lookupd_http_addresses or [])
        if not self.nsqd_tcp_addresses and not self.lookupd_http_addresses:
            raise ValueError("Consumer needs nsqd_tcp_addresses or lookupd_http_addresses")
        self._lookupds = [
            LookupdClient(a, timeout=self.config.lookupd_request_timeout)
            for a in self.lookupd_http_addresses
        ]
        self.giving_up = giving_up
        self.on_connect = on_connect
        self.on_disconnect = on_disconnect
        self._max_in_flight = self.config.max_in_flight
        self._max_tries = self.config.max_tries

        self._lock = threading.RLock()
        self._conns: dict[str, _ConnInfo] = {}
        self._connecting: dict[str, Connection] = {}
        self._reconnect_at: dict[str, float] = {}
        self._reconnect_failures: dict[str, int] = {}
        self._lookupd_found: set[str] = set()
        self._connect_threads: set[threading.Thread] = set()
        self._delegate = _Delegate(self)
        # Messages waiting for a handler worker, oldest first.  The reader appends a whole
        # socket read's worth under _work_cond; workers pop one at a time without it and
        # wait on it only when the deque is empty.
        self._work: deque[Message] = deque()
        self._work_cond = threading.Condition(threading.Lock())
        self._idle_workers = 0
        self._workers_exit = False
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._rdy_wake = threading.Event()
        self._discovery_wake = threading.Event()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._stop_requested = threading.Event()
        #: set by a second SIGINT/SIGTERM during run()'s drain: requeue and go now
        self._force_stop = threading.Event()
        self._stop_lock = threading.Lock()
        self._idle = threading.Event()
        self._started = False
        #: set once start() has started every thread (a hook may call stop() before that)
        self._all_started = threading.Event()
        self._threads: list[threading.Thread] = []
        self._workers: list[threading.Thread] = []
        #: per worker: is it running a handler (each slot written only by its worker)
        self._busy: list[bool] = []
        #: per worker: the message its handler is running on (None when idle)
        self._current: list[Message | None] = []
        self._backoff = BackoffState(
            self.config.backoff_multiplier,
            self.config.max_backoff_duration,
            self.config.backoff_strategy,
        )
        self._stats = {
            "received": 0,
            "finished": 0,
            "requeued": 0,
            "given_up": 0,
            "timed_out_locally": 0,
            "handler_errors": 0,
            "finish_failed": 0,
            "requeue_failed": 0,
            "touch_failed": 0,
        }

    def __repr__(self) -> str:
        return f"<Consumer {self.topic}/{self.channel} connections={len(self._conns)}>"

    # ================================================================ lifecycle

    def start(self) -> None:
        """Start the threads and connect; returns at once.  Call :meth:`stop` to finish."""
        if self._started or self._stopping.is_set():
            raise RuntimeError("Consumer already started (or stopped)")
        self._started = True
        now = time.monotonic()
        for address in self.nsqd_tcp_addresses:
            self._reconnect_at[address] = now
        tag = f"{self.topic}/{self.channel}"
        self._busy = [False] * self.config.concurrency
        self._current = [None] * self.config.concurrency
        for i in range(self.config.concurrency):
            t = threading.Thread(
                target=self._work_loop, args=(i,), name=f"nsq-worker-{tag}-{i}", daemon=True
            )
            self._workers.append(t)
        self._threads = [
            threading.Thread(target=self._discovery_loop, name=f"nsq-discovery-{tag}", daemon=True),
            threading.Thread(target=self._rdy_loop, name=f"nsq-rdy-{tag}", daemon=True),
        ]
        for t in self._workers + self._threads:
            t.start()
        self._all_started.set()

    def run(self) -> None:
        """Start, then block until SIGINT/SIGTERM (when called from the main thread) or
        :meth:`stop` from another thread; stops cleanly before returning.

        The first signal drains: handlers finish the messages already received (see
        :meth:`stop`).  A second signal stops at once: every message not yet answered is
        requeued (REQ, no delay), handlers still running are abandoned, and run() returns
        without a traceback."""
        installed = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                installed[sig] = signal.signal(sig, self._on_signal)
        try:
            if not self._started:
                self.start()
            while not self._stop_requested.wait(0.5) and not self._stopped.is_set():
                pass
            self.stop()
        finally:
            for sig, previous in installed.items():
                signal.signal(sig, previous)
            if not self._stopped.is_set():
                self.stop()

    def _on_signal(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if not self._stop_requested.is_set():
            self._stop_requested.set()
            logger.info(
                "%s: stopping; draining %d messages in flight (send %s again to stop now and"
                " requeue them)",
                name,
                self._in_flight(),
                name,
            )
        elif not self._force_stop.is_set():
            self._force_stop.set()
            logger.warning("second %s: stopping now; requeueing what is not answered", name)

    def _in_flight(self) -> int:
        with self._lock:
            return sum(i.conn.in_flight for i in self._conns.values())

    def stop(self, timeout: float = 30.0) -> None:
        """Stop: CLS every connection (nsqd sends nothing more), stop discovery and reconnects,
        let handlers finish the messages already received, and wait for the messages taken
        over with ``enable_async()`` to be answered (up to ``timeout`` seconds in all; what is
        still waiting for a handler then is requeued at once, and a message a handler still
        holds is left to nsqd's msg_timeout), close every connection and join every thread.

        Safe from any thread, a handler or a connection hook included (that thread is not
        waited for), and from several threads at once (one stops, the others wait for it)."""
        self._stop_requested.set()
        self._stopping.set()
        deadline = time.monotonic() + timeout
        if not self._stop_lock.acquire(timeout=max(timeout, 0.0)):
            return  # another thread is stopping and has not finished in our time
        try:
            if not self._stopped.is_set():
                self._stop(deadline)
        finally:
            self._stop_lock.release()

    def _stop(self, deadline: float) -> None:
        current = threading.current_thread()
        if self._started:
            self._all_started.wait(max(deadline - time.monotonic(), 0.1))
        self._discovery_wake.set()
        self._rdy_wake.set()
        with self._lock:
            dialing = list(self._connecting.values())
            connecting = list(self._connect_threads)
        for conn in dialing:
            conn.abort_connect()  # a hung nsqd may never answer the handshake
        for t in [*self._threads, *connecting]:
            if t is not current:
                t.join(max(deadline - time.monotonic(), 0.1))
        with self._lock:
            infos = list(self._conns.values())
        closing = []
        for info in infos:
            try:
                closing.append(info.conn.send_cls())
            except NSQError:
                pass
        for fut in closing:
            try:
                fut.exception(timeout=max(deadline - time.monotonic(), 0.01))
            except TimeoutError:
                pass
        # Let the workers drain what was received (a handler calling stop() is one of them),
        # and wait for messages taken over with enable_async() to be answered too.
        own = self._workers.index(current) if current in self._workers else -1
        while time.monotonic() < deadline and not self._force_stop.is_set():
            busy = any(b for i, b in enumerate(self._busy) if i != own)
            if not busy and not self._work and self._unanswered(own) == 0:
                break
            self._wait_idle(min(0.05, max(deadline - time.monotonic(), 0)))
        forced = self._force_stop.is_set()
        if forced:
            self._requeue_running(own)
        self._requeue_unstarted()
        with self._work_cond:
            self._workers_exit = True
            self._work_cond.notify_all()
        for t in self._workers:
            if t is current:
                continue
            t.join(0.0 if forced else max(deadline - time.monotonic(), 0.1))
            if t.is_alive():
                logger.warning("%s still runs a handler after stop(); leaving it", t.name)
        with self._lock:
            infos = list(self._conns.values())
        for info in infos:
            info.conn.close(max(deadline - time.monotonic(), 1.0))
        for lookupd in self._lookupds:
            lookupd.close()
        self._drain_events()
        self._stopped.set()

    def _unanswered(self, own: int) -> int:
        """Messages received and not yet answered, but for the one the worker ``own`` (the
        thread stopping the consumer) is handling."""
        count = self._in_flight()
        mine = self._current[own] if own >= 0 else None
        if mine is not None and not mine._responded:
            count -= 1
        return count

    def _requeue_running(self, own: int) -> None:
        """Forced stop: hand back the messages handlers are still working on (what those
        handlers answer later is ignored, as for any message answered twice)."""
        for i, message in enumerate(list(self._current)):
            if i != own and message is not None and not message.has_responded():
                message.requeue(delay=0, backoff=False)

    def _wait_idle(self, seconds: float) -> None:
        # Woken early by a worker finishing a message (see _work_loop).
        self._idle.wait(seconds)
        self._idle.clear()

    def _requeue_unstarted(self) -> None:
        while True:
            try:
                message = self._work.popleft()
            except IndexError:
                return
            if not message.has_responded():
                message.requeue(delay=0, backoff=False)

    @property
    def is_running(self) -> bool:
        return self._started and not self._stopped.is_set()

    # ================================================================ public knobs

    @property
    def max_in_flight(self) -> int:
        return self._max_in_flight

    def set_max_in_flight(self, max_in_flight: int) -> None:
        """Change ``max_in_flight``; 0 pauses (RDY 0 everywhere), a positive value resumes."""
        self._max_in_flight = check_int(max_in_flight, "max_in_flight", "messages", min=0)
        self._rdy_wake.set()

    def is_starved(self) -> bool:
        """True when some connection has 85% or more of its RDY in flight: a batching handler
        holding messages (``enable_async``) should process its batch now."""
        with self._lock:
            return is_starved(self._views(time.monotonic()))

    def stats(self) -> dict[str, Any]:
        """Counters (received, finished, requeued, given_up, timed_out_locally,
        handler_errors), the backoff level, and per-connection stats."""
        with self._lock:
            out: dict[str, Any] = dict(self._stats)
            out["backoff_level"] = self._backoff.level
            out["max_in_flight"] = self._max_in_flight
            out["connections"] = {a: i.conn.stats() for a, i in self._conns.items()}
        return out

    def connections(self) -> list[Connection]:
        with self._lock:
            return [i.conn for i in self._conns.values()]

    # ================================================================ discovery / connecting

    def _discovery_loop(self) -> None:
        cfg = self.config
        next_poll = time.monotonic() if self._lookupds else float("inf")
        while not self._stopping.is_set():
            wait = 1.0
            try:
                self._drain_events()
                if time.monotonic() >= next_poll:
                    jitter = random.random() * cfg.lookupd_poll_jitter * cfg.lookupd_poll_interval
                    next_poll = time.monotonic() + cfg.lookupd_poll_interval + jitter
                    self._query_lookupds()
                for address in self._due_reconnects(time.monotonic()):
                    self._start_connect(address, direct=address in self.nsqd_tcp_addresses)
                with self._lock:
                    pending = list(self._reconnect_at.values())
                wake_at = min([next_poll, *pending], default=next_poll)
                wait = min(max(wake_at - time.monotonic(), 0.0), 1.0)
            except Exception:
                logger.exception("unexpected error in discovery; it goes on")
            if self._discovery_wake.wait(wait):
                self._discovery_wake.clear()

    def _due_reconnects(self, now: float) -> list[str]:
        with self._lock:
            due = [a for a, t in self._reconnect_at.items() if t <= now]
            for a in due:
                del self._reconnect_at[a]
        return due

    def _query_lookupds(self) -> None:
        found: set[str] = set()
        for lookupd in self._lookupds:
            try:
                result = lookupd.lookup(self.topic)
            except NSQError as exc:
                logger.warning("lookupd %s: %s", lookupd, exc)
                continue
            except Exception as exc:  # garbage from a lookupd must not kill discovery
                logger.warning("lookupd %s returned something unusable: %r", lookupd, exc)
                continue
            for p in result.get("producers") or []:
                try:
                    found.add(producer_address(p))
                except (KeyError, TypeError, ValueError) as exc:
                    logger.warning("lookupd %s: bad producer entry %r: %s", lookupd, p, exc)
        with self._lock:
            self._lookupd_found = found
            new = [a for a in found if a not in self._conns and a not in self._connecting]
        for address in sorted(new):
            self._start_connect(address, direct=False)

    def _start_connect(self, address: str, direct: bool) -> None:
        """Connect to ``address`` on a thread of its own, so that a slow or hung nsqd never
        delays connecting to the others."""
        with self._lock:
            if self._stopping.is_set() or address in self._conns or address in self._connecting:
                return
            conn = Connection(address, self.config, delegate=self._delegate)
            self._connecting[address] = conn
            thread = threading.Thread(
                target=self._connect,
                args=(conn, direct),
                name=f"nsq-connect-{address}",
                daemon=True,
            )
            self._connect_threads.add(thread)
        thread.start()

    def _connect(self, conn: Connection, direct: bool) -> None:
        try:
            self._subscribe(conn, direct)
        except Exception as exc:
            logger.exception("unexpected error connecting to %s", conn.address)
            conn.close(0.5)
            with self._lock:
                self._connecting.pop(conn.address, None)
            self._schedule_reconnect(conn.address, direct, exc)
        finally:
            with self._lock:
                self._connect_threads.discard(threading.current_thread())

    def _subscribe(self, conn: Connection, direct: bool) -> None:
        address = conn.address
        try:
            conn.connect()
            conn.request(protocol.sub(self.topic, self.channel)).result(
                self.config.handshake_timeout
            )
        except (OSError, NSQError, TimeoutError) as exc:
            logger.warning("cannot subscribe to %s: %s", address, exc)
            conn.close(0.5)
            with self._lock:
                self._connecting.pop(address, None)
            self._schedule_reconnect(address, direct, exc)
            return
        with self._lock:
            self._connecting.pop(address, None)
            if self._stopping.is_set() or conn.is_closed:
                stale = True
            else:
                stale = False
                self._conns[address] = _ConnInfo(conn, direct, time.monotonic())
                self._reconnect_failures.pop(address, None)
        if stale:
            conn.close(0.5)
            return
        logger.info("subscribed to %s/%s on %s", self.topic, self.channel, address)
        self._run_hook(self.on_connect, address)
        self._rdy_wake.set()

    def _schedule_reconnect(self, address: str, direct: bool, reason: BaseException | None) -> None:
        if self._stopping.is_set():
            return
        if not direct:
            return  # lookupd-found nsqd come back when a later poll lists them
        with self._lock:
            failures = self._reconnect_failures.get(address, 0) + 1
            self._reconnect_failures[address] = failures
            delay = reconnect_delay(
                failures, self.config.reconnect_interval, self.config.max_reconnect_interval
            )
            self._reconnect_at[address] = time.monotonic() + delay
        logger.info("reconnecting to %s in %.1fs", address, delay)
        self._discovery_wake.set()

    def _drain_events(self) -> None:
        while True:
            try:
                address, reason = self._events.get_nowait()
            except queue.Empty:
                return
            self._run_hook(self.on_disconnect, address, reason)

    def _run_hook(self, hook: Callable[..., Any] | None, *args: Any) -> None:
        if hook is None:
            return
        try:
            hook(*args)
        except Exception:
            logger.exception("connection hook %r failed", hook)

    # ================================================================ connection delegate
    # (via _Delegate; these run on a connection's reader thread: quick, never user code)

    def _on_messages(self, conn: Connection, decoded: list[protocol.DecodedMessage]) -> None:
        """The messages of one socket read: one lock round and one hand-off for all of them."""
        now = conn.last_message_at
        received = Message._received
        delegate = self._delegate
        messages = [received(d, delegate, conn, now) for d in decoded]
        n = len(messages)
        with self._lock:
            self._stats["received"] += n
            conn.in_flight += n
            info = self._conns.get(conn.address)
            if info is not None and info.conn is conn:
                info.remaining -= n
                mode = BackoffMode.NORMAL if self._backoff.level == 0 else self._backoff.mode(now)
                if mode is BackoffMode.TESTING:
                    # One message per test window: take the RDY back until its result is in.
                    self._send_rdy(info, 0)
                elif mode is BackoffMode.NORMAL and needs_refill(info.remaining, conn.rdy):
                    self._send_rdy(info, conn.rdy)
                if info.first_message:
                    info.first_message = False
                    self._rdy_wake.set()
        with self._work_cond:
            self._work.extend(messages)
            if self._idle_workers:
                self._work_cond.notify(min(n, self._idle_workers))

    def _on_server_error(self, conn: Connection, error: ServerError) -> None:
        counters = _ANSWER_FAILED.get(error.code)
        if counters is not None:
            failed, taken_back = counters
            with self._lock:
                self._stats[failed] += 1
                if taken_back is not None:
                    self._stats[taken_back] -= 1
            logger.warning(
                "nsqd %s: %s (the message had probably timed out and been redelivered)",
                conn.address,
                error,
            )
            return
        logger.warning("nsqd %s: %s", conn.address, error)

    def _on_close(self, conn: Connection, reason: BaseException | None) -> None:
        with self._lock:
            info = self._conns.get(conn.address)
            if info is None or info.conn is not conn:
                return
            del self._conns[conn.address]
        self._events.put((conn.address, reason))
        self._schedule_reconnect(conn.address, info.direct, reason)
        self._rdy_wake.set()
        self._discovery_wake.set()

    # ================================================================ RDY

    def _views(self, now: float) -> list[ConnView]:
        return [
            ConnView(
                address=a,
                rdy=i.conn.rdy,
                max_rdy_count=i.conn.max_rdy_count,
                in_flight=i.conn.in_flight,
                last_message_at=None if i.first_message else i.conn.last_message_at,
                rdy_since=i.rdy_since,
                waiting_since=i.waiting_since,
            )
            for a, i in self._conns.items()
        ]

    def _send_rdy(self, info: _ConnInfo, count: int) -> None:
        conn = info.conn
        now = time.monotonic()
        if count > 0 and conn.rdy == 0:
            info.rdy_since = now
        elif count == 0 and conn.rdy > 0:
            info.rdy_since = None
            info.waiting_since = now
        conn.rdy = count
        info.remaining = count
        conn.last_rdy_at = now
        try:
            conn.send(protocol.rdy(count))
        except NSQError:
            pass  # closed: on_close cleans up

    def _rebalance(self) -> float:
        """Apply the RDY policy once; return seconds until it should run again."""
        cfg = self.config
        now = time.monotonic()
        with self._lock:
            if self._stopping.is_set():
                targets = {a: 0 for a in self._conns}
                mode = BackoffMode.PAUSED
            else:
                mode = self._backoff.mode(now)
                targets = rdy_targets(
                    self._views(now),
                    self._max_in_flight,
                    now,
                    mode,
                    cfg.low_rdy_idle_timeout,
                    cfg.low_rdy_timeout,
                )
            # Lower first, so that the sum of RDY never exceeds max_in_flight.
            changes = sorted(
                ((n, a) for a, n in targets.items() if self._conns[a].conn.rdy != n),
                key=lambda item: item[0] - self._conns[item[1]].conn.rdy,
            )
            for count, address in changes:
                self._send_rdy(self._conns[address], count)
        wait = cfg.rdy_redistribute_interval
        if mode is BackoffMode.PAUSED and self._backoff.until:
            wait = min(wait, max(self._backoff.until - now, 0.0))
        return wait

    def _rdy_loop(self) -> None:
        while True:
            try:
                wait = self._rebalance()
            except Exception:
                logger.exception("unexpected error balancing RDY; it goes on")
                wait = self.config.rdy_redistribute_interval
            if self._stopping.is_set():
                return
            if self._rdy_wake.wait(wait):
                self._rdy_wake.clear()

    # ================================================================ handlers

    def _work_loop(self, index: int) -> None:
        busy = self._busy
        current = self._current
        work = self._work
        cond = self._work_cond
        while True:
            try:
                message = work.popleft()
            except IndexError:
                with cond:
                    while not work:
                        if self._workers_exit:
                            return
                        self._idle_workers += 1
                        try:
                            cond.wait()
                        finally:
                            self._idle_workers -= 1
                continue
            busy[index] = True
            current[index] = message
            try:
                self._handle(message)
            except Exception:
                logger.exception("unexpected error handling message %r", message.id)
            finally:
                current[index] = None
                busy[index] = False
                if self._stopping.is_set():
                    self._idle.set()

    def _handle(self, message: Message) -> None:
        max_tries = self._max_tries
        if max_tries and message.attempts > max_tries:
            with self._lock:
                self._stats["given_up"] += 1
            try:
                if self.giving_up is not None:
                    self.giving_up(message)
                else:
                    logger.warning(
                        "giving up on message %r after %d attempts", message.id, message.attempts
                    )
            except Exception:
                logger.exception("giving_up callback failed")
            if not message.has_responded():
                message.finish()
            return
        started = time.monotonic()
        try:
            result = self.handler(message)
        except RequeueMessage as req:
            if not message.has_responded():
                message.requeue(req.delay, req.backoff)
            result = None
        except Exception:
            logger.exception("handler failed on message %r; requeueing", message.id)
            with self._lock:
                self._stats["handler_errors"] += 1
            if not message.has_responded():
                message.requeue(backoff=True)
            result = None
        else:
            if not message._async and not message._responded:
                if result is False:
                    message.requeue(backoff=True)
                elif message._claim("finish"):
                    self._finish_message(message)
        now = time.monotonic()
        # nsqd's timer runs from delivery, and restarts at each TOUCH.
        held = now - (message.touched_at or message.received_at)
        if held < 1.0:  # below any msg_timeout nsqd allows: the common case, decided here
            return
        conn = message._conn
        if conn is not None and held > conn.msg_timeout:
            elapsed = now - started
            with self._lock:
                self._stats["timed_out_locally"] += 1
            logger.warning(
                "handler took %.1fs on message %r, past nsqd's msg_timeout of %.1fs: nsqd has "
                "probably redelivered it; call message.touch() in long handlers",
                elapsed,
                message.id,
                conn.msg_timeout,
            )

    # ======================================================== MessageResponder (via _Delegate)

    def _answered(self, message: Message, counter: str, success: bool | None) -> None:
        conn = message._conn
        assert conn is not None  # a Consumer's messages always carry their connection
        with self._lock:
            self._stats[counter] += 1
            if conn.in_flight > 0:
                conn.in_flight -= 1
            # At level 0 a success changes nothing (BackoffState.record returns None).
            if success is not None and (self._backoff.level or not success):
                decision = self._backoff.record(success, time.monotonic())
                if decision is not None:
                    logger.info("backoff: %s (level %d)", decision.mode.value, decision.level)
                    self._rdy_wake.set()

    def _finish_message(self, message: Message) -> None:
        conn = message._conn
        assert conn is not None  # a Consumer's messages always carry their connection
        try:
            # The id came from nsqd in this message: no need to check it as protocol.fin does.
            conn.send(b"FIN " + message.id + b"\n")
        except NSQError:
            logger.debug("cannot FIN %r: connection closed; nsqd will redeliver it", message.id)
        self._answered(message, "finished", True)

    def _requeue_message(self, message: Message, delay: float | None, backoff: bool) -> None:
        conn = message._conn
        assert conn is not None  # a Consumer's messages always carry their connection
        cfg = self.config
        if delay is None:
            delay = min(cfg.default_requeue_delay * message.attempts, cfg.max_requeue_delay)
        try:
            conn.send(protocol.req(message.id, int(round(delay * 1000))))
        except NSQError:
            logger.debug("cannot REQ %r: connection closed; nsqd will redeliver it", message.id)
        self._answered(message, "requeued", False if backoff else None)

    def _touch_message(self, message: Message) -> None:
        conn = message._conn
        assert conn is not None  # a Consumer's messages always carry their connection
        try:
            conn.send(protocol.touch(message.id))
        except NSQError:
            logger.debug("cannot TOUCH %r: connection closed", message.id)
