"""Consumer: subscribe to a topic/channel on many nsqd and run a handler on each message.

Threads (all named, all joined by :meth:`Consumer.stop`):

* per connection, a reader and a writer (see :mod:`nsqclient.conn`);
* ``nsq-discovery``: queries nsqlookupd (first at once, then every ``lookupd_poll_interval``
  plus jitter), connects new nsqd, reconnects direct addresses after a growing delay, and runs
  the user's connection hooks (:mod:`nsqclient.consumer._discovery`);
* ``nsq-rdy``: applies the RDY policy (:mod:`nsqclient.rdy`) periodically and whenever
  something changes (a connection comes or goes, backoff, ``set_max_in_flight``)
  (:mod:`nsqclient.consumer._rdy_balancer`);
* ``nsq-worker-N`` (``concurrency`` of them): run the handler.  A handler that blocks for minutes
  stops nothing else: heartbeats are answered by the reader threads.

The Consumer holds its lifecycle, its connections and their counts, and the work queue; each
other job is a collaborator it owns: :class:`~nsqclient.consumer._discovery.Discovery` (finding and
keeping nsqd), :class:`~nsqclient.consumer._rdy_balancer.RdyBalancer` (RDY),
:class:`~nsqclient.consumer._answers.Responder` (FIN/REQ/TOUCH) and
:class:`~nsqclient.consumer._delivery.Handling` (a message's way to user code).

Handler contract: return None or True -> FIN; return False or raise -> REQ (and backoff);
raise :class:`~nsqclient.message.RequeueMessage` to choose the delay and whether to back off;
call ``message.enable_async()`` to answer later from any thread.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Unpack

from .. import protocol
from ..backoff import BackoffState
from ..checks import check_float, check_int
from ..config import ConsumerOptions, add_options_help
from ..conn._connection import Connection
from ..errors import NSQError, ServerError
from ..message import Message
from ..observe import ObserverSet, tell
from ..platforms import stop_signals
from ..rdy import is_starved
from ._answers import Responder
from ._arguments import Handler, check_addresses, check_config, check_mode
from ._batch import MessageBatch, Origin
from ._delegate import Delegate
from ._delivery import Handling
from ._discovery import Discovery
from ._discovery import split_key as split_key  # re-exported (subscription keys)
from ._discovery import target_key as target_key
from ._fin_tally import FinTally
from ._rdy_balancer import ConnectionCounts, ConnFlow, RdyBalancer, conn_views, connection_counts
from ._shared_state import SharedState
from ._work_queue import Intake

__all__ = ["Consumer", "ConnectionCounts"]

logger = logging.getLogger("nsqclient.consumer")


class Consumer:
    """Consume ``topic``/``channel`` with ``handler``.

    Args:
        topic, channel: names (``#ephemeral`` allowed); validated here.
        handler: ``handler(message)``; runs on a worker thread.  None: pull mode, no worker
            thread; the caller takes what arrives with :meth:`take` and answers it (each
            message, or many at once with :meth:`finish_many` / :meth:`requeue_many`).
        nsqd_tcp_addresses: nsqd to connect to directly (``"host:port"``, a list of them, or
            one comma-separated str); reconnected with exponential backoff when they drop.
        lookupd_http_addresses: nsqlookupd HTTP addresses (``"http://host:4161"`` or
            ``"host:4161"``, the port required; a list or a comma-separated str) to discover
            nsqd from.  Bad addresses raise here (:mod:`nsqclient.addresses`).
        giving_up: ``giving_up(message)`` called (on a worker) for a message whose attempts
            exceed ``max_tries``, before it is FINished; the default logs a warning.
        on_connect, on_disconnect: ``hook(address)`` / ``hook(address, reason)``, run on the
            consumer's own threads (that address's connect thread, the discovery thread; never
            a connection's reader or writer) when a connection is made or lost.  For a youzan
            partition the address reads ``"host:port#partition"``.
        partition: youzan: consume only this partition (with ``nsqd_tcp_addresses``: send
            ``SUB topic channel partition`` to each).  By default a Consumer subscribes to
            every partition lookup names, one connection per (nsqd, partition).
        ordered: youzan: subscribe with ``SUB_ORDERED``: nsqd sends a partition's next
            message only once the previous one is finished.  A failed message is requeued
            with no delay and tried again (never given up on, whatever ``max_tries``), so
            nothing behind it is skipped.  A topic created ordered must be consumed this way
            (otherwise the Consumer stops with SubOrderIsMustError).
        on_out_of_order: youzan, ordered: ``hook(message, last_offset)`` run (on a worker,
            before the handler) when a message's disk queue offset is below the last one seen
            on its partition (also logged as a WARNING, counted in ``stats()``, and told to
            observers); the message is then handled as usual, and the check goes on from its
            offset.
        columnar: pull mode: messages come as :class:`~nsqclient.consumer.MessageBatch` columns
            (:meth:`take_batches`), no object per message; :meth:`take` is then refused.
        **options: the options below (:class:`~nsqclient.config.ConsumerOptions` to a type
            checker), durations in seconds.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        handler: Handler | None,
        nsqd_tcp_addresses: str | Sequence[str] | None = None,
        lookupd_http_addresses: str | Sequence[str] | None = None,
        giving_up: Callable[[Message], Any] | None = None,
        on_connect: Callable[[str], Any] | None = None,
        on_disconnect: Callable[[str, BaseException | None], Any] | None = None,
        *,
        partition: int | None = None,
        ordered: bool = False,
        on_out_of_order: Callable[[Message, int], Any] | None = None,
        columnar: bool = False,
        **options: Unpack[ConsumerOptions],
    ):
        self.topic = protocol.check_topic_name(topic)
        self.channel = protocol.check_channel_name(channel)
        #: pull mode (no handler): messages wait in the work queue until take()
        self._pull, self._columnar = check_mode(handler, columnar)
        self.config = check_config(options)
        self.nsqd_tcp_addresses, self.lookupd_http_addresses = check_addresses(
            nsqd_tcp_addresses, lookupd_http_addresses
        )
        self.partition = None if partition is None else check_int(partition, "partition", min=0)
        self.ordered = bool(ordered)
        self._delegate = Delegate(self)
        self._discovery = self._make_discovery(on_connect, on_disconnect)
        self.on_out_of_order = on_out_of_order
        #: the error that stopped the consumer for good (see error)
        self._error: NSQError | None = None
        self.giving_up = giving_up
        self._max_tries = self.config.max_tries
        self._init_lifecycle()
        self._init_workers()
        self._init_flow_control()
        self._init_message_path(handler)

    # What __init__ does, one job each (in its order: a later step reads what an earlier one set).

    def _make_discovery(
        self,
        on_connect: Callable[[str], Any] | None,
        on_disconnect: Callable[[str, BaseException | None], Any] | None,
    ) -> Discovery:
        """The collaborator that finds and keeps the nsqd (it checks ``ordered`` against the
        addresses and options, and raises ValueError)."""
        return Discovery(
            self._delegate,
            self.topic,
            self.channel,
            self.config,
            delegate=self._delegate,
            nsqd_tcp_addresses=self.nsqd_tcp_addresses,
            lookupd_http_addresses=self.lookupd_http_addresses,
            partition=self.partition,
            ordered=self.ordered,
            on_connect=on_connect,
            on_disconnect=on_disconnect,
        )

    def _init_lifecycle(self) -> None:
        """The lock, the connections, and the events and flags of start() and stop()."""
        self._lock = threading.RLock()
        self._conns: dict[str, ConnFlow] = {}
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._stop_requested = threading.Event()
        #: set by a second SIGINT/SIGTERM during run()'s drain: requeue and go now
        self._force_stop = threading.Event()
        self._stop_lock = threading.Lock()
        #: ``nsq-stop-on-error``, stopping the consumer after a fatal error (joined by stop())
        self._stopper: threading.Thread | None = None
        self._idle = threading.Event()
        self._started = False
        #: set once start() has started every thread (a hook may call stop() before that)
        self._all_started = threading.Event()

    def _init_workers(self) -> None:
        """The handler workers' threads and slots, filled by start()."""
        self._workers: list[threading.Thread] = []
        #: per worker: the message its handler is running on (None when idle; each slot
        #: written only by its worker)
        self._current: list[Message | None] = []

    def _init_flow_control(self) -> None:
        """Backoff, the RDY balancer and the counters."""
        self._backoff = BackoffState(
            self.config.backoff_multiplier,
            self.config.max_backoff_duration,
            self.config.backoff_strategy,
        )
        self._rdy = RdyBalancer(
            self.config, self._conns, self._lock, self._backoff, f"{self.topic}/{self.channel}"
        )
        self._rdy_wake = self._rdy.wake
        self._stats = {
            "received": 0,
            "finished": 0,
            "requeued": 0,
            "given_up": 0,
            "timed_out_locally": 0,
            "handler_errors": 0,
            "out_of_order": 0,
            "finish_failed": 0,
            "requeue_failed": 0,
            "touch_failed": 0,
        }

    def _init_message_path(self, handler: Handler | None) -> None:
        """The work queue, the observers, the answers (FIN/REQ/TOUCH) and the handling of a
        message on its way to user code."""
        # What the connections received, until a worker or a taker has it.
        books = SharedState(self._backoff, self._lock, self._conns, self._stats, self._rdy_wake)
        workers = 0 if self._pull else self.config.concurrency
        self._intake = Intake(books, workers)
        #: the FINs workers wrote and have not counted yet (consumer/_fin_tally.py)
        self._tally = FinTally(workers)
        self._observers = ObserverSet(self)
        self._responder = Responder(
            self,
            self.config,
            self.ordered,
            books,
            observers=self._observers,
            pull=self._pull,
            idle=self._idle,
        )
        #: pull mode: messages taken and not answered yet (stop() requeues what is left)
        self._held = self._responder.held
        self._handling = Handling(
            self,
            handler,
            ordered=self.ordered,
            max_tries=self._max_tries,
            tracing=self.config.trace,
            observers=self._observers,
            finish=self._responder.finish_message,
            count=self._count,
            idle=self._idle,
            tally=self._tally,
            settle=self._settle_fins,
            backoff=self._backoff,
        )
        # bound once: a worker's and take()'s calls cost what a method of the Consumer's did
        self._handle = self._handling.handle
        self._prepare = self._handling.prepare
        self._check_offset = self._handling.check_offset

    def __repr__(self) -> str:
        return f"<Consumer {self.topic}/{self.channel} connections={len(self._conns)}>"

    @property
    def handler(self) -> Handler | None:
        """The handler (None: pull mode)."""
        return self._handling.handler

    @handler.setter
    def handler(self, handler: Handler | None) -> None:
        self._handling.handler = handler

    @property
    def on_connect(self) -> Callable[[str], Any] | None:
        """``hook(key)`` run when a connection is made (see the class doc)."""
        return self._discovery.on_connect

    @on_connect.setter
    def on_connect(self, hook: Callable[[str], Any] | None) -> None:
        self._discovery.on_connect = hook

    @property
    def on_disconnect(self) -> Callable[[str, BaseException | None], Any] | None:
        """``hook(key, reason)`` run when a connection is lost (see the class doc)."""
        return self._discovery.on_disconnect

    @on_disconnect.setter
    def on_disconnect(self, hook: Callable[[str, BaseException | None], Any] | None) -> None:
        self._discovery.on_disconnect = hook

    # ================================================================ lifecycle

    def start(self) -> None:
        """Start the threads and connect; returns at once.  Call :meth:`stop` to finish."""
        if self._started or self._stopping.is_set():
            raise RuntimeError("Consumer already started (or stopped)")
        self._started = True
        tag = f"{self.topic}/{self.channel}"
        workers = 0 if self._pull else self.config.concurrency
        self._current = [None] * workers
        for i in range(workers):
            t = threading.Thread(
                target=self._work_loop, args=(i,), name=f"nsq-worker-{tag}-{i}", daemon=True
            )
            self._workers.append(t)
        for t in self._workers:
            t.start()
        self._discovery.start()
        self._rdy.start()
        self._all_started.set()
        if self._rdy.max_in_flight == 0:
            logger.warning(
                "%s/%s: max_in_flight is 0: paused (RDY 0 everywhere) until set_max_in_flight()",
                self.topic,
                self.channel,
            )

    def run(self) -> None:
        """Start, then block until SIGINT/SIGTERM (when called from the main thread) or
        :meth:`stop` from another thread; stops cleanly before returning.

        The first signal drains: handlers finish the messages already received (see
        :meth:`stop`).  A second signal stops at once: every message not yet answered is
        requeued (REQ, no delay), handlers still running are abandoned, and run() returns
        without a traceback."""
        installed = {}
        if threading.current_thread() is threading.main_thread():
            for sig in stop_signals():
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
        if self._error is not None:
            raise self._error

    def _on_signal(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if not self._stop_requested.is_set():
            self._stop_requested.set()
            logger.info(
                "%s: stopping, draining %d messages in flight (%s again: stop now, requeue them)",
                name,
                self._in_flight(),
                name,
            )
        elif not self._force_stop.is_set():
            self._force_stop.set()
            logger.warning("second %s: stopping now; requeueing what is not answered", name)

    def _in_flight(self) -> int:
        with self._lock:
            self._settle_fins()
            return sum(f.in_flight for f in self._conns.values())

    def stop(self, timeout: float = 30.0) -> None:
        """Stop: CLS every connection (nsqd sends nothing more), stop discovery and reconnects,
        let handlers finish the messages already received, and wait for the messages taken
        over with ``enable_async()`` to be answered (up to ``timeout`` seconds in all; what is
        still waiting for a handler then is requeued at once, and a message a handler still
        holds is left to nsqd's msg_timeout), close every connection and join every thread.

        Safe from any thread, a handler or a connection hook included (that thread is not
        waited for), and from several threads at once (one stops, the others wait for it).
        After a fatal error (:attr:`error`) it stops itself on ``nsq-stop-on-error``."""
        self._stop_requested.set()
        self._discovery.stop()
        self._rdy.stop()
        self._responder.stopping = True
        self._handling.stopping = True
        self._stopping.set()
        self._intake.wake_all()  # a taker waiting in take() returns now
        deadline = time.monotonic() + timeout
        if not self._stop_lock.acquire(timeout=max(timeout, 0.0)):
            return  # another thread is stopping and has not finished in our time
        try:
            if not self._stopped.is_set():
                self._stop(deadline)
        finally:
            self._stop_lock.release()
        with self._lock:
            stopper = self._stopper
        if stopper is not None and stopper is not threading.current_thread():
            stopper.join(max(deadline - time.monotonic(), 0.1))

    def _stop(self, deadline: float) -> None:
        current = threading.current_thread()
        if self._started:
            self._all_started.wait(max(deadline - time.monotonic(), 0.1))
        self._discovery.join(deadline)
        self._rdy.join(deadline)
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
        # Workers drain what was received (a stopping handler too), enable_async() ones answer.
        own = self._workers.index(current) if current in self._workers else -1
        while time.monotonic() < deadline and not self._force_stop.is_set():
            if self._pull:
                self._requeue_unstarted()  # not taken yet: back to nsqd at once
            busy = any(m is not None for i, m in enumerate(self._current) if i != own)
            if not busy and not self._intake.unstarted() and self._unanswered(own) == 0:
                break
            self._wait_idle(min(0.05, max(deadline - time.monotonic(), 0)))
        forced = self._force_stop.is_set()
        if forced:
            self._requeue_running(own)
        self._requeue_unstarted()
        self._responder.requeue_held()
        self._intake.close()
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
        self._discovery.close()
        self._observers.close()
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
        while (item := self._intake.pop()) is not None:
            if type(item) is MessageBatch:
                self._responder.answer_batches([item], "requeue", 0.0, False)
            elif not item.has_responded():
                item.requeue(delay=0, backoff=False)

    @property
    def is_running(self) -> bool:
        return self._started and not self._stopped.is_set()

    @property
    def error(self) -> NSQError | None:
        """The error that stopped the consumer by itself, or None.  For example
        SubOrderIsMustError when the topic must be consumed with ``ordered=True``.
        :meth:`run` raises it."""
        return self._error

    @property
    def tracing(self) -> bool:
        """True while each message's trace id is logged (see :meth:`set_tracing`)."""
        return self._handling.tracing

    def set_tracing(self, enabled: bool) -> None:
        """Switch message tracing on or off at run time: while on, every message received is
        logged at INFO on ``nsqclient.trace`` (topic, partition, nsqd, message id, trace id,
        offset, arrival time) before its handler runs."""
        self._handling.tracing = bool(enabled)

    def _count(self, counter: str) -> None:
        with self._lock:
            self._stats[counter] += 1

    def _fail(self, error: NSQError) -> None:
        """Stop for good: a subscription was refused in a way no reconnect can change."""
        with self._lock:
            if self._error is not None or self._stopping.is_set():
                return
            self._error = error
            logger.error("%s; the consumer stops", error)
            # started under the lock, so that stop() never finds it made but not started
            stopper = threading.Thread(target=self.stop, name="nsq-stop-on-error", daemon=True)
            self._stopper = stopper
            stopper.start()

    # ================================================================ public knobs

    @property
    def max_in_flight(self) -> int:
        return self._rdy.max_in_flight

    def set_max_in_flight(self, max_in_flight: int) -> None:
        """Change ``max_in_flight``; 0 pauses (RDY 0 everywhere), a positive value resumes."""
        value = check_int(max_in_flight, "max_in_flight", "messages", min=0)
        if (value == 0) != (self._rdy.max_in_flight == 0):
            logger.info("%s/%s: %s", self.topic, self.channel, "paused" if not value else "resumed")
        self._rdy.max_in_flight = value
        self._rdy_wake.set()

    def is_starved(self, threshold: float = 0.85) -> bool:
        """True when, on some connection, the messages handlers hold (received, given to a
        handler or taken, and not yet answered) amount to ``threshold`` (a fraction, 0.85 by
        default) or more of its RDY: nsqd will soon send nothing more, so a batching handler
        holding messages (``enable_async``, or pull mode) should process its batch now.
        Messages still waiting for a handler worker, or for :meth:`take`, do not count."""
        check_float(threshold, "threshold", "", min=0)
        with self._lock:
            self._counts_now()
            return is_starved(conn_views(self._conns), threshold)

    def stats(self) -> dict[str, Any]:
        """Counters (received, finished, requeued, given_up, timed_out_locally,
        handler_errors; youzan, ordered: out_of_order, the times a partition's offset went
        backwards), the backoff level, and per-connection stats."""
        with self._lock:
            self._counts_now()
            out: dict[str, Any] = dict(self._stats)
            out["backoff_level"] = self._backoff.level
            out["max_in_flight"] = self._rdy.max_in_flight
            out["connections"] = {
                a: {**f.conn.stats(), **f.counts()} for a, f in self._conns.items()
            }
        return out

    def _counts_now(self) -> None:
        """Bring each connection's counts up to date (the caller holds the lock): the FINs
        workers wrote and have not counted, the messages still waiting for a worker."""
        self._settle_fins()
        self._intake.count_queued()

    def _settle_fins(self) -> None:
        """Count the FINs workers wrote and have not counted yet (consumer/_fin_tally.py):
        whoever reads ``finished`` or a connection's ``in_flight`` calls this first."""
        with self._lock:  # reentrant: most callers hold it already
            self._tally.settle(self._stats)

    def connections(self) -> list[Connection]:
        with self._lock:
            return [f.conn for f in self._conns.values()]

    def connection_counts(self) -> list[ConnectionCounts]:
        """Per connection, a snapshot of its flow-control counts (read-only): the RDY last
        sent, nsqd's ``max_rdy_count``, the messages in flight (received, not answered) and,
        of those, the ones still queued (waiting for a handler worker, or in pull mode for
        :meth:`take`), and nsqd's ``msg_timeout`` (seconds)."""
        with self._lock:
            self._counts_now()
            return connection_counts(self._conns)

    def is_saturated(self) -> bool:
        """True when nsqd will send nothing more until something is answered: every
        connection with a RDY above 0 has that many messages in flight (and one has), and
        no RDY is about to be raised (a connection's first message, received at RDY 1, is
        not saturation: its RDY is raised next)."""
        with self._lock:
            self._settle_fins()
            flows = [f for f in self._conns.values() if f.rdy > 0]
            if not flows or any(f.in_flight < f.rdy for f in flows):
                return False
            return not self._rdy.would_raise()

    def add_observer(self, observer: Any) -> None:
        """Tell ``observer`` what this Consumer does (see :mod:`nsqclient.observe`)."""
        self._observers.add(observer)

    def remove_observer(self, observer: Any) -> None:
        """Stop telling ``observer`` (added with :meth:`add_observer`)."""
        self._observers.remove(observer)

    # ================================================================ pull mode

    def take(
        self, max_messages: int | None = None, timeout: float = 0.0, *, fill: bool = False
    ) -> list[Message]:
        """Pull mode: the messages received and not taken yet, oldest first, at most
        ``max_messages`` (None: all).  Waits up to ``timeout`` seconds for the first one
        (0: never blocks); [] when none came, or the Consumer is stopping (then it waits up
        to ``timeout`` for the stop to end, so that a ``while consumer.is_running`` loop does
        not spin).

        ``fill=True`` fills a batch: once the first message is there it keeps taking until
        ``max_messages`` are there, ``timeout`` seconds have passed since the call, or
        :meth:`is_saturated` (nsqd sends nothing more until something is answered, so the
        batch would never fill), whichever comes first.

        Each message has been through what a handler's goes through first (the trace log,
        youzan's ordered-offset check, the give-up at ``max_tries``: a message given up on is
        answered here and not returned).  A taken message is yours to answer, from any
        thread: ``message.finish()`` / ``requeue()`` / ``touch()``, or many at once with
        :meth:`finish_many` / :meth:`requeue_many`.  Answer within nsqd's msg_timeout (60 s
        by default), or touch it: nsqd sends it again after that.  RDY is kept as in handler
        mode, taken messages or not: the sum of RDY never exceeds ``max_in_flight``, so nsqd
        stops sending once that many are in flight (what a connection held when its RDY was
        lowered for another may briefly add to it, as in go-nsq).

        Raises:
            RuntimeError: the Consumer has a handler, or was never started (nothing is
                received before :meth:`start`).
        """
        batch = self._take_items(max_messages, timeout, False, fill)
        if not batch:
            return []
        for message in batch:
            message._async = True  # the taker answers: nothing answers for it
        with self._lock:
            self._held.update(batch)
        kept = self._prepare(batch)
        observers = self._observers.active
        if observers and kept:
            tell(observers, "messages_taken", self, kept)
        return kept

    def take_batches(
        self, max_messages: int | None = None, timeout: float = 0.0, *, fill: bool = False
    ) -> list[MessageBatch]:
        """Columnar pull mode (``columnar=True``): what :meth:`take` does, but the messages
        come as :class:`~nsqclient.consumer.MessageBatch` objects (one per socket read and
        connection, oldest first; the last one split to stay within ``max_messages``), with
        no Python object per message.  Answer each batch (``batch.finish()``, ...), or many at
        once with :meth:`finish_batches` / :meth:`requeue_batches`; :meth:`touch_batches`
        restarts nsqd's timeout.  A batch may be cut in two (``batch.split(i)``), each part
        then answered on its own.  ``fill=True`` waits for ``max_messages`` as :meth:`take`
        does.

        Raises:
            RuntimeError: the Consumer was not made with ``columnar=True``, or was never
                started.
        """
        batches = self._take_items(max_messages, timeout, True, fill)
        if not batches:
            return []
        batches = self._handling.prepare_batches(batches, self._responder)
        with self._lock:
            self._responder.held_batches.update(batches)
        observers = self._observers.active
        if observers and batches:
            tell(observers, "batches_taken", self, batches)
        return batches

    def _take_items(
        self, max_messages: int | None, timeout: float, columnar: bool, fill: bool
    ) -> list[Any]:
        if not self._pull:
            raise RuntimeError("take() is for a Consumer made without a handler (handler=None)")
        if self._columnar != columnar:
            use = "take_batches()" if self._columnar else "take()"
            raise RuntimeError(f"this Consumer was made with columnar={self._columnar}: use {use}")
        if not self._started:
            call = "take_batches()" if columnar else "take()"
            raise RuntimeError(
                f"{call} on a Consumer that was never started: call consumer.start() first"
                " (nothing is received before it; the messages wait in nsqd)"
            )
        # The common poll (nothing to take, no wait) answered at once: a zero int or float
        # only, which check_float below passes too (False is refused there).
        zero = type(timeout) in (int, float) and timeout == 0
        if zero and max_messages is None and not self._intake.work:
            return []
        if max_messages is not None:
            check_int(max_messages, "max_messages", "messages", min=1)
        check_float(timeout, "timeout", "seconds", min=0)
        deadline = time.monotonic() + timeout
        if fill:
            items = self._intake.fill(max_messages, timeout, self._stopping, self.is_saturated)
        else:
            items = self._intake.take(max_messages, timeout, self._stopping)
        if not items and self._stopping.is_set():
            # nothing more is handed out: wait for the stop, not a busy loop
            self._stopped.wait(max(deadline - time.monotonic(), 0.0))
        return items

    def finish_many(self, messages: Iterable[Message]) -> int:
        """FIN ``messages`` (received by this Consumer), one write per connection; return how
        many were finished.  A message already answered is skipped (with a warning, as
        ``message.finish()`` does); one whose connection is gone is only marked answered
        (nsqd sends it again).  Counters, RDY and backoff move as for ``message.finish()``.

        Raises:
            ValueError: a message this Consumer did not receive (before anything is sent).
        """
        return self._responder.finish_many(messages)

    def requeue_many(
        self, messages: Iterable[Message], delay: float | None = None, backoff: bool = True
    ) -> int:
        """REQ ``messages`` (received by this Consumer), one write per connection; return how
        many were requeued.  ``delay`` in seconds (None: each message's default, as
        ``message.requeue()``); ``backoff``: count each as a failure for backoff.  Skips and
        errors as :meth:`finish_many`."""
        if delay is not None:
            check_float(delay, "delay", "seconds", min=0)
        return self._responder.requeue_many(messages, delay, backoff)

    def finish_batches(self, batches: Iterable[MessageBatch]) -> int:
        """FIN every message of ``batches`` (taken with :meth:`take_batches`), one write per
        connection; return how many.  Skips and errors as :meth:`finish_many` (a batch
        answered or split already is skipped)."""
        return self._responder.answer_batches(list(batches), "finish", None, False)

    def requeue_batches(
        self, batches: Iterable[MessageBatch], delay: float | None = None, backoff: bool = True
    ) -> int:
        """REQ every message of ``batches``, one write per connection; ``delay`` and
        ``backoff`` as :meth:`requeue_many`; return how many."""
        if delay is not None:
            check_float(delay, "delay", "seconds", min=0)
        return self._responder.answer_batches(list(batches), "requeue", delay, backoff)

    def touch_batches(self, batches: Iterable[MessageBatch]) -> int:
        """TOUCH every message of ``batches`` not answered yet (nsqd restarts their
        msg_timeout), one write per connection; return how many."""
        return self._responder.answer_batches(list(batches), "touch", None, False)

    # ================================================================ connection delegate
    # (via Delegate, consumer/_delegate.py; these run on a connection's reader thread: quick,
    # never user code)

    def _flow(self, conn: Connection) -> ConnFlow:
        """The consumer's side of ``conn`` (one that is not in the table, a connection being
        dropped, gets one of its own: its messages are counted nowhere)."""
        flow = self._conns.get(conn.key)
        if flow is None or flow.conn is not conn:
            flow = ConnFlow(conn, time.monotonic())
        return flow

    def _on_messages(self, conn: Connection, decoded: list[protocol.DecodedMessage]) -> None:
        """Decoded messages of one socket read: one lock round and one hand-off for all."""
        now = conn.last_message_at
        flow = self._flow(conn)
        received = Message._received
        responder = self._responder
        messages = [received(d, responder, flow, now) for d in decoded]
        self._intake.put(flow, messages, len(messages), now)

    def _on_message_run(self, conn: Connection, run: protocol.MessageRun) -> None:
        """The messages of one socket read, undecoded: one lock round and one hand-off for
        all of them.  Classic NSQ's are decoded straight into Message objects; a columnar
        Consumer keeps them as one batch."""
        now = conn.last_message_at
        flow = self._flow(conn)
        if self._columnar:
            origin = Origin.of(conn, self.config.youzan)
            batch = MessageBatch(
                run.buffer, run.starts, run.ends, origin, now, self._responder, flow
            )
            self._intake.put(flow, [batch], len(run.starts), now)
            return
        youzan, extended, ordered = conn.config.youzan, conn.extended, conn.ordered
        if youzan or extended or ordered:
            decode, buf = protocol.decode_message_at, run.buffer
            pairs = zip(run.starts, run.ends, strict=True)
            decoded = [decode(buf, start, end, youzan, extended, ordered) for start, end in pairs]
            received = Message._received
            messages = [received(d, self._responder, flow, now) for d in decoded]
        else:
            messages = Message._run(run.buffer, run.starts, run.ends, self._responder, flow, now)
        self._intake.put(flow, messages, len(messages), now)

    def _on_server_error(self, conn: Connection, error: ServerError) -> None:
        if not self._responder.answer_failed(conn, error):
            logger.warning("nsqd %s: %s", conn.address, error)

    def _on_close(self, conn: Connection, reason: BaseException | None) -> None:
        with self._lock:
            flow = self._conns.get(conn.key)
            if flow is None or flow.conn is not conn:
                return
            del self._conns[conn.key]
        self._discovery.lost(conn.key, reason)
        self._rdy_wake.set()

    # ================================================================ handlers

    def _work_loop(self, index: int) -> None:
        """Worker ``index``: handle runs of messages until the queue closes (see
        consumer/_work_queue.py: runs are shared, so no message waits behind a busy handler
        while a worker is idle)."""
        next_run = self._intake.next_run
        handle_run = self._handling.handle_run
        current = self._current
        while (run := next_run(index)) is not None:
            handle_run(run, current, index)


add_options_help(Consumer, "Consumer")
