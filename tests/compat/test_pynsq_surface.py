"""pynsq 0.9.1's whole public surface at nsqclient's top level: names, signatures, command bytes,
frame and message decoding, BackoffTimer's values, SyncConn against the broker, AsyncConn's
refusal, LegacyReader."""

from __future__ import annotations

import inspect
import json
import struct
import warnings

import pytest

import nsqclient as nsq
from nsqclient import compat
from nsqclient.compat import _legacy as legacy
from nsqclient.producer._producer import Producer

#: pynsq 0.9.1's nsq.__all__, written out so the test needs no pynsq.  The one copy of the list
#: outside the package, on purpose: it pins pynsq's surface independently of the code it checks
#: (compat.PYNSQ_NAMES is derived from the modules' __all__), so a name dropped from the code and
#: from its list at once still fails here.  test_pynsq_all_as_installed_matches checks this copy
#: against pynsq itself when pynsq is installed.
PYNSQ_ALL = [
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
]

MID = b"0123456789abcdef"  # a classic message id: 16 ASCII characters


@pytest.fixture(autouse=True)
def clean_registry():
    yield
    compat._shutdown(timeout=5.0)


def size(n: int) -> bytes:
    return struct.pack(">l", n)


# ---------------------------------------------------------------------------- names


def test_every_pynsq_name_is_at_the_top_level():
    assert sorted(nsq.PYNSQ_NAMES) == sorted(PYNSQ_ALL)
    assert len(nsq.PYNSQ_NAMES) == len(PYNSQ_ALL)
    missing = [name for name in PYNSQ_ALL if not hasattr(nsq, name) or not hasattr(compat, name)]
    assert missing == []
    assert set(PYNSQ_ALL) <= set(nsq.__all__)
    assert (nsq.FRAME_TYPE_RESPONSE, nsq.FRAME_TYPE_ERROR, nsq.FRAME_TYPE_MESSAGE) == (0, 1, 2)


def test_the_drop_in_surface_is_one_list_re_exported():
    # compat.__all__ is compat's own names plus legacy.__all__; the top level offers all of it,
    # each name the same object, and nothing of pynsq's lower layer beyond it (no MAGIC_V2).
    assert set(legacy.__all__) <= set(compat.__all__)
    assert len(compat.__all__) == len(set(compat.__all__))
    assert len(nsq.__all__) == len(set(nsq.__all__))
    for name in compat.__all__:
        assert name in nsq.__all__, name
        assert getattr(nsq, name) is getattr(compat, name), name
    # what docs/compat.rst names beyond pynsq's list
    added = {"stop", "dpub", "SendError", "IntegrityError", "ConnectionClosedError"}
    added.add("ProtocolError")
    assert set(compat.__all__) - set(PYNSQ_ALL) == compat.ADDED_NAMES == added
    assert "MAGIC_V2" not in nsq.__all__ and not hasattr(nsq, "MAGIC_V2")
    assert legacy.MAGIC_V2 == b"  V2"


def test_pynsq_all_as_installed_matches():
    pynsq = pytest.importorskip("nsq", reason="pynsq is not installed (bench extra)")
    assert sorted(pynsq.__all__) == sorted(PYNSQ_ALL)


@pytest.mark.parametrize(
    "name",
    [n for n in PYNSQ_ALL if n not in ("Message", "Error") and not n.startswith("FRAME_")],
)
def test_signatures_take_pynsq_arguments(name):
    pynsq = pytest.importorskip("nsq", reason="pynsq is not installed (bench extra)")
    theirs, ours = getattr(pynsq, name), getattr(nsq, name)
    if name == "LegacyReader":  # *args, **kwargs in both
        theirs, ours = theirs.__init__, ours.__init__

    def params(obj):
        try:
            sig = inspect.signature(obj)
        except ValueError:
            return []
        return [
            (p.name, p.default if p.default is not inspect.Parameter.empty else "<required>")
            for p in sig.parameters.values()
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name != "self"
        ]

    their_params, our_params = params(theirs), params(ours)
    our_names = [n for n, _ in our_params]
    for position, (pname, default) in enumerate(their_params):
        if name in ("Reader", "Writer") and pname not in our_names:
            # the rest of pynsq's Reader/Writer keywords go through **kwargs (test_compat)
            continue
        if name == "AsyncConn" and pname == "user_agent":
            assert our_params[position][0] == "user_agent"  # pynsq's default names its version
            continue
        assert our_params[position] == (pname, default), f"{name}: argument {position}"


# ---------------------------------------------------------------------------- command bytes

