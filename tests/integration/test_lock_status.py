"""``lopd lock-status`` (:mod:`lopd.workflow.lockstale`): a committed ``dvc.lock`` must describe the tree that
commits it. On a toy pipeline it is fresh after ``dvc repro`` and names each planted edit: a code dependency, a
params key, a committed report; an output merely absent from the cache is not staleness. The repository's own
lock is checked too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lopd.workflow.lockstale import _produced, stale
from tests.conftest import REPO

STEP = "import yaml, pathlib\nx = yaml.safe_load(open('params.yaml'))['a']['x']\n" \
       "pathlib.Path('reports').mkdir(exist_ok=True)\npathlib.Path('reports/out.md').write_text(f'x = {x}\\n')\n" \
       "pathlib.Path('model.txt').write_text(str(x))\n"
DVC_YAML = """stages:
  step:
    cmd: python step.py
    deps: [step.py]
    params: [a.x]
    outs:
      - model.txt
      - reports/out.md: {cache: false}
"""


def _dvc(cwd: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd, check=True, capture_output=True, text=True)


def test_a_fresh_lock_passes_and_each_planted_edit_is_named(tmp_path):
    (tmp_path / "step.py").write_text(STEP)
    (tmp_path / "params.yaml").write_text("a: {x: 1, y: 2}\n")
    (tmp_path / "dvc.yaml").write_text(DVC_YAML)
    _dvc(tmp_path, "init", "--no-scm", "-q")
    _dvc(tmp_path, "repro", "-q")
    assert stale(tmp_path) == []
    (tmp_path / "model.txt").unlink()
    _dvc(tmp_path, "gc", "-w", "-f", "-q")  # a clone without the cache: the output is absent, not stale
    assert stale(tmp_path) == []

    def planted(path: str, text: str) -> list[str]:
        before = (tmp_path / path).read_text()
        (tmp_path / path).write_text(text)
        try:
            return stale(tmp_path)
        finally:
            (tmp_path / path).write_text(before)

    assert planted("step.py", STEP + "# an edit\n") == ["step: dependency step.py modified"]
    assert planted("params.yaml", "a: {x: 3, y: 2}\n") == ["step: params a.x modified"]
    assert planted("params.yaml", "a: {x: 1, y: 5}\n") == []  # a key no stage reads
    assert planted("reports/out.md", "x = 2\n") == ["step: committed output reports/out.md modified"]
    assert stale(tmp_path) == []


def test_a_dependency_above_or_below_a_stage_output_is_produced_not_committed():
    outs = {"models/draws/bank-0", "data/confirm"}
    assert _produced("models/draws", outs)  # a folder holding outputs (a fresh clone has none of it)
    assert _produced("data/confirm/manifest.json", outs)  # a file inside an output
    assert _produced("data/confirm/", outs)
    assert not _produced("models/draw", outs)  # a prefix of a name is not a parent folder
    assert not _produced("data/confirmation.yaml", outs)
    assert not _produced("registration/ledger.yaml", outs)


def test_the_committed_lock_describes_the_committed_tree():
    lines = stale(REPO)
    assert lines == [], f"{len(lines)} differences, e.g. {lines[:5]} (lopd lock-status lists them)"
