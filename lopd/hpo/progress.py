"""The search's progress bar: trials finished of the target, the best value so far, pruned trials."""

from __future__ import annotations

from contextlib import contextmanager


def search_status(study) -> tuple[int, str]:
    """``(finished trials, "best 0.412 (trial 5) · pruned 2")`` of ``study``: finished = COMPLETE or
    PRUNED (what the search's budget counts); best = the highest value among COMPLETE trials."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    pruned = len(trials) - len(complete)
    if not complete:
        return len(trials), f"best – · pruned {pruned}"
    best = max(complete, key=lambda t: (t.value, -t.number))
    return len(trials), f"best {best.value:.3f} (trial {best.number}) · pruned {pruned}"


@contextmanager
def search_progress(target: int, label: str = "search"):
    """A progress bar of ``target`` trials; yields the callback ``(study, trial)`` that moves it (the
    search calls it after each batch of trials, with ``trial=None``)."""
    from lopd.utils import progress

    with progress() as prog:
        bar = prog.add_task(f"{label} (trials)", total=target, info="")

        def on_trial(study, trial) -> None:
            done, info = search_status(study)
            prog.update(bar, completed=min(done, target), info=info)

        yield on_trial
