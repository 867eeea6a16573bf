"""A few LOPD training steps in the current directory's workspace: step time, tokens/s, peak memory.

    python bench/gpu_step.py --steps 5 [--arm lopd] [--label tiny]

Run from a workspace whose ``params.yaml`` has been through prepare → base → bank →
cold-start (``bench/gpu_smoke.sh`` builds one). The first step is a warm-up (CUDA kernels,
allocator, optimiser state) and is reported separately. Tokens/s counts every token of the
step's rollout batch (forced + generated; the batch the student, teacher and composer
passes run over); generated tokens/s counts only the student's own tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--arm", default="lopd")
    ap.add_argument("--label", default="")
    a = ap.parse_args()

    import torch

    import lopd.training.trainer as trainer_mod
    from lopd.paths import Paths
    from lopd.stages.common import load_resources
    from lopd.arms import get_arm
    from lopd.config import load_params
    from lopd.training.trainer import HParams, Trainer

    params = load_params("params.yaml")
    t0 = time.perf_counter()
    res = load_resources(params, Paths.for_params("params.yaml"), role="train", need_bank=get_arm(a.arm).context != "none")
    load_s = time.perf_counter() - t0
    bb = res.bb
    cuda = bb.device.type == "cuda"
    tokens: list[int] = []
    _collate = trainer_mod.collate

    def counting_collate(rollouts, pad_id, device="cpu"):
        out = _collate(rollouts, pad_id, device)
        tokens.append(int(out[1].sum()))  # attention mask: every real token of the batch
        return out

    trainer_mod.collate = counting_collate
    hp = HParams.from_params(params, steps=a.steps + 1, val_every=10**9, checkpoint_every=10**9)
    tr = Trainer(res, get_arm(a.arm), hp, seed=0)
    tr.prepare(res.train_tasks)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    rows = []
    for i in range(a.steps + 1):
        if i == 1 and cuda:
            torch.cuda.reset_peak_memory_stats()
        sync()
        t = time.perf_counter()
        m = tr.train_step()
        sync()
        rows.append({"seconds": time.perf_counter() - t, "tokens": tokens[-1], "generated": m.get("n_supervised", 0.0),
                     "loss": m.get("loss"), "reward": m.get("reward"), "beta": m.get("beta")})
    warm, timed = rows[0], rows[1:] or rows
    secs = sum(r["seconds"] for r in timed)
    out = {
        "label": a.label, "arm": a.arm, "device": str(bb.device), "dtype": str(next(bb.model.parameters()).dtype),
        "model": params.model.name_or_path or f"tiny {params.model.arch} d={params.model.hidden_size}",
        "rollouts_per_step": hp.tasks_per_step, "K": hp.K, "n_ret": hp.n_ret, "load_s": round(load_s, 2),
        "warmup_step_s": round(warm["seconds"], 3), "steps_timed": len(timed),
        "step_s": round(secs / len(timed), 3),
        "tokens_per_s": round(sum(r["tokens"] for r in timed) / secs, 1),
        "generated_tokens_per_s": round(sum(r["generated"] for r in timed) / secs, 1),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3) if cuda else None,
        "losses": [round(r["loss"], 4) for r in rows if r["loss"] is not None],
    }
    print(f"[{a.label or a.arm}] {out['model']} on {out['device']} ({out['dtype']}), {hp.tasks_per_step} rollouts/step:")
    print(f"  step time      {out['step_s']:.3f} s (mean of {len(timed)}; warm-up step {out['warmup_step_s']:.3f} s)")
    print(f"  tokens/s       {out['tokens_per_s']:.0f} (batch tokens), {out['generated_tokens_per_s']:.0f} generated")
    print(f"  peak GPU mem   " + (f"{out['peak_mem_gib']:.3f} GiB (torch.cuda.max_memory_allocated)" if cuda
                                  else "n/a (not on CUDA)"))
    print("RESULT " + json.dumps(out))
    bad = [x for x in out["losses"] if x != x or abs(x) == float("inf")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
