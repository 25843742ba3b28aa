"""nsqclient: a thread-based, synchronous Python client for NSQ and youzan's partitioned NSQ.

The public face::

    import nsqclient
    consumer = nsqclient.Consumer("topic", "channel", handler, lookupd_http_addresses=[...])
    consumer.run()
    with nsqclient.Producer(["127.0.0.1:4150"]) as producer:
        producer.pub("topic", b"body")
"""

from . import compat, errors, protocol
from ._version import __version__
from .compat import Error, Reader, Writer, run, stop
from .config import Config
from .consumer import Consumer
from .errors import (
    AuthRequiredError,
    ConnectionClosedError,
    HTTPError,
    NSQError,
    NSQTimeoutError,
    ProtocolError,
    ServerError,
)
from .http import LookupdClient, NsqdHTTPClient, TopicNotFoundError
from .message import Message, RequeueMessage
from .producer import Producer
from .protocol import valid_channel_name, valid_topic_name

__all__ = [
    "__version__",
    "errors",
    "compat",
    "Reader",
    "Writer",
    "run",
    "stop",
    "Error",
    "protocol",
    "Config",
    "Consumer",
    "Producer",
    "Message",
    "RequeueMessage",
    "NsqdHTTPClient",
    "LookupdClient",
    "TopicNotFoundError",
    "NSQError",
    "ProtocolError",
    "ConnectionClosedError",
    "NSQTimeoutError",
    "AuthRequiredError",
    "ServerError",
    "HTTPError",
    "valid_topic_name",
    "valid_channel_name",
]
