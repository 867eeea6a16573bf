"""A roofline for the training passes: what a LOPD population step's passes achieve against the bare model.

    python bench/roofline.py --workdir <pipeline dir> [--sizes 1 5 10] [--repeats 3] [--profile 10]

For each population size S, one step's rollouts are drawn once (arm lopd at the selected point,
``hpo/best_params.yaml``, else ``train``'s own), then the step's passes are timed on that fixed batch
(medians of ``--repeats``): the student's forward (member-routed LoRA), the composer (the backbone
over the retrieved experiences under the composer adapters, then the QFormer block), the teacher's
forward with its latent prefix, the objectives (log-softmaxes, the KL's top-M plus tail, δ, Δ(φ), the
anchor and margin terms), and the one backward over every member's loss. Each pass's token positions
and FLOPs are counted and turned into positions/s and GFLOP/s.

The reference is the **bare model**: the backbone with no adapter, no routing, no context, on a batch of
the same shape as the student's, a log-softmax NLL, and the backward, as the goal of 40k student positions/s
was timed. Its positions/s is what the passes would reach if they added nothing around the model.

FLOP model (printed): a position's forward costs 2 FLOPs per weight it meets (the decoder's linear
maps, the LM head, the LoRA factors of the targeted maps) plus attention's 4 · heads · head_dim ·
(keys it attends to) per layer; a backward costs 2× the forward of a pass whose weights take gradient
(student, composer) and 1× where only the activations do (the teacher: its gradient reaches φ
through the prefix; its weights are frozen). Padding is counted as work (the kernels do it).

``--profile S``: a ``torch.profiler`` table of one step's passes at size S, by op and by region
(``record_function`` around the student, composer encoder, QFormer, teacher, objectives, backward and
the routed LoRA maps).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from contextlib import contextmanager
from pathlib import Path

from _workspace import params, selected_point, workspace


class Meter:
    """Wall seconds and token positions per region, accumulated over one timed call."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.positions: dict[str, int] = {}

    @contextmanager
    def region(self, name: str, positions: int = 0):
        import torch

        t0 = time.perf_counter()
        with torch.profiler.record_function(name):
            yield
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
        self.positions[name] = self.positions.get(name, 0) + positions


def instrument(bb, composers, meter: Meter) -> None:
    """Time the backbone's passes and the QFormer through wrappers on this instance (nothing in lopd/
    changes); a LoRA layer's routed forward gets a profiler label."""
    import torch

    logits, teacher, hidden = bb.logits, bb.teacher_logits, bb.hidden_states

    def student(ids, attn, role):
        with meter.region("student", ids.numel()):
            return logits(ids, attn, role)

    def teacher_pass(prefix, mask, ids, attn, **kw):
        n = ids.numel() + (0 if prefix is None else prefix.shape[0] * prefix.shape[1])
        with meter.region("teacher", n):
            return teacher(prefix, mask, ids, attn, **kw)

    def encoder(ids, attn, role="composer"):
        with meter.region("composer encoder", ids.numel()):
            return hidden(ids, attn, role)

    bb.logits, bb.teacher_logits, bb.hidden_states = student, teacher_pass, encoder
    for comp in composers:
        block_forward = comp.block.forward

        def qformer(h, mask, K, _f=block_forward):
            with meter.region("qformer", 0):
                return _f(h, mask, K)
        comp.block.forward = qformer
    for mod in bb._layers:
        if "forward" in vars(mod):
            routed = mod.forward

            def labelled(x, *a, _f=routed, **kw):
                with torch.profiler.record_function("lora routed"):
                    return _f(x, *a, **kw)
            mod.forward = labelled


