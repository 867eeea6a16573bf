"""The experiment's MLflow parent ends FINISHED with the report attached whatever DVC skips.

The report stage closes the parent. When a repro reproduces every output of the committed lock, DVC
skips the report stage (nothing it reads changed), and the parent the other stages opened stayed
RUNNING with no report. ``lopd repro`` now closes it after a whole repro that succeeded
(:func:`lopd.tracking.close_experiment`), and the parent's description in the UI says who closes it.
"""

from __future__ import annotations

import shutil

from tests.conftest import BIN, default_params, run_cmd


def _parent(uri: str):
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])
            if r.data.tags.get("stage") == "experiment"]
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return client, runs[0]


def _write_report(root):
    (root / "reports" / "figures").mkdir(parents=True)
    (root / "reports" / "falsification.md").write_text("# verdict\n")
    (root / "reports" / "summary.json").write_text("{}\n")
    (root / "reports" / "figures" / "curves.png").write_bytes(b"\x89PNG")


def test_close_experiment_finishes_a_running_parent_with_the_report(tmp_path):
    from lopd.tracking import close_experiment, experiment_parent_id
    from lopd.tracking.store import PARENT_NOTE

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    params = default_params({"tracking": {"uri": uri}})
    assert close_experiment(params, tmp_path) == "no report"  # nothing to attach: nothing done
    experiment_parent_id(params)  # what the first stage of a repro does: the parent, RUNNING
    client, parent = _parent(uri)
    assert parent.info.status == "RUNNING"
    assert parent.data.tags["mlflow.note.content"] == PARENT_NOTE  # the UI says who closes it
    _write_report(tmp_path)
    assert close_experiment(params, tmp_path) == "ok"
    client, parent = _parent(uri)
    assert parent.info.status == "FINISHED"
    names = {a.path for a in client.list_artifacts(parent.info.run_id, "reports")}
    assert {"reports/falsification.md", "reports/summary.json", "reports/figures"} <= names, names
    assert close_experiment(params, tmp_path) == "already finished"


def test_a_repro_that_skips_the_report_stage_still_closes_the_parent(smoke_recorded, tmp_path):
    """Every output of the smoke lock present and current, the MLflow store gone (a fresh clone's, or
    one whose parent a skipped report never closed): ``lopd repro`` runs no stage and the parent of
    this experiment ends FINISHED with the report attached."""
    repo = shutil.copytree(smoke_recorded.repo, tmp_path / "repo", symlinks=True)
    (repo / "mlflow.db").unlink()
    shutil.rmtree(repo / "mlartifacts", ignore_errors=True)
    r = run_cmd([str(BIN / "lopd"), "repro"], repo, 600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Running stage" not in r.stdout, r.stdout  # DVC skipped every stage, the report's included
    assert "MLflow experiment parent: ok (DVC skipped the report stage)" in r.stdout, r.stdout
    client, parent = _parent(f"sqlite:///{repo / 'mlflow.db'}")
    assert parent.info.status == "FINISHED"
    names = {a.path for a in client.list_artifacts(parent.info.run_id, "reports")}
    assert "reports/falsification.md" in names, names


def test_a_no_op_repro_is_answered_by_the_stamp_until_something_changes(smoke_recorded, tmp_path):
    """After a whole ``lopd repro`` the next one runs neither DVC nor MLflow while nothing DVC reads
    has changed (:mod:`lopd.workflow.stamp`); a touched dependency, a removed store or ``--by-hash``
    each send it back to DVC's hashes, and that repro stamps again."""
    repo = shutil.copytree(smoke_recorded.repo, tmp_path / "repo", symlinks=True)
    lopd = str(BIN / "lopd")
    said = "nothing DVC reads has changed"
    first = run_cmd([lopd, "repro"], repo, 600)
    assert first.returncode == 0 and said not in first.stdout, first.stdout[-2000:] + first.stderr[-2000:]
    assert (repo / ".lopd" / "repro.stamp.json").is_file()
    again = run_cmd([lopd, "repro"], repo, 120)
    assert again.returncode == 0 and said in again.stdout, again.stdout + again.stderr
    assert "Running stage" not in again.stdout
    by_hash = run_cmd([lopd, "repro", "--by-hash"], repo, 600)
    assert by_hash.returncode == 0 and said not in by_hash.stdout, by_hash.stdout[-2000:]
    assert "Running stage" not in by_hash.stdout
    (repo / "params.yaml").touch()  # same bytes, a new mtime: DVC hashes it and finds it unchanged
    touched = run_cmd([lopd, "repro"], repo, 600)
    assert touched.returncode == 0 and said not in touched.stdout, touched.stdout[-2000:]
    assert "Running stage" not in touched.stdout
    assert said in run_cmd([lopd, "repro"], repo, 120).stdout  # stamped again
    (repo / "mlflow.db").unlink()  # the parent's store gone: the stamp cannot vouch for it
    shutil.rmtree(repo / "mlartifacts", ignore_errors=True)
    gone = run_cmd([lopd, "repro"], repo, 600)
    assert gone.returncode == 0 and said not in gone.stdout, gone.stdout[-2000:]
    assert "MLflow experiment parent: ok (DVC skipped the report stage)" in gone.stdout, gone.stdout