IDENTIFY_ASCII = {"a": 1, "b": 2}
IDENTIFY_UNICODE = {"c": "w\xc3\xa5\xe2\x80\xa0"}
BODIES = [b"asdf", b"ghjk", b"abcd"]
MPUB_BODY = size(3) + b"".join(size(len(m)) + m for m in BODIES)


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        pytest.param(
            lambda: nsq.identify(IDENTIFY_ASCII),
            b"IDENTIFY\n" + size(16) + b'{"a": 1, "b": 2}',
            id="identify-ascii",
        ),
        pytest.param(
            lambda: nsq.identify(IDENTIFY_UNICODE),
            b"IDENTIFY\n"
            + size(len(json.dumps(IDENTIFY_UNICODE)))
            + json.dumps(IDENTIFY_UNICODE).encode(),
            id="identify-unicode",
        ),
        pytest.param(
            lambda: nsq.subscribe(topic="test_topic", channel="test_channel"),
            b"SUB test_topic test_channel\n",
            id="subscribe",
        ),
        pytest.param(lambda: nsq.finish(id=MID), b"FIN " + MID + b"\n", id="finish"),
        pytest.param(lambda: nsq.finish(MID.decode()), b"FIN " + MID + b"\n", id="finish-str"),
        pytest.param(lambda: nsq.requeue(id=MID), b"REQ " + MID + b" 0\n", id="requeue-0"),
        pytest.param(lambda: nsq.requeue(MID, time_ms=60), b"REQ " + MID + b" 60\n", id="req-60"),
        pytest.param(lambda: nsq.touch(id=MID), b"TOUCH " + MID + b"\n", id="touch"),
        pytest.param(lambda: nsq.ready(count=100), b"RDY 100\n", id="ready"),
        pytest.param(lambda: nsq.nop(), b"NOP\n", id="nop"),
        pytest.param(
            lambda: nsq.pub(topic="test", data=b"asdf"), b"PUB test\n" + size(4) + b"asdf", id="pub"
        ),
        pytest.param(
            lambda: nsq.mpub(topic="test", data=BODIES),
            b"MPUB test\n" + size(len(MPUB_BODY)) + MPUB_BODY,
            id="mpub",
        ),
        pytest.param(
            lambda: nsq.dpub(topic="test", delay_ms=1500, data=b"x"),
            b"DPUB test 1500\n" + size(1) + b"x",
            id="dpub",
        ),
    ],
)
def test_command_bytes(call, expected):
    assert call() == expected


def test_command_bytes_equal_pynsqs():
    pynsq = pytest.importorskip("nsq.protocol", reason="pynsq is not installed (bench extra)")
    for ours, theirs in [
        (nsq.identify(IDENTIFY_UNICODE), pynsq.identify(IDENTIFY_UNICODE)),
        (nsq.identify({"x": [1, "y"]}), pynsq.identify({"x": [1, "y"]})),
        (nsq.mpub("t", BODIES), pynsq.mpub("t", BODIES)),
        (nsq.requeue(MID, 60), pynsq.requeue(MID, 60)),
        (nsq.subscribe("t", "c#ephemeral"), pynsq.subscribe("t", "c#ephemeral")),
    ]:
        assert ours == theirs


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: nsq.subscribe("bad topic", "c"), ValueError),
        (lambda: nsq.subscribe("t", "x" * 65), ValueError),
        (lambda: nsq.ready(-1), ValueError),
        (lambda: nsq.ready(1.5), TypeError),
        (lambda: nsq.requeue(MID, 1.5), TypeError),
        (lambda: nsq.finish(b"short"), ValueError),  # nsqd answers E_INVALID and hangs up
        (lambda: nsq.pub("t", b""), ValueError),
        (lambda: nsq.pub("t", 42), TypeError),
        (lambda: nsq.mpub("t", []), ValueError),
        (lambda: nsq.identify("not a dict"), TypeError),
    ],
)
def test_bad_commands_fail_before_any_byte(call, error):
    with pytest.raises(error):
        call()


def test_str_body_is_utf8():
    # pynsq raised AssertionError for a str body; here it is sent as UTF-8.
    assert nsq.pub("t", "w\u00e5") == b"PUB t\n" + size(3) + "w\u00e5".encode()


# ---------------------------------------------------------------------------- frames and messages


def frame(frame_type: int, data: bytes) -> bytes:
    return struct.pack(">l", frame_type) + data


