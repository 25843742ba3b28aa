"""The sink: each Spark task publishes its rows' ``body`` (or ``value``) column with MPUB.

Runs on the executors.  A task opens its own :class:`~nsqclient.Producer`, cuts its rows into
MPUBs of at most ``maxMessagesPerMpub`` messages and ``maxBytesPerMpub`` body bytes, keeps up to
``maxMpubsInFlight`` of them unanswered, and returns only when nsqd acknowledged every one.  Any
failure raises, so Spark retries the task (and, past ``spark.task.maxFailures``, fails the
batch or the write).  A retried task publishes its rows again: the sink is at-least-once.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from ..http import LookupdClient, TopicNotFoundError, producer_address
from ..producer import Producer
from .options import SinkOptions

__all__ = ["NSQWriter", "NSQStreamWriter", "PublishedCount", "body_column", "publish_batches"]

logger = logging.getLogger("nsqclient.spark.sink")

#: bytes nsqd counts per message in an MPUB body besides the message itself (its size prefix)
_PER_MESSAGE_OVERHEAD = 4


@dataclass
class PublishedCount(WriterCommitMessage):
    """What one task published: ``messages`` messages in ``mpubs`` MPUBs."""

    messages: int
    mpubs: int


def body_column(schema_names: Iterable[str]) -> str:
    """The column to publish: ``body``, else ``value`` (case-insensitive)."""
    names = {n.lower(): n for n in schema_names}
    for wanted in ("body", "value"):
        if wanted in names:
            return names[wanted]
    raise ValueError(
        f"the nsq sink publishes a 'body' or 'value' column (binary or string); "
        f"the data has {sorted(names.values())}"
    )


def resolve_addresses(options: SinkOptions) -> list[str]:
    """The nsqd TCP addresses to publish to: the ``nsqd_tcp_addresses`` option, else those
    nsqlookupd lists for the topic, else every nsqd nsqlookupd knows."""
    if options.nsqd_tcp_addresses:
        return list(options.nsqd_tcp_addresses)
    found: set[str] = set()
    for address in options.lookupd_http_addresses:
        with LookupdClient(address) as lookupd:
            try:
                producers = lookupd.lookup(options.topic)["producers"]
            except TopicNotFoundError:
                producers = lookupd.nodes()
            found.update(producer_address(p) for p in producers)
    if not found:
        raise ConnectionError(
            f"nsqlookupd {options.lookupd_http_addresses} knows no nsqd to publish "
            f"{options.topic!r} to"
        )
    return sorted(found)


def _chunks(bodies: Iterator[bytes | str], max_count: int, max_bytes: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    size = 0
    for body in bodies:
        if body is None:
            raise ValueError("the nsq sink cannot publish a null body")
        length = len(body) + _PER_MESSAGE_OVERHEAD
        if chunk and (len(chunk) >= max_count or size + length > max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(body)
        size += length
    if chunk:
        yield chunk


def _bodies(batches: Iterable[Any]) -> Iterator[bytes | str]:
    column: str | None = None
    for batch in batches:
        if column is None:
            column = body_column(batch.schema.names)
        yield from batch.column(batch.schema.get_field_index(column)).to_pylist()


def publish_batches(options: SinkOptions, batches: Iterable[Any]) -> PublishedCount:
    """Publish the body column of Arrow record batches; return when nsqd acknowledged all.

    Raises the first publish error (nsqclient's ServerError, ConnectionClosedError,
    NSQTimeoutError) or ValueError for a missing column, a null or an empty body."""
    producer: Producer | None = None
    pending: deque[Future] = deque()
    messages = mpubs = 0
    try:
        for chunk in _chunks(
            _bodies(batches), options.max_messages_per_mpub, options.max_bytes_per_mpub
        ):
            if producer is None:
                producer = Producer(resolve_addresses(options), **options.producer_options)
            while len(pending) >= options.max_mpubs_in_flight:
                pending.popleft().result()
            pending.append(producer.mpub_async(options.topic, chunk))
            messages += len(chunk)
            mpubs += 1
        while pending:
            pending.popleft().result()
    finally:
        if producer is not None:
            producer.close()
    return PublishedCount(messages, mpubs)


class NSQWriter(DataSourceArrowWriter):
    """Batch writer (``df.write.format("nsq")``)."""

    def __init__(self, options: SinkOptions):
        self.options = options

    def write(self, iterator: Iterator[Any]) -> PublishedCount:
        """On an executor: publish this task's rows."""
        return publish_batches(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(m.messages for m in messages if isinstance(m, PublishedCount))
        logger.info("published %d messages to %s", total, self.options.topic)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        done = sum(m.messages for m in messages if isinstance(m, PublishedCount))
        logger.warning(
            "write to %s failed; %d messages of the finished tasks stay published",
            self.options.topic,
            done,
        )


class NSQStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writer (``df.writeStream.format("nsq")``)."""

    def __init__(self, options: SinkOptions):
        self.options = options

    def write(self, iterator: Iterator[Any]) -> PublishedCount:
        """On an executor: publish this task's rows of the micro-batch."""
        return publish_batches(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        total = sum(m.messages for m in messages if isinstance(m, PublishedCount))
        logger.info("batch %d: published %d messages to %s", batchId, total, self.options.topic)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        done = sum(m.messages for m in messages if isinstance(m, PublishedCount))
        logger.warning(
            "batch %d to %s failed; %d messages of the finished tasks stay published",
            batchId,
            self.options.topic,
            done,
        )
