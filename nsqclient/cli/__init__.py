"""The ``nsqclient`` command: ``tail``, ``pub``, ``stat`` and ``to-file``.

Each subcommand lives in its own module (:mod:`.tail`, :mod:`.pub`, :mod:`.stat`,
:mod:`.to_file`) with an ``add_parser(subparsers)`` that declares its flags and a
``run(args) -> int`` that returns the exit status; :mod:`.main` ties them together with
:mod:`argparse`; :mod:`.common` holds what they share and :mod:`.topic_discovery` the topics
``to-file`` finds through nsqlookupd (durations are parsed by :mod:`nsqclient.durations`, which
the embedded servers' flags share).  Flags keep the names of the Go tools (``nsq_tail``, ``to_nsq``,
``nsq_stat``, ``nsq_to_file``) so that scripts move over with the command name changed.

Exit statuses: 0 success (and a clean stop on SIGINT/SIGTERM for ``tail``, ``stat`` and
``to-file``), 1 failure (a broker that cannot be reached, a write that failed), 2 usage error,
128+signal for ``pub`` interrupted before the end of its input.
"""

from __future__ import annotations
