"""How long a connection's reader lets nsqd's answers pile up before it reads again.

nsqd writes every answer to a request (each ``OK`` of a PUB) to the socket on its own.  A
caller that pipelines thousands of publishes (``Producer.pub_async``) would have the reader
wake for every few answers, and a wake costs the reader far more than the answers it carries
(a system call, the interpreter lock taken from the publishing thread, a lock round).  So after
a small read, while many requests are still unanswered, the reader waits a little before its
next read: the answers behind it arrive meanwhile and are handled in one go.

The wait delays an answer by at most :data:`ANSWER_WAIT` seconds, and only while at least
:data:`ANSWER_BACKLOG` requests are unanswered, when the last of them waits longer than that
for nsqd to get through the ones before it anyway.  A consumer's connection, whose reads carry
messages and whose requests are few, never waits; nor does a blocking request on a quiet
connection.
"""

from __future__ import annotations

__all__ = ["ANSWER_BACKLOG", "ANSWER_WAIT", "SMALL_READ", "answer_wait"]

#: bytes: a read smaller than this carried only a few answers (an OK frame is 10 bytes)
SMALL_READ = 4096
#: requests unanswered from which the reader waits after a small read
ANSWER_BACKLOG = 256
#: seconds the reader waits then
ANSWER_WAIT = 0.0005


def answer_wait(read_size: int, unanswered: int) -> float:
    """Seconds to wait before the next read, after a read of ``read_size`` bytes that left
    ``unanswered`` requests waiting for their answers (0.0: read again at once)."""
    if read_size < SMALL_READ and unanswered >= ANSWER_BACKLOG:
        return ANSWER_WAIT
    return 0.0
