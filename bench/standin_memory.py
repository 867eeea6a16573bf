"""Peak memory of one LOPD step against one SFT step on the Qwen3-0.6B-shaped stand-in (one backbone
in memory: the student, the composer and the teacher share it), at the toy counts of the stand-in
path check, on a CPU.

    bench/standin_path.sh                  # once: the workspace with the bank and the cold-started composer
    python bench/standin_memory.py [--workspace bench/out/standin] [--steps 1]

Each arm runs in a fresh subprocess: resources loaded as the train stage loads them, one warm-up step
(allocator pools, optimiser state), then ``--steps`` measured steps. Peak memory is the process's peak
RSS (``ru_maxrss``); its growth during the measured steps is reported too. SFT trains on its own
successes, and random weights have none, so the SFT child counts every rollout as a success: its loss
then covers the same generated tokens LOPD's does (the heaviest SFT step a batch can give).
The LOPD step runs twice: with the workspace's ``train.recompute_context_passes`` (on in the stand-in
profile: the composer's and the teacher's layers are recomputed in backward) and, as ``lopd-keep``,
with it off (every activation kept), so the table shows what the recomputation buys.
Goal: LOPD / SFT process peak ≤ 1.5.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _workspace import child_results  # noqa: E402 - bench/ is the script directory


def child(child_arm: str, steps: int) -> None:
    import torch

    from lopd.arms import ARMS
    from lopd.config import load_params
    from lopd.paths import Paths
    from lopd.stages.common import load_resources
    from lopd.training.trainer import HParams, Trainer

    p = load_params(Path.cwd() / "params.yaml")
    torch.set_num_threads(p.model.torch_threads)
    res = load_resources(p, Paths(Path.cwd()), role="train")
    arm = child_arm.removesuffix("-keep")
    over = {"recompute_context_passes": False} if child_arm.endswith("-keep") else {}
    hp = HParams.from_params(p, steps=10_000, val_every=10_000, **over)
    tr = Trainer(res, ARMS[arm], hp, seed=0)
    tr.prepare(res.train_tasks)
    if arm == "sft":
        rollout = tr._rollout_batch

        def every_rollout_a_success() -> dict:
            batch = rollout()
            batch["rewards"] = torch.ones_like(batch["rewards"])
            return batch

        tr._rollout_batch = every_rollout_a_success
    row = tr.train_step()  # warm-up
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    for _ in range(steps):
        row = tr.train_step()
    step_s = (time.perf_counter() - t0) / steps
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    n_params = sum(x.numel() for x in res.bb.model.parameters())
    print(json.dumps({"arm": child_arm, "recompute": hp.recompute_context_passes, "peak_bytes": peak * 1024,
                      "step_s": step_s, "growth_bytes": (peak - before) * 1024,
                      "n_supervised": row.get("n_supervised"), "n_params": n_params}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workspace", default=str(REPO / "bench/out/standin"))
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--child", default=None)
    a = ap.parse_args()
    os.chdir(a.workspace)
    if a.child:
        child(a.child, a.steps)
        return
    if not (Path("models/cold_start").exists() and Path("params.yaml").exists()):
        raise SystemExit(f"{a.workspace} has no cold-started composer: run bench/standin_path.sh first")
    # one after the other: one stand-in in memory at a time
    out = child_results([sys.executable, __file__, "--workspace", a.workspace, "--steps", str(a.steps)],
                        ("sft", "lopd", "lopd-keep"))
    for arm, d in out.items():
        print(f"peak memory {arm:<9} (recompute {str(d['recompute']).lower():<5}): process peak "
              f"{d['peak_bytes'] / 2**30:6.2f} GiB, growth during {a.steps} "
              f"step(s) {d['growth_bytes'] / 2**20:8.1f} MiB ({d['n_supervised']:.0f} supervised tokens, "
              f"{d['n_params'] / 1e6:.1f}M parameters; {d['step_s']:.1f} s per step)")
    print(f"LOPD / SFT process peak memory = {out['lopd']['peak_bytes'] / out['sft']['peak_bytes']:.2f} "
          f"(goal <= 1.5; one shared backbone); every activation kept: "
          f"{out['lopd-keep']['peak_bytes'] / out['sft']['peak_bytes']:.2f}")


if __name__ == "__main__":
    main()
