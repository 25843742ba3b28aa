"""The one parser of addresses: those users give (nsqd TCP addresses and nsqlookupd HTTP
addresses) and those lookup replies name (:func:`producer_address`).

Every entry point that takes addresses (:class:`~nsqclient.Producer`,
:class:`~nsqclient.Consumer`, pynsq's ``Reader`` and ``Writer``, the CLI's address flags, the
Spark options) passes them through :func:`nsqd_addresses` or :func:`lookupd_addresses`, so one
input gets one answer and one message everywhere:

* A str is a comma-separated list: ``"10.0.0.1:4150, 10.0.0.2:4150"`` is two addresses.  A
  list, tuple or set holds addresses (each str in it may itself be a comma list).  ``None`` or an
  empty list is no address.
* Whitespace around an address is dropped; an empty one (``"a:1,,b:2"``, ``"a:1,"``, ``""``) is
  an error.
* nsqd TCP: ``host:port``, an IPv6 host in brackets (``[::1]:4150``), the port from 1 to 65535,
  no scheme.  Normalised to ``host:port`` (``[v6]:port``).
* nsqlookupd HTTP: ``host:port`` or ``http(s)://host:port[/path]``, with a port (go-nsq would
  silently use port 80).  Normalised by dropping the surrounding whitespace and a trailing ``/``.

Anything else raises at the call, before anything connects, naming the argument and the bad
item: :class:`TypeError` for what is not a str or a sequence of str (a ``("127.0.0.1", 4150)``
pair included), :class:`AddressError` (a ``ValueError``) for a bad address::

    nsqd_tcp_addresses: invalid address 'nohost': expected host:port, e.g. '127.0.0.1:4150'

Pure functions; this module imports nothing of nsqclient's, so every other module may use it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, TypeGuard
from urllib.parse import urlsplit

__all__ = [
    "AddressError",
    "join_host_port",
    "lookupd_addresses",
    "lookupd_base_url",
    "nsqd_addresses",
    "producer_address",
    "producer_http_address",
    "reply_port",
    "split_host_port",
]

#: what the messages suggest
NSQD_EXAMPLE = "127.0.0.1:4150"
LOOKUPD_EXAMPLE = "http://127.0.0.1:4161"
#: nsqlookupd's default HTTP port, suggested when an address has none
LOOKUPD_HTTP_PORT = 4161


class AddressError(ValueError):
    """A bad address.  The message is ``f"{argument}: {problem}"``; the two parts are kept apart
    for callers that name the argument their own way (an argparse flag)."""

    def __init__(self, argument: str, problem: str):
        super().__init__(f"{argument}: {problem}")
        self.argument = argument
        self.problem = problem


class _Bad(Exception):
    """What is wrong with one address (the message without the argument's name)."""


# ------------------------------------------------------------------------------ host:port


def _host_port(address: str) -> tuple[str, int]:
    """``"host:port"``/``"[v6]:port"`` -> ``(host, port)``, host without brackets; raise _Bad.
    An unbracketed IPv6 host (``"::1:4150"``) splits at the last colon (for a Connection's
    address, as it always did); :func:`nsqd_addresses` refuses it."""
    if "://" in address:
        bare = address.split("://", 1)[1].rstrip("/")
        raise _Bad(
            f"invalid address {address!r}: TCP addresses take no scheme; use {bare!r}"
            " (http:// addresses are for nsqlookupd and nsqd's HTTP API)"
        )
    host, sep, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if (
        not sep
        or not host
        or not (port.isascii() and port.isdigit())
        or any(c.isspace() or c in "[]" for c in host)
    ):
        raise _Bad(f"invalid address {address!r}: expected host:port, e.g. {NSQD_EXAMPLE!r}")
    if not 0 < int(port) < 65536:
        raise _Bad(f"invalid address {address!r}: the port must be a number from 1 to 65535")
    return host, int(port)


def split_host_port(address: str, argument: str = "address") -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` -> ``(host, port)``, the host without brackets.

    Raises TypeError for a non-str, :class:`AddressError` naming ``argument`` otherwise.
    """
    if not isinstance(address, str):
        raise TypeError(
            f"{argument}: expected a 'host:port' str, e.g. {NSQD_EXAMPLE!r},"
            f" not {type(address).__name__} {address!r}"
        )
    try:
        return _host_port(address.strip())
    except _Bad as exc:
        raise AddressError(argument, str(exc)) from None


def join_host_port(host: str, port: int | str) -> str:
    """``(host, port)`` -> ``"host:port"``, an IPv6 host in brackets (``"[::1]:4150"``)."""
    host = str(host)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


# ------------------------------------------------------------------------------ lookup replies


def reply_port(value: Any) -> Any:
    """A port of a lookup reply as an int when it is a string of digits (youzan and legacy
    replies send strings); anything else as it is."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return value


def _valid_port(port: Any) -> TypeGuard[int]:
    return isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536


def producer_address(p: Mapping[str, Any]) -> str:
    """The ``"host:tcp_port"`` to connect to for one producer entry of a lookup reply.

    The host is ``broadcast_address``; replies from nsqlookupd before 0.2.x only have
    ``address``.  The port may be an int or (youzan) a string of digits.  IPv6 hosts are
    bracketed (``"[::1]:4150"``).  Raises ValueError when the entry has no host or no port.
    """
    if not isinstance(p, Mapping):
        raise TypeError(f"a lookup producer entry is a dict, not {type(p).__name__}")
    host = p.get("broadcast_address") or p.get("address")
    if not host:
        raise ValueError(f"lookup producer entry has no broadcast_address: {dict(p)!r}")
    port = reply_port(p.get("tcp_port"))
    if not _valid_port(port):
        raise ValueError(f"lookup producer entry has no valid tcp_port: {dict(p)!r}")
    return join_host_port(host, port)


def producer_http_address(p: Mapping[str, Any]) -> str | None:
    """The ``"host:http_port"`` of one producer entry of a lookup reply (as
    :func:`producer_address`), or None when the entry names no valid HTTP port."""
    host = p.get("broadcast_address") or p.get("address") if isinstance(p, Mapping) else None
    port = reply_port(p.get("http_port")) if host else None
    if not host or not _valid_port(port):
        return None
    return join_host_port(host, port)


# ------------------------------------------------------------------------------ user input


def _nsqd(address: str) -> str:
    host, port = _host_port(address)
    if ":" in host and not address.startswith("["):
        raise _Bad(f"invalid address {address!r}: an IPv6 host goes in brackets, e.g. '[::1]:4150'")
    return join_host_port(host, port)


# ------------------------------------------------------------------------------ lookupd URLs


def _url(address: str, port_required: bool) -> str:
    """``host:port`` or ``http(s)://host:port[/path]`` -> the base URL; raise _Bad."""
    url = address if "://" in address else "http://" + address
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise _Bad(f"invalid address {address!r}: the scheme must be http or https")
    if not parts.hostname or any(c.isspace() for c in address):
        hint = ", an IPv6 host in brackets" if parts.netloc.count(":") > 1 else ""
        raise _Bad(
            f"invalid address {address!r}: expected host:port or http://host:port{hint},"
            f" e.g. {LOOKUPD_EXAMPLE!r}"
        )
    if parts.query or parts.fragment:
        raise _Bad(f"invalid address {address!r}: an address takes no query or fragment")
    try:
        port = parts.port
    except ValueError:  # not a number, or above 65535
        port = 0
    if port == 0:
        raise _Bad(f"invalid address {address!r}: the port must be a number from 1 to 65535")
    if port is None and port_required:
        path = parts.path.rstrip("/")
        shown = address.rstrip("/")
        suggestion = shown[: len(shown) - len(path)] + f":{LOOKUPD_HTTP_PORT}" + path
        raise _Bad(
            f"invalid address {address!r}: a port is required, e.g. {suggestion!r}"
            f" (nsqlookupd's HTTP port is {LOOKUPD_HTTP_PORT} unless it was changed)"
        )
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


def lookupd_base_url(address: str, argument: str = "address", *, port_required: bool = True) -> str:
    """``host:port`` or ``http(s)://host:port[/path]`` -> ``"http(s)://host:port[/path]"``.

    ``port_required=False`` lets ``"host"`` through (port 80 or 443, as a URL would); a
    lookupd address needs its port.  Raises TypeError for a non-str, :class:`AddressError`
    naming ``argument`` otherwise.
    """
    if not isinstance(address, str):
        raise TypeError(
            f"{argument}: expected an HTTP address str, e.g. {LOOKUPD_EXAMPLE!r},"
            f" not {type(address).__name__} {address!r}"
        )
    stripped = address.strip()
    if not stripped:
        raise AddressError(argument, f"empty address; pass e.g. {LOOKUPD_EXAMPLE!r}")
    try:
        return _url(stripped, port_required)
    except _Bad as exc:
        raise AddressError(argument, str(exc)) from None


def _lookupd(address: str) -> str:
    _url(address, port_required=True)
    return address.rstrip("/")


# ------------------------------------------------------------------------------ the lists


#: what a message of a wrong type says to pass, per kind of address
_PASS_NSQD = f"pass 'host:port' strings, e.g. {NSQD_EXAMPLE!r}"
_PASS_LOOKUPD = f"pass 'host:port' or 'http://host:port' strings, e.g. {LOOKUPD_EXAMPLE!r}"


def _is_pair(value: object) -> bool:
    """True for ``("127.0.0.1", 4150)``, a socket address rather than a list of addresses."""
    if not isinstance(value, tuple | list) or len(value) != 2:
        return False
    host, port = value
    if not isinstance(host, str) or not isinstance(port, int):
        return False
    try:
        _nsqd(host.strip())
    except _Bad:
        return True
    return False  # ["a:1", 2]: an address, then a wrong item


def _items(value: object, name: str, hint: str) -> Iterator[str]:
    """Each address of ``value``, stripped.  TypeError for a value that is not a str or a
    sequence of str (every item is checked before any is parsed), AddressError for an empty
    item.  ``hint`` ends the TypeError messages."""
    if isinstance(value, str):
        strings: list[object] = [value]
    elif isinstance(value, Sequence | AbstractSet) and not isinstance(
        value, bytes | bytearray | memoryview
    ):
        strings = list(value)
    else:
        raise TypeError(
            f"{name}: expected a str or a list of str, not {type(value).__name__} {value!r}; {hint}"
        )
    for text in strings:
        if isinstance(text, str):
            continue
        if _is_pair(value):
            raise TypeError(f"{name}: {value!r} is a (host, port) pair, not addresses; {hint}")
        raise TypeError(f"{name}: {text!r} ({type(text).__name__}) is not a str; {hint}")
    for text in strings:
        assert isinstance(text, str)
        for item in text.split(","):
            item = item.strip()
            if not item:
                where = f" in {text!r}" if text.strip() else ""
                raise AddressError(name, f"empty address{where}; {hint}")
            yield item


def nsqd_addresses(value: str | Sequence[str] | None, name: str) -> list[str]:
    """The nsqd TCP addresses of ``value``, normalised (``"host:port"``, ``"[v6]:port"``).

    ``value``: a str (a comma-separated list), a list/tuple/set of str, or None (no address).
    ``name``: the argument, for the messages (``"nsqd_tcp_addresses"``).
    Raises TypeError or :class:`AddressError` naming ``name`` and the bad item.
    """
    if value is None:
        return []
    found = []
    for item in _items(value, name, _PASS_NSQD):
        try:
            found.append(_nsqd(item))
        except _Bad as exc:
            raise AddressError(name, str(exc)) from None
    return found


def lookupd_addresses(value: str | Sequence[str] | None, name: str) -> list[str]:
    """The nsqlookupd HTTP addresses of ``value``, each as given without the surrounding
    whitespace and a trailing ``/`` (``"127.0.0.1:4161"``, ``"http://lookupd:4161"``).

    ``value``: a str (a comma-separated list), a list/tuple/set of str, or None (no address).
    ``name``: the argument, for the messages (``"lookupd_http_addresses"``).
    Raises TypeError or :class:`AddressError` naming ``name`` and the bad item.
    """
    if value is None:
        return []
    found = []
    for item in _items(value, name, _PASS_LOOKUPD):
        try:
            found.append(_lookupd(item))
        except _Bad as exc:
            raise AddressError(name, str(exc)) from None
    return found
