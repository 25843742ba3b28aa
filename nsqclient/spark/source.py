"""The streaming source: driver-side Consumers hold messages until Spark commits them.

Where things run (Spark 4 Python data sources):

* ``latestOffset``, ``partitions``, ``commit`` and ``stop`` run in one long-lived Python
  process beside the driver, for the whole query.  :class:`NSQStreamReader` starts its
  :class:`~nsqclient.spark.fleet.Fleet` there (``ceil(max_in_flight / max_rdy_count)``
  Consumers, so that nsqd's per-connection RDY cap does not cap ``max_in_flight``), lazily, at
  the first ``latestOffset``: the reader object is also built and pickled elsewhere (to make
  the executors' ``read``), so ``__init__`` opens nothing.
* The Consumers are in columnar pull mode (no handler, no worker thread, no Python object per
  message): their reader threads leave what they receive in the Consumers' queues as
  :class:`~nsqclient.consumer.MessageBatch` objects (one socket read each), and the reader takes
  them all (``consumer.take_batches()``) into a :class:`~nsqclient.spark.ledger.Ledger`
  (messages numbered in arrival order) when it cuts a batch, and every quarter
  ``msg_timeout``.  ``latestOffset`` FINishes the committed batch, waits (at most
  ``fillTimeout``) for nsqd to refill what those FINs freed, and cuts the next batch from what
  is held; ``partitions`` puts the batch's messages, as nsqd framed them, into the
  InputPartitions (:mod:`nsqclient.spark.frames`: the bytes read, byte ranges and offsets);
  the executors' ``read`` decodes them into Arrow rows.  No executor talks to nsqd.
* A message is FINished on the driver, on the connection it came on (one write per connection
  for the whole batch), once Spark has committed its batch: at the next ``latestOffset`` (Spark
  calls it only after it wrote the batch's entry in the checkpoint's commit log) or at
  ``commit``, whichever comes first.  Until then a toucher thread TOUCHes it every half
  ``msg_timeout``.  When the reader stops, what it still holds is requeued (REQ with no delay,
  after RDY 0 so that nsqd does not send it straight back).
* Spark 4.3 does not call ``stop()`` when a query stops: it ends the reader's process with
  SIGTERM.  The reader therefore handles SIGTERM in that process (only where nobody else
  installed a handler): it requeues what it holds, stops the Consumers, then dies of the signal
  as Spark meant.  A SIGKILL (or a crash) leaves the messages to nsqd's ``msg_timeout``.
* Telemetry: ``NSQInstrumentor().instrument()`` in the user's driver script does not reach
  this process.  Here, when the standard ``OTEL_*`` environment names an exporter, the reader
  sets OpenTelemetry's SDK up from it and instruments nsqclient at its start
  (:func:`configure_telemetry`: :func:`nsqclient.otel.configure_from_env`); nothing of
  OpenTelemetry is imported otherwise.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from .fleet import Fleet
from .frames import Frames, frames_of, to_rows
from .ledger import Ledger
from .options import SourceOptions

__all__ = ["NSQStreamReader", "NSQInputPartition"]

logger = logging.getLogger("nsqclient.spark.source")

#: seconds assumed for nsqd's msg_timeout before a connection told us its own
_DEFAULT_MSG_TIMEOUT = 60.0

#: The garbage collector's thresholds in the process Spark starts for the source's reader.
READER_GC_THRESHOLD = (50_000, 20, 100)

#: The module Spark runs (``python -m ...``) as the driver-side process of a Python source.
SPARK_SOURCE_RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"

#: ``service.name`` of the reader's telemetry when ``OTEL_SERVICE_NAME`` (or
#: ``OTEL_RESOURCE_ATTRIBUTES``) gives none
TELEMETRY_SERVICE_NAME = "nsqclient-spark-source"

#: seconds without a new message after which a filling batch is cut (nsqd refills RDY freed by
#: FINs within a few milliseconds on a loopback or a LAN)
FILL_GAP = 0.02


def in_spark_source_runner() -> bool:
    """True in the Python process Spark starts for a Python stream source (and nothing else)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == SPARK_SOURCE_RUNNER


