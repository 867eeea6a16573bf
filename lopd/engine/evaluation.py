"""Evaluation of a policy alone: no retrieval, no latents, no composer.

Every task is rolled out ``samples_per_task`` times (once when greedy: the draws would be
identical). Sample ``k`` of task ``t`` is drawn with the sampling seed
``derive_seed(seed, t.task_id, k)`` and the rollout engine keys each random number by
(that seed, position) only, so the draws do not depend on the batch a task lands in, on
the other tasks evaluated, or on the policy being evaluated: two arms evaluated with the
same ``seed`` see *common random numbers* for every (task, sample). A task's reward is the
mean over its samples; the per-sample rewards are kept so the evaluation-noise share of a
seed-to-seed variance can be computed.
"""

from __future__ import annotations

from collections import defaultdict

from lopd.envs import make_env
from lopd.envs.base import Task
from lopd.errors import BadInput
from lopd.engine.rollout import Rollout, rollout_batch
from lopd.engine.sampling import derive_seed


def make_envs(params) -> dict:
    return {d: make_env(d, params.envs) for d in params.envs.domains}


def sample_seed(seed: int, task_id: str, sample: int) -> int:
    """The sampling seed of sample ``sample`` of ``task_id`` in an evaluation seeded ``seed``."""
    return derive_seed("eval", seed, task_id, sample)


def evaluate_policy(model, fmt, envs: dict, tasks: list[Task], *, max_new_tokens: int, max_len: int,
                    batch_size: int = 64, greedy: bool = True, temperature: float = 1.0, seed: int = 0,
                    samples_per_task: int = 1, progress=None) -> dict:
    """Roll ``model`` out ``samples_per_task`` times on every task (once if ``greedy``).

    Returns ``{"per_task": [{task_id, domain, family, reward, rewards}], "by_domain": {...},
    "mean": float, "samples_per_task": n}`` where ``reward`` = mean of the task's per-sample
    ``rewards``, ``by_domain[d]`` = mean of ``reward`` over the domain's tasks and ``mean`` =
    mean over domains. ``model`` must already be in its student mode.
    """
    if samples_per_task < 1:
        raise BadInput(f"evaluate.samples_per_task must be >= 1 (got {samples_per_task})")
    if len({t.task_id for t in tasks}) != len(tasks):
        raise BadInput("evaluation tasks must have distinct task_ids (a task's samples are keyed by its id)")
    n = 1 if greedy else samples_per_task
    jobs = [(t, k) for t in tasks for k in range(n)]
    was_training = model.training
    model.eval()
    rollouts: list[Rollout] = []
    for i in range(0, len(jobs), batch_size):
        chunk = jobs[i:i + batch_size]
        rollouts += rollout_batch(model, fmt, envs, [t for t, _ in chunk], max_new_tokens=max_new_tokens,
                                  max_len=max_len, greedy=greedy, temperature=temperature,
                                  seeds=[sample_seed(seed, t.task_id, k) for t, k in chunk])
        if progress is not None:
            progress()
    if was_training:
        model.train()
    out = summarize_rollouts(rollouts)
    out["samples_per_task"] = n
    return out


def summarize_rollouts(rollouts: list[Rollout]) -> dict:
    """Per-task mean reward over the task's rollouts (in first-seen task order), per-domain
    mean of the per-task means, and the mean over domains."""
    per_sample: dict[str, list[float]] = defaultdict(list)
    first: dict[str, Task] = {}
    for r in rollouts:
        per_sample[r.task.task_id].append(r.reward)
        first.setdefault(r.task.task_id, r.task)
    by_dom: dict[str, list[float]] = defaultdict(list)
    per_task = []
    for tid, t in first.items():
        rewards = per_sample[tid]
        mean = sum(rewards) / len(rewards)
        by_dom[t.domain].append(mean)
        per_task.append({"task_id": tid, "domain": t.domain, "family": t.family, "reward": mean, "rewards": rewards})
    by_domain = {d: sum(v) / len(v) for d, v in sorted(by_dom.items())}
    mean = sum(by_domain.values()) / len(by_domain) if by_domain else float("nan")
    return {"per_task": per_task, "by_domain": by_domain, "mean": mean}
