"""Tests of the sans-IO wire layer (nsqclient.protocol): bytes in, bytes out, no sockets.

The expected byte strings are written out by hand from the NSQ TCP protocol spec (classic nsqd
1.3, ``nsqd/protocol_v2.go``) and from youzan's nsqd (``nsqdserver/protocol_v2.go``,
``nsqd/message.go``) and go-nsq (``command.go``, ``message.go``, ``consumer.go``):

* every command is ``NAME[ param]*\\n``, optionally followed by ``[4B big-endian size][body]``;
* PUB_TRACE body: ``[8B trace id][body]``; PUB_EXT body: ``[2B ext size][ext json][body]``;
* MPUB_TRACE / MPUB_EXT: an MPUB body whose every item is the PUB_TRACE / PUB_EXT body above,
  each item's 4-byte size counting the trace id or the ext header too;
* a message frame sent to a youzan client is
  ``[8B ts][2B attempts][8B internal id][8B trace id]`` then, with extend_support,
  ``[1B ext version]`` (and when non-zero ``[2B ext size][ext]``), then, for SUB_ORDERED and
  SUB_ADVANCED, ``[8B disk queue offset][4B raw size]``, then the body.
"""

from __future__ import annotations

import json
import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsqclient import protocol
from nsqclient.errors import ProtocolError
from nsqclient.protocol import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    Frame,
    FrameReader,
)

HEX_ID = b"0a1b2c3d4e5f6789"  # a classic nsqd message id: 16 ASCII hex characters
RAW_ID = struct.pack(">QQ", (3 << 50) | 42, 0x0A20_0A20_0A20_0A20)  # youzan: has \n and space


def size(n: int) -> bytes:
    """A 4-byte big-endian size prefix."""
    return struct.pack(">I", n)


def sized(body: bytes) -> bytes:
    return size(len(body)) + body


def u64(n: int) -> bytes:
    return struct.pack(">Q", n)


def u16(n: int) -> bytes:
    return struct.pack(">H", n)


# ------------------------------------------------------------------------------------------
# Encoders: classic NSQ


def test_magic() -> None:
    assert protocol.MAGIC_V2 == b"  V2"


def test_identify_is_compact_json_with_size() -> None:
    data = {"client_id": "c", "feature_negotiation": True, "heartbeat_interval": 30000}
    body = b'{"client_id":"c","feature_negotiation":true,"heartbeat_interval":30000}'
    assert protocol.identify(data) == b"IDENTIFY\n" + size(len(body)) + body


@pytest.mark.parametrize("secret", ["s3cr3t", b"s3cr3t"])
def test_auth(secret: str | bytes) -> None:
    assert protocol.auth(secret) == b"AUTH\n\x00\x00\x00\x06s3cr3t"


def test_sub_classic() -> None:
    assert protocol.sub("clicks", "archive") == b"SUB clicks archive\n"


def test_sub_ephemeral_names() -> None:
    assert protocol.sub("t#ephemeral", "c#ephemeral") == b"SUB t#ephemeral c#ephemeral\n"


def test_sub_accepts_ascii_bytes_names() -> None:
    assert protocol.sub(b"clicks", b"archive") == b"SUB clicks archive\n"  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("count", "line"), [(0, b"RDY 0\n"), (1, b"RDY 1\n"), (2500, b"RDY 2500\n")]
)
def test_rdy(count: int, line: bytes) -> None:
    assert protocol.rdy(count) == line


@pytest.mark.parametrize("message_id", [HEX_ID, HEX_ID.decode(), bytearray(HEX_ID)])
def test_fin_req_touch_classic_hex_id(message_id: bytes | str) -> None:
    assert protocol.fin(message_id) == b"FIN 0a1b2c3d4e5f6789\n"
    assert protocol.req(message_id, 0) == b"REQ 0a1b2c3d4e5f6789 0\n"
    assert protocol.req(message_id, 90000) == b"REQ 0a1b2c3d4e5f6789 90000\n"
    assert protocol.touch(message_id) == b"TOUCH 0a1b2c3d4e5f6789\n"


def test_fin_req_touch_youzan_raw_id_is_sent_verbatim() -> None:
    # youzan's nsqd reads FIN/REQ/TOUCH by fixed offsets (the raw id may hold \n or spaces):
    # FIN line is 21 bytes, TOUCH 23, REQ 4 + 16 + 1 + digits + 1.
    fin = protocol.fin(RAW_ID)
    touch = protocol.touch(RAW_ID)
    req = protocol.req(RAW_ID, 1500)
    assert fin == b"FIN " + RAW_ID + b"\n" and len(fin) == 21
    assert touch == b"TOUCH " + RAW_ID + b"\n" and len(touch) == 23
    assert req == b"REQ " + RAW_ID + b" 1500\n" and req[4:20] == RAW_ID


def test_cls_nop() -> None:
    assert protocol.cls() == b"CLS\n"
    assert protocol.nop() == b"NOP\n"


def test_pub() -> None:
    assert protocol.pub("clicks", b"hello") == b"PUB clicks\n\x00\x00\x00\x05hello"


@pytest.mark.parametrize("empty", [b"", "", bytearray(), memoryview(b"")])
def test_pub_empty_body_is_refused(empty: object) -> None:
    # nsqd answers an empty body with E_BAD_MESSAGE and closes the connection.
    with pytest.raises(ValueError, match="must not be empty"):
        protocol.pub("t", empty)  # type: ignore[arg-type]


