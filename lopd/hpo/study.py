"""Validation-only search over the margin ``m``, latent tokens per experience ``K``,
retrieved experiences ``n_ret``, the student learning rate and the dual step ``η_β``.

Objective: the LOPD student's mean reward on the **validation** split at the final runs' horizon
(``hpo.steps``, null = ``train.steps``), averaged over ``hpo.seeds_per_trial`` seeds, every val task
sampled ``train.val_samples_per_task`` times with the same sampling seeds in every trial (common
random numbers). Trials are asked ``hpo.trials_per_batch`` at a time (TPE with ``constant_liar``), and
a batch's trials × seeds train as one population (:mod:`lopd.population`). Each trial keeps its
per-task rewards (user attribute ``val_per_task``), so the selection (:mod:`lopd.hpo.selection`)
compares trials paired by task and applies the tie rule registered in ``hpo.tie_rule``. Intermediate
validation rewards (a trial's mean over its seeds) are reported to Optuna as the trial's learning curve, but
no pruner judges them: a batch trains its members to the horizon together, so a pruned trial saved no compute
and only lost its value, and a verdict at the first validation (step 24 of 96) came before β had moved, so
the margin could not show its status (every trial now keeps its value and its margin's path).

Every arm of ``hpo.searched_arms`` is searched like LOPD over its own coordinates, with the same budget, and
the boundary rule extends any search whose selection sits on an edge (:mod:`lopd.hpo.search`); the arms of
``hpo.baseline_arms`` (lopd_fixbeta's held β at the selected point) are tuned over one knob's grid
(:func:`lopd.hpo.search.tune_baselines`).

Storage: an Optuna Journal file (``hpo/journal.log``, beside the stage's outputs but not one of
them: it holds timestamps and worker ids, and every DVC output must be a deterministic function of
its deps; DVC leaves an undeclared file alone), so a killed search resumes and keeps its finished
trials; a trial left RUNNING by a killed process is
marked FAIL on restart and does not count. ``--worker`` joins an existing study (several
processes on one journal file on one machine, or a PostgreSQL/MySQL URL across machines).

The split guard applies: this stage's reader has role ``hpo`` and cannot open ``test``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from lopd.utils import atomic_write_text, write_csv, write_json

if TYPE_CHECKING:
    from lopd.config import Params
    from lopd.training.trainer import Resources


TRIAL_COLUMNS = ["number", "state", "value", "ci_low", "ci_high", "rerun_value", "rerun_seed_count",
                 "tied_with_best", "margin", "K", "n_ret", "lr_student", "eta_beta"]
RERUN_COLUMNS = ["trial", "seed", "source", "val_reward"]
BASELINE_COLUMNS = ["arm", "knob", "knob_value", "seed", "val_reward"]
MARGIN_PATH_COLUMNS = ["trial", "seed", "margin", "step", "beta", "delta_phi"]


def horizon(params: Params) -> int:
    """Training steps of a search trial: ``hpo.steps``, or the final runs' ``train.steps`` when null."""
    return params.hpo.steps or params.train.steps


LOPD_AXES = ("margin", "K", "n_ret", "lr_student", "eta_beta")


def space(params: Params, axes: tuple[str, ...] | list[str] = LOPD_AXES) -> dict:
    """The choices of each searched coordinate in ``axes`` (default: LOPD's) before any extension of the
    boundary rule (:mod:`lopd.hpo.boundary`)."""
    hp = params.hpo
    full = {"margin": list(hp.margin_choices), "K": list(hp.k_choices),
            "n_ret": list(range(hp.n_ret_min, hp.n_ret_max + 1)), "lr_student": list(hp.lr_choices),
            "eta_beta": list(hp.eta_beta_choices), "group_size": list(hp.group_size_choices)}
    return {a: full[a] for a in axes}


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


