"""pynsq's ``Writer``: publishes with callbacks, on a :class:`~nsqclient.Producer`."""

from __future__ import annotations

import functools
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ClassVar

from ..addresses import nsqd_addresses, split_host_port
from ..checks import check_int
from ..errors import ConnectionClosedError, NSQError
from ..producer import Producer
from ..protocol import Body
from ._errors import Error, SendError
from ._options import check_seconds, translate_kwargs
from ._runtime import Registered, registry
from ._tornado_bridge import LoopStopped

__all__ = ["Writer"]

logger = logging.getLogger("nsqclient.compat")


class _ConnRef:
    """What a Writer callback receives as ``conn`` (pynsq passed its AsyncConn): the nsqd that
    answered, with pynsq's ``id``, ``host`` and ``port``."""

    __slots__ = ("host", "port")

    def __init__(self, address: str):
        self.host, self.port = split_host_port(address)

    @property
    def id(self) -> str:
        return f"{self.host}:{self.port}"

    def __str__(self) -> str:
        return self.id

    def __repr__(self) -> str:
        return f"<nsqd {self.id}>"


_STOP = object()
PubCallback = Callable[[Any, Any], Any]


class Writer(metaclass=Registered):
    """pynsq's ``nsq.Writer``: publish with a callback.

    Args:
        nsqd_tcp_addresses: ``"host:port"`` or a list of them; each publish goes to one of them.
        reconnect_interval: seconds before retrying an nsqd that could not be reached.
        name: used in log lines (default: the first address).
        **kwargs: pynsq's connection options (see ``nsqclient.compat``'s docstring).

    ``callback(conn, data)`` runs on the Writer's callback thread (``nsq-callbacks-<name>``):
    ``data`` is nsqd's answer (``b"OK"``) or an :data:`Error` (a ServerError naming the E_* code,
    ConnectionClosedError, or SendError when no nsqd could be reached); ``conn`` has pynsq's
    ``id``/``host``/``port`` of the nsqd that answered (None when none was reached).  Without a
    callback, failures are logged.  Each method also returns a Future of the same answer,
    resolved on the callback thread just before the callback runs.

    Resends follow the Producer's one policy, nothing of the Writer's own: a publish that nsqd
    provably did not process (queued on a connection behind another publish's fatal error, after
    which nsqd processes nothing more) is handed to :meth:`Producer.pub` (and its siblings) on
    the Writer's resend thread (``nsq-resend-<name>``), which sends it again as ``pub()`` does
    (fresh connection, next address, within ``pub_timeout``); pynsq failed its callback with
    the other publish's error.  A publish whose outcome is unknown (the connection died while it
    was in flight) is never resent, as in pynsq: its callback gets the ConnectionClosedError.
    ``pub_retries`` is therefore refused here (TypeError); use :class:`Producer` for it.
    """

    #: what :func:`run` does with it: close it when it ends
    run_role: ClassVar[str] = "writer"

    def __init__(
        self,
        nsqd_tcp_addresses: str | Sequence[str],
        reconnect_interval: float = 15.0,
        name: str | None = None,
        **kwargs: Any,
    ):
        if "pub_retries" in kwargs:
            raise TypeError(
                f"{type(self).__name__}() does not take pub_retries: like pynsq's, a Writer never "
                "resends a publish whose outcome is unknown, its callback gets the error; use "
                "nsqclient.Producer(..., pub_retries=N) to resend those"
            )
        options = translate_kwargs(kwargs, type(self).__name__)
        addresses = nsqd_addresses(nsqd_tcp_addresses, "nsqd_tcp_addresses")
        if not addresses:
            raise ValueError("Writer needs at least one nsqd address")
        self.nsqd_tcp_addresses = addresses
        self.name = name or addresses[0]
        self.reconnect_interval = check_seconds("reconnect_interval", reconnect_interval)
        producer_options = {
            # pynsq retried an unreachable nsqd every reconnect_interval, without growth.
            "reconnect_interval": self.reconnect_interval,
            "max_reconnect_interval": self.reconnect_interval,
            **options,
        }
        self._producer = Producer(addresses, **producer_options)
        self._single = addresses[0] if len(addresses) == 1 else None
        self._callbacks: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._stop_sent = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._callback_loop, name=f"nsq-callbacks-{self.name}", daemon=True
        )
        self._thread.start()
        # Runs the Producer's blocking publish for resends (started on first use).
        self._resender = ThreadPoolExecutor(1, thread_name_prefix=f"nsq-resend-{self.name}")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}{' closed' if self._closed else ''}>"

    @property
    def producer(self) -> Producer:
        """The :class:`~nsqclient.Producer` doing the work (not pynsq API)."""
        return self._producer

    @property
    def callback_thread(self) -> threading.Thread:
        """The thread that runs this Writer's callbacks (hands them to the IOLoop under a
        tornado :func:`run`)."""
        return self._thread

    # ---------------------------------------------------------------- publishing

    def pub(self, topic: str, msg: Body, callback: PubCallback | None = None) -> Future[bytes]:
        """Publish one message (bytes, bytearray, memoryview, or str sent as UTF-8);
        ``callback(conn, data)`` gets the answer (see the class doc).  The Future returned
        resolves to ``b"OK"`` or fails with the error the callback gets."""
        producer = self._producer
        return self._pub(
            "pub",
            topic,
            msg,
            callback,
            lambda: producer.pub_async(topic, msg),
            lambda: producer.pub(topic, msg),
        )

    def mpub(
        self, topic: str, msg: Sequence[Body] | Body, callback: PubCallback | None = None
    ) -> Future[bytes]:
        """Publish several messages in one MPUB (a single body is sent as a list of one)."""
        bodies = [msg] if isinstance(msg, bytes | bytearray | memoryview | str) else msg
        if not isinstance(bodies, list | tuple | set | frozenset):
            raise TypeError(f"mpub takes a list of message bodies, not {type(msg).__name__}")
        items: list[Any] = list(bodies)
        producer = self._producer
        return self._pub(
            "mpub",
            topic,
            msg,
            callback,
            lambda: producer.mpub_async(topic, items),
            lambda: producer.mpub(topic, items),
        )

    def dpub(
        self, topic: str, delay_ms: int, msg: Body, callback: PubCallback | None = None
    ) -> Future[bytes]:
        """Publish one message that nsqd delivers after ``delay_ms`` MILLISECONDS (as pynsq)."""
        delay = check_int(delay_ms, "delay_ms", "milliseconds", min=0) / 1000.0
        producer = self._producer
        return self._pub(
            "dpub",
            topic,
            msg,
            callback,
            lambda: producer.dpub_async(topic, msg, delay=delay),
            lambda: producer.dpub(topic, msg, delay=delay),
        )

    def _pub(
        self,
        command: str,
        topic: str,
        msg: Any,
        callback: PubCallback | None,
        submit: Callable[[], Future],
        resend: Callable[[], object],
    ) -> Future:
        if callback is None:
            callback = functools.partial(self._finish_pub, command=command, topic=topic, msg=msg)
        elif not callable(callback):
            raise TypeError(f"callback must be callable, not {callback!r}")
        if self._closed:
            raise ConnectionClosedError(f"{self!r} is closed")
        outer: Future = Future()
        try:
            future = submit()  # bad input raises here
        except ConnectionClosedError as exc:
            self._enqueue((callback, None, SendError("no open connections", exc), outer))
            return outer
        future.add_done_callback(functools.partial(self._on_answer, callback, resend, outer))
        return outer

    def _on_answer(
        self, callback: PubCallback, resend: Callable[[], object], outer: Future, future: Future
    ) -> None:
        # Runs where the future completes, usually a connection's reader thread: only hand on.
        error = future.exception()
        address = getattr(future, "nsqd_address", None)
        if error is not None and address is None:
            # Never written: no nsqd could be reached (refused, no handshake, pub_timeout).
            self._enqueue((callback, None, SendError("no open connections", error), outer))
            return
        if isinstance(error, ConnectionClosedError) and not error.maybe_processed:
            # Queued behind a fatal error on its connection: nsqd provably did not process it.
            # The Producer's blocking publish sends it again, by the Producer's rules.
            try:
                self._resender.submit(self._resend, callback, resend, outer, error)
                return
            except RuntimeError:  # close() shut the resend thread down meanwhile
                pass
        address = address or self._single
        conn = _ConnRef(address) if address else None
        self._enqueue((callback, conn, error if error is not None else future.result(), outer))

    def _resend(
        self,
        callback: PubCallback,
        resend: Callable[[], object],
        outer: Future,
        first_error: ConnectionClosedError,
    ) -> None:
        """On the resend thread: the Producer's blocking publish, then the callback's turn."""
        data: Any
        try:
            resend()
            data = b"OK"  # pub()/mpub()/dpub() return only when nsqd answered OK
        except ConnectionClosedError as exc:
            data = exc if exc.maybe_processed else SendError("no open connections", exc)
        except NSQError as exc:
            data = exc
        except Exception as exc:  # not an NSQ outcome: still the callback's to hear about
            logger.exception("[%s] resending a publish failed", self.name)
            data = SendError(f"resend failed after {first_error}", exc)
        self._enqueue((callback, _ConnRef(self._single) if self._single else None, data, outer))

    def _enqueue(self, item: tuple) -> None:
        with self._lock:
            if not self._stop_sent:
                self._callbacks.put(item)
                return
        logger.warning("[%s] closed; dropping a publish callback", self.name)
        outer = item[-1]
        if not outer.done():
            outer.set_exception(ConnectionClosedError(f"{self!r} closed", maybe_processed=True))

    def _callback_loop(self) -> None:
        while True:
            try:
                item = self._callbacks.get(timeout=1.0)
            except queue.Empty:
                continue
            if item is _STOP:
                return
            bridge = registry.bridge
            if bridge is not None:
                try:
                    bridge.call(self._run_callback, *item)  # pynsq's model: on the IOLoop
                    continue
                except LoopStopped:
                    pass  # run() is ending: the callback still runs, here, in order
            self._run_callback(*item)

    def _run_callback(self, callback: PubCallback, conn: Any, data: Any, outer: Future) -> None:
        # The returned Future is resolved here too, so its own done-callbacks never run on a
        # connection's thread.
        if not outer.done():
            if isinstance(data, BaseException):
                outer.set_exception(data)
            else:
                outer.set_result(data)
        try:
            callback(conn, data)
        except Exception:
            logger.exception("[%s] uncaught exception in publish callback %r", self.name, callback)

    def _finish_pub(self, conn: Any, data: Any, command: str, topic: str, msg: Any) -> None:
        """The callback used when none is given: log failures (as pynsq)."""
        if isinstance(data, Error):
            logger.error(
                "[%s] failed to %s (%s, %r): %s",
                conn.id if conn is not None else "NA",
                command,
                topic,
                msg,
                data,
            )

    def heartbeat(self, conn: Any) -> None:
        """pynsq called this on each heartbeat; nsqclient never does."""

    # ---------------------------------------------------------------- closing

    def close(self, timeout: float = 5.0) -> None:
        """Wait up to ``timeout`` seconds for publishes in flight, run their callbacks, close
        the connections and stop the callback thread (not pynsq API: pynsq never closed)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        registry.remove(self)
        self._producer.close(timeout)
        # A resend still running ends at once now that the Producer is closed (its connections
        # failed what they held); its callback is queued before the callback thread stops.
        self._resender.shutdown(wait=True)
        with self._lock:
            self._stop_sent = True
            self._callbacks.put(_STOP)
        bridge = registry.bridge
        on_loop = bridge is not None and bridge.on_loop_thread()
        # Not from the callback thread, nor from the IOLoop its callbacks wait on.
        if threading.current_thread() is not self._thread and not on_loop:
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.warning("[%s] a publish callback still runs after close()", self.name)