def test_unpack_response_and_decode_message():
    ts = 1_700_000_000_123_456_789
    data = struct.pack(">qh", ts, 3) + MID + b'{"data": 1}'
    frame_type, payload = nsq.unpack_response(frame(nsq.FRAME_TYPE_MESSAGE, data))
    assert frame_type == nsq.FRAME_TYPE_MESSAGE
    message = nsq.decode_message(payload)
    assert isinstance(message, nsq.Message)
    assert (message.id, message.timestamp, message.attempts, message.body) == (
        MID,
        ts,
        3,
        b'{"data": 1}',
    )
    assert nsq.unpack_response(frame(nsq.FRAME_TYPE_RESPONSE, b"OK")) == (0, b"OK")
    assert nsq.unpack_response(frame(nsq.FRAME_TYPE_ERROR, b"E_INVALID x")) == (1, b"E_INVALID x")


def test_decode_message_refuses_a_short_frame():
    with pytest.raises(nsq.ProtocolError):
        nsq.decode_message(b"\x00" * 20)


def test_decoding_matches_pynsqs():
    pynsq = pytest.importorskip("nsq.protocol", reason="pynsq is not installed (bench extra)")
    for i in range(10):
        data = struct.pack(">qh", 10**18 + i, i) + (b"%016d" % i) + b"body %d" % i
        ours, theirs = nsq.decode_message(data), pynsq.decode_message(data)
        assert (ours.id, ours.body, ours.timestamp, ours.attempts) == (
            theirs.id,
            theirs.body,
            theirs.timestamp,
            theirs.attempts,
        )


# ---------------------------------------------------------------------------- BackoffTimer


def test_backoff_timer_values():
    timer = nsq.BackoffTimer(0, 128)  # short part: 25% of 128 in 10 steps, long: the rest in 250
    assert timer.get_interval() == 0.0
    timer.success()  # nothing to take off
    assert timer.get_interval() == 0.0
    timer.failure()
    assert timer.get_interval() == pytest.approx(3.2 + 0.384)
    for _ in range(9):
        timer.failure()
    assert timer.get_interval() == pytest.approx(32 + 3.84)
    timer.failure()  # the short part is full: only the long part grows
    assert timer.get_interval() == pytest.approx(32 + 4.224)
    timer.success()
    assert timer.get_interval() == pytest.approx(32 - 3.2 + 4.224 - 0.384)
    for _ in range(300):
        timer.failure()
    assert timer.get_interval() == 128.0  # both parts capped
    for _ in range(300):
        timer.success()
    assert timer.get_interval() == 0.0


def test_backoff_timer_with_a_minimum_and_a_ratio():
    timer = nsq.BackoffTimer(1.5, 11.5, ratio=0.5, short_length=2, long_length=4)
    assert timer.get_interval() == 1.5
    timer.failure()
    assert timer.get_interval() == pytest.approx(1.5 + 2.5 + 1.25)
    timer.failure()
    timer.failure()
    assert timer.get_interval() == pytest.approx(1.5 + 5 + 3.75)
    timer.success()
    assert timer.get_interval() == pytest.approx(1.5 + 2.5 + 2.5)


def test_backoff_timer_equals_pynsqs_on_a_long_sequence():
    pynsq = pytest.importorskip("nsq.backoff_timer", reason="pynsq is not installed (bench extra)")
    ours, theirs = nsq.BackoffTimer(0.1, 60, 0.3), pynsq.BackoffTimer(0.1, 60, 0.3)
    steps = ([True] * 7 + [False] * 3) * 40 + [False] * 500
    for step in steps:
        for timer in (ours, theirs):
            timer.failure() if step else timer.success()
        assert ours.get_interval() == theirs.get_interval()


@pytest.mark.parametrize(
    ("args", "error"),
    [(("1", 2), TypeError), ((5, 1), ValueError), ((0, 1, 1.5), ValueError)],
)
def test_backoff_timer_refuses_bad_arguments(args, error):
    with pytest.raises(error):
        nsq.BackoffTimer(*args)


# ---------------------------------------------------------------------------- SyncConn


def test_sync_conn_identifies_subscribes_and_receives(nsqd):
    bodies = [b'{"data": {"test_key": %d}}' % i for i in range(10)]
    with Producer(nsqd.nsqd.tcp_address) as producer:
        producer.mpub("sync", bodies)
    host, port = nsqd.nsqd.tcp_address.rsplit(":", 1)
    conn = nsq.SyncConn(timeout=5.0)
    conn.connect(host, int(port))
    try:
        conn.send(nsq.identify({"client_id": "test", "hostname": "test.example"}))
        conn.send(nsq.subscribe("sync", "ch"))
        assert nsq.unpack_response(conn.read_response()) == (nsq.FRAME_TYPE_RESPONSE, b"OK")
        assert nsq.unpack_response(conn.read_response()) == (nsq.FRAME_TYPE_RESPONSE, b"OK")
        got = []
        for _ in bodies:
            conn.send(nsq.ready(1))
            frame_type, data = nsq.unpack_response(conn.read_response())
            assert frame_type == nsq.FRAME_TYPE_MESSAGE
            message = nsq.decode_message(data)
            assert message.attempts == 1 and len(message.id) == 16
            got.append(message.body)
            conn.send(nsq.finish(message.id))
        assert got == bodies
        conn.send(nsq.pub("bad topic!"[:3], b"x"))  # "bad": a valid name
        assert nsq.unpack_response(conn.read_response()) == (nsq.FRAME_TYPE_RESPONSE, b"OK")
    finally:
        conn.close()


