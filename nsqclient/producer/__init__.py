"""The Producer and what it owns: the pool of nsqd endpoints, the backlog of publishes waiting
for a connection, the deadline keeper, the ledger of what could not be delivered, and
publishing by lookup (youzan's partitions, leaders and retries)."""

from ._producer import Answer, Key, Producer, PublishResult

__all__ = ["Answer", "Key", "Producer", "PublishResult"]
