"""MLflow overhead of a default-sized training run, as a share of its training wall time.

    python bench/mlflow_overhead.py [--step-ms MS] [--steps N] [--runs R]

A training step is simulated by ``time.sleep`` of the step time; around it, the tracker is used
exactly as the trainer uses it: one row of the 11 history metrics per step (``val/reward`` every
``train.val_every`` steps), a flush at every checkpoint (``train.checkpoint_every``) and at the
end, parameters once, and the run created and ended. ``N`` defaults to ``train.steps`` of
params.yaml. The step time is, unless ``--step-ms`` gives it, measured here as bench/step.py
measures it: the median of 3 real LOPD steps of the default config (``Trainer.train_step``, no
tracker) on the bench workspace.

Printed per mode (``tracking.async_logging`` true / false), median over R runs against a fresh
SQLite store (the store and the experiment parent exist beforehand, as for every stage after the
first):

* per step: the extra wall time of the training loop over the sleeps alone, and the process CPU
  time the logging costs (all threads: MLflow's background writer included), each per step and as
  a share of the step time;
* per run: Tracker creation + params + end (wall), as a share of the run's N steps;
* per stage process: importing MLflow, and the first Tracker (store open, look-ups, run creation),
  fresh and forked from a worker that called :func:`lopd.tracking.preload`.

The target is per-step overhead <= 3 % of training wall time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lopd.tracking.names import HISTORY_METRICS  # noqa: E402

METRICS = tuple(HISTORY_METRICS.values())  # the trainer's per-step MLflow names (HISTORY_COLUMNS less step, seconds)


def measure_step_ms() -> float:
    sys.path.insert(0, str(REPO / "bench"))
    from _workspace import params, workspace

    workspace()
    from lopd.arms import ARMS
    from lopd.paths import Paths
    from lopd.stages.common import load_resources
    from lopd.training.trainer import HParams, Trainer

    p = params()
    res = load_resources(p, Paths(Path.cwd()), role="train")
    tr = Trainer(res, ARMS["lopd"], HParams.from_params(p, steps=10_000, val_every=10_000), seed=0)
    tr.prepare(res.train_tasks)
    tr.train_step()  # warm-up
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        tr.train_step()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


STAGE_PROCESS = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
t0 = time.perf_counter()
import mlflow  # noqa: F401
from lopd.config import load_params
from lopd.tracking import Tracker, preload
t1 = time.perf_counter()
base = load_params(sys.argv[2])
tracking = base.tracking.model_copy(update={"uri": sys.argv[3], "experiment": "bench"})
params = base.model_copy(update={"tracking": tracking})
if sys.argv[4] == "fresh":
    tr = Tracker(params, "stage", {"stage": "bench"})
    assert tr.ok, tr.error
    print(f"{t1 - t0:.3f} {time.perf_counter() - t1:.3f}")
    sys.exit(0)
preload(params)  # the warm worker, once
r, w = os.pipe()
if os.fork() == 0:  # one stage
    t2 = time.perf_counter()
    tr = Tracker(params, "stage", {"stage": "bench"})
    tr.end()
    os.write(w, f"{tr.ok} {time.perf_counter() - t2:.3f}".encode())
    os._exit(0)
os.wait()
ok, dt = os.read(r, 100).decode().split()
assert ok == "True"
print(dt)
"""


def stage_process_costs(uri: str) -> tuple[float, float, float]:
    """Seconds a stage process spends on MLflow before its first metric: importing it (and
    lopd.config/tracking), then its first Tracker (open the store, find the experiment and its
    parent, create the run); and that first Tracker in a process forked from a preloaded worker."""
    import subprocess

    def run(mode: str) -> list[str]:
        return subprocess.run([sys.executable, "-c", STAGE_PROCESS, str(REPO), str(REPO / "params.yaml"), uri, mode],
                              capture_output=True, text=True, check=True).stdout.split()

    imp, first = map(float, run("fresh"))
    return imp, first, float(run("forked")[0])


