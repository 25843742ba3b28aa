"""What both clients ask of nsqlookupd: the pool of lookupd addresses that spreads, retries and
demotes queries, and youzan's partitions (the partition of a key, a topic's route as a lookup
names it)."""

from ._partitions import (
    TopicRoute,
    key_partition,
    missing_partitions,
    murmur3_32,
    partition_count,
    route_from_lookup,
)
from ._pool import LookupdPool, UnusableAnswerError, demotion_delay, is_answer, unanswered

__all__ = [
    "LookupdPool",
    "TopicRoute",
    "UnusableAnswerError",
    "demotion_delay",
    "is_answer",
    "key_partition",
    "missing_partitions",
    "murmur3_32",
    "partition_count",
    "route_from_lookup",
    "unanswered",
]
