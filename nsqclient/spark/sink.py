"""The sink: each Spark task publishes its rows' ``body`` (or ``value``) column with MPUB.

Runs on the executors.  A task opens its own :class:`~nsqclient.Producer`, cuts its rows into
MPUBs of at most ``maxMessagesPerMpub`` messages and ``maxBytesPerMpub`` body bytes, keeps up to
``maxMpubsInFlight`` of them unanswered, and returns only when nsqd acknowledged every one.  Any
failure raises, so Spark retries the task (and, past ``spark.task.maxFailures``, fails the
batch or the write).  A retried task publishes its rows again: the sink is at-least-once.

youzan's partitioned topics: a row's ``partition`` column (when not null) names the partition
it goes to; else its ``key`` column (when not null) picks one, the same partition
``Producer.pub(key=)`` picks (:func:`~nsqclient.lookupd.key_partition` over the topic's
partition count from lookup); rows with neither go round-robin.  Rows bound for one partition
share MPUBs.
"""

from __future__ import annotations

import itertools
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

from ..addresses import producer_address
from ..errors import NoRouteError
from ..http import HTTPError, LookupdClient, TopicNotFoundError
from ..lookupd import key_partition, partition_count
from ..producer import Producer
from .options import SinkOptions

__all__ = [
    "NSQWriter",
    "NSQStreamWriter",
    "PublishedCount",
    "body_column",
    "publish_batches",
    "routing_columns",
]

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


def routing_columns(schema_names: Iterable[str]) -> tuple[str | None, str | None]:
    """The ``key`` and ``partition`` columns (case-insensitive), None where absent."""
    names = {n.lower(): n for n in schema_names}
    return names.get("key"), names.get("partition")


def check_frame(schema_names: Iterable[str], options: SinkOptions) -> None:
    """Refuse, before any task runs, a frame the sink cannot publish: no body column, or a
    ``key`` column without ``lookupd_http_addresses`` (the partition count comes from lookup)."""
    names = list(schema_names)
    body_column(names)
    key, _ = routing_columns(names)
    if key is not None and not options.lookupd_http_addresses:
        raise ValueError(
            f"the nsq sink publishes a row with a {key!r} column to the key's partition "
            "(youzan), which needs the 'lookupd_http_addresses' option: lookup says how many "
            "partitions the topic has"
        )


def lookup_partition_count(options: SinkOptions) -> int:
    """The topic's partition count from the first nsqlookupd that answers (youzan's meta)."""
    errors: list[str] = []
    for address in options.lookupd_http_addresses:
        try:
            with LookupdClient(address) as lookupd:
                count = partition_count(lookupd.lookup(options.topic, "w", True).get("meta"))
        except (OSError, HTTPError, TopicNotFoundError, ValueError) as exc:
            errors.append(f"{address}: {exc}")
            continue
        if count:
            return count
        errors.append(f"{address}: no partition count for {options.topic!r}")
    raise NoRouteError(
        f"the nsq sink publishes rows with a key to the key's partition, and lookup gave no "
        f"partition count for {options.topic!r} (a youzan partitioned topic): " + "; ".join(errors)
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


def _column(batch: Any, name: str | None) -> list[Any]:
    if name is None:
        return [None] * batch.num_rows
    return batch.column(batch.schema.get_field_index(name)).to_pylist()


def _routed_rows(
    batches: Iterable[Any], options: SinkOptions
) -> Iterator[tuple[int | None, bytes | str]]:
    """``(partition or None, body)`` for every row: the ``partition`` column, else the key's
    partition, else None (round-robin)."""
    count: int | None = None
    for batch in batches:
        names = batch.schema.names
        body_name = body_column(names)
        key_name, partition_name = routing_columns(names)
        bodies = _column(batch, body_name)
        keys = _column(batch, key_name)
        partitions = _column(batch, partition_name)
        for body, key, partition in zip(bodies, keys, partitions, strict=True):
            if partition is None and key is not None:
                if count is None:
                    count = lookup_partition_count(options)
                partition = key_partition(key, count)
            yield partition, body


def _open_producer(options: SinkOptions, routed: bool) -> Producer:
    if routed and options.lookupd_http_addresses:
        return Producer(
            lookupd_http_addresses=options.lookupd_http_addresses, **options.producer_options
        )
    return Producer(resolve_addresses(options), **options.producer_options)


def publish_batches(options: SinkOptions, batches: Iterable[Any]) -> PublishedCount:
    """Publish the body column of Arrow record batches; return when nsqd acknowledged all.

    With a ``key`` or ``partition`` column, each row goes to its partition (see the module
    docstring).

    Raises the first publish error (nsqclient's ServerError, ConnectionClosedError,
    NSQTimeoutError) or ValueError for a missing column, a null or an empty body."""
    iterator = iter(batches)
    first = next(iterator, None)
    if first is None:
        return PublishedCount(0, 0)
    everything = itertools.chain([first], iterator)
    routed = routing_columns(first.schema.names) != (None, None)
    producer: Producer | None = None
    pending: deque[Future] = deque()
    messages = mpubs = 0
    try:
        if routed:
            chunks: Iterator[tuple[int | None, list[Any]]] = _partitioned_chunks(
                _routed_rows(everything, options),
                options.max_messages_per_mpub,
                options.max_bytes_per_mpub,
            )
        else:
            chunks = (
                (None, chunk)
                for chunk in _chunks(
                    _bodies(everything), options.max_messages_per_mpub, options.max_bytes_per_mpub
                )
            )
        for partition, chunk in chunks:
            if producer is None:
                producer = _open_producer(options, routed)
            while len(pending) >= options.max_mpubs_in_flight:
                pending.popleft().result()
            if partition is None:
                pending.append(producer.mpub_async(options.topic, chunk))
            else:
                pending.append(producer.mpub_async(options.topic, chunk, partition=partition))
            messages += len(chunk)
            mpubs += 1
        while pending:
            pending.popleft().result()
    finally:
        if producer is not None:
            producer.close()
    return PublishedCount(messages, mpubs)


def _partitioned_chunks(
    rows: Iterator[tuple[int | None, bytes | str]], max_count: int, max_bytes: int
) -> Iterator[tuple[int | None, list[Any]]]:
    """MPUB chunks of rows bound for one partition (None: round-robin), each partition's rows
    in their order."""
    open_chunks: dict[int | None, tuple[list[Any], int]] = {}
    for partition, body in rows:
        if body is None:
            raise ValueError("the nsq sink cannot publish a null body")
        length = len(body) + _PER_MESSAGE_OVERHEAD
        chunk, size = open_chunks.get(partition, (None, 0))
        if chunk and (len(chunk) >= max_count or size + length > max_bytes):
            yield partition, chunk
            chunk = None
        if chunk is None:
            chunk, size = [], 0
        chunk.append(body)
        open_chunks[partition] = (chunk, size + length)
    for partition, (chunk, _) in open_chunks.items():
        if chunk:
            yield partition, chunk


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
