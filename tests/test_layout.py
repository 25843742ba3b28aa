"""The shape of the package (docs/contributing.rst, "The layers"): no import circle, and the
arrows point down.

The import graph is read from the source with :mod:`ast`, not by importing anything: every
``import``/``from ... import`` counts, at module level, under ``if TYPE_CHECKING:`` and inside
functions alike, with relative imports resolved.  ``from . import x`` is an edge to the module
``x`` when there is one, else to the package's ``__init__`` (``from . import __version__``).
The implicit import of a package's ``__init__`` when one of its modules is imported is not an
edge: every module would otherwise sit in a circle with its own package.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from pathlib import Path

PACKAGE = "nsqclient"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE


def _module_name(path: Path) -> str:
    parts = [PACKAGE, *path.relative_to(ROOT).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _resolve(module: str, level: int, target: str | None) -> str:
    """The absolute name ``from <level dots><target> import ...`` refers to inside ``module``."""
    parts = module.split(".")
    if not _is_package(module):
        parts.pop()  # a module's relative imports start from its package
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join([*parts, target] if target else parts)


def _ours(name: str) -> str | None:
    """The module of ours that importing ``name`` runs: itself, or its nearest known parent
    (``nsqclient.protocol.FrameReader`` is not a module: ``nsqclient.protocol``)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, source: str | None = None) -> set[str]:
    """Every module of ours that ``module`` imports, anywhere in its source (or in
    ``source``, read as if it were that module's)."""
    if source is None:
        source = MODULES[module].read_text(encoding="utf-8")
    tree = ast.parse(source, str(MODULES[module]))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node.level, node.module) if node.level else (node.module or "")
            # "from base import x": the module base.x if there is one, else base itself.
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            target = _ours(name)
            if target is not None and target != module:
                found.add(target)
    return found


GRAPH: dict[str, set[str]] = {module: imports_of(module) for module in MODULES}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: every group of modules that import one another, in a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    counter = 0

    def visit(start: str) -> None:
        nonlocal counter
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return groups


def a_cycle(graph: dict[str, set[str]], group: Iterable[str]) -> list[str]:
    """One concrete circle inside ``group`` (a strongly connected set), for the message:
    ``[a, b, c, a]`` means a imports b imports c imports a."""
    members = set(group)
    start = min(members)
    # Breadth-first from start's imports back to start, staying inside the group.
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        next_frontier = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    path = [node]  # walk back from node to start
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if child not in parents:
                    parents[child] = node
                    next_frontier.append(child)
        frontier = next_frontier
    raise AssertionError(f"{sorted(members)} is not strongly connected")


def _describe(groups: list[list[str]]) -> str:
    return "; ".join(" -> ".join(a_cycle(GRAPH, group)) for group in groups)


def _in_testing(module: str) -> bool:
    return module == f"{PACKAGE}.testing" or module.startswith(f"{PACKAGE}.testing.")


CYCLES = strongly_connected(GRAPH)


# ---------------------------------------------------------------------------------------------
# The graph reader itself, on known facts (so that a reader that sees nothing cannot pass)


def test_the_graph_sees_module_function_and_type_checking_imports() -> None:
    assert len(MODULES) > 20 and f"{PACKAGE}.testing" in MODULES
    assert GRAPH[f"{PACKAGE}.protocol"] >= {f"{PACKAGE}.errors"}
    assert f"{PACKAGE}.conn._connection" in GRAPH[f"{PACKAGE}.consumer._discovery"]
    assert f"{PACKAGE}.compat" in GRAPH[PACKAGE]  # "from . import compat": the module
    # the handshake imports the version inside a function
    assert f"{PACKAGE}._version" in GRAPH[f"{PACKAGE}.conn._handshake"]
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from ..conn import Connection\n"
        "def f():\n"
        "    from .._version import __version__\n"
    )
    assert imports_of(f"{PACKAGE}.consumer._batch", source) == {
        f"{PACKAGE}.conn",
        f"{PACKAGE}._version",
    }


def test_the_cycle_finder_finds_and_names_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert a_cycle(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]
    assert strongly_connected({"x": {"y"}, "y": set()}) == []


