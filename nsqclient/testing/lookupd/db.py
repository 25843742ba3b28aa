"""nsqlookupd's registration database: which nsqd (peer) registered which topic and channel.

Keys are ``(category, key, subkey)``: ``("client", "", "")`` for every identified nsqd,
``("topic", topic, "")`` and ``("channel", topic, channel)``.  Follows ``registration_db.go``.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["PeerInfo", "RegisteredNode", "RegistrationDB", "Key", "active"]


class PeerInfo:
    """An nsqd known to nsqlookupd (its IDENTIFY plus the connection's address)."""

    __slots__ = (
        "id",
        "remote_address",
        "hostname",
        "broadcast_address",
        "tcp_port",
        "http_port",
        "version",
        "last_update",
    )

    def __init__(self, peer_id: str):
        self.id = peer_id
        self.remote_address = peer_id
        self.hostname = ""
        self.broadcast_address = ""
        self.tcp_port = 0
        self.http_port = 0
        self.version = ""
        self.last_update = time.monotonic()

    def as_json(self) -> dict[str, Any]:
        return {
            "remote_address": self.remote_address,
            "hostname": self.hostname,
            "broadcast_address": self.broadcast_address,
            "tcp_port": self.tcp_port,
            "http_port": self.http_port,
            "version": self.version,
        }


class RegisteredNode:
    """One nsqd's registration under one key (nsqlookupd's Producer; tombstones are per
    registration)."""

    __slots__ = ("peer", "tombstoned", "tombstoned_at")

    def __init__(self, peer: PeerInfo):
        self.peer = peer
        self.tombstoned = False
        self.tombstoned_at = 0.0

    def is_tombstoned(self, lifetime: float) -> bool:
        return self.tombstoned and time.monotonic() - self.tombstoned_at < lifetime


Key = tuple[str, str, str]  # category, key, subkey


class RegistrationDB:
    """nsqlookupd's registration map: (category, key, subkey) -> {peer id: RegisteredNode}."""

    def __init__(self):
        self.map: dict[Key, dict[str, RegisteredNode]] = {}

    def add_registration(self, k: Key) -> None:
        self.map.setdefault(k, {})

    def add_producer(self, k: Key, peer: PeerInfo) -> bool:
        producers = self.map.setdefault(k, {})
        if peer.id in producers:
            return False
        producers[peer.id] = RegisteredNode(peer)
        return True

    def remove_producer(self, k: Key, peer_id: str) -> tuple[bool, int]:
        producers = self.map.get(k)
        if producers is None:
            return False, 0
        removed = producers.pop(peer_id, None) is not None
        return removed, len(producers)

    def remove_registration(self, k: Key) -> None:
        self.map.pop(k, None)

    def find_registrations(self, category: str, key: str, subkey: str) -> list[Key]:
        if key != "*" and subkey != "*":
            k = (category, key, subkey)
            return [k] if k in self.map else []
        return [k for k in self.map if _match(k, category, key, subkey)]

    def find_producers(self, category: str, key: str, subkey: str) -> list[RegisteredNode]:
        if key != "*" and subkey != "*":
            return list(self.map.get((category, key, subkey), {}).values())
        seen: set[str] = set()
        out = []
        for k, producers in self.map.items():
            if not _match(k, category, key, subkey):
                continue
            for p in producers.values():
                if p.peer.id not in seen:
                    seen.add(p.peer.id)
                    out.append(p)
        return out

    def lookup_registrations(self, peer_id: str) -> list[Key]:
        return [k for k, producers in self.map.items() if peer_id in producers]

    def channels_of(self, topic: str) -> list[str]:
        return [k[2] for k in self.find_registrations("channel", topic, "*")]


def _match(k: Key, category: str, key: str, subkey: str) -> bool:
    return k[0] == category and (key == "*" or k[1] == key) and (subkey == "*" or k[2] == subkey)


def active(
    producers: list[RegisteredNode], inactive: float, tombstone_lifetime: float
) -> list[RegisteredNode]:
    """The registrations updated within ``inactive`` seconds and not tombstoned (seconds)."""
    now = time.monotonic()
    return [
        p
        for p in producers
        if now - p.peer.last_update <= inactive and not p.is_tombstoned(tombstone_lifetime)
    ]
