"""The Producer's backlog: asynchronous publishes that could not be written at once.

``pub_async()`` must return within microseconds whatever the network does.  When no connection
is ready (the first publish, nsqd down, a silent listener in the handshake) the work that could
block (connecting, looking up) is handed to a :class:`Backlog`: one thread runs the jobs in the
order they came, so one caller's publishes keep their order, and ends once none has come for
:data:`LINGER` seconds (or at :meth:`Backlog.close`).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

__all__ = ["Backlog"]

logger = logging.getLogger("nsqclient.producer")

Job = Callable[[], None]

#: Seconds an idle backlog thread waits for another job before it ends.  Starting a thread
#: blocks its starter until the thread runs (several ms on a busy machine), and the starter is
#: a pub_async() caller: an event loop's thread in an ASGI app, which must never wait that long.
LINGER = 5.0


class Backlog:
    """Jobs run one at a time, in order, on a thread named ``nsq-backlog-<name>`` that exists
    while there are jobs (and :data:`LINGER` seconds after the last).  A job must not raise
    (it reports into its own Future); one that does is logged and the next runs."""

    def __init__(self, name: str):
        self.name = name
        #: the jobs waiting or running, oldest first (test its truth without the lock: a
        #: publisher only needs to know whether it must queue behind some)
        self.jobs: deque[Job] = deque()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        #: the last thread started (still known while it returns: see close)
        self._last: threading.Thread | None = None
        self._idle = threading.Condition(self._lock)
        #: a lingering thread waits on it for the next job
        self._work = threading.Condition(self._lock)
        self._closed = False

    def submit(self, job: Job) -> None:
        """Queue ``job``; start the thread when it is the only one."""
        with self._lock:
            self.jobs.append(job)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"nsq-backlog-{self.name}", daemon=True
                )
                self._last = self._thread
                self._thread.start()
            else:
                self._work.notify()

    def close(self, timeout: float = 1.0) -> None:
        """End the thread once the jobs queued have run (it lingers no more); wait up to
        ``timeout`` seconds for it to end."""
        with self._lock:
            self._closed = True
            self._work.notify()
            thread = self._last  # the thread may have forgotten itself while returning
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(timeout, 0.0))

    def wait_empty(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until every job has run; True if it has.  On the
        backlog's own thread (a job, or a done callback it runs, closing the Producer) it does
        not wait: the job running is the one waiting."""
        if threading.current_thread() is self._thread:
            with self._lock:
                return not self.jobs
        with self._idle:
            return self._idle.wait_for(lambda: not self.jobs, max(timeout, 0.0))

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self.jobs:
                    self._idle.notify_all()
                    if not self._closed:
                        self._work.wait(LINGER)
                    if not self.jobs:
                        self._thread = None
                        return
                job = self.jobs[0]
            try:
                job()
            except Exception:
                logger.exception("unexpected error in a backlogged publish; the next one runs")
            # Popped only once it ran: a publish made meanwhile sees a backlog and queues
            # behind it, rather than overtaking it on a connection that just came up.
            with self._lock:
                self.jobs.popleft()
