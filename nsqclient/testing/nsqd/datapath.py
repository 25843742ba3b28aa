"""What an embedded nsqd keeps in its ``--data-path`` across a restart of the process.

- ``nsqd.dat``: the metadata, in real nsqd's layout (``{"topics": [{"name", "paused",
  "channels": [{"name", "paused"}]}], "version"}``), rewritten whenever a topic or channel
  appears, goes or is paused; ephemeral ones are left out, as nsqd does.
- ``nsqclient-embedded.queues``: the messages still queued when the node stopped (in-flight and
  deferred ones are back in their channel's queue by then, as nsqd's shutdown does), one record
  per message with its id, timestamp and attempts.  Read and removed on start.

Unlike nsqd's disk queues, messages reach the disk only on a clean stop (SIGTERM/SIGINT or
``NSQD.stop()``); a killed process loses the queued ones.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..gostyle.text import VERSION
from .queues import Message, Topic

__all__ = [
    "METADATA_FILE",
    "QUEUES_FILE",
    "save_metadata",
    "load_metadata",
    "save_queues",
    "load_queues",
]

log = logging.getLogger("nsqclient.testing.datapath")

METADATA_FILE = "nsqd.dat"
QUEUES_FILE = "nsqclient-embedded.queues"

_MAGIC = b"NSQCLIENT-EMBEDDED-QUEUES 1\n"
_QUEUE_HEAD = struct.Struct(">HHI")  # topic name length, channel name length, message count
_MSG_HEAD = struct.Struct(">16sqHI")  # id, timestamp (ns), attempts, body length


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_metadata(data_path: str | os.PathLike[str], topics: Iterable[Topic]) -> None:
    """Write ``nsqd.dat`` for ``topics`` (ephemeral topics and channels left out)."""
    doc: dict[str, Any] = {"topics": [], "version": VERSION}
    for topic in topics:
        if topic.ephemeral or topic.exiting:
            continue
        channels = [
            {"name": c.name, "paused": c.paused}
            for c in topic.channels.values()
            if not c.ephemeral and not c.exiting
        ]
        doc["topics"].append({"channels": channels, "name": topic.name, "paused": topic.paused})
    _write_atomically(Path(data_path) / METADATA_FILE, json.dumps(doc).encode("utf-8"))


def load_metadata(data_path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The topics recorded in ``nsqd.dat`` (empty when there is none)."""
    path = Path(data_path) / METADATA_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    doc = json.loads(raw)
    topics = doc.get("topics") if isinstance(doc, dict) else None
    return [t for t in topics or [] if isinstance(t, dict) and isinstance(t.get("name"), str)]


def save_queues(data_path: str | os.PathLike[str], topics: Iterable[Topic]) -> int:
    """Write every queued message of ``topics`` (topic queues and channel queues); return how
    many were written.  Ephemeral topics and channels are left out."""
    parts = [_MAGIC]
    total = 0

    def queue(topic: str, channel: str, msgs: Iterable[Message]) -> None:
        nonlocal total
        batch = list(msgs)
        if not batch:
            return
        t, c = topic.encode(), channel.encode()
        parts.append(_QUEUE_HEAD.pack(len(t), len(c), len(batch)) + t + c)
        for m in batch:
            parts.append(_MSG_HEAD.pack(m.id, m.timestamp, m.attempts & 0xFFFF, len(m.body)))
            parts.append(m.body)
        total += len(batch)

    for topic in topics:
        if topic.ephemeral:
            continue
        queue(topic.name, "", topic.queue)
        for channel in topic.channels.values():
            if not channel.ephemeral:
                queue(topic.name, channel.name, channel.queue)
    _write_atomically(Path(data_path) / QUEUES_FILE, b"".join(parts))
    return total


def load_queues(data_path: str | os.PathLike[str]) -> Iterator[tuple[str, str, list[Message]]]:
    """``(topic, channel, messages)`` for each queue saved by :func:`save_queues` (channel
    ``""`` for a topic's own queue).  The file is removed once read."""
    path = Path(data_path) / QUEUES_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return
    if not raw.startswith(_MAGIC):
        raise ValueError(f"{path} is not an embedded nsqd queue file")
    pos = len(_MAGIC)
    out = []
    while pos < len(raw):
        tlen, clen, count = _QUEUE_HEAD.unpack_from(raw, pos)
        pos += _QUEUE_HEAD.size
        topic = raw[pos : pos + tlen].decode()
        pos += tlen
        channel = raw[pos : pos + clen].decode()
        pos += clen
        msgs = []
        for _ in range(count):
            msg_id, ts, attempts, size = _MSG_HEAD.unpack_from(raw, pos)
            pos += _MSG_HEAD.size
            msg = Message(msg_id, raw[pos : pos + size], ts)
            msg.attempts = attempts
            msgs.append(msg)
            pos += size
        out.append((topic, channel, msgs))
    path.unlink()
    yield from out
