"""Evaluation of a policy alone: no retrieval, no latents, no composer.

Batched multi-turn rollouts (with the KV cache), greedy or sampled; returns per-task rewards
and the mean reward per domain.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from lopd.envs import make_env
from lopd.envs.base import Task
from lopd.rollout import Rollout, rollout_batch


def make_envs(params) -> dict:
    return {d: make_env(d, params.envs) for d in params.envs.domains}


def evaluate_policy(model, fmt, envs: dict, tasks: list[Task], *, max_new_tokens: int, max_len: int,
                    batch_size: int = 64, greedy: bool = True, temperature: float = 1.0, seed: int = 0,
                    progress=None) -> dict:
    """Roll ``model`` out once on every task; returns ``{"per_task": [...], "by_domain": {...},
    "mean": float}``. ``model`` must already be in its student mode."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    was_training = model.training
    model.eval()
    rollouts: list[Rollout] = []
    for i in range(0, len(tasks), batch_size):
        rollouts += rollout_batch(model, fmt, envs, tasks[i:i + batch_size], max_new_tokens=max_new_tokens,
                                  max_len=max_len, greedy=greedy, temperature=temperature, generator=gen)
        if progress is not None:
            progress()
    if was_training:
        model.train()
    return summarize_rollouts(rollouts)


def summarize_rollouts(rollouts: list[Rollout]) -> dict:
    by_dom: dict[str, list[float]] = defaultdict(list)
    per_task = []
    for r in rollouts:
        by_dom[r.task.domain].append(r.reward)
        per_task.append({"task_id": r.task.task_id, "domain": r.task.domain, "family": r.task.family,
                         "reward": r.reward})
    by_domain = {d: sum(v) / len(v) for d, v in sorted(by_dom.items())}
    mean = sum(by_domain.values()) / len(by_domain) if by_domain else float("nan")
    return {"per_task": per_task, "by_domain": by_domain, "mean": mean}
