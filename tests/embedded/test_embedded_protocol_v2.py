"""The embedded nsqd's protocol V2 core, with bytes only: no socket, no event loop, no node.

:class:`~nsqclient.testing.nsqd.protocol_v2.ProtocolV2` takes what a client sends, gives the
commands and their arguments with nsqd's checks, and gives back what is queued for the client
(compressed once compression is on); youzan's variant reads raw ids and partitions."""

from __future__ import annotations

import json
import struct
import zlib

import pytest

from nsqclient import protocol
from nsqclient.testing.nsqd.options import NSQDOptions
from nsqclient.testing.nsqd.protocol_v2 import (
    CLOSE_WAIT_FRAME,
    STATE_CLOSING,
    STATE_INIT,
    STATE_MAGIC,
    STATE_SUBSCRIBED,
    BadProtocol,
    ClientError,
    FatalClientError,
    LineTooLong,
    ProtocolV2,
)
from nsqclient.testing.youzan.protocol import (
    EXT_VER_JSON,
    YOUZAN_VERSION,
    BodyError,
    YouzanProtocolV2,
    traced_reply,
)


def sized(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def ready(opts: NSQDOptions | None = None, cls: type[ProtocolV2] = ProtocolV2) -> ProtocolV2:
    """A core past the magic."""
    wire = cls(opts or NSQDOptions())
    wire.receive_data(b"  V2")
    assert wire.read_magic()
    return wire


def command(wire: ProtocolV2, data: bytes) -> tuple[list[bytes], int]:
    wire.receive_data(data)
    found = wire.next_command()
    assert found is not None
    return found


def refused(call, code: str) -> str:
    with pytest.raises(FatalClientError) as info:
        call()
    assert info.value.code == code
    desc = info.value.desc
    return desc.decode() if isinstance(desc, bytes) else desc


def test_the_magic_arrives_in_pieces_and_anything_else_is_refused():
    wire = ProtocolV2(NSQDOptions())
    assert wire.state == STATE_MAGIC
    wire.receive_data(b"  ")
    assert not wire.read_magic()
    wire.receive_data(b"V2NOP\n")
    assert wire.read_magic() and wire.state == STATE_INIT
    assert wire.next_command() == ([b"NOP"], 7)  # offsets count from the first byte received
    bad = ProtocolV2(NSQDOptions())
    bad.receive_data(b"  V1")
    with pytest.raises(BadProtocol) as info:
        bad.read_magic()
    assert info.value.magic == b"  V1"


def test_commands_come_out_line_by_line_and_stay_until_read_past():
    wire = ready()
    wire.receive_data(b"NOP\r\nRDY 5\nFI")
    params, nl = wire.next_command() or ([], -1)
    assert params == [b"NOP"]
    assert wire.next_command() == (params, nl)  # not consumed until advance()
    wire.advance(nl + 1)
    params, nl = wire.next_command() or ([], -1)
    assert params == [b"RDY", b"5"]
    wire.advance(nl + 1)
    assert wire.next_command() is None  # "FI" is not a line yet
    wire.receive_data(b"N " + b"0" * 16 + b"\n")
    params, nl = wire.next_command() or ([], -1)
    assert params == [b"FIN", b"0" * 16]
    wire.advance(nl + 1)
    wire.compact()  # everything was read: the buffer starts afresh
    assert bytes(wire.buf) == b"" and wire.pos == 0


def test_a_line_longer_than_nsqds_buffer_is_refused():
    wire = ready()
    wire.receive_data(b"X" * (16 * 1024))
    with pytest.raises(LineTooLong):
        wire.next_command()


def test_identify_takes_the_settings_and_negotiates_with_nsqds_reply():
    wire = ready()
    body = json.dumps(
        {
            "client_id": "c",
            "hostname": "h",
            "heartbeat_interval": 5000,
            "msg_timeout": 2000,
            "sample_rate": 10,
            "feature_negotiation": True,
            "deflate": True,
            "deflate_level": 9,
        }
    ).encode()
    params, nl = command(wire, b"IDENTIFY\n" + sized(body)[:10])
    assert params == [b"IDENTIFY"]
    assert wire.parse_identify(nl + 1) is None  # the body is not complete
    wire.receive_data(sized(body)[10:])
    read = wire.parse_identify(nl + 1)
    assert read is not None
    after, data = read
    assert after == len(wire.buf) and data["client_id"] == "c"
    assert (wire.heartbeat_interval, wire.msg_timeout, wire.sample_rate) == (5.0, 2.0, 10)
    reply, negotiated = wire.negotiate(data, tls_available=False, auth_required=True)
    [(kind, payload)] = protocol.FrameReader().feed(reply)
    answer = json.loads(payload)
    assert kind == protocol.FRAME_TYPE_RESPONSE
    assert answer["version"] == "1.3.0" and answer["msg_timeout"] == 2000
    assert answer["deflate"] is True and answer["deflate_level"] == 6  # max_deflate_level
    assert answer["auth_required"] is True and answer["tls_v1"] is False
    assert negotiated.deflate and not negotiated.tls and negotiated.upgrades


def test_identify_refuses_what_nsqd_refuses():
    wire = ready()
    params, nl = command(wire, b"IDENTIFY\n" + sized(b'{"heartbeat_interval": 10}'))
    text = refused(lambda: wire.parse_identify(nl + 1), "E_BAD_BODY")
    assert text == "IDENTIFY heartbeat interval (10) is invalid"
    both = {"feature_negotiation": True, "snappy": True, "deflate": True}
    text = refused(lambda: ready().negotiate(both, False, False), "E_IDENTIFY_FAILED")
    assert text == "cannot enable both deflate and snappy compression"
    too_big = ready(NSQDOptions(max_body_size=8))
    params, nl = command(too_big, b"IDENTIFY\n" + struct.pack(">i", 9))
    assert refused(lambda: too_big.parse_identify(nl + 1), "E_BAD_BODY") == (
        "IDENTIFY body too big 9 > 8"
    )


def test_pub_names_a_valid_topic_and_its_body_size_is_checked_first():
    wire = ready(NSQDOptions(max_msg_size=4))
    params, nl = command(wire, b"PUB bad!topic\n")
    text = refused(lambda: wire.parse_pub(params, nl + 1), "E_BAD_TOPIC")
    assert text == 'PUB topic name "bad!topic" is not valid'
    wire = ready(NSQDOptions(max_msg_size=4))
    params, nl = command(wire, b"PUB t\n" + struct.pack(">i", 5))  # no body needed to refuse
    assert refused(lambda: wire.parse_pub(params, nl + 1), "E_BAD_MESSAGE") == (
        "PUB message too big 5 > 4"
    )
    wire = ready()
    params, nl = command(wire, b"PUB t\n" + sized(b"hello")[:6])
    assert wire.parse_pub(params, nl + 1) is None
    wire.receive_data(b"llo")
    topic, after = wire.parse_pub(params, nl + 1) or ("", 0)
    assert topic == "t" and wire.body(nl + 5, after) == b"hello"


def test_mpub_bodies_are_read_as_they_arrive():
    wire = ready()
    messages = sized(b"a") + sized(b"bc")
    body = struct.pack(">i", 2) + messages
    params, nl = command(wire, b"MPUB t\n" + sized(body)[:12])
    assert wire.parse_publish_topic("MPUB", params, 2) == "t"
    assert wire.read_mpub(nl + 1) is None
    wire.receive_data(sized(body)[12:])
    after, bodies = wire.read_mpub(nl + 1) or (0, [])
    assert bodies == [b"a", b"bc"] and after == len(wire.buf)
    empty = ready()
    params, nl = command(empty, b"MPUB t\n" + sized(struct.pack(">ii", 1, 0)))
    assert refused(lambda: empty.read_mpub(nl + 1), "E_BAD_MESSAGE") == (
        "MPUB invalid message(0) body size 0"
    )


def test_rdy_req_and_cls_follow_the_clients_state():
    wire = ready(NSQDOptions(max_rdy_count=10, max_req_timeout=1.0))
    assert refused(lambda: wire.parse_rdy([b"RDY", b"1"]), "E_INVALID") == (
        "cannot RDY in current state"
    )
    assert wire.parse_sub([b"SUB", b"t", b"c"]) == ("t", "c")
    wire.subscribed()
    assert wire.state == STATE_SUBSCRIBED
    assert wire.parse_rdy([b"RDY", b"7"]) == 7
    assert refused(lambda: wire.parse_rdy([b"RDY", b"11"]), "E_INVALID") == (
        "RDY count 11 out of range 0-10"
    )
    msg_id = b"0123456789abcdef"
    assert wire.parse_req([b"REQ", msg_id, b"5000"]) == (msg_id, 1.0)  # clamped
    assert refused(lambda: wire.parse_msg_id([b"FIN", b"short"], "FIN"), "E_INVALID") == (
        "invalid message ID"
    )
    wire.start_closing()
    assert wire.state == STATE_CLOSING
    assert wire.parse_rdy([b"RDY", b"1"]) is None  # ignored while closing
    wire.check_subscribed("FIN")  # still allowed
    assert CLOSE_WAIT_FRAME.endswith(b"CLOSE_WAIT")
    assert not issubclass(FatalClientError, ClientError) and ClientError.fatal is False


def test_deflate_compresses_what_leaves_and_decompresses_what_arrives():
    wire = ready()
    wire.start_compression(snappy_on=False, deflate=True, level=6)
    wire.out.append(b"hello")
    [sent] = wire.data_to_send()
    assert zlib.decompressobj(-15).decompress(sent) == b"hello" and wire.out == []
    client = zlib.compressobj(6, zlib.DEFLATED, -15)
    wire.receive_data(client.compress(b"NOP\n") + client.flush(zlib.Z_SYNC_FLUSH))
    assert wire.next_command() == ([b"NOP"], wire.pos + 3)


def test_youzan_reads_raw_ids_holding_a_newline_and_its_partitions():
    wire = ready(cls=YouzanProtocolV2)
    raw_id = b"\x00\x00\x00\x00\x00\x00\x00\x05\n" + b"\x01" * 7
    params, nl = command(wire, b"FIN " + raw_id + b"\n")
    assert params == [b"FIN", raw_id] and nl == 4 + 20
    assert isinstance(wire, YouzanProtocolV2)
    assert wire.parse_internal_id(params, "FIN") == 5
    assert wire.version == YOUZAN_VERSION
    assert refused(lambda: wire.parse_partition(b"x"), "E_BAD_PARTITION") == (
        'topic partition is not valid: strconv.Atoi: parsing "x": invalid syntax'
    )


def test_youzan_pub_ext_splits_header_and_body():
    wire = ready(cls=YouzanProtocolV2)
    assert isinstance(wire, YouzanProtocolV2)
    header = json.dumps({"##trace_id": "42"}).encode()
    body = struct.pack(">H", len(header)) + header + b"payload"
    params, nl = command(wire, b"PUB_EXT t 0\n" + sized(body))
    assert wire.parse_pub_head(params, nl + 1, mpub=False) == ("t", 0, len(body))
    got = wire.sized_body(nl + 1, len(body))
    assert got == body
    (message, trace_id, ext_ver, ext), traced = wire.split_pub_body(got, len(body), False, True)
    assert (message, trace_id, ext_ver, ext, traced) == (b"payload", 42, EXT_VER_JSON, header, True)
    with pytest.raises(BodyError):
        wire.parse_ext(b"[1]")
    assert traced_reply(1, 2, 3, 4) == b"OK" + struct.pack(">QQQI", 1, 2, 3, 4)
