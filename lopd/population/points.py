"""A grid of runs as one population: every point (hyper-parameters) × every seed, on validation.

What the search's trials (:func:`lopd.hpo.batches.train_trials`) and the sensitivity grid need:
train each (point, seed) at the given horizon, validating every ``val_every`` steps, then validate
every member on all val tasks, as a run alone ends (:func:`lopd.training.run.run_arm`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from lopd.config import Params
    from lopd.training.trainer import Resources


MARGIN_PATH = ("step", "beta", "delta_phi")  # what a run's margin did, per step (its history.csv columns)


@dataclass
class Score:
    """A (point, seed) run's final validation: its mean reward and the per-task rewards; and its margin
    path: ``MARGIN_PATH``'s columns of its history, step by step (nan where a step logged none)."""

    val_reward: float
    val_per_task: list[float]
    margin_path: dict[str, list[float]] = field(default_factory=dict)


def read_margin_path(history_csv) -> dict[str, list[float]]:
    """``MARGIN_PATH``'s columns of a run's ``history.csv`` (a column it lacks: absent)."""
    import csv
    import math

    with open(history_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    num = lambda v: float(v) if v not in (None, "") else math.nan  # noqa: E731
    return {k: [num(r.get(k)) for r in rows] for k in MARGIN_PATH if rows and k in rows[0]}


def train_points(params: Params, res: Resources, arm_name: str, points: list[dict], seeds: list[int], *, steps: int, val_every: int,
                 on_report: Callable[[int, int, float], None] | None = None,
                 naming: Callable[[int, int], tuple[dict, str]] | None = None, parent_run_id: str | None = None,
                 label: str = "population") -> list[list[Score]]:
    """``scores[p][s]``: point ``p`` trained with ``seeds[s]`` (members point-major, all in one population).

    ``on_report(p, step, value)``: at each intermediate validation, once all of point ``p``'s seeds have
    validated at ``step``, the mean of their rewards. ``naming(p, seed)``: the MLflow tags and run
    name of that member's run (a child of ``parent_run_id``); its ``history.csv`` and ``result.json``
    are logged there, its outputs otherwise go to a scratch directory that is removed.
    """
    import shutil
    import tempfile
    from pathlib import Path

    from lopd.population.jobs import Job, run_jobs
    from lopd.training.trainer import HParams

    pending: dict[tuple[int, int], list[float]] = {}

    def on_val(p: int):
        def report(step: int, value: float) -> None:
            vals = pending.setdefault((p, step), [])
            vals.append(value)
            if len(vals) == len(seeds) and on_report is not None:
                on_report(p, step, sum(vals) / len(vals))
        return report

    scratch = Path(tempfile.mkdtemp(prefix=f"{arm_name}-points-"))
    try:
        jobs = []
        for p, point in enumerate(points):
            for seed in seeds:
                tags, name = naming(p, seed) if naming is not None else ({}, None)
                jobs.append(Job(seed, HParams.from_params(params, **{**point, "steps": steps, "val_every": val_every}),
                                scratch / f"{p}-{seed}", tags=tags, run_name=name, on_val=on_val(p)))
        done = run_jobs(params, res, arm_name, jobs, parent_run_id=parent_run_id, label=label)
        paths = [read_margin_path(j.out_dir / "history.csv") for j in jobs]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return [[Score(done[p * len(seeds) + s][0]["val_reward"], done[p * len(seeds) + s][0]["val_per_task"],
                   paths[p * len(seeds) + s]) for s in range(len(seeds))] for p in range(len(points))]
