"""Statistics over (seeds × tasks) arrays: pure functions, in the spirit of google-research's rliable.

The training seed is the unit of replication; test tasks (and evaluation samples) sit inside a seed.
An arm contributes one value per seed (its mean test reward), or a (seeds × tasks) array.

* one arm: :func:`summarize` (mean, Student-t interval);
* two arms paired by seed: :func:`t_test` / :func:`paired_t` (primary, ``scipy.stats.ttest_1samp``)
  and :func:`sign_flip_p` (exact sign-flip test, the robustness check), both vectorised over
  leading axes so that many simulated experiments are tested at once;
* families: :func:`holm`; paired by seed: :func:`prob_improvement`;
* bootstrap intervals: :func:`percentile_interval` (the one percentile rule every bootstrap here uses), only
  from ``report.min_bootstrap_seeds`` seeds per arm (:func:`bootstrap_allowed`). No interval resamples the
  test tasks: the inference is conditional on them (they are crossed with the seeds and nested in worlds);
* design (power, seeds needed): :mod:`lopd.analysis.power`;
* evaluation noise: :func:`eval_noise_share`.

Randomness only through ``numpy.random.default_rng(seed)``; bad input raises :class:`ValueError`.
"""

from __future__ import annotations

import math
import warnings
from typing import Sequence

import numpy as np
from scipy import stats

#: Largest n for which :func:`sign_flip_p` enumerates all 2**n sign patterns.
EXACT_SIGN_FLIP_MAX_N = 20
#: Random sign patterns used by :func:`sign_flip_p` above that n.
MC_SIGN_FLIPS = 100_000
#: Flipped sums within this fraction of sum|d| of the observed sum count as ties (float rounding).
TIE_RTOL = 1e-9
ALTERNATIVES = ("two-sided", "greater", "less")
#: Level of the report's descriptive intervals (the two-sided t-CIs, the efficiency CI);
#: the pre-registered tests use ``report.alpha`` instead.
DESCRIPTIVE_CONFIDENCE = 0.95


