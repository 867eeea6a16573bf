"""Stage ``cold_start``: composer SFT on the bank → φ0 (the frozen anchor of every LOPD run)."""

from __future__ import annotations

import time

from lopd.config import Params
from lopd.paths import Paths
from lopd.stages.common import experience_task, load_backbone, task_embeddings, write_side
from lopd.utils import write_json


def run(params: Params, paths: Paths) -> dict:
    from lopd.bank import ExperienceBank
    from lopd.training.checkpoint import save_tensors
    from lopd.training.cold_start import cold_start
    from lopd.tracking import Tracker
    from lopd.utils import progress

    cp = params.cold_start
    bb = load_backbone(params, paths)
    bank = ExperienceBank.load(paths.bank)
    emb = task_embeddings(params, bb, [experience_task(e) for e in bank.entries])
    tracker = Tracker(params, "cold start", {"stage": "cold_start", "arm": "lopd", "seed": cp.seed,
                                                      "split": "train", "bank_mode": "relevant",
                                                      "params_hash": params.section_hash("model", "bank", "cold_start")})
    k_choices = sorted(set(params.hpo.k_choices) | {params.train.K})
    t0 = time.time()
    with progress() as prog:
        bar = prog.add_task("composer cold start", total=cp.steps, info="")

        def on_step(step, row):
            prog.update(bar, advance=1, info=f"teacher NLL {row['nll']:.3f}")
            tracker.log_metrics({f"cold_start/{k}": v for k, v in row.items()}, step)

        comp, rows = cold_start(bb, bank, emb, cp, k_choices=k_choices, on_step=on_step)
    save_tensors(paths.cold_start / "phi0.safetensors", comp.state())
    last = rows[-10:]
    result = {"stage": "cold_start", "steps": cp.steps, "k_choices": k_choices,
              **{f"{k}_first": rows[0][k] for k in rows[0]}, **{f"{k}_last": rows[-1][k] for k in rows[-1]},
              **{f"{k}_last10_mean": sum(r[k] for r in last) / len(last) for k in rows[-1]}}
    tracker.end()
    write_json(paths.cold_start / "result.json", result)
    write_side(paths, "cold_start", {"seconds": round(time.time() - t0, 1), "mlflow_run_id": tracker.run_id,
                                     "tracking": tracker.status})
    print(f"cold start: teacher NLL {rows[0]['nll']:.3f} -> {rows[-1]['nll']:.3f}"
          + (f", KL(text || latent) {rows[0]['distill_kl']:.3f} -> {rows[-1]['distill_kl']:.3f}"
             if "distill_kl" in rows[0] else ""))
    return result
