"""The DVC pipeline: structure checks on dvc.yaml and one end-to-end ``dvc repro`` on the
smoke profile in a scratch copy of the repository."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, copy_repo

BIN = Path(sys.executable).parent


def _stage_deps(dvc: dict) -> dict[str, list[str]]:
    return {name: [str(d) for d in (st.get("deps") or [])] for name, st in dvc["stages"].items()}


def _reads_test(dep: str) -> bool:
    d = dep.rstrip("/")
    return d.endswith("test.jsonl") or d in ("data", "data/splits")


def test_only_evaluate_depends_on_the_test_split():
    dvc = yaml.safe_load((REPO / "dvc.yaml").read_text())
    offenders = {s: [d for d in deps if _reads_test(d)] for s, deps in _stage_deps(dvc).items()}
    offenders = {s: d for s, d in offenders.items() if d and s != "evaluate"}
    assert not offenders, f"stages other than evaluate depend on the test split: {offenders}"
    assert any(_reads_test(d) for d in _stage_deps(dvc)["evaluate"]), "evaluate must read the test split"


def test_detector_catches_a_test_dependency():
    """The check above can fail: a stage depending on test.jsonl or the whole splits dir is caught."""
    bad = {"stages": {"hpo": {"deps": ["data/splits/val.jsonl", "data/splits/test.jsonl"]},
                      "bank": {"deps": ["data/splits"]}}}
    found = {s for s, deps in _stage_deps(bad).items() if any(_reads_test(d) for d in deps)}
    assert found == {"hpo", "bank"}


def test_train_and_evaluate_matrix_cover_every_arm_and_seed():
    from lopd.arms import ARMS
    from lopd.config import load_params

    p = load_params(REPO / "params.yaml")
    assert set(p.train.arms) == set(ARMS), "the default profile runs every arm"
    assert len(p.train.seeds) >= 5 and p.hpo.n_trials >= 16
    dvc = yaml.safe_load((REPO / "dvc.yaml").read_text())
    for stage in ("train", "evaluate"):
        assert dvc["stages"][stage]["matrix"] == {"arm": "${train.arms}", "seed": "${train.seeds}"}


def _run(cmd: list[str], cwd: Path, timeout: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", "DVC_NO_ANALYTICS": "1",
           "MLFLOW_DISABLE_TELEMETRY": "true", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_dvc_repro_smoke_end_to_end(tmp_path):
    repo = copy_repo(tmp_path / "repo")
    for cmd in (["git", "init", "-q"], [str(BIN / "lopd"), "apply-profile", "profiles/smoke.yaml"]):
        r = _run(cmd, repo, 60)
        assert r.returncode == 0, r.stderr
    t0 = time.time()
    r = _run([str(BIN / "dvc"), "repro"], repo, 900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    print(f"smoke dvc repro: {time.time() - t0:.0f} s")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    arms, seeds = params["train"]["arms"], params["train"]["seeds"]
    expected = ["data/splits/manifest.json", "models/base/model/config.json", "models/bank/manifest.json",
                "models/cold_start/phi0.safetensors", "results/probe/result.json", "hpo/best_params.yaml",
                "hpo/trials.csv", "hpo/journal.log", "results/sensitivity/grid.csv", "reports/summary.json",
                "reports/main_table.md", "reports/falsification.md", "reports/leakage_audit.md",
                "reports/figures/margin_dynamics.png"]
    for a in arms:
        for s in seeds:
            expected += [f"runs/{a}-{s}/result.json", f"runs/{a}-{s}/history.csv", f"runs/{a}-{s}/student.safetensors",
                         f"results/eval/{a}-{s}/result.json", f"results/eval/{a}-{s}/per_task.json"]
    missing = [e for e in expected if not (repo / e).exists()]
    assert not missing, f"missing outputs: {missing}"
    summary = json.loads((repo / "reports/summary.json").read_text())
    assert set(summary["test_reward"]) == set(arms)
    st = _run([str(BIN / "dvc"), "status"], repo, 120)
    assert st.returncode == 0 and "up to date" in st.stdout, st.stdout
    again = _run([str(BIN / "dvc"), "repro"], repo, 300)
    assert again.returncode == 0
    assert "Running stage" not in again.stdout, f"a second repro re-ran stages:\n{again.stdout}"

    # changing only a report parameter reruns only the report
    params["report"]["n_boot"] = params["report"]["n_boot"] + 1
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    rep = _run([str(BIN / "dvc"), "repro"], repo, 300)
    assert rep.returncode == 0, rep.stdout[-3000:] + rep.stderr[-3000:]
    ran = [ln for ln in rep.stdout.splitlines() if "Running stage" in ln]
    assert ran == ["Running stage 'report':"], ran

    # `dvc exp run -S hpo.n_trials=...` resumes the study: the finished trials are kept, one is added
    n = params["hpo"]["n_trials"]
    before = (repo / "hpo/trials.csv").read_text().splitlines()
    for cmd in (["git", "add", "-A"], ["git", "commit", "-qm", "smoke"]):
        r = _run(cmd, repo, 60)
        assert r.returncode == 0, r.stderr
    exp = _run([str(BIN / "dvc"), "exp", "run", "hpo", "-S", f"hpo.n_trials={n + 1}"], repo, 600)
    assert exp.returncode == 0, exp.stdout[-3000:] + exp.stderr[-3000:]
    states = json.loads((repo / "hpo/result.json").read_text())["trial_states"]
    assert states["COMPLETE"] + states["PRUNED"] == n + 1 and states["FAIL"] == 0, states
    after = (repo / "hpo/trials.csv").read_text().splitlines()
    assert len(after) == len(before) + 1 and after[:len(before)] == before, (before, after)
