"""nsqclient: a thread-based, synchronous Python client for NSQ and youzan's partitioned NSQ.

The public face::

    import nsqclient
    consumer = nsqclient.Consumer("topic", "channel", handler, lookupd_http_addresses=[...])
    consumer.run()
    with nsqclient.Producer(["127.0.0.1:4150"]) as producer:
        producer.pub("topic", b"body")
"""

from . import compat, errors, observe, protocol
from ._version import __version__
from .compat import (
    Error,
    IntegrityError,
    LegacyReader,
    Reader,
    SendError,
    Writer,
    run,
    stop,
)
from .config import Config
from .consumer import ConnectionCounts, Consumer
from .errors import *  # noqa: F403 - every error class, as the guides name them
from .errors import __all__ as _error_names
from .http import LookupdClient, NsqdHTTPClient, TopicNotFoundError
from .legacy import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    AsyncConn,
    BackoffTimer,
    SyncConn,
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
from .message import Message, RequeueMessage
from .observe import Observer, PublishEvent
from .partitions import key_partition
from .producer import Producer, PublishResult

#: pynsq 0.9.1's ``nsq.__all__``, every name of which is here with pynsq's signature.
PYNSQ_NAMES = (
    "Reader",
    "Writer",
    "run",
    "BackoffTimer",
    "Message",
    "Error",
    "LegacyReader",
    "SyncConn",
    "AsyncConn",
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
    "valid_topic_name",
    "valid_channel_name",
    "FRAME_TYPE_RESPONSE",
    "FRAME_TYPE_ERROR",
    "FRAME_TYPE_MESSAGE",
)

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
    "key_partition",
    "Message",
    "RequeueMessage",
    "NsqdHTTPClient",
    "LookupdClient",
    "TopicNotFoundError",
    "valid_topic_name",
    "valid_channel_name",
    # pynsq's surface (PYNSQ_NAMES) and its error names
    "Reader",
    "Writer",
    "LegacyReader",
    "run",
    "stop",
    "Error",
    "SendError",
    "IntegrityError",
    "BackoffTimer",
    "SyncConn",
    "AsyncConn",
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
    "FRAME_TYPE_RESPONSE",
    "FRAME_TYPE_ERROR",
    "FRAME_TYPE_MESSAGE",
    # every error class of nsqclient.errors
    *[name for name in _error_names if name not in ("error_from_frame", "ERROR_CLASSES")],
]
