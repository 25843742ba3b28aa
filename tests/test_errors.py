"""Tests of the exception hierarchy and of error_from_frame (nsqclient.errors)."""

from __future__ import annotations

import pickle

import pytest

from nsqclient import errors
from nsqclient.errors import (
    ERROR_CLASSES,
    HTTPError,
    NSQError,
    NSQTimeoutError,
    ProtocolError,
    ServerError,
    UnknownServerError,
    error_from_frame,
)

# A classic nsqd keeps the connection open only after the first three; youzan's nsqd also after
# the others (E_FAILED_ON_NOT_LEADER and E_FAILED_ON_NOT_WRITABLE on PUB; the rest are
# forecasts, the connection still waits for the server to close).
NON_FATAL = {
    "E_FIN_FAILED",
    "E_REQ_FAILED",
    "E_TOUCH_FAILED",
    "E_FAILED_ON_NOT_LEADER",
    "E_FAILED_ON_NOT_WRITABLE",
    "E_CREATE_TOPIC_FAILED",
    "E_INVALID_JSON_HEADER",
    "INVALID_TRACE_ID",
}

CLASSIC_CODES = {
    "E_INVALID",
    "E_BAD_BODY",
    "E_BAD_TOPIC",
    "E_BAD_CHANNEL",
    "E_BAD_MESSAGE",
    "E_PUB_FAILED",
    "E_MPUB_FAILED",
    "E_DPUB_FAILED",
    "E_FIN_FAILED",
    "E_REQ_FAILED",
    "E_TOUCH_FAILED",
    "E_AUTH_FAILED",
    "E_UNAUTHORIZED",
}
YOUZAN_CODES = {
    "E_FAILED_ON_NOT_LEADER",
    "E_FAILED_ON_NOT_WRITABLE",
    "E_TOPIC_NOT_EXIST",
    "E_SUB_ORDER_IS_MUST",
    "E_BAD_PARTITION",
    "E_SUB_EXTEND_FORBIDDON",
    "E_EXT_NOT_SUPPORT",
}
# Codes given their own class later, each with the class it must map to.
NEW_CLASSES = {
    "E_SUB_FAILED": errors.SubFailedError,
    "E_IDENTIFY_FAILED": errors.IdentifyFailedError,
    "E_AUTH_FIRST": errors.AuthFirstError,
    "E_AUTH_ERROR": errors.AuthErrorError,
    "E_AUTH_DISABLED": errors.AuthDisabledError,
    "E_BAD_PROTOCOL": errors.BadProtocolError,
    "E_SUB_EXTEND_NEED": errors.SubExtendNeedError,
    "E_SUB_CHANNEL_NOT_REGISTERED": errors.SubChannelNotRegisteredError,
    "E_PUB_TOO_MUCH_WAITING": errors.PubTooMuchWaitingError,
    "E_BAD_EXT": errors.BadExtError,
    "E_CREATE_TOPIC_FAILED": errors.CreateTopicFailedError,
    "E_INVALID_JSON_HEADER": errors.InvalidJSONHeaderError,
    "INVALID_TRACE_ID": errors.InvalidTraceIDError,
}


def test_error_classes_cover_the_documented_codes() -> None:
    assert CLASSIC_CODES | YOUZAN_CODES | set(NEW_CLASSES) <= set(ERROR_CLASSES)


@pytest.mark.parametrize(("code", "cls"), sorted(NEW_CLASSES.items()))
def test_new_code_maps_to_its_class(code: str, cls: type[ServerError]) -> None:
    assert ERROR_CLASSES[code] is cls and cls.code == code
    assert cls.__name__ in errors.__all__
    exc = error_from_frame(f"{code} detail here".encode())
    assert type(exc) is cls
    assert (exc.code, exc.message) == (code, "detail here")
    assert exc.fatal is (code not in NON_FATAL)


def test_invalid_json_header_is_its_own_non_fatal_class() -> None:
    exc = error_from_frame(b"E_INVALID_JSON_HEADER fail to parse")
    assert type(exc) is errors.InvalidJSONHeaderError
    assert (exc.code, exc.message) == ("E_INVALID_JSON_HEADER", "fail to parse")
    assert not exc.fatal
    assert not isinstance(exc, errors.InvalidError)


@pytest.mark.parametrize(("code", "cls"), sorted(ERROR_CLASSES.items()))
def test_error_from_frame_every_code(code: str, cls: type[ServerError]) -> None:
    assert cls.code == code
    exc = error_from_frame(f"{code} something went wrong".encode())
    assert type(exc) is cls
    assert isinstance(exc, ServerError) and isinstance(exc, NSQError)
    assert exc.code == code
    assert exc.message == "something went wrong"
    assert exc.fatal is (code not in NON_FATAL)
    assert str(exc) == f"{code} something went wrong"


