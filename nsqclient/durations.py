"""The one duration parser of the command-line tools and of the embedded servers' flags.

A duration is a plain number of seconds (``"60"``, ``"0.5"``) or a Go duration as
``time.ParseDuration`` reads it (``"60s"``, ``"1m30s"``, ``"250ms"``, ``"-1.5h"``).  Go's tools
accept only the second form (and ``"0"``); taking both means a flag reads the same in
``nsqclient``, ``nsqclient-nsqd`` and ``python -m nsqclient.testing``.

This module imports nothing of ours, so that the embedded servers (``nsqclient.testing``),
which must not depend on the client, can share it with the command-line tools.
"""

from __future__ import annotations

import argparse
import math
import re

__all__ = ["DurationError", "parse_duration"]

_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


class DurationError(argparse.ArgumentTypeError, ValueError):
    """Not a duration.  An :class:`argparse.ArgumentTypeError` (argparse shows its message) and a
    :class:`ValueError` (for callers that parse flags by other means)."""


def parse_duration(text: str) -> float:
    """Seconds in ``text``: a finite number of seconds (``"2"``, ``"0.5"``) or a Go duration
    (``"2s"``, ``"1m30s"``, ``"250ms"``, with an optional sign).  Raises :class:`DurationError`
    otherwise."""
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(value):
            raise DurationError(f"invalid duration {text!r} (not a finite number of seconds)")
        return value
    body = text[1:] if text[:1] in ("+", "-") else text
    pos = 0
    total = 0.0
    while pos < len(body):
        match = _PART.match(body, pos)
        if match is None:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if not body or pos != len(body):
        raise DurationError(
            f"invalid duration {text!r} (seconds like 2.5, or Go's form like 2s, 500ms, 1m30s)"
        )
    return -total if text.startswith("-") else total