def test_every_publish_command_refuses_an_empty_body() -> None:
    for call in (
        lambda: protocol.dpub("t", 10, b""),
        lambda: protocol.pub_trace("t", b"", 1),
        lambda: protocol.pub_ext("t", b"", {"k": "v"}),
        lambda: protocol.mpub("t", [b""]),
        lambda: protocol.mpub_trace("t", [b""], [1]),
        lambda: protocol.mpub_ext("t", [b""], [{}]),
    ):
        with pytest.raises(ValueError, match="must not be empty"):
            call()


def test_pub_str_body_is_utf8() -> None:
    assert protocol.pub("t", "é") == b"PUB t\n\x00\x00\x00\x02\xc3\xa9"  # type: ignore[arg-type]


def test_mpub() -> None:
    body = size(2) + size(1) + b"a" + size(3) + b"bcd"
    assert len(body) == 16
    assert protocol.mpub("t", [b"a", b"bcd"]) == b"MPUB t\n" + size(16) + body


def test_published_count() -> None:
    assert protocol.published_count(protocol.pub("t", b"x")) == 1
    assert protocol.published_count(protocol.dpub("t", 10, b"x")) == 1
    assert protocol.published_count(protocol.pub("t", b"x", partition=3)) == 1
    assert protocol.published_count(protocol.mpub("t", [b"a"] * 7)) == 7
    assert protocol.published_count(protocol.mpub("t", [b"a", b"b"], partition=1)) == 2
    assert protocol.published_count(protocol.mpub_trace("t", [b"a"] * 3, [1, 2, 3])) == 3
    assert protocol.published_count(protocol.mpub_ext("t", [b"a"] * 4, [{}] * 4)) == 4
    assert protocol.published_count(protocol.pub_trace("t", b"x", 5)) == 1


def test_mpub_accepts_tuple_and_mixed_body_types() -> None:
    expected = b"MPUB t\n" + sized(size(3) + sized(b"x") + sized(b"y") + sized(b"\xc3\xa9"))
    assert protocol.mpub("t", (b"x", bytearray(b"y"), "é")) == expected  # type: ignore[arg-type]


def test_dpub() -> None:
    assert protocol.dpub("t", 5000, b"later") == b"DPUB t 5000\n\x00\x00\x00\x05later"
    assert protocol.dpub("t", 0, b"x") == b"DPUB t 0\n\x00\x00\x00\x01x"


# ------------------------------------------------------------------------------------------
# Encoders: youzan's extensions (go-nsq command.go: SubscribeWithPart, SubscribeOrdered,
# PublishWithPart, MultiPublishWithPart, PublishTrace, MultiPublishTrace, PublishWithJsonExt,
# MultiPublishWithJsonExt)


@pytest.mark.parametrize(("partition", "tail"), [(0, b" 0"), (3, b" 3"), (None, b"")])
def test_sub_with_partition(partition: int | None, tail: bytes) -> None:
    assert protocol.sub("t", "c", partition) == b"SUB t c" + tail + b"\n"


def test_sub_ordered() -> None:
    assert protocol.sub_ordered("t", "c", 0) == b"SUB_ORDERED t c 0\n"
    assert protocol.sub_ordered("t", "c", 12) == b"SUB_ORDERED t c 12\n"


def test_pub_and_mpub_with_partition() -> None:
    assert protocol.pub("t", b"hi", partition=1) == b"PUB t 1\n\x00\x00\x00\x02hi"
    expected = b"MPUB t 7\n" + sized(size(1) + sized(b"hi"))
    assert protocol.mpub("t", [b"hi"], partition=7) == expected


def test_pub_trace() -> None:
    trace_id = 0x0102030405060708
    expected = b"PUB_TRACE t 2\n" + size(8 + 3) + u64(trace_id) + b"abc"
    assert protocol.pub_trace("t", b"abc", trace_id, partition=2) == expected


def test_pub_trace_without_partition() -> None:
    assert protocol.pub_trace("t", b"x", 0) == b"PUB_TRACE t\n" + size(9) + u64(0) + b"x"


def test_pub_trace_max_trace_id() -> None:
    out = protocol.pub_trace("t", b"x", 2**64 - 1)
    assert out.endswith(b"\xff" * 8 + b"x")


def test_mpub_trace_puts_trace_id_inside_each_item() -> None:
    # Each item: [4B size = 8 + len(body)][8B trace id][body]; the trace id is counted in the
    # item size and sits before the body (go-nsq getMPubBodyForTrace, youzan readMPUBEXT).
    body = size(2) + size(8 + 1) + u64(11) + b"a" + size(8 + 2) + u64(22) + b"bc"
    expected = b"MPUB_TRACE t 0\n" + sized(body)
    assert protocol.mpub_trace("t", [b"a", b"bc"], [11, 22], partition=0) == expected


def test_pub_ext_dict_and_bytes() -> None:
    ext_json = b'{"##trace_id":"123","k":"v"}'
    expected = b"PUB_EXT t 1\n" + sized(u16(len(ext_json)) + ext_json + b"body")
    assert protocol.pub_ext("t", b"body", {"##trace_id": "123", "k": "v"}, partition=1) == expected
    assert protocol.pub_ext("t", b"body", ext_json, partition=1) == expected


def test_pub_ext_size_field_is_two_bytes() -> None:
    ext_json = b'{"a":"' + b"x" * 300 + b'"}'
    out = protocol.pub_ext("t", b"B", ext_json)
    payload = out[len(b"PUB_EXT t\n") + 4 :]
    assert payload[:2] == u16(len(ext_json)) == b"\x01\x34"  # 308
    assert payload[2:-1] == ext_json and payload[-1:] == b"B"


def test_mpub_ext() -> None:
    e1, e2 = b'{"a":"1"}', b"{}"
    item1 = u16(len(e1)) + e1 + b"x"
    item2 = u16(len(e2)) + e2 + b"yz"
    body = size(2) + sized(item1) + sized(item2)
    expected = b"MPUB_EXT t 4\n" + sized(body)
    assert protocol.mpub_ext("t", [b"x", b"yz"], [{"a": "1"}, {}], partition=4) == expected


