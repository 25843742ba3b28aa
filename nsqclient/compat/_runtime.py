"""``run()`` and ``stop()``: the registry of every live Reader and Writer, the run loop (on
threads, or on tornado's IOLoop), signals and the clean stop."""

from __future__ import annotations

import atexit
import logging
import signal
import threading
from typing import Any, ClassVar, Protocol, cast

from ..platforms import stop_signals
from ._tornado_bridge import LoopBridge, current_ioloop, tornado_in_use

__all__ = ["Registered", "RunClient", "RunReader", "registry", "run", "shutdown", "stop"]

logger = logging.getLogger("nsqclient.compat")


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


class Registry:
    """Every live Reader and Writer, and the state of :func:`run`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.readers: list[RunReader] = []
        self.writers: list[RunClient] = []
        self.running = False
        self.stop_requested = threading.Event()
        self.wake = threading.Event()
        self.previous_handlers: dict[int, Any] = {}
        #: the tornado IOLoop's bridge while run() runs one (see nsqclient.compat._tornado_bridge)
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


registry = Registry()


class Registered(type):
    """Registers an instance once its ``__init__`` (a subclass's included) has returned, so that
    :func:`run` never starts a half-built Reader."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        instance = super().__call__(*args, **kwargs)
        registry.add(instance)
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
            (whether the program imported tornado); False keeps handlers on their
            worker threads and callbacks on their callback threads.
    """
    use_tornado = tornado_in_use() if tornado is None else bool(tornado)
    ioloop = current_ioloop() if use_tornado else None  # raises before any state changes
    with registry.lock:
        if registry.running:
            raise RuntimeError("nsq.run() is already running")
        registry.running = True
    installed = threading.current_thread() is threading.main_thread()
    if installed:
        for sig in stop_signals():
            registry.previous_handlers[sig] = signal.signal(sig, _on_signal)
    try:
        if ioloop is not None:
            _run_ioloop(ioloop)
        else:
            _run_threads()
    finally:
        if installed:
            _restore_signal_handlers()
        try:
            shutdown()
        finally:
            with registry.lock:
                registry.running = False
                registry.stop_requested.clear()


def _run_threads() -> None:
    """run() without tornado: this thread starts Readers and polls ``disabled()`` hooks."""
    while not registry.stop_requested.is_set():
        wait = _start_and_poll()
        if registry.wake.wait(wait):
            registry.wake.clear()


def _start_and_poll() -> float:
    """Start the Readers not started yet and poll overridden ``disabled()`` hooks; return the
    seconds until the next poll is due (0.5 at most)."""
    readers, _ = registry.snapshot()
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
    with registry.lock:
        registry.bridge = bridge
    poller = PeriodicCallback(_tick, 500)  # milliseconds: disabled() hooks
    try:
        if registry.stop_requested.is_set():
            return  # stop() before run(): return at once, as IOLoop.stop() before start() did
        logger.debug("running the tornado IOLoop: handlers and callbacks run on it")
        ioloop.add_callback(_tick)
        poller.start()
        ioloop.start()
    finally:
        poller.stop()
        with registry.lock:
            registry.bridge = None
        bridge.close()


def stop() -> None:
    """Make :func:`run` stop every Reader and Writer and return.  Thread-safe; callable from a
    handler, a callback, a signal handler or any thread.  Called before :func:`run`, it makes
    the next :func:`run` return at once (as tornado's ``IOLoop.stop()`` did)."""
    registry.stop_requested.set()
    registry.wake.set()
    bridge = registry.bridge
    if bridge is not None:
        bridge.stop_soon()


def _on_signal(signum: int, frame: Any) -> None:
    logger.info("signal %d received: stopping", signum)
    # A second signal gets the previous handler (a second Ctrl-C interrupts the clean stop).
    _restore_signal_handlers()
    stop()


def _restore_signal_handlers() -> None:
    handlers, registry.previous_handlers = registry.previous_handlers, {}
    for sig, previous in handlers.items():
        try:
            signal.signal(sig, previous)
        except (TypeError, ValueError):  # None (set from C) or not the main thread
            pass


def shutdown(timeout: float = 30.0) -> None:
    """Stop every registered Reader (in parallel) and close every Writer."""
    readers, writers = registry.snapshot()
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
    _, writers = registry.snapshot()
    for writer in writers:
        try:
            writer.close(timeout=5.0)
        except Exception:
            logger.exception("closing %r at exit failed", writer)


atexit.register(_close_writers_at_exit)
