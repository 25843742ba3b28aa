"""`make demo` (examples/demo.py) runs to the end and loses nothing, with a smaller count."""

from __future__ import annotations

import os
import re
import subprocess
import sys

DEMO = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "examples", "demo.py")


def test_demo_publishes_restarts_an_nsqd_and_loses_nothing():
    result = subprocess.run(
        [sys.executable, DEMO, "--count", "20000", "--publishers", "3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    summary = re.search(
        r"published (\d+)  consumed (\d+)  duplicates (\d+)  lost (\d+)  in [\d.]+s "
        r"\((\d+) msgs/s\)",
        out,
    )
    assert summary, out
    published, consumed, duplicates, lost, rate = map(int, summary.groups())
    assert (published, lost) == (20000, 0)
    assert consumed == published + duplicates
    assert rate > 0
    assert "-- halfway: stopping nsqd" in out and "is back" in out
    assert out.rstrip().endswith("demo OK")
    # stdout is not a terminal: plain progress lines, no bar redrawn with carriage returns
    assert "\r" not in out
    assert re.search(r"^consumed +\d+/20000 \( *\d+%\) +\d+ msgs/s$", out, re.M), out