def study_name(params: Params, dep_files: list[Path], arm: str = "lopd", space_: dict | None = None,
               fixed: dict | None = None, level: int = 0, after: int | None = None) -> str:
    """``hpo.study_name`` plus a hash of everything a trial's value depends on except
    ``n_trials`` — the training setup and the contents of the upstream outputs (splits manifest,
    base model, bank, φ0), the arm, its searched space (``space_``, default LOPD's), the values it holds
    fixed and the boundary rule's extension ``level`` with the trials it starts from (``after``: raising
    ``n_trials`` grows the level-0 study, and each extension starts again from it): raising ``n_trials`` resumes
    the study, any other change starts a new one in the same (persistent) journal. LOPD's level-0 study keeps
    its older name."""
    import hashlib
    import json

    from lopd.config.train import TRIAL_KEYS
    from lopd.utils import sha256_path

    # what a trial trains with (lopd.config.train.TRIAL_KEYS): not which runs the final matrix holds (adding a
    # seed must not restart the search), nor how the final runs draw the bank and φ0 (the search always uses the
    # shared draw), nor the control arms' β schedules (a trial is lopd, with dual ascent)
    train = params.train.model_dump(include=set(TRIAL_KEYS))
    setup = [sha256_path(f) for f in dep_files] + [train]
    setup = hashlib.sha256(json.dumps(setup, sort_keys=True).encode()).hexdigest()[:8]
    name = f"{params.hpo.study_name}-{setup}-{_space_hash(params)}"
    if arm == "lopd" and level == 0 and (space_ is None or space_ == space(params)) and not fixed:
        return name
    more = json.dumps({"arm": arm, "space": space_, "fixed": fixed, "level": level, "after": after}, sort_keys=True)
    return f"{name}-{arm}-{level}-{hashlib.sha256(more.encode()).hexdigest()[:8]}"


def _space_hash(params: Params) -> str:
    import hashlib

    # none of these changes a trial (the other arms' spaces and the extensions enter study_name's own hash)
    d = params.hpo.model_dump(exclude={"n_trials", "baseline_arms", "beta_fixed_choices", "tie_rule",
                                       "tie_alpha", "rerun_top", "rerun_seeds", "searched_arms", "search_axes",
                                       "group_size_choices", "max_extensions", "trials_per_extension"})
    d["steps"] = horizon(params)
    return hashlib.sha256(repr(sorted(d.items())).encode()).hexdigest()[:8]


def run_search(params: Params, res: Resources, *, storage: str, dep_files: list[Path], n_trials: int | None = None,
               worker: bool = False, parent_tracker=None, on_batch=None, arm: str = "lopd",
               space_: dict | None = None, fixed: dict | None = None, level: int = 0, parent=None,
               forced: list[dict] = ()) -> "optuna.Study":  # noqa: F821
    """The search's study, run until ``n_trials`` (default ``hpo.n_trials``) trials are finished,
    ``hpo.trials_per_batch`` trials at a time, each batch's trials × ``hpo.seeds_per_trial`` seeds
    trained as one population (:func:`lopd.hpo.batches.run_batches`, ``train_trials``).
    ``on_batch(study)`` after each batch is told (the stage's progress bar).

    The stage's process reseeds the TPE sampler before each batch from the number of finished
    trials, and tells FAIL the trials a killed process left RUNNING: a killed and resumed search
    proposes what an uninterrupted one would. A ``worker`` joins a running study: it fails no
    trial (the others' trials are running) and keeps one sampler (its trials' order depends on the
    other processes anyway). Every process stops once the budget is reached; a batch asked before
    then is cut to what the budget has left when it is asked.

    ``arm``, ``space_`` (default LOPD's :func:`space`) and ``fixed`` (the values of what the arm does not
    search): any arm's search (:mod:`lopd.hpo.search`). ``level`` > 0: an extension of the boundary rule, a new
    study over the extended ``space_`` that starts with ``parent``'s finished trials (their points are in it).
    ``forced``: points trained first, each unless a trial of this study (past ``parent``'s) holds it already."""
    import optuna

    from lopd.hpo.batches import fail_interrupted, run_batches, train_trials
    from lopd.tracking.names import trial_run

    hp = params.hpo
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    def make_sampler(n_finished: int):
        return optuna.samplers.TPESampler(seed=hp.seed + n_finished, n_startup_trials=min(8, hp.n_trials),
                                          constant_liar=True)  # RUNNING trials of a batch steer the next asks

    pruner = search_pruner()
    space_ = space(params) if space_ is None else space_
    fixed = dict(fixed or {})
    from lopd.hpo.batches import adopt_trials, n_finished, queue_points

    name = study_name(params, dep_files, arm, space_, fixed, level, n_finished(parent) if parent is not None else None)
    study = optuna.create_study(study_name=name, storage=make_storage(storage),
                                sampler=make_sampler(0), pruner=pruner, direction="maximize", load_if_exists=True)
    if not worker:
        stale = fail_interrupted(study)
        if stale:
            print(f"marked {stale} trial(s) left RUNNING by a killed search as FAIL")
    dists = distributions(space_)
    study, start = adopt_trials(study, parent, dists) if parent is not None else (study, 0)
    queue_points(study, list(forced), start)
    seeds = search_seeds(params)

    def suggest(trial) -> dict:
        return {a: (trial.suggest_int(a, d.low, d.high) if a == "n_ret" else trial.suggest_categorical(a, list(d.choices)))
                for a, d in dists.items()}

    def train(trials, points):
        def naming(t: int, seed: int) -> tuple[dict, str]:
            return ({"stage": "hpo" if arm == "lopd" else f"hpo-{arm}", "trial": trials[t].number, "split": "val"},
                    trial_run(trials[t].number, points[t], seed if len(seeds) > 1 else None))

        out = [None] * len(points)
        for idx in by_group_size(points):
            got = train_trials(params, res, arm, [trials[t] for t in idx], [{**fixed, **points[t]} for t in idx],
                               seeds=seeds, steps=horizon(params), val_every=hp.val_every,
                               naming=lambda i, seed, idx=idx: naming(idx[i], seed),
                               parent_run_id=parent_tracker.run_id if parent_tracker else None)
            for t, o in zip(idx, got):
                out[t] = o
        return out

    run_batches(study, budget=n_trials if n_trials is not None else hp.n_trials, batch=hp.trials_per_batch,
                suggest=suggest, train=train, make_sampler=None if worker else make_sampler,
                on_batch=on_batch, fail_stale=False)
    return study


