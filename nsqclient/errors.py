"""One exception hierarchy for everything nsqclient raises.

Server errors arrive on the wire as an error frame whose body reads ``E_CODE description``
(youzan's nsqd sometimes sends the code and a space with an empty description, or glues text
onto the code).  :func:`error_from_frame` turns such a body into an instance of the class
registered for its code, matching the code by prefix.

``fatal`` says whether the server closes the connection after sending that error.  A classic
nsqd closes it after every error except ``E_FIN_FAILED``, ``E_REQ_FAILED`` and
``E_TOUCH_FAILED``.  youzan's nsqd decides some codes per command (E_FAILED_ON_NOT_LEADER closes
the connection after SUB and FIN but not after PUB), so a connection treats ``fatal`` as a
forecast and waits for the server to close.
"""

from __future__ import annotations

import string
from concurrent.futures import Future
from typing import Any

__all__ = [
    "NSQError",
    "ProtocolError",
    "ConnectionClosedError",
    "NSQTimeoutError",
    "UndeliveredError",
    "AuthRequiredError",
    "NoRouteError",
    "ServerError",
    "InvalidError",
    "BadBodyError",
    "BadTopicError",
    "BadChannelError",
    "BadMessageError",
    "PubFailedError",
    "MPubFailedError",
    "DPubFailedError",
    "FinFailedError",
    "ReqFailedError",
    "TouchFailedError",
    "AuthFailedError",
    "UnauthorizedError",
    "FailedOnNotLeaderError",
    "FailedOnNotWritableError",
    "TopicNotExistError",
    "SubOrderIsMustError",
    "BadPartitionError",
    "SubExtendForbiddenError",
    "ExtNotSupportedError",
    "SubFailedError",
    "IdentifyFailedError",
    "AuthFirstError",
    "AuthErrorError",
    "AuthDisabledError",
    "BadProtocolError",
    "SubExtendNeedError",
    "SubChannelNotRegisteredError",
    "PubTooMuchWaitingError",
    "BadExtError",
    "CreateTopicFailedError",
    "InvalidJSONHeaderError",
    "InvalidTraceIDError",
    "UnknownServerError",
    "HTTPError",
    "error_from_frame",
    "ERROR_CLASSES",
]


class NSQError(Exception):
    """Base class of every error nsqclient raises."""


class ProtocolError(NSQError):
    """The byte stream broke the NSQ protocol (bad frame, bad size, wrong port...)."""


class ConnectionClosedError(NSQError):
    """The connection closed (or could not be made) before the request got an answer.

    ``maybe_processed`` is True when nsqd may have acted on the request before the connection
    died (the outcome is unknown), False when it provably did not (nothing was sent, or the
    request was queued behind a fatal error, after which nsqd processes nothing more).
    ``address`` is the nsqd (``"host:port"``, several joined by ``", "``) when one is known;
    ``__cause__`` is what closed it (nsqd's error, the socket's), when known.
    """

    def __init__(self, message: str = "", maybe_processed: bool = True, address: str | None = None):
        super().__init__(message)
        self.maybe_processed = maybe_processed
        self.address = address

    def __reduce__(self):
        return (type(self), (str(self), self.maybe_processed, self.address))


class NSQTimeoutError(NSQError, TimeoutError):
    """A call ran past its timeout (a publish: ``pub_timeout``, or ``timeout=``).

    For a publish, ``maybe_processed`` says whether nsqd may have stored it: True when it was
    written and no answer came in time (the outcome is unknown), False when it was never written
    (no connection in time, or still queued behind a write nsqd did not take).  ``address``
    is the nsqd (``"host:port"``) when one is known.
    """

    def __init__(self, message: str = "", maybe_processed: bool = True, address: str | None = None):
        super().__init__(message)
        self.maybe_processed = maybe_processed
        self.address = address

    def __reduce__(self):
        return (type(self), (str(self), self.maybe_processed, self.address))


