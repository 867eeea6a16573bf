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
Goal (issue 35): LOPD / SFT process peak ≤ 1.5.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _workspace import child_results  # noqa: E402 - bench/ is the script directory


def child(arm: str, steps: int) -> None:
    import torch

    from lopd.arms import ARMS
    from lopd.config import load_params
    from lopd.paths import Paths
    from lopd.stages.common import load_resources
    from lopd.training.trainer import HParams, Trainer

    p = load_params(Path.cwd() / "params.yaml")
    torch.set_num_threads(p.model.torch_threads)
    res = load_resources(p, Paths(Path.cwd()), role="train")
    hp = HParams.from_params(p, steps=10_000, val_every=10_000)
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
    for _ in range(steps):
        row = tr.train_step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    n_params = sum(x.numel() for x in res.bb.model.parameters())
    print(json.dumps({"arm": arm, "peak_bytes": peak * 1024, "growth_bytes": (peak - before) * 1024,
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
    out = child_results([sys.executable, __file__, "--workspace", a.workspace, "--steps", str(a.steps)], ("sft", "lopd"))
    for arm, d in out.items():
        print(f"peak memory {arm:<4}: process peak {d['peak_bytes'] / 2**30:6.2f} GiB, growth during {a.steps} "
              f"step(s) {d['growth_bytes'] / 2**20:8.1f} MiB ({d['n_supervised']:.0f} supervised tokens, "
              f"{d['n_params'] / 1e6:.1f}M parameters)")
    print(f"LOPD / SFT process peak memory = {out['lopd']['peak_bytes'] / out['sft']['peak_bytes']:.2f} "
          f"(goal <= 1.5; one shared backbone)")


if __name__ == "__main__":
    main()