def search_pruner():
    """Optuna's pruner of every search: none judges a trial (the module docstring says why)."""
    import optuna

    return optuna.pruners.NopPruner()


def by_group_size(points: list[dict]) -> list[list[int]]:
    """The indices of ``points`` grouped by their ``group_size`` (None: unset), in first-seen order: a population
    shares ``train.group_size``, so GRPO's points train one population per group size."""
    groups: dict = {}
    for i, p in enumerate(points):
        groups.setdefault(p.get("group_size"), []).append(i)
    return list(groups.values())


def distributions(space_: dict) -> dict:
    """Optuna's distribution of each searched coordinate: n_ret an integer range, the others categorical."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    return {a: IntDistribution(min(v), max(v)) if a == "n_ret" else CategoricalDistribution(list(v))
            for a, v in space_.items()}


def search_seeds(params: Params) -> list[int]:
    """The training seeds of every search trial."""
    return [1000 + s for s in range(params.hpo.seeds_per_trial)]


def rerun_seeds(params: Params) -> list[int]:
    """The seeds the best trials are rerun with (after the search's own)."""
    hp = params.hpo
    return [1000 + hp.seeds_per_trial + s for s in range(hp.rerun_seeds)]


def rerun_trials(params: Params, res: Resources, study, out_dir: Path, parent_tracker=None, *, arm: str = "lopd",
                   fixed: dict | None = None, have: dict[int, list[float]] | None = None) -> dict[int, list[float]] | None:
    """The ``hpo.rerun_top`` best COMPLETE trials (:func:`lopd.hpo.selection.rerun_candidates`), each rerun
    with :func:`rerun_seeds` at the search's horizon, all as one population on val; returns each one's mean
    val reward per seed of the search's seeds then the confirmation's (``per_seed[number]``, numbered as in
    ``trials.csv``) and writes ``reruns.csv``. None when ``hpo.rerun_top`` is 0 (``reruns.csv`` has no rows).

    ``have``: trials rerun before (an earlier level of the boundary rule's extensions): not rerun, and
    returned and written with the others, so the selection compares every trial rerun on more seeds.
    ``arm`` and ``fixed``: another arm's search (:func:`run_search`)."""
    from lopd.errors import RunFailed
    from lopd.hpo.selection import TrialScore, rerun_candidates
    from lopd.population.points import train_points
    from lopd.tracking.names import trial_run

    hp = params.hpo
    if not hp.rerun_top:
        write_csv(out_dir / "reruns.csv", [], RERUN_COLUMNS)
        return None
    done, have = finished_trials(study), dict(have or {})
    scores = [TrialScore(i, t.state.name, dict(t.params), t.value) for i, t in enumerate(done)]
    top = rerun_candidates(scores, hp.rerun_top)
    if not top:
        raise RunFailed("the search finished no COMPLETE trial: nothing to rerun")
    n_first = hp.seeds_per_trial
    top = [t for t in top if t.number not in have]
    first = {n: v[:n_first] for n, v in have.items()}
    for t in top:
        got = done[t.number].user_attrs.get("val_per_seed")
        if got is None or len(got) != hp.seeds_per_trial:
            raise RunFailed(f"search trial {t.number} holds no per-seed val rewards (a journal of an older search?): "
                            f"delete {out_dir / 'journal.log'} to rerun the search")
        first[t.number] = [float(v) for v in got]
    seeds = rerun_seeds(params)
    more = {**{n: v[n_first:] for n, v in have.items()}, **{t.number: [] for t in top}}
    for group in ([[top[i] for i in idx] for idx in by_group_size([t.point for t in top])] if seeds else ()):
        def naming(p: int, seed: int, group=group) -> tuple[dict, str]:
            return ({"stage": "hpo-rerun" if arm == "lopd" else f"hpo-{arm}-rerun", "trial": group[p].number,
                     "split": "val"}, trial_run(group[p].number, group[p].point, seed))

        runs = train_points(params, res, arm, [{**(fixed or {}), **t.point} for t in group], seeds,
                            steps=horizon(params), val_every=hp.val_every, naming=naming,
                            parent_run_id=parent_tracker.run_id if parent_tracker else None,
                            label=f"rerun {len(group)} {arm} trials")
        more.update({t.number: [s.val_reward for s in per_seed] for t, per_seed in zip(group, runs)})
    rows = [{"trial": n, "seed": s, "source": src, "val_reward": v}
            for n in sorted(first) for src, ss, vs in (("search", search_seeds(params), first[n]),
                                                       ("rerun", seeds, more[n]))
            for s, v in zip(ss, vs)]
    write_csv(out_dir / "reruns.csv", rows, RERUN_COLUMNS)
    return {n: first[n] + more[n] for n in sorted(first)}


def finished_trials(study) -> list:
    """COMPLETE and PRUNED trials in the order they were created. A FAIL trial is one a killed
    search left RUNNING (:func:`lopd.hpo.batches.fail_interrupted`; a trial that raises stops the stage): it is
    not part of the search's result, so outputs number trials by position in this list and a
    resumed search writes what an uninterrupted one would."""
    from optuna.trial import TrialState

    return sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)),
                  key=lambda t: t.number)


