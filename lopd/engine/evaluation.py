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
from typing import TYPE_CHECKING

from lopd.envs import make_env
from lopd.envs.base import Task
from lopd.errors import BadInput
from lopd.engine.rollout import Rollout, RowMembers, rollout_batch
from lopd.engine.sampling import derive_seed

if TYPE_CHECKING:
    from lopd.config import Params


def make_envs(params: Params) -> dict:
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
    return evaluate_members(model, fmt, envs, tasks, seeds=[seed], max_new_tokens=max_new_tokens, max_len=max_len,
                            batch_size=batch_size, greedy=greedy, temperature=temperature,
                            samples_per_task=samples_per_task, progress=progress)[0]


def evaluate_members(model, fmt, envs: dict, tasks: list[Task], *, seeds: list[int], max_new_tokens: int,
                     max_len: int, batch_size: int = 64, greedy: bool = True, temperature: float = 1.0,
                     samples_per_task: int = 1, route=None, adapters: list[str] | None = None,
                     progress=None) -> list[dict]:
    """:func:`evaluate_policy` of several policies at once, one per entry of ``seeds`` (member ``i``
    evaluated with seed ``seeds[i]``), their rollouts batched together ``batch_size`` rows at a time.

    ``route(members)``, for policies that share ``model`` (population members,
    :mod:`lopd.model.members`), is a context manager around each batch, given each row's member; it
    yields the ``on_rows`` callback that routes the engine's rows through the Hugging Face forward;
    ``adapters`` (member ``i``'s adapter name) lets the lean decoder route them instead
    (:class:`~lopd.engine.rollout.RowMembers`). Without ``route`` there is one policy (``model`` as it
    is). Returns one summary per member.
    """
    from contextlib import nullcontext

    if samples_per_task < 1:
        raise BadInput(f"evaluate.samples_per_task must be >= 1 (got {samples_per_task})")
    if len({t.task_id for t in tasks}) != len(tasks):
        raise BadInput("evaluation tasks must have distinct task_ids (a task's samples are keyed by its id)")
    if route is None and len(seeds) != 1:
        raise ValueError("several members share the model only through a route")
    n = 1 if greedy else samples_per_task
    jobs = [(i, t, k) for i in range(len(seeds)) for t in tasks for k in range(n)]
    was_training = model.training
    model.eval()
    rollouts: list[Rollout] = []
    for at in range(0, len(jobs), batch_size):
        chunk = jobs[at:at + batch_size]
        owner = [i for i, _, _ in chunk]
        with (route(owner) if route is not None else nullcontext()) as on_rows:
            routed = {}
            if on_rows is not None:
                routed = ({"on_rows": on_rows, "members": RowMembers(adapters, owner)} if adapters is not None
                          else {"engine": "hf", "on_rows": on_rows})
            rollouts += rollout_batch(model, fmt, envs, [t for _, t, _ in chunk], max_new_tokens=max_new_tokens,
                                      max_len=max_len, greedy=greedy, temperature=temperature,
                                      seeds=[sample_seed(seeds[i], t.task_id, k) for i, t, k in chunk], **routed)
        if progress is not None:
            progress()
    if was_training:
        model.train()
    per_member = len(tasks) * n
    outs = []
    for i in range(len(seeds)):
        out = summarize_rollouts(rollouts[i * per_member:(i + 1) * per_member])
        out["samples_per_task"] = n
        outs.append(out)
    return outs


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
