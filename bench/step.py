"""One LOPD step at the default batch: time of each part and of the whole step, the rollout
time of the former engine against the current one, and peak memory of a LOPD step against an
SFT step on the same batch.

    python bench/step.py [--repeats 5]

Parts (each timed on its own, same batch): rollout; student forward+backward; teacher
forward (given c_φ); composer forward+backward; tracking (one step's metrics, batched).
The rollout is also timed with the former one-position-per-forward engine
(``bench/reference_rollout.py``), interleaved with the current one so both see the same
machine state. Every part includes scoring (the sandbox's memo is cleared first).
Goals: whole ≤ 1.3 × sum of parts; LOPD peak memory ≤ 1.5 × SFT's; rollout time
≥ 3× lower than the former engine's.
Peak memory is the growth of the process's peak RSS during the step (CPU), or
``torch.cuda.max_memory_allocated`` on CUDA, measured in a fresh subprocess per arm.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from _workspace import child_results, params, workspace


def _timeit_interleaved(fns: dict, repeats: int) -> dict:
    """Median wall time of each function, the functions run in turn ``repeats`` times (so
    that a slow spell of a shared machine hits them all alike)."""
    times: dict = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def timing(repeats: int) -> None:
    import torch

    from lopd.training import objectives as obj
    from lopd.paths import Paths
    from lopd.stages.common import load_resources
    from lopd.arms import ARMS
    from lopd.engine.rollout import collate, rollout_batch
    from lopd.tracking import Tracker
    from lopd.training.trainer import HParams, Trainer
    from reference_rollout import rollout_batch as former_rollout_batch

    p = params()
    res = load_resources(p, Paths(Path.cwd()), role="train")
    hp = HParams.from_params(p, steps=10_000, val_every=10_000)
    tracker = Tracker(p, "bench-step", {"stage": "bench"})
    tr = Trainer(res, ARMS["lopd"], hp, seed=0, tracker=tracker)
    tr.prepare(res.train_tasks)
    bb = res.bb
    tasks = tr.sample_tasks()
    gen = torch.Generator().manual_seed(0)

    from lopd.envs import sandboxed

    def rollout(engine=rollout_batch):
        sandboxed._SCORE_CACHE.clear()  # time real sandbox scoring, as a step on fresh tasks pays it
        bb.mode("student")
        bb.model.eval()  # as Trainer.train_step rolls out
        return engine(bb.model, bb.fmt, res.envs, tasks, max_new_tokens=hp.max_new_tokens, max_len=hp.max_len,
                      temperature=hp.temperature, generator=gen)

    def former_rollout():
        return rollout(former_rollout_batch)

    rolls = rollout()
    ids, attn, mask = collate(rolls, bb.fmt.pad_id, bb.device)

    def student():
        loss = obj.sft_loss(obj.token_logprobs(bb.logits(ids, attn, "student")[:, :-1], ids[:, 1:]), mask)
        loss.backward()

    exps = [tr.experiences_for(t) for t in tasks]
    with torch.no_grad():
        c = tr.composer(exps, hp.K)
    cmask = torch.ones(c.shape[:2], dtype=torch.long)

    def teacher():
        with torch.no_grad():
            bb.teacher_logits(c, cmask, ids, attn)

    def composer():
        tr.composer(exps, hp.K).pow(2).mean().backward()

    metrics = {k: 0.5 for k in ("reward", "kd_loss", "delta_phi", "beta", "margin_sat_frac", "anchor", "tail_mass",
                                "rollouts_used")}

    def tracking():
        tracker.log_metrics(metrics, 0)
        tracker.flush()

    def whole():
        sandboxed._SCORE_CACHE.clear()
        row = tr.train_step()
        tracker.log_metrics({k: v for k, v in row.items() if v is not None}, row["step"])
        tracker.flush()

    parts = {"rollout": rollout, "student fwd+bwd": student, "teacher fwd": teacher, "composer fwd+bwd": composer,
             "tracking": tracking}
    whole()  # warm-up
    former_rollout()
    t = _timeit_interleaved({**parts, "whole step": whole, "former rollout": former_rollout}, repeats)
    t_whole, t_former = t.pop("whole step"), t.pop("former rollout")
    tracker.end()
    print(f"one LOPD step, {len(tasks)} rollouts, K={hp.K}, n_ret={hp.n_ret} (median of {repeats}, interleaved):")
    for k, v in t.items():
        print(f"  {k:<18} {v * 1000:8.1f} ms")
    s = sum(t.values())
    print(f"  {'sum of parts':<18} {s * 1000:8.1f} ms")
    print(f"  {'whole step':<18} {t_whole * 1000:8.1f} ms   ratio whole/sum = {t_whole / s:.2f} (goal <= 1.3)")
    print(f"rollout per step: former engine {t_former * 1000:.1f} ms, this engine {t['rollout'] * 1000:.1f} ms: "
          f"{t_former / t['rollout']:.2f}x lower (goal >= 3x)")


def peak_memory_child(arm: str) -> None:
    import resource

    import torch

    from lopd.paths import Paths
    from lopd.stages.common import load_resources
    from lopd.arms import ARMS
    from lopd.training.trainer import HParams, Trainer

    p = params()
    res = load_resources(p, Paths(Path.cwd()), role="train")
    hp = HParams.from_params(p, steps=10_000, val_every=10_000)
    # SFT on the same batch: force every rollout to count as a success so SFT trains on all of it
    tr = Trainer(res, ARMS[arm], hp, seed=0)
    tr.prepare(res.train_tasks)
    cuda = torch.cuda.is_available()
    tr.train_step()  # warm-up: allocator pools, optimiser state
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(3):
        tr.train_step()
    peak = (torch.cuda.max_memory_allocated() - before) if cuda else \
        (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    total = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"arm": arm, "peak_growth_bytes": peak, "peak_total_bytes": total}))


def memory() -> None:
    out = child_results([sys.executable, __file__], ("sft", "lopd"), cwd=Path.cwd())
    for arm, d in out.items():
        print(f"peak memory {arm:<5}: process peak {d['peak_total_bytes'] / 2**20:8.1f} MiB, "
              f"growth during 3 steps {d['peak_growth_bytes'] / 2**20:7.2f} MiB")
    ratio = out["lopd"]["peak_total_bytes"] / out["sft"]["peak_total_bytes"]
    print(f"LOPD / SFT process peak memory = {ratio:.2f} (goal <= 1.5; one shared backbone, no teacher copy)")
    if out["sft"]["peak_growth_bytes"] > 0:
        g = out["lopd"]["peak_growth_bytes"] / out["sft"]["peak_growth_bytes"]
        print(f"LOPD / SFT peak growth during steps = {g:.2f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--child", default=None)
    ap.add_argument("--no-memory", action="store_true", help="timings only")
    a = ap.parse_args()
    workspace()
    if a.child:
        peak_memory_child(a.child)
    else:
        timing(a.repeats)
        if not a.no_memory:
            memory()
