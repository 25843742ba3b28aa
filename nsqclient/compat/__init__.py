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

pynsq's other public names (encoders, BackoffTimer, SyncConn, AsyncConn) are here too.

Built on :class:`~nsqclient.Consumer` and :class:`~nsqclient.Producer`.
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
it (:mod:`nsqclient.compat._tornado_bridge`): pynsq's model, where tornado code and
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

The package, one job a module: ``errors`` (pynsq's error names), ``options`` (pynsq's keyword
arguments translated to nsqclient's options), ``runtime`` (:func:`run` and :func:`stop`: the
registry of live Readers and Writers, the loop on threads or on tornado's IOLoop, signals, the
clean stop), ``reader`` (Reader, LegacyReader) and ``writer`` (Writer).  ``runtime`` knows a
client only by its ``run_role`` and the ``RunClient``/``RunReader`` protocols (``tick()``,
``wait_closed()``); ``reader`` and ``writer`` import it, never the other way.  Each of the
drop-in's names is written once: compat's own in ``__all__`` below, the lower ones in
``nsqclient.compat._legacy.__all__``; the top level re-exports both.
"""

from __future__ import annotations

from ..errors import ConnectionClosedError, ProtocolError
from ..message import Message
from ._errors import Error, IntegrityError, SendError
from ._legacy import *  # noqa: F403 - pynsq's names below Reader and Writer (legacy.__all__)
from ._legacy import __all__ as _legacy_names
from ._reader import LegacyReader, Reader
from ._runtime import registry as _registry  # noqa: F401 - run()'s state, for the tests
from ._runtime import run, stop
from ._runtime import shutdown as _shutdown  # noqa: F401 - stops every Reader and Writer
from ._writer import Writer

# The drop-in's names: those defined above Reader and Writer, then those of _legacy.py.  Each
# name is written once, in the __all__ of the module that provides it; nsqclient re-exports
# this one.
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
]
__all__ += _legacy_names

#: The drop-in's names that pynsq 0.9.1's ``nsq.__all__`` did not have.
ADDED_NAMES = frozenset(
    {"stop", "dpub", "SendError", "ConnectionClosedError", "IntegrityError", "ProtocolError"}
)

#: pynsq 0.9.1's ``nsq.__all__``, every name of which is here (and at nsqclient's top level)
#: with pynsq's signature.
PYNSQ_NAMES = tuple(name for name in __all__ if name not in ADDED_NAMES)
