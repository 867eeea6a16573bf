"""One MLflow tree per pipeline experiment: every stage's run under the experiment parent, the report
on the parent, one parent however many processes start it, and the failure semantics."""

from __future__ import annotations

import multiprocessing
import os
import signal

import pytest

from lopd.errors import BadInput
from tests.conftest import default_params  # noqa: E402


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory):
    """An MLflow SQLite db with its tables created once (MLflow's migrations take seconds)."""
    from mlflow import MlflowClient

    db = tmp_path_factory.mktemp("store") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
    return db


@pytest.fixture
def make_params(tmp_path, monkeypatch, empty_store):
    import shutil

    from lopd import tracking
    from lopd.config import Params, TrackingParams

    shutil.copy(empty_store, tmp_path / "mlflow.db")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    for cache in (tracking.PARENTS, tracking.EXPERIMENT_IDS):
        cache.clear()

    def make(uri: str | None = None, **tracking_over) -> Params:
        uri = uri or f"sqlite:///{tmp_path / 'mlflow.db'}"
        return default_params({"tracking": {"uri": uri, "experiment": "tree-test", **tracking_over}})

    return make


def _new_process():
    """What a fresh stage process would not have: this process's cached parent look-up."""
    from lopd import tracking

    tracking.PARENTS.clear()


def _runs(params) -> list:
    from mlflow import MlflowClient

    c = MlflowClient(tracking_uri=params.tracking.uri)
    exp = c.get_experiment_by_name(params.tracking.experiment)
    return list(c.search_runs([exp.experiment_id], max_results=1000))


def assert_one_tree(uri: str, experiment: str, report_artifacts: list[str]) -> dict:
    """Every run of ``experiment`` descends from one experiment parent (tag lopd.experiment_key),
    and that parent holds ``report_artifacts``. Returns the runs by id (for the end-to-end test too)."""
    from mlflow import MlflowClient

    from lopd.tracking import EXPERIMENT_KEY_TAG

    c = MlflowClient(tracking_uri=uri)
    exp = c.get_experiment_by_name(experiment)
    runs = {r.info.run_id: r for r in c.search_runs([exp.experiment_id], max_results=10_000)}
    parents = [rid for rid, r in runs.items() if EXPERIMENT_KEY_TAG in r.data.tags]
    assert len(parents) == 1, [runs[p].data.tags[EXPERIMENT_KEY_TAG] for p in parents]
    for rid, r in runs.items():
        seen = [rid]
        while seen[-1] != parents[0]:
            up = runs[seen[-1]].data.tags.get("mlflow.parentRunId")
            assert up in runs and up not in seen, f"run {r.info.run_name} ({rid}): chain {seen} -> {up}"
            seen.append(up)

    def listing(path=None):
        return [a for f in c.list_artifacts(parents[0], path) for a in (listing(f.path) if f.is_dir else [f.path])]

    missing = sorted(set(report_artifacts) - set(listing()))
    assert not missing, f"experiment parent lacks {missing}"
    return runs


def _stage(params, name: str, tags: dict, parent_run_id: str | None = None, steps: int = 3):
    from lopd.tracking import Tracker

    tr = Tracker(params, name, {"seed": 0, "arm": "lopd", "split": "train", "bank_mode": "relevant",
                                "params_hash": "h", **tags}, parent_run_id=parent_run_id)
    assert tr.ok, tr.error
    tr.log_params({"lr": 0.01, "K": 4})
    for step in range(1, steps + 1):
        tr.log_metrics({"reward": 0.1 * step, "beta": float(step), "nan": float("nan"), "none": None}, step)
    return tr


_REPORT = ["reports/main_table.md", "reports/metrics.json", "reports/figures/learning_curves.png"]


def _report_files() -> list[str]:
    from pathlib import Path

    (Path("reports") / "figures").mkdir(parents=True)
    Path("reports/main_table.md").write_text("| arm | reward |\n")
    Path("reports/metrics.json").write_text('{"lopd": 0.5}\n')
    Path("reports/figures/learning_curves.png").write_bytes(b"\x89PNG fake")
    return list(_REPORT)


