"""Small-sample statistics for comparing training arms over seeds.

Every arm contributes one scalar metric per seed. The helpers here summarise
one arm (:func:`summarize`), compare two arms run on the same seeds
(:func:`paired_diff`, :func:`paired_permutation_p`), compare two arms without
pairing (:func:`prob_improvement`), adjust a family of p-values
(:func:`holm`) and do power analysis for the paired t-test
(:func:`t_test_power`, :func:`min_detectable_diff`, :func:`seeds_needed`).

All functions are pure (no global RNG state is touched: randomness comes from
``numpy.random.default_rng(seed)``) and raise :class:`ValueError` on bad input.
"""

from __future__ import annotations

import math
import warnings
from typing import Sequence

import numpy as np
from scipy import optimize, stats

__all__ = [
    "summarize",
    "paired_permutation_p",
    "paired_diff",
    "holm",
    "prob_improvement",
    "t_test_power",
    "min_detectable_diff",
    "seeds_needed",
]

#: Largest n for which :func:`paired_permutation_p` enumerates all 2**n flips.
EXACT_PERM_MAX_N = 16
#: Number of random sign flips used by :func:`paired_permutation_p` for n > 16.
MC_PERM_FLIPS = 100_000
#: Tolerance for "|flipped mean| >= |observed mean|" (relative to max(1, |obs|)).
PERM_TIE_TOL = 1e-12


# --------------------------------------------------------------------------- #
# validation helpers
# --------------------------------------------------------------------------- #
def _as_1d(x: Sequence[float], name: str) -> np.ndarray:
    """Return ``x`` as a 1-d float array; non-empty and finite, else ValueError."""
    try:
        arr = np.asarray(x, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a sequence of numbers: {exc}") from exc
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} must be non-empty")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must contain only finite values (no nan/inf)")
    return arr


def _paired(a: Sequence[float], b: Sequence[float]) -> np.ndarray:
    """Validate a paired sample and return the differences ``a - b``."""
    aa = _as_1d(a, "a")
    bb = _as_1d(b, "b")
    if aa.shape != bb.shape:
        raise ValueError(
            f"paired samples must have equal length, got len(a)={aa.size}, len(b)={bb.size}"
        )
    return aa - bb


def _check_prob(value: float, name: str) -> float:
    value = float(value)
    if not (0.0 < value < 1.0):
        raise ValueError(f"{name} must be strictly between 0 and 1, got {value}")
    return value


def _check_n_boot(n_boot: int) -> int:
    if int(n_boot) != n_boot or n_boot < 1:
        raise ValueError(f"n_boot must be a positive integer, got {n_boot}")
    return int(n_boot)


