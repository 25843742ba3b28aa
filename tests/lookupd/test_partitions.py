"""Pure parts of youzan support: the key hash, lookup answers as routes, lookupd demotion."""

from __future__ import annotations

import logging

import pytest

from nsqclient.errors import HTTPError
from nsqclient.lookupd._partitions import (
    TopicRoute,
    key_bytes,
    key_partition,
    murmur3_32,
    route_from_lookup,
)
from nsqclient.lookupd._pool import DEMOTE_AFTER, MAX_DEMOTION, LookupdPool, demotion_delay

# Published MurmurHash3 x86_32 vectors (Appleby's SMHasher and its ports).
MURMUR_VECTORS = [
    (b"", 0, 0),
    (b"", 1, 0x514E28B7),
    (b"", 0xFFFFFFFF, 0x81F16F39),
    (b"\x00\x00\x00\x00", 0, 0x2362F9DE),
    (b"a", 0x9747B28C, 0x7FA09EA6),
    (b"aaaa", 0x9747B28C, 0x5A97808A),
    (b"abc", 0, 0xB3DD93FA),
    (b"Hello, world!", 0x9747B28C, 0x24884CBA),
    (b"The quick brown fox jumps over the lazy dog", 0x9747B28C, 0x2FA826CD),
]


@pytest.mark.parametrize(("data", "seed", "expected"), MURMUR_VECTORS)
def test_murmur3_32_matches_the_reference_vectors(data, seed, expected):
    assert murmur3_32(data, seed) == expected


def test_key_partition_is_murmur3_modulo_the_partition_count():
    assert key_partition("order-42", 4) == murmur3_32(b"order-42") % 4
    assert key_partition(b"order-42", 4) == key_partition("order-42", 4)
    assert key_partition(42, 7) == key_partition("42", 7)
    # fixed answers: the mapping is part of the public contract and must never drift
    assert [key_partition(f"k{i}", 4) for i in range(8)] == [2, 2, 0, 1, 1, 0, 1, 2]
    assert [key_partition(f"order-{i}", 10) for i in range(8)] == [0, 3, 7, 3, 9, 7, 1, 0]


def test_key_partition_spreads_keys_over_every_partition():
    counts = [0] * 8
    for i in range(8000):
        counts[key_partition(f"user-{i}", 8)] += 1
    assert min(counts) > 800, counts


@pytest.mark.parametrize("bad", [None, 1.5, True, [b"x"]])
def test_a_key_of_the_wrong_type_is_refused(bad):
    with pytest.raises(TypeError, match="partition key"):
        key_bytes(bad)


def test_key_partition_needs_at_least_one_partition():
    with pytest.raises(ValueError, match="partition_num"):
        key_partition("k", 0)


def test_route_from_a_classic_lookup():
    route = route_from_lookup(
        "t",
        {
            "channels": [],
            "producers": [
                {"broadcast_address": "a", "tcp_port": 4150},
                {"broadcast_address": "b", "tcp_port": 4150},
            ],
        },
    )
    assert route == TopicRoute("t", {}, ("a:4150", "b:4150"))
    assert not route.partitioned


def test_route_from_a_youzan_lookup_with_meta():
    node0 = {"broadcast_address": "h0", "tcp_port": "4150"}
    node1 = {"broadcast_address": "h1", "tcp_port": 4250}
    route = route_from_lookup(
        "t",
        {
            "channels": ["c"],
            "producers": [node0, node1],
            "partitions": {"0": node0, "1": node1, "2": node0},
            "meta": {"partition_num": 4, "replica": 2, "ordered": True, "extend_support": False},
        },
    )
    assert route.partitioned
    assert route.partition_num == 4
    assert route.ordered and not route.extend_support
    assert route.leader(1) == "h1:4250"
    assert route.leader(3) is None  # its leader is not listed now
    assert route.nsqd == ("h0:4150", "h1:4250")


def test_route_without_meta_does_not_guess_the_partition_count():
    node = {"broadcast_address": "h", "tcp_port": 1}
    route = route_from_lookup("t", {"producers": [node], "partitions": {"0": node, "2": node}})
    assert route.partitioned and route.partition_num == 0


def test_route_refuses_a_partition_that_is_not_a_number():
    node = {"broadcast_address": "h", "tcp_port": 1}
    with pytest.raises(ValueError, match="not a number"):
        route_from_lookup("t", {"producers": [node], "partitions": {"x": node}})


