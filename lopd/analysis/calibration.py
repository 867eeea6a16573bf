"""Calibration of the falsification rule by simulation: how often it claims a content-driven gain.

:func:`simulate_seed_means` draws per-(arm, seed, task, sample) rewards from a model with task effects, a
training-seed random effect and sampling noise, and returns each arm's per-seed mean test reward in many
simulated experiments at once; :func:`claim_rates` runs :func:`lopd.analysis.falsification.decide` (the
report's own verdict) on them. :func:`scenarios` names the configurations the tests check: nulls (no
content effect, including the intersection–union test's least favourable one) and the planted effect the
default design (``report.design``) is sized for.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from lopd.analysis.falsification import Rule, decide


def simulate_seed_means(effects: Mapping[str, float], design, *, n_exp: int, n_seeds: int | None = None,
                        seed: int = 0) -> dict[str, np.ndarray]:
    """Per-seed mean test reward of every arm in ``effects``, shape (n_exp, n_seeds).

    Model, per experiment: task t succeeds with base probability q_t ~ U(task_reward_low, task_reward_high)
    (the same test tasks for every arm and seed: task effects); arm a trained with seed s succeeds on it
    with p = clip(q_t + effects[a] + e_{a,s}, 0, 1), e_{a,s} ~ N(0, seed_sd) independent per arm and seed
    (training randomness); each task is evaluated with K = samples_per_task samples under common random
    numbers: sample k of task t on seed s is 1[U_{s,t,k} < p] with one uniform U shared by all arms."""
    rng = np.random.default_rng(seed)
    n_seeds = design.n_seeds if n_seeds is None else n_seeds
    shape = (n_exp, n_seeds, design.n_tasks)
    q = rng.uniform(design.task_reward_low, design.task_reward_high, size=(n_exp, 1, design.n_tasks))
    u = rng.random(size=(*shape, design.samples_per_task))
    out = {}
    for arm, effect in effects.items():
        e = rng.normal(0.0, design.seed_sd, size=(n_exp, n_seeds, 1))
        p = np.clip(q + effect + e, 0.0, 1.0)
        out[arm] = (u < p[..., None]).mean(axis=(2, 3))
    return out


def scenarios(rule: Rule, effect: float, strong: float = 3.0) -> dict[str, dict[str, float]]:
    """Arm effects (added to every task's success probability) for the calibration scenarios.

    * ``global_null``: every arm equal;
    * ``content_null``: the treatment beats the gain_over arms by ``strong·effect`` and the controls
      equal it (part (i) true, part (ii) false);
    * ``least_favourable``: as content_null, but only the first control equals the treatment and the
      others are ``strong·effect`` below it, so every test but one is almost sure to reject: the
      configuration where an intersection–union test's level is closest to α;
    * ``design``: the treatment beats every other arm by ``effect`` (content explains all of the gain).
    """
    g = strong * effect
    t, gain, ctrl = rule.treatment, rule.gain_over, rule.content_controls
    rho_base = {rule.rho_baseline: 0.0} if rule.rho is not None else {}
    others = {a: 0.0 for a in (*gain, *ctrl)} | rho_base
    return {
        "global_null": {t: 0.0, **others},
        "content_null": {t: g, **others, **{c: g for c in ctrl}},
        "least_favourable": {t: g, **others, ctrl[0]: g},
        "design": {t: effect, **others},
    }


def claim_rates(rule: Rule, effects: Mapping[str, float], design, *, n_exp: int, n_seeds: int | None = None,
                seed: int = 0) -> dict[str, float]:
    """Fraction of ``n_exp`` simulated experiments in which each verdict component holds: ``claim``,
    ``gain``, ``content`` (t-tests) and their ``*_robust`` (sign-flip) counterparts."""
    values = simulate_seed_means(effects, design, n_exp=n_exp, n_seeds=n_seeds, seed=seed)
    v = decide(values, rule)
    keys = ("claim", "gain", "content", "claim_robust", "gain_robust", "content_robust")
    return {k: float(np.mean(v[k])) for k in keys} | {"n_exp": n_exp}