@pytest.mark.parametrize("async_logging", [True, False])
def test_every_stage_run_nests_under_one_experiment_parent(make_params, async_logging):
    from mlflow import MlflowClient

    from lopd.tracking import EXPERIMENT_KEY_TAG, experiment_key, log_report_artifacts, mark_stale_run

    params = make_params(async_logging=async_logging)
    for stage in ("base", "cold_start", "probe"):
        _new_process()
        _stage(params, stage, {"stage": stage}).end()
    _new_process()
    hpo = _stage(params, "hpo", {"stage": "hpo", "split": "val"})
    trials = [_stage(params, f"trial-{i}", {"stage": "hpo_trial"}, parent_run_id=hpo.run_id) for i in range(2)]
    for t in (*trials, hpo):
        t.end()
    _new_process()
    killed = _stage(params, "lopd-0", {"stage": "train"})  # its process dies: never ended
    _new_process()
    assert mark_stale_run(params.tracking, killed.run_id) is True
    resumed = _stage(params, "lopd-0", {"stage": "train", "resumed_from_run": killed.run_id})
    resumed.end()
    _new_process()
    ev = _stage(params, "eval-lopd-0", {"stage": "evaluate", "split": "test"}, steps=1)
    ev.end()
    _new_process()
    assert log_report_artifacts(params, _report_files()) == "ok"

    runs = assert_one_tree(params.tracking.uri, params.tracking.experiment, _REPORT)
    parent = next(r for r in runs.values() if EXPERIMENT_KEY_TAG in r.data.tags)
    assert parent.data.tags[EXPERIMENT_KEY_TAG] == experiment_key(params)
    assert parent.info.status == "FINISHED"
    assert parent.data.params["train.lr_student"] == str(params.train.lr_student)  # the whole params
    for rid, r in runs.items():
        if rid == parent.info.run_id:
            continue
        want = hpo.run_id if rid in {t.run_id for t in trials} else parent.info.run_id
        assert r.data.tags.get("mlflow.parentRunId") == want, (r.info.run_name, r.data.tags)
        for tag in ("stage", "arm", "seed", "bank_mode", "split", "git_commit", "params_hash"):
            assert r.data.tags.get(tag), (r.info.run_name, tag)
    assert len(runs) == 1 + 3 + 1 + 2 + 2 + 1
    assert runs[killed.run_id].info.status == "KILLED" and runs[resumed.run_id].info.status == "FINISHED"
    assert all(r.info.end_time and r.info.end_time >= r.info.start_time for r in runs.values())

    c = MlflowClient(tracking_uri=params.tracking.uri)
    hist = sorted((m.step, round(m.value, 6)) for m in c.get_metric_history(resumed.run_id, "reward"))
    assert hist == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert "nan" not in runs[resumed.run_id].data.metrics and runs[resumed.run_id].data.params["K"] == "4"
    top = {f.path for f in c.list_artifacts(parent.info.run_id)}
    assert top == {"reports"}
    assert {f.path for f in c.list_artifacts(parent.info.run_id, "reports")} == \
        {"reports/main_table.md", "reports/metrics.json", "reports/figures"}
    assert [f.path for f in c.list_artifacts(parent.info.run_id, "reports/figures")] == \
        ["reports/figures/learning_curves.png"]
    local = c.download_artifacts(parent.info.run_id, "reports/metrics.json", ".")
    assert open(local).read() == '{"lopd": 0.5}\n'
    where = os.path.realpath(parent.info.artifact_uri.removeprefix("file://"))
    assert where.startswith(os.path.realpath("mlartifacts"))  # beside mlflow.db, not ./mlruns


