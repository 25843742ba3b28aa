"""nsqclient: a thread-based, synchronous Python client for NSQ and youzan's partitioned NSQ."""

from . import errors, protocol
from .errors import (
    ConnectionClosedError,
    HTTPError,
    NSQError,
    NSQTimeoutError,
    ProtocolError,
    ServerError,
)
from .protocol import valid_channel_name, valid_topic_name

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "errors",
    "protocol",
    "NSQError",
    "ProtocolError",
    "ConnectionClosedError",
    "NSQTimeoutError",
    "ServerError",
    "HTTPError",
    "valid_topic_name",
    "valid_channel_name",
]
