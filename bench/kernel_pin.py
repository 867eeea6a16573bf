"""The speed cost of the kernel pin (lopd.compat.kernels): base pretraining and LOPD training steps
with the pinned AVX2 kernels against the CPU's own (native: AVX-512 where the CPU has it).

    python bench/kernel_pin.py [--base-steps 400] [--train-steps 16] [--repeats 3]

Each measurement runs in a fresh process (ATen reads its capability once per process), the two
modes alternate so that a slow spell of a shared machine hits both alike, and the median is
printed. Base: the default model and batch (params.yaml), ``--base-steps`` optimiser steps of
pretraining (the stage runs base.steps = 5000). Train: ``--train-steps`` steps of the lopd arm on the
bench workspace (bench/_workspace.py), including its rollouts. A stage never runs unpinned: this
script calls the library directly, outside the ``lopd`` command.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _workspace import REPO

MODES = {"pinned": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}, "native": {}}


def _child(kind: str, steps: int) -> None:
    import time

    import torch

    sys.path.insert(0, str(REPO / "bench"))
    from _workspace import params, workspace

    if kind == "base":
        from lopd.training.base_policy import train_base_policy
        from lopd.config import load_params
        from lopd.engine.evaluation import make_envs
        from lopd.compat.kernels import seed_everything

        p = load_params(REPO / "params.yaml")
        p = p.model_copy(update={"base": p.base.model_copy(update={"steps": steps})})
        seed_everything(0, p.model.torch_threads)
        t0 = time.perf_counter()
        train_base_policy(p, make_envs(p))
    else:
        from lopd.paths import Paths
        from lopd.stages.common import load_resources
        from lopd.training.run import run_arm

        workspace()
        p = params()
        res = load_resources(p, Paths(Path.cwd()), role="train")
        out = Path(tempfile.mkdtemp())
        t0 = time.perf_counter()
        run_arm(p, res, "lopd", 0, out, ckpt_dir=None, hp_over={"steps": steps, "val_every": 10_000},
                final_val=False)
    print(json.dumps({"seconds": time.perf_counter() - t0, "cap": torch.backends.cpu.get_cpu_capability()}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-steps", type=int, default=400)
    ap.add_argument("--train-steps", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return _child(a.child[0], int(a.child[1]))
    env0 = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA")}
    for kind, steps in (("base", a.base_steps), ("train", a.train_steps)):
        times: dict[str, list[float]] = {m: [] for m in MODES}
        caps = {}
        for _ in range(a.repeats):
            for mode, pin in MODES.items():
                r = subprocess.run([sys.executable, __file__, "--child", kind, str(steps)], env={**env0, **pin},
                                   capture_output=True, text=True, check=True)
                d = json.loads(r.stdout.strip().splitlines()[-1])
                times[mode].append(d["seconds"])
                caps[mode] = d["cap"]
        med = {m: statistics.median(v) for m, v in times.items()}
        print(f"{kind} ({steps} steps, median of {a.repeats}): pinned ({caps['pinned']}) {med['pinned']:.2f} s, "
              f"native ({caps['native']}) {med['native']:.2f} s; pinned/native = {med['pinned'] / med['native']:.3f}")


if __name__ == "__main__":
    main()