def write_outputs(study, out_dir: Path, params: Params, per_seed: dict[int, list[float]] | None = None, *,
                  arm: str = "lopd", space_: dict | None = None, boundary: dict | None = None) -> dict:
    """``trials.csv`` (every finished trial with its val CI on the search's seeds, its mean over every seed
    where it was rerun, and whether it ties with the best), ``margin_paths.csv`` (:func:`margin_path_rows`:
    what the margin did in each trial's runs), ``selection.json`` and ``best_params.yaml`` (the point the
    registered tie rule selects, its tie count and the rule). With ``per_seed`` (:func:`rerun_trials`) the
    selection is :func:`lopd.hpo.selection.select_by_seed` among the rerun trials, and the search's own
    task-paired selection over every trial is kept as ``selection.json``'s ``search``; without, it is
    :func:`lopd.hpo.selection.select`.

    ``arm`` and ``space_`` (its searched coordinates and their choices, extended by the boundary rule; default
    LOPD's): another arm's search writes the same files but ``best_params.yaml`` (its point goes to
    ``baselines.yaml``), and no binding point. ``boundary``: what the boundary rule did, into ``selection.json``."""
    from lopd.errors import RunFailed
    from lopd.analysis.constraint import trial_margins
    from lopd.hpo.selection import TrialScore, select, select_by_seed, select_binding

    done = finished_trials(study)
    space_ = space(params) if space_ is None else space_
    scores = [TrialScore(i, t.state.name, dict(t.params), t.value, tuple(t.user_attrs.get("val_per_task", ())))
              for i, t in enumerate(done)]
    try:
        sel = select(scores, params.hpo.tie_rule, params.hpo.tie_alpha, space_)
        search_ci = sel.intervals
        if per_seed:
            sel = replace(select_by_seed(scores, per_seed, search_seeds(params) + rerun_seeds(params),
                                         params.hpo.tie_rule, params.hpo.tie_alpha, space_),
                          search=replace(sel, intervals=None))
    except ValueError as e:
        raise RunFailed(f"the search finished no trial: nothing to select ({e})") from None
    tied = set(sel.tied)
    rows = [{"number": t.number, "state": t.state, "value": t.value,
             "ci_low": (search_ci.get(str(t.number)) or {}).get("low"),
             "ci_high": (search_ci.get(str(t.number)) or {}).get("high"),
             "rerun_value": sum(per_seed[t.number]) / len(per_seed[t.number]) if per_seed and t.number in per_seed
             else None, "rerun_seed_count": len(per_seed[t.number]) if per_seed and t.number in per_seed else None,
             "tied_with_best": t.number in tied, **t.point}
            for t in scores]
    columns = TRIAL_COLUMNS[:-5] + [a for a in ("margin", "K", "n_ret", "lr_student", "eta_beta", "group_size")
                                    if a in space_]
    write_csv(out_dir / "trials.csv", [{k: r.get(k) for k in columns} for r in rows], columns)
    paths_rows = margin_path_rows(done) if "margin" in space_ else []
    write_csv(out_dir / "margin_paths.csv", paths_rows, MARGIN_PATH_COLUMNS)
    margins = {int(n): t for n, t in trial_margins(paths_rows).items()}
    b = select_binding(scores, {n: t["status"] for n, t in margins.items()}, params.hpo.binding_min_frac,
                       {n: t["max_delta"] for n, t in margins.items()}) if arm == "lopd" else None
    sel = sel.with_outputs(space_, arm, boundary, b)
    write_json(out_dir / "selection.json", sel.to_json())
    if b is None:
        return {**{k: _num(v) for k, v in sel.point.items()}, "value": float(sel.value), "trial": sel.selected,
                "tie_count": sel.tie_count, "tie_unit": sel.unit,
                "value_seeds": len(sel.seeds or search_seeds(params)), "selected_on": "val"}
    best = {**_point(sel.point, params), "value": float(sel.value), "trial": sel.selected,
            "tie_count": sel.tie_count, "tie_rule": sel.rule, "tie_unit": sel.unit,
            "value_seeds": len(sel.seeds or search_seeds(params)), "selected_on": "val"}
    best["binding"] = ({**_point(b.point, params), "value": b.value, "trial": b.trial}
                       if b.trial is not None else None)
    if b.trial is None:
        best["binding_reason"] = b.reason
    atomic_write_text(out_dir / "best_params.yaml", yaml.safe_dump(best, sort_keys=True))
    return best


