"""What a LOPD run leaves in the MLflow store: per-step training signals and provenance tags."""

from __future__ import annotations

import pytest

from tests.conftest import solved_train_tasks

STEPS = 3


@pytest.fixture
def tracked_run(workspace, resources, tmp_path, monkeypatch):
    from lopd.training.run import run_arm

    # train on tasks the base policy is known to solve (the bank's): Δ(φ) weighs δ by reward, so a
    # step whose rollouts all score 0 has no Δ(φ) to log
    solved = solved_train_tasks(resources)  # at least 8; how many depends on the CPU's float kernels
    monkeypatch.setattr(resources, "train_tasks", solved)

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    params = workspace.params(tracking={"uri": uri},
                              train={"steps": STEPS, "tasks_per_step": min(16, len(solved)), "val_every": STEPS,
                                     "val_tasks": 2, "use_best_params": False})
    resources.val_tasks = resources.val_tasks[:4]
    r, meta = run_arm(params, resources, "lopd", 0, tmp_path / "run", ckpt_dir=None)
    return uri, {**r, **meta}


def test_lopd_run_logs_signals_every_step_and_provenance_tags(tracked_run):
    from mlflow.tracking import MlflowClient

    uri, r = tracked_run
    assert r["tracking"] == "ok"
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(r["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    for key in ("margin/delta_phi", "margin/beta", "margin/sat_frac", "train/reward", "train/loss"):
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, key))
        assert set(range(1, STEPS + 1)) <= set(steps), f"{key} logged at steps {steps}"
        assert len([s for s in steps if s >= 1]) == STEPS, f"{key} logged more than once per step: {steps}"
    tags = run.data.tags
    for key in ("stage", "arm", "seed", "bank_mode", "split", "git_commit", "params_hash"):
        assert tags.get(key), f"tag {key} missing: {sorted(tags)}"
    assert tags["stage"] == "train" and tags["arm"] == "lopd" and tags["seed"] == "0"
    assert tags["bank_mode"] == "relevant"
    assert tags["params_hash"] == r["params_hash"]
    assert run.data.metrics["final/val_reward"] == r["val_reward"]
    assert run.data.metrics["final/beta"] == r["beta_final"]
    assert run.info.run_name == "lopd · seed 0"
    assert tags["dvc.exp_name"] == "workspace" and tags["dvc.rev"] == tags["git_commit"]
    assert {"val/reward"} <= set(run.data.metrics), sorted(run.data.metrics)
    assert not [k for k in run.data.metrics if "/" not in k], sorted(run.data.metrics)  # every name namespaced
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id)) == ["history.csv", "result.json"]


def test_runs_of_dead_processes_on_this_host_are_marked_killed(tmp_path):
    """A stage killed before it ended its MLflow run leaves it RUNNING; the next tracker of the
    experiment marks it KILLED, but leaves runs of live processes and of other hosts alone."""
    import socket
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    from lopd import tracking
    from tests.conftest import default_params

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    params = default_params({"tracking": {"uri": uri}})
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that existed and is gone
    client = MlflowClient(tracking_uri=uri)
    exp_id = tracking.experiment_id(client, uri, params.tracking.experiment)
    host = socket.gethostname()
    runs = {name: client.create_run(exp_id, run_name=name, tags={tracking.HOST_TAG: h, tracking.PID_TAG: str(pid)})
            .info.run_id for name, h, pid in [("killed", host, dead.pid), ("live", host, 1),
                                              ("elsewhere", "another-host", dead.pid)]}
    tracking.SWEPT.clear()
    t = tracking.Tracker(params, "next-stage", {"stage": "test"})
    assert t.ok, t.status
    status = {name: client.get_run(rid).info.status for name, rid in runs.items()}
    assert status == {"killed": "KILLED", "live": "RUNNING", "elsewhere": "RUNNING"}, status
    assert client.get_run(t.run_id).data.tags[tracking.PID_TAG] == str(__import__("os").getpid())
    t.end()
