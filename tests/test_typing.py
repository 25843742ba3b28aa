"""``mypy --strict`` on users' programs (tests/typecheck/): no error in a correct program comes
from nsqclient's annotations, and the option mistakes the runtime would catch ("did you
mean") are flagged by the type checker too.

The programs are checked as a user's would be: nsqclient found on the Python path like an
installed package (its own modules are not checked, only what it declares), from a directory
holding nothing but the programs (the project's own mypy settings do not apply).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import nsqclient

pytest.importorskip("mypy", reason="mypy is not installed (dev extra)")

PROGRAMS = Path(__file__).parent / "typecheck"
GOOD = ["legacy_pynsq.py", "typed_producer.py", "typed_consumer.py", "typed_asyncio.py"]
BAD = "misspelt_options.py"
#: file:line: severity: message  [code]
LINE = re.compile(r"^(?P<file>[\w.]+):(?P<line>\d+): (?P<severity>error|note): (?P<message>.*)$")


@pytest.fixture(scope="module")
def mypy_errors(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(file, line, message) of every error mypy --strict reports on the programs."""
    work = tmp_path_factory.mktemp("typecheck")
    for name in [*GOOD, BAD]:
        shutil.copy(PROGRAMS / name, work / name)
    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    cache_dir = cache.mkdir("mypy-user-programs") if cache is not None else work / ".cache"
    root = Path(nsqclient.__file__).resolve().parent.parent  # where this nsqclient is imported
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("MYPYPATH", None)
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(cache_dir),
         "--no-color-output", "--no-error-summary", "--show-error-codes", *GOOD, BAD],
        cwd=work, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    errors = []
    for line in proc.stdout.splitlines():
        match = LINE.match(line)
        assert match, f"unexpected mypy output: {line!r}\n{proc.stdout}{proc.stderr}"
        if match["severity"] == "error":
            errors.append((match["file"], int(match["line"]), match["message"]))
    return errors


@pytest.mark.parametrize("program", GOOD)
def test_a_correct_program_passes_mypy_strict(mypy_errors, program):
    assert [e for e in mypy_errors if e[0] == program] == []


def test_option_mistakes_are_flagged_where_they_are_made(mypy_errors):
    lines = (PROGRAMS / BAD).read_text(encoding="utf-8").splitlines()
    marked = [n for n, text in enumerate(lines, 1) if text.endswith("# error")]
    assert [(BAD, line, message) for _, line, message in mypy_errors if _ == BAD] == [
        (BAD, marked[0], 'Unexpected keyword argument "max_in_flght" for "Consumer"; did you'
         ' mean "max_in_flight"?  [call-arg]'),
        (BAD, marked[1], 'Unexpected keyword argument "pub_timout" for "Producer"; did you mean'
         ' "pub_timeout"?  [call-arg]'),
        (BAD, marked[2], 'Unexpected keyword argument "max_in_flight" for "Producer"  [call-arg]'),
        (BAD, marked[3], 'Argument "msg_timeout" to "Consumer" has incompatible type "str";'
         ' expected "float | None"  [arg-type]'),
        (BAD, marked[4], 'Unexpected keyword argument "heartbeat_intervall" for "Config"; did'
         ' you mean "heartbeat_interval"?  [call-arg]'),
    ]  # fmt: skip
    assert len(marked) == 5


def test_the_runtime_refuses_the_same_mistakes():
    """What the type checker flags, the runtime refuses too, before anything connects."""
    address = "127.0.0.1:4150"
    with pytest.raises(TypeError, match="did you mean 'max_in_flight'"):
        nsqclient.Consumer("clicks", "archive", None, address, max_in_flght=100)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="max_in_flight is a Consumer option"):
        nsqclient.Producer(address, max_in_flight=5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="msg_timeout"):
        nsqclient.Consumer("t", "c", None, address, msg_timeout="30")  # type: ignore[arg-type]
