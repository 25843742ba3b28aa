"""Every file a comment or a docstring names exists (issue 34: seven of them named a design
page the project does not have, setup.cfg a Django page of docs/ that is not there).

Read from the source (tokenize and ast, nothing imported): in nsqclient/ and tests/, each
comment and each module, class and function docstring; in setup.cfg and MANIFEST.in, the whole
text.  A name ending in ``.md``, ``.rst`` or ``.py`` with a folder in it must be a file of the
repository, from its top or from nsqclient/, nsqclient/testing/, tests/ or the naming file's
folder (``spark/frames.py``, ``testing/nsqd/writes.py``); a bare name
(``errors.py``) must be the name of one of its files.  MANIFEST.in's include and graft lines
must each match something.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMED = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[\w-]+\.(?:md|rst|py))(?![\w/-])")
SKIPPED = {".git", "build", "dist", "__pycache__", "_build", ".pytest_cache", ".hypothesis"}


def repository_files() -> set[str]:
    return {
        p.relative_to(ROOT).as_posix()
        for p in ROOT.rglob("*")
        if p.is_file()
        and not SKIPPED & set(p.relative_to(ROOT).parts)
        and not any(part.startswith(".venv") for part in p.relative_to(ROOT).parts)
    }


FILES = repository_files()
NAMES = {f.rsplit("/", 1)[-1] for f in FILES}


def comments_and_docstrings(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, text)`` of each comment and docstring of the Python file ``path``."""
    source = path.read_text(encoding="utf-8")
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                yield first.lineno, first.value.value


def exists(name: str, named_in: str) -> bool:
    if "/" not in name:
        return name in NAMES
    folder = named_in.rsplit("/", 1)[0] + "/" if "/" in named_in else ""
    return any(
        f"{base}{name}" in FILES
        for base in ("", folder, "nsqclient/", "nsqclient/testing/", "tests/")
    )


def missing_in(rel: str, texts: Iterator[tuple[int, str]]) -> list[str]:
    return [
        f"{rel}:{line}: {match.group(1)}"
        for line, text in texts
        for match in NAMED.finditer(text)
        if not exists(match.group(1), rel)
    ]


def test_the_scan_finds_names_and_tells_a_missing_one(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""See docs/contributing.rst and conn/_connection.py."""\n'
        "# DESIGN.md, rule 2; docs/django.rst; spark/frames.py\n"
        "def f():\n"
        '    """Like tests/no_such_test.py."""\n'
        "x = 'not/a/docstring.py'\n",
        encoding="utf-8",
    )
    found = [
        (line, m.group(1))
        for line, text in comments_and_docstrings(sample)
        for m in NAMED.finditer(text)
    ]
    assert sorted(found) == [
        (1, "conn/_connection.py"),
        (1, "docs/contributing.rst"),
        (2, "DESIGN.md"),
        (2, "docs/django.rst"),
        (2, "spark/frames.py"),
        (4, "tests/no_such_test.py"),
    ]
    missing = missing_in("nsqclient/sample.py", comments_and_docstrings(sample))
    assert [m.split(": ", 1)[1] for m in missing] == [
        "DESIGN.md",
        "docs/django.rst",
        "tests/no_such_test.py",
    ]


def test_every_file_a_comment_or_docstring_names_exists():
    missing = []
    for top in ("nsqclient", "tests"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            missing += missing_in(rel, comments_and_docstrings(path))
    assert not missing, "named, and not in the repository:\n" + "\n".join(missing)


def test_every_file_setup_cfg_and_manifest_in_name_exists():
    missing = []
    for rel in ("setup.cfg", "MANIFEST.in"):
        text = (ROOT / rel).read_text(encoding="utf-8")
        missing += missing_in(rel, enumerate(text.splitlines(), 1))
    assert not missing, "named, and not in the repository:\n" + "\n".join(missing)
    for line in (ROOT / "MANIFEST.in").read_text(encoding="utf-8").splitlines():
        words = line.split()
        if not words or words[0] not in ("include", "graft"):
            continue
        for pattern in words[1:]:
            found = list(ROOT.glob(pattern)) if words[0] == "include" else [ROOT / pattern]
            assert any(p.exists() for p in found), f"MANIFEST.in: {line!r} matches nothing"
