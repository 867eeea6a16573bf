"""Wall time of one evaluation of a trained run, in process (no stage start-up, no DVC): load
the run's student, then run the ``evaluate`` stage's evaluation (``_evaluate``: the same tasks per
domain, samples per task and sampling) ``--repeats`` times on the VAL split, the sandbox's score
cache cleared before each, so that every code program is run again.

    cd <pipeline run dir> && python <repo>/bench/evaluate_once.py [--arm lopd] [--seed 0] [--repeats 3]
        [--tree PATH]

Run it inside a finished pipeline's directory (``bash bench/pipeline.sh`` prints it). ``--tree``
imports the ``lopd`` package of another checkout instead of this one (``git archive <rev> lopd |
tar -x -C PATH``), to compare two versions on the same run. The test split stays sealed: only the
``evaluate`` stage reads it; val has as many tasks per domain, so the cost is the stage's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arm", default="lopd")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tree", default=str(REPO), help="a checkout's root holding lopd/ (default: this one)")
    a = ap.parse_args()
    sys.path.insert(0, a.tree)

    import lopd
    import lopd.envs.sandboxed as sandboxed
    from lopd import data as data_mod
    from lopd.config import load_params
    from lopd.engine.evaluation import make_envs
    from lopd.model.backbone import load_student_policy
    from lopd.paths import Paths
    from lopd.stages.evaluate import _evaluate
    from lopd.training.checkpoint import load_tensors_verified
    from lopd.kernels import seed_everything

    print(f"lopd from {Path(lopd.__file__).parent}; run dir {os.getcwd()}")
    params = load_params("params.yaml")
    paths = Paths.for_params("params.yaml")
    seed_everything(0, params.model.torch_threads)
    weights = load_tensors_verified(paths.run_dir(a.arm, a.seed) / "student.safetensors")
    model, fmt = load_student_policy(params, paths.base, weights)
    val = data_mod.SplitReader(paths.splits, role="train").load("val")
    envs = make_envs(params)
    for _ in range(a.repeats):
        sandboxed._SCORE_CACHE.clear()
        t = time.perf_counter()
        res = _evaluate(params, model, fmt, envs, val, a.seed)
        print(f"evaluate {a.arm}-{a.seed} on val: {time.perf_counter() - t:.2f} s, mean reward {res['mean']:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
