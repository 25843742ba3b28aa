"""The embedded NSQ's pytest plugin is opt-in (issue 34): installing nsqclient adds no hook,
report header, marker or fixture to another project's pytest run; the one line docs/testing.rst
gives turns all of it on, fixtures unchanged.

Each case is a throwaway project (one test file, its own pytest.ini) run by pytest in a
subprocess that can import this tree's nsqclient, as a project that installed it would.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
DOCS = ROOT / "docs" / "testing.rst"
PLUGIN = "nsqclient.testing.pytest_plugin"
OUR_FIXTURES = ("nsqd", "nsq_cluster", "nsq_cluster_factory", "auth_server", "nsq_broker_kind")

# The throwaway project's test: what the plugin's import left in the process, and the fixtures.
PROBE = f"""
import sys

def test_probe(request):
    loaded = {PLUGIN!r} in sys.modules
    print("PROBE plugin-imported=%s" % loaded)
"""


def documented_blocks() -> list[str]:
    """The python code blocks of docs/testing.rst's section "The pytest plugin", dedented."""
    text = DOCS.read_text(encoding="utf-8")
    start = text.index("The pytest plugin\n")
    end = text.index("\n----", text.index("\n----", start) + 5)
    section = text[start:end]
    blocks = re.findall(r"\.\. code-block:: python\n\n((?:    .*\n|\n)+)", section)
    return ["\n".join(line[4:] for line in b.splitlines()).strip() + "\n" for b in blocks]


def project(tmp_path: Path, conftest: str | None = None, test: str = PROBE) -> Path:
    where = tmp_path / "project"
    where.mkdir()
    (where / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")  # its own rootdir
    (where / "test_one.py").write_text(test, encoding="utf-8")
    if conftest is not None:
        (where / "conftest.py").write_text(conftest, encoding="utf-8")
    return where


def run_pytest(where: Path, *args: str) -> str:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    }
    env["PYTHONPATH"] = str(ROOT)  # this tree's nsqclient, importable as if installed
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", *args],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-5000:]
    return out


def listed_fixtures(out: str) -> set[str]:
    """The fixture names a ``pytest --fixtures`` output lists (``name -- file:line``)."""
    return set(re.findall(r"^(\w+)(?: \[\w+ scope\])? -- ", out, re.MULTILINE))


def test_installed_metadata_declares_no_pytest_entry_point():
    ours = [
        ep for ep in importlib.metadata.entry_points(group="pytest11") if "nsqclient" in ep.value
    ]
    assert not ours, (
        f"the installed nsqclient still declares {ours}: a stale install (setup.cfg declares "
        "none); reinstall it (make install, or pip install -e .)"
    )


def test_without_the_one_line_nothing_of_ours_is_in_the_run(tmp_path):
    where = project(tmp_path)
    fixtures = run_pytest(where, "--fixtures")
    assert "tmp_path" in listed_fixtures(fixtures)  # the parse reads this pytest's output
    assert not listed_fixtures(fixtures) & set(OUR_FIXTURES), fixtures
    assert "nsq broker:" not in fixtures
    markers = run_pytest(where, "--markers")
    assert "@pytest.mark.skip(" in markers
    assert "embedded_only" not in markers and "real_only" not in markers
    run = run_pytest(where)
    assert "PROBE plugin-imported=False" in run and "nsq broker:" not in run


def test_the_documented_conftest_line_turns_it_on_and_its_example_runs(tmp_path):
    line, example = documented_blocks()
    assert line == f'pytest_plugins = ["{PLUGIN}"]\n'
    where = project(tmp_path, conftest=line, test=example)
    fixtures = run_pytest(where, "--fixtures")
    assert set(OUR_FIXTURES) <= listed_fixtures(fixtures), fixtures
    assert "nsq broker: embedded" in fixtures or "nsq broker: real" in fixtures
    markers = run_pytest(where, "--markers")
    assert "embedded_only" in markers and "real_only" in markers
    run = run_pytest(where, "-q")
    assert "1 passed" in run


@pytest.mark.parametrize("how", ["-p", "addopts"])
def test_the_command_line_option_turns_it_on(tmp_path, how):
    where = project(tmp_path)
    if how == "addopts":
        (where / "pytest.ini").write_text(f"[pytest]\naddopts = -p {PLUGIN}\n", encoding="utf-8")
        args: tuple[str, ...] = ()
    else:
        args = ("-p", PLUGIN)
    fixtures = run_pytest(where, *args, "--fixtures")
    assert set(OUR_FIXTURES) <= listed_fixtures(fixtures), fixtures
    run = run_pytest(where, *args)
    assert "PROBE plugin-imported=True" in run and "nsq broker:" in run
