"""`make docs`: the Sphinx build is clean (warnings and unresolved references are errors), the
configuration reference lists every option of config.py, the API reference every error class."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import nsqclient
from nsqclient import errors
from nsqclient.config import OPTIONS

pytest.importorskip("sphinx", reason="Sphinx is not installed (dev extra)")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
DOCS = os.path.join(ROOT, "docs")
ROOT_PATH = Path(ROOT)
sys.path.insert(0, os.path.join(DOCS, "_ext"))

import nsqclient_options  # noqa: E402 - the extension, from docs/_ext


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("html")
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "-n", "-E", "-q", "-b", "html", DOCS, str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr.strip() == "", result.stderr
    return str(out)


def page_text(built: str, name: str) -> str:
    with open(os.path.join(built, name), encoding="utf-8") as f:
        text = html.unescape(re.sub(r"<[^>]+>", "", f.read()))
    return " ".join(text.split())  # one space between words


def test_the_configuration_reference_has_every_option(built):
    text = page_text(built, "configuration.html")
    rows = nsqclient_options.option_rows()
    assert [row[0] for row in rows] == list(OPTIONS)
    for name, *_, meaning in rows:
        assert re.search(rf"\b{re.escape(name)}\b", text), name
        assert meaning in text, name
    with open(os.path.join(built, "configuration.html"), encoding="utf-8") as f:
        raw = f.read()
    for name in OPTIONS:  # each row is a link target: configuration.html#option-<name>
        assert f'id="option-{name.replace("_", "-")}"' in raw, name


def test_option_rows_say_default_range_and_unit():
    rows = {row[0]: row for row in nsqclient_options.option_rows()}
    assert rows["dial_timeout"][1:4] == ("1", "0.001 to 3600", "seconds")
    assert rows["heartbeat_interval"][2] == "1 to 3600; also -1, 0"
    assert rows["max_requeue_delay"][2] == ">= 0; inf"
    assert rows["msg_timeout"][1:3] == ("None", ">= 1; None")
    assert rows["backoff_strategy"][2] == "one of ``'exponential'``, ``'full_jitter'``"
    assert rows["tls_v1"][1:3] == ("False", "True or False")
    assert rows["max_frame_size"][3] == "bytes"


def test_the_api_reference_has_every_error_class_and_the_pynsq_names(built):
    text = page_text(built, "api.html")
    for name in errors.__all__:
        if isinstance(getattr(errors, name), type):
            assert f"nsqclient.errors.{name}" in text, name
            assert getattr(nsqclient, name) is getattr(errors, name)  # also at the top level
    for name in ("Config", "Reader", "Writer", "LegacyReader", "run", "stop", "BackoffTimer"):
        assert re.search(rf"nsqclient\.(\w+\.)?{name}\b", text), name


def test_every_guide_is_in_the_toctree(built):
    index = page_text(built, "index.html")
    for page in (
        "Quickstart",
        "Consuming",
        "Publishing",
        "Guarantees",
        "Migrating from pynsq",
        "youzan",
        "Configuration reference",
        "API reference",
    ):
        assert page in index, page


#: the faces of the packages: what each exports is public, and documented
PACKAGE_FACES = ("conn", "consumer", "producer", "lookupd")


def test_the_api_reference_has_every_name_the_packages_export(built):
    import importlib

    text = page_text(built, "api.html")
    for face in PACKAGE_FACES:
        module = importlib.import_module(f"nsqclient.{face}")
        for name in module.__all__:
            top = getattr(nsqclient, name, None) is getattr(module, name)
            assert f"nsqclient.{face}.{name}" in text or (top and f"nsqclient.{name}" in text), (
                f"nsqclient.{face}.{name}"
            )


def test_the_api_reference_documents_no_private_module():
    """Users never import a module whose name starts with ``_``: the page names none."""
    with open(os.path.join(DOCS, "api.rst"), encoding="utf-8") as f:
        source = f.read()
    assert re.findall(r"nsqclient(?:\.\w+)*\._[a-z]\w*", source) == []


def _resolves(dotted: str) -> bool:
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attribute in parts[i:]:
                obj = getattr(obj, attribute)
        except AttributeError:
            return False
        return True
    return False


def test_every_dotted_path_the_guides_and_examples_name_exists():
    """README.rst, the guides and the examples name only modules and names that import (a
    logger's name, ``nsqclient.trace``, is not a module)."""
    loggers = set()
    for path in (ROOT_PATH / "nsqclient").rglob("*.py"):
        loggers |= set(re.findall(r'getLogger\("([\w.]+)"\)', path.read_text(encoding="utf-8")))
    sources = [
        ROOT_PATH / "README.rst",
        *(ROOT_PATH / "docs").glob("*.rst"),
        *(ROOT_PATH / "examples").rglob("*.py"),
    ]
    named = {
        (source.name, match)
        for source in sources
        for match in re.findall(r"\bnsqclient(?:\.[A-Za-z_]\w*)+", source.read_text("utf-8"))
    }
    assert len(named) > 50
    wrong = sorted((f, n) for f, n in named if n not in loggers and not _resolves(n))
    assert wrong == []
    assert not _resolves("nsqclient.consumer.NoSuchName") and not _resolves("nsqclient.batch")


def test_the_api_reference_documents_every_public_module_of_the_top():
    """Each module at nsqclient/'s top whose name has no ``_`` in front is public: the page
    has it (``automodule``, or its names)."""
    with open(os.path.join(DOCS, "api.rst"), encoding="utf-8") as f:
        source = f.read()
    public = sorted(
        p.stem for p in (ROOT_PATH / "nsqclient").glob("*.py") if not p.stem.startswith("_")
    )
    assert "protocol" in public
    assert [
        m for m in public if f"nsqclient.{m}." not in source and f"nsqclient.{m}\n" not in source
    ] == []
