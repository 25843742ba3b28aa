"""``nsqclient pub``'s summary after a failed publish says how many messages were not sent, and
says that the rest of the input was not read only when the input had not ended: a pipe whose
writer is gone is read to its end (it holds all there is), one whose writer is still there is
not waited for.  Against a dead nsqd (a port bound, then released: connection refused) and
against the test broker refusing a message.

Each pipe is filled and, for an ended input, closed before the tool starts, so what the tool
finds there does not depend on timing.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

import pytest

from nsqclient.testing.helpers import message_count

NOT_READ = "the rest of the input was not read"


@contextlib.contextmanager
def pipe_holding(data: bytes, ended: bool) -> Iterator[int]:
    """The read end of a pipe already holding ``data``.  ``ended``: its write end is closed
    (the input ends after ``data``); otherwise it stays open, writing nothing more, until the
    block is left."""
    assert len(data) < 4096  # fits in any pipe's buffer: the write does not block
    r, w = os.pipe()
    try:
        assert os.write(w, data) == len(data)
        if ended:
            os.close(w)
            w = -1
        yield r
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


#: (input, extra flags, the summary's "not sent" when the input ended, when it had not)
DEAD_CASES = [
    pytest.param(
        b"x\n",
        [],
        "; not sent 1 (the failed batch of 1 and 0 after it)\n",
        "; not sent at least 1 (the failed batch of 1 and at least 0 after it); " + NOT_READ,
        id="echo-x",
    ),
    pytest.param(
        b"a\nb\n\nc",  # the last record has no delimiter; the empty one is skipped
        ["--batch-size", "1"],
        "; not sent 3 (the failed batch of 1 and 2 after it)\n",
        # "c" may go on in what the writer has not written yet: still at least one message
        "; not sent at least 3 (the failed batch of 1 and at least 2 after it); " + NOT_READ,
        id="lines-after-the-failed-batch",
    ),
]


@pytest.mark.parametrize("ended", [True, False], ids=["ended", "open"])
@pytest.mark.parametrize("data, flags, ended_text, open_text", DEAD_CASES)
def test_a_dead_nsqd_counts_every_message_not_sent_and_says_the_rest_was_not_read_if_not_ended(
    cli, free_port, data, flags, ended_text, open_text, ended
):
    address = f"127.0.0.1:{free_port()}"
    with pipe_holding(data, ended=ended) as stdin:
        run = cli.start("pub", "--topic", "t", "--nsqd-tcp-address", address, *flags, stdin=stdin)
        # With the pipe open it exits without waiting for the rest (the writer end is still
        # open meanwhile).
        assert run.wait() == 1, run.stderr
    err = run.stderr
    assert "refused" in err.lower(), err
    assert "published 0 messages" in err
    if ended:
        assert "error: publishing to" in err, err
        assert err.endswith(ended_text), err
        assert NOT_READ not in err and "at least" not in err
    else:
        assert err.endswith(open_text + "\n"), err


def test_a_dead_nsqd_and_a_pipe_that_never_ends_exits_and_says_the_rest_was_not_read(
    cli, free_port
):
    address = f"127.0.0.1:{free_port()}"
    r, w = os.pipe()
    try:
        run = cli.start("pub", "--topic", "t", "--nsqd-tcp-address", address, stdin=r)
    finally:
        os.close(r)  # the tool's copy is the only reader: gone with it

    def write_forever() -> None:  # like `yes`: until the reader is gone
        try:
            while True:
                os.write(w, b"y\n" * 4096)
        except BrokenPipeError:
            pass

    writer = threading.Thread(target=write_forever, name="test-yes", daemon=True)
    writer.start()
    try:
        code = run.wait()
    finally:
        if run.proc.poll() is None:  # it did not exit: gone, it leaves the writer no reader
            run.proc.kill()
            run.proc.wait(10)
        writer.join(10)
        if not writer.is_alive():
            os.close(w)
    assert not writer.is_alive()
    assert code == 1, run.stderr
    err = run.stderr
    assert "refused" in err.lower(), err
    assert "published 0 messages" in err
    assert "; not sent at least " in err
    assert err.endswith(NOT_READ + "\n"), err


@pytest.mark.parametrize("ended", [True, False], ids=["ended", "open"])
def test_a_refused_message_in_a_pipe_says_the_rest_was_not_read_only_when_it_was_not(
    nsq_cluster_factory, cli, ended
):
    node = nsq_cluster_factory(max_msg_size=100).nsqd
    topic = f"pub_refused_{'ended' if ended else 'open'}"
    data = b"a\n" + b"x" * 101 + b"\nz\n"  # the second is over --max-msg-size: refused
    with pipe_holding(data, ended=ended) as stdin:
        run = cli.start(
            "pub", "--topic", topic, "--nsqd-tcp-address", node.tcp_address,
            "--batch-size", "1", stdin=stdin,
        )  # fmt: skip
        assert run.wait() == 1, run.stderr
    err = run.stderr
    assert "E_BAD_MESSAGE" in err, err
    assert "published 1 messages" in err and "failed 1," in err
    if ended:
        assert err.endswith("; not sent 2 (the failed batch of 1 and 1 after it)\n"), err
        assert NOT_READ not in err
    else:
        assert err.endswith(
            "; not sent at least 2 (the failed batch of 1 and at least 1 after it); "
            + NOT_READ
            + "\n"
        ), err
    assert message_count(node, topic) == 1
