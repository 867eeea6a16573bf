"""Every ``from lopd... import name`` in bench/ names something that exists.

The bench scripts import lopd lazily (inside functions, after their argument parsing), and no test
runs them, so a module that moves breaks a bench only when someone runs it. This checks each such
import statically: the module imports and has the name.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _lopd_imports() -> list[tuple[str, str, str]]:
    out = []
    for path in sorted((REPO / "bench").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "lopd":
                out += [(path.name, node.module, a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                out += [(path.name, a.name, "") for a in node.names if a.name.split(".")[0] == "lopd"]
    return out


def _resolves(module: str, name: str) -> bool:
    try:
        mod = importlib.import_module(module)
        if name and not hasattr(mod, name):
            importlib.import_module(f"{module}.{name}")  # a submodule imported by name
    except ImportError:
        return False
    return True


def test_every_bench_import_of_lopd_resolves():
    imports = _lopd_imports()
    assert len(imports) > 20, "the bench scripts' lopd imports were not found"
    broken = [f"bench/{s}: from {m} import {n}" for s, m, n in imports if not _resolves(m, n)]
    assert not broken, "bench scripts import what lopd no longer has:\n" + "\n".join(broken)
