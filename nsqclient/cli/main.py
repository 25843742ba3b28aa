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


def _before_command(argv: Sequence[str], command: str, unknown: Sequence[str]) -> bool:
    """Whether the first of the ``unknown`` arguments comes before the subcommand's name (a
    top-level flag that does not exist rather than a subcommand's)."""
    try:
        return argv.index(unknown[0]) < argv.index(command)
    except ValueError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``nsqclient`` with ``argv`` (default: the process's arguments); return the exit
    status: 0 success, 1 failure, 2 usage error (argparse exits with 2 by itself),
    128+signal for ``pub`` interrupted before the end of its input."""
    parser = build_parser()
    args_list = go_style_flags(list(sys.argv[1:] if argv is None else argv), _long_options(parser))
    args, unknown = parser.parse_known_args(args_list)
    if unknown:
        # argparse reports what a subcommand did not know with the top-level usage; the
        # subcommand's usage is the one that lists the flags that could have been meant.
        where = parser if _before_command(args_list, args.command, unknown) else args.subparser
        where.error(f"unrecognized arguments: {' '.join(unknown)}")
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
