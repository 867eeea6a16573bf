"""A/B of the rollout engine: this checkout's ``lopd`` against another checkout's, on the same
policy and tasks, alternating processes so that a busy spell of a shared machine hits both.

    python bench/rollout_ab.py --tree <other checkout> [--rounds 3] [--runs 40] [--batch 64]

Each round runs one process per tree; a process times ``--runs`` rollouts of ``--batch`` tool
tasks of the train split with the default base policy (student adapter active, sampled at
``evaluate.temperature``, row seeds from ``torch.Generator().manual_seed(run % 5)``) after one
warm-up, and prints the min and median ms per batch and the tokens generated. Both trees read
this checkout's workspace (``bench/_workspace.py``) and its ``params.yaml``. Equal generated
token counts mean both engines sampled the same rollouts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def child(tree: str, runs: int, batch: int) -> None:
    sys.path.insert(0, str(REPO / "bench"))
    from _workspace import rollout_workload, workspace

    workspace()
    sys.path.insert(0, tree)  # the tree's lopd, imported after the workspace exists
    for name in [m for m in sys.modules if m == "lopd" or m.startswith("lopd.")]:
        del sys.modules[name]
    import torch

    import lopd
    from lopd.engine.rollout import rollout_batch

    assert Path(lopd.__file__).resolve().is_relative_to(Path(tree).resolve()), lopd.__file__
    _, bb, tasks, envs, kw = rollout_workload(batch)

    def run(i):
        return rollout_batch(bb.model, bb.fmt, envs, tasks, **kw, generator=torch.Generator().manual_seed(i % 5))

    run(0)
    ts, gen = [], 0
    for i in range(runs):
        t0 = time.perf_counter()
        rolls = run(i)
        ts.append(time.perf_counter() - t0)
        gen += sum(r.n_generated for r in rolls)
    print(f"RESULT {min(ts) * 1e3:.1f} {statistics.median(ts) * 1e3:.1f} {gen}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", required=True, help="the other checkout (its lopd/ is imported)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.runs, args.batch)
    trees = {"other": str(Path(args.tree).resolve()), "this": str(REPO)}
    got = {k: [] for k in trees}
    for rnd in range(args.rounds):
        for name, tree in trees.items():
            out = subprocess.run([sys.executable, __file__, "--tree", tree, "--child", tree, "--runs", str(args.runs),
                                  "--batch", str(args.batch)], capture_output=True, text=True,
                                 env={**os.environ, "PYTHONWARNINGS": "ignore"})
            line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")]
            if out.returncode or not line:
                raise SystemExit(f"{name} ({tree}) failed:\n{out.stderr[-3000:]}")
            lo, med, gen = line[0].split()[1:]
            got[name].append((float(lo), float(med), int(gen)))
            print(f"round {rnd}  {name:<5}  min {float(lo):6.1f} ms  median {float(med):6.1f} ms per batch  "
                  f"({gen} tokens generated over {args.runs} runs)", flush=True)
    for name in trees:
        print(f"{name:<5} ({trees[name]}): median of round medians {statistics.median(m for _, m, _ in got[name]):.1f} ms, "
              f"best min {min(lo for lo, _, _ in got[name]):.1f} ms")
    ratio = statistics.median(m for _, m, _ in got["other"]) / statistics.median(m for _, m, _ in got["this"])
    print(f"this checkout is {ratio:.2f}x the other's speed (median of round medians)")


if __name__ == "__main__":
    main()
