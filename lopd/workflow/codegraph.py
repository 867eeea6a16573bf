"""A stage's code dependencies, computed from the import graph rather than listed by hand.

The code a stage runs is the closure, over ``import`` statements, of the modules its process imports:
the ``lopd`` package, the command line's *runner* modules (:data:`RUNNER`) and the stage's own module.
Every ``import`` in a module is followed, those inside functions included (a statically reachable
import may run, so it is a dependency even when this configuration never takes that branch: the
closure over-approximates, which can only rerun a stage too often, never too rarely); an import under
``if TYPE_CHECKING:`` never runs and is not followed. The runner is
the exception: ``lopd.cli``, ``lopd.dispatch`` and ``lopd.warm`` serve every command, so only their
module-level imports are followed; what one command runs is named by a string in the stage registry
(:mod:`lopd.stages.registry`) and reached through that command's own module.

Importing ``a.b.c`` imports the packages ``a`` and ``a.b`` first, so their ``__init__.py`` files are
deps too. A package whose every ``.py`` file (recursively) is in the closure is written as its
directory, as a hand-written ``dvc.yaml`` would; DVC then also sees a new file in it (``.dvcignore``
keeps bytecode out).
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

PACKAGE = "lopd"
# The command-line modules every stage's process runs through; only their module-level imports are
# followed (their function-level imports serve the other commands: tools, the launcher, repro).
RUNNER = ("lopd.cli", "lopd.dispatch", "lopd.warm")


def package_root() -> Path:
    """The directory that holds the ``lopd`` package (the repository root)."""
    return Path(__file__).resolve().parents[2]


def module_file(module: str, root: Path) -> Path | None:
    """The source file of ``module`` under ``root`` (``a/b.py`` or ``a/b/__init__.py``), None if absent."""
    base = root.joinpath(*module.split("."))
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def _resolve(level: int, name: str | None, importer: str, is_pkg: bool) -> str:
    """The absolute module of a (possibly relative) ``from ... import`` / ``import``."""
    if level == 0:
        return name or ""
    parts = importer.split(".")
    base = parts if is_pkg else parts[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


@lru_cache(maxsize=None)
def _imports(path: Path, module: str, module_level_only: bool) -> tuple[str, ...]:
    """Every ``lopd`` module ``path`` imports: for ``from X import y``, ``X.y`` when that is a module
    (a submodule import), else ``X``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    root = package_root()
    # module-level only: what runs at import (under `if`/`try`, in a class body), not inside a function
    skip = (ast.FunctionDef, ast.AsyncFunctionDef) if module_level_only else ()
    nodes = list(_walk(tree.body, skip))
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == PACKAGE}
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node.level, node.module, module, is_pkg)
            if base.split(".")[0] != PACKAGE:
                continue
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names if module_file(f"{base}.{a.name}", root)}
    return tuple(sorted(m for m in out if module_file(m, root)))


def _is_type_checking(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` / ``if typing.TYPE_CHECKING:``: a block that never runs."""
    t = node.test if isinstance(node, ast.If) else None
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _walk(body: list[ast.stmt], skip: tuple) -> list[ast.AST]:
    """Every node under ``body``, but not inside a ``skip`` node nor in an ``if TYPE_CHECKING:`` block (its
    ``else`` is walked): imports for annotations only never run, so they are no dependency."""
    out: list[ast.AST] = []
    todo: list[ast.AST] = list(body)
    while todo:
        node = todo.pop()
        if skip and isinstance(node, skip):
            continue
        out.append(node)
        if _is_type_checking(node):
            todo += node.orelse
            continue
        todo += list(ast.iter_child_nodes(node))
    return out


def _with_parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def closure(entry_modules: list[str] | tuple[str, ...], runner: tuple[str, ...] = RUNNER) -> set[str]:
    """The ``lopd`` modules reachable from ``entry_modules`` (their parent packages included)."""
    root = package_root()
    seen: set[str] = set()
    todo = [p for m in entry_modules for p in _with_parents(m)]
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        path = module_file(mod, root)
        if path is None:
            raise ValueError(f"no module {mod!r} under {root}")
        seen.add(mod)
        for dep in _imports(path, mod, mod in runner):
            todo += [p for p in _with_parents(dep) if p not in seen]
    return seen


def files_of(modules: set[str]) -> set[str]:
    """Repository-relative source files (posix) of ``modules``."""
    root = package_root()
    return {module_file(m, root).relative_to(root).as_posix() for m in modules}


def collapse(files: set[str]) -> list[str]:
    """``files`` with each package directory all of whose ``.py`` files (recursively) are listed
    written as the directory (the outermost such directory); sorted."""
    root = package_root()
    out = set(files)
    for d in sorted(_ancestors(files), key=lambda d: d.count("/")):
        if any(d.startswith(o + "/") for o in out):
            continue  # inside a directory already collapsed
        members = {p.relative_to(root).as_posix() for p in (root / d).rglob("*.py") if "__pycache__" not in p.parts}
        if members and members <= files:
            out = (out - members) | {d}
    return sorted(out)


def _ancestors(files: set[str]) -> set[str]:
    """The directories below the package that hold ``files``."""
    out: set[str] = set()
    for f in files:
        p = Path(f).parent
        while p.as_posix() not in (PACKAGE, "."):
            out.add(p.as_posix())
            p = p.parent
    return out


def code_deps(entry_modules: list[str] | tuple[str, ...]) -> list[str]:
    """The code deps of a stage whose process imports ``entry_modules`` (beside the runner), as
    ``dvc.yaml`` lists them."""
    return collapse(files_of(closure([*RUNNER, *entry_modules])))
