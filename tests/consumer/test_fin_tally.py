"""The FINs handler workers wrote and the Consumer has not counted yet (consumer/_fin_tally.py):
settling moves each slot's into its connection's in_flight and the finished counter, once."""

from __future__ import annotations

from types import SimpleNamespace

from nsqclient.consumer._fin_tally import FinTally


def test_settle_moves_each_slots_fins_once():
    a, b = SimpleNamespace(in_flight=10), SimpleNamespace(in_flight=4)
    tally = FinTally(2)
    stats = {"finished": 1}
    tally.flows[:] = [a, b]
    tally.written[0] += 3
    tally.written[1] += 4
    assert tally.written != tally.counted
    assert tally.settle(stats) == 7
    assert (a.in_flight, b.in_flight, stats["finished"]) == (7, 0, 8)
    assert tally.written == tally.counted
    assert tally.settle(stats) == 0  # nothing twice
    assert (a.in_flight, b.in_flight, stats["finished"]) == (7, 0, 8)


def test_a_slot_moves_to_another_connection_once_settled():
    a, b = SimpleNamespace(in_flight=2), SimpleNamespace(in_flight=2)
    tally = FinTally(1)
    stats = {"finished": 0}
    tally.flows[0] = a
    tally.written[0] += 2
    tally.settle(stats)
    tally.flows[0] = b
    tally.written[0] += 1
    tally.settle(stats)
    assert (a.in_flight, b.in_flight, stats["finished"]) == (0, 1, 3)


def test_in_flight_never_goes_below_zero():
    """A connection whose counts were reset meanwhile (its messages requeued by stop()) keeps
    0, as a FIN counted one at a time does; the FINs still count as finished."""
    flow = SimpleNamespace(in_flight=1)
    tally = FinTally(1)
    stats = {"finished": 0}
    tally.flows[0] = flow
    tally.written[0] += 3
    assert tally.settle(stats) == 3
    assert (flow.in_flight, stats["finished"]) == (0, 3)
