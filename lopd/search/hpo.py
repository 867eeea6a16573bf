"""Validation-only search over the margin ``m``, latent tokens per experience ``K`` and
retrieved experiences ``n_ret``.

Objective: the LOPD student's mean reward on the **validation** split after
``hpo.steps`` training steps, averaged over ``hpo.seeds_per_trial`` seeds (default 1: on
the CPU profile a second seed per trial would halve the number of trials the 30-minute
budget allows, and the final runs re-measure the selected point over every seed anyway).
Intermediate validation rewards are reported to Optuna's median pruner.

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

from lopd.utils import write_csv, write_json

TRIAL_COLUMNS = ["number", "state", "value", "margin", "K", "n_ret"]


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
    train = params.train.model_dump(exclude={"arms", "seeds", "extra_arms", "extra_seeds", "use_best_params"})
    setup = [sha256_path(f) for f in dep_files] + [train]
    setup = hashlib.sha256(json.dumps(setup, sort_keys=True).encode()).hexdigest()[:8]
    return f"{params.hpo.study_name}-{setup}-{_space_hash(params)}"


def _space_hash(params) -> str:
    import hashlib

    d = params.hpo.model_dump()
    d.pop("n_trials")
    return hashlib.sha256(repr(sorted(d.items())).encode()).hexdigest()[:8]


def _fail_stale_trials(study) -> int:
    """Trials left RUNNING by a killed process can never finish: mark them FAIL (public ``tell``)."""
    from optuna.trial import TrialState

    stale = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for t in stale:
        study.tell(t.number, state=TrialState.FAIL)
    return len(stale)


def run_search(params, res, *, storage: str, dep_files: list[Path], n_trials: int | None = None,
               worker: bool = False, parent_tracker=None, trial_fn=None) -> "optuna.Study":  # noqa: F821
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
    target = n_trials if n_trials is not None else hp.n_trials
    finished = (TrialState.COMPLETE, TrialState.PRUNED)
    objective = trial_fn or (lambda trial: _objective(trial, params, res, parent_tracker))

    def remaining() -> int:
        return target - len(study.get_trials(deepcopy=False, states=finished))

    if worker:  # a worker runs its own quota of trials on the shared study
        study.optimize(objective, n_trials=target, catch=())
        return study
    while remaining() > 0:
        # the sampler's random stream depends on how many trials are finished, not on how often the
        # search was restarted: a search killed and resumed proposes what an uninterrupted one would
        n_done = len(study.get_trials(deepcopy=False, states=finished))
        study.sampler = optuna.samplers.TPESampler(seed=hp.seed + n_done, n_startup_trials=min(8, hp.n_trials))
        study.optimize(objective, n_trials=1, catch=())
    return study


def _objective(trial, params, res, parent_tracker) -> float:
    import optuna

    from lopd.training.run import run_arm

    hp = params.hpo
    margin = trial.suggest_categorical("margin", list(hp.margin_choices))
    K = trial.suggest_categorical("K", list(hp.k_choices))
    n_ret = trial.suggest_int("n_ret", hp.n_ret_min, hp.n_ret_max)
    vals = []
    for s in range(hp.seeds_per_trial):
        offset = s * hp.steps

        def on_val(step, v, _off=offset):
            trial.report(v, _off + step)
            if trial.should_prune():
                raise optuna.TrialPruned()

        tmp = Path(tempfile.mkdtemp(prefix=f"trial{trial.number}-"))
        try:
            r, _ = run_arm(params, res, "lopd", 1000 + s, tmp, ckpt_dir=None,
                           tags={"stage": "hpo", "trial": trial.number, "split": "val"},
                           hp_over={"margin": margin, "K": K, "n_ret": n_ret, "steps": hp.steps,
                                    "val_every": hp.val_every},
                           on_val=on_val, parent_run_id=parent_tracker.run_id if parent_tracker else None)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        vals.append(r["val_reward"])
    return sum(vals) / len(vals)


def finished_trials(study) -> list:
    """COMPLETE and PRUNED trials in the order they were created. A FAIL trial is one a killed
    search left RUNNING (:func:`_fail_stale_trials`; a trial that raises stops the stage): it is
    not part of the search's result, so outputs number trials by position in this list and a
    resumed search writes what an uninterrupted one would."""
    from optuna.trial import TrialState

    return sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)),
                  key=lambda t: t.number)


def write_outputs(study, out_dir: Path) -> dict:
    from optuna.trial import TrialState

    done = finished_trials(study)
    rows = [{"number": i, "state": t.state.name, "value": t.value, **t.params} for i, t in enumerate(done)]
    write_csv(out_dir / "trials.csv", rows, TRIAL_COLUMNS)
    complete = [(i, t) for i, t in enumerate(done) if t.state == TrialState.COMPLETE]
    if not complete:
        from lopd.errors import RunFailed

        raise RunFailed("the search finished no trial: nothing to select")
    i, best = max(complete, key=lambda it: (it[1].value, -it[0]))
    sel = {"margin": float(best.params["margin"]), "K": int(best.params["K"]), "n_ret": int(best.params["n_ret"]),
           "value": float(best.value), "trial": i, "selected_on": "val"}
    tmp = out_dir / "best_params.yaml.tmp"
    tmp.write_text(yaml.safe_dump(sel, sort_keys=True))
    tmp.replace(out_dir / "best_params.yaml")
    return sel


def interrupted_trials(study) -> int:
    """Trials a killed search left behind (marked FAIL on restart); reported in the side file."""
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.FAIL,)))


def write_result(out_dir: Path, sel: dict, study, splits_read: list) -> None:
    states = {"COMPLETE": 0, "PRUNED": 0}
    for t in finished_trials(study):
        states[t.state.name] += 1
    write_json(out_dir / "result.json", {"best": sel, "trial_states": states, "splits_read": splits_read})