@pytest.mark.parametrize("code", sorted(ERROR_CLASSES))
def test_code_with_empty_description(code: str) -> None:
    for body in (f"{code} ".encode(), code.encode(), f"{code}  \n".encode()):
        exc = error_from_frame(body)
        assert type(exc) is ERROR_CLASSES[code]
        assert exc.code == code and exc.message == ""
        assert str(exc) == code


def test_classic_fatality_rule() -> None:
    non_fatal = {code for code, cls in ERROR_CLASSES.items() if not cls.fatal}
    assert non_fatal == NON_FATAL


def test_youzan_description_with_parent_error() -> None:
    exc = error_from_frame(b'E_BAD_TOPIC PUB topic name "a b" is not valid')
    assert type(exc) is errors.BadTopicError
    assert exc.message == 'PUB topic name "a b" is not valid'


def test_code_glued_to_text_matches_by_prefix() -> None:
    exc = error_from_frame(b"E_FAILED_ON_NOT_LEADERpartition 3 moved")
    assert type(exc) is errors.FailedOnNotLeaderError
    assert exc.code == "E_FAILED_ON_NOT_LEADER" and exc.message == "partition 3 moved"
    assert not exc.fatal
    exc = error_from_frame(b"E_TOPIC_NOT_EXIST:t-1")
    assert type(exc) is errors.TopicNotExistError and exc.message == ":t-1"


def test_longer_code_sharing_a_known_prefix_is_not_mistaken_for_it() -> None:
    exc = error_from_frame(b"E_INVALID_JSON_HEADER fail to parse json header:bad")
    assert exc.code == "E_INVALID_JSON_HEADER"
    assert type(exc) is errors.InvalidJSONHeaderError


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"E_INVALIDX bad", "E_INVALIDX"),
        (b"E_BAD_BODY2 bad", "E_BAD_BODY2"),
        (b"E_INVALID_JSON_HEADERS bad", "E_INVALID_JSON_HEADERS"),
        (b"E_FIN_FAILED_AGAIN bad", "E_FIN_FAILED_AGAIN"),
    ],
)
def test_known_code_followed_by_code_characters_is_unknown(body: bytes, code: str) -> None:
    exc = error_from_frame(body)
    assert type(exc) is UnknownServerError
    assert (exc.code, exc.message) == (code, "bad")
    assert exc.fatal


@pytest.mark.parametrize(
    ("body", "cls", "message"),
    [
        (
            b"E_SUB_FAILED SUB failed to deleted topic/channel",
            errors.SubFailedError,
            "SUB failed to deleted topic/channel",
        ),
        (
            b"E_PUB_TOO_MUCH_WAITING pub too much waiting",
            errors.PubTooMuchWaitingError,
            "pub too much waiting",
        ),
        (b"E_BAD_PROTOCOL", errors.BadProtocolError, ""),
        (b"INVALID_TRACE_ID invalid trace id", errors.InvalidTraceIDError, "invalid trace id"),
    ],
)
def test_youzan_replies_map_to_their_classes(
    body: bytes, cls: type[ServerError], message: str
) -> None:
    exc = error_from_frame(body)
    assert type(exc) is cls and exc.message == message


@pytest.mark.parametrize(
    ("body", "code", "message"),
    [
        (b"E_WHATEVER  spaced   text ", "E_WHATEVER", "spaced   text"),
        (b"E_NEW_THING", "E_NEW_THING", ""),
        (b"", "E_UNKNOWN", ""),
        (b"   ", "E_UNKNOWN", ""),
    ],
)
def test_unknown_code_keeps_the_code(body: bytes, code: str, message: str) -> None:
    exc = error_from_frame(body)
    assert type(exc) is UnknownServerError
    assert exc.code == code
    assert exc.message == message
    assert exc.fatal  # unknown: assume the server closes the connection
    assert isinstance(exc, ServerError)


def test_error_from_frame_accepts_str_and_bytearray() -> None:
    for body in ("E_BAD_BODY invalid body size 0", bytearray(b"E_BAD_BODY invalid body size 0")):
        exc = error_from_frame(body)
        assert type(exc) is errors.BadBodyError and exc.message == "invalid body size 0"


def test_error_from_frame_non_utf8_body_does_not_raise() -> None:
    exc = error_from_frame(b"E_BAD_MESSAGE \xff\xfe")
    assert type(exc) is errors.BadMessageError
    assert exc.message == "\ufffd\ufffd"


def test_server_error_explicit_code() -> None:
    exc = ServerError("boom", code="E_SOMETHING")
    assert (exc.code, exc.message, str(exc)) == ("E_SOMETHING", "boom", "E_SOMETHING boom")
    assert errors.BadTopicError("x").code == "E_BAD_TOPIC"


