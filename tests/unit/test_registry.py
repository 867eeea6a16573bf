"""The stage registry (lopd/stages/registry.py) and the dvc.yaml written from it: the committed
dvc.yaml is exactly what ``lopd dvc-yaml`` writes, a stage's code deps follow the import graph, and
the command line, dispatch and the warm preload come from the registry. No pipeline runs here."""

from __future__ import annotations

import textwrap

import pytest
import yaml

from lopd.dispatch import STAGE_COMMANDS, parser
from lopd.stages import registry
from lopd.workflow import codegraph, dvcgen
from tests.conftest import REPO


def test_the_committed_dvc_yaml_is_what_the_registry_writes():
    committed = (REPO / "dvc.yaml").read_text()
    assert committed == dvcgen.render(), "dvc.yaml is stale: run `.venv/bin/lopd dvc-yaml` and commit it"


def test_the_written_dvc_yaml_parses_to_the_registry():
    dvc = yaml.safe_load(dvcgen.render())
    assert list(dvc["stages"]) == [s.name for s in registry.STAGES]
    for st in registry.STAGES:
        got = dvc["stages"][st.name]
        assert got["cmd"] == " ".join(p for p in ("lopd", st.command, st.argv) if p)
        assert got.get("params", []) == list(st.params)
        assert got.get("matrix") == st.matrix
        assert [d for d in got.get("deps", []) if not d.startswith("lopd")][:len(st.deps)] == list(st.deps)
    assert registry.check() == []


def test_every_stage_module_is_a_command_and_every_command_is_parsed():
    assert {c.name for c in registry.COMMANDS} == set(STAGE_COMMANDS)
    sub = next(a for a in parser()._actions if a.dest == "cmd")
    assert set(STAGE_COMMANDS) <= set(sub.choices)
    for c in registry.COMMANDS:  # every module exists and has a run
        assert codegraph.module_file(c.module, codegraph.package_root()) is not None, c.module
    stage_files = {p.stem for p in (REPO / "lopd" / "stages").glob("*.py")} - {"__init__", "common", "registry"}
    assert stage_files == {c.module.rsplit(".", 1)[1] for c in registry.COMMANDS}


def _toy_package(root, monkeypatch, files: dict[str, str]):
    """A toy ``lopd`` package of ``files`` under ``root``, which the code graph then reads (its import cache
    cleared now; the autouse fixture below clears it after the test)."""
    pkg = root / "lopd"
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    monkeypatch.setattr(codegraph, "package_root", lambda: root)
    codegraph._imports.cache_clear()
    return pkg


@pytest.fixture(autouse=True)
def _fresh_import_cache():
    yield
    codegraph._imports.cache_clear()  # a toy package's imports must not outlive its test


def test_code_deps_follow_imports_and_a_new_import_reaches_the_stage(tmp_path, monkeypatch):
    """A toy package: the stage module imports ``a`` inside a function, ``a`` imports ``b`` at module
    level; the runner's function-level imports (the tools) are not followed. Add an import to ``b`` and
    the stage's deps grow with no hand edit."""
    files = {
        "__init__.py": "", "cli.py": "from lopd import dispatch\n",
        "dispatch.py": "import os\nfrom lopd.stages import registry\n\ndef tool():\n    from lopd import tools\n",
        "warm.py": "", "tools.py": "", "stages/__init__.py": "", "stages/registry.py": "",
        "stages/toy.py": "def run(params, paths):\n    from lopd.lib import a\n", "stages/other.py": "",
        "lib/__init__.py": "", "lib/a.py": "from . import b\n", "lib/b.py": "", "lib/c.py": "",
    }
    pkg = _toy_package(tmp_path, monkeypatch, files)
    deps = codegraph.code_deps(["lopd.stages.toy"])
    assert "lopd/tools.py" not in deps  # only the runner's module-level imports are followed
    assert {"lopd/lib/a.py", "lopd/lib/b.py", "lopd/lib/__init__.py", "lopd/stages/toy.py"} <= set(deps)
    assert "lopd/lib/c.py" not in deps and "lopd/lib" not in deps
    (pkg / "lib" / "b.py").write_text("from lopd.lib.c import x\n")  # a new import
    codegraph._imports.cache_clear()
    assert "lopd/lib" in codegraph.code_deps(["lopd.stages.toy"])  # every file of lopd/lib: its directory


def test_a_toy_stage_touches_the_registry_and_its_module_only(monkeypatch):
    """The recipe of docs/architecture.md: a stage module and one Command and one Stage entry; the
    parser, dispatch and dvc.yaml pick it up."""
    cmd = registry.Command("toy", "lopd.stages.report", "a toy stage", (registry.Arg(("--n",), type=int),))
    st = registry.Stage("toy", "toy", "--n 3", deps=("data/splits/manifest.json",), params=("report.alpha",),
                        outs=("results/toy",))
    monkeypatch.setattr(registry, "COMMANDS", (*registry.COMMANDS, cmd))
    monkeypatch.setattr(registry, "STAGES", (*registry.STAGES, st))
    monkeypatch.setattr(dvcgen, "COMMANDS", registry.COMMANDS)
    monkeypatch.setattr(dvcgen, "STAGES", registry.STAGES)
    text = dvcgen.render()
    toy = yaml.safe_load(text)["stages"]["toy"]
    assert toy["cmd"] == "lopd toy --n 3" and toy["outs"] == ["results/toy"]
    assert "lopd/stages/report.py" in toy["deps"] and toy["deps"][0] == "data/splits/manifest.json"
    monkeypatch.setattr("lopd.dispatch.COMMANDS", registry.COMMANDS)
    sub = next(a for a in parser()._actions if a.dest == "cmd")
    assert sub.choices["toy"].parse_args(["--n", "3"]).n == 3


def test_the_check_names_a_stale_line(tmp_path, capsys):
    (tmp_path / "dvc.yaml").write_text(dvcgen.render().replace("cmd: lopd prepare", "cmd: lopd prepare --x"))
    assert dvcgen.write(tmp_path, check_only=True) == 1
    assert "cmd: lopd prepare --x" in capsys.readouterr().out
    assert dvcgen.write(tmp_path) == 0 and dvcgen.write(tmp_path, check_only=True) == 0


def test_scalars_that_need_quotes_are_quoted():
    for s in ("${train.seeds}", "models/draws/bank-${item.seed}", "a: b", "plain/path.py", "true"):
        assert yaml.safe_load(textwrap.dedent(f"x: [{dvcgen._scalar(s, True)}]"))["x"] == [s]
        assert yaml.safe_load(f"x: {dvcgen._scalar(s, False)}")["x"] == s


def test_imports_for_annotations_only_are_no_dependency(tmp_path, monkeypatch):
    files = {"__init__.py": "", "cli.py": "", "dispatch.py": "", "warm.py": "", "stages/__init__.py": "",
             "stages/other.py": "", "heavy.py": "", "light.py": "",
             "stages/toy.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from lopd import heavy\n"
                              "else:\n    from lopd import light\n"}
    _toy_package(tmp_path, monkeypatch, files)
    deps = codegraph.code_deps(["lopd.stages.toy"])
    assert "lopd/light.py" in deps and "lopd/heavy.py" not in deps
