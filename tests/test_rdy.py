"""The RDY policy, pure: exact RDY for given connection states and a fake clock."""

from nsqclient.backoff import BackoffMode
from nsqclient.rdy import ConnView, is_starved, needs_refill, rdy_targets


def conn(address, rdy=0, last_message_at=1.0, rdy_since=None, waiting_since=0.0, **kw):
    if rdy and rdy_since is None:
        rdy_since = 0.0
    return ConnView(
        address,
        rdy=rdy,
        last_message_at=last_message_at,
        rdy_since=rdy_since,
        waiting_since=waiting_since,
        **kw,
    )


def test_one_connection_starts_at_one_then_gets_everything():
    fresh = ConnView("a:1", rdy=0, last_message_at=None)
    assert rdy_targets([fresh], 100, now=0.0) == {"a:1": 1}
    busy = ConnView("a:1", rdy=1, last_message_at=0.5, rdy_since=0.0)
    assert rdy_targets([busy], 100, now=1.0) == {"a:1": 100}


def test_five_connections_split_evenly_with_the_remainder_first():
    conns = [conn(f"n{i}:4150") for i in range(5)]
    assert rdy_targets(conns, 100, 2.0) == {f"n{i}:4150": 20 for i in range(5)}
    assert rdy_targets(conns, 12, 2.0) == {
        "n0:4150": 3,
        "n1:4150": 3,
        "n2:4150": 2,
        "n3:4150": 2,
        "n4:4150": 2,
    }


def test_five_fresh_connections_start_at_one_each():
    conns = [ConnView(f"n{i}:4150") for i in range(5)]
    assert rdy_targets(conns, 100, 0.0) == {f"n{i}:4150": 1 for i in range(5)}


def test_never_above_max_rdy_count():
    conns = [conn("a:1", max_rdy_count=50), conn("b:1")]
    assert rdy_targets(conns, 1000, 2.0) == {"a:1": 50, "b:1": 500}


def test_sum_never_exceeds_max_in_flight():
    for n in range(1, 12):
        for mif in range(0, 30):
            conns = [
                conn(f"h{i}:1", rdy=(i % 3), rdy_since=0.0 if i % 3 else None) for i in range(n)
            ]
            for mode in BackoffMode:
                t = rdy_targets(conns, mif, 50.0, mode)
                assert sum(t.values()) <= (1 if mode is BackoffMode.TESTING else mif)
                assert set(t) == {c.address for c in conns}


def test_paused_and_zero_max_in_flight_give_zero_everywhere():
    conns = [conn("a:1", rdy=5), conn("b:1", rdy=5)]
    assert rdy_targets(conns, 10, 1.0, BackoffMode.PAUSED) == {"a:1": 0, "b:1": 0}
    assert rdy_targets(conns, 0, 1.0) == {"a:1": 0, "b:1": 0}


def test_max_in_flight_below_connections_rotates_rdy_by_liveness():
    # 3 connections, max_in_flight 1: the one waiting longest gets RDY 1.
    conns = [
        conn("a:1", waiting_since=5.0),
        conn("b:1", waiting_since=1.0),
        conn("c:1", waiting_since=3.0),
    ]
    assert rdy_targets(conns, 1, 10.0) == {"a:1": 0, "b:1": 1, "c:1": 0}
    # b holds RDY 1 and keeps receiving: it keeps it.
    conns = [
        conn("a:1", waiting_since=5.0),
        conn("b:1", rdy=1, rdy_since=10.0, last_message_at=14.0),
        conn("c:1", waiting_since=3.0),
    ]
    assert rdy_targets(conns, 1, 15.0, low_rdy_idle_timeout=10.0) == {
        "a:1": 0,
        "b:1": 1,
        "c:1": 0,
    }
    # b went idle for low_rdy_idle_timeout: RDY moves to the longest waiter (c).
    assert rdy_targets(conns, 1, 24.0, low_rdy_idle_timeout=10.0) == {
        "a:1": 0,
        "b:1": 0,
        "c:1": 1,
    }
    # b is busy but held RDY for low_rdy_timeout: it is moved anyway, so others get a turn.
    conns[1] = conn("b:1", rdy=1, rdy_since=10.0, last_message_at=39.0)
    assert rdy_targets(conns, 1, 40.0, low_rdy_idle_timeout=10.0, low_rdy_timeout=30.0) == {
        "a:1": 0,
        "b:1": 0,
        "c:1": 1,
    }