def configure_telemetry() -> bool:
    """OpenTelemetry from the ``OTEL_*`` environment, in Spark's source process: when it names
    an exporter (``OTEL_TRACES_EXPORTER``, ``OTEL_METRICS_EXPORTER``, or an OTLP endpoint), set
    the SDK up from it and instrument nsqclient (see
    :func:`nsqclient.otel.configure_from_env`); True when that was done.  Nothing of
    OpenTelemetry is imported when the environment asks for nothing.  Only called in Spark's
    dedicated source process (see :func:`in_spark_source_runner`): in a process the user owns,
    setting up telemetry is the user's call.  A set-up that fails is logged, and the source
    runs without telemetry."""
    from ..otel.env import configure_from_env

    try:
        return configure_from_env(service_name=TELEMETRY_SERVICE_NAME)
    except Exception:
        logger.exception("cannot set OpenTelemetry up from the OTEL_* environment")
        return False


def flush_telemetry(timeout: float = 5.0) -> None:
    """Export what the global tracer and meter providers hold (spans in the batch processor's
    queue, the metrics since the last periodic export), waiting up to ``timeout`` seconds for
    each.  Spark ends its source process with SIGTERM, which runs no ``atexit`` hook (where
    the SDK would flush), so the reader flushes when it stops.  Only after
    :func:`configure_telemetry` said True (OpenTelemetry is imported then)."""
    from opentelemetry import metrics, trace

    for provider in (trace.get_tracer_provider(), metrics.get_meter_provider()):
        flush = getattr(provider, "force_flush", None)
        if flush is not None:
            try:
                flush(int(timeout * 1000))
            except Exception:
                logger.exception("flushing %r failed", provider)


def relax_gc() -> tuple[int, ...]:
    """Raise this process's GC thresholds to at least :data:`READER_GC_THRESHOLD`; return the
    thresholds before.

    The reader holds up to ``max_in_flight`` messages (tens of thousands of objects) and makes
    a few objects per message received: with CPython's defaults (700, 10, 10) the collector
    runs every few hundred messages and its older generations walk what is held.  Measured
    (bench/spark_reader.py, 50,000 in flight): 9-10 µs of CPU per message with the defaults,
    7-8 µs relaxed.  Messages are freed by reference counting when Spark commits them, not
    by the collector, so they are not held longer.  Only done in Spark's dedicated source
    process (see :func:`in_spark_source_runner`), never in a process the user owns."""
    before = gc.get_threshold()
    gc.set_threshold(*(max(b, r) for b, r in zip(before, READER_GC_THRESHOLD, strict=True)))
    return before


class NSQInputPartition(InputPartition):
    """One Spark partition of a micro-batch: its messages as nsqd framed them (or None); the
    executor's ``read`` makes the rows (:func:`nsqclient.spark.frames.to_rows`)."""

    def __init__(self, index: int, frames: Frames | None):
        super().__init__(index)
        self.frames = frames

    @property
    def count(self) -> int:
        """How many messages (rows) it holds."""
        return 0 if self.frames is None else self.frames.messages

    def __repr__(self) -> str:
        return f"NSQInputPartition({self.value}, rows={self.count})"


class NSQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The micro-batch stream reader of the ``nsq`` data source (see the module docstring).

    Args:
        options: the parsed source options.
    """

    def __init__(self, options: SourceOptions):
        self.options = options
        self.session = uuid.uuid4().hex
        self._ledger = Ledger(self.session)
        self._fleet: Fleet | None = None
        self._toucher: threading.Thread | None = None
        self._stopping = threading.Event()
        self._start_lock = threading.Lock()
        # Taking from the Consumers and numbering in the ledger happen together.
        self._take_lock = threading.Lock()
        # Serialises FIN, TOUCH and REQ: a message is never touched after it was answered.
        self._answer_lock = threading.Lock()
        self._available_now = False
        self._stop_claimed = False
        self._stop_done = threading.Event()
        #: OpenTelemetry was set up from the environment at the start (flushed at stop)
        self._telemetry = False
        self._sigterm_seen = False

    # Only the picklable configuration travels; threads and sockets stay in the driver process.
    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "session": self.session}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]
        self.session = state["session"]
        self._ledger = Ledger(self.session)

    # ------------------------------------------------------------------ Spark's calls

    def initialOffset(self) -> dict:
        """Offset of a query that has no checkpoint yet: before this reader's first message."""
        return self._ledger.offset(0)

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxMessagesPerBatch`` as a row limit, else all that is held."""
        if self.options.max_messages_per_batch is not None:
            return ReadMaxRows(self.options.max_messages_per_batch)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: each ``latestOffset`` waits for messages until the topic is
        quiet for ``availableNowIdleTimeout`` seconds; an empty answer ends the query."""
        self._available_now = True

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """FIN what Spark committed (everything up to ``start``), let nsqd refill, then cut the
        next batch.

        Spark calls this for batch N+1 only after batch N ran and its commit-log entry was
        written, so ``start`` (the end of batch N) is committed.  The FINs free batch N's RDY;
        cutting at once would give batch N+1 only what arrived while N ran (batches settle at
        half of ``max_in_flight``), so the cut waits, at most ``fillTimeout`` seconds, until
        nsqd refilled every connection, or ``maxMessagesPerBatch`` are held, or no message came
        for 20 ms."""
        self._ensure_started()
        fleet = self._fleet
        finished = self._finish_through(start)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if fleet is not None:
            fleet.adjust()
            full = fleet.saturated
        else:
            full = _never
        # Both waits take what the Consumers received first (refresh); the take after them
        # serves the cut without a wait.
        if self._available_now:
            idle = self.options.available_now_idle_timeout
            self._ledger.wait_for_batch(
                start,
                max_rows,
                deadline=float("inf"),
                gap=min(FILL_GAP, idle),
                empty_wait=idle,
                full=full,
                stop=self._stopping,
                refresh=self._take,
            )
        elif self.options.fill_timeout > 0:
            self._ledger.wait_for_batch(
                start,
                max_rows,
                deadline=time.monotonic() + self.options.fill_timeout,
                gap=FILL_GAP,
                empty_wait=FILL_GAP if finished else 0.0,
                full=full,
                stop=self._stopping,
                refresh=self._take,
            )
        self._take()
        end = self._ledger.latest(start, max_rows)
        if end != start:
            logger.debug("batch planned: %s -> %s", start, end)
        return end

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        """The messages of ``(start, end]``, split into ``numPartitions`` InputPartitions."""
        batches = self._ledger.slice(start, end)
        if not batches:
            if self._ledger.seq_of(end) is None and start != end:
                logger.info(
                    "batch %s -> %s is from an earlier run of the query; its messages were not "
                    "finished and come back from nsqd",
                    start,
                    end,
                )
            return []
        parts = frames_of(batches, self.options.num_partitions)
        return [NSQInputPartition(i, frames) for i, frames in enumerate(parts)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """On an executor: decode the partition's messages and yield them as one Arrow
        record batch (no connection to nsqd)."""
        frames = getattr(partition, "frames", None)
        if frames is not None and frames.messages:
            yield to_rows(frames, self.options.topic)

    def commit(self, end: dict) -> None:
        """Spark committed everything up to ``end``: FIN it (usually done already by
        :meth:`latestOffset`)."""
        self._finish_through(end)

    def stop(self) -> None:
        """Requeue every message still held and stop the Consumer and the toucher.

        Idempotent; a second caller waits (up to 30 s) for the first one to finish."""
        with self._start_lock:
            claimed = not self._stop_claimed
            self._stop_claimed = True
            self._stopping.set()
        if not claimed:
            self._stop_done.wait(30.0)
            return
        try:
            if self._fleet is not None:
                # RDY 0 first: what is requeued below is not sent straight back to us.
                self._fleet.pause()
            self._take()
            with self._answer_lock:
                held = self._ledger.release_all()
                if self._fleet is not None:
                    self._fleet.requeue(held)
            if held:
                count = sum(map(len, held))
                logger.info("stopping: requeued %d messages not committed by Spark", count)
            if self._fleet is not None:
                # CLS, then close: the REQs queued before are written first.
                self._fleet.stop(timeout=10.0)
            if self._toucher is not None:
                self._toucher.join(5.0)
            if self._telemetry:
                flush_telemetry()
        finally:
            self._stop_done.set()

    # ------------------------------------------------------------------ internals

    def _capacity(self) -> int:
        return int(self.options.consumer_options["max_in_flight"])

    def _ensure_started(self) -> None:
        with self._start_lock:
            if self._fleet is not None or self._stopping.is_set():
                return
            opts = self.options
            if in_spark_source_runner():
                before = relax_gc()
                logger.debug("GC thresholds %s -> %s", before, gc.get_threshold())
                # Before the Consumers exist: the instrumentation observes them from the start.
                self._telemetry = configure_telemetry()
                if self._telemetry:
                    logger.info("OpenTelemetry configured from the OTEL_* environment")
            fleet = Fleet(
                opts.topic,
                opts.channel,
                nsqd_tcp_addresses=opts.nsqd_tcp_addresses or None,
                lookupd_http_addresses=opts.lookupd_http_addresses or None,
                **opts.consumer_options,
            )
            fleet.start()
            self._fleet = fleet
            self._handle_sigterm()
            self._toucher = threading.Thread(
                target=self._touch_loop,
                name=f"nsq-spark-toucher-{opts.topic}/{opts.channel}",
                daemon=True,
            )
            self._toucher.start()
            logger.info(
                "nsq source %s/%s started (session %s, max_in_flight %d, %d connections per nsqd)",
                opts.topic,
                opts.channel,
                self.session,
                self._capacity(),
                len(fleet.consumers),
            )

    def _handle_sigterm(self) -> None:
        """In Spark's reader process (main thread, where no one else handles SIGTERM): on
        SIGTERM, :meth:`stop` on a thread of its own, then die of SIGTERM.

        The handler itself only starts that thread: it runs on the main thread between two
        bytecodes, maybe inside a FIN holding a lock that stopping needs."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return

        def stop_then_die() -> None:
            try:
                self.stop()
            finally:
                os.kill(os.getpid(), signal.SIGTERM)  # the handler below ends the process

        def on_sigterm(signum: int, frame: Any) -> None:
            if self._stop_done.is_set():
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)
                return
            if not self._sigterm_seen:
                self._sigterm_seen = True
                logger.info("SIGTERM: the query stops; requeueing what the reader holds")
                threading.Thread(target=stop_then_die, name="nsq-spark-stop", daemon=True).start()

        signal.signal(signal.SIGTERM, on_sigterm)

    def _take(self) -> None:
        """Move what the Consumers received into the ledger (numbered in that order), to be
        held until Spark commits them; once stopping, requeue it instead."""
        fleet = self._fleet
        if fleet is not None:
            with self._take_lock:
                batches = fleet.take()
                if not batches:
                    return
                if self._stopping.is_set():
                    fleet.requeue(batches)
                else:
                    self._ledger.add_many(batches)

    def _finish_through(self, offset: dict) -> int:
        """FIN every held message up to ``offset`` (if it is this reader's); how many."""
        seq = self._ledger.seq_of(offset)
        if seq is None:
            return 0
        with self._answer_lock:
            done = self._ledger.release_through(seq)
            if done and self._fleet is not None:
                self._fleet.finish(done)
        count = sum(map(len, done))
        if count:
            logger.debug("finished %d messages through seq %d", count, seq)
        return count

    def _msg_timeouts(self) -> dict[str, float]:
        fleet = self._fleet
        return {} if fleet is None else fleet.msg_timeouts()

    def _touch_loop(self) -> None:
        configured = self.options.consumer_options.get("msg_timeout")
        default = float(configured) if configured else _DEFAULT_MSG_TIMEOUT
        while True:
            timeouts = self._msg_timeouts()
            shortest = min([default, *timeouts.values()])
            # Wake four times per shortest timeout: each message is touched between a half and
            # three quarters of its timeout after its last delivery or touch.
            if self._stopping.wait(max(shortest / 4, 0.05)):
                return
            # Messages received since the last batch was cut wait in the Consumers: take them,
            # so that they are touched too when a batch runs for long.
            self._take()
            # Under the answer lock: nothing due is FINished (or requeued) meanwhile.
            with self._answer_lock:
                due = self._ledger.due_for_touch(time.monotonic(), timeouts, default)
                touched = 0 if self._fleet is None or not due else self._fleet.touch(due)
            if touched:
                logger.debug("touched %d held messages", touched)


def _never() -> bool:
    return False
