"""Stage ``train@{arm}-{seed}``: one arm, one seed, the validation-selected hyper-parameters."""

from __future__ import annotations

from lopd.config import Params
from lopd.paths import Paths
from lopd.stages.common import load_resources, write_side


def run(params: Params, paths: Paths, arm: str, seed: int) -> dict:
    from lopd.arms import get_arm
    from lopd.training.distributed import World
    from lopd.training.run import run_arm

    spec = get_arm(arm)
    world = World.from_env(params.model.device)  # None unless launched by torchrun with >1 process
    # training seed s reads upstream draw s (models/draws/*-s); train.per_seed_draws decides whether those differ
    res = load_resources(params, paths, role="train", need_bank=spec.context != "none", draw=seed)
    result, meta = run_arm(params, res, arm, seed, paths.run_dir(arm, seed), ckpt_dir=paths.checkpoints / f"{arm}-{seed}",
                           best_params_file=paths.hpo / "best_params.yaml", world=world)
    if world is None or world.is_main:
        write_side(paths, f"train@{arm}-{seed}", meta)
    print(f"{arm} seed {seed}: val reward {result['val_reward']:.3f} in {meta['seconds']} s")
    return result