def test_runs_name_and_tag_their_dvc_experiment(make_params, monkeypatch):
    """Under ``dvc exp run`` (DVC_EXP_NAME, DVC_EXP_BASELINE_REV set for each stage) the parent is
    named after the experiment and commit, and every run carries both as tags."""
    from mlflow import MlflowClient

    from lopd.tracking import EXPERIMENT_KEY_TAG, git_commit

    monkeypatch.setenv("DVC_EXP_NAME", "lucky-dove")
    monkeypatch.setenv("DVC_EXP_BASELINE_REV", "f" * 40)
    params = make_params()
    _stage(params, "lopd · seed 0", {"stage": "train"}).end()
    runs = _runs(params)
    parent = next(r for r in runs if EXPERIMENT_KEY_TAG in r.data.tags)
    key = parent.data.tags[EXPERIMENT_KEY_TAG]
    assert parent.info.run_name == f"lucky-dove @ {git_commit()[:7]} · params {key[:8]}"
    assert {(r.data.tags["dvc.exp_name"], r.data.tags["dvc.rev"]) for r in runs} == {("lucky-dove", "f" * 40)}
    assert {r.info.run_name for r in runs} == {parent.info.run_name, "lopd · seed 0"}
    exp = MlflowClient(tracking_uri=params.tracking.uri).get_experiment_by_name(params.tracking.experiment)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # model training, for the UI


def test_test_metrics_are_mirrored_onto_the_training_run(make_params, capsys):
    from mlflow import MlflowClient

    from lopd.tracking import log_to_training_run

    params = make_params()
    train = _stage(params, "lopd · seed 0", {"stage": "train"})
    train.end()
    _stage(params, "lopd · seed 1", {"stage": "train", "seed": 1}).end()
    assert log_to_training_run(params, "lopd", 0, {"test/reward": 0.25, "test/benchmark/x": float("nan")}) == "ok"
    metrics = MlflowClient(tracking_uri=params.tracking.uri).get_run(train.run_id).data.metrics
    assert metrics["test/reward"] == 0.25 and "test/benchmark/x" not in metrics
    assert log_to_training_run(params, "lopd", 7, {"test/reward": 0.5}).startswith(
        "failed: LookupError: no finished MLflow training run of lopd seed 7")
    assert "WARNING: MLflow tracking" in capsys.readouterr().err


def test_tree_check_catches_an_orphan_and_a_missing_report(make_params):
    from mlflow import MlflowClient

    from lopd.tracking import log_report_artifacts

    params = make_params()
    _stage(params, "lopd-0", {"stage": "train"}).end()
    with pytest.raises(AssertionError, match="lacks"):
        assert_one_tree(params.tracking.uri, params.tracking.experiment, _REPORT)
    log_report_artifacts(params, _report_files())
    assert_one_tree(params.tracking.uri, params.tracking.experiment, _REPORT)
    c = MlflowClient(tracking_uri=params.tracking.uri)
    c.create_run(c.get_experiment_by_name(params.tracking.experiment).experiment_id, run_name="stray")
    with pytest.raises(AssertionError, match="stray"):
        assert_one_tree(params.tracking.uri, params.tracking.experiment, _REPORT)


def test_other_params_make_another_parent(make_params):
    from lopd.tracking import EXPERIMENT_KEY_TAG

    a = make_params()
    b = a.model_copy(update={"train": a.train.model_copy(update={"lr_student": a.train.lr_student * 2})})
    c = a.model_copy(update={"tracking": a.tracking.model_copy(update={"on_failure": "fail"})})
    runs = {name: _stage(p, name, {"stage": "train"}) for name, p in (("a", a), ("b", b), ("c", c))}
    for t in runs.values():
        t.end()
    stored = {r.info.run_id: r for r in _runs(a)}
    parents = {r.info.run_id for r in stored.values() if EXPERIMENT_KEY_TAG in r.data.tags}
    assert len(parents) == 2  # tracking settings are not part of the experiment's identity
    parent_of = {n: stored[t.run_id].data.tags["mlflow.parentRunId"] for n, t in runs.items()}
    assert parent_of["a"] == parent_of["c"] != parent_of["b"] and set(parent_of.values()) == parents


def _start_same_experiment(params, barrier, queue) -> None:
    from lopd.tracking import Tracker

    barrier.wait(timeout=120)
    tr = Tracker(params, f"worker-{os.getpid()}", {"stage": "hpo"})
    tr.log_metrics({"x": 1.0}, 0)
    tr.end()
    queue.put((tr.run_id, tr.error))


