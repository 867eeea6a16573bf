"""Stage ``probe``: the privilege probe — teacher δ with relevant / shuffled / no context on val."""

from __future__ import annotations

from lopd.config import Params
from lopd.paths import Paths
from lopd.pipeline.common import load_resources, splits_read, write_side
from lopd.utils import write_json


def _track(params: Params, paths: Paths, out: dict) -> None:
    from lopd.tracking import Tracker

    tracker = Tracker(params, "probe", {"stage": "probe", "arm": "base", "seed": 0, "split": "val",
                                        "bank_mode": "relevant", "params_hash": params.section_hash("train")})
    tracker.log_metrics({f"{mode}_{k}": v for mode, d in out.get("by_mode", {}).items() for k, v in d.items()
                         if isinstance(v, (int, float)) and not isinstance(v, bool)}, 0)
    tracker.end()
    write_side(paths, "probe", {"mlflow_run_id": tracker.run_id, "tracking": tracker.status})


def run(params: Params, paths: Paths) -> dict:
    import torch

    from lopd.training.checkpoint import load_tensors_verified
    from lopd.cold_start import privilege_probe
    from lopd.model.composer import Composer
    from lopd.rollout import rollout_batch

    res = load_resources(params, paths, role="probe")
    comp = Composer(res.bb, res.k_max)
    comp.load_state(load_tensors_verified(paths.cold_start / "phi0.safetensors"))
    gen = torch.Generator().manual_seed(0)
    res.bb.mode("student")
    ev = params.evaluate
    rolls = []
    for _ in range(2):
        rolls += rollout_batch(res.bb.model, res.bb.fmt, res.envs, res.val_tasks, max_new_tokens=ev.max_new_tokens,
                               max_len=params.model.max_seq_len, temperature=ev.temperature, generator=gen)
    out = privilege_probe(res.bb, comp, res.bank, rolls, res.task_emb, K=params.train.K, n_ret=params.train.n_ret,
                          seeds=[0, 1, 2])
    out["splits_read"] = splits_read()
    _track(params, paths, out)
    write_json(paths.results / "probe" / "result.json", out)
    print("privilege probe (mean δ on successful val trajectories):",
          {k: round(v["mean_delta"], 4) for k, v in out.get("by_mode", {}).items()})
    return out
