"""The starting policy.

For the tiny default model: build a word-level tokenizer from the environments' vocabulary,
build a tiny causal LM from a config, and train it from scratch (all weights, next-token
NLL on the assistant's tokens only) on demonstrations of a scripted solver in the
**pretraining worlds** — never in the target worlds the splits use, so the base policy
does not know any target world's conventions. Each demonstration carries, in its text
context (:meth:`lopd.model.chat.ChatFormat.join_context`, the same rendering the
``opsd_text`` teacher sees), ``n`` successful trajectories of *other* tasks of the same
world, ``n`` drawn from ``base.context_probs``: the policy learns to copy a world's
conventions from experience, and without experience to guess them. The demonstrations are
imperfect on purpose — each action is corrupted with probability ``base.noise`` and a
demonstration is truncated with probability ``base.truncate_prob`` — so the base policy
keeps headroom even when its context shows the conventions.

For a real model (``model.name_or_path`` set) nothing is trained: the stage records the
model directory's hash.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from lopd.envs.base import Task, world_key
from lopd.envs.tool import run_actions
from lopd.model.chat import ChatFormat
from lopd.training.objectives import sft_loss, token_logprobs
from lopd.model.chat import pad_sequences

if TYPE_CHECKING:
    from lopd.config import Params


Messages = list[tuple[str, str]]


@dataclass
class Demo:
    """One pretraining sequence: a text context of successful same-world trajectories, then
    the demonstration the loss is on."""

    context: list[Messages]
    messages: Messages
    task_id: str = ""
    context_task_ids: tuple[str, ...] = ()


def trajectory(env, task: Task, actions: list[str]) -> Messages:
    """The message list of ``actions`` played in ``task`` (single-turn domains are not run:
    they have no observation to collect)."""
    if env.max_turns == 1:
        return [("user", task.prompt), ("assistant", actions[0] if actions else "")]
    msgs, _ = run_actions(env, task, actions)
    return msgs


def pretraining_seed(envs_seed: int, domain_index: int) -> int:
    """Generator seed of a domain's pretraining tasks (the splits use ``seed*1000 + 10*s + d``;
    pretraining task ids carry a ``p`` tag as well, so the two can never collide)."""
    return envs_seed * 1000 + 500 + domain_index


def sample_context_size(rng: random.Random, probs: list[float]) -> int:
    """``n`` with probability ``probs[n]``."""
    u, acc = rng.random(), 0.0
    for n, p in enumerate(probs):
        acc += p
        if u < acc:
            return n
    return len(probs) - 1


def pretraining_demos(envs: dict, bp, envs_seed: int) -> list[Demo]:
    """``base.demos_per_task`` noisy demonstrations of each of ``base.tasks_per_world`` tasks in
    every pretraining world of every domain, each after a context of ``n ~ context_probs``
    clean (successful) trajectories of other tasks of the same world."""
    rng = random.Random(bp.seed)
    demos: list[Demo] = []
    for d_i, (domain, env) in enumerate(envs.items()):
        n_worlds = len(env.worlds["pretrain"])
        tasks = env.generate(pretraining_seed(envs_seed, d_i), n_worlds * bp.tasks_per_world, pool="pretrain")
        by_world: dict[tuple, list[Task]] = defaultdict(list)
        for t in tasks:
            by_world[world_key(t)].append(t)
        clean = {t.task_id: trajectory(env, t, env.solve(t)) for t in tasks}
        for t in tasks:
            peers = [u for u in by_world[world_key(t)] if u.task_id != t.task_id]
            for _ in range(bp.demos_per_task):
                n = min(sample_context_size(rng, bp.context_probs), len(peers))
                chosen = rng.sample(peers, n)
                context = [clean[u.task_id] for u in chosen]
                actions = env.solve(t, rng, bp.noise)
                if actions and rng.random() < bp.truncate_prob:
                    actions = actions[: rng.randrange(len(actions))] or actions[:1]
                demos.append(Demo(context, trajectory(env, t, actions), t.task_id, tuple(u.task_id for u in chosen)))
    rng.shuffle(demos)
    return demos


def encode_demo(fmt: ChatFormat, demo: Demo, context_loss: bool) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of a demo: its context (:meth:`ChatFormat.context_ids`) then its own
    trajectory. The loss is on the demo's assistant tokens and, with ``context_loss``, also on
    the context trajectories' assistant tokens — each one is then a demonstration of a success
    conditioned on the same-world successes before it (more supervision per token, as in
    language-model pretraining on documents)."""
    ids, mask = fmt.encode_with_context(demo.context, demo.messages)
    if context_loss:
        ctx_mask: list[int] = []
        for msgs in demo.context:
            own_ids, own_mask = fmt.encode_messages(msgs)
            ctx_mask += [0] * len(fmt.exp) + own_mask[len(own_ids) - len(fmt.experience_ids(msgs)):]
        mask = ctx_mask + mask[len(ctx_mask):]
    return ids, mask


