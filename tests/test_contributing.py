"""docs/contributing.rst, the map of the code, names every module and sub-package of nsqclient/,
and CONTRIBUTING.rst points to it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "nsqclient"
MAP = (ROOT / "docs" / "contributing.rst").read_text(encoding="utf-8")


def named(name: str) -> bool:
    return re.search(rf"``{re.escape(name)}``", MAP) is not None


#: the packages whose every module the map names, each with its job (the add-ons' and the
#: embedded NSQ's modules are described by their folder)
LAYERS = ("conn", "consumer", "producer", "lookupd", "compat")


def test_every_module_of_the_top_is_named_with_its_job():
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert "protocol.py" in modules and "__init__.py" in modules
    missing = [m for m in modules if not named(m)]
    assert missing == [], f"docs/contributing.rst does not name {missing}"


def test_every_module_of_the_layers_packages_is_named_with_its_job():
    modules = [
        f"{layer}/{p.name}"
        for layer in LAYERS
        for p in sorted((PACKAGE / layer).glob("*.py"))
        if p.name != "__init__.py"
    ]
    assert "conn/_connection.py" in modules and len(modules) > 30
    missing = [m for m in modules if not named(m)]
    assert missing == [], f"docs/contributing.rst does not name {missing}"


def test_every_sub_package_is_named():
    packages = sorted(p.parent.name + "/" for p in PACKAGE.glob("*/__init__.py"))
    assert "testing/" in packages and "conn/" in packages
    assert [p for p in packages if not named(p)] == []


def test_every_sub_package_of_the_embedded_nsq_is_named():
    testing = sorted(p.parent.name + "/" for p in (PACKAGE / "testing").glob("*/__init__.py"))
    assert "nsqd/" in testing
    assert [p for p in testing if not named(p)] == []


def test_the_map_names_no_module_that_is_gone():
    mentioned = set(re.findall(r"``((?:[a-z]+/)?[a-z_]+\.py)``", MAP))
    gone = sorted(m for m in mentioned if not (PACKAGE / m).exists() and not (ROOT / m).exists())
    assert gone == []


def test_contributing_points_to_the_map():
    assert "docs/contributing.rst" in (ROOT / "CONTRIBUTING.rst").read_text(encoding="utf-8")


def test_tests_are_laid_out_like_the_package():
    """tests/<package>/ for each package of nsqclient/ (the embedded NSQ's are in
    tests/embedded/); no two test files share a name (pytest imports them by it)."""
    tests = ROOT / "tests"
    for package in (*LAYERS, "cli", "otel", "spark"):
        assert list((tests / package).glob("test_*.py")), f"tests/{package}/ has no test"
    assert list((tests / "embedded").glob("test_embedded_*.py"))
    names = [p.name for p in tests.rglob("test_*.py")]
    assert len(names) > 100 and len(names) == len(set(names))
    assert named("tests/embedded/")
