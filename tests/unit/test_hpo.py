"""The search's selection of the best trial through lopd.hpo.study.write_outputs, on hand-made
in-memory Optuna studies under the ``best`` tie rule: an exact tie goes to the earliest finished
trial, FAIL trials are not finished trials (positions count COMPLETE and PRUNED only), a PRUNED trial
is never selected, and a search with no COMPLETE trial selects nothing.

Every trial's per-task val rewards are flat (one value on all 4 tasks), so each paired difference
has zero spread: two trials are tied exactly when their values are equal (the interval is the point
difference). The paired tie test and the other tie rules: tests/integration/test_hpo_selection.py."""

from __future__ import annotations

import csv

import optuna
import pytest
import yaml
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from lopd.errors import RunFailed
from lopd.hpo.study import finished_trials, write_outputs
from tests.conftest import default_params

C, P, F = TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL
DISTS = {"margin": CategoricalDistribution([0.0, 0.05, 0.1, 0.2]), "K": CategoricalDistribution([2, 4, 8]),
         "n_ret": IntDistribution(1, 4)}


def _params():
    return default_params({"hpo": {"margin_choices": [0.0, 0.05, 0.1, 0.2], "k_choices": [2, 4, 8], "n_ret_min": 1,
                                   "n_ret_max": 4, "tie_rule": "best"}})


def _study(*trials: tuple) -> optuna.Study:
    """A study holding ``(state, value, margin, K, n_ret)`` trials, numbered in this order; each scored
    ``value`` on every one of 4 val tasks (a PRUNED trial reported it before it was stopped)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    for state, value, margin, K, n_ret in trials:
        kw = {"value": value} if state == C else {"intermediate_values": {1: value}} if state == P else {}
        attrs = {"val_per_task": [value] * 4} if value is not None else {}
        study.add_trial(create_trial(state=state, params={"margin": margin, "K": K, "n_ret": n_ret},
                                     distributions=DISTS, user_attrs=attrs, **kw))
    return study


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_a_tie_goes_to_the_earliest_trial(tmp_path):
    """Values 0.5, 0.75, 0.25, 0.75: the two 0.75 trials tie (tie count 2) and the earlier one
    (position 1) is selected; a later trial with the same value never replaces it."""
    study = _study((C, 0.5, 0.0, 2, 1), (C, 0.75, 0.1, 4, 2), (C, 0.25, 0.2, 8, 3), (C, 0.75, 0.05, 8, 4))
    sel = write_outputs(study, tmp_path, _params())
    lr, eta = _params().train.lr_student, _params().train.eta_beta  # not searched here: the train defaults
    want = {"margin": 0.1, "K": 4, "n_ret": 2, "lr_student": lr, "eta_beta": eta, "value": 0.75, "trial": 1, "tie_count": 2,
            "tie_rule": "best", "tie_unit": "task", "value_seeds": _params().hpo.seeds_per_trial, "selected_on": "val",
            "binding": None,  # no margin paths recorded: no binding trial
            "binding_reason": "no completed trial's margin binds in at least 50% of its seeds; the smallest "
                              "positive m tried is 0.05"}
    assert sel == want
    assert yaml.safe_load((tmp_path / "best_params.yaml").read_text()) == want
    assert [r["tied_with_best"].lower() for r in _rows(tmp_path / "trials.csv")] == ["false", "true", "false", "true"]


def test_pruned_and_failed_trials_are_never_selected(tmp_path):
    """FAIL (left RUNNING by a killed search) is not a finished trial: positions count COMPLETE and
    PRUNED only. The PRUNED trial reported 0.9 before it was stopped, above every COMPLETE value;
    the selection is still the best COMPLETE trial, 0.5 at position 2 (positions: 0.25, pruned, 0.5)."""
    study = _study((F, None, 0.2, 8, 4), (C, 0.25, 0.0, 2, 1), (P, 0.9, 0.2, 8, 4), (C, 0.5, 0.05, 2, 3))
    assert [t.number for t in finished_trials(study)] == [1, 2, 3]
    sel = write_outputs(study, tmp_path, _params())
    assert (sel["trial"], sel["value"], sel["margin"], sel["K"], sel["n_ret"]) == (2, 0.5, 0.05, 2, 3)
    rows = _rows(tmp_path / "trials.csv")
    assert [(r["number"], r["state"], r["value"]) for r in rows] == [("0", "COMPLETE", "0.25"), ("1", "PRUNED", ""),
                                                                    ("2", "COMPLETE", "0.5")]


def test_no_complete_trial_selects_nothing(tmp_path):
    """Only PRUNED (and FAIL) trials: no selection is made up — RunFailed, and neither
    best_params.yaml nor selection.json is written."""
    study = _study((P, 0.75, 0.1, 4, 2), (F, None, 0.0, 2, 1), (P, 0.25, 0.2, 8, 1))
    with pytest.raises(RunFailed, match="the search finished no trial: nothing to select"):
        write_outputs(study, tmp_path, _params())
    assert not (tmp_path / "best_params.yaml").exists() and not (tmp_path / "selection.json").exists()