def one_run(params, step_s: float, steps: int, track: bool) -> dict:
    from lopd.tracking import Tracker

    tp, train = params.tracking, params.train
    w0 = time.perf_counter()
    tr = Tracker(params, "bench", {"stage": "bench"}) if track else None
    if tr is not None:
        assert tr.ok, tr.error
        tr.log_params({f"h{i}": 0.5 for i in range(30)})
    w_setup = time.perf_counter() - w0
    loop_w, loop_cpu, sleep_s = time.perf_counter(), time.process_time(), 0.0
    for step in range(1, steps + 1):
        t = time.perf_counter()
        time.sleep(step_s)
        sleep_s += time.perf_counter() - t
        row = {k: 0.5 * step for k in METRICS}
        if step % train.val_every:
            row["val/reward"] = None
        if tr is not None:
            tr.log_metrics(row, step)
            if step % train.checkpoint_every == 0 or step == steps:
                tr.flush()
    w_end = time.perf_counter()
    if tr is not None:
        tr.end()
        assert tr.ok, tr.error
    end_s = time.perf_counter() - w_end
    loop_wall = w_end - loop_w
    cpu_s = time.process_time() - loop_cpu
    return {"loop_extra_ms": 1000 * (loop_wall - sleep_s) / steps, "cpu_ms": 1000 * cpu_s / steps,
            "fixed_ms": 1000 * (w_setup + end_s), "async": tp.async_logging}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--step-ms", type=float, default=None, help="simulated step time (default: measure it)")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default: train.steps)")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    from lopd.config import load_params

    base = load_params(REPO / "params.yaml")
    step_ms = a.step_ms
    if step_ms is None:
        step_ms = measure_step_ms()
        print(f"measured LOPD step (default config, bench workspace, median of 3): {step_ms:.1f} ms")
    steps = a.steps or base.train.steps
    tmp = Path(tempfile.mkdtemp(prefix="mlflow-overhead-"))
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    print(f"{steps} steps of {step_ms:.1f} ms (simulated by sleep), {len(METRICS)} metrics/step, flush every "
          f"{base.train.checkpoint_every} steps; store {uri}; median of {a.runs} runs")
    from lopd.tracking import experiment_parent_id

    results = {}
    for async_logging in (True, False):
        params = base.model_copy(update={"tracking": base.tracking.model_copy(
            update={"uri": uri, "experiment": "bench", "on_failure": "fail", "async_logging": async_logging})})
        experiment_parent_id(params)  # store opened, parent created: what every later stage finds
        runs = [one_run(params, step_ms / 1000, steps, track=True) for _ in range(a.runs)]
        results[async_logging] = {k: statistics.median(r[k] for r in runs)
                                  for k in ("loop_extra_ms", "cpu_ms", "fixed_ms")}
    idle = [one_run(base, step_ms / 1000, steps, track=False) for _ in range(a.runs)]
    idle_extra = statistics.median(r["loop_extra_ms"] for r in idle)
    idle_cpu = statistics.median(r["cpu_ms"] for r in idle)
    run_ms = steps * step_ms
    share = {}
    for async_logging, r in results.items():
        wall, cpu = r["loop_extra_ms"] - idle_extra, r["cpu_ms"] - idle_cpu
        share[async_logging] = max(wall, cpu) / step_ms
        print(f"async_logging={str(async_logging).lower():<5} per step: "
              f"wall +{wall:6.2f} ms ({100 * wall / step_ms:5.2f} %), "
              f"CPU {cpu:6.2f} ms ({100 * cpu / step_ms:5.2f} %); per run: create+params+end {r['fixed_ms']:6.1f} ms "
              f"({100 * r['fixed_ms'] / run_ms:5.2f} % of {steps} steps)")
    imp, first, forked = stage_process_costs(uri)
    print(f"per stage process: fresh: import MLflow {imp:.2f} s + first Tracker {first:.2f} s (store code and "
          f"store open, experiment + parent look-up, run creation); forked from a worker that ran "
          f"lopd.tracking.preload: first Tracker {forked:.2f} s")
    default = base.tracking.async_logging
    print(f"MLflow overhead per training step (params.yaml: async_logging={str(default).lower()}; the larger of wall "
          f"and CPU): {100 * share[default]:.2f} % of step time (target <= 3 %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
