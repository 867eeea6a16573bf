"""DVC behind one door. pyproject.toml's import-linter contract forbids ``dvc`` in every lopd module but the DVC
tooling (``lopd.workflow``), the launcher (``lopd.launch``) and the adapter (``lopd.compat.dvc``); lint-imports sees
an external package only as a whole, so which *parts* of DVC are read is checked here: its internals (the modules
``lopd.compat.dvc.INTERNALS`` lists) only in the adapter, and the public API (``dvc.cli``, ``dvc.repo``, ...)
only behind the door."""

from __future__ import annotations

import tomllib
from pathlib import Path

from lopd.compat import dvc as compat_dvc
from tests.conftest import REPO
from tests.unit.test_dependencies import absolute_imports

PACKAGE = REPO / "lopd"
DOOR = {"lopd.workflow", "lopd.launch", "lopd.compat.dvc"}
CONTRACT = "DVC behind one door"


def _module(path: Path, root: Path = REPO) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def dvc_imports(package: Path = PACKAGE) -> dict[str, set[str]]:
    """lopd module -> the ``dvc`` modules it imports anywhere in its source (inside functions too)."""
    found: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        for name in absolute_imports(path):
            if name == "dvc" or name.startswith("dvc."):
                found.setdefault(_module(path, package.parent), set()).add(name)
    return found


def _behind(module: str, door: set[str] = DOOR) -> bool:
    return any(module == d or module.startswith(d + ".") for d in door)


def _contract(pyproject: Path = REPO / "pyproject.toml") -> dict:
    contracts = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["name"].startswith(CONTRACT)]
    return contract


def test_dvc_internals_are_read_only_in_the_adapter():
    internal = {module for module, _ in compat_dvc.INTERNALS}
    readers = {m: {n for n in names if any(n == i or n.startswith(i + ".") for i in internal)}
               for m, names in dvc_imports().items()}
    assert {m for m, names in readers.items() if names} == {"lopd.compat.dvc"}, readers


def test_dvc_is_imported_only_behind_the_door():
    outside = {m: names for m, names in dvc_imports().items() if not _behind(m)}
    assert not outside, f"dvc imported outside {sorted(DOOR)}: {outside}"


def test_the_contract_covers_every_module_but_the_door():
    """A new top-level module (or compat adapter) must be named in the contract, or this fails with its name."""
    tops = {f"lopd.{p.stem}" for p in PACKAGE.iterdir()
            if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())}
    compat = {_module(p) for p in (PACKAGE / "compat").glob("*.py") if p.stem != "__init__"}
    expected = (tops - {"lopd.compat"} | compat) - DOOR
    contract = _contract()
    assert contract["forbidden_modules"] == ["dvc"]
    assert set(contract["source_modules"]) == expected, (
        f"missing from the contract: {sorted(expected - set(contract['source_modules']))}; "
        f"not lopd modules: {sorted(set(contract['source_modules']) - expected)}")


def test_the_scan_sees_a_lazy_import_of_an_internal(tmp_path):
    pkg = tmp_path / "lopd"
    (pkg / "stages").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "stages" / "__init__.py").write_text("")
    (pkg / "stages" / "x.py").write_text("def f():\n    from dvc.schema import COMPILED_LOCKFILE_SCHEMA\n"
                                         "    import dvc.repo\n")
    assert dvc_imports(pkg) == {"lopd.stages.x": {"dvc.schema", "dvc.repo"}}
