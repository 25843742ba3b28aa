"""Conformance: heartbeats at the negotiated interval, and the close of a silent client.

nsqd sends ``_heartbeat_`` every heartbeat_interval and gives each read a deadline of twice the
interval, reset by any command; a client that answers nothing is closed after about two missed
heartbeats.
"""

from __future__ import annotations

import time

from rawclient import Closed, RawConn, frame_bytes

from nsqclient import protocol
from nsqclient.protocol import FRAME_TYPE_RESPONSE, HEARTBEAT


def test_heartbeats_arrive_and_a_silent_client_is_closed(nsqd):
    with RawConn(nsqd.nsqd) as conn:
        conn.identify(heartbeat_interval=1000)
        start = time.monotonic()
        raw = conn.read_raw_frame(timeout=5)
        first = time.monotonic() - start
        assert raw == frame_bytes(FRAME_TYPE_RESPONSE, HEARTBEAT)
        assert first >= 0.9, f"first heartbeat after {first:.3f}s for a 1 s interval"
        # answer nothing: the 2 s read deadline (from the IDENTIFY) closes the connection
        while True:
            try:
                frame = conn.read_frame(timeout=6)
            except Closed:
                break
            assert frame == (FRAME_TYPE_RESPONSE, HEARTBEAT), frame
        closed = time.monotonic() - start
    assert closed >= 1.9, f"closed after {closed:.3f}s, before two heartbeat intervals"


def test_answering_heartbeats_with_any_command_keeps_the_connection(nsqd):
    with RawConn(nsqd.nsqd) as conn:
        conn.identify(heartbeat_interval=1000)
        conn.sub("t", "c", rdy=1)
        # three intervals, past the 2 s read deadline; NOP or any other command resets it
        for answer in (protocol.nop(), protocol.rdy(1), protocol.nop()):
            frame = conn.read_frame(timeout=5)
            assert frame == (FRAME_TYPE_RESPONSE, HEARTBEAT), frame
            conn.send(answer)
        with RawConn(nsqd.nsqd) as producer:  # a PUB's OK could race the message here
            producer.pub("t", b"still here")
        assert conn.expect_message().body == b"still here"
