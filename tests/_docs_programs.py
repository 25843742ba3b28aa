"""Running a program printed in the guides (``docs/*.rst``) against the test broker: its code
block taken from the page, run on a thread of this process, its Consumer stopped at the end.

Used by docs/test_docs_examples.py and docs/test_docs_pull.py.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Iterator
from typing import Any

from nsqclient.testing import helpers
from nsqclient.testing.waiting import wait_for

DOCS = os.path.join(os.path.dirname(__file__), os.pardir, "docs")


def code_block(page: str, section: str) -> str:
    """The first ``.. code-block:: python`` under the heading ``section`` of ``page``."""
    with open(os.path.join(DOCS, page), encoding="utf-8") as f:
        text = f.read()
    start = text.index(section + "\n")
    match = re.search(r"\.\. code-block:: python\n\n((?:    .*\n|\n)+)", text[start:])
    assert match, f"no python code block under {section!r} in {page}"
    lines = match.group(1).splitlines()
    return "\n".join(line[4:] for line in lines) + "\n"


def channel_stats(cluster: Any, topic: str, channel: str) -> dict | None:
    """The cluster's first nsqd's /stats entry for ``topic``/``channel``, or None."""
    return helpers.channel_stats(cluster.nsqd, topic, channel)


def wait_drained(cluster: Any, topic: str, channel: str, timeout: float) -> None:
    """Wait until nsqd's ``channel`` of ``topic`` exists and holds nothing, queued or in
    flight."""
    wait_for(
        lambda: (
            (c := channel_stats(cluster, topic, channel)) is not None
            and c["in_flight_count"] == 0
            and c["depth"] == 0
        ),
        timeout,
        0.05,
        lambda: f"left on nsqd: {channel_stats(cluster, topic, channel)}",
    )


@contextlib.contextmanager
def program_running(
    source: str, page: str, namespace: dict[str, Any], timeout: float = 10.0, join: float = 15.0
) -> Iterator[dict[str, Any]]:
    """Run ``source`` (from ``page``) in ``namespace`` on a thread (named after its
    ``__name__``) for the block; then stop the ``consumer`` it made (waiting ``timeout``
    seconds for it to exist and to stop) and wait ``join`` seconds for the program to return.
    After a block that did not raise: the program returned, and raised nothing."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            exec(compile(source, page, "exec"), namespace)
        except BaseException as exc:
            errors.append(exc)

    program = threading.Thread(target=run, name=namespace["__name__"].replace("_", "-"))
    program.start()
    try:
        yield namespace
    finally:
        wait_for(lambda: "consumer" in namespace, timeout)
        namespace["consumer"].stop(timeout=timeout)
        program.join(join)
    assert not program.is_alive() and errors == []
