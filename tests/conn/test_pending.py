"""nsqclient.conn._pending: a connection's FIFO of requests awaiting answers, without sockets."""

from __future__ import annotations

from nsqclient.conn._futures import RequestFuture, Waiter
from nsqclient.conn._pending import Pending, expired_error


def filled(written: int, unsent: int) -> tuple[Pending, list[RequestFuture]]:
    pending = Pending()
    futures = [RequestFuture() for _ in range(written + unsent)]
    pending.items.extend(futures)
    pending.unsent = [b"C%d" % i for i in range(written, written + unsent)]
    return pending, futures


def test_answers_go_to_the_oldest_and_the_front_is_cut_keeping_places():
    pending, futures = filled(3000, 0)
    assert pending.pop() is futures[0]
    assert pending.take(2000) == futures[1:2001]
    assert pending.count() == 999
    assert pending.head == 0 and pending.base == 2001  # cut: places kept
    assert pending.mark() == 3000
    assert pending.waiting() == futures[2001:]


def test_expire_before_takes_only_what_a_mark_covers_once():
    pending, futures = filled(5, 0)
    mark = pending.mark()
    later = RequestFuture()
    pending.items.append(later)
    expired = pending.expire_before(mark)
    assert [f for f, _ in expired] == futures
    assert all(written for _, written in expired)
    assert pending.expire_before(mark) == []  # looked at already
    assert pending.items[-1] is later


def test_unsent_requests_expired_go_with_their_commands_and_later_ones_keep_their_places():
    pending, futures = filled(2, 3)  # 2 written, 3 left for the writer
    mark = pending.mark()
    newer = [RequestFuture() for _ in range(2)]
    pending.items.extend(newer)
    pending.unsent += [b"N0", b"N1"]
    newer_mark = pending.mark()
    expired = pending.expire_before(mark)
    assert [(f, w) for f, w in expired] == [(f, i < 2) for i, f in enumerate(futures)]
    assert pending.unsent == [b"N0", b"N1"] and pending.items[-2:] == newer
    assert pending.items == futures[:2] + newer
    # the newer requests' places did not move: a later mark still covers exactly them
    assert [f for f, _ in pending.expire_before(newer_mark)] == newer


def test_a_blocking_callers_waiter_keeps_its_own_time():
    pending = Pending()
    waiter, future = Waiter(), RequestFuture()
    pending.items.extend([waiter, future])
    assert pending.expire_before(pending.mark()) == [(future, True)]


def test_expire_one_takes_an_unsent_request_out_with_its_command():
    pending, futures = filled(1, 3)
    assert pending.expire(futures[0]) is True  # written: stays for nsqd's late answer
    assert pending.expire(futures[2]) is False  # unsent: out, never written
    assert pending.expire(RequestFuture()) is None
    assert pending.items == [futures[0], futures[1], futures[3]]
    assert pending.unsent == [b"C1", b"C3"]
    assert pending.mark() == 4  # the later requests keep their places


def test_the_writer_takes_unsent_commands_oldest_first_up_to_a_size():
    pending, futures = filled(0, 4)  # commands of 2 bytes each
    assert pending.take_unsent(3) == [b"C0", b"C1"]  # at least 3 bytes: two of them
    assert pending.unsent == [b"C2", b"C3"]
    assert pending.take_unsent(100) == [b"C2", b"C3"]  # fewer bytes than asked: all
    assert pending.unsent == [] and pending.count() == 4  # written, not answered
    newest = RequestFuture()
    pending.items.append(newest)
    pending.unsent.append(b"C4")
    assert pending.clear() == [*futures, newest]  # the connection closed: nothing to write
    assert pending.unsent == [] and pending.count() == 0


def test_expired_errors_say_whether_anything_was_sent():
    assert expired_error("a:1", True).maybe_processed
    error = expired_error("a:1", False)
    assert not error.maybe_processed and "nothing was sent" in str(error)


def test_requests_written_as_one_command_share_its_one_answer():
    pending, futures = filled(7, 0)
    pending.join(1, [3, 1, 2])  # futures[1:4] went out as one command, [4] alone, [5:7] as one
    assert pending.pop() is futures[0]  # nothing shared yet at the front
    assert pending.take(1) == futures[1:4]
    assert pending.take(2) == futures[4:7]
    assert pending.shared == {}  # each answer took its entry
    assert pending.count() == 0


def test_a_shared_answer_survives_the_front_being_cut_and_expiry():
    pending, futures = filled(3000, 0)
    assert len(pending.take(2000)) == 2000  # cut: the list moved under the entry to come
    assert pending.base == 2000 and pending.head == 0
    pending.join(0, [5])
    expired = pending.expire_before(pending.base + 2)  # the first two of the five
    assert [f for f, _ in expired] == futures[2000:2002]
    assert pending.take(2) == futures[2000:2006]  # the answer is still all five's
    assert pending.count() == 994


def test_clearing_forgets_what_was_shared():
    pending, futures = filled(4, 0)
    pending.join(0, [4])
    assert pending.clear() == futures
    fresh = [RequestFuture(), RequestFuture()]
    pending.items.extend(fresh)
    assert pending.take(1) == fresh[:1]
