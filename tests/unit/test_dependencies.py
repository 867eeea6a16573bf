"""Every third-party module that lopd/ imports is declared in pyproject.toml: in ``project.dependencies`` or
in one of the optional extras (``make setup`` installs them), not merely brought in by another package."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "lopd"


def _normalise(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def declared_distributions(pyproject: Path = REPO / "pyproject.toml") -> set[str]:
    """Normalised names of every requirement in project.dependencies and in every optional extra."""
    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = [*project.get("dependencies", []), *(r for extra in project.get("optional-dependencies", {}).values()
                                                  for r in extra)]
    return {_normalise(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", r).group(1)) for r in reqs}


def absolute_imports(path: Path) -> list[str]:
    """The dotted module names of every absolute ``import`` and ``from ... import`` in ``path``, inside
    functions too (``from a.b import c`` names ``a.b``)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def imported_modules(package: Path = PACKAGE, root: Path = REPO) -> dict[str, set[str]]:
    """Top-level module name -> the files under ``package`` (relative to ``root``) importing it, for every
    absolute ``import`` and ``from ... import`` (inside functions too), leaving out the standard library,
    lopd itself and a sibling module imported by its bare name (the sandbox child runs its own files from
    a temp dir)."""
    found: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        for name in absolute_imports(path):
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or top == "lopd" or top == "__future__":
                continue
            if (path.parent / f"{top}.py").exists() or (path.parent / top / "__init__.py").exists():
                continue
            found.setdefault(top, set()).add(path.relative_to(root).as_posix())
    return found


def undeclared(modules: dict[str, set[str]], declared: set[str]) -> list[str]:
    """One line per module none of whose distributions is declared (a module no installed distribution
    provides counts as the distribution of its own name)."""
    dists = importlib.metadata.packages_distributions()
    lines = []
    for module, files in sorted(modules.items()):
        provided_by = dists.get(module) or [module]
        if not declared & {_normalise(d) for d in provided_by}:
            lines.append(f"{module} (distribution {' or '.join(sorted(set(provided_by)))}) imported by "
                         f"{', '.join(sorted(files))}")
    return lines


def test_every_third_party_import_is_declared():
    modules = imported_modules()
    assert {"torch", "numpy", "yaml", "psutil"} <= set(modules), sorted(modules)  # the scan sees imports
    missing = undeclared(modules, declared_distributions())
    assert not missing, "undeclared in pyproject.toml:\n" + "\n".join(missing)


def test_an_undeclared_import_is_reported_with_its_file(tmp_path):
    pkg = tmp_path / "lopd"
    pkg.mkdir()
    (pkg / "a.py").write_text("import os\nimport yaml\n\ndef f():\n    from psutil import Process\n")
    (pkg / "b.py").write_text("from lopd import a\nfrom . import a as c\nimport plain_sibling\n")
    (pkg / "plain_sibling.py").write_text("")
    modules = imported_modules(pkg, tmp_path)
    assert modules == {"yaml": {"lopd/a.py"}, "psutil": {"lopd/a.py"}}
    assert undeclared(modules, {"pyyaml"}) == ["psutil (distribution psutil) imported by lopd/a.py"]
