"""Design of the pre-registered tests: power, smallest detectable difference and seeds needed.

* :func:`t_test_power`, :func:`min_detectable_diff`, :func:`seeds_needed`: for the one-sided or
  two-sided paired t-test the verdict runs (:func:`lopd.analysis.stats.t_test`), requiring that the
  exact sign-flip test (:func:`lopd.analysis.stats.min_sign_flip_p`) can reject too;
* :func:`joint_power`, :func:`joint_seeds_needed`: all one-sided tests of an intersection–union rule
  reject, by simulation.

Randomness only through ``numpy.random.default_rng(seed)``; bad input raises :class:`ValueError`.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, stats

from lopd.analysis.stats import as_1d, check_alternative, check_prob, min_sign_flip_p, t_test


def _power_es(effect_size, n, alpha: float, alternative: str):
    """Power of the paired t-test for standardised effect E[d]/sd(d), vectorised in n (noncentral t,
    ncp = effect·√n, df = n − 1). The lower tail is written as an upper tail of −ncp (nct.cdf is nan
    deep in the left tail)."""
    n = np.asarray(n, dtype=float)
    df, ncp = n - 1.0, np.asarray(effect_size, dtype=float) * np.sqrt(n)
    if alternative == "two-sided":
        crit = stats.t.ppf(1.0 - alpha / 2.0, df)
        return stats.nct.sf(crit, df, ncp) + stats.nct.sf(crit, df, -ncp)
    crit = stats.t.ppf(1.0 - alpha, df)
    return stats.nct.sf(crit, df, ncp if alternative == "greater" else -ncp)


def variance_upper_factor(n: int, upper: float) -> float:
    """(n − 1)/χ²_{1−upper, n−1}: the factor that takes a variance estimated from n seeds to its one-sided
    ``upper`` confidence bound (the pilot's covariance at, e.g., its 80% upper bound)."""
    return float((n - 1) / stats.chi2.ppf(1 - upper, n - 1))


def _check_design(alpha, power=None, alternative="greater"):
    check_prob(alpha, "alpha")
    check_alternative(alternative)
    if power is not None and check_prob(power, "power") <= alpha:
        raise ValueError(f"power ({power}) must exceed alpha ({alpha})")


def t_test_power(diff: float, std: float, n: int, *, alpha: float = 0.05, alternative: str = "greater") -> float:
    """Power of the paired t-test (:func:`t_test`) at level α with n seeds, when the per-seed
    differences have mean ``diff`` and standard deviation ``std``; nan for n < 2."""
    _check_design(alpha, None, alternative)
    if not (std > 0 and math.isfinite(std)) or not math.isfinite(diff):
        raise ValueError(f"std must be positive and finite and diff finite, got std={std}, diff={diff}")
    if int(n) != n or n < 1:
        raise ValueError(f"n must be a positive integer, got {n}")
    return math.nan if n < 2 else float(_power_es(diff / std, int(n), alpha, alternative))


def min_detectable_diff(std: float, n: int, *, alpha: float = 0.05, power: float = 0.8,
                        alternative: str = "greater") -> float:
    """Smallest E[d] ≥ 0 that the paired t-test detects with probability ``power`` (``brentq`` on the
    standardised effect). inf for n < 2, 0 for std = 0."""
    _check_design(alpha, power, alternative)
    if std < 0 or not math.isfinite(std) or int(n) != n:
        raise ValueError(f"std must be non-negative and finite and n an integer, got std={std}, n={n}")
    if n < 2:
        return math.inf
    if std == 0:
        return 0.0
    alt = "two-sided" if alternative == "two-sided" else "greater"

    def gap(es: float) -> float:
        return float(_power_es(es, int(n), alpha, alt)) - power

    hi = 1.0
    while gap(hi) < 0:
        hi *= 2.0
    return float(optimize.brentq(gap, 0.0, hi, xtol=1e-12, rtol=1e-12) * std)


def seeds_needed(diff: float, std: float, *, alpha: float = 0.05, power: float = 0.8,
                 alternative: str = "greater", max_n: int = 1000) -> int | None:
    """Smallest n ≥ 2 at which (a) the paired t-test reaches ``power`` (as :func:`t_test_power`, a
    1e-10 tolerance makes it the inverse of :func:`min_detectable_diff`) and (b) the exact sign-flip
    robustness check can reject at all (:func:`min_sign_flip_p` < α). None when no n ≤ ``max_n`` does
    (e.g. diff = 0, or diff < 0 for a ``greater`` test); std = 0 needs only (b)."""
    _check_design(alpha, power, alternative)
    if not math.isfinite(diff) or std < 0 or not math.isfinite(std) or int(max_n) != max_n or max_n < 2:
        raise ValueError(f"need finite diff, finite std ≥ 0 and integer max_n ≥ 2 (got {diff}, {std}, {max_n})")
    ns = np.arange(2, int(max_n) + 1)
    floor_ok = np.array([min_sign_flip_p(int(k), alternative=alternative) < alpha for k in ns])
    if diff == 0 or (alternative == "greater" and diff < 0) or (alternative == "less" and diff > 0):
        return None
    alt = "two-sided" if alternative == "two-sided" else "greater"
    pw = np.ones(ns.size) if std == 0 else _power_es(abs(diff) / std, ns, alpha, alt)
    ok = floor_ok & (pw >= power - 1e-10)
    return int(ns[np.argmax(ok)]) if ok.any() else None


def joint_power(mean, cov, n: int, *, alpha: float = 0.05, n_sim: int = 4000, seed: int = 0) -> float:
    """P(every one-sided paired t-test rejects at α) for k contrasts whose per-seed values are
    multivariate normal with ``mean`` (k,) and covariance ``cov`` (k × k), n seeds: the power of an
    intersection–union rule, by simulating ``n_sim`` experiments from ``default_rng(seed)``."""
    return float(np.mean(np.all(joint_rejections(mean, cov, n, alpha=alpha, n_sim=n_sim, seed=seed), axis=-1)))


def joint_rejections(mean, cov, n: int, *, alpha: float, n_sim: int, seed: int = 0) -> np.ndarray:
    """Which of the k one-sided paired t-tests reject at α in each of ``n_sim`` simulated experiments
    (boolean, n_sim × k), the experiments of :func:`joint_power`."""
    mu = as_1d(mean, "mean")
    sigma = np.atleast_2d(np.asarray(cov, dtype=float))
    if sigma.shape != (mu.size, mu.size) or not np.all(np.isfinite(sigma)):
        raise ValueError(f"cov must be a finite {mu.size}×{mu.size} matrix, got shape {sigma.shape}")
    if int(n) != n or n < 2:
        raise ValueError(f"n must be an integer ≥ 2, got {n}")
    draws = np.random.default_rng(seed).multivariate_normal(mu, sigma, size=(int(n_sim), int(n)),
                                                            check_valid="ignore", method="eigh")
    p = t_test(np.moveaxis(draws, 1, -1), alternative="greater")["p"]  # (n_sim, k)
    return p < alpha


def joint_seeds_needed(mean, cov, *, alpha: float = 0.05, power: float = 0.8, max_n: int = 100,
                       n_sim: int = 2000, seed: int = 0) -> int | None:
    """Smallest n ≤ ``max_n`` with :func:`joint_power` ≥ ``power`` and :func:`min_sign_flip_p` < α, by
    bisection (the power grows with n). None when some contrast has mean ≤ 0 (its one-sided test then has
    power ≤ α) or ``max_n`` seeds are not enough."""
    if np.any(as_1d(mean, "mean") <= 0):
        return None
    lo = next(n for n in range(2, 64) if min_sign_flip_p(n) < alpha)

    def ok(n: int) -> bool:
        return joint_power(mean, cov, n, alpha=alpha, n_sim=n_sim, seed=seed) >= power

    if not ok(max_n):
        return None
    hi = max_n
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid + 1, hi)
    return lo
