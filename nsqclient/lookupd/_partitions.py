"""Where a youzan topic's partitions live and which partition a publish goes to; pure.

youzan's nsqlookupd answers ``/lookup?topic=T&access=w&metainfo=true`` with, beside the classic
``producers`` list, ``partitions`` (partition number -> the nsqd leading it) and ``meta``
(``partition_num``, ``replica``, ``ordered``, ``extend_support``).  :func:`route_from_lookup`
turns that answer into a :class:`TopicRoute`; :func:`key_partition` maps a sharding key to a
partition the same way from any process.  Nothing here does I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..addresses import producer_address, producer_http_address
from ..checks import check_int

__all__ = [
    "TopicRoute",
    "key_partition",
    "missing_partitions",
    "murmur3_32",
    "partition_count",
    "route_from_lookup",
]

_C1 = 0xCC9E2D51
_C2 = 0x1B873593
_M32 = 0xFFFFFFFF


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3 x86 32-bit of ``data`` (an unsigned 32-bit int).

    The hash youzan's guide configures for keyed publishing in its Go client
    (``config.Hasher = murmur3.New32()``), so Python and Go publishers agree on partitions."""
    h = seed & _M32
    n = len(data)
    body = n - n % 4
    for i in range(0, body, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _C1) & _M32
        k = ((k << 15) | (k >> 17)) & _M32
        k = (k * _C2) & _M32
        h ^= k
        h = ((h << 13) | (h >> 19)) & _M32
        h = (h * 5 + 0xE6546B64) & _M32
    tail = data[body:]
    if tail:
        k = int.from_bytes(tail, "little")
        k = (k * _C1) & _M32
        k = ((k << 15) | (k >> 17)) & _M32
        k = (k * _C2) & _M32
        h ^= k
    h ^= n
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    h ^= h >> 16
    return h


def key_bytes(key: bytes | str | int) -> bytes:
    """The bytes a sharding key is hashed as: bytes as they are, str as UTF-8, int as its
    decimal digits (so ``key=42`` and ``key="42"`` land on the same partition)."""
    if isinstance(key, bool):
        raise TypeError("a partition key must be bytes, str or int, not bool")
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key)
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, int):
        return str(key).encode("ascii")
    raise TypeError(f"a partition key must be bytes, str or int, not {type(key).__name__}")


def key_partition(key: bytes | str | int, partition_num: int) -> int:
    """The partition (0 .. partition_num-1) for sharding key ``key``:
    ``murmur3_32(key_bytes(key)) % partition_num``.  Stable across processes, Producer
    instances and Python versions (no ``hash()``, no randomisation)."""
    check_int(partition_num, "partition_num", min=1)
    return murmur3_32(key_bytes(key)) % partition_num


@dataclasses.dataclass(frozen=True)
class TopicRoute:
    """A topic's route: where its partitions are written, as lookup said (the one meaning of
    "route" in nsqclient).

    Attributes:
        topic: the topic name.
        leaders: partition -> ``"host:tcp_port"`` of the nsqd leading it (youzan); empty for
            a classic topic.
        nsqd: every ``"host:tcp_port"`` lookup listed (the classic producers list).
        partition_num: partitions the topic has, from youzan's ``meta`` (0 when lookup did
            not say: a classic topic, or a lookup without ``metainfo``).
        ordered: youzan's ``orderedmulti``: consume with ``ordered=True``, publish with a
            partition or key.
        extend_support: the topic takes ``PUB_EXT`` headers.
        http: ``"host:tcp_port"`` -> ``"host:http_port"`` of the nsqd lookup named with one.
    """

    topic: str
    leaders: Mapping[int, str]
    nsqd: tuple[str, ...]
    partition_num: int = 0
    ordered: bool = False
    extend_support: bool = False
    http: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def partitioned(self) -> bool:
        """True when lookup answered in youzan's partitioned shape."""
        return bool(self.leaders) or self.partition_num > 0

    def leader(self, partition: int) -> str | None:
        """The nsqd leading ``partition``, or None when lookup named none (its leader is
        down or moving)."""
        return self.leaders.get(partition)


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.lower() in ("true", "1")
    return bool(value)


def route_from_lookup(topic: str, result: Mapping[str, Any]) -> TopicRoute:
    """A :class:`TopicRoute` from :meth:`~nsqclient.http.LookupdClient.lookup`'s result.

    Raises ValueError for a partition key that is not a number or a producer entry without
    an address."""
    leaders: dict[int, str] = {}
    http: dict[str, str] = {}
    for key, producer in (result.get("partitions") or {}).items():
        try:
            partition = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"lookup named partition {key!r}, not a number") from None
        leaders[partition] = producer_address(producer)
        _note_http(http, leaders[partition], producer)
    producers = result.get("producers") or []
    nsqd = tuple(dict.fromkeys(producer_address(p) for p in producers))
    for p in producers:
        _note_http(http, producer_address(p), p)
    meta = result.get("meta") or {}
    partition_num = partition_count(meta)
    return TopicRoute(
        topic=topic,
        leaders=leaders,
        nsqd=nsqd,
        partition_num=partition_num,
        ordered=isinstance(meta, Mapping) and _truthy(meta.get("ordered")),
        extend_support=isinstance(meta, Mapping) and _truthy(meta.get("extend_support")),
        http=http,
    )


def _note_http(http: dict[str, str], address: str, producer: Any) -> None:
    """Note the HTTP address of the nsqd at ``address`` (a lookup producer entry)."""
    http_address = producer_http_address(producer)
    if http_address is not None:
        http.setdefault(address, http_address)


def partition_count(meta: Any) -> int:
    """The partition count in lookup's ``meta`` (an int or a numeric string); 0 when absent."""
    if not isinstance(meta, Mapping):
        return 0
    try:
        return max(int(meta.get("partition_num") or 0), 0)
    except (TypeError, ValueError):
        return 0


def missing_partitions(
    partition_num: int | None, seen: set[int], only: int | None, held: set[int]
) -> set[int]:
    """The partitions a consumer should read and holds no connection to.

    Args:
        partition_num: the topic's partition count from lookup's meta (None: not given).
        seen: every partition lookup has named so far (all that is known without a count).
        only: the one partition the consumer reads (``partition=``), or None for all.
        held: the partitions it has a connection to (or is connecting to).
    """
    if only is not None:
        wanted = (
            {only} if (partition_num is None or only < partition_num or only in seen) else set()
        )
    else:
        wanted = set(seen) if partition_num is None else set(range(partition_num))
    return wanted - held
