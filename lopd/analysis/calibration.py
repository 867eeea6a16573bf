"""Calibration of the falsification rule by simulation: how often it claims a content-driven gain.

:func:`simulate_seed_means` draws per-(arm, seed, task, sample) rewards from a model with task effects, a
training-seed random effect, an upstream-draw random effect (the experience bank and φ0, shared by the arms
that use them) and sampling noise, and returns each arm's per-seed mean test reward in many simulated
experiments at once; :func:`claim_rates` runs :func:`lopd.analysis.falsification.decide` (the
report's own verdict) on them. :func:`scenarios` names the configurations the tests check: nulls (no
content effect, including the intersection–union test's least favourable one) and the planted effect the
default design (``report.design``) is sized for.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from lopd.analysis.falsification import Rule, decide
from lopd.arms import get_arm


def uses_upstream_draw(arm: str) -> bool:
    """Whether ``arm`` reads the experience bank and φ0 (any teacher context): the arms a draw shifts."""
    return get_arm(arm).context != "none"


def simulate_seed_means(effects: Mapping[str, float], design, *, n_exp: int, n_seeds: int | None = None,
                        seed: int = 0, per_seed_draws: bool = True) -> dict[str, np.ndarray]:
    """Per-seed mean test reward of every arm in ``effects``, shape (n_exp, n_seeds).

    Model, per experiment: task t succeeds with base probability q_t ~ U(task_reward_low, task_reward_high)
    (the same test tasks for every arm and seed: task effects); arm a trained with seed s succeeds on it
    with p = clip(q_t + effects[a] + e_{a,s} + g_{a,d(s)}, 0, 1), where e_{a,s} ~ N(0, seed_sd) independent
    per arm and seed (training randomness) and g is the upstream draw's effect: for an arm that uses the bank
    and φ0 (:func:`uses_upstream_draw`), g_{a,d} = draw_sd·(√c·z_d + √(1−c)·z_{a,d}), z ~ N(0, 1),
    c = draw_corr (the arms that share draw d are correlated through z_d; every such arm's shift has sd
    draw_sd, and the contrast of two of them has sd draw_sd·√(2(1−c))); g = 0 for an arm that does not. The draw d(s) is the
    seed's own with ``per_seed_draws`` (g enters each (arm, seed) unit), else one draw shared by every seed of
    the experiment (g shifts all its seeds alike). Each task is evaluated with K = samples_per_task samples
    under common random numbers: sample k of task t on seed s is 1[U_{s,t,k} < p] with one uniform U shared
    by all arms."""
    rng = np.random.default_rng(seed)
    n_seeds = design.n_seeds if n_seeds is None else n_seeds
    shape = (n_exp, n_seeds, design.n_tasks)
    draws = (n_exp, n_seeds if per_seed_draws else 1, 1)
    q = rng.uniform(design.task_reward_low, design.task_reward_high, size=(n_exp, 1, design.n_tasks))
    u = rng.random(size=(*shape, design.samples_per_task))
    shared = rng.normal(size=draws)
    out = {}
    for arm, effect in effects.items():
        e = rng.normal(0.0, design.seed_sd, size=(n_exp, n_seeds, 1))
        own = rng.normal(size=draws)  # drawn for every arm: an arm's stream does not depend on the others'
        g = design.draw_sd * (np.sqrt(design.draw_corr) * shared + np.sqrt(1 - design.draw_corr) * own)
        p = np.clip(q + effect + e + (g if uses_upstream_draw(arm) else 0.0), 0.0, 1.0)
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
                seed: int = 0, per_seed_draws: bool = True) -> dict[str, float]:
    """Fraction of ``n_exp`` simulated experiments in which each verdict component holds: ``claim``,
    ``gain``, ``content`` (t-tests) and their ``*_robust`` (sign-flip) counterparts."""
    values = simulate_seed_means(effects, design, n_exp=n_exp, n_seeds=n_seeds, seed=seed,
                                 per_seed_draws=per_seed_draws)
    v = decide(values, rule)
    keys = ("claim", "gain", "content", "claim_robust", "gain_robust", "content_robust")
    return {k: float(np.mean(v[k])) for k in keys} | {"n_exp": n_exp}


NULLS = ("global_null", "content_null", "least_favourable")


def design_rates(rule: Rule, design, *, per_seed_draws: bool, n_seeds: int | None = None,
                 seed: int = 0) -> dict[str, float]:
    """The full rule's claim rate in every :func:`scenarios` configuration at ``design.effect``, over
    ``design.n_sim`` simulated experiments each: under the :data:`NULLS` it is the false-claim rate, under
    ``design`` the power."""
    return {name: claim_rates(rule, effects, design, n_exp=design.n_sim, n_seeds=n_seeds, seed=seed,
                              per_seed_draws=per_seed_draws)["claim"]
            for name, effects in scenarios(rule, design.effect).items()}
