"""Can experience help, and can the base policy read it? Base-policy reward on the target-world
VAL tasks, per domain, with no context, with relevant text context (successful trajectories of
same-world TRAIN tasks) and with shuffled context (successful trajectories of train tasks from
other worlds of the same domain), each rendered exactly as the ``opsd_text`` teacher sees it
(:meth:`lopd.model.chat.ChatFormat.join_context`).

    python bench/premise_text.py [--profile profiles/null-world.yaml] [--base-dir models/base]
                                 [--n-ret N] [--samples S] [--json out.json]

Without ``--base-dir`` the base policy is pretrained here, in process, exactly as the ``base``
stage does it (same function, same params); the splits are generated in memory from the
params (the test split is never generated or read). Context trajectories are the scripted
solver's successful trajectories of the chosen train tasks. Every val task is rolled out
``S`` times per condition (sampled at ``evaluate.temperature``; the same generator seed for
every condition) and its reward averaged; CIs are over val tasks: Student-t for a condition's
mean, paired t over val tasks for a difference of conditions.

Acceptance (issue 13), default profile, per domain: none in [0.10, 0.45]; relevant - none >=
0.30; shuffled - none <= 0. Null world: relevant ~ shuffled.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CONDITIONS = ("none", "relevant", "shuffled")


class ContextFormat:
    """A :class:`ChatFormat` whose prompt tokens are preceded by the prompt's text context: a
    decoding loop that forces ``fmt.prompt_ids(prompt)`` then rolls the policy out after the
    context, at the positions the text teacher's view gives it."""

    def __init__(self, fmt, context_by_prompt: dict[str, list[int]]):
        self._fmt, self._ctx = fmt, context_by_prompt

    def prompt_ids(self, prompt: str) -> list[int]:
        return self._ctx[prompt] + self._fmt.prompt_ids(prompt)

    def prompt_ids_many(self, prompts: list[str]) -> list[list[int]]:
        # the rollout engine tokenises a batch's prompts at once: each must keep its context
        return [self._ctx[p] + ids for p, ids in zip(prompts, self._fmt.prompt_ids_many(prompts))]

    def __getattr__(self, name):
        return getattr(self._fmt, name)


def contexts(condition: str, val, train, env, fmt, n_ret: int, seed: int) -> dict[str, list[int]]:
    """Text context (token ids) per val prompt under ``condition``."""
    from lopd.training.base_policy import trajectory

    out: dict[str, list[int]] = {}
    for t in val:
        if t.prompt in out:
            continue
        if condition == "none":
            out[t.prompt] = []
            continue
        rng = random.Random(f"{seed}:{condition}:{t.prompt}")
        same = condition == "relevant"
        pool = [u for u in train if u.domain == t.domain and (u.world == t.world) == same]
        chosen = rng.sample(pool, n_ret)
        out[t.prompt] = fmt.context_ids([trajectory(env, u, env.solve(u)) for u in chosen])
    return out


def rewards(model, fmt, envs, val, ctx, params, samples: int, seed: int) -> list[float]:
    """Mean reward of ``samples`` rollouts per val task, in ``val`` order."""
    import torch

    from lopd.engine.rollout import rollout_batch

    gen = torch.Generator().manual_seed(seed)
    cfmt = ContextFormat(fmt, ctx)
    todo = [t for t in val for _ in range(samples)]
    extra = max(len(c) for c in ctx.values())
    ev = params.evaluate
    per: dict[str, list[float]] = {}
    for i in range(0, len(todo), ev.batch_size):
        for r in rollout_batch(model, cfmt, envs, todo[i:i + ev.batch_size], max_new_tokens=ev.max_new_tokens,
                               max_len=params.model.max_seq_len + extra, greedy=ev.greedy,
                               temperature=ev.temperature, generator=gen):
            per.setdefault(r.task.task_id, []).append(r.reward)
    return [sum(per[t.task_id]) / len(per[t.task_id]) for t in val]


