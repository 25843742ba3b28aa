"""Options of the ``nsq`` Spark data source: strings in, typed values out.

Spark hands a data source its options as strings, with the keys lower-cased.  This module turns
them into the keyword arguments of :class:`~nsqclient.Consumer` and :class:`~nsqclient.Producer`
(every :class:`~nsqclient.config.Config` option, by the same name: ``max_in_flight``,
``tls_v1``, ``auth_secret``, ``msg_timeout``...) plus the source's and sink's own options.
It imports nothing of pyspark, so it can be tested and used without Spark.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..addresses import lookupd_addresses, nsqd_addresses
from ..config import OPTIONS, Config, check_owner
from ..protocol import check_channel_name, check_topic_name

__all__ = ["SourceOptions", "SinkOptions", "parse_config_value"]

#: options of the source that are not Config options: name -> (default, meaning)
SOURCE_OPTIONS: dict[str, tuple[str | None, str]] = {
    "topic": (None, "topic to consume (required)"),
    "channel": (None, "channel to consume (required)"),
    "nsqd_tcp_addresses": (None, "comma-separated nsqd TCP addresses (host:port)"),
    "lookupd_http_addresses": (None, "comma-separated nsqlookupd HTTP addresses"),
    "maxMessagesPerBatch": (None, "most messages in one micro-batch (default: all held)"),
    "numPartitions": ("1", "Spark partitions each micro-batch is split into"),
    "availableNowIdleTimeout": (
        "2.0",
        "seconds without a new message after which Trigger.AvailableNow ends",
    ),
    "fillTimeout": (
        "0.1",
        "seconds a batch waits at most for nsqd to refill what the last batch's FINs freed",
    ),
}

#: options of the sink that are not Config options
SINK_OPTIONS: dict[str, tuple[str | None, str]] = {
    "topic": (None, "topic to publish to (required)"),
    "nsqd_tcp_addresses": (None, "comma-separated nsqd TCP addresses (host:port)"),
    "lookupd_http_addresses": (None, "comma-separated nsqlookupd HTTP addresses"),
    "maxMessagesPerMpub": ("500", "most messages in one MPUB"),
    "maxBytesPerMpub": ("4194304", "most body bytes in one MPUB (nsqd's max-body-size: 5 MiB)"),
    "maxMpubsInFlight": ("4", "MPUBs a task keeps unanswered at once"),
}

#: defaults the source uses where the Consumer's own default does not fit a Spark source
SOURCE_CONFIG_DEFAULTS: dict[str, Any] = {
    # The source holds every message until Spark has committed it: max_in_flight bounds the
    # driver's memory and the size of a micro-batch.
    "max_in_flight": 5000,
    # A message that made a query fail five times must not be dropped silently: never give up.
    "max_tries": 0,
}

#: options Spark itself adds to a data source's (lower-cased): never the data source's business
SPARK_OWN_OPTIONS = frozenset({"checkpointlocation", "queryname", "path", "paths"})

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}
_NONE = {"", "none", "null"}


def _addresses(options: Mapping[str, str | None]) -> tuple[list[str], list[str]]:
    """The ``nsqd_tcp_addresses`` and ``lookupd_http_addresses`` options as lists (an option
    not given or blank: none), parsed as the Consumer and Producer parse them
    (:mod:`nsqclient.addresses`: comma-separated, no empty item)."""
    nsqd, lookupd = options["nsqd_tcp_addresses"], options["lookupd_http_addresses"]
    return (
        nsqd_addresses(nsqd if nsqd and nsqd.strip() else None, "nsqd_tcp_addresses"),
        lookupd_addresses(
            lookupd if lookupd and lookupd.strip() else None, "lookupd_http_addresses"
        ),
    )


def parse_config_value(name: str, text: str) -> Any:
    """Turn the string ``text`` into a value for the Config option ``name``.

    Booleans accept true/false/1/0/yes/no/on/off; a nullable option accepts ""/none/null for
    None.  The value is then validated by :class:`Config` (range, choices).

    Raises:
        ValueError: unknown option (naming the closest one), or a value that does not parse.
    """
    opt = OPTIONS.get(name)
    if opt is None:
        raise ValueError(f"unknown option {name!r}{_hint(name, OPTIONS)}")
    if not isinstance(text, str):
        text = str(text)
    stripped = text.strip()
    if opt.nullable and stripped.lower() in _NONE:
        return None
    kind = opt.kind
    try:
        if kind is bool:
            low = stripped.lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError(f"not a boolean: {text!r}")
        if kind is int:
            return int(stripped)
        if kind is float:
            return float(stripped)
    except ValueError as exc:
        raise ValueError(f"option {name}: {exc}") from None
    return text  # str, or (str, bytes): the string itself


def _hint(name: str, known: Mapping[str, Any] | list[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _parse(
    options: Mapping[str, str], own: Mapping[str, tuple[str | None, str]], what: str
) -> tuple[dict[str, str | None], dict[str, Any]]:
    """Split ``options`` into the data source's own (by their documented name) and Config
    keyword arguments (parsed and validated).  Keys are matched case-insensitively."""
    by_lower = {k.lower(): k for k in own}
    mine: dict[str, str | None] = {k: default for k, (default, _) in own.items()}
    config: dict[str, Any] = {}
    for key, value in options.items():
        low = key.lower()
        if low in by_lower:
            mine[by_lower[low]] = value
        elif low in OPTIONS:
            config[low] = parse_config_value(low, value)
        elif low in SPARK_OWN_OPTIONS:
            continue
        else:
            spelled = {**{name: name for name in OPTIONS}, **by_lower}
            close = difflib.get_close_matches(low, list(spelled), n=1)
            hint = f"; did you mean {spelled[close[0]]!r}?" if close else ""
            raise ValueError(f"unknown option {key!r} for the nsq {what}{hint}")
    try:
        check_owner(config, "Consumer" if what == "source" else "Producer")
        Config(**config)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"nsq {what}: {exc}") from None
    return mine, config


def _positive_int(value: str | None, name: str) -> int | None:
    if value is None or value.strip().lower() in _NONE:
        return None
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, not {value!r}") from None
    if number < 1:
        raise ValueError(f"{name} must be >= 1, not {number}")
    return number


def _seconds(value: str | None, name: str, default: float) -> float:
    if value is None or not value.strip():
        return default
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, not {value!r}") from None


@dataclass(frozen=True)
class SourceOptions:
    """The source's parsed options.

    Attributes:
        topic, channel: what to consume.
        nsqd_tcp_addresses, lookupd_http_addresses: where (at least one list is non-empty).
        max_messages_per_batch: most messages in a micro-batch (None: all held).
        num_partitions: Spark partitions a micro-batch is split into.
        available_now_idle_timeout: seconds without a message that end Trigger.AvailableNow.
        fill_timeout: seconds ``latestOffset`` waits at most for nsqd to refill (0: never).
        consumer_options: keyword arguments for :class:`~nsqclient.Consumer`.
    """

    topic: str
    channel: str
    nsqd_tcp_addresses: list[str] = field(default_factory=list)
    lookupd_http_addresses: list[str] = field(default_factory=list)
    max_messages_per_batch: int | None = None
    num_partitions: int = 1
    available_now_idle_timeout: float = 2.0
    fill_timeout: float = 0.1
    consumer_options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Parse Spark's option strings; raise ValueError naming the bad option."""
        mine, config = _parse(options, SOURCE_OPTIONS, "source")
        topic, channel = mine["topic"], mine["channel"]
        if not topic:
            raise ValueError("the nsq source needs the 'topic' option")
        if not channel:
            raise ValueError("the nsq source needs the 'channel' option")
        check_topic_name(topic)
        check_channel_name(channel)
        nsqd, lookupd = _addresses(mine)
        if not nsqd and not lookupd:
            raise ValueError(
                "the nsq source needs 'nsqd_tcp_addresses' or 'lookupd_http_addresses'"
            )
        idle = _seconds(mine["availableNowIdleTimeout"], "availableNowIdleTimeout", 2.0)
        if not idle > 0:
            raise ValueError(f"availableNowIdleTimeout must be > 0 seconds, not {idle}")
        fill = _seconds(mine["fillTimeout"], "fillTimeout", 0.1)
        if not 0 <= fill <= 60:
            raise ValueError(f"fillTimeout must be between 0 and 60 seconds, not {fill}")
        consumer_options = {**SOURCE_CONFIG_DEFAULTS, **config}
        if consumer_options["max_in_flight"] < 1:
            raise ValueError("max_in_flight must be >= 1 for the nsq source")
        return cls(
            topic=topic,
            channel=channel,
            nsqd_tcp_addresses=nsqd,
            lookupd_http_addresses=lookupd,
            max_messages_per_batch=_positive_int(
                mine["maxMessagesPerBatch"], "maxMessagesPerBatch"
            ),
            num_partitions=_positive_int(mine["numPartitions"], "numPartitions") or 1,
            available_now_idle_timeout=idle,
            fill_timeout=fill,
            consumer_options=consumer_options,
        )


