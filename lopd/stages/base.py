"""Stage ``base``: train the tiny base policy (or fingerprint a real model) and evaluate it on val."""

from __future__ import annotations

import time

from lopd import data as data_mod
from lopd.config import Params
from lopd.paths import Paths
from lopd.stages.common import splits_read, write_side
from lopd.utils import atomic_write_text, write_json


def _train_tiny(params: Params, paths: Paths, envs, tracker) -> tuple:
    """Pretrain the tiny model on the pretraining worlds (never on a split)."""
    from lopd.training.base_policy import save_base, train_base_policy
    from lopd.utils import progress

    with progress() as prog:
        bar = prog.add_task("base policy", total=params.base.steps, info="")

        def on_step(step, loss):
            prog.update(bar, advance=1, info=f"loss {loss:.3f}")
            tracker.log_metrics({"train/loss": loss}, step)

        model, tok, info = train_base_policy(params, envs, on_step=on_step)
    save_base(model, tok, paths.base / "model")
    return model, tok, {"trained": True, "n_demos": info["n_demos"], "final_loss": info["final_loss"],
                        "n_params": info["n_params"]}


def _fingerprint_real(params: Params, paths: Paths) -> tuple:
    from pathlib import Path

    from lopd.model.backbone import dir_hash, load_causal_lm, resolve_device, resolve_dtype
    from lopd.model.tokenizer import load_tokenizer

    src = Path(params.model.name_or_path)
    device = resolve_device(params.model)
    model = load_causal_lm(src, device, resolve_dtype(params.model, device))
    paths.base.mkdir(parents=True, exist_ok=True)
    atomic_write_text(paths.base / "REAL_MODEL", str(src) + "\n")
    return model, load_tokenizer(src), {"model_dir": str(src), "model_hash": dir_hash(src), "trained": False}


def run(params: Params, paths: Paths) -> dict:
    from lopd.engine.evaluation import evaluate_policy, make_envs
    from lopd.model.chat import ChatFormat
    from lopd.tracking import Tracker
    from lopd.compat.kernels import seed_everything

    bp = params.base
    seed_everything(bp.seed, params.model.torch_threads)
    val = data_mod.SplitReader(paths.splits, role="base").load("val")  # pretraining uses no split
    envs = make_envs(params)
    tracker = Tracker(params, "base", {"stage": "base", "arm": "base", "seed": bp.seed, "split": "train",
                                                "params_hash": params.section_hash("model", "envs", "base"),
                                                "bank_mode": "none"})
    t0 = time.time()
    if params.model.name_or_path:
        model, tok, info = _fingerprint_real(params, paths)
    else:
        model, tok, info = _train_tiny(params, paths, envs, tracker)
    ev = params.evaluate
    res = evaluate_policy(model, ChatFormat(tok), envs, val, max_new_tokens=ev.max_new_tokens,
                          max_len=params.model.max_seq_len, batch_size=ev.batch_size, greedy=ev.greedy,
                          temperature=ev.temperature, seed=bp.seed)
    result = {"stage": "base", "seed": bp.seed, **info, "val_reward": res["mean"],
              "val_reward_by_domain": res["by_domain"], "splits_read": splits_read()}
    tracker.log_metrics({"val/reward": res["mean"], **{f"val/reward/{d}": v for d, v in res["by_domain"].items()}}, 0)
    tracker.end()
    write_json(paths.results / "base" / "val_rewards.json", res["per_task"])
    write_json(paths.results / "base" / "result.json", result)
    write_side(paths, "base", {"seconds": round(time.time() - t0, 1), "mlflow_run_id": tracker.run_id,
                               "tracking": tracker.status})
    print(f"base policy val reward {res['mean']:.3f} by domain {res['by_domain']}")
    return result