def _bootstrap_mean_ci(x: np.ndarray, confidence: float, n_boot: int, seed: int) -> tuple[float, float]:
    """Percentile-bootstrap CI of the mean (``scipy.stats.bootstrap``).

    n = 1 -> (nan, nan) (no resampling variability can be estimated);
    constant input -> (mean, mean) without calling scipy (which would warn).
    """
    if x.size < 2:
        return math.nan, math.nan
    if np.ptp(x) == 0.0:
        m = float(x[0])
        return m, m
    res = stats.bootstrap(
        (x,),
        np.mean,
        n_resamples=n_boot,
        confidence_level=confidence,
        method="percentile",
        vectorized=True,
        batch=max(1, min(n_boot, 2_000_000 // x.size)),
        rng=np.random.default_rng(seed),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


# --------------------------------------------------------------------------- #
# one arm
# --------------------------------------------------------------------------- #
def summarize(
    x: Sequence[float], *, confidence: float = 0.95, n_boot: int = 10000, seed: int = 0
) -> dict:
    """Summarise one arm's per-seed metric.

    Returns a dict with

    * ``n``: number of values;
    * ``mean``: arithmetic mean;
    * ``std``: sample standard deviation (``ddof=1``); nan for n = 1;
    * ``ci_low``, ``ci_high``: Student-t confidence interval of the mean,
      ``scipy.stats.t.interval(confidence, df=n-1, loc=mean, scale=std/sqrt(n))``;
      nan for n = 1, ``(mean, mean)`` for constant input;
    * ``ci_half``: half width ``(ci_high - ci_low) / 2`` (nan for n = 1);
    * ``boot_low``, ``boot_high``: percentile-bootstrap confidence interval of
      the mean (``scipy.stats.bootstrap``, ``method="percentile"``,
      ``n_boot`` resamples, ``rng=numpy.random.default_rng(seed)``, so it is
      deterministic for a given seed); nan for n = 1, ``(mean, mean)`` for
      constant input;
    * ``iqm``: interquartile mean, ``scipy.stats.trim_mean(x, 0.25)`` (the mean
      after cutting ``int(0.25 * n)`` values from each end).
    """
    arr = _as_1d(x, "x")
    confidence = _check_prob(confidence, "confidence")
    n_boot = _check_n_boot(n_boot)
    n = arr.size
    mean = float(np.mean(arr))
    if n >= 2:
        std = float(np.std(arr, ddof=1))
        if std == 0.0:
            ci_low = ci_high = mean
        else:
            sem = std / math.sqrt(n)
            ci_low, ci_high = (float(v) for v in stats.t.interval(confidence, n - 1, loc=mean, scale=sem))
    else:
        std = ci_low = ci_high = math.nan
    boot_low, boot_high = _bootstrap_mean_ci(arr, confidence, n_boot, seed)
    return {
        "n": int(n),
        "mean": mean,
        "std": std,
        "ci_low": ci_low,
        "ci_high": ci_high,
        "ci_half": (ci_high - ci_low) / 2.0,
        "boot_low": boot_low,
        "boot_high": boot_high,
        "iqm": float(stats.trim_mean(arr, 0.25)),
    }


# --------------------------------------------------------------------------- #
# two arms, paired by seed
# --------------------------------------------------------------------------- #
def paired_permutation_p(
    a: Sequence[float], b: Sequence[float], *, n_mc: int = MC_PERM_FLIPS, seed: int = 0
) -> float:
    """Two-sided sign-flip permutation p-value for H0: mean(a - b) = 0.

    With ``d = a - b`` and observed statistic ``T = mean(d)``, the null
    distribution is that of ``mean(s * d)`` over sign vectors ``s`` in
    ``{-1, +1}^n``. The p-value is the fraction of sign vectors with
    ``|mean(s * d)| >= |T| - 1e-12 * max(1, |T|)`` (the tolerance makes exact
    ties count despite float rounding).

    * n <= 16: exact, all ``2**n`` sign vectors are enumerated (the identity
      flip is included, so p >= 2 / 2**n > 0 whenever d is not all zero).
    * n > 16: Monte Carlo with ``n_mc`` (default 100000) random sign vectors
      drawn from ``numpy.random.default_rng(seed)``; the observed labelling is
      counted as one extra flip, ``p = (1 + hits) / (1 + n_mc)``, so p > 0.
    * All differences zero: returns 1.0.
    """
    d = _paired(a, b)
    if int(n_mc) != n_mc or n_mc < 1:
        raise ValueError(f"n_mc must be a positive integer, got {n_mc}")
    n = d.size
    if np.all(d == 0.0):
        return 1.0
    obs = abs(float(np.mean(d)))
    thresh = obs - PERM_TIE_TOL * max(1.0, obs)
    if n <= EXACT_PERM_MAX_N:
        bits = (np.arange(2**n, dtype=np.int64)[:, None] >> np.arange(n, dtype=np.int64)) & 1
        signs = 1.0 - 2.0 * bits  # row 0 is the identity flip
        flipped = np.abs(signs @ d) / n
        return float(np.mean(flipped >= thresh))
    rng = np.random.default_rng(seed)
    chunk = max(1, min(int(n_mc), 4_000_000 // n))
    hits = 0
    done = 0
    while done < n_mc:
        m = min(chunk, int(n_mc) - done)
        signs = rng.choice(np.array([-1.0, 1.0]), size=(m, n))
        hits += int(np.count_nonzero(np.abs(signs @ d) / n >= thresh))
        done += m
    return (1.0 + hits) / (1.0 + n_mc)


def paired_diff(
    a: Sequence[float],
    b: Sequence[float],
    *,
    confidence: float = 0.95,
    n_boot: int = 10000,
    seed: int = 0,
) -> dict:
    """Compare two arms run on the same seeds (``a[i]`` and ``b[i]`` share seed i).

    Returns a dict with

    * ``n``: number of pairs;
    * ``diff_mean``: ``mean(a - b)``;
    * ``boot_low``, ``boot_high``: percentile-bootstrap CI (level
      ``confidence``) of the mean paired difference, resampling pairs
      (``scipy.stats.bootstrap``, ``n_boot`` resamples, seeded by ``seed``);
      nan for n = 1, ``(diff, diff)`` for constant differences;
    * ``p_perm``: :func:`paired_permutation_p` (two-sided sign-flip test).
    """
    d = _paired(a, b)
    confidence = _check_prob(confidence, "confidence")
    n_boot = _check_n_boot(n_boot)
    lo, hi = _bootstrap_mean_ci(d, confidence, n_boot, seed)
    return {
        "n": int(d.size),
        "diff_mean": float(np.mean(d)),
        "boot_low": lo,
        "boot_high": hi,
        "p_perm": paired_permutation_p(a, b, seed=seed),
    }


# --------------------------------------------------------------------------- #
# multiple comparisons
# --------------------------------------------------------------------------- #
def holm(pvals: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, returned in the input order.

    With the m p-values sorted ascending, ``p_(1) <= ... <= p_(m)``, the
    adjusted value is ``min(1, max_{j <= i} (m - j + 1) * p_(j))`` (running
    maximum makes them monotone). Reject H_i at level alpha iff adjusted
    ``p_i <= alpha``. Ties keep their input order.
    """
    p = _as_1d(pvals, "pvals")
    if np.any((p < 0.0) | (p > 1.0)):
        raise ValueError("pvals must lie in [0, 1]")
    m = p.size
    order = np.argsort(p, kind="stable")
    scaled = (m - np.arange(m)) * p[order]
    adj_sorted = np.minimum(np.maximum.accumulate(scaled), 1.0)
    out = np.empty(m)
    out[order] = adj_sorted
    return [float(v) for v in out]


# --------------------------------------------------------------------------- #
# two arms, unpaired
# --------------------------------------------------------------------------- #
def prob_improvement(a: Sequence[float], b: Sequence[float]) -> float:
    """Probability of improvement ``P(X_a > X_b) + 0.5 * P(X_a == X_b)``.

    X_a and X_b are drawn independently and uniformly from the samples ``a``
    and ``b`` (all ``len(a) * len(b)`` pairs, no pairing by seed). Computed as
    ``scipy.stats.mannwhitneyu(a, b).statistic / (len(a) * len(b))`` (the
    Mann-Whitney U statistic of ``a``). 0.5 means no difference.
    """
    aa = _as_1d(a, "a")
    bb = _as_1d(b, "b")
    with warnings.catch_warnings():
        # Only the statistic is used; p-value machinery may warn on degenerate
        # (e.g. all-tied or size-1) samples.
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            u = stats.mannwhitneyu(aa, bb, alternative="two-sided", method="asymptotic").statistic
    return float(u) / (aa.size * bb.size)


# --------------------------------------------------------------------------- #
# power analysis (two-sided t-tests, noncentral t)
# --------------------------------------------------------------------------- #
def _df_ncp_factor(n, paired: bool):
    """Degrees of freedom and ncp / effect-size factor for n seeds (per arm)."""
    n = np.asarray(n, dtype=float)
    if paired:
        return n - 1.0, np.sqrt(n)
    return 2.0 * n - 2.0, np.sqrt(n / 2.0)


def _power_es(effect_size, n, alpha: float, paired: bool):
    """Two-sided t-test power for standardized effect ``effect_size`` (vectorised in n)."""
    df, fac = _df_ncp_factor(n, paired)
    ncp = np.asarray(effect_size, dtype=float) * fac
    tcrit = stats.t.ppf(1.0 - alpha / 2.0, df)
    # Lower tail P(T < -tcrit | ncp) written as P(T > tcrit | -ncp): identical
    # mathematically, but nct.cdf returns nan deep in the left tail (df=1, ncp>~7).
    return stats.nct.sf(tcrit, df, ncp) + stats.nct.sf(tcrit, df, -ncp)


def _check_power_args(alpha: float, power: float | None = None) -> None:
    _check_prob(alpha, "alpha")
    if power is not None:
        _check_prob(power, "power")
        if power <= alpha:
            raise ValueError(f"power ({power}) must exceed alpha ({alpha})")


def t_test_power(diff: float, std: float, n: int, *, alpha: float = 0.05, paired: bool = True) -> float:
    """Power of a two-sided t-test at level ``alpha`` with ``n`` seeds.

    ``paired=True``: one-sample t-test on the n paired differences, whose
    true mean is ``diff`` and standard deviation ``std``; df = n - 1,
    noncentrality ``diff / std * sqrt(n)``.
    ``paired=False``: two-sample equal-variance t-test with n seeds per arm,
    per-arm standard deviation ``std``; df = 2n - 2, noncentrality
    ``diff / std * sqrt(n / 2)``.
    Power = ``nct.sf(t_crit, df, ncp) + nct.cdf(-t_crit, df, ncp)`` (the
    second term evaluated as ``nct.sf(t_crit, df, -ncp)``) with
    ``t_crit = t.ppf(1 - alpha/2, df)``. Returns nan when df < 1.
    """
    _check_power_args(alpha)
    if std <= 0 or not math.isfinite(std):
        raise ValueError(f"std must be positive and finite, got {std}")
    if not math.isfinite(diff):
        raise ValueError(f"diff must be finite, got {diff}")
    if int(n) != n or n < 1:
        raise ValueError(f"n must be a positive integer, got {n}")
    if n < 2:
        return math.nan
    return float(_power_es(abs(diff) / std, int(n), alpha, paired))


def min_detectable_diff(
    std: float, n: int, *, alpha: float = 0.05, power: float = 0.8, paired: bool = True
) -> float:
    """Smallest true mean difference detected with probability ``power``.

    Solves ``t_test_power(delta, std, n, alpha=alpha, paired=paired) == power``
    for ``delta >= 0`` with ``scipy.optimize.brentq`` on the standardized
    effect size (power from the noncentral t distribution, see
    :func:`t_test_power`). For ``paired=True`` ``std`` is the standard
    deviation of the paired differences; for ``paired=False`` it is the
    per-arm standard deviation (two-sample test, n seeds per arm).
    Returns ``inf`` when n < 2 and 0.0 when ``std == 0``.
    """
    _check_power_args(alpha, power)
    if std < 0 or not math.isfinite(std):
        raise ValueError(f"std must be non-negative and finite, got {std}")
    if int(n) != n:
        raise ValueError(f"n must be an integer, got {n}")
    n = int(n)
    if n < 2:
        return math.inf
    if std == 0:
        return 0.0

    def f(es: float) -> float:
        return float(_power_es(es, n, alpha, paired)) - power

    hi = 1.0
    while f(hi) < 0:
        hi *= 2.0
        if hi > 1e8:  # pragma: no cover - cannot happen for 0 < power < 1
            raise ValueError("could not bracket the effect size")
    es = optimize.brentq(f, 0.0, hi, xtol=1e-12, rtol=1e-12)
    return float(es * std)


def seeds_needed(
    diff: float, std: float, *, alpha: float = 0.05, power: float = 0.8, max_n: int = 1000
) -> int | None:
    """Smallest n >= 2 at which a two-sided paired t-test reaches ``power``.

    ``diff`` is the true mean of the paired differences and ``std`` their
    standard deviation; power as in :func:`t_test_power` (paired). A tolerance
    of 1e-10 on the power makes this the inverse of :func:`min_detectable_diff`:
    ``seeds_needed(min_detectable_diff(std, n), std) == n``.
    Returns None if ``diff == 0`` or more than ``max_n`` seeds would be needed,
    and 2 if ``std == 0`` (noise-free differences).
    """
    _check_power_args(alpha, power)
    if not math.isfinite(diff):
        raise ValueError(f"diff must be finite, got {diff}")
    if std < 0 or not math.isfinite(std):
        raise ValueError(f"std must be non-negative and finite, got {std}")
    if int(max_n) != max_n or max_n < 2:
        raise ValueError(f"max_n must be an integer >= 2, got {max_n}")
    if diff == 0:
        return None
    if std == 0:
        return 2
    ns = np.arange(2, int(max_n) + 1)
    pw = _power_es(abs(diff) / std, ns, alpha, True)
    ok = np.nonzero(pw >= power - 1e-10)[0]
    return int(ns[ok[0]]) if ok.size else None