@dataclass(frozen=True)
class SinkOptions:
    """The sink's parsed options.

    Attributes:
        topic: where to publish.
        nsqd_tcp_addresses, lookupd_http_addresses: where (at least one list is non-empty;
            with lookupd only, the nsqd that have the topic, else every nsqd it knows).
        max_messages_per_mpub, max_bytes_per_mpub: chunking of a task's rows into MPUBs.
        max_mpubs_in_flight: MPUBs one task keeps unanswered at once.
        producer_options: keyword arguments for :class:`~nsqclient.Producer`.
    """

    topic: str
    nsqd_tcp_addresses: list[str] = field(default_factory=list)
    lookupd_http_addresses: list[str] = field(default_factory=list)
    max_messages_per_mpub: int = 500
    max_bytes_per_mpub: int = 4 * 1024 * 1024
    max_mpubs_in_flight: int = 4
    producer_options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        """Parse Spark's option strings; raise ValueError naming the bad option."""
        mine, config = _parse(options, SINK_OPTIONS, "sink")
        topic = mine["topic"]
        if not topic:
            raise ValueError("the nsq sink needs the 'topic' option")
        check_topic_name(topic)
        nsqd, lookupd = _addresses(mine)
        if not nsqd and not lookupd:
            raise ValueError("the nsq sink needs 'nsqd_tcp_addresses' or 'lookupd_http_addresses'")
        return cls(
            topic=topic,
            nsqd_tcp_addresses=nsqd,
            lookupd_http_addresses=lookupd,
            max_messages_per_mpub=_positive_int(mine["maxMessagesPerMpub"], "maxMessagesPerMpub")
            or 500,
            max_bytes_per_mpub=_positive_int(mine["maxBytesPerMpub"], "maxBytesPerMpub")
            or 4 * 1024 * 1024,
            max_mpubs_in_flight=_positive_int(mine["maxMpubsInFlight"], "maxMpubsInFlight") or 4,
            producer_options=config,
        )
