"""nsqclient: a thread-based, synchronous Python client for NSQ and youzan's partitioned NSQ.

The public face::

    import nsqclient
    consumer = nsqclient.Consumer("topic", "channel", handler, lookupd_http_addresses=[...])
    consumer.run()
    with nsqclient.Producer(["127.0.0.1:4150"]) as producer:
        producer.pub("topic", b"body")
    # asyncio (an ASGI app): await nsqclient.aresult(producer.pub_async("topic", b"body"))
"""

from . import compat, errors, observe, protocol
from ._version import __version__
from .compat import *  # noqa: F403 - the pynsq drop-in: every name of compat.__all__
from .compat import PYNSQ_NAMES  # noqa: F401 - pynsq 0.9.1's nsq.__all__
from .compat._legacy import *  # noqa: F403 - through compat too; imported here for type checkers
from .config import Config
from .conn import aresult
from .consumer import ConnectionCounts, Consumer
from .errors import *  # noqa: F403 - every error class, as the guides name them
from .errors import __all__ as _error_names
from .http import LookupdClient, NsqdHTTPClient, TopicNotFoundError
from .lookupd import key_partition
from .message import Message, RequeueMessage
from .observe import Observer, PublishEvent
from .producer import Producer, PublishResult

__all__ = [
    "__version__",
    "errors",
    "compat",
    "protocol",
    "observe",
    "Observer",
    "PublishEvent",
    "ConnectionCounts",
    "Config",
    "Consumer",
    "Producer",
    "PublishResult",
    "aresult",
    "key_partition",
    "Message",
    "RequeueMessage",
    "NsqdHTTPClient",
    "LookupdClient",
    "TopicNotFoundError",
    # the pynsq drop-in: pynsq 0.9.1's names (PYNSQ_NAMES), stop, dpub and their error names
    *[name for name in compat.__all__ if name != "Message"],
    # every error class of nsqclient.errors
    *[
        name
        for name in _error_names
        if name not in ("error_from_frame", "ERROR_CLASSES", *compat.__all__)
    ],
]