def test_demotion_grows_and_is_bounded():
    assert [demotion_delay(n) for n in range(DEMOTE_AFTER)] == [0.0] * DEMOTE_AFTER
    delays = [demotion_delay(n) for n in range(DEMOTE_AFTER, DEMOTE_AFTER + 12)]
    assert delays == sorted(delays) and delays[0] > 0
    assert delays[-1] == MAX_DEMOTION


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_failing_lookupd_is_demoted_but_never_the_last_one():
    clock = Clock()
    pool = LookupdPool(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"], 1.0, clock)
    a, b, c = pool.candidates()
    for _ in range(DEMOTE_AFTER):
        pool.failed(a, OSError("refused"))
    assert pool.candidates() == [b, c]
    for _ in range(DEMOTE_AFTER):
        pool.failed(b, OSError("refused"))
    assert pool.candidates() == [c]
    for _ in range(DEMOTE_AFTER * 3):
        pool.failed(c, OSError("refused"))
    assert pool.candidates() == [c]  # the last one left is never demoted
    clock.now += demotion_delay(DEMOTE_AFTER) + 0.1
    assert pool.candidates() == [a, b, c]  # their demotion ran out
    pool.succeeded(a)
    pool.failed(a, OSError("refused"))
    assert a in pool.candidates()  # an answer starts its count afresh
    pool.failed(b, OSError("refused"))
    assert b not in pool.candidates()  # still failing: demoted again, for longer
    clock.now += demotion_delay(DEMOTE_AFTER) + 0.1
    assert b not in pool.candidates()
    clock.now += demotion_delay(DEMOTE_AFTER + 1)
    assert b in pool.candidates()


def test_a_lookupd_is_not_demoted_while_it_is_the_only_one_left():
    clock = Clock()
    pool = LookupdPool(["127.0.0.1:1", "127.0.0.1:2"], 1.0, clock)
    a, b = pool.candidates()
    for _ in range(DEMOTE_AFTER):
        pool.failed(a, OSError("refused"))
    clock.now += demotion_delay(DEMOTE_AFTER) + 0.1
    for _ in range(DEMOTE_AFTER):
        pool.failed(b, OSError("refused"))
    for _ in range(DEMOTE_AFTER):
        pool.failed(a, OSError("refused"))
    # a fails again while b is demoted: a stays, as the one left to ask
    assert pool.candidates() == [a]
    clock.now += MAX_DEMOTION
    assert pool.candidates() == [a, b]


def test_the_same_lookupd_twice_is_one_member():
    pool = LookupdPool(["127.0.0.1:4161", "http://127.0.0.1:4161"], 1.0)
    assert len(pool) == 1


def test_a_lookupd_refusing_the_consumers_lookup_is_not_demoted(monkeypatch, caplog):
    """lookup_each (the consumers' poll) treats a lookupd's 4xx answer as first() does: it is
    up and said no, so it is not an outage; it is logged at WARNING once while it repeats."""
    pool = LookupdPool(["127.0.0.1:1", "127.0.0.1:2"], 1.0, Clock())
    a, b = pool.candidates()
    refusal = HTTPError(400, "INVALID_ARG_TOPIC", a.base_url + "/lookup")
    monkeypatch.setattr(a, "lookup", lambda *args: (_ for _ in ()).throw(refusal))
    answer = {"channels": [], "producers": [{"broadcast_address": "h", "tcp_port": 4150}]}
    monkeypatch.setattr(b, "lookup", lambda *args: answer)
    with caplog.at_level(logging.DEBUG, logger="nsqclient.lookup"):
        for _ in range(DEMOTE_AFTER + 2):
            assert pool.lookup_each("t") == [(b.base_url, answer)]
    assert pool.candidates() == [a, b]
    refused = [r for r in caplog.records if "refused the lookup" in r.getMessage()]
    assert [r.levelno for r in refused] == [logging.WARNING] + [logging.DEBUG] * (DEMOTE_AFTER + 1)
    assert "INVALID_ARG_TOPIC" in refused[0].getMessage()


def test_a_lookupd_that_does_not_answer_the_consumers_lookup_is_demoted(monkeypatch):
    pool = LookupdPool(["127.0.0.1:1", "127.0.0.1:2"], 1.0, Clock())
    a, b = pool.candidates()
    down = HTTPError(0, "connection refused", a.base_url + "/lookup")
    monkeypatch.setattr(a, "lookup", lambda *args: (_ for _ in ()).throw(down))
    monkeypatch.setattr(b, "lookup", lambda *args: {"channels": [], "producers": []})
    for _ in range(DEMOTE_AFTER):
        pool.lookup_each("t")
    assert pool.candidates() == [b]


def test_missing_partitions_of_a_consumer():
    from nsqclient.lookupd._partitions import missing_partitions, partition_count

    # with the count from meta: every partition is wanted, named by lookup or not
    assert missing_partitions(4, {0, 1}, None, {0}) == {1, 2, 3}
    assert missing_partitions(2, {0, 1}, None, {0, 1}) == set()
    # without a count: the partitions lookup ever named
    assert missing_partitions(None, {0, 2}, None, {2}) == {0}
    assert missing_partitions(None, set(), None, set()) == set()  # classic: nothing to follow
    # partition=: only that one
    assert missing_partitions(4, {0, 1, 2, 3}, 2, {0, 1}) == {2}
    assert missing_partitions(4, set(), 3, {3}) == set()
    assert missing_partitions(2, set(), 5, set()) == set()  # a partition the topic lacks
    assert partition_count({"partition_num": "3"}) == 3
    assert partition_count({"partition_num": None}) == partition_count("x") == 0
