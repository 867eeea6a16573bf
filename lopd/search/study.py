"""Validation-only search over the margin ``m``, latent tokens per experience ``K`` and
retrieved experiences ``n_ret``.

Objective: the LOPD student's mean reward on the **validation** split at the final runs' horizon
(``hpo.steps``, null = ``train.steps``), averaged over ``hpo.seeds_per_trial`` seeds, every val task
sampled ``train.val_samples_per_task`` times with the same sampling seeds in every trial (common
random numbers). Each trial keeps its per-task rewards (user attribute ``val_per_task``), so the
selection (:mod:`lopd.search.selection`) compares trials paired by task and applies the tie rule
registered in ``hpo.tie_rule``. Intermediate validation rewards feed Optuna's median pruner.

The learning baselines (``hpo.baseline_arms``) are tuned like the method: each gets its student
learning rate from ``hpo.lr_choices`` (the grid LOPD's is searched over) on the validation split,
with the selected K and n_ret where the arm reads them (:func:`tune_baselines`).

Storage: an Optuna Journal file (``hpo/journal.log``, beside the stage's outputs but not one of
them: it holds timestamps and worker ids, and every DVC output must be a deterministic function of
its deps; DVC leaves an undeclared file alone), so a killed search resumes and keeps its finished
trials; a trial left RUNNING by a killed process is
marked FAIL on restart and does not count. ``--worker`` joins an existing study (several
processes on one journal file on one machine, or a PostgreSQL/MySQL URL across machines).

The split guard applies: this stage's reader has role ``hpo`` and cannot open ``test``.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import yaml

from lopd.utils import atomic_write_text, write_csv, write_json

TRIAL_COLUMNS = ["number", "state", "value", "ci_low", "ci_high", "tied_with_best", "margin", "K", "n_ret",
                 "lr_student"]
BASELINE_COLUMNS = ["arm", "lr_student", "seed", "val_reward"]


def horizon(params) -> int:
    """Training steps of a search trial: ``hpo.steps``, or the final runs' ``train.steps`` when null."""
    return params.hpo.steps or params.train.steps


def space(params) -> dict:
    """Every searched coordinate and its choices (the boundary check reads this)."""
    hp = params.hpo
    return {"margin": list(hp.margin_choices), "K": list(hp.k_choices),
            "n_ret": list(range(hp.n_ret_min, hp.n_ret_max + 1)), "lr_student": list(hp.lr_choices)}


def make_storage(url_or_path: str):
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

    if "://" in url_or_path:
        return optuna.storages.RDBStorage(url_or_path)
    Path(url_or_path).parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(url_or_path, lock_obj=JournalFileOpenLock(url_or_path)))


def dep_files(paths) -> list[Path]:
    """The upstream outputs a trial's value depends on (hashed into the study name)."""
    return [paths.splits / "manifest.json", paths.base, paths.bank / "manifest.json",
            paths.cold_start / "phi0.safetensors"]


def study_name(params, dep_files: list[Path]) -> str:
    """``hpo.study_name`` plus a hash of everything a trial's value depends on except
    ``n_trials`` — the training setup and the contents of the upstream outputs (splits manifest,
    base model, bank, φ0): raising ``n_trials`` resumes the study, any other change starts a new
    one in the same (persistent) journal."""
    import hashlib
    import json

    from lopd.utils import sha256_path

    # which runs the final matrix holds is not part of a trial (adding a seed must not restart the search)
    # nor is how the final runs draw the bank and φ0 (the search always uses the shared draw)
    train = params.train.model_dump(exclude={"arms", "seeds", "extra_arms", "extra_seeds", "use_best_params",
                                             "per_seed_draws"})
    setup = [sha256_path(f) for f in dep_files] + [train]
    setup = hashlib.sha256(json.dumps(setup, sort_keys=True).encode()).hexdigest()[:8]
    return f"{params.hpo.study_name}-{setup}-{_space_hash(params)}"


def _space_hash(params) -> str:
    import hashlib

    d = params.hpo.model_dump(exclude={"n_trials", "baseline_arms", "tie_rule", "tie_alpha"})  # none changes a trial
    d["steps"] = horizon(params)
    return hashlib.sha256(repr(sorted(d.items())).encode()).hexdigest()[:8]


def _fail_stale_trials(study) -> int:
    """Trials left RUNNING by a killed process can never finish: mark them FAIL (public ``tell``)."""
    from optuna.trial import TrialState

    stale = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for t in stale:
        study.tell(t.number, state=TrialState.FAIL)
    return len(stale)


