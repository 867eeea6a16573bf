"""Shared fixtures.

``workspace``: a session-wide scratch directory holding the outputs of the early pipeline
stages (prepare → base → bank → cold_start) run on a *tiny* profile, so tests of the
trainer, arms, checkpoints and search can start from real artefacts in seconds. Tests
that change the working directory use ``monkeypatch.chdir(workspace.root)``; they must not
modify the shared artefacts (write under their own ``tmp_path`` or into ``runs/`` with a
unique name).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY = {
    "envs": {"n_train": 48, "n_val": 16, "n_test": 16},
    "base": {"steps": 250},
    "bank": {"rollouts_per_task": 2},
    "cold_start": {"steps": 4, "batch_size": 8},
    "train": {"seeds": [0, 1], "steps": 2, "tasks_per_step": 8, "val_every": 2, "val_tasks": 8,
              "checkpoint_every": 1, "use_best_params": False},
    "hpo": {"n_trials": 3, "steps": 2, "val_every": 1},
}


@dataclass
class Workspace:
    root: Path
    params_path: Path

    def params(self, **over):
        from lopd.config import deep_merge, parse_params

        raw = yaml.safe_load(self.params_path.read_text())
        return parse_params(deep_merge(raw, over), "test params")


def tiny_params_dict() -> dict:
    from lopd.config import deep_merge

    return deep_merge(yaml.safe_load((REPO / "params.yaml").read_text()), TINY)


@pytest.fixture(scope="session")
def workspace(tmp_path_factory) -> Workspace:
    root = tmp_path_factory.mktemp("ws")
    pp = root / "params.yaml"
    raw = tiny_params_dict()
    raw["tracking"]["uri"] = f"sqlite:///{root / 'mlflow.db'}"
    pp.write_text(yaml.safe_dump(raw))
    old = os.getcwd()
    os.chdir(root)
    try:
        from lopd.cli import main

        for cmd in ("prepare", "base", "bank", "cold-start"):
            rc = main(["--params", str(pp), cmd])
            assert rc == 0, f"workspace stage {cmd} failed with {rc}"
    finally:
        os.chdir(old)
    return Workspace(root=root, params_path=pp)


@pytest.fixture
def resources(workspace, monkeypatch):
    """Loaded backbone, bank, φ0 and tasks of the workspace (fresh per test: adapters are mutated)."""
    from lopd import stages

    monkeypatch.chdir(workspace.root)
    return stages.load_resources(workspace.params(), role="train")


def copy_repo(dst: Path) -> Path:
    """A clean copy of the tracked source tree (no outputs) for end-to-end tests."""
    import subprocess

    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.split()
    for f in files:
        src = REPO / f
        if not src.is_file():
            continue
        out = dst / f
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, out)
    return dst
