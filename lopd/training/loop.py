"""The training loop, one for a run alone and for a population of runs.

:func:`fit` owns *when* things happen: the step-0 validation, a validation every ``val_every``
steps and at the last step, a checkpoint every ``checkpoint_every`` steps and at the last step, each run's
student adapter kept at ``hp.snapshot_steps`` (``Trainer.snapshots``; written beside its outputs),
progress after every step, and the stop condition (``hp.steps`` steps, or none for an arm that
does not train). *How* a step, a validation or a checkpoint is done is the stepper's:

* :class:`Alone` steps one :class:`~lopd.training.trainer.Trainer` (``Trainer.fit``);
* :class:`lopd.population.trainer.Population` steps its members' trainers with every pass batched.

Both hand back one row per run and one validation reward per run, so every run's history, MLflow
metrics and validation callbacks come out of the same lines below whichever stepper ran it.
"""

from __future__ import annotations

from typing import Callable, Protocol


def is_validation_step(step: int, hp) -> bool:
    """Whether the loop validates after ``step`` (every ``val_every`` steps, and at the last)."""
    return step % hp.val_every == 0 or step == hp.steps


def is_snapshot_step(step: int, hp) -> bool:
    """Whether the loop keeps each run's student adapter after ``step`` (``hp.snapshot_steps``)."""
    return step in getattr(hp, "snapshot_steps", ())


def is_checkpoint_step(step: int, hp) -> bool:
    """Whether the loop checkpoints after ``step`` (every ``checkpoint_every`` steps, and at the last)."""
    return step % hp.checkpoint_every == 0 or step == hp.steps


class Stepper(Protocol):
    """What :func:`fit` drives: ``trainers`` (the runs, each a Trainer that records its own history),
    their shared ``arm`` and loop settings ``hp``, and the step they are at."""

    trainers: list
    arm: object
    hp: object

    @property
    def step(self) -> int: ...

    def restore(self) -> int:
        """Resume from the checkpoint if there is one; the step it resumed at (0: none)."""

    def validate(self) -> list[float]:
        """Every run's validation reward (the val tasks of ``hp.val_tasks``)."""

    def train_step(self) -> list[dict]:
        """One step of every run; each run's history row."""

    def save(self) -> None:
        """A checkpoint of every run."""


class Alone:
    """The stepper of one run: its trainer's own step, validation and checkpoint."""

    def __init__(self, trainer):
        self.trainers, self.arm, self.hp = [trainer], trainer.arm, trainer.hp

    @property
    def step(self) -> int:
        return self.trainers[0].step

    def restore(self) -> int:
        state = self.trainers[0].restore()
        return state["step"] if state else 0

    def validate(self) -> list[float]:
        return [self.trainers[0].validate()]

    def train_step(self) -> list[dict]:
        return [self.trainers[0].train_step()]

    def save(self) -> None:
        self.trainers[0].save()


def fit(stepper: Stepper, progress: Callable[[int, list[dict]], None] | None = None) -> dict:
    """Train every run of ``stepper`` for ``hp.steps`` steps, resuming from its checkpoint if one
    exists; ``progress(step, rows)`` after each step. Returns ``{"resumed_from_step": …}``."""
    hp, trs = stepper.hp, stepper.trainers
    for tr in trs:
        tr.prepare()
    trains = stepper.arm.trains
    resumed = stepper.restore() if trains else 0
    if trains and stepper.step == 0:
        for tr, v in zip(trs, stepper.validate()):
            tr.last_val = v
            tr.record({"step": 0, "rollouts_used": tr.rollouts_used, "beta": tr.beta, "val_reward": v})
    while trains and stepper.step < hp.steps:
        rows = stepper.train_step()
        step = stepper.step
        if is_validation_step(step, hp):
            for tr, row, v in zip(trs, rows, stepper.validate()):
                row["val_reward"] = tr.last_val = v
                if tr.on_val is not None:
                    tr.on_val(step, v)
        for tr, row in zip(trs, rows):
            tr.record(row)
        if progress is not None:
            progress(step, rows)
        if is_snapshot_step(step, hp):  # before the checkpoint: a resumed run keeps it
            for tr in trs:
                tr.snapshots[step] = (tr.rollouts_used, {k: v.detach().clone()
                                                         for k, v in tr.bb.adapter_state("student").items()})
        if is_checkpoint_step(step, hp):
            stepper.save()
    for tr in trs:
        if tr.tracker is not None:
            tr.tracker.flush()
    return {"resumed_from_step": resumed}