def test_relative_imports_resolve_like_python() -> None:
    assert _resolve(f"{PACKAGE}.conn._connection", 2, "protocol") == f"{PACKAGE}.protocol"
    assert _resolve(f"{PACKAGE}.conn", 1, "_futures") == f"{PACKAGE}.conn._futures"
    assert _resolve(PACKAGE, 1, None) == PACKAGE
    if f"{PACKAGE}.testing.nsqd.node" in MODULES:
        assert _resolve(f"{PACKAGE}.testing.nsqd.node", 3, "protocol") == f"{PACKAGE}.protocol"
        assert _resolve(f"{PACKAGE}.testing.nsqd", 1, "queues") == f"{PACKAGE}.testing.nsqd.queues"


# ---------------------------------------------------------------------------------------------
# No import circle


def test_no_import_cycle_in_the_client() -> None:
    """Every circle outside ``testing/`` (the client, spark, the CLI) fails here, named."""
    client = [group for group in CYCLES if not any(_in_testing(m) for m in group)]
    assert not client, f"import cycles: {_describe(client)}"


def test_no_import_cycle_in_testing() -> None:
    testing = [group for group in CYCLES if any(_in_testing(m) for m in group)]
    assert not testing, f"import cycles: {_describe(testing)}"


# ---------------------------------------------------------------------------------------------
# The layers' arrows (docs/contributing.rst)


def _ours_imported_by(module: str) -> set[str]:
    return GRAPH[module]


def test_protocol_imports_nothing_of_ours_but_errors_and_checks() -> None:
    allowed = {f"{PACKAGE}.errors", f"{PACKAGE}.checks"}
    assert _ours_imported_by(f"{PACKAGE}.protocol") <= allowed


def test_leaves_import_nothing_of_ours() -> None:
    for leaf in ("errors", "checks", "_version"):
        assert _ours_imported_by(f"{PACKAGE}.{leaf}") == set(), leaf


def test_version_module_imports_nothing_at_all() -> None:
    tree = ast.parse(MODULES[f"{PACKAGE}._version"].read_text(encoding="utf-8"))
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert imports == []


