"""Stage ``cold_start``: composer SFT on the bank → φ0 (the frozen anchor of every LOPD run)."""

from __future__ import annotations

import time

from lopd.config import Params
from lopd.paths import Paths
from lopd.pipeline.common import experience_task, load_backbone, task_embeddings, write_side
from lopd.utils import write_json


def run(params: Params, paths: Paths) -> dict:
    from lopd.bank import ExperienceBank
    from lopd.training.checkpoint import save_tensors
    from lopd.cold_start import cold_start
    from lopd.tracking import Tracker
    from lopd.utils import progress

    cp = params.cold_start
    bb = load_backbone(params, paths)
    bank = ExperienceBank.load(paths.bank)
    emb = task_embeddings(params, bb, [experience_task(e) for e in bank.entries])
    tracker = Tracker(params, "cold_start", {"stage": "cold_start", "arm": "lopd", "seed": cp.seed,
                                                      "split": "train", "bank_mode": "relevant",
                                                      "params_hash": params.section_hash("model", "bank", "cold_start")})
    k_choices = sorted(set(params.hpo.k_choices) | {params.train.K})
    t0 = time.time()
    with progress() as prog:
        bar = prog.add_task("composer cold start", total=cp.steps, info="")

        def on_step(step, loss):
            prog.update(bar, advance=1, info=f"teacher NLL {loss:.3f}")
            tracker.log_metrics({"cold_start_nll": loss}, step)

        comp, losses = cold_start(bb, bank, emb, steps=cp.steps, batch_size=cp.batch_size, lr=cp.lr, k_choices=k_choices,
                                  n_ret_max=cp.n_ret_max, k_max=cp.k_max, seed=cp.seed, on_step=on_step)
    save_tensors(paths.cold_start / "phi0.safetensors", comp.state())
    result = {"stage": "cold_start", "steps": cp.steps, "nll_first": losses[0], "nll_last": losses[-1],
              "nll_last10_mean": sum(losses[-10:]) / len(losses[-10:]), "k_choices": k_choices}
    tracker.end()
    write_json(paths.cold_start / "result.json", result)
    write_side(paths, "cold_start", {"seconds": round(time.time() - t0, 1), "mlflow_run_id": tracker.run_id,
                                     "tracking": tracker.status})
    print(f"cold start: teacher NLL {losses[0]:.3f} -> {losses[-1]:.3f}")
    return result
