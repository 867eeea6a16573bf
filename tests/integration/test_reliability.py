"""Reliability: kill/resume, determinism, NaN divergence, an infeasible margin, corrupt
checkpoints, concurrent and killed searches, and the sealed test split.

End-to-end cases run the real stage scripts as subprocesses in copies of the tiny
workspace (its validation split cut to 4 tasks so each process is quick); the others
call the stage code in-process on the shared ``resources``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from lopd.errors import RunFailed, SplitAccessError
from tests.conftest import solved_train_tasks

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
TIMEOUT = 300  # seconds: bound on every subprocess and every poll


# ------------------------------------------------------------------ helpers


def make_copy(src: Path, dst: Path, n_val: int = 4, **sections) -> Path:
    """Copy the workspace's inputs (splits, models, MLflow db) to ``dst``;
    params.yaml gets ``sections`` merged in and its own tracking store; the val split is cut
    to ``n_val`` tasks (manifest hash updated)."""
    dst.mkdir(parents=True)
    for d in ("data", "models"):
        shutil.copytree(src / d, dst / d)
    if (src / "mlflow.db").exists():
        shutil.copy2(src / "mlflow.db", dst / "mlflow.db")
    raw = yaml.safe_load((src / "params.yaml").read_text())
    raw["tracking"]["uri"] = f"sqlite:///{dst / 'mlflow.db'}"
    for sec, vals in sections.items():
        raw[sec].update(vals)
    (dst / "params.yaml").write_text(yaml.safe_dump(raw))
    if n_val:
        sp = dst / "data" / "splits"
        by_domain: dict[str, list[str]] = {}
        for line in (sp / "val.jsonl").read_text().splitlines():
            by_domain.setdefault(json.loads(line)["domain"], []).append(line)
        keep = [ln for lines in by_domain.values() for ln in lines[: max(1, n_val // len(by_domain))]]
        (sp / "val.jsonl").write_text("\n".join(keep) + "\n")
        manifest = json.loads((sp / "manifest.json").read_text())
        manifest["files"]["val"].update(sha256=hashlib.sha256((sp / "val.jsonl").read_bytes()).hexdigest(),
                                        n=len(keep))
        (sp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return dst


def _env() -> dict:
    env = dict(os.environ)
    env.update(PYTHONPATH=str(REPO), MLFLOW_DISABLE_TELEMETRY="true", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    return env


def start(cmd: list[str], cwd: Path, log: str) -> subprocess.Popen:
    f = open(cwd / log, "w")
    p = subprocess.Popen(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, env=_env())
    f.close()
    return p


def finish(p: subprocess.Popen, cwd: Path, log: str) -> tuple[int, str]:
    try:
        rc = p.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        rc = None
    return rc, (cwd / log).read_text()


def run(cmd: list[str], cwd: Path, log: str) -> tuple[int, str]:
    return finish(start(cmd, cwd, log), cwd, log)


def stop(*procs: subprocess.Popen) -> None:
    """Kill what is still running (a failed test must not leave processes behind)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def wait_for(pred, proc: subprocess.Popen, what: str, timeout: float = TIMEOUT, every: float = 0.2):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = pred()
        if v:
            return v
        if proc.poll() is not None:
            pytest.fail(f"the process ended (rc {proc.returncode}) before {what}")
        time.sleep(every)
    proc.kill()
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


TRAIN = [PY, "-m", "lopd.cli", "train", "--arm", "lopd", "--seed", "0"]
ONE_THREAD = {"torch_threads": 1}  # several processes share the CPUs
RESUME_TRAIN = {"steps": 6, "checkpoint_every": 1, "use_best_params": False, "val_every": 3, "tasks_per_step": 4}


def _ckpt_step(ckpt: Path):
    from lopd.training.checkpoint import load_checkpoint

    if not (ckpt / "meta.json").exists():
        return None
    try:
        return load_checkpoint(ckpt)[1]["step"]
    except Exception:  # noqa: BLE001 - being replaced right now; poll again
        return None


# ------------------------------------------------------------------ kill / resume / determinism


