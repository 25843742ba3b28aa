"""Every option of Connection, Producer and Consumer: its default, its range and its meaning.

Options are validated here, in one place, when a Config is built, so that a bad value fails at
the call site (``Consumer(..., max_in_flight=-1)``) with a message naming the option.  Durations
are seconds (floats); they become milliseconds only on the wire.
"""

from __future__ import annotations

import difflib
import inspect
import math
import socket
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

from .checks import check_float, check_int

__all__ = [
    "Option",
    "OPTIONS",
    "Config",
    "CommonOptions",
    "ConsumerOptions",
    "ProducerOptions",
    "ConfigOptions",
    "check_owner",
    "options_help",
]


@dataclass(frozen=True)
class Option:
    """One option: ``kind`` is the Python type accepted (int also accepted for float)."""

    name: str
    default: Any
    kind: type | tuple[type, ...]
    doc: str
    min: float | None = None
    max: float | None = None
    choices: tuple[Any, ...] | None = None
    nullable: bool = False
    #: exact values accepted outside [min, max] (nsqd's -1 = disabled, 0 = its default)
    special: tuple[Any, ...] = ()
    #: a float option that accepts infinity (a cap that may be "none"); NaN is never accepted
    infinite: bool = False
    #: the one class that takes it ("Consumer" or "Producer"); None: both do
    owner: str | None = None

    @property
    def unit(self) -> str | None:
        """The unit named in error messages: the first of seconds/bytes the doc mentions."""
        for unit in ("seconds", "bytes"):
            if unit in self.doc:
                return unit
        return None

    @property
    def accepted(self) -> str:
        """The values accepted, in words: bounds, choices, special values, None."""
        kind = self.kind if isinstance(self.kind, tuple) else (self.kind,)
        if self.choices is not None:
            text = "one of " + ", ".join(f"``{value_text(c)}``" for c in self.choices)
        elif bool in kind:
            text = "True or False"
        elif self.min is not None and self.max is not None:
            text = f"{value_text(self.min)} to {value_text(self.max)}"
        elif self.min is not None:
            text = f">= {value_text(self.min)}"
        elif self.max is not None:
            text = f"<= {value_text(self.max)}"
        else:
            text = " or ".join(k.__name__ for k in kind)
        if self.special:
            text += "; also " + ", ".join(value_text(v) for v in self.special)
        if self.infinite:
            text += "; inf"
        if self.nullable:
            text += "; None"
        return text

    def validate(self, value: Any) -> Any:
        """``value`` checked (and an int made a float for a float option); TypeError for a wrong
        type (a bool is not a number), ValueError out of range, both naming the option."""
        if value is None and self.nullable:
            return None
        kind = self.kind
        if kind is float:
            value = check_float(value, self.name, self.unit, infinite=self.infinite)
        elif kind is int:
            value = check_int(value, self.name, self.unit)
        elif not isinstance(value, kind):
            names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
            raise TypeError(f"{self.name} must be {names}, not {type(value).__name__} {value!r}")
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"{self.name} must be one of {self.choices}, not {value!r}")
        if value in self.special:
            return value
        if self.min is not None and value < self.min:
            raise ValueError(f"{self.name} must be >= {self.min}, not {value!r} ({self.doc})")
        if self.max is not None and value > self.max:
            raise ValueError(f"{self.name} must be <= {self.max}, not {value!r} ({self.doc})")
        return value


def value_text(value: Any) -> str:
    """An option's value as the documentation shows it (``1`` for 1.0, ``inf``, ``'text'``)."""
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value) if isinstance(value, str) else str(value)


_HOUR = 3600.0

OPTIONS: dict[str, Option] = {
    o.name: o
    for o in [
        # --- connection
        Option("dial_timeout", 1.0, float, "seconds to wait for the TCP connect", 0.001, _HOUR),
        Option(
            "read_timeout",
            60.0,
            float,
            "seconds without any byte from nsqd before the connection is declared dead"
            " (2x heartbeat_interval is used when that is shorter)",
            0.1,
            _HOUR,
        ),
        Option(
            "write_timeout",
            1.0,
            float,
            "seconds one write to nsqd may take (longer means nsqd is not reading) before the"
            " connection is closed and what was in flight on it fails",
            0.001,
            _HOUR,
        ),
        Option(
            "handshake_timeout",
            5.0,
            float,
            "seconds for magic, IDENTIFY, upgrades, AUTH",
            0.01,
            _HOUR,
        ),
        Option(
            "heartbeat_interval",
            30.0,
            float,
            "seconds between nsqd heartbeats (at least 1); -1 disables them, 0 = nsqd's default",
            1.0,
            _HOUR,
            special=(-1.0, 0.0),
        ),
        Option(
            "output_buffer_size",
            16384,
            int,
            "bytes nsqd buffers before flushing to this client (at least 64); -1 disables"
            " buffering, 0 = nsqd's default",
            64,
            None,
            special=(-1, 0),
        ),
        Option(
            "output_buffer_timeout",
            0.25,
            float,
            "seconds nsqd waits before flushing its output buffer (at least nsqd's"
            " --min-output-buffer-timeout, 0.025 by default); -1 disables it, 0 = nsqd's default",
            0.025,
            _HOUR,
            special=(-1.0, 0.0),
        ),
        Option(
            "client_id",
            None,
            str,
            "client_id sent in IDENTIFY (default: short hostname)",
            nullable=True,
        ),
        Option("hostname", None, str, "hostname sent in IDENTIFY (default: FQDN)", nullable=True),
        Option(
            "user_agent",
            None,
            str,
            "user_agent sent in IDENTIFY (default nsqclient/<v>)",
            nullable=True,
        ),
        Option(
            "sample_rate", 0, int, "percentage of messages nsqd sends this client; 0 = all", 0, 99
        ),
        Option(
            "msg_timeout",
            None,
            float,
            "seconds nsqd waits for FIN/REQ/TOUCH before requeueing, at least 1 (None: nsqd's"
            " default)",
            1.0,
            None,
            nullable=True,
        ),
        Option("tls_v1", False, bool, "negotiate TLS (stdlib ssl)"),
        Option("tls_ca_file", None, str, "CA bundle to verify nsqd's certificate", nullable=True),
        Option("tls_cert_file", None, str, "client certificate (PEM)", nullable=True),
        Option("tls_key_file", None, str, "client private key (PEM)", nullable=True),
        Option("tls_verify", True, bool, "verify nsqd's certificate and host name"),
        Option(
            "tls_server_name",
            None,
            str,
            "host name to verify (default: the host dialled)",
            nullable=True,
        ),
        Option("snappy", False, bool, "negotiate snappy compression"),
        Option("deflate", False, bool, "negotiate deflate compression"),
        Option("deflate_level", 6, int, "deflate level 1-9 (bounded by nsqd's max)", 1, 9),
        Option(
            "auth_secret",
            None,
            (str, bytes),
            "secret sent with AUTH when nsqd requires it",
            nullable=True,
        ),
        Option(
            "max_frame_size",
            16 * 1024 * 1024,
            int,
            "largest frame accepted from nsqd, bytes",
            1024,
            None,
        ),
        Option("youzan", False, bool, "speak youzan's NSQ: raw 16-byte message ids"),
        Option("extend_support", False, bool, "youzan: ask for message extension headers"),
        Option(
            "trace",
            False,
            bool,
            "youzan: publish with PUB_TRACE and log each reply (message id, trace id, offset,"
            " raw size); consumers log each message's trace id and arrival",
        ),
        Option(
            "leader_retries",
            100,
            int,
            "youzan: times at most a publish refused before anything was stored"
            " (E_FAILED_ON_NOT_LEADER, _NOT_WRITABLE, E_TOPIC_NOT_EXIST, E_PUB_FAILED exiting"
            " ...) is retried after a fresh lookup, never past pub_timeout (waits 0.1 s,"
            " doubling up to 1 s; the default outlasts a pub_timeout of 90 s)",
            0,
            1000,
            owner="Producer",
        ),
        # --- consumer
        Option(
            "max_in_flight",
            1,
            int,
            "messages in flight across all connections",
            0,
            None,
            owner="Consumer",
        ),
        Option("concurrency", 1, int, "handler worker threads", 1, 4096, owner="Consumer"),
        Option(
            "max_tries",
            5,
            int,
            "attempts after which giving_up runs; 0 = never",
            0,
            65535,
            owner="Consumer",
        ),
        Option(
            "default_requeue_delay",
            90.0,
            float,
            "seconds; REQ delay is this x attempts, capped by max_requeue_delay",
            0,
            None,
            owner="Consumer",
        ),
        Option(
            "max_requeue_delay",
            900.0,
            float,
            "seconds, cap on a REQ delay (inf: no cap)",
            0,
            None,
            infinite=True,
            owner="Consumer",
        ),
        Option(
            "max_backoff_duration",
            128.0,
            float,
            "seconds, cap on a backoff pause; 0 disables backoff",
            0,
            None,
            owner="Consumer",
        ),
        Option(
            "backoff_multiplier",
            1.0,
            float,
            "seconds, base of the backoff duration",
            0.0,
            None,
            owner="Consumer",
        ),
        Option(
            "backoff_strategy",
            "exponential",
            str,
            "how backoff grows with failures",
            choices=("exponential", "full_jitter"),
            owner="Consumer",
        ),
        Option("lookupd_poll_interval", 60.0, float, "seconds between lookupd queries", 0.01, None),
        Option(
            "lookupd_poll_jitter",
            0.3,
            float,
            "fraction of the interval added at random",
            0,
            1,
            owner="Consumer",
        ),
        Option(
            "lookupd_request_timeout", 2.0, float, "seconds per lookupd HTTP request", 0.01, None
        ),
        Option(
            "low_rdy_idle_timeout",
            10.0,
            float,
            "seconds without a message before a connection's RDY may be moved elsewhere",
            0.01,
            None,
            owner="Consumer",
        ),
        Option(
            "low_rdy_timeout",
            30.0,
            float,
            "seconds a connection may hold RDY while max_in_flight < connections",
            0.01,
            None,
            owner="Consumer",
        ),
        Option(
            "rdy_redistribute_interval",
            5.0,
            float,
            "seconds between RDY redistributions when max_in_flight < connections",
            0.01,
            None,
            owner="Consumer",
        ),
        Option(
            "reconnect_interval",
            1.0,
            float,
            "seconds, base delay before reconnecting a direct nsqd address (or, youzan, looking"
            " up a partition whose connection closed again)",
            0.0,
            None,
        ),
        Option(
            "max_reconnect_interval",
            60.0,
            float,
            "seconds, cap on the reconnect delay",
            0.0,
            None,
        ),
        # --- producer
        Option(
            "pub_timeout",
            10.0,
            float,
            "seconds pub()/mpub()/dpub() wait for nsqd's answer",
            0.001,
            None,
            owner="Producer",
        ),
        Option(
            "pub_retries",
            0,
            int,
            "times pub() resends a publish whose outcome is unknown (connection died in flight);"
            " >0 may store duplicates",
            0,
            100,
            owner="Producer",
        ),
        Option(
            "max_msg_size",
            1024 * 1024,
            int,
            "bytes: a PUB/DPUB body or one message of an MPUB above this raises BadMessageError"
            " at the call, nothing sent (nsqd's --max-msg-size; nsqd's own value, read from its"
            " HTTP API where the Producer knows it, is used when this is not given and also"
            " enforced when lower)",
            1,
            None,
            owner="Producer",
        ),
        Option(
            "max_body_size",
            5 * 1024 * 1024,
            int,
            "bytes: an MPUB whose body (4 + 4 per message + the messages) is above this raises"
            " BadBodyError at the call, nothing sent (nsqd's --max-body-size; learned from nsqd"
            " as max_msg_size is)",
            1,
            None,
            owner="Producer",
        ),
        Option(
            "join_publishes",
            True,
            bool,
            "PUBs of one topic that queue up on a connection one after another (pipelined"
            " pub_async(), many threads' pub()) go out as one MPUB of up to 16 KiB, each"
            " answered by nsqd's one answer (far less work for nsqd; order kept; never by"
            " lookup or with youzan); False: each PUB on its own",
            owner="Producer",
        ),
        Option(
            "exit_flush_timeout",
            5.0,
            float,
            "seconds a Producer that was not closed waits at interpreter exit for the publishes"
            " it accepted, before it logs how many it could not deliver",
            0.0,
            None,
            owner="Producer",
        ),
    ]
}


#: The TLS options that mean nothing unless ``tls_v1`` is on, with the value that says "not set".
_TLS_SETTINGS = {
    "tls_ca_file": None,
    "tls_cert_file": None,
    "tls_key_file": None,
    "tls_server_name": None,
    "tls_verify": True,
}

#: nsqd's heartbeat interval when IDENTIFY leaves it to nsqd (``heartbeat_interval=0``), seconds.
_NSQD_DEFAULT_HEARTBEAT = 30.0


def check_pairs(values: Mapping[str, Any]) -> None:
    """ValueError naming both options when two options contradict each other.

    Each of these would otherwise fail only later, on a connection's or the discovery thread's
    first handshake, far from the call that set them:

    * ``tls_key_file`` without ``tls_cert_file`` (the certificate file alone is fine: it may
      hold the key too);
    * any TLS setting (``tls_ca_file``, ``tls_cert_file``, ``tls_key_file``,
      ``tls_server_name``, ``tls_verify=False``) without ``tls_v1=True``.  go-nsq and pynsq
      ignore them then and talk in plain text; nsqclient refuses rather than send in the clear
      what the caller meant to encrypt (``tls_v1=True`` turns TLS on);
    * ``snappy`` and ``deflate`` together (nsqd refuses that IDENTIFY: E_IDENTIFY_FAILED);
    * ``extend_support`` without ``youzan`` (youzan's extension; its messages carry headers a
      classic nsqd never sends);
    * ``read_timeout`` not above the heartbeat interval (an idle connection would be declared
      dead between two heartbeats; go-nsq refuses it too).
    """
    if values["tls_key_file"] is not None and values["tls_cert_file"] is None:
        raise ValueError(
            "tls_key_file needs tls_cert_file: give the client certificate as tls_cert_file"
            " (tls_cert_file alone is enough when it holds the key too)"
        )
    if not values["tls_v1"]:
        given = [name for name, unset in _TLS_SETTINGS.items() if values[name] != unset]
        if given:
            shown = ", ".join(f"{name}={values[name]!r}" for name in given)
            raise ValueError(
                f"{shown} given but tls_v1 is False: pass tls_v1=True to use TLS (without it"
                " these options would be ignored and the connection would be plain text)"
            )
    if values["snappy"] and values["deflate"]:
        raise ValueError(
            "snappy and deflate cannot both be on: nsqd refuses the IDENTIFY with"
            " E_IDENTIFY_FAILED; choose one compression"
        )
    if values["extend_support"] and not values["youzan"]:
        raise ValueError("extend_support is youzan's extension: it needs youzan=True")
    heartbeat = values["heartbeat_interval"]
    if heartbeat != -1:
        heartbeat = heartbeat or _NSQD_DEFAULT_HEARTBEAT
        if values["read_timeout"] <= heartbeat:
            default = "" if values["heartbeat_interval"] else ", nsqd's default"
            raise ValueError(
                f"read_timeout ({values['read_timeout']:g} s) must be above heartbeat_interval"
                f" ({heartbeat:g} s{default}): an idle connection gets nothing but heartbeats"
                " and would be declared dead between two of them"
            )


def check_owner(options: Mapping[str, Any], cls: str) -> None:
    """TypeError naming the first of ``options`` that only the other class takes, for the
    class named ``cls`` ("Consumer" or "Producer"); unknown names are left to :class:`Config`."""
    for name in options:
        opt = OPTIONS.get(name)
        if opt is not None and opt.owner is not None and opt.owner != cls:
            raise TypeError(f"{name} is a {opt.owner} option ({opt.doc}); {cls} does not take it")


# The options as a type checker sees them, for ``**options`` (PEP 692): a misspelt or
# mistyped option is flagged where it is passed.  Kept equal to OPTIONS and to Config's
# annotations by tests/test_config.py.


class CommonOptions(TypedDict, total=False):
    """The options both a Consumer and a Producer take (those of their connections)."""

    dial_timeout: float
    read_timeout: float
    write_timeout: float
    handshake_timeout: float
    heartbeat_interval: float
    output_buffer_size: int
    output_buffer_timeout: float
    client_id: str | None
    hostname: str | None
    user_agent: str | None
    sample_rate: int
    msg_timeout: float | None
    tls_v1: bool
    tls_ca_file: str | None
    tls_cert_file: str | None
    tls_key_file: str | None
    tls_verify: bool
    tls_server_name: str | None
    snappy: bool
    deflate: bool
    deflate_level: int
    auth_secret: str | bytes | None
    max_frame_size: int
    youzan: bool
    extend_support: bool
    trace: bool
    lookupd_poll_interval: float
    lookupd_request_timeout: float
    reconnect_interval: float
    max_reconnect_interval: float


class ConsumerOptions(CommonOptions, total=False):
    """The keyword options of :class:`~nsqclient.Consumer`: :class:`CommonOptions` and these."""

    max_in_flight: int
    concurrency: int
    max_tries: int
    default_requeue_delay: float
    max_requeue_delay: float
    max_backoff_duration: float
    backoff_multiplier: float
    backoff_strategy: str
    lookupd_poll_jitter: float
    low_rdy_idle_timeout: float
    low_rdy_timeout: float
    rdy_redistribute_interval: float


class ProducerOptions(CommonOptions, total=False):
    """The keyword options of :class:`~nsqclient.Producer`: :class:`CommonOptions` and these."""

    leader_retries: int
    pub_timeout: float
    pub_retries: int
    max_msg_size: int
    max_body_size: int
    join_publishes: bool
    exit_flush_timeout: float


class ConfigOptions(ConsumerOptions, ProducerOptions, total=False):
    """Every option: the keyword arguments of :class:`Config`."""


class Config:
    """Validated options.  ``Config(max_in_flight=10)``; read them as attributes.

    Unknown names raise TypeError with the closest known name; bad values raise TypeError or
    ValueError naming the option, and so do options that only make sense together (see
    :func:`check_pairs`).  Every option is a typed attribute (the annotations below, kept equal
    to :data:`OPTIONS` by a test) stored in a slot, so reading one costs a plain attribute read.
    A Config is immutable: :meth:`replace` makes a changed copy.
    """

    # One annotation per option of OPTIONS, in the same order (defaults, ranges and meanings
    # live in OPTIONS; tests/test_config.py fails when the two drift apart).
    dial_timeout: float
    read_timeout: float
    write_timeout: float
    handshake_timeout: float
    heartbeat_interval: float
    output_buffer_size: int
    output_buffer_timeout: float
    client_id: str | None
    hostname: str | None
    user_agent: str | None
    sample_rate: int
    msg_timeout: float | None
    tls_v1: bool
    tls_ca_file: str | None
    tls_cert_file: str | None
    tls_key_file: str | None
    tls_verify: bool
    tls_server_name: str | None
    snappy: bool
    deflate: bool
    deflate_level: int
    auth_secret: str | bytes | None
    max_frame_size: int
    youzan: bool
    extend_support: bool
    trace: bool
    leader_retries: int
    max_in_flight: int
    concurrency: int
    max_tries: int
    default_requeue_delay: float
    max_requeue_delay: float
    max_backoff_duration: float
    backoff_multiplier: float
    backoff_strategy: str
    lookupd_poll_interval: float
    lookupd_poll_jitter: float
    lookupd_request_timeout: float
    low_rdy_idle_timeout: float
    low_rdy_timeout: float
    rdy_redistribute_interval: float
    reconnect_interval: float
    max_reconnect_interval: float
    pub_timeout: float
    pub_retries: int
    max_msg_size: int
    max_body_size: int
    join_publishes: bool
    exit_flush_timeout: float

    __slots__ = tuple(OPTIONS)

    def __init__(self, **options: Unpack[ConfigOptions]) -> None:
        values = {name: opt.default for name, opt in OPTIONS.items()}
        for name, value in options.items():
            opt = OPTIONS.get(name)
            if opt is None:
                close = difflib.get_close_matches(name, OPTIONS, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise TypeError(f"unknown option {name!r}{hint}")
            values[name] = opt.validate(value)
        check_pairs(values)
        set_slot = object.__setattr__
        for name, value in values.items():
            set_slot(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Config is immutable; use replace()")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("Config is immutable; use replace()")

    def replace(self, **options: Unpack[ConfigOptions]) -> Config:
        """A copy with some options changed (validated)."""
        merged = {k: v for k, v in self.as_dict().items() if v != OPTIONS[k].default}
        merged.update(options)
        return Config(**merged)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_from_dict, (self.as_dict(),))

    def as_dict(self) -> dict[str, Any]:
        """Every option and its value (a new dict)."""
        return {name: getattr(self, name) for name in OPTIONS}

    def __repr__(self) -> str:
        changed = {k: v for k, v in self.as_dict().items() if v != OPTIONS[k].default}
        if "auth_secret" in changed:
            changed["auth_secret"] = "***"
        return f"Config({', '.join(f'{k}={v!r}' for k, v in changed.items())})"


def options_help(cls: str | None) -> str:
    """The options part of the docstring of the class named ``cls`` ("Consumer" or
    "Producer"; None: every option, for :class:`Config`), made from :data:`OPTIONS`: each
    option's name, type, default, unit, accepted values and meaning, as ``help()`` shows them."""
    hints = Config.__annotations__
    lines = [
        "Options (keyword arguments, checked when it is made: a wrong type or a value out of"
        " range raises TypeError or ValueError naming the option):",
        "",
    ]
    for name, opt in OPTIONS.items():
        if cls is not None and opt.owner not in (None, cls):
            continue
        unit = f", {opt.unit}" if opt.unit else ""
        lines.append(
            f"``{name}`` ({hints[name]}, default ``{value_text(opt.default)}``{unit};"
            f" accepted: {opt.accepted})"
        )
        lines.append(
            textwrap.fill(opt.doc, 92, initial_indent="    ", subsequent_indent="    ",
                          break_long_words=False, break_on_hyphens=False)
        )  # fmt: skip
    return "\n".join(lines)


def add_options_help(cls: type, owner: str | None) -> None:
    """Append :func:`options_help` to ``cls``'s docstring (none under ``python -OO``)."""
    if cls.__doc__ is not None:
        cls.__doc__ = inspect.cleandoc(cls.__doc__) + "\n\n" + options_help(owner)


add_options_help(Config, None)


def _from_dict(values: dict[str, Any]) -> Config:
    return Config(**values)


def identify_payload(config: Config, version: str) -> dict[str, Any]:
    """The IDENTIFY JSON for ``config`` (durations converted to milliseconds)."""
    fqdn = socket.getfqdn()

    def ms(seconds: float) -> int:
        return -1 if seconds == -1 else int(round(seconds * 1000))

    payload: dict[str, Any] = {
        "client_id": config.client_id or fqdn.split(".")[0],
        "hostname": config.hostname or fqdn,
        "user_agent": config.user_agent or f"nsqclient/{version}",
        "feature_negotiation": True,
        "heartbeat_interval": ms(config.heartbeat_interval),
        "output_buffer_size": config.output_buffer_size,
        "output_buffer_timeout": ms(config.output_buffer_timeout),
        "tls_v1": config.tls_v1,
        "snappy": config.snappy,
        "deflate": config.deflate,
        "deflate_level": config.deflate_level,
        "sample_rate": config.sample_rate,
    }
    if config.msg_timeout is not None:
        payload["msg_timeout"] = ms(config.msg_timeout)
    if config.extend_support:
        payload["extend_support"] = True
    return payload