def run_search(params, res, *, storage: str, dep_files: list[Path], n_trials: int | None = None,
               worker: bool = False, parent_tracker=None, trial_fn=None, callbacks=()) -> "optuna.Study":  # noqa: F821
    """The search's study, run until ``n_trials`` (default ``hpo.n_trials``) trials are finished;
    ``callbacks`` go to ``study.optimize`` (the stage's progress bar)."""
    import optuna
    from optuna.trial import TrialState

    hp = params.hpo
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=hp.seed, n_startup_trials=min(8, hp.n_trials))
    pruner = optuna.pruners.MedianPruner(n_startup_trials=4, n_warmup_steps=1)
    study = optuna.create_study(study_name=study_name(params, dep_files), storage=make_storage(storage), sampler=sampler,
                                pruner=pruner, direction="maximize", load_if_exists=True)
    if not worker:
        stale = _fail_stale_trials(study)
        if stale:
            print(f"marked {stale} trial(s) left RUNNING by a killed search as FAIL")
    budget = n_trials if n_trials is not None else hp.n_trials
    finished = (TrialState.COMPLETE, TrialState.PRUNED)
    objective = trial_fn or (lambda trial: _objective(trial, params, res, parent_tracker))

    def n_finished() -> int:
        return len(study.get_trials(deepcopy=False, states=finished))

    def reseed(study, _trial=None) -> None:
        # the sampler's random stream depends on how many trials are finished, not on how often the
        # search was restarted: a search killed and resumed proposes what an uninterrupted one would
        study.sampler = optuna.samplers.TPESampler(seed=hp.seed + n_finished(), n_startup_trials=min(8, hp.n_trials))

    # one budget for the study, whoever runs its trials: every process (the stage, each --worker) stops
    # once `budget` trials are finished (a worker that started a trial before then finishes it)
    stop_at_budget = optuna.study.MaxTrialsCallback(budget, states=finished)
    if n_finished() >= budget:
        return study  # optimize() would start a trial before its callback could stop it
    if worker:  # a worker keeps the stage's sampler: its trials' order depends on the other processes anyway
        study.optimize(objective, catch=(), callbacks=[stop_at_budget, *callbacks])
        return study
    reseed(study)
    study.optimize(objective, catch=(), callbacks=[reseed, stop_at_budget, *callbacks])
    return study


def _objective(trial, params, res, parent_tracker) -> float:
    import optuna

    from lopd.tracking.names import trial_run

    hp = params.hpo
    point = {"margin": trial.suggest_categorical("margin", list(hp.margin_choices)),
             "K": trial.suggest_categorical("K", list(hp.k_choices)),
             "n_ret": trial.suggest_int("n_ret", hp.n_ret_min, hp.n_ret_max),
             "lr_student": trial.suggest_categorical("lr_student", list(hp.lr_choices))}
    steps = horizon(params)
    vals, per_task = [], []
    for s in range(hp.seeds_per_trial):
        def on_val(step, v, _off=s * steps):
            trial.report(v, _off + step)
            if trial.should_prune():
                raise optuna.TrialPruned()

        r = _val_run(params, res, "lopd", 1000 + s, {**point, "steps": steps, "val_every": hp.val_every},
                     {"stage": "hpo", "trial": trial.number, "split": "val"}, parent_tracker, on_val,
                     run_name=trial_run(trial.number, point, 1000 + s if hp.seeds_per_trial > 1 else None))
        vals.append(r["val_reward"])
        per_task.append(r["val_per_task"])
    trial.set_user_attr("val_per_task", [sum(x) / len(x) for x in zip(*per_task)])
    return sum(vals) / len(vals)