def length_batches(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Indices grouped into batches of similar length (sorted by length, then chunked), so a
    batch pads little; training draws one of them at random per step."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def lr_factor(step: int, steps: int, warmup: int = 20, decay_frac: float = 0.2) -> float:
    """Warm-up, stable, decay: ``(step+1)/warmup`` over the first ``warmup`` steps, then 1, then a
    linear decay over the last ``decay_frac`` of the run down to 0.05. (Reading experience is
    learnt late, after a plateau: a rate that stays high until then learns it in fewer steps
    than one decaying from the start.)"""
    warm = min(1.0, (step + 1) / warmup)
    start = (1 - decay_frac) * steps
    if step < start:
        return warm
    return warm * max(0.05, (steps - step) / (steps - start))


def train_on_demos(model, fmt: ChatFormat, demos: list[Demo], *, steps: int, batch_size: int,
                   lr: float, seed: int, context_loss: bool = False, on_step=None) -> list[float]:
    """Next-token NLL (token mean) on the supervised tokens of ``demos`` (:func:`encode_demo`),
    AdamW at :func:`lr_factor` × ``lr``, gradient norm clipped at 1; returns the loss per step."""
    device = next(model.parameters()).device
    encoded = [encode_demo(fmt, d, context_loss) for d in demos]
    batches = length_batches([len(e[0]) for e in encoded], batch_size)
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, steps))
    losses = []
    model.train()
    for step in range(steps):
        idx = batches[int(torch.randint(len(batches), (1,), generator=g))]
        ids, attn = pad_sequences([encoded[i][0] for i in idx], fmt.pad_id, device)
        gmask, _ = pad_sequences([encoded[i][1] for i in idx], 0, device)
        logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1]
        loss = sft_loss(token_logprobs(logits, ids[:, 1:]), gmask[:, 1:].float())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
    model.eval()
    return losses


def train_base_policy(params: Params, envs: dict, on_step=None):
    """Build the tokenizer and the tiny model from ``params`` and pretrain it on
    :func:`pretraining_demos`; returns ``(model, tokenizer, info)`` (info: number of demos,
    final loss, number of parameters, the losses)."""
    from lopd.model.backbone import build_tiny_model, resolve_device
    from lopd.model.tokenizer import build_tokenizer, env_vocabulary

    bp = params.base
    tok = build_tokenizer(env_vocabulary(params.envs.domains, params.envs))
    model = build_tiny_model(params.model, tok, seed=bp.seed).to(resolve_device(params.model))
    demos = pretraining_demos(envs, bp, params.envs.seed)
    losses = train_on_demos(model, ChatFormat(tok), demos, steps=bp.steps, batch_size=bp.batch_size, lr=bp.lr,
                            seed=bp.seed, context_loss=bp.context_loss, on_step=on_step)
    info = {"n_demos": len(demos), "final_loss": losses[-1], "n_params": sum(p.numel() for p in model.parameters()),
            "losses": losses}
    return model, tok, info


def save_base(model, tokenizer, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))
