"""Batched multi-turn rollouts: generated tokens per second with and without the KV cache.

    python bench/rollouts.py [--batch 64] [--repeats 3]

Goal (issue 2): ≥ 3× with the cache. Runs on the base policy of the pipeline (or a tiny
workspace it builds).
"""

from __future__ import annotations

import argparse
import time

from _workspace import params, workspace


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    workspace()
    import torch

    from lopd import data, stages
    from lopd.evaluate import make_envs
    from lopd.rollout import rollout_batch

    p = params()
    torch.set_num_threads(p.model.torch_threads)
    bb = stages._load_bb(p)
    tasks = data.SplitReader(stages.SPLITS_DIR, role="base").load("train")
    tasks = [t for t in tasks if t.domain == "tool"][: args.batch]  # multi-turn episodes
    envs = make_envs(p)
    bb.mode("student")
    out = {}
    for use_cache in (True, False):
        toks, secs, positions = 0, 0.0, 0
        for r in range(args.repeats):
            g = torch.Generator().manual_seed(r)
            t0 = time.perf_counter()
            rolls = rollout_batch(bb.model, bb.fmt, envs, tasks, max_new_tokens=p.evaluate.max_new_tokens,
                                  max_len=p.model.max_seq_len, generator=g, use_cache=use_cache)
            secs += time.perf_counter() - t0
            toks += sum(r.n_generated for r in rolls)
            positions += max(len(r.ids) for r in rolls)
        out[use_cache] = toks / secs
        print(f"KV cache {'on ' if use_cache else 'off'}: {toks / secs:8.0f} generated tokens/s "
              f"({toks / args.repeats:.0f} tokens, {positions / args.repeats:.0f} positions per batch of {len(tasks)}, "
              f"{secs / args.repeats:.2f} s per batch)")
    print(f"speed-up with the KV cache: {out[True] / out[False]:.2f}x (goal >= 3x)")


if __name__ == "__main__":
    main()
