"""Shared fixtures.

``workspace``: a session-wide scratch directory holding the outputs of the early pipeline
stages (prepare → base → bank → cold_start, and each training seed's bank and cold-start draw) run on a
*tiny* profile, so tests of the trainer, arms, checkpoints and search can start from real artefacts in
seconds. Paths are rooted at the workspace (``workspace.paths``), never at the working directory; tests must not
modify the shared artefacts (write under their own ``tmp_path``).

``smoke_recorded``: the whole smoke pipeline (``dvc repro`` in a clean copy of the repository,
every stage recording its reads), once per session; every end-to-end test shares it (the
kill-anywhere chain compares its interrupted ``lopd repro`` with it byte for byte).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Two torch processes on two cores (``make test`` runs two pytest workers): OpenMP's busy-wait would make
# each spin on the cores the other needs; passive waiting changes when threads sleep, never a result.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from lopd.compat.kernels import pin_kernels  # noqa: E402

# before any test imports torch and computes: in-process stages then use the kernels a stage
# process pins (lopd.cli does the same), whatever the CI runner's environment says
pin_kernels()

TINY = {
    "envs": {"n_train": 48, "n_val": 16, "n_test": 16, "n_target_worlds": 4, "n_pretrain_worlds": 96},
    "base": {"steps": 400},  # (as profiles/smoke.yaml: enough for the bank to hold successes)
    "bank": {"rollouts_per_task": 2},
    "cold_start": {"steps": 4, "batch_size": 8},
    "train": {"seeds": [0, 1], "steps": 2, "tasks_per_step": 8, "val_every": 2, "val_tasks": 8,
              "checkpoint_every": 1, "use_best_params": False},
    "hpo": {"n_trials": 3, "steps": 2, "val_every": 1, "seeds_per_trial": 1, "n_ret_max": 2, "baseline_arms": [],
            "searched_arms": [], "max_extensions": 0, "group_size_choices": [2, 4]},
    "confirm": {"efficiency_fractions": [], "efficiency_baseline": None},
}


@dataclass
class Workspace:
    root: Path
    params_path: Path

    @property
    def paths(self):
        from lopd.paths import Paths

        return Paths(self.root)

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
    from lopd.cli import main

    draws = [[cmd, "--draw", str(s)] for s in raw["train"]["seeds"] for cmd in ("bank", "cold-start")]
    for cmd in (["prepare"], ["base"], ["bank"], ["cold-start"], *draws):  # the draws: what `lopd train` reads
        rc = main(["--params", str(pp), *cmd])
        assert rc == 0, f"workspace stage {cmd} failed with {rc}"
    return Workspace(root=root, params_path=pp)


@pytest.fixture
def resources(workspace):
    """Loaded backbone, bank, φ0 and tasks of the workspace (fresh per test: adapters are mutated)."""
    from lopd.stages.common import load_resources

    return load_resources(workspace.params(), workspace.paths, role="train")


def copy_repo(dst: Path) -> Path:
    """A clean copy of the tracked source tree for end-to-end tests: no outputs, and no ``dvc.lock``
    (the committed one records the default profile's run; a smoke repro must not start from it, nor
    drag its ~140 entries through every lock rewrite)."""
    from lopd.utils import copy_checkout

    return copy_checkout(REPO, dst, exclude=["dvc.lock"])


# --------------------------------------------------------------------------- the shared smoke pipeline
BIN = Path(__import__("sys").executable).parent


def run_cmd(cmd: list[str], cwd: Path, timeout: int, **env_over):
    import subprocess

    env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", "DVC_NO_ANALYTICS": "1",
           "MLFLOW_DISABLE_TELEMETRY": "true", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com", **env_over}
    for k in [k for k, v in env.items() if v is None]:
        env.pop(k)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@dataclass
class Smoke:
    """A clean copy of the repository after ``dvc repro`` on the smoke profile."""

    repo: Path
    records: Path | None  # per-stage read records (LOPD_RECORD_DIR), or None
    seconds: float
    stdout: str


def make_smoke_repo(dst: Path) -> Path:
    repo = copy_repo(dst)
    for cmd in (["git", "init", "-q"], [str(BIN / "lopd"), "apply-profile", "profiles/smoke.yaml"],
                ["git", "add", "-A"], ["git", "commit", "-qm", "smoke"]):
        r = run_cmd(cmd, repo, 120)
        assert r.returncode == 0, r.stderr
    return repo


def run_smoke(dst: Path, record: bool) -> Smoke:
    import time

    repo = make_smoke_repo(dst)
    records = repo.parent / (repo.name + "-records") if record else None
    t0 = time.time()
    env = {"LOPD_RECORD_DIR": str(records)} if record else {"LOPD_WARM": "1"}
    r = run_cmd([str(BIN / "dvc"), "repro"], repo, 1800, **env)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return Smoke(repo=repo, records=records, seconds=time.time() - t0, stdout=r.stdout)


@pytest.fixture(scope="session")
def smoke_recorded(tmp_path_factory) -> Smoke:
    """The smoke pipeline, every stage recording its reads: forked from a warm worker that preloaded
    only the libraries (lopd.warm), so each stage imports, and records, its own ``lopd`` modules."""
    return run_smoke(tmp_path_factory.mktemp("smoke-rec") / "repo", record=True)


def default_params(over: dict | None = None):
    """params.yaml (the only source of defaults) with ``over`` merged in, validated."""
    from lopd.config import deep_merge, parse_params

    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    return parse_params(deep_merge(raw, over or {}), "params.yaml + test overrides")


def solved_train_tasks(res) -> list:
    """The train tasks the workspace's base policy solved (its experience bank's), for tests that
    need rewarded rollouts: in the worlds the 400-step test base rarely guesses a convention."""
    solved = {e.task_id for e in res.bank.entries}
    tasks = [t for t in res.train_tasks if t.task_id in solved]
    assert len(tasks) >= 8, f"the test workspace's bank solved only {len(tasks)} train tasks"
    return tasks


# --------------------------------------------------------------------------- two workers (pytest-xdist)
SMOKE_FIXTURES = ("smoke_recorded", "smoke_reference")
# The test files that use the shared smoke pipeline (a test file must name a fixture to use it).
SMOKE_FILES = {f.relative_to(REPO).as_posix() for f in Path(__file__).parent.rglob("test_*.py")
               if any(name in f.read_text() for name in SMOKE_FIXTURES)}
# Tests by speed, marked by folder: tests/unit needs no workspace (the whole set under a minute, make test-unit),
# tests/integration builds the tiny workspace or runs a stage in a subprocess, tests/e2e runs the smoke pipeline.
TIERS = ("unit", "integration", "e2e")


# The files that roll out the briefly trained tiny policy (tests/tiny_policy.py, cached per process): one worker
# trains it once for all of them (13 s of CPU each time: 400 steps and the demonstrations)
TRAINED_POLICY_FILES = {f.relative_to(REPO).as_posix() for f in Path(__file__).parent.rglob("test_*.py")
                        if "trained_backbone(" in f.read_text()}


def _group(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    if path in SMOKE_FILES:
        return "smoke-pipeline"
    return "trained-policy" if path in TRAINED_POLICY_FILES else path


def pytest_collection_modifyitems(config, items):
    """The smoke pipeline's files first (stable otherwise): under two workers the longest group starts
    at once, and alone the suite builds the pipeline before anything else, as it would anyway. A test that
    reaches a smoke fixture (through any fixture) from a file outside the group is an error: on another
    worker it would build a second pipeline and race the group's ``dvc`` runs."""
    stray = [item.nodeid for item in items if set(SMOKE_FIXTURES) & set(getattr(item, "fixturenames", ()))
             and _group(item.nodeid) != "smoke-pipeline"]
    if stray:
        raise pytest.UsageError(f"these tests use the smoke pipeline from files outside its worker group ({SMOKE_FIXTURES} "
                                f"must be named in the test file, tests/conftest.py SMOKE_FILES): {stray}")
    for item in items:
        tier = item.nodeid.split("/")[1] if item.nodeid.startswith("tests/") else ""
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
    items.sort(key=lambda item: _group(item.nodeid) != "smoke-pipeline")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``make test`` runs two workers (``-n 2``). Each test file runs on one worker as a whole, so its
    module-scoped fixtures (a Ray cluster, a trained tokenizer, the kill chain) are built once and its
    tests never race each other; every file of the shared smoke pipeline runs on one worker too, so the
    pipeline is built once and the tests that run ``dvc`` in its repository run one at a time. (A
    scheduler, not ``xdist_group`` marks: xdist 3.8 writes the group into ``item._nodeid``, which
    pytest 9 no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class FileGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    config.option.loadscopereorder = False  # collection order: the smoke pipeline's group first
    return FileGroups(config, log)