def test_concurrent_processes_create_one_parent(make_params):
    """Forked from a process that already has the store open (as the warm worker may)."""
    from lopd.tracking import EXPERIMENT_KEY_TAG, Tracker, experiment_key

    params = make_params()
    opened = Tracker(params.model_copy(update={"model": params.model.model_copy(update={"torch_threads": 1})}),
                     "other-experiment", {"stage": "base"})
    opened.log_metrics({"x": 1.0}, 0)
    opened.flush()  # this process's async queue and pooled connection exist before the fork
    ctx = multiprocessing.get_context("fork")
    n = 4
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_start_same_experiment, args=(params, barrier, queue)) for _ in range(n)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    opened.end()
    assert [p.exitcode for p in procs] == [0] * n
    assert all(rid and err is None for rid, err in results), results
    runs = {r.info.run_id: r for r in _runs(params)}
    parents = [r for r in runs.values() if r.data.tags.get(EXPERIMENT_KEY_TAG) == experiment_key(params)]
    assert len(parents) == 1, [(r.info.run_id, r.info.start_time) for r in parents]
    assert {runs[rid].data.tags["mlflow.parentRunId"] for rid, _ in results} == {parents[0].info.run_id}
    assert all(runs[rid].info.status == "FINISHED" and runs[rid].data.metrics == {"x": 1.0} for rid, _ in results), [
        (runs[rid].info.status, runs[rid].data.metrics, runs[rid].data.tags.get("lopd.pid")) for rid, _ in results]


def test_stages_forked_from_a_preloaded_worker(make_params):
    """The warm worker's pattern: preload once (store open, parent found), fork one process per stage."""
    from lopd.tracking import EXPERIMENT_KEY_TAG, experiment_parent_id, preload

    params = make_params()
    preload(params)
    parent = experiment_parent_id(params)
    ctx = multiprocessing.get_context("fork")
    barrier, queue = ctx.Barrier(1), ctx.Queue()
    for _ in range(2):  # one after the other, as dvc runs stages
        p = ctx.Process(target=_start_same_experiment, args=(params, barrier, queue))
        p.start()
        p.join(timeout=120)
        assert p.exitcode == 0
    results = [queue.get(timeout=10) for _ in range(2)]
    runs = {r.info.run_id: r for r in _runs(params)}
    assert [r.info.run_id for r in runs.values() if EXPERIMENT_KEY_TAG in r.data.tags] == [parent]
    for rid, err in results:
        assert err is None and runs[rid].data.tags["mlflow.parentRunId"] == parent
        assert runs[rid].info.status == "FINISHED" and runs[rid].data.metrics == {"x": 1.0}


def _run_until_killed(params, queue) -> None:
    from lopd.tracking import Tracker

    tr = Tracker(params, "lopd-0", {"stage": "train"})
    queue.put(tr.run_id)
    signal.pause()


def test_killed_process_run_is_marked_killed(make_params):
    from mlflow import MlflowClient

    from lopd.tracking import mark_stale_run

    params = make_params()
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    p = ctx.Process(target=_run_until_killed, args=(params, queue))
    p.start()
    run_id = queue.get(timeout=120)
    os.kill(p.pid, signal.SIGKILL)
    p.join(timeout=30)
    client = MlflowClient(tracking_uri=params.tracking.uri)
    assert client.get_run(run_id).info.status == "RUNNING"
    assert mark_stale_run(params.tracking, run_id) is True
    assert client.get_run(run_id).info.status == "KILLED"
    assert mark_stale_run(params.tracking, run_id) is False  # already ended


def test_unreachable_uri_warns_and_records(make_params, capsys):
    from lopd.tracking import Tracker, log_report_artifacts

    params = make_params(uri="http://127.0.0.1:9")
    tr = Tracker(params, "r", {"stage": "train"})
    assert not tr.ok and tr.status.startswith("failed: MlflowException")
    assert "WARNING: MLflow tracking at 'http://127.0.0.1:9' failed" in capsys.readouterr().err
    tr.log_metrics({"x": 1.0}, 0)
    tr.end()
    assert log_report_artifacts(params, _report_files()).startswith("failed: MlflowException")
    assert "WARNING" in capsys.readouterr().err