def test_ext_header_of_65535_bytes_still_fits_the_size_field() -> None:
    with pytest.raises(ValueError, match="extension header"):
        protocol.pub_ext("t", b"x", b"x" * 65536)


def test_ext_header_of_exactly_65535_bytes_is_refused() -> None:
    # youzan nsqd refuses ext data of len >= 65535 when it writes the message out.
    with pytest.raises(ValueError, match="65534"):
        protocol.pub_ext("t", b"x", b"x" * 65535)
    with pytest.raises(ValueError, match="65534"):
        protocol.mpub_ext("t", [b"x"], [b"x" * 65535])


def test_ext_header_of_65534_bytes_is_accepted() -> None:
    ext = b"x" * 65534
    out = protocol.pub_ext("t", b"B", ext)
    assert out == b"PUB_EXT t\n" + sized(u16(65534) + ext + b"B")


@pytest.mark.parametrize("trace_id", [-1, 2**64, 1.5, "1", True])
def test_bad_trace_id(trace_id: object) -> None:
    with pytest.raises(ValueError, match="trace id"):
        protocol.pub_trace("t", b"x", trace_id)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="trace id"):
        protocol.mpub_trace("t", [b"x"], [trace_id])  # type: ignore[list-item]


def test_largest_trace_id_is_accepted() -> None:
    assert protocol.pub_trace("t", b"x", 2**64 - 1).endswith(u64(2**64 - 1) + b"x")


def test_mpub_trace_and_ext_need_one_per_message() -> None:
    with pytest.raises(ValueError, match="one trace id per message"):
        protocol.mpub_trace("t", [b"a", b"b"], [1])
    with pytest.raises(ValueError, match="one extension header per message"):
        protocol.mpub_ext("t", [b"a"], [{}, {}])


def test_mpub_trace_and_ext_empty_list() -> None:
    with pytest.raises(ValueError, match="at least one"):
        protocol.mpub_trace("t", [], [])
    with pytest.raises(ValueError, match="at least one"):
        protocol.mpub_ext("t", [], [])


@pytest.mark.parametrize("partition", [-1, True, 1.0, "1"])
def test_bad_partition(partition: object) -> None:
    for call in (
        lambda: protocol.sub("t", "c", partition),  # type: ignore[arg-type]
        lambda: protocol.sub_ordered("t", "c", partition),  # type: ignore[arg-type]
        lambda: protocol.pub("t", b"x", partition),  # type: ignore[arg-type]
        lambda: protocol.mpub("t", [b"x"], partition),  # type: ignore[arg-type]
        lambda: protocol.pub_trace("t", b"x", 1, partition),  # type: ignore[arg-type]
        lambda: protocol.pub_ext("t", b"x", {}, partition),  # type: ignore[arg-type]
    ):
        with pytest.raises(ValueError, match="partition"):
            call()


def test_sub_ordered_needs_a_partition() -> None:
    with pytest.raises(ValueError, match="partition"):
        protocol.sub_ordered("t", "c", None)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------
# Validation


VALID_NAMES = [
    "a",
    "a" * 64,
    "Clicks.v2-raw_9",
    "x#ephemeral",
    "a" * 54 + "#ephemeral",  # 64 characters, the suffix counts
    "...",
    "-_",
]
INVALID_NAMES = [
    "",
    "a" * 65,
    "a" * 55 + "#ephemeral",  # 65 characters
    "a b",
    "a/b",
    "a:b",
    "tópico",
    "#ephemeral",
    "a#ephemeralx",
    "a#other",
    "a#",
    "a\nb",
    " a",
]


@pytest.mark.parametrize("name", VALID_NAMES)
def test_valid_names(name: str) -> None:
    assert protocol.valid_topic_name(name)
    assert protocol.valid_channel_name(name)
    assert protocol.check_topic_name(name) == name
    assert protocol.check_channel_name(name) == name


@pytest.mark.parametrize("name", INVALID_NAMES)
def test_invalid_names(name: str) -> None:
    assert not protocol.valid_topic_name(name)
    assert not protocol.valid_channel_name(name)


@pytest.mark.parametrize("name", [None, 5, ["a"], b"\xff\xfe"])
def test_non_str_names_are_invalid(name: object) -> None:
    assert not protocol.valid_topic_name(name)
    with pytest.raises(ValueError, match="invalid topic name"):
        protocol.check_topic_name(name)


def test_check_name_accepts_ascii_bytes() -> None:
    assert protocol.check_topic_name(b"clicks") == "clicks"
    assert protocol.check_channel_name(b"archive#ephemeral") == "archive#ephemeral"


@pytest.mark.parametrize("name", ["bad name", "a" * 65, ""])
def test_value_error_names_the_bad_name_and_the_rule(name: str) -> None:
    with pytest.raises(ValueError) as topic_exc:
        protocol.pub(name, b"x")
    text = str(topic_exc.value)
    assert "topic" in text and repr(name) in text
    assert "64" in text and "#ephemeral" in text and ".a-zA-Z0-9_-" in text
    with pytest.raises(ValueError) as channel_exc:
        protocol.sub("t", name)
    text = str(channel_exc.value)
    assert "channel" in text and repr(name) in text and "64" in text


@pytest.mark.parametrize("name", ["topic\n", "topic#ephemeral\n"])
def test_name_with_trailing_newline_is_invalid(name: str) -> None:
    assert not protocol.valid_topic_name(name)
    assert not protocol.valid_channel_name(name)
    with pytest.raises(ValueError, match="invalid topic name"):
        protocol.sub(name, "c")
    with pytest.raises(ValueError, match="invalid channel name"):
        protocol.sub("t", name)