def test_sync_conn_reports_a_closed_connection(nsqd):
    host, port = nsqd.nsqd.tcp_address.rsplit(":", 1)
    conn = nsq.SyncConn(timeout=5.0)
    with pytest.raises(nsq.ConnectionClosedError, match="not connected"):
        conn.send(nsq.nop())
    conn.connect(host, int(port))
    conn.send(b"BOGUS\n")  # nsqd answers E_INVALID and closes the connection
    frame_type, data = nsq.unpack_response(conn.read_response())
    assert frame_type == nsq.FRAME_TYPE_ERROR and data.startswith(b"E_INVALID")
    with pytest.raises(nsq.ConnectionClosedError):
        conn.read_response()
    conn.close()


def test_sync_conn_checks_its_arguments():
    conn = nsq.SyncConn()
    with pytest.raises(TypeError):
        conn.connect(b"127.0.0.1", 4150)
    with pytest.raises(TypeError):
        conn.connect("127.0.0.1", "4150")


# ---------------------------------------------------------------------------- AsyncConn


def test_async_conn_raises_at_use_naming_what_to_use():
    with pytest.raises(NotImplementedError, match="nsqclient.Reader/Writer.*SyncConn"):
        nsq.AsyncConn("127.0.0.1", 4150)

    class Mine(nsq.AsyncConn):  # a subclass still imports and defines
        pass

    with pytest.raises(NotImplementedError):
        Mine("127.0.0.1", 4150, timeout=2.0)


# ---------------------------------------------------------------------------- LegacyReader


def test_legacy_reader_makes_one_reader_per_task(nsqd):
    def a(message):
        return True

    def b(message):
        return True

    with pytest.warns(DeprecationWarning, match="LegacyReader"):
        legacy = nsq.LegacyReader(
            {"a": a, "b": b}, "legacy", "chan", nsqd_tcp_addresses=[nsqd.nsqd.tcp_address]
        )
    assert [(r.topic, r.channel, r.message_handler) for r in legacy.readers] == [
        ("legacy", "chan.a", a),
        ("legacy", "chan.b", b),
    ]
    with pytest.warns(DeprecationWarning):
        single = nsq.LegacyReader(
            all_tasks={"only": a},
            topic="legacy",
            channel="chan",
            nsqd_tcp_addresses=nsqd.nsqd.tcp_address,
        )
    assert [r.channel for r in single.readers] == ["chan"]
    legacy.close()
    single.close()


def test_legacy_reader_consumes_every_message_per_task(nsqd):
    from nsqclient.testing.waiting import wait_for

    http = nsq.NsqdHTTPClient(nsqd.nsqd.http_address)
    http.create_topic("legacy2")
    http.create_channel("legacy2", "c.x")  # both channels exist before the publish: each
    http.create_channel("legacy2", "c.y")  # task gets all three messages
    with Producer(nsqd.nsqd.tcp_address) as producer:
        producer.mpub("legacy2", [b"1", b"2", b"3"])
    seen: dict[str, list[bytes]] = {"x": [], "y": []}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        legacy = nsq.LegacyReader(
            all_tasks={
                "x": lambda m: seen["x"].append(m.body) is None,
                "y": lambda m: seen["y"].append(m.body) is None,
            },
            topic="legacy2",
            channel="c",
            nsqd_tcp_addresses=[nsqd.nsqd.tcp_address],
            max_in_flight=3,
        )
    for reader in legacy.readers:
        reader.start()
    wait_for(lambda: sorted(seen["x"]) == sorted(seen["y"]) == [b"1", b"2", b"3"], 15)
    legacy.close()


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((), {"topic": "t", "channel": "c"}, "all_tasks"),
        (({},), {"topic": "t", "channel": "c"}, "non-empty"),
        (({"a": 1},), {"topic": "t", "channel": "c"}, "callable"),
        (({"a": print}, "t"), {"topic": "t", "channel": "c"}, "multiple values"),
    ],
)
def test_legacy_reader_refuses_bad_arguments(args, kwargs, match):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(TypeError, match=match):
            nsq.LegacyReader(*args, **kwargs)
