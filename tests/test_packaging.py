"""Packaging (issue 24): the LICENSE ships, the sdist is complete enough for its tests to run from
it (MANIFEST.in), and the wheel holds the nsqclient package only.

The sdist and the wheel are built and checked here by the script ``make dist-check`` runs,
``.ci/check-dist --contents-only`` (a clean copy of the tree, ``python -m build --no-isolation``,
~3 s; no venv, no install, no tests from the sdist: ``make dist-check`` does those).  The script
is also shown failing on a wheel that carries tests and an sdist that lacks tests/conftest.py.
"""

from __future__ import annotations

import configparser
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECK_DIST = ROOT / ".ci" / "check-dist"


def test_the_license_is_mit_and_setup_cfg_ships_it():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg", encoding="utf-8")
    assert cfg["metadata"]["license_expression"] == "MIT"
    assert cfg["metadata"]["license_files"].split() == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License\n")
    assert "Copyright (c) 2024-2026 The nsqclient authors" in text
    assert 'THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND' in text


def check_dist(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHECK_DIST), "--contents-only", *args],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The sdist and the wheel, built and found complete by ``.ci/check-dist``."""
    pytest.importorskip("build", reason="build is not installed (dev extra)")
    out = tmp_path_factory.mktemp("dist")
    result = check_dist("--outdir", str(out), str(ROOT))
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    assert "complete" in result.stdout
    return out


def sdist_of(dist: Path) -> Path:
    (sdist,) = dist.glob("nsqclient-*.tar.gz")
    return sdist


def wheel_of(dist: Path) -> Path:
    (wheel,) = dist.glob("nsqclient-*.whl")
    return wheel


def test_the_sdist_has_the_tests_docs_and_examples_and_the_wheel_the_package_only(dist):
    with tarfile.open(sdist_of(dist)) as tar:
        top, *_ = tar.getnames()[0].split("/")
        in_sdist = {name.removeprefix(top + "/") for name in tar.getnames()}
    for path in (
        "LICENSE",
        "MANIFEST.in",
        "Makefile",
        ".ruff.toml",
        ".ci/check-dist",
        "tests/conftest.py",
        "tests/certs/cert.pem",
        "tests/spark/conftest.py",
        "tests/spark/spark_helpers.py",
        "tests/cli/conftest.py",
        "tests/conformance/rawclient.py",
        "tests/test_packaging.py",
        "docs/index.rst",
        "docs/_ext/nsqclient_options.py",
        "examples/demo.py",
        "bench/publish.py",
    ):
        assert path in in_sdist, path
    assert not [name for name in in_sdist if name.endswith(".pyc") or "_build/" in name]

    with zipfile.ZipFile(wheel_of(dist)) as zf:
        in_wheel = zf.namelist()
    dist_info = wheel_of(dist).name.split("-py3")[0] + ".dist-info"  # nsqclient-X.Y.Z.dist-info
    assert {name.split("/")[0] for name in in_wheel} == {"nsqclient", dist_info}
    assert {"nsqclient/__init__.py", "nsqclient/py.typed"} <= set(in_wheel)
    assert f"{dist_info}/licenses/LICENSE" in in_wheel


def test_the_wheel_declares_its_commands_and_no_pytest_plugin(dist):
    """The embedded NSQ's pytest plugin is opt-in (docs/testing.rst): no ``pytest11`` entry
    point loads it into every pytest run of a project that installs nsqclient."""
    with zipfile.ZipFile(wheel_of(dist)) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt")]
        text = zf.read(name).decode("utf-8")
    points = configparser.ConfigParser()
    points.read_string(text)
    assert set(points.sections()) == {"console_scripts", "opentelemetry_instrumentor"}, text
    assert set(points["console_scripts"]) == {"nsqclient", "nsqclient-nsqd", "nsqclient-nsqlookupd"}


def test_check_dist_fails_on_a_wheel_with_tests_and_an_sdist_without_conftest(dist, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    wheel = wheel_of(dist)
    with zipfile.ZipFile(wheel) as good_zip, zipfile.ZipFile(bad / wheel.name, "w") as bad_zip:
        for item in good_zip.infolist():
            bad_zip.writestr(item, good_zip.read(item))
        bad_zip.writestr("tests/test_leak.py", "def test_x(): pass\n")
    sdist = sdist_of(dist)
    with tarfile.open(sdist) as good_tar, tarfile.open(bad / sdist.name, "w:gz") as bad_tar:
        for member in good_tar.getmembers():
            if not member.name.endswith("/tests/conftest.py"):
                bad_tar.addfile(member, good_tar.extractfile(member) if member.isfile() else None)

    result = check_dist("--dist", str(bad), str(ROOT))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "wheel: tests/test_leak.py is not in the nsqclient package" in result.stderr
    assert "sdist: no tests/conftest.py" in result.stderr
    assert "FAILED" in result.stdout
