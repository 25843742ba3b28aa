"""pynsq's connection keyword arguments, translated to nsqclient's options (seconds)."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from typing import Any

from ..checks import check_float
from ..config import OPTIONS

__all__ = ["check_seconds", "translate_kwargs"]

logger = logging.getLogger("nsqclient.compat")


def check_seconds(name: str, value: Any) -> float:
    """``value`` as a float of seconds; TypeError/ValueError naming ``name``."""
    return check_float(value, name, "seconds")


def _opt_output_buffer_timeout(value: Any) -> dict[str, Any]:
    # pynsq: milliseconds.  nsqclient: seconds (-1 still disables the timeout).
    ms = check_float(value, "output_buffer_timeout", "milliseconds")
    return {"output_buffer_timeout": -1.0 if ms == -1 else ms / 1000.0}


def _opt_msg_timeout(value: Any) -> dict[str, Any]:
    # pynsq: seconds; a falsy value means "nsqd's default".
    return {"msg_timeout": check_seconds("msg_timeout", value) if value else None}


def _opt_hostname(value: Any) -> dict[str, Any]:
    # pynsq also derived the IDENTIFY client_id from the hostname it was given.
    if value is None:
        return {}
    if not isinstance(value, str):
        raise TypeError(f"hostname must be a str, not {value!r}")
    return {"hostname": value, "client_id": value.split(".")[0]}


def _opt_timeout(value: Any) -> dict[str, Any]:
    duration = check_seconds("timeout", value)
    return {"dial_timeout": duration, "write_timeout": duration}


def _same(name: str, coerce: Callable[[Any], Any] | None = None) -> Callable[[Any], dict]:
    def convert(value: Any) -> dict[str, Any]:
        return {name: coerce(value) if coerce is not None else value}

    return convert


# The TLS keywords tornado accepted in pynsq's ``tls_options`` dict.
_TLS_IGNORED = {
    "ssl_version": "nsqclient negotiates TLS 1.2 or newer",
    "ciphers": "nsqclient uses the ssl module's default cipher list",
}
_TLS_SILENT_VERSIONS = {
    getattr(ssl, name)
    for name in ("PROTOCOL_TLSv1_2", "PROTOCOL_TLS", "PROTOCOL_TLS_CLIENT")
    if hasattr(ssl, name)
}


def _opt_tls_options(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"tls_options must be a dict of ssl keywords, not {value!r}")
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key == "ca_certs":
            out["tls_ca_file"] = item
        elif key == "certfile":
            out["tls_cert_file"] = item
        elif key == "keyfile":
            out["tls_key_file"] = item
        elif key == "cert_reqs":
            if item not in (ssl.CERT_NONE, ssl.CERT_OPTIONAL, ssl.CERT_REQUIRED):
                raise ValueError(f"tls_options cert_reqs must be an ssl.CERT_* value, not {item!r}")
            out["tls_verify"] = item != ssl.CERT_NONE
        elif key in _TLS_IGNORED:
            if not (key == "ssl_version" and item in _TLS_SILENT_VERSIONS):
                logger.warning("tls_options[%r]=%r ignored: %s", key, item, _TLS_IGNORED[key])
        else:
            raise TypeError(
                f"unknown tls_options key {key!r}; pynsq accepted ca_certs, certfile, keyfile, "
                f"cert_reqs, ssl_version, ciphers"
            )
    return out


#: pynsq's connection keyword arguments (AsyncConn) -> nsqclient options.
_PYNSQ_CONN_KWARGS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "timeout": _opt_timeout,
    "heartbeat_interval": _same("heartbeat_interval"),  # seconds in both
    "requeue_delay": _same("default_requeue_delay"),  # seconds in both
    "tls_v1": _same("tls_v1", bool),
    "tls_options": _opt_tls_options,
    "snappy": _same("snappy", bool),
    "deflate": _same("deflate", bool),
    "deflate_level": _same("deflate_level"),
    "user_agent": _same("user_agent"),
    "output_buffer_size": _same("output_buffer_size"),
    "output_buffer_timeout": _opt_output_buffer_timeout,  # ms -> s
    "sample_rate": _same("sample_rate"),
    "auth_secret": _same("auth_secret"),
    "msg_timeout": _opt_msg_timeout,  # seconds in both
    "hostname": _opt_hostname,
}

#: Keywords legacy pynsq code may pass that mean nothing without tornado: accepted, ignored.
_IGNORED_KWARGS = {
    "io_loop": "nsqclient runs on threads, not on a tornado IOLoop",
}


def translate_kwargs(kwargs: dict[str, Any], owner: str) -> dict[str, Any]:
    """pynsq connection keywords -> nsqclient Config options (validated later by Config)."""
    options: dict[str, Any] = {}
    native: dict[str, Any] = {}
    for name, value in kwargs.items():
        if name == "tls_options" and value and not kwargs.get("tls_v1"):
            # pynsq used tls_options only with tls_v1; nsqclient's Config refuses TLS settings
            # without it, so a legacy program that passes them with tls_v1 off still runs.
            logger.warning(
                "%s: tls_options ignored because tls_v1 is not set (as pynsq did); the"
                " connection is plain text",
                owner,
            )
            _opt_tls_options(value)  # still refuse what pynsq refused
            continue
        if name in _PYNSQ_CONN_KWARGS:
            options.update(_PYNSQ_CONN_KWARGS[name](value))
        elif name in _IGNORED_KWARGS:
            logger.warning("%s: %s=%r ignored: %s", owner, name, value, _IGNORED_KWARGS[name])
        elif name in OPTIONS:
            native[name] = value  # nsqclient's own option, in nsqclient's units
        else:
            raise TypeError(
                f"{owner}() got an unexpected keyword argument {name!r} (pynsq accepts "
                f"{', '.join(sorted(_PYNSQ_CONN_KWARGS))})"
            )
    options.update(native)
    return options