def test_rotation_visits_every_connection():
    """Simulate the balancer with mif=1 over 4 idle nsqd: each gets a turn."""
    now = 0.0
    state = {f"n{i}:1": dict(rdy=0, rdy_since=None, waiting_since=float(i)) for i in range(4)}
    holders = []
    for _ in range(8):
        views = [
            ConnView(
                a,
                rdy=s["rdy"],
                last_message_at=None,
                rdy_since=s["rdy_since"],
                waiting_since=s["waiting_since"],
            )
            for a, s in state.items()
        ]
        targets = rdy_targets(views, 1, now, low_rdy_idle_timeout=10.0)
        for a, n in targets.items():
            s = state[a]
            if n and not s["rdy"]:
                s["rdy_since"] = now
            elif not n and s["rdy"]:
                s["rdy_since"], s["waiting_since"] = None, now
            s["rdy"] = n
        holders.append([a for a, n in targets.items() if n])
        now += 10.0
    assert holders == [["n0:1"], ["n1:1"], ["n2:1"], ["n3:1"]] * 2


def test_testing_mode_gives_one_connection_rdy_one():
    conns = [conn(f"n{i}:1", waiting_since=float(i)) for i in range(5)]
    t = rdy_targets(conns, 100, 10.0, BackoffMode.TESTING)
    assert t == {"n0:1": 1, "n1:1": 0, "n2:1": 0, "n3:1": 0, "n4:1": 0}


def test_connections_joining_and_leaving_during_backoff():
    conns = [conn("a:1", waiting_since=1.0), conn("b:1", waiting_since=2.0)]
    assert rdy_targets(conns, 10, 5.0, BackoffMode.PAUSED) == {"a:1": 0, "b:1": 0}
    joined = [*conns, ConnView("c:1", waiting_since=6.0)]
    assert rdy_targets(joined, 10, 7.0, BackoffMode.PAUSED) == {"a:1": 0, "b:1": 0, "c:1": 0}
    # Testing the water: a holds the single RDY; when a leaves, b gets it.
    holding = [
        conn("a:1", rdy=1, rdy_since=8.0, last_message_at=None),
        conn("b:1", waiting_since=2.0),
        ConnView("c:1", waiting_since=6.0),
    ]
    assert rdy_targets(holding, 10, 9.0, BackoffMode.TESTING) == {"a:1": 1, "b:1": 0, "c:1": 0}
    assert rdy_targets(holding[1:], 10, 9.0, BackoffMode.TESTING) == {"b:1": 1, "c:1": 0}
    # Back to normal with three connections: an even split again.
    assert rdy_targets([conn("b:1"), conn("c:1")], 10, 9.0) == {"b:1": 5, "c:1": 5}


def test_lowering_max_in_flight_below_connections_keeps_current_holders_first():
    conns = [
        conn("a:1", rdy=5, rdy_since=0.0, last_message_at=9.0),
        conn("b:1", rdy=5, rdy_since=0.0, last_message_at=9.0),
    ]
    assert rdy_targets(conns, 1, 10.0) == {"a:1": 1, "b:1": 0}


def test_needs_refill_at_zero_or_below_a_quarter():
    assert needs_refill(0, 1)
    assert needs_refill(-1, 1)
    assert not needs_refill(1, 1)
    assert not needs_refill(25, 100)
    assert needs_refill(24, 100)
    assert not needs_refill(0, 0)


def test_is_starved_uses_the_085_rule():
    assert not is_starved([ConnView("a:1", rdy=100, in_flight=84)])
    assert is_starved([ConnView("a:1", rdy=100, in_flight=85)])
    assert not is_starved([ConnView("a:1", rdy=0, in_flight=0)])
    assert is_starved([ConnView("a:1", rdy=10, in_flight=1), ConnView("b:1", rdy=1, in_flight=1)])


def test_is_starved_counts_only_what_handlers_hold():
    # 2,499 in flight of RDY 2,500, but 2,498 of them still wait for a handler: the handler
    # holds one, nsqd will go on sending as the queue drains, a batch is nowhere near starved.
    assert not is_starved([ConnView("a:1", rdy=2500, in_flight=2499, queued=2498)])
    assert not is_starved([ConnView("a:1", rdy=100, in_flight=100, queued=16)])  # 84 held
    assert is_starved([ConnView("a:1", rdy=100, in_flight=100, queued=15)])  # 85 held
    assert not is_starved([ConnView("a:1", rdy=1, in_flight=1, queued=1)])  # nothing held yet