class UndeliveredError(NSQError):
    """``flush()``, ``close()`` or leaving a ``with Producer(...)`` block found publishes
    accepted since the previous ``flush()``/``close()`` that failed or were still unanswered,
    and whose outcome nobody took from their Future.

    ``futures`` holds those Futures (the first 10,000; ``count`` counts them all), each with its
    own exception once done (one still unanswered may yet resolve as a ``pub_async()`` Future
    does: ``b"OK"`` or a :class:`~nsqclient.PublishResult`); ``failed`` and ``unanswered``
    split ``count``.  A Future whose outcome was already taken (``result()``, ``exception()``,
    ``add_done_callback()``) is not reported again.
    """

    def __init__(
        self,
        message: str = "",
        futures: list[Future[Any]] | None = None,
        failed: int = 0,
        unanswered: int = 0,
    ):
        super().__init__(message)
        self.futures: list[Future[Any]] = list(futures or [])
        self.failed = failed
        self.unanswered = unanswered
        self.count = failed + unanswered

    def __reduce__(self):
        return (type(self), (str(self), [], self.failed, self.unanswered))


class NoRouteError(NSQError):
    """A Producer publishing by lookup found no nsqd to send the topic (or its partition) to:
    lookupd names none, or (youzan) the topic has no channel yet.  Nothing was sent.

    ``retryable`` is True when a fresh lookup may name one soon (a partition's leader is
    moving); the Producer retries those by itself (the ``leader_retries`` option)."""

    def __init__(self, message: str, retryable: bool = False):
        super().__init__(message)
        self.retryable = retryable

    def __reduce__(self):
        return (type(self), (str(self), self.retryable))


class AuthRequiredError(NSQError):
    """nsqd requires AUTH but no ``auth_secret`` was configured."""


class ServerError(NSQError):
    """An error frame sent by nsqd.

    Attributes:
        code: the ``E_*`` code, e.g. ``"E_BAD_TOPIC"``.
        message: the description nsqd sent after the code (may be empty).
        fatal: True when the server closes the connection after this error.
    """

    code: str = ""
    fatal: bool = True

    def __init__(self, message: str = "", code: str | None = None):
        if code is not None:
            self.code = code
        self.message = message
        super().__init__(f"{self.code} {message}".strip())

    def __reduce__(self):
        return (type(self), (self.message, self.code))


class InvalidError(ServerError):
    code = "E_INVALID"


class BadBodyError(ServerError):
    code = "E_BAD_BODY"


class BadTopicError(ServerError):
    code = "E_BAD_TOPIC"


class BadChannelError(ServerError):
    code = "E_BAD_CHANNEL"


class BadMessageError(ServerError):
    code = "E_BAD_MESSAGE"


class PubFailedError(ServerError):
    code = "E_PUB_FAILED"


class MPubFailedError(ServerError):
    code = "E_MPUB_FAILED"


class DPubFailedError(ServerError):
    code = "E_DPUB_FAILED"


class FinFailedError(ServerError):
    code = "E_FIN_FAILED"
    fatal = False


class ReqFailedError(ServerError):
    code = "E_REQ_FAILED"
    fatal = False


class TouchFailedError(ServerError):
    code = "E_TOUCH_FAILED"
    fatal = False


class AuthFailedError(ServerError):
    code = "E_AUTH_FAILED"


class UnauthorizedError(ServerError):
    code = "E_UNAUTHORIZED"


# youzan's partitioned NSQ.
class FailedOnNotLeaderError(ServerError):
    """The nsqd is not the leader of this partition (any more): refresh lookup and retry."""

    code = "E_FAILED_ON_NOT_LEADER"
    fatal = False


class FailedOnNotWritableError(ServerError):
    """The partition takes no writes now (youzan): refresh lookup and retry."""

    code = "E_FAILED_ON_NOT_WRITABLE"
    fatal = False


class TopicNotExistError(ServerError):
    """The topic (or this partition of it) does not exist on that nsqd: refresh lookup."""

    code = "E_TOPIC_NOT_EXIST"


class SubOrderIsMustError(ServerError):
    code = "E_SUB_ORDER_IS_MUST"


class BadPartitionError(ServerError):
    code = "E_BAD_PARTITION"


class SubExtendForbiddenError(ServerError):
    code = "E_SUB_EXTEND_FORBIDDON"  # sic: youzan's spelling on the wire


class ExtNotSupportedError(ServerError):
    code = "E_EXT_NOT_SUPPORT"


class SubFailedError(ServerError):
    code = "E_SUB_FAILED"


