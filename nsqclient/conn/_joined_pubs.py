"""PUBs for one topic, queued one after another, written as one MPUB.

nsqd answers every command with a frame of its own and flushes its socket for each: a
pipelined PUB costs it several microseconds, an MPUB message a fraction of one.  A writer
that finds consecutive PUBs of one topic queued (pipelined ``pub_async()``, many threads'
``pub()``) may send them as one MPUB: nsqd stores the same messages in the same order, and
its one answer is every one of theirs (a Connection does when its ``join_limit`` is set).

A PUB command is ``PUB <topic>\\n`` + a 4-byte size + the body; an MPUB body is a 4-byte
count and, per message, the same 4-byte size + body: so each PUB's part of the MPUB is the
PUB without its first line.
"""

from __future__ import annotations

from itertools import islice, repeat, takewhile
from operator import itemgetter

__all__ = ["join_pubs"]

_PUB = b"PUB "


def join_pubs(commands: list[bytes], limit: int) -> tuple[list[bytes], list[int] | None]:
    """``commands`` as they should be written: each run of two or more consecutive
    ``PUB <topic>`` commands of one topic becomes one MPUB whose body is at most ``limit``
    bytes (a run too large for one is cut into several), every other command is left as it
    is, in its place.  Returns the bytes to write, in order (an MPUB as several pieces: its
    first line and sizes, then each message, so that its bytes are copied once, by the
    write's join), and, when anything was joined, how many of ``commands`` each command
    written stands for (None: nothing joined, the list is ``commands``)."""
    n = len(commands)
    if n < 2:
        return commands, None
    out: list[bytes] = []
    counts: list[int] = []
    joined = False
    i = 0
    while i < n:
        head, end = _run(commands, i)
        if end - i < 2:
            out.append(commands[i])
            counts.append(1)
            i += 1
            continue
        for start, stop, size in _cut(commands, i, end, head, limit):
            if stop - start == 1:
                out.append(commands[start])
            else:
                group = commands[start:stop]
                out.append(
                    b"M" + group[0][:head] + size.to_bytes(4, "big") + len(group).to_bytes(4, "big")
                )
                out += map(itemgetter(slice(head, None)), group)
                joined = True
            counts.append(stop - start)
        i = end
    return (out, counts) if joined else (commands, None)


def _run(commands: list[bytes], i: int) -> tuple[int, int]:
    """The length of the first line of ``commands[i]`` and the end of the run of PUBs of one
    topic that starts there (``i + 1`` when ``commands[i]`` is not a PUB to join: another
    command, or a PUB with more than a topic on its line, as youzan's partitioned one)."""
    command = commands[i]
    if not command.startswith(_PUB) or i + 1 == len(commands):
        return 0, i + 1
    head = command.find(b"\n", 5) + 1
    line = command[:head]
    if not (head and commands[i + 1].startswith(line)) or line.count(b" ") != 1:
        return head, i + 1
    same = map(bytes.startswith, islice(commands, i + 2, None), repeat(line))
    return head, i + 2 + len(list(takewhile(bool, same)))


def _cut(
    commands: list[bytes], start: int, end: int, head: int, limit: int
) -> list[tuple[int, int, int]]:
    """``commands[start:end]`` (PUBs whose first line is ``head`` bytes) cut into pieces
    whose MPUB bodies are at most ``limit`` bytes: ``(start, stop, body size)``, in order."""
    size = 4 + sum(map(len, islice(commands, start, end))) - head * (end - start)
    if size <= limit:
        return [(start, end, size)]
    pieces = []
    first, size = start, 4
    for i in range(start, end):
        part = len(commands[i]) - head
        if i > first and size + part > limit:
            pieces.append((first, i, size))
            first, size = i, 4
        size += part
    pieces.append((first, end, size))
    return pieces
