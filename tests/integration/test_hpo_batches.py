"""The batched search (:func:`lopd.hpo.batches.run_batches`): a batch killed while it trains
resumes without losing or duplicating a trial, and ends as an uninterrupted search ends.

The objective is a toy (a function of the point), so these tests exercise the ask/tell bookkeeping,
the journal and the sampler's reseeding, not training.
"""

from __future__ import annotations

import optuna
import pytest

from lopd.hpo.batches import Outcome, run_batches

CHOICES = {"margin": [0.0, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0], "K": [4, 8, 16]}


def _study(path):
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = JournalStorage(JournalFileBackend(str(path), lock_obj=JournalFileOpenLock(str(path))))
    return optuna.create_study(study_name="s", storage=storage, direction="maximize", load_if_exists=True)


def _sampler(n_done: int):
    # startup trials past the killed batch: the resumed batch draws random points, which only reseeding repeats
    return optuna.samplers.TPESampler(seed=7 + n_done, n_startup_trials=8, constant_liar=True)


def _suggest(trial) -> dict:
    return {k: trial.suggest_categorical(k, v) for k, v in CHOICES.items()}


def _train(trials, points):
    # pruned: the point with margin 1.0 (its last report is its value)
    out = []
    for t, p in zip(trials, points):
        v = -abs(p["margin"] - 0.1) + 0.01 * p["K"]
        t.report(v, 1)
        out.append(Outcome(None, pruned=True) if p["margin"] == 1.0 else Outcome(v, attrs={"k_times_2": 2 * p["K"]}))
    return out


def _finished(study) -> list[tuple]:
    from optuna.trial import TrialState

    done = sorted(study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED)), key=lambda t: t.number)
    return [(t.state.name, t.params["margin"], t.params["K"], t.value, t.user_attrs.get("k_times_2")) for t in done]


def test_a_batch_killed_while_training_resumes_without_losing_or_repeating_a_trial(tmp_path):
    whole = run_batches(_study(tmp_path / "whole.log"), budget=10, batch=3, suggest=_suggest, train=_train,
                        make_sampler=_sampler)
    expected = _finished(whole)
    assert len(expected) == 10 and len({(m, k) for _, m, k, _, _ in expected}) > 3  # TPE explored

    calls = {"n": 0}

    def killed_in_batch_3(trials, points):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("killed")
        return _train(trials, points)

    with pytest.raises(KeyboardInterrupt):
        run_batches(_study(tmp_path / "killed.log"), budget=10, batch=3, suggest=_suggest, train=killed_in_batch_3,
                    make_sampler=_sampler)
    resumed = _study(tmp_path / "killed.log")  # a new process: the journal is all it has
    assert len(_finished(resumed)) == 6
    run_batches(resumed, budget=10, batch=3, suggest=_suggest, train=_train, make_sampler=_sampler)
    assert _finished(resumed) == expected, "the resumed search must end with the uninterrupted one's trials"
    states = [t.state.name for t in resumed.get_trials()]
    assert states.count("FAIL") == 3, "the killed batch's trials are marked FAIL, not counted"
    assert len(states) == 13


def test_the_budget_is_met_exactly_and_a_last_batch_is_cut_to_it(tmp_path):
    seen = []

    def train(trials, points):
        seen.append(len(trials))
        return _train(trials, points)
    study = run_batches(_study(tmp_path / "j.log"), budget=7, batch=3, suggest=_suggest, train=train,
                        make_sampler=_sampler)
    assert seen == [3, 3, 1] and len(_finished(study)) == 7
    # raising the budget resumes the study where it stopped
    run_batches(study, budget=9, batch=3, suggest=_suggest, train=train, make_sampler=_sampler)
    assert seen[-1] == 2 and len(_finished(study)) == 9


def test_train_must_answer_every_trial(tmp_path):
    with pytest.raises(RuntimeError, match="2 outcomes for 3 trials"):
        run_batches(_study(tmp_path / "j.log"), budget=3, batch=3, suggest=_suggest,
                    train=lambda trials, points: _train(trials, points)[:2])


def test_a_batch_of_trials_scores_each_trial_as_it_scores_alone(resources, workspace, tmp_path):
    """Two trials × two seeds trained as one population: each trial's value and per-task rewards equal
    those of the same runs alone (:func:`lopd.training.run.run_arm`, one seed at a time, the path the
    search took before it trained in batches)."""
    from lopd.hpo.batches import train_trials
    from lopd.training.run import run_arm

    params = workspace.params()
    points = [{"margin": 0.05, "K": 4, "n_ret": 2, "lr_student": 0.005},
              {"margin": 0.5, "K": 2, "n_ret": 1, "lr_student": 0.002}]
    study = optuna.create_study(direction="maximize")
    trials = [study.ask() for _ in points]
    got = train_trials(params, resources, "lopd", trials, points, seeds=[1000, 1001], steps=3, val_every=2)
    for point, out in zip(points, got):
        alone = [run_arm(params, resources, "lopd", seed, tmp_path / f"{point['K']}-{seed}", ckpt_dir=None,
                         hp_over={**point, "steps": 3, "val_every": 2})[0] for seed in (1000, 1001)]
        assert out.value == pytest.approx(sum(r["val_reward"] for r in alone) / 2, abs=1e-9)
        per_task = [sum(x) / 2 for x in zip(*(r["val_per_task"] for r in alone))]
        assert out.attrs["val_per_task"] == pytest.approx(per_task, abs=1e-9)
    assert got[0].value != got[1].value or got[0].attrs != got[1].attrs, "the two trials were not told apart"
    # every trial reported one mean per validation step (steps 2 and 3)
    assert [sorted(study.trials[i].intermediate_values) for i in range(2)] == [[2, 3], [2, 3]]
