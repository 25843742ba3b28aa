"""pynsq drop-in: ``Reader``, ``Writer``, ``LegacyReader`` and ``run()`` with pynsq 0.9.1's
signatures; tornado only when the program uses it.

A legacy pynsq program runs unchanged but for its import::

    import nsqclient as nsq

    def handler(message):
        print(message.body)
        return True                      # True: FIN, False: REQ (with backoff)

    r = nsq.Reader(topic="clicks", channel="archive", message_handler=handler,
                   lookupd_http_addresses=["http://127.0.0.1:4161"], max_in_flight=9)
    nsq.run()                            # blocks until SIGINT/SIGTERM or nsq.stop()

pynsq's other public names (encoders, BackoffTimer, SyncConn, AsyncConn) are in
:mod:`nsqclient.legacy`.

Built on :class:`~nsqclient.consumer.Consumer` and :class:`~nsqclient.producer.Producer`.
pynsq's keyword arguments keep pynsq's names and units and are translated to nsqclient's
options (seconds everywhere): ``heartbeat_interval`` (seconds in both), ``msg_timeout``
(seconds in both), ``output_buffer_timeout`` (MILLISECONDS in pynsq, converted), ``requeue_delay``
(seconds, the base of the default REQ delay), ``timeout`` (seconds, connect and write timeout),
``tls_options`` (the ``ssl`` keywords pynsq passed to tornado: ``ca_certs``, ``certfile``,
``keyfile``, ``cert_reqs``; ``ssl_version`` and ``ciphers`` are ignored with a warning; like
pynsq, the whole dict is ignored, with a warning, unless ``tls_v1`` is set), and
``tls_v1``, ``snappy``, ``deflate``, ``deflate_level``, ``output_buffer_size``, ``sample_rate``,
``user_agent``, ``auth_secret``, ``hostname``.  nsqclient's own option names (see
:mod:`nsqclient.config`, in seconds) are accepted too.  ``io_loop`` (older pynsq) is accepted and
ignored with a warning.  Any other keyword raises TypeError (pynsq raised AssertionError).

Threads: each Reader runs its handler on its own worker thread, one message at a time (as on
pynsq's single IOLoop); two Readers run their handlers in parallel.  A Writer's callbacks run
on its own callback thread (``nsq-callbacks-<name>``), never on a connection thread.  When the
program has imported tornado, :func:`run` runs tornado's IOLoop instead and both are handed to
it (:mod:`nsqclient.tornado_bridge`): pynsq's model, where tornado code and
``IOLoop.current().stop()`` work in handlers and callbacks.

Deliberate differences from pynsq:

* A handler returning None (or anything but True/False, an awaitable or a Future) without having
  answered the message is an error in pynsq too: pynsq logs it and leaves the message in flight
  until nsqd's msg_timeout redelivers it.  Here it is logged and requeued at once, without
  backoff, with a delay of the connection's msg_timeout: same outcome, the in-flight slot is
  freed.
* A coroutine handler is run to completion on the worker thread (``asyncio.run``), so coroutine
  handlers of one Reader do not interleave.  A ``concurrent.futures.Future`` returned by a handler
  answers the message when it completes (truthy result: FIN, otherwise REQ).
* Writer: bad input (invalid topic name, empty or non-bytes body, an empty MPUB, a negative delay)
  raises ValueError/TypeError at the call site.  pynsq sent it; nsqd then refused it and closed
  the connection, failing the callbacks of every other publish in flight on it.  ``str`` bodies
  are accepted (UTF-8).  Publishing works before ``run()`` (the connection is made on first use;
  pynsq answered ``SendError('no open connections')``); that first publish may block the caller
  for up to the connect and handshake timeouts.  A publish queued behind another publish's
  fatal error on the same connection (which nsqd provably did not process) is sent again;
  pynsq failed its callback with the other publish's error.  pub/mpub/dpub return a Future
  resolved on the callback thread: do not wait on it from inside a callback of the same Writer.
* Without tornado there is no IOLoop: :func:`stop` (thread-safe, callable from a handler) ends
  :func:`run`; with it, ``IOLoop.current().stop()`` does too.  When :func:`run` returns, every
  registered Reader has been stopped cleanly (CLS, in-flight handlers drained, connections
  closed) and every Writer closed (publishes in flight answered, callbacks run).
* ``heartbeat(conn)`` overrides are never called: heartbeats are answered on the connection's
  reader thread, where no user code runs.  Backoff follows nsqclient's policy
  (:mod:`nsqclient.backoff`), not pynsq's BackoffTimer.  With ``tls_v1`` and verification on,
  the host name is checked too (pynsq's default ``ssl_version`` context did not check it).
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import inspect
import logging
import math
import queue
import random
import signal
import ssl
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ClassVar, Protocol, cast

from .. import protocol
from ..addresses import lookupd_addresses, nsqd_addresses
from ..checks import check_float, check_int
from ..config import OPTIONS
from ..conn import parse_address
from ..consumer import Consumer
from ..errors import ConnectionClosedError, NSQError, ProtocolError
from ..legacy import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    decode_message,
    dpub,
    finish,
    identify,
    mpub,
    nop,
    pub,
    ready,
    requeue,
    subscribe,
    touch,
    unpack_response,
    valid_channel_name,
    valid_topic_name,
)
from ..message import Message, RequeueMessage
from ..producer import Producer
from ..tornado_bridge import LoopBridge, LoopStopped, current_ioloop, tornado_in_use

__all__ = [
    "Reader",
    "Writer",
    "LegacyReader",
    "run",
    "stop",
    "Message",
    "Error",
    "SendError",
    "ConnectionClosedError",
    "IntegrityError",
    "ProtocolError",
    "valid_topic_name",
    "valid_channel_name",
    "FRAME_TYPE_RESPONSE",
    "FRAME_TYPE_ERROR",
    "FRAME_TYPE_MESSAGE",
    "unpack_response",
    "decode_message",
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
]

logger = logging.getLogger("nsqclient.compat")

# ============================================================================ errors

#: pynsq's ``nsq.Error``: the base of every error a callback receives or a call raises.
Error = NSQError
#: pynsq raised IntegrityError for a frame or JSON it could not parse: our ProtocolError.
IntegrityError = ProtocolError


class SendError(ConnectionClosedError):
    """Nothing was sent: no nsqd could be reached (pynsq's ``SendError``).

    Attributes:
        msg: what failed (``"no open connections"``).
        error: the underlying exception, or None.
    """

    def __init__(self, msg: str, error: BaseException | None = None):
        super().__init__(f"{msg} ({error})" if error is not None else msg, maybe_processed=False)
        self.msg = msg
        self.error = error

    def __reduce__(self):
        return (type(self), (self.msg, self.error))


# ============================================================================ options

_MISSING = object()


def _seconds(name: str, value: Any) -> float:
    return check_float(value, name, "seconds")


def _opt_output_buffer_timeout(value: Any) -> dict[str, Any]:
    # pynsq: milliseconds.  nsqclient: seconds (-1 still disables the timeout).
    ms = check_float(value, "output_buffer_timeout", "milliseconds")
    return {"output_buffer_timeout": -1.0 if ms == -1 else ms / 1000.0}


def _opt_msg_timeout(value: Any) -> dict[str, Any]:
    # pynsq: seconds; a falsy value means "nsqd's default".
    return {"msg_timeout": _seconds("msg_timeout", value) if value else None}


def _opt_hostname(value: Any) -> dict[str, Any]:
    # pynsq also derived the IDENTIFY client_id from the hostname it was given.
    if value is None:
        return {}
    if not isinstance(value, str):
        raise TypeError(f"hostname must be a str, not {value!r}")
    return {"hostname": value, "client_id": value.split(".")[0]}


def _opt_timeout(value: Any) -> dict[str, Any]:
    seconds = _seconds("timeout", value)
    return {"dial_timeout": seconds, "write_timeout": seconds}


def _same(name: str, coerce: Callable[[Any], Any] | None = None) -> Callable[[Any], dict]:
    def convert(value: Any) -> dict[str, Any]:
        return {name: coerce(value) if coerce is not None else value}

    return convert


# The TLS keywords tornado accepted in pynsq's ``tls_options`` dict.
_TLS_IGNORED = {
    "ssl_version": "nsqclient negotiates TLS 1.2 or newer",
    "ciphers": "nsqclient uses the ssl module's default cipher list",
}
_TLS_SILENT_VERSIONS = {
    getattr(ssl, name)
    for name in ("PROTOCOL_TLSv1_2", "PROTOCOL_TLS", "PROTOCOL_TLS_CLIENT")
    if hasattr(ssl, name)
}


def _opt_tls_options(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"tls_options must be a dict of ssl keywords, not {value!r}")
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key == "ca_certs":
            out["tls_ca_file"] = item
        elif key == "certfile":
            out["tls_cert_file"] = item
        elif key == "keyfile":
            out["tls_key_file"] = item
        elif key == "cert_reqs":
            if item not in (ssl.CERT_NONE, ssl.CERT_OPTIONAL, ssl.CERT_REQUIRED):
                raise ValueError(f"tls_options cert_reqs must be an ssl.CERT_* value, not {item!r}")
            out["tls_verify"] = item != ssl.CERT_NONE
        elif key in _TLS_IGNORED:
            if not (key == "ssl_version" and item in _TLS_SILENT_VERSIONS):
                logger.warning("tls_options[%r]=%r ignored: %s", key, item, _TLS_IGNORED[key])
        else:
            raise TypeError(
                f"unknown tls_options key {key!r}; pynsq accepted ca_certs, certfile, keyfile, "
                f"cert_reqs, ssl_version, ciphers"
            )
    return out


#: pynsq's connection keyword arguments (AsyncConn) -> nsqclient options.
_PYNSQ_CONN_KWARGS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "timeout": _opt_timeout,
    "heartbeat_interval": _same("heartbeat_interval"),  # seconds in both
    "requeue_delay": _same("default_requeue_delay"),  # seconds in both
    "tls_v1": _same("tls_v1", bool),
    "tls_options": _opt_tls_options,
    "snappy": _same("snappy", bool),
    "deflate": _same("deflate", bool),
    "deflate_level": _same("deflate_level"),
    "user_agent": _same("user_agent"),
    "output_buffer_size": _same("output_buffer_size"),
    "output_buffer_timeout": _opt_output_buffer_timeout,  # ms -> s
    "sample_rate": _same("sample_rate"),
    "auth_secret": _same("auth_secret"),
    "msg_timeout": _opt_msg_timeout,  # seconds in both
    "hostname": _opt_hostname,
}

#: Keywords legacy pynsq code may pass that mean nothing without tornado: accepted, ignored.
_IGNORED_KWARGS = {
    "io_loop": "nsqclient runs on threads, not on a tornado IOLoop",
}


def _translate_kwargs(kwargs: dict[str, Any], owner: str) -> dict[str, Any]:
    """pynsq connection keywords -> nsqclient Config options (validated later by Config)."""
    options: dict[str, Any] = {}
    native: dict[str, Any] = {}
    for name, value in kwargs.items():
        if name == "tls_options" and value and not kwargs.get("tls_v1"):
            # pynsq used tls_options only with tls_v1; nsqclient's Config refuses TLS settings
            # without it, so a legacy program that passes them with tls_v1 off still runs.
            logger.warning(
                "%s: tls_options ignored because tls_v1 is not set (as pynsq did); the"
                " connection is plain text",
                owner,
            )
            _opt_tls_options(value)  # still refuse what pynsq refused
            continue
        if name in _PYNSQ_CONN_KWARGS:
            options.update(_PYNSQ_CONN_KWARGS[name](value))
        elif name in _IGNORED_KWARGS:
            logger.warning("%s: %s=%r ignored: %s", owner, name, value, _IGNORED_KWARGS[name])
        elif name in OPTIONS:
            native[name] = value  # nsqclient's own option, in nsqclient's units
        else:
            raise TypeError(
                f"{owner}() got an unexpected keyword argument {name!r} (pynsq accepts "
                f"{', '.join(sorted(_PYNSQ_CONN_KWARGS))})"
            )
    options.update(native)
    return options


# ============================================================================ registry


class RunClient(Protocol):
    """What :func:`run` and its registry need of a Reader or a Writer."""

    #: ``"reader"``: :func:`run` starts it and calls its ``tick()``; ``"writer"``: it is only
    #: closed when :func:`run` ends
    run_role: ClassVar[str]
    name: str

    def close(self, timeout: float = ...) -> None: ...


class RunReader(RunClient, Protocol):
    """What :func:`run` needs of a Reader (``run_role == "reader"``)."""

    def tick(self) -> float: ...

    def wait_closed(self, timeout: float) -> None: ...


class _Registry:
    """Every live Reader and Writer, and the state of :func:`run`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.readers: list[RunReader] = []
        self.writers: list[RunClient] = []
        self.running = False
        self.stop_requested = threading.Event()
        self.wake = threading.Event()
        self.previous_handlers: dict[int, Any] = {}
        #: the tornado IOLoop's bridge while run() runs one (see nsqclient.tornado_bridge)
        self.bridge: LoopBridge | None = None

    def add(self, client: RunClient) -> None:
        reader = client.run_role == "reader"
        with self.lock:
            if reader:
                self.readers.append(cast(RunReader, client))
            else:
                self.writers.append(client)
        self.wake.set()
        bridge = self.bridge
        if bridge is not None and reader:
            bridge.call_soon(_tick)

    def remove(self, client: RunClient) -> None:
        with self.lock:
            clients: list[Any] = self.readers if client.run_role == "reader" else self.writers
            if client in clients:
                clients.remove(client)

    def snapshot(self) -> tuple[list[RunReader], list[RunClient]]:
        with self.lock:
            return list(self.readers), list(self.writers)


_registry = _Registry()


class _Registered(type):
    """Registers an instance once its ``__init__`` (a subclass's included) has returned, so that
    :func:`run` never starts a half-built Reader."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        instance = super().__call__(*args, **kwargs)
        _registry.add(instance)
        return instance


def run(*, tornado: bool | None = None) -> None:
    """Start every Reader made so far (and any made while running), then block until SIGINT or
    SIGTERM (when called from the main thread) or :func:`stop`.  Before returning, stop every
    Reader cleanly and close every Writer.

    Args:
        tornado: run tornado's IOLoop in this thread and deliver every Reader handler and Writer
            callback on it, as pynsq did (``IOLoop.current().stop()`` in a handler then ends
            ``run()``, and ``PeriodicCallback``/``tornado.web`` code runs beside).  The default,
            None, does so when the program has imported ``tornado.ioloop``
            (:func:`nsqclient.tornado_bridge.tornado_in_use`); False keeps handlers on their
            worker threads and callbacks on their callback threads.
    """
    use_tornado = tornado_in_use() if tornado is None else bool(tornado)
    ioloop = current_ioloop() if use_tornado else None  # raises before any state changes
    with _registry.lock:
        if _registry.running:
            raise RuntimeError("nsq.run() is already running")
        _registry.running = True
    installed = threading.current_thread() is threading.main_thread()
    if installed:
        for sig in (signal.SIGINT, signal.SIGTERM):
            _registry.previous_handlers[sig] = signal.signal(sig, _on_signal)
    try:
        if ioloop is not None:
            _run_ioloop(ioloop)
        else:
            _run_threads()
    finally:
        if installed:
            _restore_signal_handlers()
        try:
            _shutdown()
        finally:
            with _registry.lock:
                _registry.running = False
                _registry.stop_requested.clear()


def _run_threads() -> None:
    """run() without tornado: this thread starts Readers and polls ``disabled()`` hooks."""
    while not _registry.stop_requested.is_set():
        wait = _start_and_poll()
        if _registry.wake.wait(wait):
            _registry.wake.clear()


def _start_and_poll() -> float:
    """Start the Readers not started yet and poll overridden ``disabled()`` hooks; return the
    seconds until the next poll is due (0.5 at most)."""
    readers, _ = _registry.snapshot()
    wait = 0.5
    for reader in readers:
        wait = min(wait, reader.tick())
    return wait


def _tick() -> None:
    """On the IOLoop: what :func:`_run_threads`'s loop does once."""
    try:
        _start_and_poll()
    except Exception:
        logger.exception("starting a Reader failed")


def _run_ioloop(ioloop: Any) -> None:
    """run() with tornado: run the IOLoop here until it stops (:func:`stop`, a signal, or the
    program's own ``IOLoop.current().stop()``)."""
    from tornado.ioloop import PeriodicCallback

    bridge = LoopBridge(ioloop)
    with _registry.lock:
        _registry.bridge = bridge
    poller = PeriodicCallback(_tick, 500)  # milliseconds: disabled() hooks
    try:
        if _registry.stop_requested.is_set():
            return  # stop() before run(): return at once, as IOLoop.stop() before start() did
        logger.debug("running the tornado IOLoop: handlers and callbacks run on it")
        ioloop.add_callback(_tick)
        poller.start()
        ioloop.start()
    finally:
        poller.stop()
        with _registry.lock:
            _registry.bridge = None
        bridge.close()


def stop() -> None:
    """Make :func:`run` stop every Reader and Writer and return.  Thread-safe; callable from a
    handler, a callback, a signal handler or any thread.  Called before :func:`run`, it makes
    the next :func:`run` return at once (as tornado's ``IOLoop.stop()`` did)."""
    _registry.stop_requested.set()
    _registry.wake.set()
    bridge = _registry.bridge
    if bridge is not None:
        bridge.stop_soon()


def _on_signal(signum: int, frame: Any) -> None:
    logger.info("signal %d received: stopping", signum)
    # A second signal gets the previous handler (a second Ctrl-C interrupts the clean stop).
    _restore_signal_handlers()
    stop()


def _restore_signal_handlers() -> None:
    handlers, _registry.previous_handlers = _registry.previous_handlers, {}
    for sig, previous in handlers.items():
        try:
            signal.signal(sig, previous)
        except (TypeError, ValueError):  # None (set from C) or not the main thread
            pass


def _shutdown(timeout: float = 30.0) -> None:
    """Stop every registered Reader (in parallel) and close every Writer."""
    readers, writers = _registry.snapshot()
    stoppers = [
        threading.Thread(
            target=reader.close, args=(timeout,), name=f"nsq-stop-{reader.name}", daemon=True
        )
        for reader in readers
    ]
    for t in stoppers:
        t.start()
    for t in stoppers:
        t.join(timeout + 5.0)
        if t.is_alive():
            logger.warning("%s did not finish within %.0fs", t.name, timeout + 5.0)
    for reader in readers:
        reader.wait_closed(timeout)
    for writer in writers:
        writer.close()


def _close_writers_at_exit() -> None:
    # Publishes still in flight when the interpreter exits get their answer (and callback).
    _, writers = _registry.snapshot()
    for writer in writers:
        try:
            writer.close(timeout=5.0)
        except Exception:
            logger.exception("closing %r at exit failed", writer)


atexit.register(_close_writers_at_exit)


# ============================================================================ Reader


class Reader(metaclass=_Registered):
    """pynsq's ``nsq.Reader``: consume ``topic``/``channel`` with ``message_handler``.

    Arguments are pynsq's, with pynsq's defaults and units (seconds): ``max_tries`` (0: never
    give up), ``max_in_flight``, ``lookupd_poll_interval``, ``low_rdy_idle_timeout``,
    ``max_backoff_duration``, ``lookupd_poll_jitter`` (a fraction), ``lookupd_request_timeout``
    (which also bounds the connect; ``lookupd_connect_timeout`` has no separate effect).
    ``**kwargs`` are pynsq's connection options (see the module docstring).

    The Reader starts when :func:`run` is called (or with :meth:`start`).  Subclass hooks, as in
    pynsq: :meth:`process_message`, :meth:`preprocess_message`, :meth:`validate_message`,
    :meth:`giving_up`, :meth:`disabled` (deprecated; polled every ``disabled_poll_interval``
    seconds while :func:`run` runs).
    """

    #: seconds between two calls of an overridden :meth:`disabled` while :func:`run` runs
    disabled_poll_interval = 15.0
    #: what :func:`run` does with it: start it, call :meth:`tick`, close it when it ends
    run_role: ClassVar[str] = "reader"

    def __init__(
        self,
        topic: str,
        channel: str,
        message_handler: Callable[[Message], Any] | None = None,
        name: str | None = None,
        nsqd_tcp_addresses: str | Sequence[str] | None = None,
        lookupd_http_addresses: str | Sequence[str] | None = None,
        max_tries: int = 5,
        max_in_flight: int = 1,
        lookupd_poll_interval: float = 60,
        low_rdy_idle_timeout: float = 10,
        max_backoff_duration: float = 128,
        lookupd_poll_jitter: float = 0.3,
        lookupd_connect_timeout: float = 1,
        lookupd_request_timeout: float = 2,
        **kwargs: Any,
    ):
        options = _translate_kwargs(kwargs, type(self).__name__)
        self.topic = protocol.check_topic_name(topic)
        self.channel = protocol.check_channel_name(channel)
        self.name = name or f"{topic}:{channel}"
        self.nsqd_tcp_addresses = nsqd_addresses(nsqd_tcp_addresses, "nsqd_tcp_addresses")
        self.lookupd_http_addresses = lookupd_addresses(
            lookupd_http_addresses, "lookupd_http_addresses"
        )
        random.shuffle(self.lookupd_http_addresses)  # as pynsq: spread the first queries
        self.max_tries = max_tries
        self.lookupd_poll_interval = lookupd_poll_interval
        self.lookupd_poll_jitter = lookupd_poll_jitter
        self.low_rdy_idle_timeout = low_rdy_idle_timeout
        self.lookupd_connect_timeout = lookupd_connect_timeout
        self.lookupd_request_timeout = lookupd_request_timeout
        if lookupd_connect_timeout != 1:
            logger.warning(
                "[%s] lookupd_connect_timeout=%r ignored: lookupd_request_timeout=%r bounds the "
                "connect and the request",
                self.name,
                lookupd_connect_timeout,
                lookupd_request_timeout,
            )
        consumer_options: dict[str, Any] = {
            # pynsq's default REQ delay (requeue_delay x attempts) was not capped.
            "max_requeue_delay": float("inf"),
            **options,
            "max_tries": max_tries,
            "max_in_flight": max_in_flight,
            "lookupd_poll_interval": _seconds("lookupd_poll_interval", lookupd_poll_interval),
            "low_rdy_idle_timeout": _seconds("low_rdy_idle_timeout", low_rdy_idle_timeout),
            "max_backoff_duration": _seconds("max_backoff_duration", max_backoff_duration),
            "lookupd_poll_jitter": _seconds("lookupd_poll_jitter", lookupd_poll_jitter),
            "lookupd_request_timeout": _seconds("lookupd_request_timeout", lookupd_request_timeout),
        }
        self.message_handler: Callable[[Message], Any] | None = None
        if message_handler is not None:
            self.set_message_handler(message_handler)
        self._consumer = Consumer(
            self.topic,
            self.channel,
            self._handle_message,
            nsqd_tcp_addresses=self.nsqd_tcp_addresses,
            lookupd_http_addresses=self.lookupd_http_addresses,
            giving_up=self._on_giving_up,
            **consumer_options,
        )
        self._lock = threading.Lock()
        self._started = False
        self._closed = False
        self._closer: threading.Thread | None = None
        self._worker_idents: set[int] = set()
        self._disabled_by_hook = False
        self._restore_max_in_flight = max_in_flight
        self._next_disabled_poll = 0.0
        if _overrides(type(self), "heartbeat"):
            logger.warning(
                "[%s] %s.heartbeat() will never be called: nsqclient answers heartbeats on the "
                "connection's own thread",
                self.name,
                type(self).__name__,
            )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Connect and start consuming; returns at once.  :func:`run` calls it (not pynsq API)."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed")
            if self._started:
                return
            if self.message_handler is None and not _overrides(type(self), "process_message"):
                raise RuntimeError(
                    f"{self!r} has no message_handler: pass message_handler=, call "
                    "set_message_handler() or override process_message()"
                )
            self._started = True
        if _overrides(type(self), "disabled"):
            logger.warning(
                "[%s] disabled() is deprecated (as in pynsq): use set_max_in_flight(0)", self.name
            )
        logger.info("[%s] starting reader for %s/%s", self.name, self.topic, self.channel)
        self._consumer.start()

    def close(self, timeout: float = 30.0) -> None:
        """Stop consuming: CLS, let the handler finish what was received (up to ``timeout``
        seconds), close every connection.  Called from a handler, it returns at once and the
        Reader stops on another thread (``nsq-close-<name>``)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        _registry.remove(self)
        bridge = _registry.bridge
        on_loop = bridge is not None and bridge.on_loop_thread()
        if on_loop or threading.get_ident() in self._worker_idents:
            # The consumer joins its workers on stop: never from one of them, nor from the
            # IOLoop they wait on.
            self._closer = threading.Thread(
                target=self._consumer.stop,
                args=(timeout,),
                name=f"nsq-close-{self.name}",
                daemon=True,
            )
            self._closer.start()
            return
        self._consumer.stop(timeout)

    def wait_closed(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for a :meth:`close` called from a handler (which
        stops the Reader on another thread) to finish (not pynsq API)."""
        closer = self._closer
        if closer is not None and closer is not threading.current_thread():
            closer.join(timeout)

    def tick(self) -> float:
        """One turn of :func:`run`'s loop for this Reader (not pynsq API): start it unless it
        is started or closed, apply an overridden :meth:`disabled`; return the seconds until
        it needs the next turn (``inf``: never)."""
        if not self._started and not self._closed:
            self.start()
        if not _overrides(type(self), "disabled"):
            return math.inf
        self._poll_disabled()
        return self.disabled_poll_interval

    @property
    def consumer(self) -> Consumer:
        """The :class:`~nsqclient.consumer.Consumer` doing the work (not pynsq API)."""
        return self._consumer

    # ---------------------------------------------------------------- pynsq's public knobs

    def set_message_handler(self, message_handler: Callable[[Message], Any]) -> None:
        """Set the callable run for each message (``handler(message)``)."""
        if not callable(message_handler):
            raise TypeError(f"message_handler must be callable, not {message_handler!r}")
        self.message_handler = message_handler

    @property
    def max_in_flight(self) -> int:
        return self._consumer.max_in_flight

    @max_in_flight.setter
    def max_in_flight(self, value: int) -> None:
        self.set_max_in_flight(value)

    def set_max_in_flight(self, max_in_flight: int) -> None:
        """Change max_in_flight; 0 pauses the Reader (RDY 0 everywhere)."""
        self._consumer.set_max_in_flight(max_in_flight)
        self._restore_max_in_flight = max_in_flight
        self._disabled_by_hook = False

    def is_starved(self) -> bool:
        """True when a connection has 85% or more of its RDY count in flight: a handler that
        buffers messages (``message.enable_async()``) should process its batch now."""
        return self._consumer.is_starved()

    @property
    def conns(self) -> dict[str, Any]:
        """The live connections, by ``"host:port"`` (pynsq's ``reader.conns``)."""
        return {c.address: c for c in self._consumer.connections()}

    @property
    def total_rdy(self) -> int:
        """The sum of the RDY counts last sent."""
        return sum(c.rdy for c in self._consumer.connections())

    def connection_max_in_flight(self) -> int:
        """max_in_flight divided among the connections (at least 1)."""
        return max(1, self.max_in_flight // max(1, len(self._consumer.connections())))

    _connection_max_in_flight = connection_max_in_flight

    def connect_to_nsqd(self, host: str, port: int) -> None:
        raise NotImplementedError(
            "nsqclient's Reader connects to nsqd_tcp_addresses and what lookupd reports; "
            "pass the address to Reader(nsqd_tcp_addresses=...)"
        )

    def query_lookupd(self) -> None:
        raise NotImplementedError(
            "nsqclient's Reader polls lookupd every lookupd_poll_interval seconds by itself"
        )

    # ---------------------------------------------------------------- subclass hooks

    def process_message(self, message: Message) -> Any:
        """Run the handler; override to change how it is called."""
        if self.message_handler is None:
            raise RuntimeError(f"{self!r} has no message_handler")
        return self.message_handler(message)

    def preprocess_message(self, message: Message) -> Any:
        """Called before :meth:`validate_message`; its result is what that one validates."""
        return message

    def validate_message(self, message: Any) -> bool:
        """Return False to FIN the message without processing it."""
        return True

    def giving_up(self, message: Message) -> None:
        """Called for a message whose ``attempts`` exceed ``max_tries``; it is FINished after."""
        logger.warning(
            "[%s] giving up on message %s after %d tries (max:%d) %r",
            self.name,
            message.id,
            message.attempts,
            self.max_tries,
            message.body,
        )

    @classmethod
    def disabled(cls) -> bool:
        """Deprecated pynsq hook: return True to pause the Reader.  Prefer set_max_in_flight."""
        return False

    def heartbeat(self, conn: Any) -> None:
        """pynsq called this on each heartbeat; nsqclient never does (see the module doc)."""

    # ---------------------------------------------------------------- internals

    def _on_giving_up(self, message: Message) -> None:
        self._worker_idents.add(threading.get_ident())
        bridge = _registry.bridge
        if bridge is not None:
            try:
                bridge.call(self.giving_up, message)
                return
            except LoopStopped:
                pass  # run() is ending: the hook still runs, here
        self.giving_up(message)

    def _handle_message(self, message: Message) -> None:
        """The Consumer's handler (on its worker thread): under a tornado :func:`run`, hand the
        message to the IOLoop and wait; otherwise handle it here."""
        self._worker_idents.add(threading.get_ident())
        bridge = _registry.bridge
        if bridge is None:
            self._process(message, None)
            return
        try:
            bridge.call(self._process, message, bridge)
        except LoopStopped:
            # run() is ending and the handler never saw the message: give it back at once.
            if not message.has_responded():
                message.requeue(delay=0.0, backoff=False)

    def _process(self, message: Message, bridge: LoopBridge | None) -> None:
        """pynsq's message handling: validate, run the handler, answer from its result."""
        try:
            if not self.validate_message(self.preprocess_message(message)):
                if not message.has_responded():
                    message.finish()
                return
            result = self.process_message(message)
            if inspect.isawaitable(result) and bridge is not None:
                # On the IOLoop (pynsq's model): the coroutine runs there, interleaved with
                # the others; the message is answered when it completes.
                message.enable_async()
                bridge.watch(result, functools.partial(_answer, message))
                return
            if inspect.isawaitable(result):
                result = _run_awaitable(result)
                if not message.has_responded():
                    if result:
                        message.finish()
                    else:
                        message.requeue()
                return
        except RequeueMessage:
            raise  # nsqclient's own way to choose the delay: the Consumer handles it
        except Exception:
            logger.exception(
                "[%s] uncaught exception while handling message %s body:%r",
                self.name,
                message.id,
                message.body,
            )
            if not message.has_responded():
                message.requeue()
            return
        if isinstance(result, Future):
            message.enable_async()
            result.add_done_callback(functools.partial(_answer_from_future, message))
            return
        if message.is_async() or message.has_responded():
            return
        if isinstance(result, int) and result in (0, 1):  # True/False (and 1/0, as pynsq)
            if result:
                message.finish()
            else:
                message.requeue()
            return
        conn = message._conn
        delay = conn.msg_timeout if conn is not None else 60.0
        logger.error(
            "[%s] handler returned %r for message %s: return True (finish) or False (requeue), "
            "or call message.enable_async(); requeueing it in %.1fs (nsqd's msg_timeout) "
            "without backoff",
            self.name,
            result,
            message.id,
            delay,
        )
        message.requeue(delay=delay, backoff=False)

    def _poll_disabled(self) -> None:
        """Apply an overridden :meth:`disabled` (called by :func:`run`'s loop)."""
        if not self._started or self._closed:
            return
        now = time.monotonic()
        if now < self._next_disabled_poll:
            return
        self._next_disabled_poll = now + self.disabled_poll_interval
        try:
            disabled = bool(self.disabled())
        except Exception:
            logger.exception("[%s] disabled() failed", self.name)
            return
        if disabled and not self._disabled_by_hook:
            logger.info("[%s] disabled: RDY 0", self.name)
            self._restore_max_in_flight = self._consumer.max_in_flight
            self._consumer.set_max_in_flight(0)
            self._disabled_by_hook = True
        elif not disabled and self._disabled_by_hook:
            logger.info(
                "[%s] enabled again: max_in_flight %d", self.name, self._restore_max_in_flight
            )
            self._consumer.set_max_in_flight(self._restore_max_in_flight)
            self._disabled_by_hook = False


def _overrides(cls: type, name: str) -> bool:
    """True when ``cls`` replaces Reader's ``name``."""
    mine = getattr(cls, name)
    theirs = getattr(Reader, name)
    return getattr(mine, "__func__", mine) is not getattr(theirs, "__func__", theirs)


def _run_awaitable(awaitable: Any) -> Any:
    async def wait() -> Any:
        return await awaitable

    return asyncio.run(wait())


def _answer(message: Message, ok: bool) -> None:
    if message.has_responded():
        return
    if ok:
        message.finish()
    else:
        message.requeue()


def _answer_from_future(message: Message, future: Future) -> None:
    if message.has_responded():
        return
    try:
        ok = bool(future.result())
    except Exception:
        logger.exception("the future of message %s failed; requeueing", message.id)
        ok = False
    if ok:
        message.finish()
    else:
        message.requeue()


# ============================================================================ Writer


class _ConnRef:
    """What a Writer callback receives as ``conn`` (pynsq passed its AsyncConn): the nsqd that
    answered, with pynsq's ``id``, ``host`` and ``port``."""

    __slots__ = ("host", "port")

    def __init__(self, address: str):
        self.host, self.port = parse_address(address)

    @property
    def id(self) -> str:
        return f"{self.host}:{self.port}"

    def __str__(self) -> str:
        return self.id

    def __repr__(self) -> str:
        return f"<nsqd {self.id}>"


_STOP = object()
PubCallback = Callable[[Any, Any], Any]


class Writer(metaclass=_Registered):
    """pynsq's ``nsq.Writer``: publish with a callback.

    Args:
        nsqd_tcp_addresses: ``"host:port"`` or a list of them; each publish goes to one of them.
        reconnect_interval: seconds before retrying an nsqd that could not be reached.
        name: used in log lines (default: the first address).
        **kwargs: pynsq's connection options (see the module docstring).

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
        options = _translate_kwargs(kwargs, type(self).__name__)
        addresses = nsqd_addresses(nsqd_tcp_addresses, "nsqd_tcp_addresses")
        if not addresses:
            raise ValueError("Writer needs at least one nsqd address")
        self.nsqd_tcp_addresses = addresses
        self.name = name or addresses[0]
        self.reconnect_interval = _seconds("reconnect_interval", reconnect_interval)
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
        """The :class:`~nsqclient.producer.Producer` doing the work (not pynsq API)."""
        return self._producer

    @property
    def callback_thread(self) -> threading.Thread:
        """The thread that runs this Writer's callbacks (hands them to the IOLoop under a
        tornado :func:`run`)."""
        return self._thread

    # ---------------------------------------------------------------- publishing

    def pub(self, topic: str, msg: bytes, callback: PubCallback | None = None) -> Future:
        """Publish one message; ``callback(conn, data)`` gets the answer (see the class doc)."""
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
        self, topic: str, msg: Sequence[bytes] | bytes, callback: PubCallback | None = None
    ) -> Future:
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
        self, topic: str, delay_ms: int, msg: bytes, callback: PubCallback | None = None
    ) -> Future:
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
            bridge = _registry.bridge
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
        _registry.remove(self)
        self._producer.close(timeout)
        # A resend still running ends at once now that the Producer is closed (its connections
        # failed what they held); its callback is queued before the callback thread stops.
        self._resender.shutdown(wait=True)
        with self._lock:
            self._stop_sent = True
            self._callbacks.put(_STOP)
        bridge = _registry.bridge
        on_loop = bridge is not None and bridge.on_loop_thread()
        # Not from the callback thread, nor from the IOLoop its callbacks wait on.
        if threading.current_thread() is not self._thread and not on_loop:
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.warning("[%s] a publish callback still runs after close()", self.name)


# ============================================================================ LegacyReader

#: pynsq's LegacyReader positional order (as its docstring meant it).
_LEGACY_POSITIONAL = (
    "all_tasks",
    "topic",
    "channel",
    "nsqd_tcp_addresses",
    "lookupd_http_addresses",
    "max_tries",
    "max_in_flight",
    "requeue_delay",
    "lookupd_poll_interval",
    "low_rdy_idle_timeout",
    "heartbeat_interval",
    "max_backoff_duration",
)


class LegacyReader:
    """pynsq's deprecated ``LegacyReader``: one :class:`Reader` per task of ``all_tasks``.

    Args:
        all_tasks: ``{task name: handler}``.  With one task, its Reader reads ``channel``; with
            several, task ``t`` reads ``<channel>.<t>``, so each task gets every message.
        topic, channel: as for :class:`Reader`.
        **kwargs: any other :class:`Reader` argument, given to every Reader.

    A DeprecationWarning is issued, as pynsq did.  The Readers are in ``self.readers``.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        warnings.warn(
            "LegacyReader is deprecated (as in pynsq): make one Reader per handler",
            DeprecationWarning,
            stacklevel=2,
        )
        if len(args) > len(_LEGACY_POSITIONAL):
            raise TypeError(
                f"LegacyReader takes at most {len(_LEGACY_POSITIONAL)} positional arguments"
            )
        params: dict[str, Any] = dict(zip(_LEGACY_POSITIONAL, args, strict=False))
        for name, value in kwargs.items():
            if name in params:
                raise TypeError(f"LegacyReader() got multiple values for argument {name!r}")
            params[name] = value
        try:
            all_tasks = params.pop("all_tasks")
            topic = params.pop("topic")
            channel = params.pop("channel")
        except KeyError as exc:
            raise TypeError(f"LegacyReader() missing required argument {exc.args[0]!r}") from None
        if not isinstance(all_tasks, dict) or not all_tasks:
            raise TypeError("all_tasks must be a non-empty dict of {task name: handler}")
        for task, handler in all_tasks.items():
            if not callable(handler):
                raise TypeError(f"task {task!r} must have a callable handler, not {handler!r}")
        self.readers: list[Reader] = []
        for task, handler in all_tasks.items():
            task_channel = channel if len(all_tasks) == 1 else f"{channel}.{task}"
            self.readers.append(
                Reader(topic=topic, channel=task_channel, message_handler=handler, **params)
            )

    def close(self, timeout: float = 30.0) -> None:
        """Close every Reader (not pynsq API)."""
        for reader in self.readers:
            reader.close(timeout)
