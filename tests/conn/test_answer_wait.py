"""When the reader waits for nsqd's answers to pile up (conn/_answer_wait.py); what the two
reader loops do with it is in test_connection_writes.py."""

from __future__ import annotations

from nsqclient.conn._answer_wait import ANSWER_BACKLOG, ANSWER_WAIT, SMALL_READ, answer_wait


def test_the_reader_waits_only_after_a_small_read_with_many_requests_unanswered():
    assert answer_wait(10, ANSWER_BACKLOG) == ANSWER_WAIT
    assert answer_wait(SMALL_READ - 1, 100_000) == ANSWER_WAIT
    assert answer_wait(SMALL_READ, 100_000) == 0.0  # a read that carried many answers
    assert answer_wait(10, ANSWER_BACKLOG - 1) == 0.0
    assert answer_wait(10, 0) == 0.0  # a blocking request on a quiet connection