def flop_model(cfg, lora_r: int, targets: list[str]) -> dict:
    d, L, V = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    hd = getattr(cfg, "head_dim", d // cfg.num_attention_heads)
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    shapes = {"q_proj": (d, q), "k_proj": (d, kv), "v_proj": (d, kv), "o_proj": (q, d),
              "gate_proj": (d, cfg.intermediate_size), "up_proj": (d, cfg.intermediate_size),
              "down_proj": (cfg.intermediate_size, d)}
    linear = L * sum(i * o for i, o in shapes.values()) + d * V
    lora = L * sum(lora_r * (i + o) for name, (i, o) in shapes.items() if name in targets)
    return {"linear": linear, "head": d * V, "lora": lora, "attn_per_key": 4 * cfg.num_attention_heads * hd * L}


def pass_flops(fm: dict, rows: int, width: int, keys_extra: int = 0, lora: bool = True, head: bool = True) -> float:
    """Forward FLOPs of ``rows`` sequences of ``width`` positions (causal: position t attends to t+1 keys,
    plus ``keys_extra`` prefix keys); ``head``: the LM head runs (the composer's encoder skips it)."""
    per_pos = 2 * (fm["linear"] - (0 if head else fm["head"]) + (fm["lora"] if lora else 0))
    keys = width * (width + 1) / 2 + width * keys_extra
    return rows * (width * per_pos + fm["attn_per_key"] * keys)


def bare_model(bb, ids, attn, repeats: int) -> float:
    """Median seconds of the bare backbone's forward + log-softmax NLL + backward on ``ids``."""
    import torch

    model = bb.model.get_base_model()
    params = [p for p in model.parameters()]
    flags = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(True)
    times = []
    try:
        with bb.model.disable_adapter():
            for _ in range(repeats + 1):
                t0 = time.perf_counter()
                out = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1]
                logp = torch.log_softmax(out.float(), -1)
                loss = -(logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1) * attn[:, 1:]).sum() / attn.sum()
                loss.backward()
                times.append(time.perf_counter() - t0)
                model.zero_grad(set_to_none=True)
    finally:
        for p, f in zip(params, flags):
            p.requires_grad_(f)
    return statistics.median(times[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 5, 10])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", type=int, default=0, metavar="S")
    ap.add_argument("--attention", choices=["default", "math"], default="default",
                    help="SDPA backend of every timed pass (default: what torch picks, flash on this CPU)")
    args = ap.parse_args()
    workspace(args.workdir)

    import torch

    from lopd.training.trainer import HParams

    p = params()
    torch.set_num_threads(p.model.torch_threads)
    hp = HParams.from_params(p, steps=10_000, val_every=10_000, checkpoint_every=10_000, **selected_point())
    print(f"arm lopd at K {hp.K}, n_ret {hp.n_ret}, m {hp.margin}; {hp.tasks_per_step} rollouts per member; "
          f"{torch.get_num_threads()} torch threads, {os.cpu_count()} cores; medians of {args.repeats} repeats")
    _summary([_size(args, p, hp, S) for S in args.sizes])


def _backend(attention: str):
    """The SDPA backend the timed passes run under (the rollouts are drawn with the default either way)."""
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.MATH]) if attention == "math" else contextlib.nullcontext()


