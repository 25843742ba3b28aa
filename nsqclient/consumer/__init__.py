"""The Consumer and what it owns: discovery of nsqd (direct or through nsqlookupd), the RDY
balancer, the work queue, the dispatch to handler workers or to takers, the answers (FIN, REQ,
TOUCH) and the columnar batches of ``take_batches()``."""

from ._arguments import Handler
from ._batch import HEADER_SIZE, ID_OFFSET, BatchResponder, MessageBatch, Origin
from ._consumer import ConnectionCounts, Consumer

__all__ = [
    "HEADER_SIZE",
    "ID_OFFSET",
    "BatchResponder",
    "ConnectionCounts",
    "Consumer",
    "Handler",
    "MessageBatch",
    "Origin",
]
