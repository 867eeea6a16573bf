import itertools
import math
import warnings

import numpy as np
import pytest
from scipy import stats

from lopd.stats import (
    holm,
    min_detectable_diff,
    paired_diff,
    paired_permutation_p,
    prob_improvement,
    seeds_needed,
    summarize,
    t_test_power,
)

SAMPLE = [0.71, 0.74, 0.69, 0.80, 0.77, 0.73, 0.75]


# ----------------------------------------------------------------- summarize
def test_summarize_t_ci_matches_scipy():
    s = summarize(SAMPLE, confidence=0.9)
    x = np.array(SAMPLE)
    lo, hi = stats.t.interval(0.9, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
    assert s["n"] == 7
    assert s["mean"] == pytest.approx(x.mean())
    assert s["std"] == pytest.approx(x.std(ddof=1))
    assert s["ci_low"] == pytest.approx(lo)
    assert s["ci_high"] == pytest.approx(hi)
    assert s["ci_half"] == pytest.approx((hi - lo) / 2)


def test_summarize_bootstrap_contains_mean_and_deterministic():
    s1 = summarize(SAMPLE, n_boot=2000, seed=3)
    s2 = summarize(SAMPLE, n_boot=2000, seed=3)
    s3 = summarize(SAMPLE, n_boot=2000, seed=4)
    assert s1["boot_low"] < s1["mean"] < s1["boot_high"]
    assert (s1["boot_low"], s1["boot_high"]) == (s2["boot_low"], s2["boot_high"])
    assert (s1["boot_low"], s1["boot_high"]) != (s3["boot_low"], s3["boot_high"])
    # the percentile interval lies within the sample range
    assert min(SAMPLE) <= s1["boot_low"] and s1["boot_high"] <= max(SAMPLE)


def test_iqm_hand_computed():
    # 8 values, cut 2 from each end -> mean(3, 4, 5, 6) = 4.5
    assert summarize([1, 2, 3, 4, 5, 6, 7, 100], n_boot=100)["iqm"] == pytest.approx(4.5)
    assert summarize([100, 7, 1, 6, 2, 5, 3, 4], n_boot=100)["iqm"] == pytest.approx(4.5)


def test_summarize_single_value():
    s = summarize([0.5])
    assert s["n"] == 1 and s["mean"] == 0.5 and s["iqm"] == 0.5
    for k in ("std", "ci_low", "ci_high", "ci_half", "boot_low", "boot_high"):
        assert math.isnan(s[k]), k


def test_summarize_constant_no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = summarize([2.0, 2.0, 2.0, 2.0])
    assert s["std"] == 0.0
    assert s["ci_low"] == s["ci_high"] == s["boot_low"] == s["boot_high"] == 2.0
    assert s["ci_half"] == 0.0


# -------------------------------------------------------------- permutation
def _brute_perm_p(a, b):
    d = np.asarray(a, float) - np.asarray(b, float)
    obs = abs(d.mean())
    hits = total = 0
    for signs in itertools.product((1.0, -1.0), repeat=len(d)):
        m = abs(sum(s * v for s, v in zip(signs, d)) / len(d))
        hits += m >= obs - 1e-12
        total += 1
    return hits / total


@pytest.mark.parametrize("n", [6, 10])
def test_permutation_matches_brute_force(n):
    rng = np.random.default_rng(n)
    a = rng.normal(0.3, 1.0, n)
    b = rng.normal(0.0, 1.0, n)
    assert paired_permutation_p(a, b) == pytest.approx(_brute_perm_p(a, b), abs=1e-12)


def test_permutation_with_ties_in_abs_diffs():
    # |d| = 1 for all -> many flips tie exactly with the observed mean
    a = [1.0, 1.0, 1.0, 0.0]
    b = [0.0, 0.0, 0.0, 1.0]  # d = [1, 1, 1, -1], mean 0.5
    # |sum| >= 2 requires at most one sign disagreeing with the majority:
    # sums 4 or -4 (2 ways) and +-2 (8 ways) -> 10/16
    assert paired_permutation_p(a, b) == pytest.approx(10 / 16)
    assert paired_permutation_p(a, b) == pytest.approx(_brute_perm_p(a, b))


def test_permutation_hand_case():
    # d = [1, 2, 3]: only the all-+ and all-- flips reach |mean| = 2 -> 2/8
    assert paired_permutation_p([1.0, 2.0, 3.0], [0.0, 0.0, 0.0]) == pytest.approx(0.25)


def test_permutation_all_zero_and_symmetry():
    assert paired_permutation_p([1, 2, 3], [1, 2, 3]) == 1.0
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=8), rng.normal(size=8)
    assert paired_permutation_p(a, b) == paired_permutation_p(b, a)


def test_permutation_monte_carlo_large_n():
    rng = np.random.default_rng(1)
    n = 20
    a = rng.normal(0.0, 1.0, n)
    b = a - rng.normal(0.5, 1.0, n)  # d ~ N(0.5, 1)
    p = paired_permutation_p(a, b)
    assert p == paired_permutation_p(a, b)  # seeded -> deterministic
    assert 0 < p <= 1
    # Monte Carlo agrees with a t-test-ish ballpark and with a different seed
    p2 = paired_permutation_p(a, b, seed=123)
    assert abs(p - p2) < 0.01
    # all-positive differences with n = 20 -> essentially only the identity hits
    assert paired_permutation_p(np.arange(1.0, 21.0), np.zeros(20)) < 1e-4


