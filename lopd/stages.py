"""Stage implementations: each reads params and inputs, calls the library, writes outputs.

``stages/*.py`` are one-line entry points into :func:`lopd.cli.main`; everything a stage does
lives here so it can be tested without DVC. Paths are relative to the repository root
(DVC runs every stage there).
"""

from __future__ import annotations

import time
from pathlib import Path

from lopd import data as data_mod
from lopd.config import Params
from lopd.utils import write_json

SPLITS_DIR = Path("data/splits")
BASE_DIR = Path("models/base")


def stage_prepare(params: Params) -> dict:
    splits = data_mod.generate_splits(params.envs)
    manifest = data_mod.write_splits(SPLITS_DIR, splits)
    counts = {s: manifest["files"][s]["n"] for s in data_mod.SPLITS}
    print(f"wrote splits {counts} to {SPLITS_DIR}")
    return manifest


def stage_base(params: Params) -> dict:
    """Train (tiny model) or fingerprint (real model) the base policy; evaluate it on val."""
    import torch

    from lopd.base_policy import demonstrations, save_base, train_on_messages
    from lopd.evaluate import evaluate_policy, make_envs
    from lopd.model.backbone import build_tiny_model, dir_hash, load_causal_lm, resolve_device, resolve_dtype
    from lopd.model.chat import ChatFormat
    from lopd.model.tokenizer import build_tokenizer, env_vocabulary, load_tokenizer
    from lopd.tracking import Tracker
    from lopd.utils import progress, seed_everything

    bp = params.base
    seed_everything(bp.seed, params.model.torch_threads)
    reader = data_mod.SplitReader(SPLITS_DIR, role="base")
    train, val = reader.load("train"), reader.load("val")
    envs = make_envs(params)
    out_dir = BASE_DIR
    tracker = Tracker(params.tracking, "base", {"stage": "base", "arm": "base", "seed": bp.seed, "split": "train",
                                                "params_hash": params.section_hash("model", "envs", "base"),
                                                "bank_mode": "none"})
    t0 = time.time()
    device = resolve_device(params.model)
    result: dict = {"stage": "base", "seed": bp.seed}
    if params.model.name_or_path:
        src = Path(params.model.name_or_path)
        model = load_causal_lm(src, device, resolve_dtype(params.model, device))
        tok = load_tokenizer(src)
        result.update(model_dir=str(src), model_hash=dir_hash(src), trained=False)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "REAL_MODEL").write_text(str(src) + "\n")
    else:
        tok = build_tokenizer(env_vocabulary(params.envs.domains, params.envs))
        model = build_tiny_model(params.model, tok, seed=bp.seed).to(device)
        fmt = ChatFormat(tok)
        demos = demonstrations(envs, train, bp.demos_per_task, bp.noise, bp.truncate_prob, bp.seed)
        with progress() as prog:
            task = prog.add_task("base policy", total=bp.steps, info="")

            def on_step(step, loss):
                prog.update(task, advance=1, info=f"loss {loss:.3f}")
                tracker.log_metrics({"train_loss": loss}, step)

            losses = train_on_messages(model, fmt, demos, steps=bp.steps, batch_size=bp.batch_size, lr=bp.lr,
                                       seed=bp.seed, on_step=on_step)
        save_base(model, tok, out_dir / "model")
        result.update(trained=True, n_demos=len(demos), final_loss=losses[-1],
                      n_params=sum(p.numel() for p in model.parameters()))
    fmt = ChatFormat(tok)
    ev = params.evaluate
    res = evaluate_policy(model, fmt, envs, val, max_new_tokens=ev.max_new_tokens, max_len=params.model.max_seq_len,
                          batch_size=ev.batch_size, greedy=ev.greedy, temperature=ev.temperature, seed=bp.seed)
    result.update(val_reward=res["mean"], val_reward_by_domain=res["by_domain"], seconds=round(time.time() - t0, 1),
                  splits_read=list(data_mod.ACCESS_LOG), mlflow_run_id=tracker.run_id, tracking=tracker.status)
    tracker.log_metrics({"val_reward": res["mean"], **{f"val_reward_{d}": v for d, v in res["by_domain"].items()}}, 0)
    tracker.end()
    write_json(Path("results/base/val_rewards.json"), res["per_task"])
    write_json(Path("results/base/result.json"), result)
    print(f"base policy val reward {res['mean']:.3f} by domain {res['by_domain']}")
    del torch
    return result
