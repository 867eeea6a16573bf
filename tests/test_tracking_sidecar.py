"""The MLflow sidecar: the same store contents and the same failure semantics as in-process tracking."""

from __future__ import annotations

import pytest

from lopd.errors import BadInput


@pytest.fixture
def sidecar(tmp_path, monkeypatch):
    from lopd import tracking
    from lopd.config import TrackingParams

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")

    def start(uri: str, on_failure: str = "warn"):
        tp = TrackingParams(uri=uri, experiment="sidecar-test", on_failure=on_failure)
        return tp, tracking.start_sidecar(tp)

    yield start
    tracking.stop_sidecar()


def _log_one_run(tp, tmp_path):
    from lopd.tracking import Tracker

    tr = Tracker(tp, "r", {"stage": "test", "seed": 3})
    tr.log_params({"margin": 0.05, "K": 4})
    for step in range(3):
        tr.log_metrics({"delta_phi": 0.1 * step, "beta": float(step), "nan": float("nan"), "none": None}, step)
    tr.set_tag("infeasible_margin", "false")
    art = tmp_path / "note.txt"
    art.write_text("hello")
    tr.log_artifact(str(art))
    tr.end()
    return tr


def _store_view(uri: str, run_id: str) -> dict:
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=uri)
    run = c.get_run(run_id)
    hist = [(m.step, m.value) for m in c.get_metric_history(run_id, "delta_phi")]
    return {"status": run.info.status, "params": run.data.params, "metrics": sorted(run.data.metrics),
            "tags": {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.") and k != "git_commit"},
            "delta_phi": sorted(hist), "artifacts": [f.path for f in c.list_artifacts(run_id)]}


def test_sidecar_store_matches_in_process(sidecar, tmp_path):
    from lopd import tracking

    uri_side, uri_local = f"sqlite:///{tmp_path / 'side.db'}", f"sqlite:///{tmp_path / 'local.db'}"
    tp_side, proc = sidecar(uri_side)
    tr_side = _log_one_run(tp_side, tmp_path)
    assert isinstance(tr_side.ops, tracking.SidecarOps) and tr_side.ok
    tp_local = tp_side.model_copy(update={"uri": uri_local})
    tr_local = _log_one_run(tp_local, tmp_path)
    assert isinstance(tr_local.ops, tracking.MlflowOps) and tr_local.ok
    side, local = _store_view(uri_side, tr_side.run_id), _store_view(uri_local, tr_local.run_id)
    assert side == local
    assert side["status"] == "FINISHED" and side["delta_phi"] == [(0, 0.0), (1, 0.1), (2, 0.2)]
    assert "nan" not in side["metrics"] and side["artifacts"] == ["note.txt"]


def test_sidecar_marks_stale_run_killed(sidecar, tmp_path):
    from mlflow.tracking import MlflowClient

    from lopd.tracking import Tracker, mark_stale_run

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    tp, _ = sidecar(uri)
    tr = Tracker(tp, "killed", {})
    assert mark_stale_run(tp, tr.run_id) is True
    assert MlflowClient(tracking_uri=uri).get_run(tr.run_id).info.status == "KILLED"
    assert mark_stale_run(tp, tr.run_id) is False  # already ended


def test_sidecar_unreachable_uri_warns_or_fails(sidecar, capsys):
    from lopd.tracking import Tracker

    tp, _ = sidecar("http://127.0.0.1:9")
    tr = Tracker(tp, "r", {})
    assert not tr.ok and tr.status.startswith("failed: MlflowException")
    assert "WARNING" in capsys.readouterr().err
    tp_fail = tp.model_copy(update={"on_failure": "fail"})
    with pytest.raises(BadInput, match="127.0.0.1:9"):
        Tracker(tp_fail, "r", {})


def test_dead_sidecar_is_reported_not_hidden(sidecar, tmp_path, capsys):
    from lopd.tracking import Tracker

    tp, proc = sidecar(f"sqlite:///{tmp_path / 'd.db'}")
    tr = Tracker(tp, "r", {})
    assert tr.ok
    proc.proc.kill()
    proc.proc.wait()
    tr.log_metrics({"x": 1.0}, 0)
    tr.flush()
    assert not tr.ok and "SidecarExited" in tr.status
    assert "WARNING" in capsys.readouterr().err


def test_sidecar_exits_when_its_parent_closes_the_pipe(sidecar, tmp_path):
    _, proc = sidecar(f"sqlite:///{tmp_path / 'e.db'}")
    proc.close(timeout=30)
    assert proc.proc.returncode == 0
