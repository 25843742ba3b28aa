#!/usr/bin/env python
"""Profile nsqclient's hot loops (consume, pipelined publish, one blocking pub() at a time) over
every thread, and print the top entries.

It runs ``consume.py`` and ``publish.py`` once each with ``--profile DIR`` (their children run
under the profiler) and prints the head of every summary written.  With py-spy (sampling, GIL
holder, every thread, little overhead; found on PATH, in ``$PY_SPY`` or given with
``--py-spy``) the figures stay near the unprofiled ones; with cProfile (every thread through
``threading.setprofile``) the rates drop several-fold and only the proportions mean anything.

    .venv/bin/python bench/profiles.py                          # nsqclient, py-spy if found
    PY_SPY=/tmp/py-spy/bin/py-spy .venv/bin/python bench/profiles.py --out /tmp/prof-before
    .venv/bin/python bench/profiles.py --profiler cprofile --clients nsqclient,pynsq -n 50000

Install py-spy anywhere, e.g. ``pip install --target /tmp/py-spy py-spy`` (binary in
``/tmp/py-spy/bin/py-spy``).  (Not named ``profile.py``: the scripts run with ``bench/``
first on sys.path, and cProfile imports the standard library's ``profile``.)

The broker is chosen as in the other scripts (NSQ_BIN_DIR: real nsqd; else the embedded one);
broker options are passed through.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import _common as common

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_messages_argument(parser, 200_000, "(default 200000)")
    parser.add_argument(
        "--out", help="directory for the profiles (default: a new temporary directory)"
    )
    common.add_profiler_arguments(parser)
    parser.add_argument(
        "--clients",
        default="nsqclient",
        help="clients to profile, comma-separated: nsqclient, pynsq, gnsq (default nsqclient)",
    )
    parser.add_argument(
        "--what",
        default="consume,publish",
        help="consume, publish or both (default consume,publish)",
    )
    parser.add_argument(
        "--concurrency", default="1", help="consumer handler threads (default 1; e.g. 1,4)"
    )
    parser.add_argument(
        "--lines", type=int, default=40, help="lines of each summary to print (default 40)"
    )
    common.add_quick_argument(parser, "tiny runs (a smoke test)")
    args, broker_args = parser.parse_known_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="nsqclient-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    n = 3000 if args.quick else args.messages
    shared = [
        "--repeat",
        "1",
        "--rss-messages",
        "0",
        "--clients",
        args.clients,
        "--profile",
        str(out),
        "--profile-clients",
        args.clients,
        "--profiler",
        args.profiler,
        *(["--py-spy", args.py_spy] if args.py_spy else []),
        *broker_args,
    ]
    runs = []
    what = set(common.comma_list(args.what))
    if "consume" in what:
        runs.append(
            [
                "consume.py",
                "-n",
                str(n),
                "--concurrency",
                args.concurrency,
                "--spread",
                "0",
                *shared,
            ]
        )
    if "publish" in what:
        runs.append(
            [
                "publish.py",
                "--cases",
                "pipelined,pub x1",
                "--pipelined-messages",
                str(n),
                "-n",
                str(max(1000, n // 10)),
                *shared,
            ]
        )
    status = 0
    for script, *rest in runs:
        argv_run = [sys.executable, str(HERE / script), *rest]
        print("$ " + " ".join(argv_run), file=sys.stderr, flush=True)
        status = subprocess.run(argv_run, env=os.environ.copy(), check=False).returncode or status
    summaries = sorted(out.glob("*.pyspy-summary.txt")) or sorted(out.glob("*.txt"))
    for path in summaries:
        if path.name.endswith(".pyspy.txt"):
            continue  # py-spy's raw stacks
        print(f"\n===== {path} =====")
        lines = path.read_text().splitlines()
        print("\n".join(lines[: args.lines]))
    print(f"\nprofiles in {out}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
