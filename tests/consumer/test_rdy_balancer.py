"""The Consumer's RDY balancing on fake connections (no sockets): what RDY is sent, in which
order, and what it notes of each connection (its ConnFlow: the connection's counts are the
Consumer's, not the connection's)."""

from __future__ import annotations

import threading
import time
from typing import Any

from nsqclient.backoff import BackoffState
from nsqclient.config import Config
from nsqclient.consumer._rdy_balancer import ConnFlow, RdyBalancer, conn_views, send_rdy
from nsqclient.errors import ConnectionClosedError


class FakeConn:
    """What the balancer uses of a Connection; every RDY sent goes to ``log``."""

    def __init__(self, key: str, log: list[tuple[str, bytes]], max_rdy_count: int = 2500):
        self.key = self.address = key
        self.partition = None
        self.log = log
        self.max_rdy_count = max_rdy_count
        self.last_message_at = 0.0
        self.closed = False

    def queue_command(self, data: bytes) -> None:
        self.send(data)

    def queue_fin(self, message_id: bytes) -> None:
        self.send(b"FIN " + message_id + b"\n")

    def write_queued(self) -> None:  # what it is given is written at once: nothing waits
        pass

    def send(self, data: bytes) -> None:
        if self.closed:
            raise ConnectionClosedError("closed")
        self.log.append((self.key, data))


def table(*keys: str, log: list[tuple[str, bytes]]) -> dict[str, ConnFlow]:
    now = time.monotonic()
    return {k: ConnFlow(FakeConn(k, log), now) for k in keys}  # type: ignore[arg-type]


def balancer(conns: dict[str, ConnFlow], **options: Any) -> RdyBalancer:
    backoff = BackoffState(1.0, 10.0)
    return RdyBalancer(Config(**options), conns, threading.RLock(), backoff, "t/c")


def test_send_rdy_notes_when_rdy_went_up_and_down() -> None:
    log: list[tuple[str, bytes]] = []
    info = table("a", log=log)["a"]
    send_rdy(info, 5)
    assert log == [("a", b"RDY 5\n")]
    assert info.rdy == 5 and info.remaining == 5 and info.rdy_since is not None
    waited = info.waiting_since
    send_rdy(info, 0)
    assert info.rdy_since is None and info.waiting_since >= waited
    info.conn.closed = True  # type: ignore[attr-defined]
    send_rdy(info, 1)  # a closed connection: noted, nothing raised
    assert info.rdy == 1


def test_views_hide_the_last_message_time_until_one_came() -> None:
    conns = table("a", log=[])
    conns["a"].conn.last_message_at = 42.0
    assert conn_views(conns)[0].last_message_at is None
    conns["a"].first_message = False
    assert conn_views(conns)[0].last_message_at == 42.0


def test_max_in_flight_is_spread_and_lowered_first() -> None:
    log: list[tuple[str, bytes]] = []
    conns = table("a", "b", log=log)
    rdy = balancer(conns, max_in_flight=10)
    for info in conns.values():
        info.first_message = False
    rdy.rebalance()
    assert sorted(log) == [("a", b"RDY 5\n"), ("b", b"RDY 5\n")]
    log.clear()
    conns["c"] = ConnFlow(FakeConn("c", log), time.monotonic())  # type: ignore[arg-type]
    conns["c"].first_message = False
    rdy.max_in_flight = 9
    rdy.rebalance()
    # 9 over three: every one lower before the new one rises, so the sum stays within 9
    assert [k for k, _ in log][-1] == "c" and sum(i.rdy for i in conns.values()) == 9


def test_stopping_sends_rdy_0_everywhere() -> None:
    log: list[tuple[str, bytes]] = []
    conns = table("a", "b", log=log)
    rdy = balancer(conns, max_in_flight=4)
    rdy.rebalance()
    rdy.stop()
    log.clear()
    rdy.rebalance()
    assert sorted(log) == [("a", b"RDY 0\n"), ("b", b"RDY 0\n")]


def test_a_backoff_pause_shortens_the_wait_to_its_end() -> None:
    conns = table("a", log=[])
    rdy = balancer(conns, max_in_flight=4, rdy_redistribute_interval=5.0)
    assert rdy.rebalance() == 5.0
    rdy._backoff.level = 1
    rdy._backoff.until = time.monotonic() + 0.5
    assert rdy.rebalance() <= 0.5
    assert conns["a"].rdy == 0


def test_the_thread_is_named_and_ends_on_stop() -> None:
    rdy = balancer(table(log=[]), rdy_redistribute_interval=60.0)
    rdy.start()
    assert rdy._thread is not None and rdy._thread.name == "nsq-rdy-t/c"
    rdy.stop()
    rdy.join(time.monotonic() + 5.0)
    assert not rdy._thread.is_alive()
