"""Stage ``cold_start``: composer SFT on the bank → φ0 (the frozen anchor of every LOPD run).

``cold_start`` (no draw) cold-starts the shared φ0 on ``models/bank``; ``cold_start_draw@s`` cold-starts upstream
draw s on ``models/draws/bank-s`` into ``models/draws/cold_start-s`` (seed :func:`upstream_seed`)."""

from __future__ import annotations

import time

from lopd.config import Params
from lopd.paths import Paths
from lopd.stages.common import experience_task, load_backbone, task_embeddings, upstream_seed, write_side
from lopd.utils import write_json


def run(params: Params, paths: Paths, draw: int | None = None, dirs=None, stage: str | None = None) -> dict:
    """``dirs``: (bank, φ0) directories instead of :meth:`Paths.upstream` ``(draw)``, and ``stage`` the name of
    its side file (a confirmation seed's draw, :mod:`lopd.stages.confirm_draw`)."""
    from lopd.bank import ExperienceBank
    from lopd.training.checkpoint import save_tensors
    from lopd.training.cold_start import cold_start
    from lopd.tracking import Tracker
    from lopd.utils import progress

    cp = params.cold_start
    seed = cp.seed if draw is None else upstream_seed(params, "cold_start", draw)
    bank_dir, out = dirs or paths.upstream(draw)
    stage = stage or ("cold_start" if draw is None else f"cold_start_draw@{draw}")
    bb = load_backbone(params, paths)
    bank = ExperienceBank.load(bank_dir)
    emb = task_embeddings(params, bb, [experience_task(e) for e in bank.entries])
    tracker = Tracker(params, "cold start" if draw is None else f"cold start · draw {draw}",
                      {"stage": "cold_start", "arm": "lopd", "seed": seed,
                                                      "split": "train", "bank_mode": "relevant",
                                                      "params_hash": params.section_hash("model", "bank", "cold_start")})
    k_choices = sorted(set(params.hpo.k_choices) | {params.train.K})
    t0 = time.time()
    with progress() as prog:
        bar = prog.add_task("composer cold start", total=cp.steps, info="")

        def on_step(step, row):
            prog.update(bar, advance=1, info=f"teacher NLL {row['nll']:.3f}")
            tracker.log_metrics({f"cold_start/{k}": v for k, v in row.items()}, step)

        comp, rows = cold_start(bb, bank, emb, cp, k_choices=k_choices, on_step=on_step, seed=seed)
    save_tensors(out / "phi0.safetensors", comp.state())
    last = rows[-10:]
    result = {"stage": "cold_start", "steps": cp.steps, "k_choices": k_choices,
              **({} if draw is None else {"draw": draw, "seed": seed}),
              **{f"{k}_first": rows[0][k] for k in rows[0]}, **{f"{k}_last": rows[-1][k] for k in rows[-1]},
              **{f"{k}_last10_mean": sum(r[k] for r in last) / len(last) for k in rows[-1]}}
    tracker.end()
    write_json(out / "result.json", result)
    write_side(paths, stage, {"seconds": round(time.time() - t0, 1), "mlflow_run_id": tracker.run_id,
                                     "tracking": tracker.status})
    print(f"cold start: teacher NLL {rows[0]['nll']:.3f} -> {rows[-1]['nll']:.3f}"
          + (f", KL(text || latent) {rows[0]['distill_kl']:.3f} -> {rows[-1]['distill_kl']:.3f}"
             if "distill_kl" in rows[0] else ""))
    return result
