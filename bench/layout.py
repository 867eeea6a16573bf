"""Which process layout does more training work per second on this machine: one population process with two
torch threads, or two single-threaded processes side by side, each with half the members?

    python bench/layout.py [--size 10] [--steps 5] [--repeats 2] [--arm lopd] [--workdir DIR]

Each layout trains ``--size`` members of ``--arm`` (seeds 0..size-1, ``train``'s own point, the default model
and batch) for one warm-up step, then, once every process of the layout has warmed up (a start file they
all wait on), ``--steps`` timed steps:

- ``1 x 2 threads``: one process, all members, 2 torch threads (today's stage layout);
- ``2 x 1 thread``: two processes at once, members split in halves (seeds 0..S/2-1 and S/2..S-1), 1 thread each;
- ``1 x 1 thread``: one process, all members, 1 thread (the reference for what a second thread buys).

Work per second is rollouts (``train.tasks_per_step`` per member and step) over the wall time from the first
timed step's start to the last one's end, across the layout's processes. The layouts alternate, ``--repeats``
rounds; the medians are printed, and the ratio of the two-process layout to today's. Kernels are pinned as in a
stage (:func:`lopd.compat.kernels.pin_kernels`). Uses the pipeline's models (``--workdir``, the repo's, else the
tiny workspace of ``bench/_workspace.py``). Run it alone: it is the cores that are measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

LAYOUTS = {"1 x 2 threads": [(2, 0, 1)], "2 x 1 thread": [(1, 0, 2), (1, 1, 2)], "1 x 1 thread": [(1, 0, 1)]}


def worker(a) -> None:
    from lopd.compat.kernels import pin_kernels, pin_threads

    pin_kernels()
    from _workspace import params, workspace

    workspace(a.workdir)
    pin_threads(a.threads)
    from lopd.arms import ARMS
    from lopd.paths import Paths
    from lopd.population.trainer import Member, Population
    from lopd.stages.common import load_resources
    from lopd.training.trainer import HParams

    p = params()
    # every stage sets torch's threads from model.torch_threads (load_resources -> seed_everything): the layout's
    # count goes there, or a "1-thread" worker would run 2 (and two of them spin against each other)
    p = p.model_copy(update={"model": p.model.model_copy(update={"torch_threads": a.threads})})
    hp = HParams.from_params(p, steps=10_000, val_every=10_000, checkpoint_every=10_000)
    per = a.size // a.parts
    seeds = range(a.part * per, (a.part + 1) * per if a.part < a.parts - 1 else a.size)
    pop = Population(load_resources(p, Paths(Path.cwd()), role="train"), ARMS[a.arm], [Member(hp, s) for s in seeds])
    for m in pop.trainers:
        m.prepare()
    pop.train_step()  # warm-up
    Path(a.sync, f"ready-{a.part}").touch()
    while not Path(a.sync, "go").exists():
        time.sleep(0.005)
    t0 = time.perf_counter()
    for _ in range(a.steps):
        pop.train_step()
    t1 = time.perf_counter()
    import torch

    print(json.dumps({"t0": t0, "t1": t1, "rollouts": a.steps * len(seeds) * hp.tasks_per_step,
                      "threads": torch.get_num_threads()}))


def run_layout(a, procs: list[tuple[int, int, int]]) -> float:
    with tempfile.TemporaryDirectory() as sync:
        children = [subprocess.Popen([sys.executable, __file__, "--worker", "--threads", str(th), "--part", str(part),
                                      "--parts", str(parts), "--sync", sync, "--size", str(a.size), "--steps",
                                      str(a.steps), "--arm", a.arm, *(["--workdir", a.workdir] if a.workdir else [])],
                                     stdout=subprocess.PIPE, text=True) for th, part, parts in procs]
        while not all(Path(sync, f"ready-{part}").exists() for _, part, _ in procs):
            if any(c.poll() not in (None, 0) for c in children):
                raise SystemExit("a worker failed")
            time.sleep(0.05)
        Path(sync, "go").touch()
        outs = [json.loads(c.communicate()[0].strip().splitlines()[-1]) for c in children]
    wall = max(o["t1"] for o in outs) - min(o["t0"] for o in outs)
    return sum(o["rollouts"] for o in outs) / wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=10)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--arm", default="lopd")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=2, help=argparse.SUPPRESS)
    ap.add_argument("--part", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--parts", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--sync", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a)
        return 0
    from _workspace import workspace

    workspace(a.workdir)  # built once here, not by two workers at once
    got: dict[str, list[float]] = {k: [] for k in LAYOUTS}
    for r in range(a.repeats):
        for name, procs in LAYOUTS.items():
            got[name].append(run_layout(a, procs))
            print(f"round {r + 1}: {name:<14} {got[name][-1]:7.1f} rollouts/s", flush=True)
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"{a.arm}, {a.size} members, {a.steps} timed steps, {os.cpu_count()} cores; median of {a.repeats}:")
    for k, v in med.items():
        print(f"  {k:<14} {v:7.1f} rollouts/s  ({', '.join(f'{x:.1f}' for x in got[k])})")
    print(f"two 1-thread processes / one 2-thread process: {med['2 x 1 thread'] / med['1 x 2 threads']:.2f}x; "
          f"a second thread in one process: {med['1 x 2 threads'] / med['1 x 1 thread']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