# -------------------------------------------------------------- paired_diff
def test_paired_diff():
    a = np.array([0.80, 0.82, 0.79, 0.85, 0.81, 0.83])
    b = np.array([0.78, 0.80, 0.79, 0.80, 0.77, 0.82])
    r = paired_diff(a, b, n_boot=3000, seed=1)
    assert r["n"] == 6
    assert r["diff_mean"] == pytest.approx(np.mean(a - b))
    assert r["boot_low"] <= r["diff_mean"] <= r["boot_high"]
    assert r["p_perm"] == pytest.approx(_brute_perm_p(a, b))
    assert r == paired_diff(a, b, n_boot=3000, seed=1)


# --------------------------------------------------------------------- holm
def test_holm_hand_worked():
    adj = holm([0.01, 0.04, 0.03, 0.005])
    assert adj == pytest.approx([0.03, 0.06, 0.06, 0.02])


def test_holm_cap_and_single():
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])
    assert holm([0.2]) == pytest.approx([0.2])
    adj = holm([0.3, 0.001, 0.02, 0.02])
    # sorted: .001*4=.004, .02*3=.06, .02*2=.04->.06, .3*1=.3
    assert adj == pytest.approx([0.3, 0.004, 0.06, 0.06])


# --------------------------------------------------------- prob_improvement
def test_prob_improvement_hand_counted_with_ties():
    a = [1, 2, 3]
    b = [2, 2, 0]
    # pairs (a, b): 1 vs 2,2,0 -> 1 win; 2 vs 2,2,0 -> 1 win + 2 ties;
    # 3 vs 2,2,0 -> 3 wins. wins = 5, ties = 2 -> (5 + 1) / 9
    assert prob_improvement(a, b) == pytest.approx(6 / 9)
    assert prob_improvement(b, a) == pytest.approx(3 / 9)
    assert prob_improvement([1.0], [1.0]) == 0.5
    assert prob_improvement([5, 6], [1, 2, 3]) == 1.0


# ---------------------------------------------------------------- power
def _mc_power(diff, std, n, *, paired=True, alpha=0.05, sims=4000, seed=0):
    rng = np.random.default_rng(seed)
    if paired:
        d = rng.normal(diff, std, size=(sims, n))
        p = stats.ttest_1samp(d, 0.0, axis=1).pvalue
    else:
        x = rng.normal(diff, std, size=(sims, n))
        y = rng.normal(0.0, std, size=(sims, n))
        p = stats.ttest_ind(x, y, axis=1).pvalue
    return float(np.mean(p < alpha))


def test_min_detectable_diff_monotone():
    vals = [min_detectable_diff(0.1, n) for n in range(2, 30)]
    assert all(v1 > v2 for v1, v2 in zip(vals, vals[1:]))
    assert min_detectable_diff(0.1, 1) == math.inf
    assert min_detectable_diff(0.0, 5) == 0.0
    # scales linearly with std, unpaired needs a bigger diff than paired (same std)
    assert min_detectable_diff(0.2, 8) == pytest.approx(2 * min_detectable_diff(0.1, 8))
    assert min_detectable_diff(0.1, 8, paired=False) > min_detectable_diff(0.1, 8)


@pytest.mark.parametrize("n,paired", [(5, True), (12, True), (8, False)])
def test_min_detectable_diff_power_by_simulation(n, paired):
    std = 0.05
    mdd = min_detectable_diff(std, n, paired=paired)
    assert t_test_power(mdd, std, n, paired=paired) == pytest.approx(0.8, abs=1e-9)
    assert _mc_power(mdd, std, n, paired=paired, seed=n) == pytest.approx(0.8, abs=0.03)


def test_seeds_needed_consistent():
    std = 0.1
    for n in (2, 3, 5, 10, 25):
        mdd = min_detectable_diff(std, n)
        assert seeds_needed(mdd, std) == n
        assert seeds_needed(-mdd, std) == n
        assert seeds_needed(mdd * 1.001, std) <= n
        assert seeds_needed(mdd * 0.999, std) == n + 1
    assert seeds_needed(0.0, std) is None
    assert seeds_needed(1e-4, std, max_n=50) is None
    assert seeds_needed(0.1, 0.0) == 2


# ------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "call",
    [
        lambda: summarize([]),
        lambda: summarize([1.0, float("nan")]),
        lambda: summarize([[1.0, 2.0]]),
        lambda: summarize(["a", "b"]),
        lambda: summarize([1.0, 2.0], confidence=1.5),
        lambda: summarize([1.0, 2.0], n_boot=0),
        lambda: paired_permutation_p([1, 2], [1, 2, 3]),
        lambda: paired_permutation_p([], []),
        lambda: paired_diff([1, 2, 3], [1]),
        lambda: holm([]),
        lambda: holm([0.1, 1.2]),
        lambda: holm([-0.1]),
        lambda: prob_improvement([], [1.0]),
        lambda: prob_improvement([1.0], [float("inf")]),
        lambda: min_detectable_diff(-1.0, 5),
        lambda: min_detectable_diff(1.0, 5, alpha=0.0),
        lambda: min_detectable_diff(1.0, 5, power=1.0),
        lambda: min_detectable_diff(1.0, 5, power=0.01),
        lambda: min_detectable_diff(1.0, 2.5),
        lambda: seeds_needed(0.1, -1.0),
        lambda: seeds_needed(0.1, 1.0, max_n=1),
        lambda: t_test_power(0.1, 0.0, 5),
    ],
)
def test_bad_input_raises(call):
    with pytest.raises(ValueError):
        call()