def _val_run(params, res, arm: str, seed: int, hp_over: dict, tags: dict, parent_tracker, on_val=None,
             run_name: str | None = None) -> dict:
    """One validation-only training run in a scratch directory; its result (val reward, per-task rewards)."""
    from lopd.training.run import run_arm

    tmp = Path(tempfile.mkdtemp(prefix=f"{arm}-val-"))
    try:
        r, _ = run_arm(params, res, arm, seed, tmp, ckpt_dir=None, tags=tags, hp_over=hp_over, on_val=on_val,
                       parent_run_id=parent_tracker.run_id if parent_tracker else None, run_name=run_name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return r


def tune_baselines(params, res, sel: dict, out_dir: Path, parent_tracker=None) -> dict:
    """Each arm of ``hpo.baseline_arms`` trained at every learning rate of ``hpo.lr_choices`` (same horizon
    and seeds as a search trial, validation only; K and n_ret of the selected point where the arm reads
    them). Selected: the highest mean val reward, the smaller rate among equal ones. Writes
    ``baselines.csv`` (every run) and ``baselines.yaml`` (arm -> lr_student, value, values by rate)."""
    from lopd.arms import get_arm
    from lopd.tracking.names import baseline_run

    hp, steps = params.hpo, horizon(params)
    rows, chosen = [], {}
    for arm in hp.baseline_arms:
        fixed = {k: sel[k] for k in ("margin", "K", "n_ret")} if get_arm(arm).use_selected else {}
        means = {}
        for lr in hp.lr_choices:
            vals = []
            for s in range(hp.seeds_per_trial):
                r = _val_run(params, res, arm, 1000 + s, {**fixed, "lr_student": lr, "steps": steps,
                                                           "val_every": hp.val_every},
                             {"stage": "hpo-baselines", "split": "val", "lr_student": lr}, parent_tracker,
                             run_name=baseline_run(arm, lr, 1000 + s))
                vals.append(r["val_reward"])
                rows.append({"arm": arm, "lr_student": lr, "seed": 1000 + s, "val_reward": r["val_reward"]})
            means[lr] = sum(vals) / len(vals)
        best = max(sorted(means), key=lambda lr: means[lr])  # sorted: the smaller rate wins an exact tie
        chosen[arm] = {"lr_student": float(best), "value": float(means[best]), "selected_on": "val",
                       "values": {str(lr): float(v) for lr, v in sorted(means.items())}}
    write_csv(out_dir / "baselines.csv", rows, BASELINE_COLUMNS)
    atomic_write_text(out_dir / "baselines.yaml", yaml.safe_dump(chosen, sort_keys=True))
    return chosen


def finished_trials(study) -> list:
    """COMPLETE and PRUNED trials in the order they were created. A FAIL trial is one a killed
    search left RUNNING (:func:`_fail_stale_trials`; a trial that raises stops the stage): it is
    not part of the search's result, so outputs number trials by position in this list and a
    resumed search writes what an uninterrupted one would."""
    from optuna.trial import TrialState

    return sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)),
                  key=lambda t: t.number)


def write_outputs(study, out_dir: Path, params) -> dict:
    """``trials.csv`` (every finished trial with its val CI and whether it ties with the best),
    ``selection.json`` (:func:`lopd.search.selection.select`) and ``best_params.yaml`` (the point the
    registered tie rule selects, its tie count and the rule)."""
    from lopd.errors import RunFailed
    from lopd.search.selection import TrialScore, select

    done = finished_trials(study)
    scores = [TrialScore(i, t.state.name, dict(t.params), t.value, tuple(t.user_attrs.get("val_per_task", ())))
              for i, t in enumerate(done)]
    try:
        sel = select(scores, params.hpo.tie_rule, params.hpo.tie_alpha, space(params))
    except ValueError as e:
        raise RunFailed(f"the search finished no trial: nothing to select ({e})") from None
    tied, ci = set(sel["tied"]), sel["intervals"]
    rows = [{"number": t.number, "state": t.state, "value": t.value, "ci_low": (ci.get(str(t.number)) or {}).get("low"),
             "ci_high": (ci.get(str(t.number)) or {}).get("high"), "tied_with_best": t.number in tied, **t.point}
            for t in scores]
    write_csv(out_dir / "trials.csv", rows, TRIAL_COLUMNS)
    write_json(out_dir / "selection.json", sel)
    p = sel["point"]
    best = {"margin": float(p["margin"]), "K": int(p["K"]), "n_ret": int(p["n_ret"]),
            "lr_student": float(p.get("lr_student", params.train.lr_student)), "value": float(sel["value"]),
            "trial": sel["selected"], "tie_count": sel["tie_count"], "tie_rule": sel["rule"], "selected_on": "val"}
    atomic_write_text(out_dir / "best_params.yaml", yaml.safe_dump(best, sort_keys=True))
    return best


def interrupted_trials(study) -> int:
    """Trials a killed search left behind (marked FAIL on restart); reported in the side file."""
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.FAIL,)))


def write_result(out_dir: Path, sel: dict, study, splits_read: list) -> None:
    states = {"COMPLETE": 0, "PRUNED": 0}
    for t in finished_trials(study):
        states[t.state.name] += 1
    write_json(out_dir / "result.json", {"best": sel, "trial_states": states, "splits_read": splits_read})
