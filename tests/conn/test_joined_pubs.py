"""nsqclient.conn._joined_pubs: consecutive PUBs of one topic written as one MPUB (what is to
be written comes in pieces: compared here joined)."""

from __future__ import annotations

from nsqclient import protocol
from nsqclient.conn._joined_pubs import join_pubs


def test_consecutive_pubs_of_one_topic_become_the_mpub_of_their_bodies():
    bodies = [b"a" * 200, b"b", b"c" * 30]
    pieces, counts = join_pubs([protocol.pub("t", body) for body in bodies], 1 << 20)
    assert b"".join(pieces) == protocol.mpub("t", bodies)
    assert counts == [3]


def test_every_other_command_keeps_its_place_between_the_runs():
    commands = [
        protocol.pub("t", b"1"),
        protocol.pub("t", b"2"),
        protocol.pub("topic_u", b"3"),  # another topic: a run of one
        protocol.dpub("t", 1000, b"4"),
        protocol.mpub("t", [b"5", b"6"]),
        protocol.pub("t", b"7"),
        protocol.pub("t", b"8"),
        protocol.pub("t", b"9"),
    ]
    pieces, counts = join_pubs(commands, 1 << 20)
    assert b"".join(pieces) == b"".join(
        [protocol.mpub("t", [b"1", b"2"]), *commands[2:5], protocol.mpub("t", [b"7", b"8", b"9"])]
    )
    assert counts == [2, 1, 1, 1, 3]


def test_topics_sharing_a_prefix_are_not_mixed():
    commands = [protocol.pub("t", b"1"), protocol.pub("tt", b"2"), protocol.pub("t", b"3")]
    assert join_pubs(commands, 1 << 20) == (commands, None)


def test_nothing_to_join_returns_the_list_itself():
    commands = [protocol.pub("t", b"1"), protocol.nop(), protocol.pub("t", b"2")]
    joined, counts = join_pubs(commands, 1 << 20)
    assert joined is commands and counts is None
    single = [protocol.pub("t", b"1")]
    assert join_pubs(single, 1 << 20) == (single, None)


def test_a_pub_with_more_than_a_topic_on_its_line_is_left_alone():
    # youzan's partitioned PUB: "PUB <topic> <partition>"
    commands = [b"PUB t 1\n" + protocol.pub("t", b"x")[6:]] * 3
    assert join_pubs(commands, 1 << 20) == (commands, None)


def test_a_run_too_large_for_one_mpub_is_cut_into_bodies_within_the_limit():
    bodies = [b"%03d" % i + b"x" * 97 for i in range(25)]  # 104 bytes each in an MPUB
    limit = 4 + 104 * 10  # ten messages per MPUB at most
    pieces, counts = join_pubs([protocol.pub("t", body) for body in bodies], limit)
    assert counts == [10, 10, 5]
    expected = [bodies[:10], bodies[10:20], bodies[20:]]
    assert b"".join(pieces) == b"".join(protocol.mpub("t", group) for group in expected)
    assert len(protocol.mpub("t", bodies[:10])) - len(b"MPUB t\n") - 4 == limit


def test_a_pub_alone_above_the_limit_stays_a_pub():
    big, small = protocol.pub("t", b"x" * 500), protocol.pub("t", b"y")
    pieces, counts = join_pubs([big, small, small], 100)
    assert pieces[0] is big and b"".join(pieces[1:]) == protocol.mpub("t", [b"y", b"y"])
    assert counts == [1, 2]
