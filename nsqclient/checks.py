"""The "a number, not a bool" checks every public call makes on its numeric arguments.

``True`` is an ``int`` to Python, so ``isinstance(x, int)`` lets ``pub_timeout=True`` through as
one second and ``rdy(True)`` as ``RDY 1``.  These pure functions refuse bools, NaN and infinities
and say what was expected, naming the argument and its unit::

    check_float(timeout, "timeout", "seconds", min=0, min_exclusive=True)
    # ValueError: timeout must be a positive number of seconds, not 0

A value of the wrong type raises :class:`NotANumberError`, which is both a ``TypeError`` (what
Python raises for a wrong type) and a ``ValueError`` (what the encoders raised before there was
one helper), so code catching either keeps working.  A number out of range raises ``ValueError``.

This module imports nothing of nsqclient's: every other module may use it.
"""

from __future__ import annotations

import math
from typing import TypeGuard

__all__ = ["NotANumberError", "is_int", "is_number", "check_int", "check_float"]


class NotANumberError(TypeError, ValueError):
    """A numeric argument got a bool, a str, None or another non-number."""


def is_int(value: object) -> TypeGuard[int]:
    """True for an ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    """True for an ``int`` or ``float`` that is not a ``bool`` (NaN and infinities included)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _fmt(bound: float) -> str:
    return str(bound) if isinstance(bound, int) else f"{bound:g}"


def _expected(
    kind: str, unit: str | None, lo: float | None, lo_exclusive: bool, hi: float | None
) -> str:
    of = f" of {unit}" if unit else ""
    if lo == 0 and hi is None:
        return f"a {'positive' if lo_exclusive else 'non-negative'} {kind}{of}"
    bounds = []
    if lo is not None and hi is not None and not lo_exclusive:
        bounds.append(f"from {_fmt(lo)} to {_fmt(hi)}")
        lo = hi = None
    if lo is not None:
        bounds.append(f"{'>' if lo_exclusive else '>='} {_fmt(lo)}")
    if hi is not None:
        bounds.append(f"<= {_fmt(hi)}")
    return f"{'an' if kind == 'int' else 'a'} {kind}{of}" + (
        f" ({' and '.join(bounds)})" if bounds else ""
    )


def _check_range(
    value: float,
    original: object,
    name: str,
    expected: str,
    lo: float | None,
    lo_exclusive: bool,
    hi: float | None,
) -> None:
    if (lo is not None and (value <= lo if lo_exclusive else value < lo)) or (
        hi is not None and value > hi
    ):
        raise ValueError(f"{name} must be {expected}, not {original!r}")


def check_int(
    value: object,
    name: str,
    unit: str | None = None,
    *,
    min: int | None = None,  # noqa: A002 - reads best at the call site
    max: int | None = None,  # noqa: A002
) -> int:
    """``value`` if it is an int (not a bool) within ``[min, max]``; else raise.

    ``name`` and ``unit`` ("milliseconds", "bytes"...) make the message:
    ``"REQ delay must be a non-negative int of milliseconds, not 1.5"``.
    Raises :class:`NotANumberError` for a non-int (a float too), ValueError out of range.
    """
    expected = _expected("int", unit, min, False, max)
    if not is_int(value):
        raise NotANumberError(f"{name} must be {expected}, not {value!r}")
    _check_range(value, value, name, expected, min, False, max)
    return value


def check_float(
    value: object,
    name: str,
    unit: str | None = None,
    *,
    min: float | None = None,  # noqa: A002 - reads best at the call site
    max: float | None = None,  # noqa: A002
    min_exclusive: bool = False,
    infinite: bool = False,
) -> float:
    """``value`` as a float if it is a finite int or float (not a bool) within the bounds.

    ``min_exclusive``: ``value`` must be above ``min`` (``timeout=0`` refused).
    ``infinite``: accept the infinities (for a cap that may be "none"); NaN never passes.
    Raises :class:`NotANumberError` for a non-number, ValueError for NaN, an infinity or a
    number out of range; the message names ``name`` and ``unit``:
    ``"timeout must be a positive number of seconds, not 0"``.
    """
    expected = _expected("number", unit, min, min_exclusive, max)
    if not is_number(value):
        raise NotANumberError(f"{name} must be {expected}, not {value!r}")
    number = float(value)
    if math.isnan(number) or (math.isinf(number) and not infinite):
        raise ValueError(f"{name} must be {expected} (finite), not {value!r}")
    _check_range(number, value, name, expected, min, min_exclusive, max)
    return number