@pytest.fixture(scope="module")
def train_copies(workspace, tmp_path_factory):
    """Three copies run ``lopd train --arm lopd --seed 0`` (6 steps) side by side: A and B
    uninterrupted, C SIGKILLed after its step-2 checkpoint and then rerun to completion."""
    base = tmp_path_factory.mktemp("train")
    a, b, c = (make_copy(workspace.root, base / n, train=RESUME_TRAIN, model=ONE_THREAD) for n in "abc")
    t_start = int(time.time() * 1000)
    procs = {n: start(TRAIN, d, "first.log") for n, d in (("a", a), ("b", b), ("c", c))}
    try:
        ckpt = c / "checkpoints" / "lopd-0"
        killed_at = wait_for(lambda: (s := _ckpt_step(ckpt)) is not None and s >= 2 and s, procs["c"],
                             "a checkpoint at step >= 2")
        procs["c"].send_signal(signal.SIGKILL)
        rc_killed, _ = finish(procs["c"], c, "first.log")
        rc_resumed, log_resumed = run(TRAIN, c, "resume.log")
        out = {"dirs": {"a": a, "b": b, "c": c}, "killed_at": killed_at, "rc_killed": rc_killed,
               "rc_resumed": rc_resumed, "log_resumed": log_resumed, "t_start": t_start}
        for n in "ab":
            out[f"rc_{n}"], out[f"log_{n}"] = finish(procs[n], {"a": a, "b": b}[n], "first.log")
    finally:
        stop(*procs.values())
    return out


def test_resume_after_kill_is_byte_identical(train_copies):
    tc = train_copies
    a, c = tc["dirs"]["a"], tc["dirs"]["c"]
    assert tc["rc_killed"] == -signal.SIGKILL, "the run finished before it could be killed"
    assert tc["rc_a"] == 0, tc["log_a"][-3000:]
    assert tc["rc_resumed"] == 0, tc["log_resumed"][-3000:]
    meta = json.loads((c / ".lopd/meta/train-lopd-0.json").read_text())
    assert meta["resumed_from_step"] >= 2
    for f in ("result.json", "history.csv"):
        assert (c / "runs/lopd/seed-0" / f).read_bytes() == (a / "runs/lopd/seed-0" / f).read_bytes(), f
    assert (c / "runs/lopd/seed-0/student.safetensors").read_bytes() == (a / "runs/lopd/seed-0/student.safetensors").read_bytes()
    assert not (c / "checkpoints/lopd-0").exists()  # replaced by the finished run's outputs


def test_resume_after_kill_marks_stale_mlflow_run(train_copies):
    from mlflow.tracking import MlflowClient

    tc = train_copies
    c = tc["dirs"]["c"]
    assert tc["rc_resumed"] == 0
    new_id = json.loads((c / ".lopd/meta/train-lopd-0.json").read_text())["mlflow_run_id"]
    client = MlflowClient(tracking_uri=f"sqlite:///{c / 'mlflow.db'}")
    exp = client.get_experiment_by_name("lopd")
    runs = [r for r in client.search_runs([exp.experiment_id], filter_string="tags.stage = 'train'")
            if r.info.run_name == "lopd · seed 0" and r.info.start_time >= tc["t_start"]]
    old = [r for r in runs if r.info.run_id != new_id]
    assert len(old) == 1, [(r.info.run_id, r.info.status) for r in runs]
    assert old[0].info.status in ("KILLED", "FAILED")
    assert client.get_run(new_id).data.tags.get("resumed_from_run") == old[0].info.run_id


def test_same_stage_and_seed_twice_is_byte_identical(train_copies):
    tc = train_copies
    a, b = tc["dirs"]["a"], tc["dirs"]["b"]
    assert tc["rc_a"] == 0, tc["log_a"][-3000:]
    assert tc["rc_b"] == 0, tc["log_b"][-3000:]
    for f in ("result.json", "history.csv", "student.safetensors", "composer.safetensors"):
        assert (a / "runs/lopd/seed-0" / f).read_bytes() == (b / "runs/lopd/seed-0" / f).read_bytes(), f


# ------------------------------------------------------------------ in-process failure modes


def _params_file(workspace, tmp_path: Path, **sections) -> Path:
    raw = yaml.safe_load(workspace.params_path.read_text())
    for sec, vals in sections.items():
        raw[sec].update(vals)
    p = tmp_path / "params.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


SMALL = {"tasks_per_step": 4, "val_every": 100, "val_tasks": 2, "checkpoint_every": 1, "use_best_params": False}


@pytest.fixture
def stage_dirs(resources, tmp_path, monkeypatch):
    """Stage outputs under tmp_path (the root of a params file written there), and the train stage
    reuses the already loaded resources."""
    import lopd.stages.train as train_stage

    resources.val_tasks = resources.val_tasks[:4]
    monkeypatch.setattr(train_stage, "load_resources", lambda *a, **k: resources)
    return tmp_path


