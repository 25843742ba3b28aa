"""The embedded NSQ's layout: every module in nsqclient/testing has one job and the modules
import each other without a circle (``if TYPE_CHECKING:`` imports and imports inside functions
count too), and none of them imports the client's Consumer or Producer."""

from __future__ import annotations

import ast
from pathlib import Path

import nsqclient.testing

PACKAGE = "nsqclient.testing"
ROOT = Path(nsqclient.testing.__file__).parent


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join([PACKAGE, *parts])


def _imported(path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    """Absolute names an import statement in ``path`` may reach (modules, or names in them)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        package = _module_name(path if path.name == "__init__.py" else path.parent / "__init__.py")
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - (node.level - 1)])
        target = f"{base}.{node.module}" if node.module else base
    else:
        target = node.module or ""
    # "from . import x" names a submodule; "from .x import y" may too
    return [target] + [f"{target}.{alias.name}" for alias in node.names]


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of this package it imports (every import statement, anywhere)."""
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            target, *names = _imported(path, node)
            if isinstance(node, ast.ImportFrom):
                # "from . import mod" imports the submodule; "from .mod import name" the module
                reached = [n for n in names if n in modules] or [target]
            else:
                reached = [target, *names]
            for module in reached:
                if module in modules and module != name:
                    graph[name].add(module)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a list of modules (first == last), or None."""
    white, grey, black = 0, 1, 2
    colour = dict.fromkeys(graph, white)
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = grey
        stack.append(node)
        for nxt in sorted(graph[node]):
            if colour[nxt] == grey:
                return stack[stack.index(nxt) :] + [nxt]
            if colour[nxt] == white:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        colour[node] = black
        return None

    for node in sorted(graph):
        if colour[node] == white:
            found = visit(node)
            if found:
                return found
    return None


def test_the_checker_finds_circles_and_every_kind_of_import():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import nsqd\n"
        "from .queues import Topic\n"
        "if TYPE_CHECKING:\n    from .lookupd import Lookupd\n"
        "def f():\n    from ..protocol import encode_frame\n"
    )
    path = ROOT / "example.py"
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update(_imported(path, node))
    assert {
        f"{PACKAGE}.nsqd",
        f"{PACKAGE}.queues",
        f"{PACKAGE}.lookupd",
        "nsqclient.protocol",
    } <= found
    graph = import_graph()
    assert f"{PACKAGE}.nsqd.queues" in graph[f"{PACKAGE}.nsqd.node"]
    assert f"{PACKAGE}.cluster" in graph[PACKAGE]


def test_no_module_of_the_embedded_nsq_imports_in_a_circle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_shared_go_style_module_is_a_leaf():
    graph = import_graph()
    assert graph[f"{PACKAGE}.gostyle.text"] == set()
    assert graph[f"{PACKAGE}.http.server"] == set()
    assert graph[f"{PACKAGE}.http.replies"] <= {f"{PACKAGE}.gostyle.text", f"{PACKAGE}.http.server"}


def test_the_protocol_cores_do_no_io():
    """nsqd's protocol V2 core and youzan's (bytes in, commands out, frames back) import no
    socket, event loop or TLS, and nothing of the connection, the node or the queues: the
    connection (nsqd/client.py, youzan/client.py) does the I/O around them."""
    graph = import_graph()
    allowed = {
        f"{PACKAGE}.nsqd.protocol_v2": {
            f"{PACKAGE}.nsqd.options",
            f"{PACKAGE}.nsqd.writes",  # snappy_writes: how a snappy stream is cut into writes
            f"{PACKAGE}.gostyle.text",
        },
        f"{PACKAGE}.youzan.protocol": {
            f"{PACKAGE}.nsqd.protocol_v2",
            f"{PACKAGE}.nsqd.options",
            f"{PACKAGE}.gostyle.text",
        },
    }
    for core, ours in allowed.items():
        assert graph[core] <= ours, f"{core} imports {sorted(graph[core] - ours)}"
        path = ROOT.joinpath(*core.split(".")[2:]).with_suffix(".py")
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in _imported(path, node):
                    assert name.split(".")[0] not in ("asyncio", "socket", "ssl", "selectors"), (
                        f"{core} imports {name}"
                    )


def test_the_embedded_nsq_never_imports_the_consumer_or_producer():
    for path in ROOT.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                assert name.split(".")[-1] not in (
                    "consumer",
                    "producer",
                    "Consumer",
                    "Producer",
                ), f"{path.name} imports {name}"
