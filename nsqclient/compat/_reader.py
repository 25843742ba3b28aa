"""pynsq's ``Reader`` (on a :class:`~nsqclient.Consumer`) and ``LegacyReader``."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
import random
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, ClassVar

from .. import protocol
from ..addresses import lookupd_addresses, nsqd_addresses
from ..consumer import Consumer
from ..message import Message, RequeueMessage
from ._options import check_seconds, translate_kwargs
from ._runtime import Registered, registry
from ._tornado_bridge import LoopBridge, LoopStopped

__all__ = ["Reader", "LegacyReader"]

logger = logging.getLogger("nsqclient.compat")


class Reader(metaclass=Registered):
    """pynsq's ``nsq.Reader``: consume ``topic``/``channel`` with ``message_handler``.

    Arguments are pynsq's, with pynsq's defaults and units (seconds): ``max_tries`` (0: never
    give up), ``max_in_flight``, ``lookupd_poll_interval``, ``low_rdy_idle_timeout``,
    ``max_backoff_duration``, ``lookupd_poll_jitter`` (a fraction), ``lookupd_request_timeout``
    (which also bounds the connect; ``lookupd_connect_timeout`` has no separate effect).
    ``**kwargs`` are pynsq's connection options (see ``nsqclient.compat``'s docstring).

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
        options = translate_kwargs(kwargs, type(self).__name__)
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
            "lookupd_poll_interval": check_seconds("lookupd_poll_interval", lookupd_poll_interval),
            "low_rdy_idle_timeout": check_seconds("low_rdy_idle_timeout", low_rdy_idle_timeout),
            "max_backoff_duration": check_seconds("max_backoff_duration", max_backoff_duration),
            "lookupd_poll_jitter": check_seconds("lookupd_poll_jitter", lookupd_poll_jitter),
            "lookupd_request_timeout": check_seconds(
                "lookupd_request_timeout", lookupd_request_timeout
            ),
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
        registry.remove(self)
        bridge = registry.bridge
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
        """The :class:`~nsqclient.Consumer` doing the work (not pynsq API)."""
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
        return sum(counts.rdy for counts in self._consumer.connection_counts())

    def connection_max_in_flight(self) -> int:
        """max_in_flight divided among the connections (at least 1)."""
        return max(1, self.max_in_flight // max(1, len(self._consumer.connection_counts())))

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
        """pynsq called this on each heartbeat; nsqclient never does (see ``nsqclient.compat``'s
        docstring)."""

    # ---------------------------------------------------------------- internals

    def _on_giving_up(self, message: Message) -> None:
        self._worker_idents.add(threading.get_ident())
        bridge = registry.bridge
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
        bridge = registry.bridge
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
        delay = self._msg_timeout(message.nsqd_address)
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

    def _msg_timeout(self, address: str) -> float:
        """The msg_timeout (seconds) nsqd at ``address`` gave this Reader's connection; 60
        (nsqd's default) when that connection is gone."""
        for conn in self._consumer.connections():
            if conn.address == address:
                return conn.msg_timeout
        return 60.0

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


# ============================================================================ LegacyReader

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
