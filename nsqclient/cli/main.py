"""``nsqclient``: the entry point (console script and ``python -m nsqclient``)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from .. import __version__
from . import pub, stat, tail, to_file
from .common import CLIError, go_style_flags

__all__ = ["main", "build_parser"]

logger = logging.getLogger("nsqclient.cli.main")

_COMMANDS = (tail, pub, stat, to_file)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``nsqclient`` and its subcommands."""
    parser = argparse.ArgumentParser(
        prog="nsqclient",
        description="Command-line tools for NSQ: tail a topic, publish lines, watch a channel, "
        "archive a topic to files.",
        epilog="Run 'nsqclient COMMAND --help' for the flags of a command.",
    )
    parser.add_argument("--version", action="version", version=f"nsqclient {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in _COMMANDS:
        module.add_parser(subparsers)
    return parser


def _long_options(parser: argparse.ArgumentParser) -> set[str]:
    names: set[str] = set()
    for action in parser._actions:
        names.update(s for s in action.option_strings if s.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                names.update(_long_options(sub))
    return names


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``nsqclient`` with ``argv`` (default: the process's arguments); return the exit
    status: 0 success, 1 failure, 2 usage error (argparse exits with 2 by itself),
    128+signal for ``pub`` interrupted before the end of its input."""
    parser = build_parser()
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(go_style_flags(args_list, _long_options(parser)))
    command = args.command
    try:
        return int(args.run(args))
    except CLIError as exc:
        if exc.exit_status == 2:
            sub = args.subparser
            sub.print_usage(sys.stderr)
            print(f"{sub.prog}: error: {exc}", file=sys.stderr)
        else:
            print(f"nsqclient {command}: error: {exc}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:  # a second Ctrl-C during a stop
        print(f"nsqclient {command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