def _reachable(start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for child in GRAPH[todo.pop()]:
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


#: the pure leaves: no I/O, no thread, nothing but the standard library and one another
PURE_LEAVES = {
    f"{PACKAGE}.{name}"
    for name in (
        "_version",
        "errors",
        "checks",
        "addresses",
        "durations",
        "config",
        "platforms",
        "backoff",
        "rdy",
        "message",
        "observe",
        "protocol",
        "lookupd._partitions",
    )
}
#: what both clients reach beside the leaves: the HTTP clients (requests) and the lookupd pool
SHARED = {f"{PACKAGE}.http", f"{PACKAGE}.lookupd", f"{PACKAGE}.lookupd._pool"}
ADD_ONS = ("compat", "cli", "otel", "spark")


def layer(module: str) -> str:
    """The layer of docs/contributing.rst's drawing that ``module`` is in."""
    if module in (PACKAGE, f"{PACKAGE}.__main__"):
        return "face"
    if module in PURE_LEAVES:
        return "leaf"
    if module in SHARED:
        return "shared"
    top = module.split(".")[1]
    if top in ("conn", "consumer", "producer", "testing"):
        return top
    if top in ADD_ONS:
        return f"add-on {top}"
    raise AssertionError(f"{module} is in no layer of docs/contributing.rst")


#: what each layer may import, besides itself
MAY_IMPORT = {
    "leaf": {"leaf"},
    "shared": {"leaf"},
    "conn": {"leaf", "shared"},
    "consumer": {"leaf", "shared", "conn"},
    "producer": {"leaf", "shared", "conn"},
    "testing": {"leaf", "shared", "conn"},
}


def is_private(module: str) -> bool:
    """A module users never import: one part of its name starts with ``_`` (``__main__`` and
    ``_version`` are the package's own)."""
    return any(part.startswith("_") for part in module.split(".")[1:]) and module not in (
        f"{PACKAGE}.__main__",
        f"{PACKAGE}._version",
    )


def wrong_arrows(graph: dict[str, set[str]]) -> list[str]:
    """Every import that points up or sideways, as ``"a -> b (why)"``."""
    wrong = []
    for module, imported in sorted(graph.items()):
        mine = layer(module)
        for target in sorted(imported):
            theirs = layer(target)
            if theirs == mine:
                continue
            if mine.startswith("add-on") or mine == "testing":
                if is_private(target):
                    wrong.append(f"{module} -> {target} ({mine} uses the public surface)")
                if mine != "testing":
                    continue
            if mine == "face":
                continue
            if theirs not in MAY_IMPORT[mine]:
                wrong.append(f"{module} -> {target} ({mine} may not import {theirs})")
    return wrong


def test_every_module_is_in_a_layer() -> None:
    for module in MODULES:
        layer(module)


def test_the_arrows_point_down() -> None:
    assert wrong_arrows(GRAPH) == []


def test_the_arrow_check_sees_each_kind_of_wrong_arrow() -> None:
    graph = {
        f"{PACKAGE}.message": {f"{PACKAGE}.conn._connection"},  # a leaf naming the connection
        f"{PACKAGE}.lookupd._partitions": {f"{PACKAGE}.http"},  # a pure leaf importing requests
        f"{PACKAGE}.consumer._consumer": {f"{PACKAGE}.producer"},  # one client the other
        f"{PACKAGE}.conn._connection": {f"{PACKAGE}.consumer"},  # the connection a client
        f"{PACKAGE}.spark.sink": {f"{PACKAGE}.producer._producer", f"{PACKAGE}.producer"},
        f"{PACKAGE}.testing.helpers": {f"{PACKAGE}.consumer", f"{PACKAGE}.conn"},
        f"{PACKAGE}.testing.real": {f"{PACKAGE}.conn._connection"},
    }
    assert [arrow.split(" (")[0] for arrow in wrong_arrows(graph)] == [
        f"{PACKAGE}.conn._connection -> {PACKAGE}.consumer",
        f"{PACKAGE}.consumer._consumer -> {PACKAGE}.producer",
        f"{PACKAGE}.lookupd._partitions -> {PACKAGE}.http",
        f"{PACKAGE}.message -> {PACKAGE}.conn._connection",
        f"{PACKAGE}.spark.sink -> {PACKAGE}.producer._producer",
        f"{PACKAGE}.testing.helpers -> {PACKAGE}.consumer",
        f"{PACKAGE}.testing.real -> {PACKAGE}.conn._connection",
    ]


def test_pure_leaves_import_only_the_standard_library() -> None:
    """Beyond one another (test_the_arrows_point_down), a pure leaf imports nothing that is
    not in the standard library: ``requests`` is why http.py is not one."""
    for module in sorted(PURE_LEAVES):
        tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top == PACKAGE, f"{module}: {name}"


def test_testing_never_imports_consumer_or_producer() -> None:
    """The embedded server reuses protocol; it must not depend on the client it tests, not
    even through another module (the package's ``__init__`` included)."""
    forbidden = {f"{PACKAGE}.consumer", f"{PACKAGE}.producer"}
    for module in MODULES:
        if _in_testing(module):
            reached = _reachable(module) & forbidden
            assert not reached, f"{module} imports {sorted(reached)}"


#: the one module that may rely on another library's private interface (concurrent.futures';
#: tests/conn/test_future_internals.py checks that it still holds on this Python)
GUARDED = f"{PACKAGE}.conn._future_internals"
#: the private fields of a concurrent.futures.Future that GUARDED relies on
FUTURE_PRIVATE = {"_state", "_condition", "_waiters", "_done_callbacks", "_invoke_callbacks"}


def private_reliance(source: str) -> list[str]:
    """What ``source`` takes from another library's private interface: imports of a private
    module or name (``concurrent.futures._base``, ``from x import _y``), and reads or writes
    of a Future's private fields (``future._state``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            dotted = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            module = node.module or ""
            dotted = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Attribute) and node.attr in FUTURE_PRIVATE:
            found.append(f"line {node.lineno}: .{node.attr}")
            continue
        else:
            continue
        for name in dotted:
            parts = name.split(".")
            if parts[0] not in (PACKAGE, "__future__") and any(p.startswith("_") for p in parts):
                found.append(f"line {node.lineno}: {name}")
    return found


def test_private_reliance_is_found() -> None:
    sample = (
        "from concurrent.futures._base import FINISHED\n"
        "from os import _exit\n"
        "import ssl\n"
        "from . import _pending\n"
        "def f(future):\n"
        "    return future._state\n"
    )
    assert private_reliance(sample) == [
        "line 1: concurrent.futures._base",
        "line 1: concurrent.futures._base.FINISHED",
        "line 2: os._exit",
        "line 6: ._state",
    ]


def test_only_the_guarded_module_relies_on_another_librarys_private_interface() -> None:
    """docs/contributing.rst: no reliance on another library's internals but in one guarded
    place (conn/_future_internals.py)."""
    offenders = {
        module: found
        for module, path in MODULES.items()
        if module != GUARDED and (found := private_reliance(path.read_text(encoding="utf-8")))
    }
    assert not offenders
    assert private_reliance(MODULES[GUARDED].read_text(encoding="utf-8"))  # it is the one
