"""The registered confirmation's false-claim rates and power, by simulating the procedure itself.

The procedure (:mod:`lopd.analysis.confirmation`): the rule's arms trained at every point of S on the same
fresh seeds, base evaluated once, and :func:`lopd.analysis.confirmation.decide_amended` deciding the primary
(the rule on per-seed values averaged over S) and the label "robust to selection" (the primary holds and the
rule holds at every point). :func:`simulate_points` draws per-seed mean test rewards for it from the
project's binary-reward model (:mod:`lopd.analysis.calibration`, ``report.design``) extended to points;
:func:`procedure_counts` counts the claims over many simulated experiments; :func:`procedure_rates` runs
the global null, each least favourable boundary of the intersection–union rule and the registered effect,
each rate with its Clopper–Pearson 95% interval (:func:`cp_row`).

Randomness only through ``numpy.random.default_rng``.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from lopd.analysis.calibration import uses_upstream_draw
from lopd.analysis.confirmation import decide_amended
from lopd.analysis.falsification import Rule
from lopd.arms import get_arm

CLAIMS = ("primary", "robust")  # the primary claim; the label "robust to selection"
GLOBAL_NULL = "global null"
BOUNDARY = "least favourable boundary"
FAR = 0.25  # a contrast "far above 0": its test rejects in ≥ 0.999 of experiments under the default design
CHUNK_BYTES = 256 * 2**20  # the simulated samples of one chunk of experiments (uniforms and their outcomes)


def simulate_points(effects: Mapping[str, float], model, *, n_points: int, n_seeds: int, n_exp: int,
                    rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    """Per-seed mean test reward of every arm in ``effects`` at each of ``n_points`` points of S:
    ``out[j][arm]`` of shape (n_exp, n_seeds).

    Model (``model`` = ``report.design``), per experiment, as :func:`lopd.analysis.calibration.simulate_seed_means`
    with per-seed draws, at every point: test task t has base success probability q_t ~ U(task_reward_low,
    task_reward_high), shared by every arm, seed and point; arm a at point j with seed s succeeds on it with
    p = clip(q_t + effects[a] + e + g_{a,s}, 0, 1), where

    * e = e_{a,j,s} ~ N(0, seed_sd) for a trained arm, its own at each point (a point is a separate training
      run); for an arm that does not train (``get_arm(a).trains`` False: base) e = e_{a,s}, one run per seed
      shared by every point, so its array is the same object at every point;
    * g_{a,s} = draw_sd·(√c·z_s + √(1−c)·z_{a,s}), z ~ N(0, 1), c = draw_corr, for an arm that uses the bank
      and φ0 (:func:`lopd.analysis.calibration.uses_upstream_draw`), else 0: seed s's draw, shared by the arms
      that use it and by every point;
    * K = samples_per_task binary rewards per task, sample k of task t on seed s being 1[U_{s,t,k} < p] with
      one uniform U shared by every arm and point (common random numbers).

    The value is the mean over the n_tasks × K rewards."""
    T, K = model.n_tasks, model.samples_per_task
    q = rng.uniform(model.task_reward_low, model.task_reward_high, size=(n_exp, 1, 1, T)).astype(np.float32)
    u = rng.random(size=(n_exp, n_seeds, K, T), dtype=np.float32)
    unit = (n_exp, n_seeds, 1, 1)
    shared = rng.normal(size=unit)
    outcome = np.empty(u.shape, dtype=bool)
    c = model.draw_corr

    def mean_reward(shift: np.ndarray) -> np.ndarray:
        np.less(u, np.clip(q + shift.astype(np.float32), 0.0, 1.0), out=outcome)
        return outcome.view(np.uint8).reshape(n_exp, n_seeds, -1).sum(axis=-1, dtype=np.int32) / (T * K)

    out: list[dict[str, np.ndarray]] = [{} for _ in range(n_points)]
    for arm, effect in effects.items():
        own = rng.normal(size=unit)  # drawn for every arm: an arm's stream does not depend on the others'
        g = model.draw_sd * (np.sqrt(c) * shared + np.sqrt(1 - c) * own) if uses_upstream_draw(arm) else 0.0
        if get_arm(arm).trains:
            for point in out:
                point[arm] = mean_reward(effect + g + rng.normal(0.0, model.seed_sd, size=unit))
        else:
            once = mean_reward(effect + g + rng.normal(0.0, model.seed_sd, size=unit))
            for point in out:
                point[arm] = once
    return out


def arm_effects(rule: Rule, contrasts: Mapping[str, float]) -> dict[str, float]:
    """Arm effects whose rule contrasts (Σ_a w_a·effect_a per test) equal ``contrasts[test name]``: the
    minimum-norm solution, shifted so the smallest effect is 0 (every contrast's weights sum to 0, so a
    common shift changes none). :class:`ValueError` if no effects give those contrasts."""
    tests, arms = rule.tests(), rule.arms()
    w = np.array([[t.weights.get(a, 0.0) for a in arms] for t in tests])
    target = np.array([float(contrasts[t.name]) for t in tests])
    e = np.linalg.lstsq(w, target, rcond=None)[0]
    if not np.allclose(w @ e, target, atol=1e-9):
        raise ValueError(f"no arm effects give the rule's contrasts {dict(contrasts)}")
    return {a: float(x) for a, x in zip(arms, e - e.min())}


def procedure_counts(rule: Rule, effects: Mapping[str, float], model, *, n_points: int, n_seeds: int, n_exp: int,
                     seed: int = 0, at_zero: str | None = None) -> dict[str, int]:
    """Over ``n_exp`` experiments of :func:`simulate_points` (chunked so one chunk's samples take about
    ``CHUNK_BYTES``), how many times the procedure claims: ``primary`` (the rule on the values averaged over
    S) and ``robust`` (the primary and the rule at every point). With ``at_zero`` (a test's name), also how
    many times every other test rejects: ``others_primary`` on the average, ``others_robust`` on the average
    and at every point. The t-tests decide (:func:`decide_amended` with ``sign_flip=False``)."""
    rng = np.random.default_rng(seed)
    per_exp = n_seeds * model.n_tasks * model.samples_per_task * 5  # float32 uniform + bool outcome
    chunk = max(1, CHUNK_BYTES // per_exp)
    others = [t.name for t in rule.tests() if t.name != at_zero]
    counts = {"n": int(n_exp), "primary": 0, "robust": 0, "others_primary": 0, "others_robust": 0}
    for start in range(0, n_exp, chunk):
        by_point = simulate_points(effects, model, n_points=n_points, n_seeds=n_seeds,
                                   n_exp=min(chunk, n_exp - start), rng=rng)
        am = decide_amended(by_point, rule, sign_flip=False)
        primary = am["primary"]["claim"]
        counts["primary"] += int(np.count_nonzero(primary))
        counts["robust"] += int(np.count_nonzero(primary & am["every"]))
        if at_zero is not None:
            on_avg = np.logical_and.reduce([am["primary"]["reject"][n] for n in others])
            everywhere = np.logical_and.reduce([on_avg, *(p["reject"][n] for p in am["points"] for n in others)])
            counts["others_primary"] += int(np.count_nonzero(on_avg))
            counts["others_robust"] += int(np.count_nonzero(everywhere))
    return counts


def cp_row(k: int, n: int) -> dict:
    """k of n with the share and its exact (Clopper–Pearson) two-sided 95% interval."""
    from scipy import stats

    ci = stats.binomtest(int(k), int(n)).proportion_ci(0.95, method="exact")
    return {"k": int(k), "n": int(n), "rate": k / n, "ci_low": float(ci.low), "ci_high": float(ci.high)}


def procedure_rates(rule: Rule, model, *, n_points: int, n_seeds: int, effect: float, n_exp: int,
                    far: float = FAR, seed: int = 0) -> dict:
    """The procedure's false-claim rates and power, ``n_exp`` experiments per scenario (each its own stream).

    * ``false_claim``: at the global null (every contrast 0) and at each least favourable boundary (the
      test ``test_at_0`` at 0, every other contrast at ``far``: for an intersection–union rule the nulls
      where its rate is largest), one row per claim (``primary``, ``robust``): scenario, test_at_0, k, n,
      rate, ci_low, ci_high (:func:`cp_row`), and ``others_reject`` (at a boundary the share of experiments
      in which every other test rejected, on the average for the primary, also at every point for the
      robust label; None at the global null);
    * ``procedure_power``: every contrast at ``effect``, one row per claim: claim, effect, k, n, rate,
      ci_low, ci_high;
    * ``procedure``: what was simulated (n_exp, n_seeds, n_points, far, seed and the model's parameters)."""
    names = [t.name for t in rule.tests()]
    scenarios = [(GLOBAL_NULL, None, dict.fromkeys(names, 0.0))]
    scenarios += [(BOUNDARY, n, {m: (0.0 if m == n else far) for m in names}) for n in names]
    kw = dict(n_points=n_points, n_seeds=n_seeds, n_exp=n_exp)
    false_claim = []
    for i, (scenario, at_zero, contrasts) in enumerate(scenarios):
        c = procedure_counts(rule, arm_effects(rule, contrasts), model, seed=seed + i, at_zero=at_zero, **kw)
        for claim in CLAIMS:
            others = None if at_zero is None else c[f"others_{claim}"] / c["n"]
            false_claim.append({"claim": claim, "scenario": scenario, "test_at_0": at_zero,
                                **cp_row(c[claim], c["n"]), "others_reject": others})
    c = procedure_counts(rule, arm_effects(rule, dict.fromkeys(names, effect)), model, seed=seed + len(scenarios),
                         **kw)
    power = [{"claim": claim, "effect": float(effect), **cp_row(c[claim], c["n"])} for claim in CLAIMS]
    keys = ("seed_sd", "draw_sd", "draw_corr", "n_tasks", "samples_per_task", "task_reward_low", "task_reward_high")
    return {"false_claim": false_claim, "procedure_power": power,
            "procedure": {"n_exp": int(n_exp), "n_seeds": int(n_seeds), "n_points": int(n_points), "far": float(far),
                          "seed": int(seed), "model": {k: getattr(model, k) for k in keys}}}