def test_to_bytes() -> None:
    assert protocol.to_bytes(b"abc") == b"abc"
    assert protocol.to_bytes("é") == b"\xc3\xa9"
    for value in (bytearray(b"abc"), memoryview(b"abc")):
        out = protocol.to_bytes(value)
        assert type(out) is bytes and out == b"abc"
    assert protocol.to_bytes(memoryview(b"xabcx")[1:4]) == b"abc"


@pytest.mark.parametrize("value", [None, 1, 1.5, {"a": 1}, [b"a"], object()])
def test_to_bytes_rejects_other_types(value: object) -> None:
    with pytest.raises(TypeError, match=type(value).__name__):
        protocol.to_bytes(value)


@pytest.mark.parametrize("body", [None, 7])
def test_pub_rejects_non_bytes_body(body: object) -> None:
    with pytest.raises(TypeError):
        protocol.pub("t", body)  # type: ignore[arg-type]


def test_mpub_empty_list() -> None:
    with pytest.raises(ValueError, match="at least one message"):
        protocol.mpub("t", [])


@pytest.mark.parametrize("single", [b"abc", "abc", bytearray(b"abc"), memoryview(b"abc")])
def test_mpub_single_body_is_a_type_error(single: object) -> None:
    with pytest.raises(TypeError, match="list of message bodies"):
        protocol.mpub("t", single)  # type: ignore[arg-type]


@pytest.mark.parametrize("single", [b"abc", "abc", bytearray(b"abc"), memoryview(b"abc")])
def test_mpub_trace_and_ext_single_body_is_a_type_error(single: object) -> None:
    with pytest.raises(TypeError, match="MPUB_TRACE takes a list of message bodies"):
        protocol.mpub_trace("t", single, [1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="MPUB_EXT takes a list of message bodies"):
        protocol.mpub_ext("t", single, [{}, {}, {}])  # type: ignore[arg-type]


def test_mpub_with_non_bytes_item() -> None:
    with pytest.raises(TypeError):
        protocol.mpub("t", [b"a", None])  # type: ignore[list-item]


@pytest.mark.parametrize("count", [-1, True, 1.0, "1", None])
def test_bad_rdy(count: object) -> None:
    with pytest.raises(ValueError, match="RDY"):
        protocol.rdy(count)  # type: ignore[arg-type]


@pytest.mark.parametrize("delay", [-1, 1.5, "10", None])
def test_bad_req_delay(delay: object) -> None:
    with pytest.raises(ValueError, match="REQ delay"):
        protocol.req(HEX_ID, delay)  # type: ignore[arg-type]


@pytest.mark.parametrize("delay", [True, False])
def test_req_delay_bool_is_refused(delay: bool) -> None:
    with pytest.raises(ValueError, match="REQ delay"):
        protocol.req(HEX_ID, delay)


@pytest.mark.parametrize("delay", [-1, True, 2.0])
def test_bad_dpub_delay(delay: object) -> None:
    with pytest.raises(ValueError, match="DPUB delay"):
        protocol.dpub("t", delay, b"x")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "message_id", [b"", b"0123456789abcde", b"0123456789abcdef0", "short", 12345, None]
)
def test_bad_message_id_length(message_id: object) -> None:
    for call in (
        lambda: protocol.fin(message_id),  # type: ignore[arg-type]
        lambda: protocol.req(message_id, 0),  # type: ignore[arg-type]
        lambda: protocol.touch(message_id),  # type: ignore[arg-type]
    ):
        with pytest.raises(ValueError, match="message id must be 16 bytes"):
            call()


@pytest.mark.parametrize("message_id", [b"", b"0123456789abcde", b"0123456789abcdef0"])
def test_encode_message_refuses_bad_id_length(message_id: bytes) -> None:
    with pytest.raises(ValueError, match="message id must be 16 bytes"):
        protocol.encode_message(0, 1, message_id, b"x")


# ------------------------------------------------------------------------------------------
# decode_message


TS = 1_700_000_000_123_456_789


def header(attempts: int = 1, message_id: bytes = HEX_ID, ts: int = TS) -> bytes:
    return struct.pack(">qH", ts, attempts) + message_id


def test_encode_message_layout() -> None:
    assert protocol.encode_message(TS, 3, HEX_ID, b"body") == header(3) + b"body"


def test_decode_classic() -> None:
    msg = protocol.decode_message(header(2) + b"hello")
    assert msg == protocol.DecodedMessage(TS, 2, HEX_ID, b"hello")
    assert msg.internal_id is msg.trace_id is msg.offset is msg.raw_size is None
    assert msg.ext_version is None and msg.ext is None


def test_decode_classic_empty_body_and_extreme_header_values() -> None:
    msg = protocol.decode_message(header(65535, ts=-1))
    assert (msg.timestamp, msg.attempts, msg.body) == (-1, 65535, b"")


def test_decode_returns_bytes_from_bytearray_and_memoryview() -> None:
    data = header() + b"xyz"
    for view in (bytearray(data), memoryview(data)):
        msg = protocol.decode_message(view)  # type: ignore[arg-type]
        assert type(msg.body) is bytes and msg.body == b"xyz"
        assert type(msg.id) is bytes


def test_decode_youzan_splits_raw_id() -> None:
    internal_id, trace_id = (5 << 50) | 77, 0xDEADBEEF_00000001
    raw = struct.pack(">QQ", internal_id, trace_id)
    msg = protocol.decode_message(header(1, raw) + b"payload", youzan=True)
    assert msg.id == raw  # kept verbatim for FIN/REQ/TOUCH
    assert (msg.internal_id, msg.trace_id) == (internal_id, trace_id)
    assert msg.body == b"payload"
    assert msg.offset is msg.raw_size is msg.ext_version is msg.ext is None
    assert protocol.fin(msg.id) == b"FIN " + raw + b"\n"