def _num(v):
    """A point's value as YAML should read it: an integral coordinate an int, the others float."""
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else float(v)


def _point(p: dict, params: Params) -> dict:
    """A trial's point as the final runs read it (``best_params.yaml``)."""
    return {"margin": float(p["margin"]), "K": int(p["K"]), "n_ret": int(p["n_ret"]),
            "lr_student": float(p.get("lr_student", params.train.lr_student)),
            "eta_beta": float(p.get("eta_beta", params.train.eta_beta))}


def margin_path_rows(trials) -> list[dict]:
    """One row per (trial, seed, step): the trial's m, and that seed's β and Δ(φ) after the step (the
    ``margin_path`` user attribute :func:`lopd.hpo.batches.train_trials` keeps; a trial without one: no rows).
    ``trials`` are :func:`finished_trials`; a trial is numbered by its position there, as in ``trials.csv``."""
    rows = []
    for i, t in enumerate(trials):
        for path in t.user_attrs.get("margin_path", ()):
            cols = [path.get(k, ()) for k in ("step", "beta", "delta_phi")]
            rows += [{"trial": i, "seed": path["seed"], "margin": t.params.get("margin"), "step": int(s),
                      "beta": b, "delta_phi": d} for s, b, d in zip(*cols)]
    return rows


def interrupted_trials(study) -> int:
    """Trials a killed search left behind (marked FAIL on restart); reported in the side file."""
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.FAIL,)))


def write_result(out_dir: Path, sel: dict, study, splits_read: list) -> None:
    states = {"COMPLETE": 0, "PRUNED": 0}
    for t in finished_trials(study):
        states[t.state.name] += 1
    write_json(out_dir / "result.json", {"best": sel, "trial_states": states, "splits_read": splits_read})
