"""The upstream draws' cold starts trained as one population: an experiment, measured slower than alone.

    python bench/cold_start_population.py --workdir DIR [--sizes 1 10] [--steps 10] [--check 3]

Could the per-seed cold starts (11 × 24 s of a default repro) train faster as one
population, as the final runs do? This bench builds that population outside the pipeline (the pipeline's
:func:`lopd.training.cold_start.cold_start` is unchanged): S draws of ``DIR/models/draws/bank-s``, each
member its own composer on its own view of the backbone (:meth:`~lopd.model.backbone.Backbone.member_views`,
starting from the backbone's ``composer`` adapter as alone), optimiser and random stream (its own K, n_ret
and entries per step); every step one composer encoder pass over all members' distinct experiences (member-
routed LoRA), one latent-teacher pass (the members' latent prefixes, n_ret·K wide, padded to the widest and
masked), one text-teacher pass (text contexts left-padded to the widest, positions shifted back as alone),
one backward over the sum of the members' losses, each member's own clipping and AdamW step.

Per size it prints the wall time per step (median of ``--steps`` after one warm-up), the teacher passes'
token positions per step and their forward positions per second. S = 1 is the pipeline's own
:func:`cold_start` (the same draw). ``--check N``: after N steps, the largest difference between each
population member's φ and the same draw cold-started alone for N steps (members' independence).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

import torch


def _pad(t, width, value, left=False):
    if t.shape[1] == width:
        return t
    pad = t.new_full((t.shape[0], width - t.shape[1], *t.shape[2:]), value)
    return torch.cat([pad, t] if left else [t, pad], dim=1)


class Counted:
    """Wraps ``bb.teacher_logits``: the token positions (rows × (prefix + ids)) and seconds of its calls."""

    def __init__(self, bb):
        self.f, self.positions, self.seconds = bb.teacher_logits, 0, 0.0
        bb.teacher_logits = self

    def __call__(self, prefix, pmask, ids, attn, **kw):
        self.positions += ids.shape[0] * (ids.shape[1] + (0 if prefix is None else prefix.shape[1]))
        t = time.perf_counter()
        out = self.f(prefix, pmask, ids, attn, **kw)
        self.seconds += time.perf_counter() - t
        return out


class PopulationColdStart:
    """S cold starts in lock-step (module docstring)."""

    def __init__(self, bb, draws, cp, k_choices):
        from lopd.model.composer import Composer
        from lopd.training.cold_start import _Encoded

        self.bb, self.cp, self.k_choices, self.S = bb, cp, k_choices, len(draws)
        start = bb.adapter_state("composer")
        self.views = bb.member_views(self.S)
        self.members = []
        for v, (bank, emb, seed) in zip(self.views, draws):
            v.load_adapter_state("composer", start)
            torch.manual_seed(seed)
            comp = Composer(v, cp.k_max, gate_init=cp.gate_init)
            phi = comp.phi_params()
            for p in phi:
                p.requires_grad_(True)
            self.members.append({"rng": random.Random(seed), "comp": comp, "phi": phi, "bank": bank,
                                 "opt": torch.optim.AdamW(phi, lr=cp.lr, weight_decay=0.0),
                                 "cap": min(cp.n_ret_max, max(1, len(bank) - 1)), "enc": _Encoded(v, bank, emb)})
        for v in self.views:
            for p in v.adapter_params("student"):
                p.requires_grad_(False)
        bb.model.train()

    def step(self):
        from lopd.model.composer import encode_distinct
        from lopd.training.cold_start import _batch, distill_kl, text_context
        from lopd.training.objectives import sft_loss, token_logprobs

        bb, cp, S = self.bb, self.cp, self.S
        batches = []
        for m in self.members:
            K = m["rng"].choice(self.k_choices)
            n_ret = m["rng"].randint(1, m["cap"])
            picks = m["rng"].sample(range(len(m["bank"])), min(cp.batch_size, len(m["bank"])))
            batches.append((K, n_ret, *_batch(bb, picks, n_ret, m["enc"])))
        flat = [x for b in batches for per_task in b[2] for x in per_task]
        owner = [i for i, b in enumerate(batches) for per_task in b[2] for _ in per_task]
        h, hm, inverse = encode_distinct(bb, flat, owner, S)
        lat, at, d0 = [], 0, 0
        for m, (K, n_ret, exps, *_r) in zip(self.members, batches):
            n = len(exps) * n_ret
            inv = inverse[at:at + n]
            d1 = int(inv.max()) + 1
            lat.append(m["comp"].compress(h[d0:d1], hm[d0:d1], n_ret, K, inv - d0))
            at, d0 = at + n, d1
        P, T = max(c.shape[1] for c in lat), max(b[3].shape[1] for b in batches)
        prefix = torch.cat([_pad(c, P, 0.0) for c in lat])
        pmask = torch.cat([_pad(torch.ones(c.shape[:2], dtype=torch.long), P, 0) for c in lat])
        ids = torch.cat([_pad(b[3], T, bb.fmt.pad_id) for b in batches])
        attn = torch.cat([_pad(b[4], T, 0) for b in batches])
        latent = bb.teacher_logits(prefix, pmask, ids, attn)[:, :-1].float()
        with torch.no_grad():
            texts = [text_context(bb, b[2]) for b in batches]
            L = max(t.shape[1] for t, _ in texts)
            shift = torch.cat([torch.full((t.shape[0],), L - t.shape[1], dtype=torch.long) for t, _ in texts])
            text = bb.teacher_logits(torch.cat([_pad(t, L, 0.0, True) for t, _ in texts]),
                                     torch.cat([_pad(mk, L, 0, True) for _, mk in texts]), ids, attn,
                                     latent_prefix=False, prefix_shift=shift)[:, :-1].float()
        losses, r0 = [], 0
        for b in batches:
            ids_m, mask = b[3], b[5]
            rows, w = slice(r0, r0 + ids_m.shape[0]), ids_m.shape[1] - 1
            r0 += ids_m.shape[0]
            nll = sft_loss(token_logprobs(latent[rows, :w], ids_m[:, 1:]), mask)
            kl = distill_kl(torch.log_softmax(text[rows, :w], -1), torch.log_softmax(latent[rows, :w], -1), mask,
                            cp.distill_top_m)
            losses.append(nll + cp.distill_weight * kl.loss)
        for m in self.members:
            m["opt"].zero_grad(set_to_none=True)
        sum(losses[1:], losses[0]).backward()
        for m in self.members:
            torch.nn.utils.clip_grad_norm_(m["phi"], 1.0)
            m["opt"].step()

    def states(self):
        return [m["comp"].state() for m in self.members]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", required=True, help="a pipeline directory with models/base and models/draws/bank-*")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 10])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--check", type=int, default=0)
    args = ap.parse_args()

    from lopd.bank import ExperienceBank
    from lopd.config import load_params
    from lopd.compat.kernels import seed_everything
    from lopd.paths import Paths
    from lopd.stages.common import experience_task, load_backbone, task_embeddings, upstream_seed
    from lopd.training.cold_start import cold_start

    params = load_params(Path(args.workdir) / "params.yaml")
    paths = Paths.for_params(Path(args.workdir) / "params.yaml")
    k_choices = sorted(set(params.hpo.k_choices) | {params.train.K})

    def setup(S):
        seed_everything(0, params.model.torch_threads)
        bb = load_backbone(params, paths)
        draws = []
        for d in range(S):
            bank = ExperienceBank.load(paths.bank_draw(d))
            emb = task_embeddings(params, bb, [experience_task(e) for e in bank.entries])
            draws.append((bank, emb, upstream_seed(params, "cold_start", d)))
        return bb, draws

    print(f"{args.workdir}: cold_start.batch_size {params.cold_start.batch_size}, K from {k_choices}, "
          f"n_ret 1..{params.cold_start.n_ret_max}; {params.model.torch_threads} threads")
    for S in args.sizes:
        bb, draws = setup(S)
        counted = Counted(bb)
        times = []
        if S == 1:  # the pipeline's own cold start, timed per step through its callback
            stamps = [time.perf_counter()]
            cp = params.cold_start.model_copy(update={"steps": args.steps + 1})
            bank, emb, seed = draws[0]
            cold_start(bb, bank, emb, cp, k_choices=k_choices, seed=seed,
                       on_step=lambda step, row: stamps.append(time.perf_counter()))
            times = [b - a for a, b in zip(stamps[1:], stamps[2:])]
            pos, sec = counted.positions / (args.steps + 1), counted.seconds / (args.steps + 1)
        else:
            pop = PopulationColdStart(bb, draws, params.cold_start, k_choices)
            for _ in range(args.steps + 1):
                t = time.perf_counter()
                pop.step()
                times.append(time.perf_counter() - t)
            times = times[1:]
            pos, sec = counted.positions / (args.steps + 1), counted.seconds / (args.steps + 1)
        step = statistics.median(times)
        print(f"S={S:>2}: {step * 1000:7.1f} ms per step ({step * 1000 / S:6.1f} ms per member); teacher passes "
              f"{pos:8.0f} positions per step ({pos / S:6.0f} per member), forward {pos / sec:8.0f} positions/s")
    if args.check:
        S = max(args.sizes)
        bb, draws = setup(S)
        pop = PopulationColdStart(bb, draws, params.cold_start, k_choices)
        for _ in range(args.check):
            pop.step()
        together = pop.states()
        worst = 0.0
        cp = params.cold_start.model_copy(update={"steps": args.check})
        for d, (bank, emb, seed) in enumerate(draws):  # each draw alone on a fresh backbone, as its stage runs it
            comp, _ = cold_start(load_backbone(params, paths), bank, emb, cp, k_choices=k_choices, seed=seed)
            alone = comp.state()
            worst = max(worst, max(float((alone[k] - together[d][k]).abs().max()) for k in alone))
        print(f"--check {args.check}: largest |φ alone − φ in the population of {S}| = {worst:.2e}")


if __name__ == "__main__":
    main()