def test_unreachable_uri_fails_with_on_failure_fail(make_params):
    from lopd.tracking import Tracker, log_report_artifacts

    params = make_params(uri="http://127.0.0.1:9", on_failure="fail")
    with pytest.raises(BadInput, match=r"127\.0\.0\.1:9.*on_failure: warn"):
        Tracker(params, "r", {"stage": "train"})
    with pytest.raises(BadInput, match="on_failure"):
        log_report_artifacts(params, _report_files())


@pytest.mark.parametrize("on_failure", ["warn", "fail"])
def test_failed_background_write_is_reported_at_end(make_params, capsys, on_failure):
    """An asynchronous write that fails (here: the run was deleted meanwhile) is not lost silently."""
    from mlflow import MlflowClient

    from lopd.tracking import Tracker

    params = make_params(on_failure=on_failure)
    tr = Tracker(params, "r", {"stage": "train"})
    MlflowClient(tracking_uri=params.tracking.uri).delete_run(tr.run_id)
    tr.log_metrics({"x": 1.0}, 0)
    tr.flush()  # queued: the failure is known only when the write has run
    if on_failure == "fail":
        with pytest.raises(BadInput, match="on_failure"):
            tr.end()
        return
    tr.end()
    assert not tr.ok and tr.status.startswith("failed: MlflowException")
    assert "WARNING: MLflow tracking" in capsys.readouterr().err


def test_cli_exits_2_when_tracking_must_not_fail(make_params, tmp_path, capsys, monkeypatch):
    """Through the report stage, whose tables are stubbed (they need a finished pipeline)."""
    import yaml

    import lopd.analysis.report
    from lopd.cli import main

    monkeypatch.setattr(lopd.analysis.report, "build_report", lambda params, root, registration=None, ledger=None: {})
    params = make_params(uri="http://127.0.0.1:9", on_failure="fail")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params.model_dump()))
    _report_files()
    rc = main(["--params", str(tmp_path / "params.yaml"), "report"])
    assert rc == 2
    assert "MLflow tracking at 'http://127.0.0.1:9' failed" in capsys.readouterr().err


def test_missing_report_artifact_is_bad_input(make_params):
    from lopd.tracking import log_report_artifacts

    with pytest.raises(BadInput, match="reports/nothing.md"):
        log_report_artifacts(make_params(), ["reports/nothing.md"])


# --------------------------------------------------------------------------- the smoke pipeline's store
_READABLE = {  # stage tag -> the run name it must have (lopd.tracking.names)
    "experiment": r"workspace @ [0-9a-f]{7} · params [0-9a-f]{8}",
    "base": "base", "cold_start": r"cold start( · draw \d+)?", "probe": "probe",
    "hpo": r"search|trial \d+ · m=\S+ K=\d+ n_ret=\d+ lr=\S+( η_β=\S+)?",
    "hpo-baselines": r"baseline \w+ · (lr|β)=\S+ · seed \d+",
    "hpo-rerun": r"trial \d+ · m=\S+ K=\d+ n_ret=\d+ lr=\S+( η_β=\S+)? · seed \d+",  # a confirmed trial's more seeds
    "hpo-sft": r"trial \d+ · lr=\S+( · seed \d+)?",  # an arm's own search (profiles/smoke.yaml: sft's)
    "hpo-sft-rerun": r"trial \d+ · lr=\S+ · seed \d+",
    "sensitivity": r"sensitivity( · ((margin|K|n_ret)=\S+|m=\S+ η_β=\S+|lopd\w*) · seed \d+)?",
    "train": r"\w+ · seed \d+", "evaluate": r"evaluate · \w+ · seed \d+",
    "confirm_train": r"confirm p\d+ · \w+ · seed \d+"}  # the confirmation's runs, one name per point


