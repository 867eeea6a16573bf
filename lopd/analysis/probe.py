"""The premise gate: statistics and the pre-registered rule (pure functions).

LOPD rests on a premise: some context makes the frozen teacher better than the student on the
student's own prefixes, and it is the *content* of retrieved experience that does it. The probe
(:func:`lopd.training.cold_start.privilege_probe`) measures, on val tasks, for each condition

    student · relevant · shuffled · unrelated · none · text

(the last five are the teacher with latents from that bank mode, with no context, and with the
raw text of the relevant trajectories)

* **reward**: the condition used as a policy, ``samples_per_task`` rollouts per task with
  common random numbers (same task, same sample index → same sampling seed in every
  condition); one value per task = the mean over its samples;
* **δ**: ``δ_t = log π_T(y_t|s_t, c) − log π_S(y_t|s_t)`` on the student's own rollouts; one
  value per task = the outcome-weighted token mean
  ``Δ_task = Σ_n r_n Σ_t m_{n,t} δ_{n,t} / Σ_n r_n Σ_t m_{n,t}`` over that task's rollouts
  (``Δ(φ)`` of DESIGN §2 restricted to the task; tasks whose rollouts all scored 0 have no
  value). The student's own δ is 0 by definition.

Intervals: two-sided Student-t intervals at ``confidence`` over tasks (``lopd.analysis.stats.summarize``),
of each condition's per-task values and of per-task *paired* differences between conditions.

**Rule** (``premise_holds``), with ``lo(·)`` the lower end of that interval::

    lo(R_relevant − R_student)  > min_margin   and   lo(R_relevant − R_shuffled) > min_margin
    and  lo(Δ_relevant)          > min_delta    and   lo(Δ_relevant − Δ_shuffled) > min_delta

An undefined bound (fewer than two tasks) fails its check.
"""

from __future__ import annotations

import math
from collections import defaultdict

from lopd.analysis.stats import summarize

CONDITIONS = ("student", "relevant", "shuffled", "unrelated", "none", "text")
TEACHERS = CONDITIONS[1:]
REWARD_PAIRS = tuple((c, "student") for c in TEACHERS) + (("relevant", "shuffled"), ("relevant", "unrelated"),
                                                           ("relevant", "none"), ("text", "shuffled"))
DELTA_PAIRS = (("relevant", "shuffled"), ("relevant", "unrelated"), ("relevant", "none"), ("text", "relevant"))


def per_task_reward(rows: list[tuple[str, float]]) -> dict[str, float]:
    """``(task_id, reward)`` rows → mean reward per task."""
    acc: dict[str, list[float]] = defaultdict(list)
    for task, r in rows:
        acc[task].append(float(r))
    return {t: sum(v) / len(v) for t, v in acc.items()}


def per_task_delta(rows: list[tuple[str, float, float, float]]) -> dict[str, float]:
    """``(task_id, reward, Σ_t m·δ, Σ_t m)`` rows (one per rollout) → outcome-weighted Δ per task:
    ``Σ r·Σδ / Σ r·Σm``; tasks with zero weight are left out."""
    num: dict[str, float] = defaultdict(float)
    den: dict[str, float] = defaultdict(float)
    for task, r, dsum, n in rows:
        num[task] += r * dsum
        den[task] += r * n
    return {t: num[t] / den[t] for t in num if den[t] > 0}


def _summary(values: list[float], confidence: float) -> dict:
    if not values:
        return {"n": 0, "mean": math.nan, "ci_low": math.nan, "ci_high": math.nan}
    s = summarize(values, confidence=confidence)
    return {k: s[k] for k in ("n", "mean", "ci_low", "ci_high")}


def compare(per_task: dict[str, dict[str, float]], pairs, confidence: float) -> dict:
    """Per-condition summaries and paired differences over the tasks every condition has."""
    tasks = sorted(set.intersection(*(set(v) for v in per_task.values()))) if per_task else []
    by_cond = {c: _summary([v[t] for t in tasks], confidence) for c, v in per_task.items()}
    paired = {f"{a}-{b}": _summary([per_task[a][t] - per_task[b][t] for t in tasks], confidence)
              for a, b in pairs if a in per_task and b in per_task}
    return {"n_tasks": len(tasks), "by_condition": by_cond, "paired": paired}


def _check(summary: dict | None, threshold: float) -> dict:
    lo = summary["ci_low"] if summary else math.nan
    return {"ci_low": lo, "threshold": threshold, "passed": bool(not math.isnan(lo) and lo > threshold)}


def premise_rule(reward: dict, delta: dict, *, min_margin: float, min_delta: float, confidence: float = 0.95) -> dict:
    """Apply the rule of the module docstring to :func:`compare` outputs for reward and δ."""
    checks = {
        "reward relevant-student": _check(reward["paired"].get("relevant-student"), min_margin),
        "reward relevant-shuffled": _check(reward["paired"].get("relevant-shuffled"), min_margin),
        "delta relevant": _check(delta["by_condition"].get("relevant"), min_delta),
        "delta relevant-shuffled": _check(delta["paired"].get("relevant-shuffled"), min_delta),
    }
    return {"premise_holds": all(c["passed"] for c in checks.values()), "checks": checks,
            "rule": rule_text(min_margin, min_delta, confidence)}


def rule_text(min_margin: float, min_delta: float, confidence: float = 0.95) -> str:
    return (f"premise holds iff the lower ends of the {confidence:.0%} t-intervals over val tasks satisfy: "
            f"reward(relevant - student) > {min_margin}, reward(relevant - shuffled) > {min_margin}, "
            f"delta(relevant) > {min_delta}, delta(relevant - shuffled) > {min_delta} "
            f"(paired per task; common random numbers for rewards; delta outcome-weighted on the student's rollouts)")