def load_or_train(params, envs, base_dir: str | None):
    from lopd.model.chat import ChatFormat

    if base_dir:
        from lopd.model.backbone import load_causal_lm, resolve_device, resolve_dtype
        from lopd.model.tokenizer import load_tokenizer

        src = Path(base_dir) / "model"
        dev = resolve_device(params.model)
        model = load_causal_lm(src, dev, resolve_dtype(params.model, dev))
        return model.eval(), ChatFormat(load_tokenizer(src)), {"source": str(src)}
    from lopd.training.base_policy import train_base_policy

    t0 = time.time()
    model, tok, info = train_base_policy(params, envs)
    info = {k: v for k, v in info.items() if k != "losses"} | {"seconds": round(time.time() - t0, 1)}
    return model.eval(), ChatFormat(tok), info


def measure(params, model, fmt, envs, splits, n_ret: int, samples: int, seed: int) -> dict:
    """Per domain: the three conditions' summaries, their paired differences, the acceptance checks."""
    from lopd.analysis.stats import paired_t, summarize

    train, val = splits["train"], splits["val"]
    out: dict = {}
    for domain in params.envs.domains:
        v = [t for t in val if t.domain == domain]
        r = {c: rewards(model, fmt, envs, v, contexts(c, v, train, envs[domain], fmt, n_ret, seed), params,
                        samples, seed) for c in CONDITIONS}
        s = {c: summarize(r[c]) for c in CONDITIONS}
        d = {"relevant-none": paired_t(r["relevant"], r["none"]),
             "shuffled-none": paired_t(r["shuffled"], r["none"]),
             "relevant-shuffled": paired_t(r["relevant"], r["shuffled"])}
        ok = (0.10 <= s["none"]["mean"] <= 0.45, d["relevant-none"]["diff"] >= 0.30,
              d["shuffled-none"]["diff"] <= 0.0)
        out[domain] = {"n_tasks": len(v), "conditions": s, "diffs": d,
                       "acceptance": dict(zip(("none_in_range", "relevant_gain_ge_0.30", "shuffled_not_above_none"),
                                              ok))}
    return out


def print_table(domains: dict) -> None:
    for domain, m in domains.items():
        s, d, ok = m["conditions"], m["diffs"], m["acceptance"]
        print(f"{domain} ({m['n_tasks']} val tasks)")
        for c in CONDITIONS:
            print(f"  {c:9s} {s[c]['mean']:.3f}  95% CI [{s[c]['ci_low']:.3f}, {s[c]['ci_high']:.3f}]")
        for k, x in d.items():
            print(f"  {k:18s} {x['diff']:+.3f}  95% CI [{x['ci_low']:+.3f}, {x['ci_high']:+.3f}]  p={x['p']:.2g}")
        print("  acceptance: " + "; ".join(f"{k} {v}" for k, v in ok.items()) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", default=str(REPO / "params.yaml"))
    ap.add_argument("--profile", default=None)
    ap.add_argument("--base-dir", default=None, help="a base stage output dir (holding model/); default: train here")
    ap.add_argument("--n-ret", type=int, default=None, help="experiences per context (default: train.n_ret)")
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)

    from lopd.config import load_params
    from lopd.data import generate_splits
    from lopd.engine.evaluation import make_envs
    from lopd.kernels import seed_everything

    params = load_params(a.params, a.profile)
    seed_everything(params.base.seed, params.model.torch_threads)
    n_ret = a.n_ret or params.train.n_ret
    envs = make_envs(params)
    splits = generate_splits(params.envs)
    model, fmt, info = load_or_train(params, envs, a.base_dir)
    print(f"base policy: {info}")
    print(f"profile {a.profile or '(default)'}; null_world={params.envs.null_world}; n_ret={n_ret}; "
          f"samples/task={a.samples}; T={params.evaluate.temperature}\n")
    t0 = time.time()
    domains = measure(params, model, fmt, envs, splits, n_ret, a.samples, a.seed)
    print_table(domains)
    print(f"measured in {time.time() - t0:.0f} s")
    if a.json:
        out = {"info": info, "n_ret": n_ret, "samples": a.samples, "null_world": params.envs.null_world,
               "domains": domains}
        Path(a.json).write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
