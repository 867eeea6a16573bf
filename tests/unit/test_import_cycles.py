"""No import cycle among lopd's modules, counting the imports inside functions too (a lazy import is
still a dependency). The layering between packages is checked by lint-imports (pyproject.toml's
import-linter contracts, run by ``make test``); this covers the top-level modules it leaves free."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO


def import_graph(pkg: Path) -> dict[str, set[str]]:
    """Module -> the lopd modules it imports anywhere in its source (``from a import b`` names the
    module ``a.b`` when that is a module, else ``a``)."""
    mods = {}
    for p in pkg.rglob("*.py"):
        name = ".".join(p.relative_to(pkg.parent).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = p
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, p in mods.items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level and node.module in mods:
                graph[name] |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module
                                for a in node.names}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), or a module importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_lopd_has_no_import_cycle():
    graph = import_graph(REPO / "lopd")
    assert "lopd.dispatch" in graph["lopd.cli"] and "lopd.dispatch" in graph["lopd.warm"]
    assert cycles(graph) == []


def test_a_cycle_is_found():
    """The check can fail: the cli <-> warm cycle this layout removed is found."""
    graph = {"lopd.cli": {"lopd.warm"}, "lopd.warm": {"lopd.cli", "lopd.utils"}, "lopd.utils": set()}
    assert cycles(graph) == [["lopd.cli", "lopd.warm"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}}) == [["a", "b", "c"], ["d"]]