def test_decode_extended_version_zero() -> None:
    data = header(1, RAW_ID) + b"\x00" + b"body"
    msg = protocol.decode_message(data, extended=True)
    assert (msg.ext_version, msg.ext, msg.body) == (0, None, b"body")
    assert msg.internal_id == struct.unpack(">Q", RAW_ID[:8])[0]


def test_decode_extended_json_header() -> None:
    ext = json.dumps({"##trace_id": "9", "tag": "x"}).encode()
    data = header(1, RAW_ID) + b"\x04" + u16(len(ext)) + ext + b"body"
    msg = protocol.decode_message(data, youzan=True, extended=True)
    assert (msg.ext_version, msg.ext, msg.body) == (4, ext, b"body")
    assert json.loads(msg.ext) == {"##trace_id": "9", "tag": "x"}


def test_decode_extended_empty_ext() -> None:
    msg = protocol.decode_message(header(1, RAW_ID) + b"\x04\x00\x00rest", extended=True)
    assert (msg.ext_version, msg.ext, msg.body) == (4, b"", b"rest")


def test_decode_ordered() -> None:
    data = header(1, RAW_ID) + u64(123_456) + size(71) + b"body"
    msg = protocol.decode_message(data, youzan=True, ordered=True)
    assert (msg.offset, msg.raw_size, msg.body) == (123_456, 71, b"body")
    assert msg.ext_version is None


def test_decode_extended_then_ordered() -> None:
    # youzan nsqd/message.go internalWriteTo: id, ext version (+ size + ext), then offset and
    # raw size (writeDetail), then the body; go-nsq decodes the ext in DecodeMessageWithExt and
    # strips offset/raw size from the remaining body in Consumer.onConnMessage.
    ext = b'{"k":"v"}'
    data = header(1, RAW_ID) + b"\x04" + u16(len(ext)) + ext + u64(2**40) + size(99) + b"B"
    msg = protocol.decode_message(data, youzan=True, extended=True, ordered=True)
    assert (msg.ext_version, msg.ext) == (4, ext)
    assert (msg.offset, msg.raw_size, msg.body) == (2**40, 99, b"B")
    data0 = header(1, RAW_ID) + b"\x00" + u64(8) + size(9) + b"B"
    msg0 = protocol.decode_message(data0, extended=True, ordered=True)
    assert (msg0.ext_version, msg0.ext, msg0.offset, msg0.raw_size, msg0.body) == (
        0,
        None,
        8,
        9,
        b"B",
    )


@pytest.mark.parametrize(
    ("data", "kwargs"),
    [
        (b"", {}),
        (header()[:-1], {}),
        (header(1, RAW_ID), {"extended": True}),  # no ext version byte
        (header(1, RAW_ID) + b"\x04\x00", {"extended": True}),  # half an ext size
        (header(1, RAW_ID) + b"\x04\x00\x05abcd", {"extended": True}),  # ext cut short
        (header(1, RAW_ID) + u64(1) + b"\x00\x00\x00", {"ordered": True}),  # 11 of 12 bytes
        (header(1, RAW_ID) + b"\x00" + u64(1), {"extended": True, "ordered": True}),
    ],
)
def test_decode_truncated(data: bytes, kwargs: dict[str, bool]) -> None:
    with pytest.raises(ProtocolError):
        protocol.decode_message(data, **kwargs)


# ------------------------------------------------------------------------------------------
# decode_trace_reply


def test_decode_trace_reply() -> None:
    data = b"OK" + u64((1 << 50) | 7) + u64(555) + u64(4096) + size(120)
    assert len(data) == 30
    reply = protocol.decode_trace_reply(data)
    assert reply == protocol.TraceReply((1 << 50) | 7, 555, 4096, 120)


def test_decode_trace_reply_mpub_trace_has_zero_trace_id() -> None:
    reply = protocol.decode_trace_reply(b"OK" + u64(9) + u64(0) + u64(0) + size(300))
    assert (reply.internal_id, reply.trace_id, reply.offset, reply.raw_size) == (9, 0, 0, 300)


@pytest.mark.parametrize(
    "data",
    [b"", b"OK", b"OK" + b"\x00" * 27, b"OK" + b"\x00" * 29, b"NO" + b"\x00" * 28, b"\x00" * 30],
)
def test_decode_trace_reply_errors(data: bytes) -> None:
    with pytest.raises(ProtocolError, match="30 bytes"):
        protocol.decode_trace_reply(data)


# ------------------------------------------------------------------------------------------
# FrameReader


def test_encode_frame_layout() -> None:
    ok = b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    assert protocol.encode_frame(FRAME_TYPE_RESPONSE, b"OK") == ok
    assert protocol.encode_frame(FRAME_TYPE_ERROR, b"") == b"\x00\x00\x00\x04\x00\x00\x00\x01"


def test_reader_one_frame_and_leftover() -> None:
    reader = FrameReader()
    hb = protocol.encode_frame(FRAME_TYPE_RESPONSE, protocol.HEARTBEAT)
    ok = protocol.encode_frame(FRAME_TYPE_RESPONSE, protocol.OK)
    assert reader.feed(hb + ok[:5]) == [Frame(FRAME_TYPE_RESPONSE, b"_heartbeat_")]
    assert reader.buffered == 5
    assert reader.feed(b"") == []
    assert reader.feed(ok[5:]) == [Frame(FRAME_TYPE_RESPONSE, b"OK")]
    assert reader.buffered == 0


