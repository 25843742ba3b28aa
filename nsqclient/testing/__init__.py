"""Embedded NSQ for tests and demos: nsqd and nsqlookupd 1.3 in pure Python.

>>> from nsqclient.testing import EmbeddedNSQ
>>> with EmbeddedNSQ(nsqd_count=2) as cluster:       # doctest: +SKIP
...     cluster.nsqd.tcp_address, cluster.lookupd.http_url

Run one from a shell with ``python -m nsqclient.testing --tcp-address 127.0.0.1:4150 ...``.
"""

from .cluster import EmbeddedNSQ, LookupdNode, Node

__all__ = ["EmbeddedNSQ", "Node", "LookupdNode"]
