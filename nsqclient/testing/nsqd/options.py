"""nsqd's options: the flags with their defaults, validation, and the TLS context they describe.

Names are nsqd's flags with underscores; durations are seconds (floats), sizes bytes.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field, fields
from typing import Any

from .writes import split_seed_from_env, split_writes_from_env

__all__ = ["NSQDOptions", "build_ssl_context", "ms"]

_TLS_VERSIONS = {
    "ssl3.0": ssl.TLSVersion.SSLv3,
    "tls1.0": ssl.TLSVersion.TLSv1,
    "tls1.1": ssl.TLSVersion.TLSv1_1,
    "tls1.2": ssl.TLSVersion.TLSv1_2,
    "tls1.3": ssl.TLSVersion.TLSv1_3,
}


@dataclass
class NSQDOptions:
    """nsqd's flags with underscores; durations in seconds (floats), sizes in bytes."""

    msg_timeout: float = 60.0
    max_msg_timeout: float = 900.0
    max_req_timeout: float = 3600.0
    max_msg_size: int = 1024 * 1024
    max_body_size: int = 5 * 1024 * 1024
    max_rdy_count: int = 2500
    max_heartbeat_interval: float = 60.0
    max_output_buffer_size: int = 64 * 1024
    max_output_buffer_timeout: float = 30.0
    min_output_buffer_timeout: float = 0.025
    output_buffer_timeout: float = 0.25
    client_timeout: float = 60.0
    mem_queue_size: int = 10000
    max_channel_consumers: int = 0
    snappy: bool = True
    deflate: bool = True
    max_deflate_level: int = 6
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_root_ca_file: str | None = None
    tls_client_auth_policy: str = ""
    tls_required: int = 0
    tls_min_version: str | None = None
    auth_http_address: str | list[str] | None = None
    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 5.0
    node_id: int | None = None
    broadcast_address: str = "127.0.0.1"
    lookupd_tcp_addresses: list[str] = field(default_factory=list)
    #: How often the node pings each nsqlookupd (nsqd: 15s).
    lookupd_ping_interval: float = 15.0
    #: How soon a lost nsqlookupd connection is retried (nsqd waits for its next ping).
    lookupd_reconnect_interval: float = 1.0
    #: In-flight / deferred scan period (nsqd: 100ms).
    queue_scan_interval: float = 0.05
    #: Directory where topics, channels and queued messages survive a restart of the process
    #: (``nsqd.dat`` and ``nsqclient-embedded.queues``); None keeps them in memory only.
    data_path: str | None = None
    #: Fault control: cut every write to a client into small random pieces (see :mod:`.writes`).
    split_writes: bool = field(default_factory=split_writes_from_env)
    #: Seed for those cuts (None: a random one, logged when the node starts).
    split_writes_seed: int | None = field(default_factory=split_seed_from_env)

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> NSQDOptions:
        """Build options from nsqd-style keyword arguments; unknown names raise TypeError."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(k for k in kwargs if k not in known and not k.startswith("statsd_"))
        if unknown:
            raise TypeError(f"unknown nsqd option(s): {', '.join(unknown)}")
        opts = cls(**{k: v for k, v in kwargs.items() if k in known})
        if isinstance(opts.auth_http_address, str):
            opts.auth_http_address = [opts.auth_http_address] if opts.auth_http_address else []
        elif opts.auth_http_address is None:
            opts.auth_http_address = []
        if not 1 <= opts.max_deflate_level <= 9:
            raise ValueError("--max-deflate-level must be [1,9]")
        if opts.tls_client_auth_policy and not opts.tls_required:
            opts.tls_required = 2
        if opts.tls_required and not (opts.tls_cert and opts.tls_key):
            raise ValueError("cannot require TLS client connections without TLS key and cert")
        return opts


def ms(seconds: float) -> int:
    """Whole milliseconds in ``seconds`` (what nsqd reports for a duration on the wire)."""
    return int(round(seconds * 1000))


def build_ssl_context(opts: NSQDOptions) -> ssl.SSLContext | None:
    """The server-side TLS context nsqd's --tls-* flags describe (None without a cert)."""
    if not (opts.tls_cert and opts.tls_key):
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(opts.tls_cert, opts.tls_key)
    if opts.tls_min_version:
        version = _TLS_VERSIONS.get(opts.tls_min_version.lower())
        if version is None:
            raise ValueError(f"unknown tls_min_version {opts.tls_min_version!r}")
        try:
            ctx.minimum_version = version
        except (ValueError, ssl.SSLError):
            pass
    policy = opts.tls_client_auth_policy
    if policy not in ("", "require", "require-verify"):
        raise ValueError(f"unknown tls_client_auth_policy {policy!r}")
    if opts.tls_root_ca_file:
        ctx.load_verify_locations(opts.tls_root_ca_file)
    if policy == "require-verify":
        ctx.verify_mode = ssl.CERT_REQUIRED
    elif policy == "require":
        # Go's RequireAnyClientCert takes any certificate; the ssl module verifies every
        # certificate it asks for, so "require" verifies against the root CA file (or the
        # system's CAs) and the connection checks after the handshake that one was sent.
        if not opts.tls_root_ca_file:
            ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
        ctx.verify_mode = ssl.CERT_OPTIONAL
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx
