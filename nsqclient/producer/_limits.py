"""A Producer's size limits: what it refuses at the call, before any byte is written.

nsqd refuses a PUB/DPUB body above its ``--max-msg-size`` (1 MiB by default) and an MPUB body
above its ``--max-body-size`` (5 MiB), and it does so from the size prefix, before reading the
body: it closes the connection with the rest of the command unread, and every publish in
flight on that connection fails with it (real nsqd often resets the connection, so that
nobody even learns why).  So, as Kafka's producer checks ``max.request.size``, a Producer checks
every publish against :class:`Limits` at the call and raises BadMessageError or BadBodyError
there, naming the limit and how to raise it; nothing around it is disturbed.

The limits are the Producer's ``max_msg_size`` and ``max_body_size`` options, and what each
nsqd says of its own (``GET /config/max_msg_size`` and ``/config/max_body_size`` on its HTTP
port, which lookupd names, or ``nsqd_http_addresses``; IDENTIFY's reply does not say).  An
option the user gave is the client's own check; an nsqd's value, when lower, is enforced too
(nsqd would refuse anyway).  An option left at its default gives way to what the nsqd say,
higher or lower.  With several nsqd, the lowest value any of them stated counts.  Asking is
done once per nsqd, on a thread of its own after its first connection, bounded by
``dial_timeout``: it never delays or fails a publish (until nsqd has answered, the options
apply).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence

from ..errors import BadBodyError, BadMessageError, NSQError
from ..http import NsqdHTTPClient

__all__ = ["Limits", "body_size", "fetch_limits"]

logger = logging.getLogger("nsqclient.producer")


class Limits:
    """The sizes a Producer's publishes are checked against (see the module doc).

    Args:
        max_msg_size: the option's value (bytes).
        max_body_size: the option's value (bytes).
        given: the names of the two options the user gave (those are never raised by nsqd).

    Attributes:
        msg: the largest PUB/DPUB body or MPUB message accepted now (bytes).
        body: the largest MPUB body accepted now (bytes).
    """

    def __init__(self, max_msg_size: int, max_body_size: int, given: Iterable[str] = ()):
        self._options = (max_msg_size, max_body_size)
        self._given = frozenset(given)
        self._lock = threading.Lock()
        #: nsqd address -> (max_msg_size, max_body_size) it stated
        self.learned: dict[str, tuple[int, int]] = {}
        self.msg = max_msg_size
        self.body = max_body_size
        #: where msg and body come from, for the errors
        self._sources = ("the max_msg_size option", "the max_body_size option")

    def learn(self, address: str, max_msg_size: int, max_body_size: int) -> None:
        """nsqd at ``address`` stated its limits: recompute :attr:`msg` and :attr:`body`."""
        with self._lock:
            self.learned[address] = (max_msg_size, max_body_size)
            self.msg, msg_source = self._effective(0, "max_msg_size")
            self.body, body_source = self._effective(1, "max_body_size")
            self._sources = (msg_source, body_source)
        logger.debug("nsqd %s: max_msg_size %d, max_body_size %d", address, *self.learned[address])

    def _effective(self, i: int, name: str) -> tuple[int, str]:
        option = self._options[i]
        if not self.learned:
            return option, f"the {name} option"
        address, stated = min(((a, v[i]) for a, v in self.learned.items()), key=lambda x: x[1])
        flag = "--" + name.replace("_", "-")
        nsqd = f"nsqd {address}'s {flag}"
        if name in self._given and option <= stated:
            return option, f"the {name} option (nsqd takes up to {stated}: {nsqd})"
        return stated, nsqd

    def check_message(self, size: int, command: str) -> None:
        """BadMessageError when a ``command`` (PUB, DPUB, MPUB) message of ``size`` bytes is
        above :attr:`msg`."""
        if size > self.msg:
            raise BadMessageError(
                f"{command} message too big {size} > {self.msg}: refused before sending,"
                f" nothing was sent (the limit is {self._sources[0]}; to send it, raise nsqd's"
                " --max-msg-size and the Producer's max_msg_size)"
            )

    def check_mpub(self, sizes: list[int]) -> None:
        """BadBodyError when an MPUB of messages of ``sizes`` bytes has a body above
        :attr:`body`, BadMessageError when one of them is above :attr:`msg`."""
        body = 4 + 4 * len(sizes) + sum(sizes)
        if body > self.body:
            raise BadBodyError(
                f"MPUB body too big {body} > {self.body}: refused before sending, nothing was"
                f" sent (the limit is {self._sources[1]}; send fewer messages per mpub(), or"
                " raise nsqd's --max-body-size and the Producer's max_body_size)"
            )
        if body - 4 - 4 * len(sizes) > self.msg:  # one of them may be too big
            for size in sizes:
                self.check_message(size, "MPUB")

    def check_body(self, body: object) -> None:
        """A PUB body (of any form the encoders take) checked against :attr:`msg`; what is
        not a body is left to the encoders, which say what is wrong with it."""
        size = body_size(body)
        if size is not None:
            self.check_message(size, "PUB")

    def check_bodies(self, bodies: object) -> None:
        """An MPUB's bodies checked against the limits (bad input is the encoders')."""
        if isinstance(bodies, Sequence) and not isinstance(bodies, str | bytes):
            sizes = [body_size(b) for b in bodies]
            self.check_mpub([s for s in sizes if s is not None])


def body_size(body: object) -> int | None:
    """Bytes of a body as it goes on the wire (a str as UTF-8); None for what is no body."""
    if isinstance(body, str):
        return len(body.encode())
    if isinstance(body, memoryview):
        return body.nbytes
    return len(body) if isinstance(body, bytes | bytearray) else None


def fetch_limits(http_address: str, timeout: float) -> tuple[int, int]:
    """``(max_msg_size, max_body_size)`` as the nsqd at ``http_address`` (``"host:port"`` or
    ``"http://host:port"``) states them; NSQError or ValueError when it does not answer so,
    within ``timeout`` seconds for each of the two requests."""
    with NsqdHTTPClient(http_address, timeout=timeout) as client:
        values = (client.config("max_msg_size"), client.config("max_body_size"))
    for value in values:
        if type(value) is not int or value <= 0:
            raise ValueError(f"nsqd {http_address} answered {values!r} for its size limits")
    return values


def learn_in_background(
    address: str,
    http_address: str,
    timeout: float,
    learned: Callable[[str, int, int], None],
    done: Callable[[bool], None],
) -> threading.Thread:
    """Ask nsqd ``address`` its limits at ``http_address`` on a thread of its own,
    ``nsq-limits-<address>`` (returned; it ends within twice ``timeout``);
    ``learned(address, max_msg_size, max_body_size)`` when it answers, then
    ``done(answered)`` in any case."""

    def run() -> None:
        answered = False
        try:
            msg, body = fetch_limits(http_address, timeout)
        except (NSQError, ValueError, OSError) as exc:
            logger.info(
                "could not read the size limits of nsqd %s at %s (%s); the max_msg_size and"
                " max_body_size options apply",
                address,
                http_address,
                exc,
            )
        else:
            learned(address, msg, body)
            answered = True
        finally:
            done(answered)

    thread = threading.Thread(target=run, name=f"nsq-limits-{address}", daemon=True)
    thread.start()
    return thread