def _size(args, p, hp, S: int) -> tuple:
    """One population size: its table printed, its row for the summary returned."""
    import torch

    from lopd.arms import ARMS
    from lopd.paths import Paths
    from lopd.population.trainer import Member, Population
    from lopd.stages.common import load_resources

    res = load_resources(p, Paths(Path.cwd()), role="train")
    pop = Population(res, ARMS["lopd"], [Member(hp, seed) for seed in range(S)])
    for m in pop.trainers:
        m.prepare()
    fm = flop_model(res.bb.model.config, p.model.lora_r, list(res.bb._lora_config.target_modules))
    batches = pop._rollouts()
    meter = Meter()
    instrument(res.bb, [tr.composer for tr in pop.trainers], meter)
    T = max(b["ids"].shape[1] for b in batches)
    ids = torch.cat([torch.nn.functional.pad(b["ids"], (0, T - b["ids"].shape[1]), value=res.bb.fmt.pad_id)
                     for b in batches])
    attn = (ids != res.bb.fmt.pad_id).long()
    runs = []
    with _backend(args.attention):
        for _ in range(args.repeats + 1):  # the first is a warm-up
            meter.seconds, meter.positions = {}, {}
            passes = pop._passes(batches)
            with meter.region("objectives"):
                outs = [tr.objective(b, q) for tr, b, q in zip(pop.trainers, batches, passes)]
            with meter.region("backward"):
                sum(o.loss for o, _ in outs).backward()
            for tr in pop.trainers:
                tr.zero_grad()
            runs.append(dict(meter.seconds))
        pos = dict(meter.positions)
        bare_s = bare_model(res.bb, ids, attn, args.repeats)
        if args.profile == S:
            _profile(pop, batches)
    sec = {k: statistics.median(r[k] for r in runs[1:]) for k in runs[0]}
    # FLOPs of this batch's passes
    N, prefix = ids.shape[0], hp.n_ret * hp.K
    n_exp = pos["composer encoder"] and N * hp.n_ret
    w_exp = pos["composer encoder"] // max(n_exp, 1)
    f = {"student": pass_flops(fm, N, T), "teacher": pass_flops(fm, N, T, keys_extra=prefix, lora=False),
         "composer encoder": pass_flops(fm, n_exp, w_exp, head=False)}
    fwd = sum(f.values())
    bwd = 2 * (f["student"] + f["composer encoder"]) + f["teacher"]
    total_s = sum(sec[k] for k in ("student", "composer encoder", "qformer", "teacher", "objectives", "backward"))
    all_pos = pos["student"] + pos["teacher"] + pos["composer encoder"]
    bare_flops = 3 * pass_flops(fm, N, T, lora=False)
    print(f"\nS = {S}: {N} rollouts of width {T}; {n_exp} retrieved experiences of padded width {w_exp}; "
          f"prefix {prefix} latents")
    print(f"  {'pass':18s} {'positions':>9s} {'seconds':>8s} {'positions/s':>12s} {'GFLOP':>7s} {'GFLOP/s':>8s}")
    for k in ("student", "composer encoder", "qformer", "teacher", "objectives", "backward"):
        gf = {"backward": bwd}.get(k, f.get(k, 0.0)) / 1e9
        n = pos.get(k, 0) if k != "backward" else all_pos
        print(f"  {k:18s} {n:>9d} {sec[k]:>8.3f} {n / sec[k]:>12.0f} {gf:>7.3f} {gf / sec[k]:>8.2f}")
    print(f"  {'all passes':18s} {all_pos:>9d} {total_s:>8.3f} {all_pos / total_s:>12.0f} "
          f"{(fwd + bwd) / 1e9:>7.3f} {(fwd + bwd) / 1e9 / total_s:>8.2f}   "
          f"(student positions/s, bench/population.py's 'pass tokens/s': {pos['student'] / total_s:.0f})")
    print(f"  {'bare model':18s} {ids.numel():>9d} {bare_s:>8.3f} {ids.numel() / bare_s:>12.0f} "
          f"{bare_flops / 1e9:>7.3f} {bare_flops / 1e9 / bare_s:>8.2f}   (forward + NLL + backward, no adapters)")
    return S, total_s, all_pos, fwd + bwd, ids.numel(), bare_s, bare_flops, fm


def _summary(rows: list[tuple]) -> None:
    fm = rows[0][-1]
    print(f"\nFLOP model: {fm['linear']:,} linear weights met per position (decoder + LM head; the composer's "
          f"encoder skips the head's {fm['head']:,}), LoRA "
          f"{fm['lora']:,}, attention {fm['attn_per_key']:,} FLOPs per (position, key) over all layers; "
          "backward 2x the forward of the student and composer passes, 1x the teacher's")
    print(f"{'S':>3} {'passes s':>9} {'passes pos/s':>13} {'passes GFLOP/s':>15} {'bare pos/s':>11} "
          f"{'bare GFLOP/s':>13} {'passes/bare (pos/s)':>20}")
    for S, total_s, all_pos, flops, bare_pos, bare_s, bare_flops, _ in rows:
        print(f"{S:>3} {total_s:>9.3f} {all_pos / total_s:>13.0f} {flops / 1e9 / total_s:>15.2f} {bare_pos / bare_s:>11.0f} "
              f"{bare_flops / 1e9 / bare_s:>13.2f} {all_pos / total_s / (bare_pos / bare_s):>20.2f}")


def _profile(pop, batches) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        passes = pop._passes(batches)
        outs = [tr.objective(b, q) for tr, b, q in zip(pop.trainers, batches, passes)]
        with torch.profiler.record_function("backward"):
            sum(o.loss for o, _ in outs).backward()
    for tr in pop.trainers:
        tr.zero_grad()
    table = prof.key_averages()
    regions = {"student", "composer encoder", "qformer", "teacher", "objectives", "backward", "lora routed"}
    print("\nprofile by region (record_function; CPU total ms, calls):")
    for e in sorted((e for e in table if e.key in regions), key=lambda e: -e.cpu_time_total):
        print(f"  {e.key:18s} {e.cpu_time_total / 1e3:>9.1f} ms  {e.count:>6d}")
    print("profile by op (self CPU):")
    print(table.table(sort_by="self_cpu_time_total", row_limit=18))


if __name__ == "__main__":
    main()
