"""The search's selection (lopd.hpo.selection, lopd.hpo.study.write_outputs) and its report
(lopd.analysis.hpo_report): ties paired over val tasks, the registered tie rule, PRUNED trials,
the boundary flag, and baseline learning rates tuned on validation only."""

from __future__ import annotations

import csv
import json
import math

import optuna
import pytest
import yaml
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from lopd.analysis.hpo_report import render_search, search_metrics
from lopd.errors import RunFailed
from lopd.analysis.search_record import Selection
from lopd.hpo.study import write_outputs
from lopd.hpo.selection import TrialScore, rerun_candidates, paired, paired_by_seed, select, select_by_seed
from tests.conftest import default_params

SPACE = {"margin": [0.0, 0.05, 0.2, 0.5], "K": [4, 8], "n_ret": [1, 2, 3], "lr_student": [0.001, 0.002]}
C, P = "COMPLETE", "PRUNED"


def _t(n, state, margin, per_task, K=8, n_ret=2, lr=0.002):
    value = sum(per_task) / len(per_task)
    return TrialScore(n, state, {"margin": margin, "K": K, "n_ret": n_ret, "lr_student": lr}, value, tuple(per_task))


def test_paired_difference_by_hand():
    """Per-task differences (1, 0, 1, 0): mean 0.5, sd 0.57735, t_{0.975,3} = 3.18245, half-width
    3.182446 · 0.57735 / 2 = 0.918693: interval [-0.4187, 1.4187] holds 0, so the two are tied."""
    a, b = _t(0, C, 0.0, [1, 1, 1, 1]), _t(1, C, 0.05, [0, 1, 0, 1])
    r = paired(a, b, 0.05)
    assert r["diff"] == pytest.approx(0.5)
    assert r["low"] == pytest.approx(0.5 - 0.918693, abs=1e-5) and r["high"] == pytest.approx(0.5 + 0.918693, abs=1e-5)
    assert r["tied"]
    with pytest.raises(ValueError, match="not scored on the same val tasks"):
        paired(a, _t(2, C, 0.0, [1, 1]), 0.05)


def test_all_trials_tie_and_the_registered_rule_chooses_the_median_margin():
    """Four trials with identical per-task rewards (what an unchanged policy scores under common random
    numbers): every one is tied with the best, nothing is distinguishable, and median_margin takes the
    lower median of the tied margins {0, 0.05, 0.2, 0.5} = 0.05 (trial 2), not the tie-break's trial 0."""
    same = [1, 0, 0, 1, 0, 1]
    trials = [_t(0, C, 0.0, same), _t(1, C, 0.2, same), _t(2, C, 0.05, same), _t(3, C, 0.5, same)]
    sel = select(trials, "median_margin", 0.05, SPACE)
    assert sel.tie_count == 4 and sel.tied == [0, 1, 2, 3]
    assert sel.best == 0 and sel.selected == 2 and sel.by_rule and not sel.distinguishable
    assert select(trials, "smallest_margin", 0.05, SPACE).selected == 0
    assert select(trials, "best", 0.05, SPACE).selected == 0


def test_a_distinguishable_best_is_selected_and_pruned_trials_never_are():
    """Trial 1 beats trial 0 on every task by 0.5 (zero spread: the interval is the point 0.5, not
    tied); trial 2 is PRUNED with a higher value and is ignored."""
    trials = [_t(0, C, 0.05, [0.0, 0.5, 0.0, 0.5]), _t(1, C, 0.2, [0.5, 1.0, 0.5, 1.0]), _t(2, P, 0.0, [1, 1, 1, 1])]
    sel = select(trials, "median_margin", 0.05, SPACE)
    assert sel.selected == sel.best == 1 and sel.tie_count == 1 and sel.distinguishable
    assert sel.runner_up["number"] == 0 and sel.runner_up["diff"] == pytest.approx(0.5)
    assert "2" not in sel.intervals and not sel.by_rule
    with pytest.raises(ValueError, match="no COMPLETE trial"):
        select([_t(0, P, 0.0, [1.0])], "best", 0.05, SPACE)
    with pytest.raises(ValueError, match="unknown tie rule"):
        select(trials, "coin", 0.05, SPACE)