def test_reader_frame_with_empty_data() -> None:
    assert FrameReader().feed(size(4) + size(1)) == [Frame(FRAME_TYPE_ERROR, b"")]


def test_reader_accepts_bytearray_and_memoryview() -> None:
    payload = protocol.encode_message(1, 1, b"0" * 16, b"m")
    frame = protocol.encode_frame(FRAME_TYPE_MESSAGE, payload)
    assert FrameReader().feed(bytearray(frame)) == [Frame(FRAME_TYPE_MESSAGE, payload)]
    assert FrameReader().feed(memoryview(frame)) == [Frame(FRAME_TYPE_MESSAGE, payload)]


@pytest.mark.parametrize(
    "reply",
    [b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", b"HTTP", b"HTTP/1.0 200 OK"],
)
def test_reader_detects_http_reply(reply: bytes) -> None:
    with pytest.raises(ProtocolError, match="^this is an HTTP port, not an nsqd TCP port$"):
        FrameReader().feed(reply)


def test_reader_detects_http_reply_after_frames() -> None:
    reader = FrameReader()
    assert reader.feed(protocol.encode_frame(0, b"OK")) == [Frame(0, b"OK")]
    with pytest.raises(ProtocolError, match="HTTP port"):
        reader.feed(b"HTTP/1.1 400 Bad Request\r\n")


def test_reader_names_the_peer_of_an_http_reply() -> None:
    reader = FrameReader(peer="127.0.0.1:4151")
    with pytest.raises(ProtocolError, match="^127.0.0.1:4151 is an HTTP port, not an nsqd TCP"):
        reader.feed(b"HTTP/1.1 400 Bad Request\r\n")


def test_reader_says_lookupd_tcp_port_is_not_nsqd() -> None:
    # nsqlookupd's V1 protocol answers nsqd's "  V2" with [4B size]E_BAD_PROTOCOL: read as
    # frames, that was "unknown frame type 1163870785" (b"E_BA").
    reply = size(14) + b"E_BAD_PROTOCOL"
    with pytest.raises(ProtocolError) as exc:
        FrameReader(peer="127.0.0.1:4160").feed(reply)
    assert str(exc.value) == (
        "127.0.0.1:4160 is not an nsqd TCP port: it sent b'E_BAD_PROTOCOL' (nsqlookupd's TCP port"
        " answers this way; nsqd's TCP port is 4150 by default)"
    )
    # The handshake feeds the 4-byte size first, then the rest: same answer.
    reader = FrameReader()
    assert reader.feed(reply[:4]) == []
    with pytest.raises(ProtocolError, match="^the peer is not an nsqd TCP port: it sent b'E_BAD"):
        reader.feed(reply[4:])


def test_reader_says_unframed_text_is_not_nsqd() -> None:
    with pytest.raises(ProtocolError) as exc:
        FrameReader(peer="h:1").feed(b"E_INVALID invalid command\n")
    assert str(exc.value) == (
        "h:1 is not an nsqd TCP port: it sent b'E_INVALID invalid command\\n' (an nsqd answers"
        " in binary frames; nsqd's TCP port is 4150 by default)"
    )


def test_reader_quotes_at_most_64_bytes_of_a_foreign_reply() -> None:
    with pytest.raises(ProtocolError, match=r"it sent b'(SSH-2\.0-x{56})\.\.\.' \(") as exc:
        FrameReader().feed(b"SSH-2.0-" + b"x" * 100)
    assert "x" * 57 not in str(exc.value)


def test_reader_binary_garbage_keeps_the_plain_messages() -> None:
    with pytest.raises(ProtocolError, match="^frame size 4294967295 exceeds the maximum"):
        FrameReader().feed(b"\xff\xff\xff\xff")
    with pytest.raises(ProtocolError, match="^unknown frame type 7$"):
        FrameReader().feed(size(5) + struct.pack(">i", 7) + b"\x00")


@pytest.mark.parametrize("bad", [0, 1, 3])
def test_reader_size_below_four(bad: int) -> None:
    with pytest.raises(ProtocolError, match=f"frame size {bad} is below the minimum of 4"):
        FrameReader().feed(size(bad) + b"\x00" * 8)


def test_reader_oversized_frame_raises_before_its_body_arrives() -> None:
    reader = FrameReader(max_frame_size=1024)
    with pytest.raises(ProtocolError, match="frame size 1025 exceeds the maximum of 1024"):
        reader.feed(size(1025))  # only the 4-byte size; no body sent yet
    assert reader.buffered == 0


def test_reader_huge_size_does_not_wait_or_buffer() -> None:
    reader = FrameReader()
    assert reader.feed(b"\xff\xff") == []
    assert reader.buffered == 2
    with pytest.raises(ProtocolError, match="exceeds the maximum"):
        reader.feed(b"\xff\xff" + b"x" * 100)
    assert reader.buffered == 0


def test_reader_frame_of_exactly_max_size_is_accepted() -> None:
    reader = FrameReader(max_frame_size=64)
    frame = protocol.encode_frame(FRAME_TYPE_MESSAGE, b"z" * 60)
    assert reader.feed(frame[:30]) == []
    assert reader.buffered == 30
    assert reader.feed(frame[30:]) == [Frame(FRAME_TYPE_MESSAGE, b"z" * 60)]


def test_reader_partial_valid_frame_buffers_only_what_arrived() -> None:
    reader = FrameReader(max_frame_size=1 << 20)
    assert reader.feed(size(1 << 20) + size(2) + b"abc") == []
    assert reader.buffered == 11


@pytest.mark.parametrize("frame_type", [3, 4, 255, -1, 2**31 - 1])
def test_reader_unknown_frame_type(frame_type: int) -> None:
    data = struct.pack(">Ii", 6, frame_type) + b"xy"
    with pytest.raises(ProtocolError, match=f"unknown frame type {frame_type}"):
        FrameReader().feed(data)


def test_reader_stays_broken_after_an_error() -> None:
    reader = FrameReader()
    with pytest.raises(ProtocolError) as first:
        reader.feed(size(2))
    good = protocol.encode_frame(FRAME_TYPE_RESPONSE, b"OK")
    for chunk in (b"", good, good):
        with pytest.raises(ProtocolError) as again:
            reader.feed(chunk)
        assert again.value is first.value
    assert reader.buffered == 0


def test_reader_one_byte_chunks() -> None:
    frames = [Frame(0, b"OK"), Frame(2, header() + b"body"), Frame(1, b"E_INVALID x")]
    frames.append(Frame(0, b""))
    stream = b"".join(protocol.encode_frame(f.type, f.data) for f in frames)
    reader = FrameReader()
    got: list[Frame] = []
    for i in range(len(stream)):
        got += reader.feed(stream[i : i + 1])
    assert got == frames and reader.buffered == 0


# ------------------------------------------------------------------------------------------
# Round trips (hypothesis)


frame_st = st.one_of(
    st.builds(
        Frame, st.sampled_from([FRAME_TYPE_RESPONSE, FRAME_TYPE_ERROR]), st.binary(max_size=300)
    ),
    # a message frame holds at least its 26-byte header (a shorter one is a ProtocolError)
    st.builds(Frame, st.just(FRAME_TYPE_MESSAGE), st.binary(min_size=26, max_size=300)),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames=st.lists(frame_st, max_size=12), data=st.data())
def test_frames_round_trip_with_any_chunking(frames: list[Frame], data: st.DataObject) -> None:
    stream = b"".join(protocol.encode_frame(f.type, f.data) for f in frames)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=40), label="cuts")
    if data.draw(st.booleans(), label="one-byte chunks"):
        cuts = list(range(len(stream) + 1))
    bounds = [0, *sorted(cuts), len(stream)]
    reader = FrameReader()
    got: list[Frame] = []
    for start, end in zip(bounds, bounds[1:], strict=False):
        got += reader.feed(stream[start:end])
        assert reader.buffered <= protocol.DEFAULT_MAX_FRAME_SIZE + 4
    assert got == frames
    assert reader.buffered == 0
    assert all(type(f.data) is bytes for f in got)


