"""Stage ``train@{arm}``: every training seed of one arm (``train.seeds_of(arm)``), the
validation-selected hyper-parameters, trained as one population (:mod:`lopd.population`; at most
``train.population_size`` seeds at once); seed ``s`` reads upstream draw ``s`` (``models/draws/*-s``)
and writes ``runs/{arm}/seed-{s}/``.

``--seed S`` trains that seed alone (:func:`lopd.training.run.run_arm`: the lean decoder, so its
numbers differ from the population's in the last bits), to the same directory. A run across
processes (``torchrun``, :mod:`lopd.training.distributed`) trains its seeds that way, one at a time."""

from __future__ import annotations

from lopd.config import Params
from lopd.paths import Paths
from lopd.stages.common import load_resources, with_draw, write_side
from lopd.utils import write_json


def run(params: Params, paths: Paths, arm: str, seed: int | None = None) -> dict:
    from lopd.arms import get_arm
    from lopd.training.distributed import World
    from lopd.training.run import not_run_reason

    spec = get_arm(arm)
    why = not_run_reason(params, paths.hpo / "best_params.yaml", spec)
    if why is not None:  # by design (lopd_binding without a binding trial): the record says why, the report too
        write_json(paths.not_run(arm), {"arm": arm, "reason": why})
        print(f"{arm}: not run: {why}")
        return {}
    paths.not_run(arm).unlink(missing_ok=True)  # a record from an earlier search that found no point
    world = World.from_env(params.model.device)  # None unless launched by torchrun with >1 process
    seeds = params.train.seeds_of(arm) if seed is None else [seed]
    if world is not None or seed is not None:
        return {s: _alone(params, paths, spec, s, world) for s in seeds}
    return _population(params, paths, spec, seeds)


def _alone(params: Params, paths: Paths, spec, seed: int, world) -> dict:
    from lopd.training.run import run_arm

    res = load_resources(params, paths, role="train", need_bank=spec.context != "none", draw=seed)
    result, meta = run_arm(params, res, spec.name, seed, paths.run_dir(spec.name, seed),
                           ckpt_dir=paths.checkpoints / f"{spec.name}-{seed}",
                           best_params_file=paths.hpo / "best_params.yaml", world=world)
    if world is None or world.is_main:
        write_side(paths, f"train@{spec.name}-{seed}", meta)
    print(f"{spec.name} seed {seed}: val reward {result['val_reward']:.3f} in {meta['seconds']} s")
    return result


def _population(params: Params, paths: Paths, spec, seeds: list[int]) -> dict:
    from lopd.population.jobs import Job, run_jobs
    from lopd.training.run import job_hparams

    arm, own = spec.name, spec.context != "none"
    # seed s reads upstream draw s (train.per_seed_draws decides whether the draws differ); one backbone
    res = load_resources(params, paths, role="train", need_bank=own, draw=seeds[0])
    hp = job_hparams(params, spec, paths.hpo / "best_params.yaml", None)
    jobs = [Job(s, hp, paths.run_dir(arm, s), res=with_draw(paths, res, s) if own and i else None,
                rid_key=paths.checkpoints / f"{arm}-seed-{s}") for i, s in enumerate(seeds)]
    done = run_jobs(params, res, arm, jobs, ckpt_dir=paths.checkpoints / arm, label=f"train {arm}")
    for s, (result, meta) in zip(seeds, done):
        write_side(paths, f"train@{arm}-{s}", meta)
        print(f"{arm} seed {s}: val reward {result['val_reward']:.3f}")
    return {s: r for s, (r, _) in zip(seeds, done)}