def test_a_boundary_optimum_is_flagged():
    trials = [_t(0, C, 0.5, [1, 1, 1, 0], K=4, n_ret=2, lr=0.002), _t(1, C, 0.05, [0, 0, 0, 0], K=8, n_ret=2)]
    sel = select(trials, "best", 0.05, SPACE)
    assert sel.boundary == {"margin": "high", "K": "low", "n_ret": None, "lr_student": "high"}
    md = render_search({"selection": sel, "trials": [], "baselines": {}}, {})
    assert "**On the boundary of the search space:** margin = 0.5 is the highest choice" in md
    assert search_metrics({"selection": sel})["on_boundary"] == ["K", "lr_student", "margin"]


DISTS = {"margin": CategoricalDistribution([0.0, 0.05, 0.2, 0.5]), "K": CategoricalDistribution([4, 8]),
         "n_ret": IntDistribution(1, 3), "lr_student": CategoricalDistribution([0.001, 0.002])}


def _study(*trials) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    for state, margin, per_task in trials:
        v = sum(per_task) / len(per_task)
        kw = {"value": v} if state == TrialState.COMPLETE else {"intermediate_values": {1: v}}
        study.add_trial(create_trial(state=state, params={"margin": margin, "K": 8, "n_ret": 2, "lr_student": 0.002},
                                     distributions=DISTS, user_attrs={"val_per_task": per_task}, **kw))
    return study


def _params(rule: str):
    return default_params({"hpo": {"margin_choices": SPACE["margin"], "k_choices": [4, 8], "n_ret_min": 1,
                                   "n_ret_max": 3, "lr_choices": [0.001, 0.002], "tie_rule": rule}})