@settings(max_examples=200, deadline=None)
@given(
    ts=st.integers(-(2**63), 2**63 - 1),
    attempts=st.integers(0, 2**16 - 1),
    message_id=st.binary(min_size=16, max_size=16),
    body=st.binary(max_size=200),
)
def test_message_round_trip(ts: int, attempts: int, message_id: bytes, body: bytes) -> None:
    data = protocol.encode_message(ts, attempts, message_id, body)
    assert protocol.decode_message(data) == (ts, attempts, message_id, body) + (None,) * 6
    yz = protocol.decode_message(data, youzan=True)
    assert yz.body == body and yz.id == message_id
    assert struct.pack(">QQ", yz.internal_id, yz.trace_id) == message_id


def parse_mpub(command: bytes) -> tuple[bytes, list[bytes]]:
    """Parse an MPUB-family command back into (line, item payloads); checks every size."""
    line, sep, rest = command.partition(b"\n")
    assert sep == b"\n"
    (total,) = struct.unpack_from(">I", rest)
    body = rest[4:]
    assert len(body) == total
    (count,) = struct.unpack_from(">I", body)
    pos, items = 4, []
    for _ in range(count):
        (n,) = struct.unpack_from(">I", body, pos)
        pos += 4
        items.append(body[pos : pos + n])
        assert len(items[-1]) == n
        pos += n
    assert pos == len(body)
    return line, items


# nsqd refuses empty bodies, and so do the encoders: draw non-empty ones.
bodies_st = st.lists(st.binary(min_size=1, max_size=100), min_size=1, max_size=20)


@settings(max_examples=150, deadline=None)
@given(bodies=bodies_st, partition=st.none() | st.integers(0, 1023))
def test_mpub_parses_back(bodies: list[bytes], partition: int | None) -> None:
    line, items = parse_mpub(protocol.mpub("topic.x", bodies, partition))
    assert line == (b"MPUB topic.x" if partition is None else b"MPUB topic.x %d" % partition)
    assert items == bodies


@settings(max_examples=100, deadline=None)
@given(bodies=bodies_st, data=st.data())
def test_mpub_trace_parses_back(bodies: list[bytes], data: st.DataObject) -> None:
    ids = data.draw(st.lists(st.integers(0, 2**64 - 1), min_size=len(bodies), max_size=len(bodies)))
    line, items = parse_mpub(protocol.mpub_trace("t", bodies, ids, 3))
    assert line == b"MPUB_TRACE t 3"
    assert [(struct.unpack(">Q", i[:8])[0], i[8:]) for i in items] == list(
        zip(ids, bodies, strict=True)
    )


ext_st = st.dictionaries(st.text(max_size=10), st.text(max_size=20), max_size=4)


@settings(max_examples=100, deadline=None)
@given(bodies=bodies_st, data=st.data())
def test_mpub_ext_parses_back(bodies: list[bytes], data: st.DataObject) -> None:
    exts = data.draw(st.lists(ext_st, min_size=len(bodies), max_size=len(bodies)))
    line, items = parse_mpub(protocol.mpub_ext("t", bodies, exts))
    assert line == b"MPUB_EXT t"
    decoded = []
    for item in items:
        (n,) = struct.unpack_from(">H", item)
        decoded.append((json.loads(item[2 : 2 + n]), item[2 + n :]))
    assert decoded == list(zip(exts, bodies, strict=True))


