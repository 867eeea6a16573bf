"""Population training: per-step wall time and per-member throughput for S = 1, 2, 5, 10 members.

    python bench/population.py [--arm lopd] [--sizes 1 2 5 10] [--steps 6] [--workdir DIR]
    python bench/population.py --fit 10 [--arm lopd] [--workdir DIR]
    python bench/population.py --tokens [--workdir DIR]
    python bench/population.py --search B [--workdir DIR]

Each size trains a population of S seeds of ``--arm`` (at ``train``'s own m, K, n_ret and learning rate,
not the search's selected point) on the default model and batch
(``train.tasks_per_step`` rollouts per member and step) for ``--steps`` steps after one warm-up
step, and reports the median step wall time, the rollouts per second per member, and the process's
CPU use over those steps (CPU seconds / wall seconds / cores). The plain serial trainer (one run,
today's path: the lean decoder for rollouts, peft's own forward) is timed the same way, as the
reference a member's speed-up is counted against. Validation is timed apart: one validation round
(of the serial run; of all S members, batched). Per size also the median split of a step: the
batched rollout (with its scoring), the forward passes with the members' losses, the backward with
the optimiser steps, and the token positions the passes run per second of forward+backward: flat in
S means the passes are bound by arithmetic, not by per-call overhead, and batching cannot make them
cheaper per member.
``--fit S``: whole runs instead, at the default horizon with validation and checkpoints: S seeds one
after the other with the serial trainer (as S train stages run them, less the stages' start-up),
then the same S seeds as one population.
``--search B``: one search batch: B points drawn at random from the search space (``hpo``'s choices,
a fixed stream), each × ``hpo.seeds_per_trial`` seeds at the search's horizon, trained one run after
another (the serial trainer, then a validation on all val tasks, as a trial's run ends) and as one
population (:func:`lopd.population.points.train_points`). Members of other K and n_ret pad their
contexts to the widest, so this is the case the step bench (one point) does not cover.
``--tokens``: the token positions each pass of a LOPD step runs (student, teacher with its latent
prefix, the composer over the padded retrieved experiences) at the selected point
(``hpo/best_params.yaml`` when present), means over 8 steps of seed 0; and the composer's positions
if each retrieved experience ran once per step, or unpadded (neither is built).
Goal: at S = 10 the step takes ≤ 3 × the S = 1 step, i.e. each member runs ≥ 3.3× faster.
``--workdir``: a pipeline directory with ``models/base``, ``models/bank``, ``models/cold_start`` (the
default is this repo's, else a tiny workspace under ``bench/out/ws``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from _workspace import params, selected_point, workspace


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _time_steps(step, steps: int, parts=None) -> dict:
    step()  # warm-up: first-call allocations, lazy imports
    times, split, cpu0, wall0 = [], [], _cpu(), time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
        if parts is not None:
            split.append(dict(parts()))
    wall = time.perf_counter() - wall0
    out = {"step_s": statistics.median(times), "cpu_use": (_cpu() - cpu0) / wall / (os.cpu_count() or 1)}
    for k in split[0] if split else ():
        out[k] = statistics.median(s[k] for s in split)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arm", default="lopd")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 5, 10])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--fit", type=int, default=0, metavar="S")
    ap.add_argument("--tokens", action="store_true")
    ap.add_argument("--search", type=int, default=0, metavar="B")
    args = ap.parse_args()
    workspace(args.workdir)

    import torch

    from lopd.arms import ARMS
    from lopd.paths import Paths
    from lopd.population.trainer import Member, Population
    from lopd.stages.common import load_resources
    from lopd.training.trainer import HParams, Trainer

    p = params()
    torch.set_num_threads(p.model.torch_threads)
    hp = HParams.from_params(p, steps=10_000, val_every=10_000, checkpoint_every=10_000)
    arm = ARMS[args.arm]

    if args.fit:
        return _fit(p, arm, args.fit)
    if args.tokens:
        return _tokens(p)
    if args.search:
        return _search(p, args.search)
    print(f"arm {args.arm}: {hp.tasks_per_step} rollouts per member and step, {args.steps} timed steps after one "
          f"warm-up, {torch.get_num_threads()} torch threads, {os.cpu_count()} cores")
    res = load_resources(p, Paths(Path.cwd()), role="train")
    tr = Trainer(res, arm, hp, seed=0)
    tr.prepare()
    serial = _time_steps(tr.train_step, args.steps)
    val_s = _seconds(tr.validate)
    print(f"serial trainer: {serial['step_s']:.3f} s per step, "
          f"{hp.tasks_per_step / serial['step_s']:.1f} rollouts/s, CPU use {serial['cpu_use']:.0%}; "
          f"one validation round {val_s:.2f} s")
    print(f"{'S':>3} {'step s':>8} {'vs S=1':>7} {'member rollouts/s':>18} {'member speed-up':>16} {'CPU use':>8} "
          f"{'rollout s':>10} {'fwd s':>7} {'bwd s':>7} {'pass tokens/s':>14} {'val round s':>12}")
    first = None
    for S in args.sizes:
        res = load_resources(p, Paths(Path.cwd()), role="train")  # a fresh backbone per size
        pop = Population(res, arm, [Member(hp, seed) for seed in range(S)])
        for m in pop.trainers:
            m.prepare()
        r = _time_steps(pop.train_step, args.steps, parts=lambda: pop.last_timing)
        first = first or r["step_s"]
        val = _seconds(pop.validate)
        print(f"{S:>3} {r['step_s']:>8.3f} {r['step_s'] / first:>7.2f} {hp.tasks_per_step / r['step_s']:>18.1f} "
              f"{serial['step_s'] * S / r['step_s']:>15.2f}x {r['cpu_use']:>8.0%} {r['rollouts']:>10.3f} "
              f"{r['forward']:>7.3f} {r['backward']:>7.3f} {r['tokens'] / (r['forward'] + r['backward']):>14.0f} {val:>12.2f}")


def _fit(p, arm, S: int) -> None:
    import tempfile

    from lopd.paths import Paths
    from lopd.population.trainer import Member, Population
    from lopd.stages.common import load_resources
    from lopd.training.trainer import HParams, Trainer

    hp = HParams.from_params(p)
    print(f"whole runs: {hp.steps} steps, validation every {hp.val_every}, checkpoint every {hp.checkpoint_every}")
    with tempfile.TemporaryDirectory() as tmp:
        res = load_resources(p, Paths(Path.cwd()), role="train")
        t0 = time.perf_counter()
        for seed in range(S):
            Trainer(res, arm, hp, seed, ckpt_dir=Path(tmp) / f"serial-{seed}").fit()
        serial = time.perf_counter() - t0
        print(f"serial: {S} runs in {serial:.1f} s ({serial / S:.1f} s per run)")
        res = load_resources(p, Paths(Path.cwd()), role="train")
        t0 = time.perf_counter()
        Population(res, arm, [Member(hp, seed) for seed in range(S)], ckpt_dir=Path(tmp) / "population").fit()
        pop = time.perf_counter() - t0
        print(f"population: {S} members in {pop:.1f} s ({pop / S:.1f} s per member); {serial / pop:.2f}x faster")


def _search(p, B: int) -> None:
    import random

    from lopd.arms import ARMS
    from lopd.paths import Paths
    from lopd.population.points import train_points
    from lopd.hpo.study import horizon, space
    from lopd.stages.common import load_resources
    from lopd.training.trainer import HParams, Trainer

    rng, sp = random.Random(0), space(p)
    points = [{k: rng.choice(v) for k, v in sp.items()} for _ in range(B)]
    seeds = [1000 + s for s in range(p.hpo.seeds_per_trial)]
    steps, val_every = horizon(p), p.hpo.val_every
    print(f"search batch: {B} points x {len(seeds)} seeds, {steps} steps, validation every {val_every}")
    for pt in points:
        print("  " + ", ".join(f"{k} {v}" for k, v in pt.items()))
    res = load_resources(p, Paths(Path.cwd()), role="hpo")
    t0 = time.perf_counter()
    serial = []
    for pt in points:
        for seed in seeds:
            tr = Trainer(res, ARMS["lopd"], HParams.from_params(p, **pt, steps=steps, val_every=val_every), seed)
            tr.fit()
            serial.append(tr.validate(res.val_tasks))
    t_serial = time.perf_counter() - t0
    res = load_resources(p, Paths(Path.cwd()), role="hpo")
    t0 = time.perf_counter()
    scores = train_points(p, res, "lopd", points, seeds, steps=steps, val_every=val_every)
    t_pop = time.perf_counter() - t0
    pop = [s.val_reward for per_point in scores for s in per_point]
    n = len(serial)
    print(f"serial: {n} runs in {t_serial:.1f} s ({t_serial / n:.1f} s per run)")
    print(f"population: {n} members in {t_pop:.1f} s ({t_pop / n:.1f} s per member); {t_serial / t_pop:.2f}x faster")
    print("final val reward, serial vs population: " + ", ".join(f"{a:.3f}/{b:.3f}" for a, b in zip(serial, pop)))


def _tokens(p, steps: int = 8) -> None:
    from lopd.arms import ARMS
    from lopd.model.chat import pad_sequences
    from lopd.paths import Paths
    from lopd.stages.common import load_resources
    from lopd.training.trainer import HParams, Trainer

    hp = HParams.from_params(p, steps=10_000, val_every=10_000, **selected_point())
    res = load_resources(p, Paths(Path.cwd()), role="train")
    tr = Trainer(res, ARMS["lopd"], hp, seed=0)
    tr.prepare()
    tot = {"student": 0, "teacher": 0, "composer": 0}
    # what the composer's pass would run with each retrieved experience once per step (unique), and
    # without padding (packed): neither is built, these size the saving
    alt = {"unique padded": 0, "packed": 0, "unique packed": 0}
    for _ in range(steps):
        b = tr._rollout_batch()
        tot["student"] += b["ids"].numel()
        tot["teacher"] += b["ids"].numel() + b["ids"].shape[0] * hp.n_ret * hp.K
        exps = [x for t in b["tasks"] for x in tr.context.experiences_for(t)]
        tot["composer"] += pad_sequences(exps, res.bb.fmt.pad_id, res.bb.device)[0].numel()
        unique = list(dict.fromkeys(tuple(x) for x in exps))
        alt["unique padded"] += len(unique) * max(map(len, unique))
        alt["packed"] += sum(map(len, exps))
        alt["unique packed"] += sum(map(len, unique))
    share = tot["composer"] / sum(tot.values())
    print(f"K {hp.K}, n_ret {hp.n_ret}: token positions per step " +
          ", ".join(f"{k} {v / steps:.0f}" for k, v in tot.items()) + f"; the composer's share {share:.1%}")
    print("the composer's positions per step if " +
          ", ".join(f"{k}: {v / steps:.0f} ({1 - v / tot['composer']:.0%} fewer)" for k, v in alt.items()))


if __name__ == "__main__":
    main()
