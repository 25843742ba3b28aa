"""pynsq's error names: ``Error``, ``IntegrityError`` and ``SendError``."""

from __future__ import annotations

from ..errors import ConnectionClosedError, NSQError, ProtocolError

__all__ = ["Error", "IntegrityError", "SendError"]

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