@settings(max_examples=100, deadline=None)
@given(bodies=bodies_st, data=st.data())
def test_an_empty_item_anywhere_in_a_list_is_refused(
    bodies: list[bytes], data: st.DataObject
) -> None:
    where = data.draw(st.integers(0, len(bodies)), label="where")
    with_empty = [*bodies[:where], b"", *bodies[where:]]
    n = len(with_empty)
    for call in (
        lambda: protocol.mpub("t", with_empty),
        lambda: protocol.mpub_trace("t", with_empty, [1] * n),
        lambda: protocol.mpub_ext("t", with_empty, [{}] * n),
    ):
        with pytest.raises(ValueError, match="must not be empty"):
            call()


def _reference_mpub(topic: str, bodies: list[bytes]) -> bytes:
    payload = struct.pack(">I", len(bodies)) + b"".join(
        struct.pack(">I", len(b)) + b for b in bodies
    )
    return f"MPUB {topic}\n".encode() + struct.pack(">I", len(payload)) + payload


@pytest.mark.parametrize("seed", range(20))
def test_mpub_matches_a_plain_encoder(seed):
    rng = random.Random(seed)
    bodies = [rng.randbytes(rng.randint(1, 300)) for _ in range(rng.randint(1, 250))]
    mixed = [
        b.decode("latin-1") if i % 3 == 0 and b.isascii() else bytearray(b) if i % 5 == 0 else b
        for i, b in enumerate(bodies)
    ]
    assert protocol.mpub("t", bodies) == _reference_mpub("t", bodies)
    assert protocol.mpub("t", mixed) == _reference_mpub("t", bodies)


def test_mpub_refuses_an_empty_body_among_plain_ones():
    with pytest.raises(ValueError, match="empty"):
        protocol.mpub("t", [b"a", b"", b"c"])


# ------------------------------------------------------------------------------------------------
# FrameReader.leading_oks: a publisher's read of OK answers


def _frame(data: bytes, frame_type: int = protocol.FRAME_TYPE_RESPONSE) -> bytes:
    return struct.pack(">ll", len(data) + 4, frame_type) + data


def test_leading_oks_counts_the_whole_ok_frames_a_read_begins_with() -> None:
    reader = FrameReader()
    ok = protocol.OK_FRAME
    assert ok == _frame(b"OK")
    assert reader.leading_oks(ok) == (1, 10)
    assert reader.leading_oks(ok * 300) == (300, 3000)
    assert reader.leading_oks(ok * 2 + ok[:5]) == (2, 20)  # the cut one is fed
    assert reader.leading_oks(ok + _frame(protocol.HEARTBEAT) + ok) == (1, 10)
    assert reader.leading_oks(_frame(b"OKAY")) == (0, 0)
    assert reader.leading_oks(_frame(b"E_INVALID x", protocol.FRAME_TYPE_ERROR) + ok) == (0, 0)
    assert reader.leading_oks(b"") == (0, 0)


def test_leading_oks_completes_an_ok_the_previous_read_cut() -> None:
    reader = FrameReader()
    ok = protocol.OK_FRAME
    assert reader.feed(ok[:3]) == []
    assert reader.leading_oks(ok[3:] + ok * 2 + ok[:4]) == (3, 27)
    assert reader.buffered == 0  # taken: nothing is left from the cut one
    assert reader.feed(ok[:4]) == [] and reader.leading_oks(ok[4:]) == (1, 6)


def test_leading_oks_takes_nothing_while_another_frame_is_incomplete() -> None:
    reader = FrameReader()
    heartbeat = _frame(protocol.HEARTBEAT)
    assert reader.feed(heartbeat[:3]) == []
    assert reader.leading_oks(heartbeat[3:]) == (0, 0)
    assert [f.data for f in reader.feed(heartbeat[3:])] == [protocol.HEARTBEAT]
    assert reader.feed(protocol.OK_FRAME[:3]) == []
    assert reader.leading_oks(protocol.OK_FRAME[3:5]) == (0, 0)  # not whole yet
    assert reader.buffered == 3


frame_st = st.sampled_from(
    [
        protocol.OK_FRAME,
        _frame(protocol.HEARTBEAT),
        _frame(b"CLOSE_WAIT"),
        _frame(b"E_PUB_FAILED nope", protocol.FRAME_TYPE_ERROR),
        _frame(protocol.encode_message(1, 1, b"0" * 16, b"OK" * 5), protocol.FRAME_TYPE_MESSAGE),
    ]
)


@settings(max_examples=200, deadline=None)
@given(frames=st.lists(frame_st, max_size=30), cuts=st.lists(st.integers(0, 400), max_size=6))
def test_leading_oks_then_feed_reads_what_feed_alone_reads(
    frames: list[bytes], cuts: list[int]
) -> None:
    """A reader that counts the OKs a read begins with and feeds the rest sees the same
    answers, in the same order, as one that feeds everything, however the stream is cut into
    reads."""
    stream = b"".join(frames)
    points = sorted({0, len(stream), *(c for c in cuts if c < len(stream))})
    reads = [stream[a:b] for a, b in zip(points, points[1:], strict=False)]
    plain, fast = FrameReader(), FrameReader()
    expected = [tuple(f) for r in reads for f in plain.feed(r)]
    got: list[tuple[int, bytes]] = []
    for r in reads:
        oks, used = fast.leading_oks(r)
        got.extend([(protocol.FRAME_TYPE_RESPONSE, protocol.OK)] * oks)
        got.extend(tuple(f) for f in fast.feed(r[used:]))
    assert got == expected
