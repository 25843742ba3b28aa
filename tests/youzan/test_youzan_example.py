"""examples/youzan_ordered.py runs to the end: every key in order, nothing lost."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).parent.parent.parent / "examples" / "youzan_ordered.py"


def test_the_youzan_example_keeps_every_key_in_order():
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "--messages", "3000", "--keys", "15"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "published 3,000 messages with 15 keys" in run.stdout
    summary = re.search(r"lost (\d+); keys out of order: (\d+)", run.stdout)
    assert summary is not None, run.stdout
    assert summary.groups() == ("0", "0")
