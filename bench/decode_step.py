"""One decoding step of the rollout engine's forward, alone: the fused packed forward against the
map-by-map one (and optionally ``torch.compile`` of the fused one), plus the step's sampling and
cache plan.

    python bench/decode_step.py [--batch 64] [--steps 300] [--threads 1] [--compile]

The default base policy (student adapter active) on a ragged cache of ``--batch`` rows whose
prompts were prefilled with 40 tokens each; every timed step feeds one token per row (the
cache is rewound to 40 tokens when a row nears 150). Prints min and median µs per step over
``--steps`` steps, three rounds per variant, interleaved; then the sampling of a step, and one
layer's attention by SDPA (as the engine calls it) and by matmul → softmax → matmul. ``--compile``: ``torch.compile(dynamic=True)``
of the fused forward, its compile time and its steps (slow: minutes on 2 cores). ``--profile``:
torch.profiler's per-operator table of 100 fused steps (the profiler inflates small operations).
"""

from __future__ import annotations

import argparse
import statistics
import time

from _workspace import rollout_workload, workspace


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (rollouts use 1)")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--profile", action="store_true", help="also print torch.profiler's operator table of the fused step")
    args = ap.parse_args()
    workspace()
    import torch

    from lopd.engine.fast_decoder import FastDecoder
    from lopd.engine.kv_cache import RaggedKVCache
    from lopd.engine.sampling import choose_tokens, seed_states

    p, bb, _, _, _ = rollout_workload(0)
    torch.set_num_threads(args.threads)
    fast = FastDecoder.build(bb.model)
    if fast is None or fast.fused is None:
        raise SystemExit("the default policy should get the fused forward")
    b = args.batch

    def steps(forward, n: int) -> tuple[float, float]:
        cache = RaggedKVCache(b, p.model.max_seq_len, torch.device("cpu"))
        forward(torch.randint(8, 100, (b * 40,)), cache.packed([40] * b, fast.kv_heads), cache)
        cache.commit()
        tok, ts = torch.randint(8, 100, (b,)), []
        for _ in range(n):
            if int(cache.lengths.max()) >= p.model.max_seq_len - 10:
                cache.lengths[:] = 40
            t0 = time.perf_counter()
            forward(tok, cache.packed([1] * b, fast.kv_heads), cache)
            cache.commit()
            ts.append(time.perf_counter() - t0)
        return min(ts) * 1e6, statistics.median(ts) * 1e6

    variants = {"fused (packed)": fast.packed, "map by map (packed_unfused)": fast.packed_unfused}
    with torch.inference_mode():
        if args.compile:
            t0 = time.perf_counter()
            compiled = torch.compile(fast.packed, dynamic=True)
            steps(compiled, 3)
            print(f"torch.compile: first steps after {time.perf_counter() - t0:.1f} s")
            variants["torch.compile(fused)"] = compiled
        print(f"decoding step, batch {b}, {args.threads} thread(s), cache plan included; min / median of {args.steps}")
        for rnd in range(3):
            for name, fwd in variants.items():
                lo, med = steps(fwd, args.steps)
                print(f"round {rnd}  {name:<28} {lo:7.0f} / {med:7.0f} µs")
        logits, pos = torch.randn(b, bb.model.config.vocab_size), torch.full((b,), 50)
        states = seed_states(torch.arange(b))
        ts = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            choose_tokens(logits, greedy=False, temperature=1.0, positions=pos, states=states)
            ts.append(time.perf_counter() - t0)
        print(f"sampling (Gumbel-max, counter hash)    {min(ts) * 1e6:7.0f} / {statistics.median(ts) * 1e6:7.0f} µs")
        attention(fast, b, args.steps)
        if args.profile:
            from torch.profiler import profile

            with profile() as prof:
                steps(fast.packed, 100)
            print("\ntorch.profiler over 100 fused steps (and one prefill), per operator:")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


def attention(fast, b: int, n: int) -> None:
    """One layer's decoding attention at the step's shapes (``b`` rows, 100 key slots, rows of
    random lengths): SDPA as the engine calls it against matmul → masked softmax → matmul."""
    import torch
    import torch.nn.functional as F

    ly = fast.fused[0]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, ly.kv_heads, ly.heads // ly.kv_heads, ly.head_dim, generator=g)
    k, v = (torch.randn(b, ly.kv_heads, 100, ly.head_dim, generator=g) for _ in range(2))
    slot = torch.arange(100)
    mask = ((slot >= 1) & (slot <= torch.randint(20, 100, (b, 1), generator=g)))[:, None, None]
    additive = torch.zeros(mask.shape).masked_fill_(~mask, float("-inf"))

    def manual():
        s = torch.matmul(q, k.transpose(-1, -2)).mul_(ly.scaling).add_(additive)
        return torch.matmul(torch.softmax(s, -1), v)

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=ly.scaling)

    for name, fn in (("attention: SDPA (the engine's)", sdpa), ("attention: matmul-softmax-matmul", manual)):
        fn()
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        print(f"{name:<38} {min(ts) * 1e6:7.0f} / {statistics.median(ts) * 1e6:7.0f} µs per layer")


if __name__ == "__main__":
    main()