# --------------------------------------------------------------------------- validation (also lopd.analysis.power's)
def _as_array(x, name: str, *, min_n: int = 1) -> np.ndarray:
    """Finite float array with at least one axis and at least ``min_n`` entries on the last one."""
    try:
        arr = np.asarray(x, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be numbers: {exc}") from exc
    if arr.ndim == 0 or arr.shape[-1] < min_n:
        raise ValueError(f"{name} needs at least {min_n} value(s) on its last axis, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must contain only finite values (no nan/inf)")
    return arr


def as_1d(x, name: str) -> np.ndarray:
    """A finite 1-d float array of at least one value, else ValueError naming ``name``."""
    arr = _as_array(x, name)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-dimensional, got shape {arr.shape}")
    return arr


def check_prob(value: float, name: str) -> float:
    """``value`` as a float strictly between 0 and 1, else ValueError naming ``name``."""
    value = float(value)
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be strictly between 0 and 1, got {value}")
    return value


def check_alternative(alternative: str) -> str:
    """``alternative`` if it is one of :data:`ALTERNATIVES`, else ValueError."""
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative must be one of {ALTERNATIVES}, got {alternative!r}")
    return alternative


def _paired(a, b) -> np.ndarray:
    aa, bb = _as_array(a, "a"), _as_array(b, "b")
    if aa.shape != bb.shape:
        raise ValueError(f"paired samples must have equal shapes, got {aa.shape} and {bb.shape}")
    return aa - bb


# --------------------------------------------------------------------------- one arm
def summarize(x: Sequence[float], *, confidence: float = 0.95) -> dict:
    """One arm's per-seed values: ``n``, ``mean``, ``std`` (ddof=1) and the Student-t interval
    ``mean ± t_{(1+c)/2, n-1}·std/√n`` (``ci_low``, ``ci_high``, ``ci_half``). n = 1: std and interval are
    nan; constant input: a zero-width interval. (No interquartile mean: over ten per-seed means it trims to
    about five numbers and has no interval here.)"""
    arr = as_1d(x, "x")
    confidence = check_prob(confidence, "confidence")
    n, mean = arr.size, float(np.mean(arr))
    std = lo = hi = math.nan
    if n >= 2:
        std = float(np.std(arr, ddof=1))
        lo = hi = mean
        if std > 0:
            lo, hi = (float(v) for v in stats.t.interval(confidence, n - 1, loc=mean, scale=std / math.sqrt(n)))
    return {"n": int(n), "mean": mean, "std": std, "ci_low": lo, "ci_high": hi, "ci_half": (hi - lo) / 2.0}


# --------------------------------------------------------------------------- paired tests
def t_test(d, *, alternative: str = "two-sided", confidence: float = 0.95) -> dict:
    """One-sample t-test of H0: E[d] = 0 over the last axis (``scipy.stats.ttest_1samp``).

    ``d`` holds per-seed differences (or contrasts), shape (..., n). Returns arrays (scalars for 1-d
    input): ``n``, ``diff`` = mean(d), ``t`` = mean/(std/√n), ``df`` = n − 1, ``p`` and the
    confidence interval of E[d] matching ``alternative`` (``ci_low``, ``ci_high``; one-sided tests get a
    one-sided bound at level ``confidence``). Degenerate rows: n < 2 gives nan; zero spread gives
    t = ±inf (p = 0 in the matching direction, 1 otherwise) or, for d ≡ 0, t = 0 and p = 1."""
    d = _as_array(d, "d")
    check_alternative(alternative)
    confidence = check_prob(confidence, "confidence")
    n = d.shape[-1]
    mean = d.mean(axis=-1)
    if n < 2:
        nan = np.full(mean.shape, np.nan)
        return _squeeze({"n": n, "diff": mean, "t": nan, "df": n - 1, "p": nan, "ci_low": nan, "ci_high": nan})
    flat = np.ptp(d, axis=-1) == 0
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # zero-spread rows, handled below
        res = stats.ttest_1samp(d, 0.0, axis=-1, alternative=alternative)
        ci = res.confidence_interval(confidence)
    t, p = np.asarray(res.statistic, float), np.asarray(res.pvalue, float)
    lo, hi = np.asarray(ci.low, float), np.asarray(ci.high, float)
    if flat.any():
        sign = np.sign(mean)
        t = np.where(flat, np.where(sign > 0, np.inf, np.where(sign < 0, -np.inf, 0.0)), t)
        agree = {"two-sided": sign != 0, "greater": sign > 0, "less": sign < 0}[alternative]
        p = np.where(flat, np.where(agree, 0.0, 1.0), p)
        lo = np.where(flat, mean if alternative != "less" else -np.inf, lo)
        hi = np.where(flat, mean if alternative != "greater" else np.inf, hi)
    return _squeeze({"n": n, "diff": mean, "t": t, "df": n - 1, "p": p, "ci_low": lo, "ci_high": hi})


def paired_t(a, b, *, alternative: str = "two-sided", confidence: float = 0.95) -> dict:
    """Paired t-test of arms ``a`` and ``b`` run on the same seeds: :func:`t_test` of ``a − b``
    (identical to ``scipy.stats.ttest_rel(a, b)``)."""
    return t_test(_paired(a, b), alternative=alternative, confidence=confidence)


def _squeeze(out: dict) -> dict:
    return {k: (float(v) if np.ndim(v) == 0 and not isinstance(v, int) else v) for k, v in out.items()}


def _all_sums(x: np.ndarray) -> np.ndarray:
    """Σ_i s_i x[..., i] for all 2**m sign vectors s (shape (..., 2**m))."""
    m = x.shape[-1]
    bits = (np.arange(2**m)[:, None] >> np.arange(m)) & 1
    return x @ (1.0 - 2.0 * bits).T


def _count_at_least(d: np.ndarray, thr: np.ndarray) -> np.ndarray:
    """Per row of ``d`` (B, n): the number of sign vectors s with Σ s_i d_i ≥ thr.

    Meet in the middle: the 2**n sums are (first-half sum) + (second-half sum); sort one half and
    count with ``searchsorted``, O(2**(n/2) log) per row instead of O(2**n · n)."""
    h = d.shape[1] // 2
    lo, hi = _all_sums(d[:, :h]), np.sort(_all_sums(d[:, h:]), axis=1)
    counts = np.empty(d.shape[0], dtype=np.int64)
    for r in range(d.shape[0]):
        counts[r] = hi.shape[1] * lo.shape[1] - np.searchsorted(hi[r], thr[r] - lo[r], side="left").sum()
    return counts


def sign_flip_p(a, b=None, *, alternative: str = "two-sided", n_mc: int = MC_SIGN_FLIPS, seed: int = 0):
    """Sign-flip (randomisation) test of H0: the distribution of d = a − b is symmetric about 0.

    Statistic S = Σ d_i; its null distribution is that of Σ s_i d_i over sign vectors s ∈ {±1}^n.
    p = fraction of sign vectors with S(s) ≥ S (``greater``), ≤ S (``less``), |S(s)| ≥ |S| (two-sided),
    ties within ``TIE_RTOL·Σ|d|`` counted (same definition as ``scipy.stats.permutation_test`` with
    ``permutation_type='samples'``, which enumerates far more slowly). n ≤ 20: exact (all 2**n vectors,
    smallest attainable p 1/2**n one-sided, 2/2**n two-sided). n > 20: ``n_mc`` random vectors from
    ``default_rng(seed)``, p = (1 + hits)/(1 + n_mc). d ≡ 0 gives p = 1. ``b=None`` tests ``a`` itself.
    Vectorised over leading axes: returns an array of p-values, or a float for 1-d input."""
    d = _as_array(a, "a") if b is None else _paired(a, b)
    check_alternative(alternative)
    if int(n_mc) != n_mc or n_mc < 1:
        raise ValueError(f"n_mc must be a positive integer, got {n_mc}")
    n = d.shape[-1]
    rows = d.reshape(-1, n)
    if alternative == "less":  # by symmetry of the null: P(S(s) ≤ S) = P(S(s) ≥ −S)
        rows = -rows
    obs = rows.sum(axis=1)
    tol = TIE_RTOL * np.abs(rows).sum(axis=1)
    thr = (np.abs(obs) if alternative == "two-sided" else obs) - tol
    if n <= EXACT_SIGN_FLIP_MAX_N:
        p = _count_at_least(rows, thr) / 2.0**n
    else:
        rng = np.random.default_rng(seed)
        hits = np.zeros(rows.shape[0])
        chunk = max(1, 2_000_000 // n)
        for start in range(0, int(n_mc), chunk):
            signs = rng.choice(np.array([-1.0, 1.0]), size=(min(chunk, int(n_mc) - start), n))
            hits += np.count_nonzero((rows @ signs.T) >= thr[:, None], axis=1)
        p = (1.0 + hits) / (1.0 + n_mc)
    if alternative == "two-sided":  # the null distribution is symmetric: P(|S(s)| ≥ c) = 2·P(S(s) ≥ c)
        p = np.where(thr > 0, np.minimum(1.0, 2.0 * p), 1.0)
    p = np.where(np.all(rows == 0.0, axis=1), 1.0, p).reshape(d.shape[:-1])
    return float(p) if p.ndim == 0 else p


def min_sign_flip_p(n: int, *, alternative: str = "greater", n_mc: int = MC_SIGN_FLIPS) -> float:
    """Smallest p-value :func:`sign_flip_p` can return with n pairs: 1/2**n one-sided, 2/2**n two-sided
    (exact, n ≤ 20), 1/(1 + n_mc) above; 1 for n < 1. If this is not below α the test cannot reject."""
    check_alternative(alternative)
    if n < 1:
        return 1.0
    if n > EXACT_SIGN_FLIP_MAX_N:
        return 1.0 / (1.0 + n_mc)
    return min(1.0, (2.0 if alternative == "two-sided" else 1.0) / 2.0**n)


# --------------------------------------------------------------------------- effect sizes
def percentile_interval(boots, confidence: float, *, outer_order_statistics: bool = False) -> tuple[float, float]:
    """Percentile bootstrap interval at level c of the B resampled statistics ``boots``: their
    q_lo = (1 − c)/2 and q_hi = (1 + c)/2 quantiles.

    Default: ``np.quantile``'s linear interpolation between order statistics (finite statistics).
    ``outer_order_statistics``: the order statistics b₍⌊q_lo·(B−1)⌋₎ and b₍⌈q_hi·(B−1)⌉₎ of the sorted
    resamples, never inside the interpolated interval and defined for non-finite statistics (+inf,
    e.g. a target never reached, sorts last, so the bound reads "not reached")."""
    confidence = check_prob(confidence, "confidence")
    q_lo, q_hi = (1 - confidence) / 2, (1 + confidence) / 2
    if not outer_order_statistics:
        lo, hi = np.quantile(boots, [q_lo, q_hi])
        return float(lo), float(hi)
    b = np.sort(np.asarray(boots, dtype=float))
    return float(b[int(math.floor(q_lo * (b.size - 1)))]), float(b[int(math.ceil(q_hi * (b.size - 1)))])


def holm(pvals: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values in input order: with p_(1) ≤ … ≤ p_(m),
    adj_(i) = min(1, max_{j ≤ i} (m − j + 1)·p_(j)). Reject H_i at α iff adj_i ≤ α."""
    p = as_1d(pvals, "pvals")
    if np.any((p < 0.0) | (p > 1.0)):
        raise ValueError("pvals must lie in [0, 1]")
    m = p.size
    order = np.argsort(p, kind="stable")
    adj = np.empty(m)
    adj[order] = np.minimum(np.maximum.accumulate((m - np.arange(m)) * p[order]), 1.0)
    return [float(v) for v in adj]


def bootstrap_allowed(n_seeds: int, min_seeds: int) -> bool:
    """Whether a percentile bootstrap over ``n_seeds`` seeds may be reported (``report.min_bootstrap_seeds``):
    with few seeds the resamples take few distinct values (3 seeds: 10 multisets) and the percentile interval
    is far too narrow, so below ``min_seeds`` only t-intervals are reported."""
    return n_seeds >= min_seeds


def prob_improvement(a, b) -> float:
    """Paired probability of improvement over shared seeds: (1/n) Σ_s ( [a_s > b_s] + ½·[a_s = b_s] ), with
    ``a[s]`` and ``b[s]`` the two arms' values on the same seed s (the same draws, the same rollout seeds:
    the design is paired, so the arms are compared seed by seed, not over all n² pairs). 0.5 = no difference."""
    d = _paired(a, b)
    return float(np.mean((d > 0) + 0.5 * (d == 0)))


# --------------------------------------------------------------------------- evaluation noise
def eval_noise_share(samples, *, weights=None) -> dict:
    """How much of the seed-to-seed variance of an arm's test reward is evaluation (sampling) noise.

    ``samples`` is (seeds × tasks × K) per-sample rewards (K ≥ 2), ``weights`` per-task weights summing
    to 1 (default 1/T; mean of domain means: 1/(#domains·T_domain)). Per-seed value
    m_s = Σ_t w_t·mean_k x[s,t,k]; seed variance V = var_s(m_s) (ddof=1). Evaluation variance of m_s
    with K samples: E_K = mean_s Σ_t w_t²·s²_{s,t}/K, with s²_{s,t} the unbiased within-task variance
    over the K samples. Returns ``seed_var`` V, ``eval_var`` E_K, ``share`` E_K/V and, for one sample per
    task, ``eval_var_1`` = K·E_K and ``share_1`` = K·E_K / (V + (K−1)·E_K). Shares are estimates and
    can exceed 1 when the seeds differ by no more than evaluation noise; nan when V = 0."""
    x = _as_array(samples, "samples")
    if x.ndim != 3 or x.shape[0] < 2 or x.shape[2] < 2:
        raise ValueError(f"samples must be (seeds ≥ 2) × tasks × (K ≥ 2 samples), got shape {x.shape}")
    k, t = x.shape[2], x.shape[1]
    w = np.full(t, 1.0 / t) if weights is None else as_1d(weights, "weights")
    if w.shape != (t,) or abs(w.sum() - 1.0) > 1e-9 or np.any(w < 0):
        raise ValueError("weights must be one non-negative weight per task, summing to 1")
    m = (x.mean(axis=2) * w).sum(axis=1)
    v = float(np.var(m, ddof=1))
    e_k = float(np.mean((x.var(axis=2, ddof=1) * w**2).sum(axis=1) / k))
    share = e_k / v if v > 0 else math.nan
    v_1 = v + (k - 1) * e_k
    return {"n_seeds": int(x.shape[0]), "n_tasks": int(t), "samples": int(k), "seed_var": v, "eval_var": e_k,
            "share": share, "eval_var_1": k * e_k, "share_1": k * e_k / v_1 if v_1 > 0 else math.nan}
