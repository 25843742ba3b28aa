"""Go's flag package, as the embedded servers' command lines need it: a :class:`Flag` table read
the way Go reads ``os.Args`` (:func:`parse_go_flags`: ``-flag`` or ``--flag``, ``-flag=value``
or ``-flag value``, booleans only as ``-flag`` or ``-flag=false``, repeatable flags) and the
``-help`` text that lists a table (:func:`usage`).

A duration flag reads Go's form or a plain number of seconds (:func:`go_duration_seconds`); the
other way, :func:`duration_flag` writes seconds as a value a real binary's duration flag reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from ...durations import parse_duration

__all__ = [
    "Flag",
    "FlagError",
    "parse_go_flags",
    "usage",
    "go_bool",
    "go_int",
    "go_duration_seconds",
    "duration_flag",
]

_GO_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_GO_FALSE = ("0", "f", "F", "FALSE", "false", "False")


class FlagError(ValueError):
    """A command line Go's flag package would refuse (exit status 2)."""


def go_duration_seconds(text: str) -> float:
    """Seconds in a duration flag: Go's form (``time.ParseDuration``: ``1h2m3.5s``, ``250ms``,
    ``0``) or a plain number of seconds (``60``, ``0.5``), which nsqd itself refuses.  The CLI's
    parser (:func:`nsqclient.durations.parse_duration`), so the two read flags alike."""
    return parse_duration(text)


def go_bool(text: str) -> bool:
    """A boolean as ``strconv.ParseBool`` reads it (``1 t T TRUE true True`` and the false
    forms); ValueError otherwise."""
    if text in _GO_TRUE:
        return True
    if text in _GO_FALSE:
        return False
    raise ValueError(f"invalid boolean {text!r}")


def go_int(text: str) -> int:
    """An integer as ``strconv.ParseInt(text, 0, 64)`` reads it (with a base prefix)."""
    return int(text, 0)  # strconv.ParseInt(text, 0, 64): 0x.., 0o.., 0b.. prefixes


@dataclass(frozen=True)
class Flag:
    """One command-line flag: its name, how its value parses, its default and its meaning."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    help: str
    is_bool: bool = False
    repeated: bool = False

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")


def parse_go_flags(flags: list[Flag], argv: list[str]) -> dict[str, Any]:
    """Values (by ``Flag.dest``) for ``argv`` parsed the way Go's flag package does.

    Raises FlagError for an unknown flag, a missing or bad value, or a positional argument;
    returns ``{"help": True}`` for ``-h``/``-help``.
    """
    by_name = {f.name: f for f in flags}
    values: dict[str, Any] = {f.dest: (list(f.default) if f.repeated else f.default) for f in flags}
    given: set[str] = set()
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            if i < len(argv):
                raise FlagError(f"unexpected argument {argv[i]!r}")
            break
        if len(arg) < 2 or arg[0] != "-":
            raise FlagError(f"unexpected argument {arg!r} (flags only)")
        name = arg[2:] if arg.startswith("--") else arg[1:]
        if not name or name[0] in "-=":
            raise FlagError(f"bad flag syntax: {arg}")
        value: str | None = None
        if "=" in name:
            name, value = name.split("=", 1)
        if name in ("h", "help"):
            return {"help": True}
        flag = by_name.get(name)
        if flag is None:
            raise FlagError(
                f"flag provided but not defined: -{name} (the embedded server does not "
                "implement it; see -help)"
            )
        if value is None:
            if flag.is_bool:
                value = "true"
            elif i < len(argv):
                value = argv[i]
                i += 1
            else:
                raise FlagError(f"flag needs an argument: -{name}")
        try:
            parsed = flag.parse(value)
        except ValueError as exc:
            raise FlagError(f"invalid value {value!r} for flag -{name}: {exc}") from exc
        if flag.repeated:
            values[flag.dest].append(parsed)
        else:
            values[flag.dest] = parsed
        given.add(flag.dest)
    values["_given"] = given
    return values


def usage(prog: str, flags: list[Flag], out: TextIO) -> None:
    """Write the flag list (name, default, meaning with its unit) to ``out``."""
    out.write(f"Usage of {prog} (embedded, nsqclient.testing; the real binary's flags):\n")
    for f in flags:
        kind = "" if f.is_bool else " value"
        default = f.default
        if f.repeated:
            shown = ""
        elif isinstance(default, float):
            shown = f" (default {_duration_text(default)})"
        elif default not in (None, "", False, []):
            shown = (
                f" (default {default!r})" if isinstance(default, str) else f" (default {default})"
            )
        else:
            shown = ""
        out.write(f"  -{f.name}{kind}\n        {f.help}{shown}\n")


def _duration_text(seconds: float) -> str:
    """A default duration as ``-help`` shows it: ``60s``, ``15m``, ``1h``, ``250ms``."""
    if seconds and seconds < 1:
        return f"{seconds * 1000:g}ms"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 3600:g}h" if seconds % 3600 == 0 else f"{seconds / 60:g}m"
    return f"{seconds:g}s"


def duration_flag(seconds: float) -> str:
    """A duration in seconds as the value of a duration flag, exact to the microsecond and read
    back by Go's ``time.ParseDuration`` (``1.5`` -> ``"1500ms"``, ``0.0005`` -> ``"500us"``)."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise ValueError(f"a duration must be a non-negative number of seconds, not {seconds!r}")
    ms = seconds * 1000.0
    if abs(ms - round(ms)) < 1e-6:
        return f"{int(round(ms))}ms"
    return f"{int(round(seconds * 1_000_000))}us"
