"""Jobs trained as one population, each finished exactly as a run alone finishes.

:func:`run_jobs` is :func:`lopd.training.run.run_arm` for the jobs of one arm: each job gets its own
MLflow run (named, tagged and parented as alone, :func:`lopd.training.run.open_job`), the members
train together (:class:`lopd.population.trainer.Population`; at most ``train.population_size`` at
once, the rest in the next population), every member is validated on all val
tasks, and each job's outputs (adapter, composer, ``history.csv``, ``result.json``,
``splits_read.json``) are written to its own directory and logged to its run
(:func:`lopd.training.run.close_job`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from lopd.config import Params
    from lopd.training.trainer import Resources


@dataclass
class Job:
    """One member's run: seed, hyper-parameters, where its outputs go and how MLflow names it."""

    seed: int
    hp: object  # lopd.training.trainer.HParams
    out_dir: Path
    tags: dict | None = None
    run_name: str | None = None
    on_val: Callable[[int, float], None] | None = None
    res: object | None = None  # its own upstream draw (Member.res); None = the population's
    # where its MLflow run id is kept while it trains (a killed attempt's run is then marked KILLED
    # and linked on the rerun): ``<rid_key>.mlflow_run_id`` beside it; None = not kept
    rid_key: Path | None = None


def run_jobs(params: Params, res: Resources, arm_name: str, jobs: list[Job], *, parent_run_id: str | None = None,
             ckpt_dir: Path | None = None, label: str = "population") -> list[tuple[dict, dict]]:
    """Train ``jobs`` (all of ``arm_name``) as populations of at most ``train.population_size``
    members (null: one population), one after another; each job's ``(result, meta)`` as
    :func:`~lopd.training.run.run_arm` returns it, in the order of ``jobs``. ``ckpt_dir``: the
    population's checkpoint, ``<ckpt_dir>-part-<i>`` for the i-th of several (a rerun resumes from it)."""
    from lopd.training.run import run_id_file

    size = params.train.population_size or len(jobs)
    parts = [jobs[i:i + size] for i in range(0, len(jobs), size)]
    done = []
    for i, part in enumerate(parts):
        part_ckpt = ckpt_dir if ckpt_dir is None or len(parts) == 1 else ckpt_dir.with_name(f"{ckpt_dir.name}-part-{i}")
        part_label = label if len(parts) == 1 else f"{label} ({i + 1}/{len(parts)})"
        done += _run_population(params, res, arm_name, part, parent_run_id, part_ckpt, part_label)
    # every output is written: the run-id files are done with. Kept until now, so a kill while outputs
    # are written, or in a later population, reruns every job linked to its earlier run
    for j in jobs:
        if j.rid_key is not None:
            run_id_file(j.rid_key).unlink(missing_ok=True)
    return done


def _run_population(params: Params, res: Resources, arm_name: str, jobs: list[Job], parent_run_id: str | None, ckpt_dir: Path | None,
                    label: str) -> list[tuple[dict, dict]]:
    """``jobs`` as one population. A failure marks every job's MLflow run FAILED. ``ckpt_dir`` is
    removed once every job's outputs are written, so a kill while they are written resumes at the
    last step and writes them again, the same bytes."""
    from lopd.arms import get_arm
    from lopd.population.trainer import Member, Population
    from lopd.training.run import close_job, open_job
    from lopd.utils import progress

    arm = get_arm(arm_name)
    opened = [open_job(params, arm, j.seed, j.hp, j.rid_key, j.tags, parent_run_id, True, j.run_name) for j in jobs]
    try:
        with progress() as prog:
            steps = jobs[0].hp.steps if arm.trains else 1
            bar = prog.add_task(f"{label}: {len(jobs)} {arm_name} runs", total=steps, info="")

            def on_step(step: int, rows: list[dict]) -> None:
                rewards = [r.get("reward") or 0.0 for r in rows]
                prog.update(bar, completed=step, info=f"mean reward {sum(rewards) / len(rewards):.2f}")

            pop = Population(res, arm, [Member(j.hp, j.seed, o.tracker, j.on_val, j.res) for j, o in zip(jobs, opened)],
                             ckpt_dir=ckpt_dir, progress=on_step)
            info = pop.fit()
            finals = pop.validate(res.val_tasks)
            prog.update(bar, completed=steps)
    except BaseException:
        for o in opened:
            o.tracker.end("FAILED")
        raise
    done = [close_job(o, tr.res, arm, tr, info, j.out_dir, final=f, final_val=True)
            for j, o, tr, f in zip(jobs, opened, pop.trainers, finals)]
    if ckpt_dir is not None:  # every member's outputs are written: the checkpoint is done with
        import shutil

        shutil.rmtree(ckpt_dir, ignore_errors=True)
    return done
