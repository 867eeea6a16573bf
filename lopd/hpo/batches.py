"""A search whose trials train in batches, one population per batch: Optuna's ask/tell.

:func:`run_batches` asks ``batch`` trials at a time, hands their points to ``train`` (which trains
them together, e.g. every trial × seed as one :class:`~lopd.population.trainer.Population`) and
tells each its outcome, until ``budget`` trials are finished (COMPLETE or PRUNED). The sampler
should be TPE with ``constant_liar`` (Optuna's default), so that the trials asked earlier in a batch,
still RUNNING, steer the later ones away from their points.

**Resuming.** A batch killed while it trains leaves its trials RUNNING in the study's storage (a
journal file). On restart they are told FAIL: they never finished, so they neither count toward the
budget nor inform the sampler. ``make_sampler(n_finished)`` builds the sampler afresh before each
batch, seeded by the number of finished trials. So the restarted batch asks the very points the killed
one asked, and a killed and resumed search finishes with the trials, points and values of an
uninterrupted one. No finished trial is lost and none is run twice
(``tests/integration/test_hpo_batches.py``).

:func:`adopt_trials` and :func:`queue_points` start the boundary rule's extension studies
(:mod:`lopd.hpo.search`): the last study's finished trials copied in, and the points to train first queued.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from lopd.config import Params
    from lopd.training.trainer import Resources


@dataclass
class Outcome:
    """What a trained trial reports: its value (None with ``pruned``: Optuna takes the last reported
    intermediate value), whether the pruner stopped it, and user attributes to keep."""

    value: float | None
    pruned: bool = False
    attrs: dict[str, Any] = field(default_factory=dict)


def n_finished(study) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def n_running(study) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))


def fail_interrupted(study) -> int:
    """Tell FAIL every trial a killed process left RUNNING; how many there were."""
    from optuna.trial import TrialState

    stale = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for t in stale:
        study.tell(t.number, state=TrialState.FAIL)
    return len(stale)


def run_batches(study, *, budget: int, batch: int, suggest: Callable[[Any], dict],
                train: Callable[[list, list[dict]], list[Outcome]],
                make_sampler: Callable[[int], Any] | None = None, on_batch: Callable[[Any], None] | None = None,
                fail_stale: bool = True):
    """Run ``study`` until ``budget`` trials are finished, ``batch`` trials trained at a time.

    ``suggest(trial)`` draws a trial's point (its ``trial.suggest_*`` calls); ``train(trials, points)``
    trains them together and returns one :class:`Outcome` each (it may call ``trial.report`` and
    ``trial.should_prune`` as it goes). ``make_sampler(n_finished)``: the sampler for the next batch.
    ``on_batch(study)`` after each batch is told (a progress bar). ``fail_stale``: first tell FAIL the
    trials a killed process left RUNNING (not in a worker that joins a running study: those are the
    other processes' trials).
    """
    from optuna.trial import TrialState

    if batch < 1:
        raise ValueError(f"a search batch needs at least one trial (got {batch})")
    if fail_stale:
        fail_interrupted(study)
    while (done := n_finished(study)) < budget:
        # trials other processes are training count against the budget too (a worker's study)
        left = budget - done - n_running(study)
        if left <= 0:
            break  # the rest of the budget is being trained elsewhere
        if make_sampler is not None:
            study.sampler = make_sampler(done)
        trials = [study.ask() for _ in range(min(batch, left))]
        points = [suggest(t) for t in trials]
        outcomes = train(trials, points)
        if len(outcomes) != len(trials):
            raise RuntimeError(f"train returned {len(outcomes)} outcomes for {len(trials)} trials")
        for trial, out in zip(trials, outcomes):
            for k, v in out.attrs.items():
                trial.set_user_attr(k, v)
            if out.pruned:
                study.tell(trial, state=TrialState.PRUNED)
            else:
                study.tell(trial, out.value)
        if on_batch is not None:
            on_batch(study)
    return study


def train_trials(params: Params, res: Resources, arm_name: str, trials: list, points: list[dict], *, seeds: list[int], steps: int,
                 val_every: int, naming=None, parent_run_id: str | None = None) -> list[Outcome]:
    """Train every trial's point with every seed as one population (validation split only), as
    :func:`run_batches`' ``train`` (:func:`lopd.population.points.train_points`).

    Each validation reports, per trial, the mean over its seeds to Optuna (``trial.report``) and asks
    the pruner. A pruned trial's members keep training (they share the batch), but the trial is told
    PRUNED, with no value or per-task rewards of its own (as a pruned trial alone). Otherwise its value
    is the mean over its seeds of the final validation on all val tasks, its user attribute
    ``val_per_task`` the per-task mean over its seeds (what the search's selection pairs trials by) and
    ``val_per_seed`` each seed's mean (what the seed-aware selection of the rerun trials pairs by). Every trial,
    pruned or not, keeps ``margin_path``: per seed, its run's β and Δ(φ) by step (what the margin did).
    ``naming`` and ``parent_run_id``: the members' MLflow runs (:func:`~lopd.population.points.train_points`).
    """
    from lopd.population.points import train_points

    pruned = [False] * len(trials)

    def on_report(t: int, step: int, value: float) -> None:
        if not pruned[t]:
            trials[t].report(value, step)
            pruned[t] = trials[t].should_prune()

    scores = train_points(params, res, arm_name, points, seeds, steps=steps, val_every=val_every,
                          on_report=on_report, naming=naming, parent_run_id=parent_run_id,
                          label=f"trials {trials[0].number}-{trials[-1].number}")
    out = []
    for t, per_seed in enumerate(scores):
        # what the margin did in each seed's run (β and Δ(φ) by step), pruned or not: the report's constraint status
        path = {"margin_path": [{"seed": seed, **s.margin_path} for seed, s in zip(seeds, per_seed)]}
        if pruned[t]:
            out.append(Outcome(None, pruned=True, attrs=path))
            continue
        out.append(Outcome(sum(s.val_reward for s in per_seed) / len(per_seed),
                           attrs={"val_per_task": [sum(x) / len(x) for x in zip(*(s.val_per_task for s in per_seed))],
                                  "val_per_seed": [s.val_reward for s in per_seed], **path}))
    return out


def adopt_trials(study, parent, distributions: dict):
    """Start an extension's ``study`` from ``parent``'s finished trials (their values, intermediate values and
    user attributes; each point is in the extended ``distributions``), once (a copy a kill cut short is made
    again in a fresh study of the same name); returns the study and how many trials it adopted."""
    import optuna

    from optuna.trial import TrialState

    old = sorted(parent.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)),
                 key=lambda t: t.number)  # lopd.hpo.study.finished_trials
    held = study.get_trials(deepcopy=False)
    if held and len(held) < len(old):  # a start killed while it copied: copy again into a fresh study
        name, storage, sampler, pruner = study.study_name, study._storage, study.sampler, study.pruner
        optuna.delete_study(study_name=name, storage=storage)
        study = optuna.create_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner,
                                    direction="maximize")
        held = []
    if not held:
        study.add_trials([optuna.trial.create_trial(state=t.state, value=t.value, params=t.params,
                                                    distributions={k: distributions[k] for k in t.params},
                                                    user_attrs=t.user_attrs, intermediate_values=t.intermediate_values)
                          for t in old])
    return study, len(old)


def queue_points(study, points: list[dict], start: int = 0) -> None:
    """Queue each of ``points`` that no finished or queued trial numbered from ``start`` holds yet, in order (a
    resumed search queues what its killed attempt did not finish, as the uninterrupted one did)."""
    from optuna.trial import TrialState

    mine = [t for t in study.get_trials(deepcopy=False) if t.number >= start]
    have = [t.params for t in mine if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    have += [t.system_attrs.get("fixed_params") for t in mine if t.state == TrialState.WAITING]
    for p in points:
        if p not in have:
            study.enqueue_trial(p)