def test_nan_loss_fails_cleanly_with_last_checkpoint(workspace, resources, stage_dirs, monkeypatch, capsys):
    import lopd.training.trainer as trainer_mod
    import lopd.stages.train as train_stage
    from lopd.paths import Paths
    from lopd.training.checkpoint import load_checkpoint
    from lopd.cli import main

    real = trainer_mod.obj.reverse_kl_topm_tail
    calls = {"n": 0, "nan_from": 2}

    def nan_at_step(*a, **k):
        calls["n"] += 1
        r = real(*a, **k)
        return r._replace(loss=r.loss * float("nan")) if calls["n"] >= calls["nan_from"] else r

    monkeypatch.setattr(trainer_mod.obj, "reverse_kl_topm_tail", nan_at_step)
    params = workspace.params(train={**SMALL, "steps": 3})
    with pytest.raises(RunFailed) as ei:
        train_stage.run(params, Paths(stage_dirs), "lopd", 0)
    msg = str(ei.value)
    assert "non-finite loss" in msg and "step 2" in msg and "checkpoint" in msg
    ckpt = stage_dirs / "checkpoints" / "lopd-0"
    tensors, state = load_checkpoint(ckpt)
    assert state["step"] == 1 and len(state["history"]) == 2  # the step-0 validation row and step 1
    assert any(k.startswith("student.") for k in tensors) and any(k.startswith("composer.") for k in tensors)
    assert not (stage_dirs / "runs" / "lopd" / "seed-0" / "result.json").exists()

    # through the command line: exit status 1 and one message
    shutil.rmtree(ckpt)
    calls.update(n=0, nan_from=1)
    pfile = _params_file(workspace, stage_dirs, train={**SMALL, "steps": 3})
    capsys.readouterr()
    rc = main(["--params", str(pfile), "train", "--arm", "lopd", "--seed", "0"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "run failed" in err and "non-finite loss" in err


def test_infeasible_margin_is_flagged(workspace, resources, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from lopd.training.run import run_arm

    # tasks the base is known to solve: with no rewarded rollout Δ(φ) is undefined, never infeasible
    monkeypatch.setattr(resources, "train_tasks", solved_train_tasks(resources))
    resources.val_tasks = resources.val_tasks[:4]
    params = workspace.params(train={**SMALL, "tasks_per_step": 8, "steps": 2, "margin": 5.0,
                                     "infeasible_patience": 2})
    _, meta = run_arm(params, resources, "lopd", 0, tmp_path / "run", ckpt_dir=None)
    res = json.loads((tmp_path / "run" / "result.json").read_text())
    assert res["steps"] == 2
    assert res["infeasible_margin"] is True
    run = MlflowClient(tracking_uri=params.tracking.uri).get_run(meta["mlflow_run_id"])
    assert run.data.tags.get("infeasible_margin") == "true"
    assert run.info.status == "FINISHED"


def test_corrupt_checkpoint_on_resume_is_bad_input(workspace, resources, stage_dirs, capsys):
    from lopd.arms import ARMS
    from lopd.cli import main
    from lopd.training.trainer import HParams, Trainer

    ckpt = stage_dirs / "checkpoints" / "lopd-0"
    params = workspace.params(train=SMALL)
    Trainer(resources, ARMS["lopd"], HParams.from_params(params), 0, ckpt_dir=ckpt).save()
    t = ckpt / "tensors.safetensors"
    data = t.read_bytes()
    t.write_bytes(data[: len(data) // 2])
    pfile = _params_file(workspace, stage_dirs, train=SMALL)
    capsys.readouterr()
    rc = main(["--params", str(pfile), "train", "--arm", "lopd", "--seed", "0"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "corrupt" in err
    assert not (stage_dirs / "runs" / "lopd" / "seed-0" / "result.json").exists()


# ------------------------------------------------------------------ the search


# batches of 2: the killed search dies inside its second batch; two workers' first batches cannot
# together pass the budget by more than the test allows
HPO = {"steps": 1, "val_every": 1, "n_trials": 4, "trials_per_batch": 2}
HPO_TRAIN = {"tasks_per_step": 4, "use_best_params": False}


def _study(copy: Path, storage: str):
    import optuna

    from lopd.config import load_params
    from lopd.paths import Paths
    from lopd.hpo.study import dep_files, make_storage, study_name

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    params = load_params(str(copy / "params.yaml"))
    try:
        return optuna.load_study(study_name=study_name(params, dep_files(Paths(copy))), storage=make_storage(storage))
    except KeyError:  # not created yet
        return None


def test_two_search_workers_share_one_journal(workspace, tmp_path):
    from optuna.trial import TrialState

    copy = make_copy(workspace.root, tmp_path / "ws", hpo=HPO, train=HPO_TRAIN, model=ONE_THREAD)
    journal = str(tmp_path / "journal.log")
    budget = 4  # one budget for the study (optuna's MaxTrialsCallback), shared by both workers
    cmd = [PY, "-m", "lopd.cli", "--params", "params.yaml", "hpo", "--worker", "--n-trials", str(budget),
           "--storage", journal]
    p1, p2 = start(cmd, copy, "w1.log"), start(cmd, copy, "w2.log")
    try:
        (rc1, log1), (rc2, log2) = finish(p1, copy, "w1.log"), finish(p2, copy, "w2.log")
    finally:
        stop(p1, p2)
    assert rc1 == 0, log1[-3000:]
    assert rc2 == 0, log2[-3000:]
    for log in (log1, log2):
        assert "locked" not in log.lower(), log[-3000:]
        assert "MLflow tracking" not in log, log[-3000:]  # the tracker's failure warning
    study = _study(copy, journal)
    trials = study.get_trials(deepcopy=False)
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    # the budget is reached; only a trial the other worker started before then may finish after it
    assert len(finished) == len(trials) and budget <= len(trials) <= budget + 1, [(t.number, t.state.name) for t in trials]
    assert sorted(t.number for t in trials) == list(range(len(trials)))
    for t in trials:  # no trial starts once the budget is reached
        done_before = sum(u.datetime_complete <= t.datetime_start for u in finished)
        assert done_before < budget, (t.number, done_before)


def test_killed_search_resumes_and_keeps_finished_trials(workspace, tmp_path):
    from optuna.trial import TrialState

    copy = make_copy(workspace.root, tmp_path / "ws", hpo=HPO, train=HPO_TRAIN)
    journal = str(copy / "hpo" / "journal.log")
    cmd = [PY, "-m", "lopd.cli", "hpo"]
    p = start(cmd, copy, "first.log")

    def first_complete():
        if not Path(journal).exists():
            return None
        try:
            st = _study(copy, journal)
        except Exception:  # noqa: BLE001 - the log is being appended; poll again
            return None
        done = st.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if st else []
        return done[0] if done else None

    try:
        first = wait_for(first_complete, p, "the first trial to complete", every=0.5)
        p.send_signal(signal.SIGKILL)
        rc, log = finish(p, copy, "first.log")
    finally:
        stop(p)
    assert rc == -signal.SIGKILL, "the search finished before it could be killed"
    rc, log = run(cmd, copy, "second.log")
    assert rc == 0, log[-3000:]
    study = _study(copy, journal)
    finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    assert len(finished) == 4, [(t.number, t.state.name) for t in study.get_trials(deepcopy=False)]
    kept = next(t for t in study.get_trials(deepcopy=False) if t.number == first.number)
    assert kept.state == TrialState.COMPLETE and kept.params == first.params and kept.value == first.value
    assert not study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    best = yaml.safe_load((copy / "hpo" / "best_params.yaml").read_text())
    assert best["selected_on"] == "val"


# ------------------------------------------------------------------ the sealed test split


def test_non_evaluation_stage_cannot_read_test(workspace, monkeypatch, tmp_path, capsys):
    import lopd.stages.hpo as hpo_stage
    from lopd import data as data_mod
    from lopd.cli import main

    root = workspace.root / "data" / "splits"
    for role in ("hpo", "train", "bank", "sensitivity", "probe"):
        with pytest.raises(SplitAccessError):
            data_mod.SplitReader(root, role).load("test")
    data_mod.SplitReader(root, "evaluate").load("test")  # the evaluation role may

    # the hpo stage's own reader, made to ask for test as well: refused, before any trial
    real_load = data_mod.SplitReader.load
    roles = []

    def load_also_test(self, split):
        roles.append(self.role)
        if split == "val":
            real_load(self, "test")
        return real_load(self, split)

    monkeypatch.setattr(data_mod.SplitReader, "load", load_also_test)
    with pytest.raises(SplitAccessError):
        hpo_stage.run(workspace.params(), workspace.paths)
    assert "hpo" in roles
    capsys.readouterr()
    assert main(["--params", str(workspace.params_path), "hpo"]) == 2
    assert "sealed" in capsys.readouterr().err
    assert not (workspace.root / "hpo").exists()
