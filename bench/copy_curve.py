"""When does the base policy learn to copy each convention from experience? Pretrains the base
policy in process, exactly as the ``base`` stage does (same function, same params), and every
``--every`` steps prints, per domain, family and convention slot, the mean probability the model
gives the right convention word, teacher-forced, on held-out tasks of the *pretraining* worlds
(a generator seed pretraining never uses) with two clean same-world trajectories in the text
context (:meth:`lopd.model.chat.ChatFormat.join_context`, the rendering pretraining uses). Chance
is ``1 / envs.n_options``; a slot whose copy has been learnt sits near 1.

    python bench/copy_curve.py [--profile P.yaml] [--every 500] [--tasks 48] [--json out.json]

This is how the tool domain's per-family pools were found to be the obstacle: with a key and a
unit pool of its own per family, after the family's own tool name, each of the 8 (family, slot)
pairs was learnt separately, abruptly, at its own step (2000, 2500, 2500, 4000 and later), while
the code domain's two slots, whose options every family shares, were learnt once for all.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def probe_items(envs: dict, fmt, envs_seed: int, per_domain: int) -> list[tuple[str, str, str, list[int], int]]:
    """(domain, family, slot, prefix ids, id of the right word): one item per hidden slot of each
    held-out task, the prefix ending just before the slot's word in the task's own solution."""
    from lopd.training.base_policy import pretraining_seed, trajectory
    from lopd.envs.base import world_key

    items = []
    for d_i, (domain, env) in enumerate(envs.items()):
        n_worlds = len(env.worlds["pretrain"])
        # 3 tasks per world (tasks go round-robin over the worlds) from a seed pretraining never draws
        tasks = env.generate(pretraining_seed(envs_seed, d_i) + 77, 3 * n_worlds, pool="pretrain")
        by_world: dict[tuple, list] = defaultdict(list)
        for t in tasks:
            by_world[world_key(t)].append(t)
        groups = [g for g in by_world.values() if len(g) >= 3][:per_domain]
        for t, *peers in groups:
            ctx = [trajectory(env, u, env.solve(u)) for u in peers[:2]]
            ids, gen_mask = fmt.encode_with_context(ctx, trajectory(env, t, env.solve(t)))
            first_gen = gen_mask.index(1)
            hidden = {s: o for s, o in t.spec["conventions"].items() if len(env_slot_options(env, t, s)) > 1}
            for slot, word in sorted(hidden.items()):
                wid = fmt.words(word)[0]
                pos = next(i for i in range(first_gen, len(ids)) if ids[i] == wid and gen_mask[i])
                items.append((domain, t.family, slot, ids[:pos], wid))
    return items


def env_slot_options(env, task, slot: str) -> list[str]:
    """The options a world of ``task``'s family draws ``slot`` from (first ``n_options``)."""
    n = env.world_cfg.n_options
    if task.domain == "tool":
        from lopd.envs.tool_families import FAMILIES

        return FAMILIES[task.family].pools[slot][:n]
    from lopd.envs.code import SLOTS

    return SLOTS[slot][:n]


def copy_probabilities(model, items) -> dict[str, float]:
    """Mean probability of the right word per ``domain/family/slot``."""
    import torch

    acc: dict[str, list[float]] = defaultdict(list)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for domain, family, slot, prefix, wid in items:
            p = model(input_ids=torch.tensor([prefix])).logits[0, -1].softmax(-1)[wid]
            acc[f"{domain}/{family}/{slot}"].append(float(p))
    model.train(was_training)
    return {k: round(sum(v) / len(v), 3) for k, v in sorted(acc.items())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", default=str(REPO / "params.yaml"))
    ap.add_argument("--profile", default=None)
    ap.add_argument("--every", type=int, default=500)
    ap.add_argument("--tasks", type=int, default=48, help="held-out pretraining-world tasks per domain")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)

    import lopd.training.base_policy as bp
    from lopd.config import load_params
    from lopd.engine.evaluation import make_envs
    from lopd.model.chat import ChatFormat
    from lopd.compat.kernels import seed_everything

    params = load_params(a.params, a.profile)
    seed_everything(params.base.seed, params.model.torch_threads)
    envs = make_envs(params)
    curve: list[dict] = []
    train = bp.train_on_demos

    def probed(model, fmt: ChatFormat, demos, **kw):
        items = probe_items(envs, fmt, params.envs.seed, a.tasks)

        def on_step(step: int, loss: float) -> None:
            if (step + 1) % a.every == 0:
                row = {"step": step + 1, "loss": round(loss, 4), **copy_probabilities(model, items)}
                curve.append(row)
                print(json.dumps(row), flush=True)

        kw.pop("on_step", None)
        return train(model, fmt, demos, on_step=on_step, **kw)

    bp.train_on_demos = probed  # the stage's own pretraining, observed every --every steps
    t0 = time.time()
    bp.train_base_policy(params, envs)
    print(f"pretrained in {time.time() - t0:.0f} s (probes included); chance = {1 / params.envs.n_options:.2f}")
    print("first probed step with copy probability >= 0.9 (- = never):")
    for key in [k for k in curve[0] if "/" in k] if curve else []:
        first = next((r["step"] for r in curve if r[key] >= 0.9), None)
        print(f"  {key:28s} {first if first is not None else '-'}   final {curve[-1][key]:.3f}")
    if a.json:
        Path(a.json).write_text(json.dumps(curve, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