PICKLED_SERVER_ERRORS = [
    errors.BadTopicError("PUB topic name is not valid"),
    errors.FinFailedError("FIN 0123 failed"),
    errors.FailedOnNotLeaderError(""),
    errors.InvalidJSONHeaderError("fail to parse"),
    errors.InvalidTraceIDError("invalid trace id"),
    UnknownServerError("odd", code="E_ODD"),
    ServerError("plain", code="E_PLAIN"),
]


@pytest.mark.parametrize("exc", PICKLED_SERVER_ERRORS, ids=lambda e: type(e).__name__)
def test_server_error_pickles(exc: ServerError) -> None:
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc)
    assert (back.code, back.message, back.fatal) == (exc.code, exc.message, exc.fatal)
    assert str(back) == str(exc)


def test_server_error_from_frame_pickles() -> None:
    exc = error_from_frame(b"E_FAILED_ON_NOT_LEADER ")
    back = pickle.loads(pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL))
    assert type(back) is errors.FailedOnNotLeaderError and back.message == "" and not back.fatal


@pytest.mark.parametrize(
    ("exc", "text"),
    [
        (HTTPError(500, "Topic has no channel", "http://127.0.0.1:4161/lookup?topic=t"), None),
        (HTTPError(0, "connection refused"), "no reply: connection refused"),
        (
            HTTPError(404, "TOPIC_NOT_FOUND", "http://h:1/lookup"),
            "HTTP 404 from http://h:1/lookup: TOPIC_NOT_FOUND",
        ),
        (
            HTTPError(0, "connection refused by h:1", "http://h:1/ping"),
            "no reply from http://h:1/ping: connection refused by h:1",
        ),
    ],
)
def test_http_error_pickles(exc: HTTPError, text: str | None) -> None:
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is HTTPError
    assert (back.status, back.message, back.url) == (exc.status, exc.message, exc.url)
    assert str(back) == str(exc)
    if text is not None:
        assert str(exc) == text
    assert isinstance(back, NSQError)


def test_http_error_text_names_the_url() -> None:
    exc = HTTPError(404, "TOPIC_NOT_FOUND", "http://127.0.0.1:4151/stats")
    assert str(exc) == "HTTP 404 from http://127.0.0.1:4151/stats: TOPIC_NOT_FOUND"


def test_timeout_error_is_a_builtin_timeout() -> None:
    assert issubclass(NSQTimeoutError, TimeoutError)
    assert issubclass(NSQTimeoutError, NSQError)
    with pytest.raises(TimeoutError):
        raise NSQTimeoutError("pub took longer than 5.0 s")


@pytest.mark.parametrize(
    "cls",
    [
        errors.ProtocolError,
        errors.ConnectionClosedError,
        errors.AuthRequiredError,
        ServerError,
        HTTPError,
        NSQTimeoutError,
    ],
)
def test_every_error_is_an_nsq_error(cls: type[Exception]) -> None:
    assert issubclass(cls, NSQError)


def test_all_exports_exist() -> None:
    for name in errors.__all__:
        assert hasattr(errors, name), name


@pytest.mark.parametrize("maybe_processed", [True, False])
def test_connection_closed_error_pickles(maybe_processed: bool) -> None:
    exc = errors.ConnectionClosedError("reset by peer", maybe_processed=maybe_processed)
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is errors.ConnectionClosedError
    assert str(back) == "reset by peer" and back.maybe_processed is maybe_processed
    assert errors.ConnectionClosedError("x").maybe_processed is True


@pytest.mark.parametrize("cls", [errors.ConnectionClosedError, errors.NSQTimeoutError])
def test_connection_errors_keep_their_nsqd_address_through_pickling(cls: type) -> None:
    exc = cls("closed", maybe_processed=False, address="127.0.0.1:4150")
    back = pickle.loads(pickle.dumps(exc))
    assert (back.address, back.maybe_processed, str(back)) == ("127.0.0.1:4150", False, "closed")
    assert cls("x").address is None


# ------------------------------------------------------------------------------------------
# Errors that say what is wrong (issue 8), against the broker's real listening sockets


def test_lookupd_tcp_port_given_as_an_nsqd_address_says_so(nsqd, connect) -> None:
    # nsqlookupd answers nsqd's "  V2" magic with its own [size]E_BAD_PROTOCOL, which read as
    # NSQ frames was "unknown frame type 1163870785".
    lookupd = nsqd.lookupd
    with pytest.raises(ProtocolError) as exc_info:
        connect(f"{lookupd.host}:{lookupd.tcp_port}")
    text = str(exc_info.value)
    assert "is not an nsqd TCP port: it sent b'E_BAD_PROTOCOL'" in text
    assert "nsqlookupd's TCP port answers this way" in text and "4150" in text
    assert "unknown frame type" not in text