def test_smoke_pipeline_store_reads_as_one_named_tree(smoke_recorded, tmp_path):
    """After the shared smoke pipeline, through MlflowClient: names distinct and readable, one tree,
    the DVC experiment on every run, namespaced metrics, each training run's files as artifacts."""
    import re
    import subprocess

    import yaml
    from mlflow import MlflowClient

    repo = smoke_recorded.repo
    params = yaml.safe_load((repo / "params.yaml").read_text())
    uri = f"sqlite:///{repo / 'mlflow.db'}"
    runs = assert_one_tree(uri, params["tracking"]["experiment"], ["reports/main_table.md"])
    names = [r.info.run_name for r in runs.values()]
    assert len(set(names)) == len(names), sorted(n for n in names if names.count(n) > 1)
    for r in runs.values():
        stage = r.data.tags["stage"]
        assert re.fullmatch(_READABLE[stage], r.info.run_name), (stage, r.info.run_name)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    dvc_tags = {(r.data.tags.get("dvc.exp_name"), r.data.tags.get("dvc.rev")) for r in runs.values()}
    assert dvc_tags == {("workspace", commit)}, dvc_tags
    by_stage: dict[str, list] = {}
    for r in runs.values():
        by_stage.setdefault(r.data.tags["stage"], []).append(r)
    # the grid's holder and one run per row of grid.csv: its margin, K, n_ret, dose-response and reference runs
    assert len(by_stage["sensitivity"]) == 1 + len((repo / "results/sensitivity/grid.csv").read_text().splitlines()) - 1
    holder = next(r for r in by_stage["sensitivity"] if r.info.run_name == "sensitivity")
    grid = [r for r in by_stage["sensitivity"] if r is not holder]
    assert {r.data.tags["mlflow.parentRunId"] for r in grid} == {holder.info.run_id}
    trials = [r for r in by_stage["hpo"] if "trial" in r.data.tags]
    n_trials = len((repo / "hpo/trials.csv").read_text().splitlines()) - 1  # the budget and the boundary rule's
    assert len(trials) == n_trials >= params["hpo"]["n_trials"], [r.info.run_name for r in trials]

    final = by_stage["train"]
    tp = params["train"]
    ran = [a for a in tp["arms"] if not (repo / f"runs/{a}/not_run.json").exists()]  # not run by design: no runs
    jobs = [(a, s) for a in ran for s in tp["seeds"]]
    jobs += [(a, s) for a in tp["extra_arms"] if a in ran for s in tp["extra_seeds"]]
    assert sorted((r.data.params["arm"], r.data.params["seed"]) for r in final) == sorted((a, str(s)) for a, s in jobs)
    for r in final:  # the runs table's columns: arm, seed, test reward, final β
        assert {"test/reward", "final/val_reward", "final/beta"} <= set(r.data.metrics), \
            (r.info.run_name, r.data.metrics)
        assert r.data.params["arm"] == r.data.tags["arm"] and r.data.params["seed"] == r.data.tags["seed"]
    lopd_run = next(r for r in final if r.data.tags["arm"] == "lopd")
    assert {"train/reward", "train/loss", "margin/delta_phi", "margin/beta", "margin/sat_frac", "val/reward"} <= \
        set(lopd_run.data.metrics), sorted(lopd_run.data.metrics)
    for r in runs.values():
        assert all("/" in k for k in r.data.metrics), (r.info.run_name, sorted(r.data.metrics))

    c = MlflowClient(tracking_uri=uri)
    for r in [*trials, *grid, *(r for s in ("train", "hpo-baselines") for r in by_stage[s])]:
        files = {a.path for a in c.list_artifacts(r.info.run_id)}
        assert {"history.csv", "result.json"} <= files, (r.info.run_name, files)
    got = c.download_artifacts(lopd_run.info.run_id, "history.csv", str(tmp_path))
    arm, seed = lopd_run.data.tags["arm"], lopd_run.data.tags["seed"]
    assert open(got).read() == (repo / f"runs/{arm}/seed-{seed}/history.csv").read_text()