def test_write_outputs_reports_ties_and_selects_by_the_registered_rule(tmp_path):
    same = [1.0, 0.0, 0.5, 0.5]
    study = _study((TrialState.COMPLETE, 0.0, same), (TrialState.PRUNED, 0.5, [1.0] * 4),
                   (TrialState.COMPLETE, 0.2, same), (TrialState.COMPLETE, 0.05, same))
    best = write_outputs(study, tmp_path, _params("median_margin"))
    # eta_beta: these trials did not search it (a journal written before it was searched): train.eta_beta
    assert best == {"margin": 0.05, "K": 8, "n_ret": 2, "lr_student": 0.002, "eta_beta": 0.5, "value": 0.5, "trial": 3,
                    "tie_count": 3, "tie_rule": "median_margin", "tie_unit": "task", "value_seeds": 2,
                    "selected_on": "val", "binding": None,
                    "binding_reason": "no completed trial's margin binds in at least 50% of its seeds; the smallest "
                                      "positive m tried is 0.05"}  # these trials recorded no margin path
    assert yaml.safe_load((tmp_path / "best_params.yaml").read_text()) == best
    with open(tmp_path / "trials.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["state"] for r in rows] == ["COMPLETE", "PRUNED", "COMPLETE", "COMPLETE"]
    assert [r["tied_with_best"] for r in rows] == ["True", "False", "True", "True"]
    # per-task rewards (1, 0, .5, .5): mean .5, sd .40825, half-width 3.18245 · .40825 / 2 = .64962
    assert float(rows[0]["ci_low"]) == pytest.approx(0.5 - 0.64962, abs=1e-4) and rows[1]["ci_low"] == ""
    import json

    sel = Selection.from_json(json.loads((tmp_path / "selection.json").read_text()))
    md = render_search({"selection": sel, "trials": rows, "baselines": {}}, {})
    assert "**The best trial is not distinguishable from the runner-up**" in md and "3 trial(s) are" in md
    assert "Every completed trial scored exactly the same validation reward" in md
    assert "`hpo.tie_rule: median_margin`" in md
    with pytest.raises(RunFailed, match="finished no trial"):
        write_outputs(_study((TrialState.PRUNED, 0.0, same)), tmp_path, _params("best"))


def test_the_searched_eta_beta_reaches_best_params_the_final_runs_and_the_ramp(tmp_path):
    """η_β is a coordinate of lopd's search: the selected trial's η_β is written to best_params.yaml and
    trials.csv, the no-binding reason names the η_β tried, every arm that reads the selected point trains with it,
    and lopd_ramp's slope is η_β·m of the selected point (5 × 0.2 = 1.0 per step)."""
    import types

    from lopd.arms import get_arm
    from lopd.training.run import selected_hparams
    from lopd.training.trainer import HParams, Trainer

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dists = {**DISTS, "eta_beta": CategoricalDistribution([0.5, 5.0])}
    study = optuna.create_study(direction="maximize")
    for margin, eta, v in ((0.05, 0.5, 0.2), (0.2, 5.0, 0.6)):
        study.add_trial(create_trial(state=TrialState.COMPLETE, value=v, distributions=dists,
                                     params={"margin": margin, "K": 8, "n_ret": 2, "lr_student": 0.002, "eta_beta": eta},
                                     user_attrs={"val_per_task": [v - 0.1, v + 0.1, v, v]}))
    p = default_params({"hpo": {"margin_choices": SPACE["margin"], "k_choices": [4, 8], "n_ret_min": 1, "n_ret_max": 3,
                                "lr_choices": [0.001, 0.002], "eta_beta_choices": [0.5, 5.0], "tie_rule": "best"},
                        "train": {"use_best_params": True, "eta_beta": 0.5}})
    best = write_outputs(study, tmp_path, p)
    assert best["trial"] == 1 and best["eta_beta"] == 5.0 and best["margin"] == 0.2
    assert "η_β tried: 0.5, 5" in best["binding_reason"]
    with open(tmp_path / "trials.csv", newline="") as f:
        assert [float(r["eta_beta"]) for r in csv.DictReader(f)] == [0.5, 5.0]
    for arm in ("lopd", "lopd_ramp", "lopd_shuffled"):
        assert selected_hparams(p, tmp_path / "best_params.yaml", get_arm(arm))["eta_beta"] == 5.0, arm
    hp = HParams.from_params(p, **selected_hparams(p, tmp_path / "best_params.yaml", get_arm("lopd_ramp")))
    assert hp.eta_beta == 5.0 and hp.beta_rate is None
    assert Trainer.beta_rate(types.SimpleNamespace(hp=hp, margin=hp.margin)) == pytest.approx(1.0)


def test_the_search_never_prunes_a_trial():
    """The search's pruner judges no trial (lopd.hpo.study.search_pruner): a batch trains its trials to the horizon
    together, so pruning saved nothing, and a verdict at the first validation came before β had moved. Planted
    fault: ``MedianPruner(n_startup_trials=4, n_warmup_steps=1)`` back; the worst trial is then pruned at step 24."""
    from lopd.hpo.study import search_pruner

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", pruner=search_pruner())
    for v in (0.5, 0.6, 0.7, 0.8, 0.9):
        t = study.ask()
        t.report(v, 24)
        study.tell(t, v)
    worst = study.ask()
    for step in (24, 48):
        worst.report(0.0, step)
        assert not worst.should_prune()


def test_baseline_learning_rates_are_tuned_on_val_only_and_used_by_the_final_runs(workspace, tmp_path):
    """tune_baselines trains sft at each rate on the hpo role's resources (the split guard: no test read),
    writes baselines.yaml, and the final run of sft takes its learning rate from there."""
    from lopd import data as data_mod
    from lopd.arms import get_arm
    from lopd.stages.common import load_resources
    from lopd.hpo.search import tune_baselines
    from lopd.training.run import selected_hparams

    p = workspace.params(hpo={"baseline_arms": ["sft"], "lr_choices": [0.001, 0.004], "steps": 1, "val_every": 1,
                              "seeds_per_trial": 1}, train={"val_tasks": 4, "use_best_params": True})
    res = load_resources(p, workspace.paths, role="hpo")
    start = len(data_mod.ACCESS_LOG)
    out = tune_baselines(p, res, {"margin": 0.05, "K": 4, "n_ret": 1}, tmp_path)
    assert set(out) == {"sft"} and out["sft"]["lr_student"] in (0.001, 0.004)
    assert set(out["sft"]["values"]) == {"0.001", "0.004"}
    assert out["sft"]["value"] == max(out["sft"]["values"].values())
    assert all(math.isfinite(v) for v in out["sft"]["values"].values())
    assert all(r["split"] != "test" and r["role"] == "hpo" for r in data_mod.ACCESS_LOG[start:])
    (tmp_path / "best_params.yaml").write_text(yaml.safe_dump({"margin": 0.1, "K": 4, "n_ret": 1, "lr_student": 0.003}))
    assert selected_hparams(p, tmp_path / "best_params.yaml", get_arm("sft")) == {"lr_student": out["sft"]["lr_student"]}
    assert selected_hparams(p, tmp_path / "best_params.yaml", get_arm("lopd")) == {
        "margin": 0.1, "K": 4, "n_ret": 1, "lr_student": 0.003}


def test_an_arms_own_search_reads_only_val_and_its_final_runs_take_its_point(workspace, tmp_path):
    """lopd_frozen's own search (lopd.hpo.search.search_arm over K, n_ret and its learning rate) trains on the hpo
    role's resources (no test read), holds m at LOPD's selection, and the final run of lopd_frozen reads every
    coordinate it searched from baselines.yaml and the rest from the selected point."""
    from lopd import data as data_mod
    from lopd.arms import get_arm
    from lopd.hpo.search import fixed_values, search_arm, tune_baselines
    from lopd.stages.common import load_resources
    from lopd.training.run import selected_hparams

    p = workspace.params(hpo={"n_trials": 2, "steps": 1, "val_every": 1, "seeds_per_trial": 1, "rerun_top": 0,
                              "max_extensions": 0, "k_choices": [2, 4], "n_ret_max": 2, "lr_choices": [0.001, 0.004]},
                         train={"val_tasks": 4, "use_best_params": True})
    res = load_resources(p, workspace.paths, role="hpo")
    lopd_sel = {"margin": 0.1, "K": 4, "n_ret": 1, "lr_student": 0.003}
    axes = ["K", "n_ret", "lr_student"]
    assert fixed_values(p, "lopd_frozen", axes, lopd_sel) == {"margin": 0.1}
    start = len(data_mod.ACCESS_LOG)
    dep = tmp_path / "dep.txt"
    dep.write_text("x")
    got, study = search_arm(p, res, "lopd_frozen", axes, tmp_path, storage=str(tmp_path / "journal.log"),
                            dep_files=[dep], fixed={"margin": 0.1})
    assert all(r["split"] != "test" and r["role"] == "hpo" for r in data_mod.ACCESS_LOG[start:])
    assert len(study.get_trials()) == 2 and all(set(t.params) == set(axes) for t in study.get_trials())
    out = tune_baselines(p, res, lopd_sel, tmp_path, searched={"lopd_frozen": (axes, got)})
    assert out["lopd_frozen"]["knob"] == "search" and out["lopd_frozen"]["knobs"] == axes
    (tmp_path / "best_params.yaml").write_text(yaml.safe_dump(lopd_sel))
    assert selected_hparams(p, tmp_path / "best_params.yaml", get_arm("lopd_frozen")) == {
        "margin": 0.1, **{k: got[k] for k in axes}}


def test_fixbeta_is_tuned_over_its_held_beta_at_the_selected_point(workspace, tmp_path, monkeypatch):
    """lopd_fixbeta in hpo.baseline_arms is tuned over hpo.beta_fixed_choices, not over learning rates: its
    runs take m, K, n_ret and the student lr of the selected point and vary only β; baselines.yaml records
    the knob, and the final run reads the chosen β with the selected point's other values. Val only."""
    from lopd import data as data_mod
    from lopd.arms import get_arm
    from lopd.population import points as points_mod
    from lopd.stages.common import load_resources
    from lopd.hpo.search import tune_baselines
    from lopd.training.run import selected_hparams

    p = workspace.params(hpo={"baseline_arms": ["lopd_fixbeta"], "beta_fixed_choices": [0.5, 2.0], "steps": 1,
                              "val_every": 1, "seeds_per_trial": 1}, train={"val_tasks": 4, "use_best_params": True})
    res = load_resources(p, workspace.paths, role="hpo")
    seen, real = [], points_mod.train_points

    def spy(params, res, arm, points, *a, **kw):
        seen.append((arm, [dict(pt) for pt in points]))
        return real(params, res, arm, points, *a, **kw)

    monkeypatch.setattr(points_mod, "train_points", spy)
    sel = {"margin": 0.05, "K": 4, "n_ret": 1, "lr_student": 0.003}
    start = len(data_mod.ACCESS_LOG)
    out = tune_baselines(p, res, sel, tmp_path)
    assert seen == [("lopd_fixbeta", [{**sel, "beta_fixed": 0.5}, {**sel, "beta_fixed": 2.0}])]
    assert out["lopd_fixbeta"]["knob"] == "beta_fixed" and out["lopd_fixbeta"]["beta_fixed"] in (0.5, 2.0)
    assert "lr_student" not in out["lopd_fixbeta"] and set(out["lopd_fixbeta"]["values"]) == {"0.5", "2.0"}
    assert all(r["split"] != "test" and r["role"] == "hpo" for r in data_mod.ACCESS_LOG[start:])
    (tmp_path / "best_params.yaml").write_text(yaml.safe_dump(sel))
    assert selected_hparams(p, tmp_path / "best_params.yaml", get_arm("lopd_fixbeta")) == {
        **sel, "beta_fixed": out["lopd_fixbeta"]["beta_fixed"]}


def test_binding_point_is_the_best_completed_trial_whose_margin_binds():
    """select_binding by hand. Trials 0-3, two seeds each, min_frac 0.5: trial 0 (0.40) binds in 1 of 2,
    trial 1 (0.45, the best value) degenerates in both, trial 2 (0.42) binds in both, trial 3 (0.50) binds
    in both but was pruned. The point is trial 2 (the best completed one binding in ≥ half its seeds); at
    min_frac 1 it is still trial 2; without trial 2 and at min_frac 1 no trial qualifies and the reason gives
    the largest Δ reached (0.06, trial 1) against the smallest positive m tried (0.01, trial 2 left out)."""
    from lopd.hpo.selection import select_binding

    pts = [{"margin": 0.01}, {"margin": 1.0}, {"margin": 0.005}, {"margin": 0.0}]
    trials = [TrialScore(0, "COMPLETE", pts[0], 0.40), TrialScore(1, "COMPLETE", pts[1], 0.45),
              TrialScore(2, "COMPLETE", pts[2], 0.42), TrialScore(3, "PRUNED", pts[3], 0.50)]
    st = {0: ["binds", "unsettled"], 1: ["degenerates"] * 2, 2: ["binds"] * 2, 3: ["binds"] * 2}
    dmax = {0: 0.02, 1: 0.06, 2: 0.01, 3: 0.03}
    got = select_binding(trials, st, 0.5, dmax)
    assert got.to_json() == {"trial": 2, "point": {"margin": 0.005}, "value": 0.42, "statuses": ["binds", "binds"]}
    assert select_binding(trials, st, 1.0, dmax).trial == 2
    none = select_binding([t for t in trials if t.number != 2], st, 1.0, dmax)
    assert none.trial is None
    assert "binds in some seed: trial(s) 0, 2, 3" in none.reason  # statuses of every trial recorded
    assert "largest Δ(φ) any run reached is 0.0600 (trial 1)" in none.reason
    assert "smallest positive m tried is 0.01" in none.reason  # trial 2 (m 0.005) left out here


def test_an_arm_without_a_point_is_recorded_not_run_and_reads_no_test_task(workspace, tmp_path):
    """lopd_binding when the search found no binding trial: train@lopd_binding writes runs/lopd_binding/
    not_run.json with the search's reason and trains nothing; evaluate@lopd_binding writes its own record and
    reads no split; the report's loader returns the reason."""
    from lopd import data as data_mod
    from lopd.analysis.loading import load_not_run
    from lopd.paths import Paths
    from lopd.stages import evaluate as evaluate_stage, train as train_stage

    p = workspace.params(train={"use_best_params": True})
    paths = Paths(tmp_path)
    paths.hpo.mkdir(parents=True)
    why = "no completed trial's margin binds in at least 50% of its seeds"
    (paths.hpo / "best_params.yaml").write_text(yaml.safe_dump(
        {"margin": 1.0, "K": 4, "n_ret": 2, "lr_student": 0.005, "binding": None, "binding_reason": why}))
    start = len(data_mod.ACCESS_LOG)
    assert train_stage.run(p, paths, "lopd_binding") == {}
    assert evaluate_stage.run(p, paths, "lopd_binding") == {}
    assert data_mod.ACCESS_LOG[start:] == []
    assert json.loads(paths.not_run("lopd_binding").read_text()) == {"arm": "lopd_binding", "reason": why}
    assert json.loads((paths.arm_evals("lopd_binding") / "not_run.json").read_text())["reason"] == why
    assert load_not_run(tmp_path) == {"lopd_binding": why}
    assert not list(paths.arm_runs("lopd_binding").glob("seed-*"))
    # every other arm reads the selected point as before; lopd_binding's hparams refuse a missing point
    from lopd.arms import get_arm
    from lopd.errors import BadInput
    from lopd.training.run import not_run_reason, selected_hparams

    assert not_run_reason(p, paths.hpo / "best_params.yaml", get_arm("lopd")) is None
    with pytest.raises(BadInput, match="has no point: no completed trial"):
        selected_hparams(p, paths.hpo / "best_params.yaml", get_arm("lopd_binding"))
    (paths.hpo / "best_params.yaml").write_text(yaml.safe_dump(
        {"margin": 1.0, "K": 4, "n_ret": 2, "lr_student": 0.005,
         "binding": {"margin": 0.01, "K": 8, "n_ret": 1, "lr_student": 0.002, "trial": 3, "value": 0.3}}))
    assert selected_hparams(p, paths.hpo / "best_params.yaml", get_arm("lopd_binding")) == {
        "margin": 0.01, "K": 8, "n_ret": 1, "lr_student": 0.002}
    assert not_run_reason(p, paths.hpo / "best_params.yaml", get_arm("lopd_binding")) is None


# --------------------------------------------------------------------------- ties by seed (hpo.rerun_top)
def test_paired_by_seed_by_hand():
    """Per-seed differences (.1, 0, .1, .2): mean .1, sd .081650, t_{0.975,3} = 3.182446, half-width
    3.182446 · .081650 / 2 = .129923: [-.0299, .2299] holds 0: tied. Equal seeds only: the point."""
    r = paired_by_seed([0.5, 0.6, 0.7, 0.8], [0.4, 0.6, 0.6, 0.6], 0.05)
    assert r["diff"] == pytest.approx(0.1) and r["n_seeds"] == 4 and r["tied"]
    assert r["low"] == pytest.approx(0.1 - 0.129923, abs=1e-5) and r["high"] == pytest.approx(0.1 + 0.129923, abs=1e-5)
    assert paired_by_seed([0.5], [0.4], 0.05)["tied"] is False and paired_by_seed([0.5], [0.5], 0.05)["tied"]
    with pytest.raises(ValueError, match="the same seeds"):
        paired_by_seed([0.5, 0.6], [0.5], 0.05)


def _seeded(n, margin, task_base, seed_effects):
    """A trial whose per-seed per-task rewards are task_base[t] + seed_effects[s]: no effect of its point."""
    per_seed = [[b + e for b in task_base] for e in seed_effects]
    search = per_seed[:2]  # the search's two seeds
    per_task = tuple(sum(x) / len(x) for x in zip(*search))
    return (TrialScore(n, C, {"margin": margin, "K": 8, "n_ret": 2, "lr_student": 0.002},
                       sum(per_task) / len(per_task), per_task), [sum(r) / len(r) for r in per_seed])


def test_the_seed_aware_tie_test_ties_two_trials_that_differ_only_by_their_seeds():
    """Two trials with the same point effect (none) whose runs differ only by seed: trial 0's two search
    seeds happened to run 0.05 above trial 1's on every task. Paired over 64 val tasks (the search's test)
    that gap is a constant, far outside its interval: 'distinguishable'. Paired by seed over 6 seeds (the 4
    confirmation seeds run each way as often), the difference's interval holds 0: tied."""
    tasks = [0.1 + 0.8 * (t % 9) / 8 + 0.001 * (t % 3) for t in range(64)]
    a, a_seeds = _seeded(0, 0.05, tasks, [0.03, 0.02, -0.02, 0.01, -0.03, 0.0])
    b, b_seeds = _seeded(1, 0.2, tasks, [-0.02, -0.03, 0.02, -0.01, 0.03, 0.01])
    assert not paired(a, b, 0.05)["tied"]  # the search's test calls them different
    sel = select_by_seed([a, b], {0: a_seeds, 1: b_seeds}, [1000, 1001, 1002, 1003, 1004, 1005], "median_margin",
                         0.05, SPACE)
    assert sel.unit == "seed" and sel.tie_count == 2 and not sel.distinguishable
    assert sel.vs_best[str(sel.runner_up["number"])]["n_seeds"] == 6
    # a real effect of the point (+0.1 on every seed) stays distinguishable by seed
    c, c_seeds = _seeded(2, 0.5, [x + 0.1 for x in tasks], [0.03, 0.02, -0.02, 0.01, -0.03, 0.0])
    sel = select_by_seed([a, b, c], {0: a_seeds, 1: b_seeds, 2: c_seeds}, list(range(6)), "best", 0.05, SPACE)
    assert sel.selected == 2 and sel.distinguishable and sel.tied == [2]
    with pytest.raises(ValueError, match="has 5 per-seed rewards for 6 seeds"):
        select_by_seed([a, b], {0: a_seeds[:5], 1: b_seeds}, list(range(6)), "best", 0.05, SPACE)


def test_confirm_candidates_are_the_best_complete_trials():
    ts = [_t(0, C, 0.0, [0.2]), _t(1, P, 0.0, [0.9]), _t(2, C, 0.0, [0.5]), _t(3, C, 0.0, [0.5]), _t(4, C, 0.0, [0.1])]
    assert [t.number for t in rerun_candidates(ts, 3)] == [2, 3, 0]


def test_write_outputs_selects_among_the_confirmed_trials_by_seed(tmp_path):
    """The search's best on its 2 seeds (trial 0) falls behind trial 2 over 6 seeds; the selection is trial 2's,
    the search's own task-paired selection is kept beside it, and the report shows both."""
    same = [1.0, 0.0, 0.5, 0.5]
    study = _study((TrialState.COMPLETE, 0.0, [1.0, 1.0, 0.5, 0.5]), (TrialState.COMPLETE, 0.05, same),
                   (TrialState.COMPLETE, 0.2, same))
    per_seed = {0: [0.75, 0.75, 0.1, 0.1, 0.1, 0.1], 2: [0.5, 0.5, 0.6, 0.6, 0.6, 0.61]}
    params = default_params({"hpo": {"margin_choices": SPACE["margin"], "k_choices": [4, 8], "n_ret_min": 1,
                                     "n_ret_max": 3, "lr_choices": [0.001, 0.002], "tie_rule": "best",
                                     "seeds_per_trial": 2, "rerun_top": 2, "rerun_seeds": 4}})
    best = write_outputs(study, tmp_path, params, per_seed)
    assert best["trial"] == 2 and best["tie_unit"] == "seed" and best["value_seeds"] == 6
    assert best["value"] == pytest.approx(sum(per_seed[2]) / 6)
    sel = Selection.from_json(json.loads((tmp_path / "selection.json").read_text()))
    assert sel.search.best == 0 and sel.search.unit == "task" and sel.seeds == list(range(1000, 1006))
    with open(tmp_path / "trials.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["rerun_seed_count"] for r in rows] == ["6", "", "6"]
    md = render_search({"selection": sel, "trials": rows, "baselines": {}}, {})
    assert "## The best trials on more seeds (ties by seed)" in md and "**the seed as the unit**" in md
    assert "paired by seed over 6 seeds" in md


def test_every_arms_tuning_budget_is_counted_from_the_search_outputs():
    """3 finished trials × 2 search seeds + 2 rerun × 4 more seeds = 14 runs; sft 3 rates × 2 seeds = 6."""
    from lopd.analysis.hpo_report import _budgets

    confirm = [{"trial": t, "seed": s, "source": "search"} for t in ("0", "2") for s in ("1000", "1001")]
    confirm += [{"trial": t, "seed": str(s), "source": "rerun"} for t in ("0", "2") for s in range(1002, 1006)]
    base_runs = [{"arm": "sft", "knob_value": v, "seed": s} for v in ("0.001", "0.002", "0.005") for s in ("1000", "1001")]
    search, by_arm = _budgets({"trials": [{}, {}, {}], "reruns": confirm, "baseline_runs": base_runs})
    assert search == "3 trials × 2 seeds + 2 × 4 more seeds = 14 runs"
    assert by_arm == {"sft": "3 values × 2 seeds = 6 runs"}
    assert _budgets({"trials": [{}], "reruns": None, "baseline_runs": None})[0] == "1 trials × ? seeds"
