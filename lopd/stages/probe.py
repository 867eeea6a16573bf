"""Stage ``probe``: the privilege probe — teacher δ with relevant / shuffled / no context on val."""

from __future__ import annotations

from lopd.config import Params
from lopd.paths import Paths
from lopd.stages.common import load_resources, splits_read, write_side
from lopd.utils import write_json


def _track(params: Params, paths: Paths, out: dict) -> None:
    from lopd.tracking import Tracker

    tracker = Tracker(params, "probe", {"stage": "probe", "arm": "base", "seed": 0, "split": "val",
                                        "bank_mode": "relevant", "params_hash": params.section_hash("train")})
    tracker.log_metrics({f"probe/{kind}_{cond}": v["mean"] for kind in ("reward", "delta")
                         for cond, v in out[kind]["by_condition"].items()}, 0)
    tracker.end()
    write_side(paths, "probe", {"mlflow_run_id": tracker.run_id, "tracking": tracker.status})


def run(params: Params, paths: Paths) -> dict:
    """The premise gate (lopd.analysis.probe) on val at the selected K and n_ret, with φ0."""
    from lopd.arms import get_arm
    from lopd.training.cold_start import privilege_probe
    from lopd.model.composer import Composer
    from lopd.training.checkpoint import load_tensors_verified
    from lopd.training.run import selected_hparams
    from lopd.utils import progress

    best = paths.hpo / "best_params.yaml"
    selected = selected_hparams(params, best, get_arm("lopd"))
    K, n_ret = selected.get("K", params.train.K), selected.get("n_ret", params.train.n_ret)
    res = load_resources(params, paths, role="probe")
    comp = Composer(res.bb, res.k_max)
    comp.load_state(load_tensors_verified(paths.cold_start / "phi0.safetensors"))
    bs, pp = params.evaluate.batch_size, params.probe
    with progress() as prog:
        bar = prog.add_task("premise gate", total=pp.samples_per_task * -(-len(res.val_tasks) // bs), info="")
        out = privilege_probe(res.bb, comp, res.bank, res.val_tasks, res.envs, res.task_emb, K=K, n_ret=n_ret, pp=pp,
                              ev=params.evaluate, max_len=params.model.max_seq_len,
                              progress=lambda: prog.update(bar, advance=1))
    out["K_n_ret_from"] = "hpo/best_params.yaml" if selected else "train.K, train.n_ret"
    out["splits_read"] = splits_read()
    _track(params, paths, out)
    write_json(paths.results / "probe" / "result.json", out)
    r, d = out["reward"]["by_condition"], out["delta"]["by_condition"]
    print(f"premise gate (K={K}, n_ret={n_ret}): premise_holds={out['premise_holds']}; val reward "
          + ", ".join(f"{c} {v['mean']:.3f}" for c, v in r.items()) + "; mean delta "
          + ", ".join(f"{c} {v['mean']:+.4f}" for c, v in d.items()))
    return out