class IdentifyFailedError(ServerError):
    code = "E_IDENTIFY_FAILED"


class AuthFirstError(ServerError):
    code = "E_AUTH_FIRST"


class AuthErrorError(ServerError):
    code = "E_AUTH_ERROR"


class AuthDisabledError(ServerError):
    code = "E_AUTH_DISABLED"


class BadProtocolError(ServerError):
    code = "E_BAD_PROTOCOL"


class SubExtendNeedError(ServerError):
    code = "E_SUB_EXTEND_NEED"


class SubChannelNotRegisteredError(ServerError):
    code = "E_SUB_CHANNEL_NOT_REGISTERED"


class PubTooMuchWaitingError(ServerError):
    code = "E_PUB_TOO_MUCH_WAITING"


class BadExtError(ServerError):
    code = "E_BAD_EXT"


class CreateTopicFailedError(ServerError):
    code = "E_CREATE_TOPIC_FAILED"
    fatal = False


class InvalidJSONHeaderError(ServerError):
    code = "E_INVALID_JSON_HEADER"
    fatal = False


class InvalidTraceIDError(ServerError):
    code = "INVALID_TRACE_ID"  # sic: youzan sends it without the E_ prefix
    fatal = False


class UnknownServerError(ServerError):
    """An error code nsqclient does not know; ``code`` holds what the server sent."""


ERROR_CLASSES: dict[str, type[ServerError]] = {
    cls.code: cls
    for cls in (
        InvalidError,
        BadBodyError,
        BadTopicError,
        BadChannelError,
        BadMessageError,
        PubFailedError,
        MPubFailedError,
        DPubFailedError,
        FinFailedError,
        ReqFailedError,
        TouchFailedError,
        AuthFailedError,
        UnauthorizedError,
        FailedOnNotLeaderError,
        FailedOnNotWritableError,
        TopicNotExistError,
        SubOrderIsMustError,
        BadPartitionError,
        SubExtendForbiddenError,
        ExtNotSupportedError,
        SubFailedError,
        IdentifyFailedError,
        AuthFirstError,
        AuthErrorError,
        AuthDisabledError,
        BadProtocolError,
        SubExtendNeedError,
        SubChannelNotRegisteredError,
        PubTooMuchWaitingError,
        BadExtError,
        CreateTopicFailedError,
        InvalidJSONHeaderError,
        InvalidTraceIDError,
    )
}
# Longest first, so that a code which is a prefix of another never shadows it.
_CODE_CHARS = frozenset(string.ascii_uppercase + string.digits + "_")
_CODES_BY_LENGTH = sorted(ERROR_CLASSES, key=len, reverse=True)


def error_from_frame(data: bytes | str) -> ServerError:
    """Build the exception for the body of an error frame (``b"E_BAD_TOPIC PUB topic..."``)."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes | bytearray) else data
    text = text.strip()
    for code in _CODES_BY_LENGTH:
        rest = text[len(code) :]
        # A known code followed by more code characters is a different, unknown code.
        if text.startswith(code) and rest[:1] not in _CODE_CHARS:
            return ERROR_CLASSES[code](rest.strip())
    code, _, rest = text.partition(" ")
    return UnknownServerError(rest.strip(), code=code or "E_UNKNOWN")


class HTTPError(NSQError):
    """An nsqd or nsqlookupd HTTP endpoint answered with an error status, or did not answer.

    Attributes:
        status: the HTTP status code, or 0 when no response arrived at all (connection refused,
            timed out, host name not resolved...): ``message`` then says which.
        message: the server's message (``{"message": ...}`` in 1.x, ``status_txt`` before), or
            what went wrong before any reply.
        url: the URL requested.

    ``str()`` reads ``HTTP 500 from URL: MESSAGE``, or ``no reply from URL: MESSAGE`` when
    status is 0 (no HTTP status was ever received).
    """

    def __init__(self, status: int, message: str, url: str = ""):
        self.status = status
        self.message = message
        self.url = url
        where = f" from {url}" if url else ""
        if status == 0:
            super().__init__(f"no reply{where}: {message}")
        else:
            super().__init__(f"HTTP {status}{where}: {message}")

    def __reduce__(self):
        return (type(self), (self.status, self.message, self.url))
