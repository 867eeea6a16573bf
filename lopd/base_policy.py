"""The starting policy.

For the tiny default model: build a word-level tokenizer from the environments' vocabulary,
build a tiny causal LM from a config, and train it from scratch (all weights, next-token
NLL on the assistant's tokens only) on demonstrations of a scripted solver on **train**
tasks. The demonstrations are imperfect on purpose — each action is corrupted with
probability ``base.noise`` and a demonstration is truncated with probability
``base.truncate_prob`` — so the base policy has headroom for the methods to improve on.

For a real model (``model.name_or_path`` set) nothing is trained: the stage records the
model directory's hash.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from lopd.envs.base import Task
from lopd.envs.tool import run_actions
from lopd.model.chat import ChatFormat
from lopd.training.objectives import sft_loss, token_logprobs
from lopd.rollout import pad_sequences


def demonstrations(envs: dict, tasks: list[Task], per_task: int, noise: float, truncate_prob: float,
                   seed: int) -> list[list[tuple[str, str]]]:
    """Noisy scripted trajectories (message lists) for ``tasks``."""
    rng = random.Random(seed)
    demos = []
    for t in tasks:
        env = envs[t.domain]
        for _ in range(per_task):
            actions = env.solve(t, rng, noise)
            if actions and rng.random() < truncate_prob:
                actions = actions[: rng.randrange(len(actions))] or actions[:1]
            if env.max_turns == 1:  # single-turn domain: no observation to collect, skip running it
                msgs = [("user", t.prompt), ("assistant", actions[0] if actions else "")]
            else:
                msgs, _ = run_actions(env, t, actions)
            demos.append(msgs)
    return demos


def train_on_messages(model, fmt: ChatFormat, demos: list[list[tuple[str, str]]], *, steps: int, batch_size: int,
                      lr: float, seed: int, on_step=None) -> list[float]:
    """Next-token NLL on assistant tokens of ``demos``; returns the loss per step."""
    device = next(model.parameters()).device
    encoded = [fmt.encode_messages(m) for m in demos]
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.05, 1 - s / steps))
    losses = []
    model.train()
    for step in range(steps):
        idx = torch.randint(len(encoded), (batch_size,), generator=g).tolist()
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


def save_base(model, tokenizer, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))
