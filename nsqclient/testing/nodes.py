"""Where an nsqd or nsqlookupd listens, and free ports to listen on: shared by the embedded NSQ,
the real-binary runner and the tests."""

from __future__ import annotations

import socket
from dataclasses import dataclass

__all__ = ["Listeners", "Node", "LookupdNode", "free_ports"]


class Listeners:
    """Addresses derived from ``host``, ``tcp_port`` and ``http_port`` (set by the subclass)."""

    host: str
    tcp_port: int
    http_port: int

    @property
    def tcp_address(self) -> str:
        """``host:port`` of the TCP listener."""
        return f"{self.host}:{self.tcp_port}"

    @property
    def http_address(self) -> str:
        """``host:port`` of the HTTP listener."""
        return f"{self.host}:{self.http_port}"

    @property
    def http_url(self) -> str:
        """``http://host:port`` of the HTTP listener."""
        return f"http://{self.host}:{self.http_port}"


@dataclass(eq=False, repr=False)
class Node(Listeners):
    """Where one nsqd listens (TCP for protocol V2, HTTP, and HTTPS when it has one)."""

    host: str = "127.0.0.1"
    tcp_port: int = 0
    http_port: int = 0
    https_port: int | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(tcp={self.tcp_address}, http={self.http_address})"


class LookupdNode(Node):
    """Where the nsqlookupd listens (TCP for nsqd registration, HTTP for lookups)."""


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports on ``host`` that were free a moment ago (bound all at once,
    so they differ, then released for a server to take)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
