"""Batched multi-turn rollouts: generated tokens/s and achieved GFLOP/s against the machine's
measured matmul peak, for the rollout engine (lean forward and Hugging Face forward) and the
former one-position-per-forward engine (bench/reference_rollout.py); then a sweep of the
cost per decoding step against model width and depth.

    python bench/rollouts.py [--batch 64] [--repeats 5] [--batches 16,64,256] [--no-sweep]

Workload: the pipeline's base policy (student LoRA active, as in training) on ``--batch``
multi-turn tool tasks of the train split, sampled at ``evaluate.temperature`` with the
pipeline's ``max_new_tokens`` / ``max_seq_len``. Engines run interleaved, repeat after
repeat; figures are medians over repeats. ``--batches``: the engine on the same policy at
other batch sizes (tasks cycled, each row its own sampling seed) — the tiny model is
overhead-bound, so throughput grows with the batch.

What is counted (useful work, the same for every engine — padding is not counted):
for a rollout of ``n`` tokens of which ``s`` the policy sampled,
``2·P_layers·(n−1) + 2·P_head·s + Σ_layers Σ_{p<n−1} 4·A·(p+1)`` FLOPs, where ``P_layers`` are
the weights of the decoder layers' linear maps including the active LoRA adapter's A and B,
``P_head = vocab × hidden`` (logits are needed only where the policy decides) and ``A`` the
attention width (heads × head_dim; QKᵀ and AV over ``p+1`` keys). Norms, rotary, softmax,
activations, embedding look-ups and sampling are not counted. Peak: the best of 5 fp32
2048×2048 ``torch.mm`` with ``model.torch_threads`` threads (2) on CPU, or bf16 8192² on
CUDA, measured in every repeat between the engines; the median of those is the peak. Then the
share of a batch spent in the model's forward passes, and the forward's own GFLOP/s.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _workspace import rollout_workload, workspace


def matmul_peak_gflops(device, repeats: int = 10) -> float:
    import torch

    n, dtype = (2048, torch.float32) if device.type == "cpu" else (8192, torch.bfloat16)
    a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def model_costs(model) -> tuple[int, int, int, list]:
    """(P_layers, P_head, attention width, layers) of a Llama-family model as the engine runs it."""
    from lopd.engine.fast_decoder import FastDecoder

    dec = FastDecoder.build(model)
    if dec is None:
        raise SystemExit("FLOP counting reads the model through FastDecoder: a Llama-family model is needed")
    p_layers = 0
    for ly in dec.layers:
        for lin in (ly.q, ly.k, ly.v, ly.o, ly.gate, ly.up, ly.down):
            p_layers += lin.weight.numel() + sum(a.numel() + b.numel() for a, b, _ in lin.lora)
    return p_layers, dec.lm_head.weight.numel(), dec.layers[0].q.weight.shape[0], dec.layers


def rollout_flops(rolls, costs) -> float:
    p_layers, p_head, width, layers = costs
    total = 0.0
    for r in rolls:
        fed = len(r.ids) - 1
        total += 2 * p_layers * fed + 2 * p_head * sum(r.gen_mask) + len(layers) * 4 * width * fed * (fed + 1) / 2
    return total


def run_engines(engines: dict, repeats: int, costs, device, label: str) -> dict:
    """Interleaved repeats of every engine and of the matmul peak (so that a busy spell of a
    shared machine hits them alike); prints and returns median figures per engine."""
    rows = {k: [] for k in engines}
    peaks = []
    for rep in range(repeats):
        peaks.append(matmul_peak_gflops(device, repeats=5))
        for name, fn in engines.items():
            t0 = time.perf_counter()
            rolls = fn(rep)
            dt = time.perf_counter() - t0
            rows[name].append((dt, sum(r.n_generated for r in rolls), rollout_flops(rolls, costs),
                               sum(len(r.ids) - 1 for r in rolls)))
    peak = statistics.median(peaks)
    print(f"{label}matmul peak {peak:.1f} GFLOP/s (median over the same repeats)")
    out = {}
    for name, rs in rows.items():
        secs = statistics.median(r[0] for r in rs)
        tok_s = statistics.median(r[1] / r[0] for r in rs)
        gflops = statistics.median(r[2] / r[0] / 1e9 for r in rs)
        out[name] = {"s": secs, "tok_s": tok_s, "gflops": gflops, "peak": peak}
        print(f"{label}{name:<26} {secs * 1000:8.1f} ms/batch  {tok_s:8.0f} generated tok/s  "
              f"{statistics.median(r[3] / r[0] for r in rs):8.0f} processed tok/s  {gflops:6.2f} GFLOP/s "
              f"= {100 * gflops / peak:5.2f}% of peak  ({statistics.median(r[1] for r in rs):.0f} generated, "
              f"{statistics.median(r[2] for r in rs) / 1e6:.1f} MFLOP per batch)")
    return out


def forward_share(engine, repeats: int, costs, peak: float) -> None:
    """How much of a batch is the model's forward (``FastDecoder.packed``, timed around each call),
    and the GFLOP/s of the forward alone: the ceiling of the engine if all host work (sampling,
    plans, environments, tokenising) cost nothing."""
    from lopd.engine.fast_decoder import FastDecoder

    plain = FastDecoder.packed
    spent = []

    def timed(self, *a):
        t0 = time.perf_counter()
        try:
            return plain(self, *a)
        finally:
            spent.append(time.perf_counter() - t0)

    rows = []
    FastDecoder.packed = timed
    try:
        for rep in range(repeats):
            spent.clear()
            t0 = time.perf_counter()
            rolls = engine(rep)
            rows.append((time.perf_counter() - t0, sum(spent), len(spent), rollout_flops(rolls, costs)))
    finally:
        FastDecoder.packed = plain
    total, fwd = statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)
    gflops = statistics.median(r[3] / r[1] / 1e9 for r in rows)
    print(f"of a batch ({total * 1000:.1f} ms), the forward passes take {fwd * 1000:.1f} ms "
          f"({100 * fwd / total:.0f}%, {statistics.median(r[2] for r in rows):.0f} forwards): the forward alone "
          f"runs {gflops:.2f} GFLOP/s = {100 * gflops / peak:.2f}% of the peak")


def batch_sweep(bb, tasks, envs, kw, costs, repeats: int, batches: list[int]) -> None:
    from lopd.engine.rollout import rollout_batch

    print(f"\nbatch sweep: base policy, tool tasks cycled, median of {repeats}")
    for n in batches:
        rows = [tasks[i % len(tasks)] for i in range(n)]

        def new(rep, rows=rows):
            return rollout_batch(bb.model, bb.fmt, envs, rows, **kw, seeds=[10_000 * rep + i for i in range(len(rows))])

        run_engines({"engine (lean forward)": new}, repeats, costs, bb.device, f"batch {n:<4} ")


def sweep(tasks, envs, p, tok, device, repeats: int) -> None:
    """Random-init qwen3 models (LoRA student active) of several widths and depths, same tasks."""
    from lopd.model.backbone import Backbone, build_tiny_model
    from lopd.engine.rollout import rollout_batch

    print(f"\nsweep: random-init qwen3 + LoRA student, batch {len(tasks)}, sampled; ms per step = per forward pass")
    for hidden in (64, 128, 256):
        for layers in (2, 4):
            mp = p.model.model_copy(update={"arch": "qwen3", "hidden_size": hidden, "num_layers": layers,
                                            "intermediate_size": 2 * hidden})
            bb = Backbone(build_tiny_model(mp, tok, seed=0), tok, mp)
            bb.mode("student")
            bb.model.eval()
            costs = model_costs(bb.model)
            steps = []

            def new(rep, bb=bb, steps=steps):
                rolls = rollout_batch(bb.model, bb.fmt, envs, tasks, max_new_tokens=p.evaluate.max_new_tokens,
                                      max_len=p.model.max_seq_len, temperature=p.evaluate.temperature,
                                      seeds=[1000 * rep + i for i in range(len(tasks))])
                steps.append(max(sum(r.gen_mask) for r in rolls))
                return rolls

            res = run_engines({"engine": new}, repeats, costs, device, f"h={hidden:<3} L={layers} ")["engine"]
            print(f"{'':10}{res['s'] * 1000 / statistics.median(steps):6.2f} ms per step "
                  f"({statistics.median(steps):.0f} steps), {costs[0] + costs[1]:,} matmul params")
            del bb


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batches", default="16,64,256", help="batch sizes of the batch sweep ('' for none)")
    ap.add_argument("--no-sweep", action="store_true", help="skip the width/depth sweep")
    args = ap.parse_args()
    workspace()
    import torch

    from lopd.engine.rollout import rollout_batch
    from reference_rollout import rollout_batch as reference_rollout_batch

    p, bb, tasks, envs, kw = rollout_workload(args.batch)
    print(f"matmul peak measured on {bb.device.type} with {torch.get_num_threads()} threads, in every repeat")
    engines = {
        "engine (lean forward)": lambda rep: rollout_batch(bb.model, bb.fmt, envs, tasks, **kw,
                                                           generator=torch.Generator().manual_seed(rep)),
        "engine (HF forward)": lambda rep: rollout_batch(bb.model, bb.fmt, envs, tasks, **kw, engine="hf",
                                                         generator=torch.Generator().manual_seed(rep)),
        "former engine (reference)": lambda rep: reference_rollout_batch(
            bb.model, bb.fmt, envs, tasks, **kw, generator=torch.Generator().manual_seed(rep)),
    }
    engines["engine (lean forward)"](0)  # warm-up
    print(f"base policy, {len(tasks)} tool tasks, median of {args.repeats}:")
    costs = model_costs(bb.model)
    res = run_engines(engines, args.repeats, costs, bb.device, "")
    old, new = res["former engine (reference)"], res["engine (lean forward)"]
    print(f"speed-up over the former engine: {old['s'] / new['s']:.2f}x per batch; "
          f"generation at {100 * new['gflops'] / new['peak']:.2f}% of the matmul peak (goal >= 5%)")
    forward_share(engines["engine (lean forward)"], args.repeats, costs, new["peak"])
    if args.batches:
        batch_sweep(bb, tasks, envs, kw, costs, args.repeats, [int(b) for b in args.batches.split(",")])
    if not args.no_sweep:
        sweep(tasks, envs, p, bb.tokenizer, bb.device, args.repeats)


if __name__ == "__main__":
    main()
