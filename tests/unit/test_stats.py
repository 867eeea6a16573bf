"""lopd.analysis.stats: hand-computed cases, scipy as the reference, simulation for power."""

import itertools
import math
import warnings

import numpy as np
import pytest
from scipy import stats

from lopd.analysis.power import joint_power, min_detectable_diff, seeds_needed, t_test_power
from lopd.analysis.stats import (
    bootstrap_allowed,
    eval_noise_share,
    holm,
    min_sign_flip_p,
    paired_t,
    prob_improvement,
    sign_flip_p,
    summarize,
    t_test,
)

SAMPLE = [0.71, 0.74, 0.69, 0.80, 0.77, 0.73, 0.75]


# ----------------------------------------------------------------- summarize
def test_summarize_t_ci_matches_scipy():
    s = summarize(SAMPLE, confidence=0.9)
    x = np.array(SAMPLE)
    lo, hi = stats.t.interval(0.9, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
    assert (s["n"], s["mean"], s["std"]) == (7, pytest.approx(x.mean()), pytest.approx(x.std(ddof=1)))
    assert (s["ci_low"], s["ci_high"]) == (pytest.approx(lo), pytest.approx(hi))
    assert s["ci_half"] == pytest.approx((hi - lo) / 2)


def test_summarize_has_no_iqm():
    # the interquartile mean of ten per-seed means trims to about five numbers and has no interval: dropped
    assert set(summarize([1, 2, 3, 4, 5, 6, 7, 100])) == {"n", "mean", "std", "ci_low", "ci_high", "ci_half"}


def test_summarize_single_and_constant():
    s = summarize([0.5])
    assert s["n"] == 1 and s["mean"] == 0.5 and all(math.isnan(s[k]) for k in ("std", "ci_low", "ci_high", "ci_half"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = summarize([2.0, 2.0, 2.0, 2.0])
    assert s["std"] == 0.0 and s["ci_low"] == s["ci_high"] == 2.0 and s["ci_half"] == 0.0


# ----------------------------------------------------------------- t-test
def test_t_test_hand_computed():
    # d = [1, 2, 3]: mean 2, sd 1, t = 2 / (1/sqrt 3) = 2 sqrt 3, df 2
    r = t_test([1.0, 2.0, 3.0], alternative="greater", confidence=0.95)
    assert r["t"] == pytest.approx(2 * math.sqrt(3)) and r["df"] == 2 and r["diff"] == pytest.approx(2.0)
    assert r["p"] == pytest.approx(stats.t.sf(2 * math.sqrt(3), 2))
    assert r["ci_low"] == pytest.approx(2.0 - stats.t.ppf(0.95, 2) / math.sqrt(3)) and r["ci_high"] == math.inf
    two = t_test([1.0, 2.0, 3.0])
    assert two["p"] == pytest.approx(2 * stats.t.sf(2 * math.sqrt(3), 2))
    assert two["ci_high"] - 2.0 == pytest.approx(stats.t.ppf(0.975, 2) / math.sqrt(3))


def test_paired_t_equals_ttest_rel_and_is_vectorised():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(2, 6, 9))
    r = paired_t(a, b, alternative="greater")
    ref = stats.ttest_rel(a, b, axis=-1, alternative="greater")
    np.testing.assert_allclose(r["p"], ref.pvalue)
    np.testing.assert_allclose(r["t"], ref.statistic)
    assert paired_t(a[2], b[2], alternative="greater")["p"] == pytest.approx(r["p"][2])


def test_t_test_degenerate_rows():
    r = t_test(np.array([[0.1, 0.1, 0.1], [0.0, 0.0, 0.0], [-0.2, -0.2, -0.2]]), alternative="greater")
    assert list(r["t"]) == [math.inf, 0.0, -math.inf] and list(r["p"]) == [0.0, 1.0, 1.0]
    assert math.isnan(t_test([0.3])["p"])


# ----------------------------------------------------------------- sign flip
def _brute(d, alternative):
    d = np.asarray(d, float)
    obs, hits = d.sum(), 0
    for s in itertools.product((1.0, -1.0), repeat=d.size):
        v = float(np.dot(s, d))
        hits += {"greater": v >= obs - 1e-12, "less": v <= obs + 1e-12,
                 "two-sided": abs(v) >= abs(obs) - 1e-12}[alternative]
    return hits / 2**d.size


def test_sign_flip_hand_cases():
    # d = [1, 2, 3]: only the identity reaches S = 6 -> 1/8 one-sided; |S| >= 6: 2/8 two-sided
    assert sign_flip_p([1.0, 2.0, 3.0], alternative="greater") == pytest.approx(1 / 8)
    assert sign_flip_p([1.0, 2.0, 3.0], [0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert sign_flip_p([1.0, 2.0, 3.0], alternative="less") == pytest.approx(1.0)
    # d = [1, 1, 1, -1], S = 2: S(s) >= 2 needs at most one of the four terms negative: 1 + 4 = 5 of 16;
    # |S(s)| >= 2: 10 of 16
    d = [1.0, 1.0, 1.0, -1.0]
    assert sign_flip_p(d, alternative="greater") == pytest.approx(5 / 16)
    assert sign_flip_p(d) == pytest.approx(10 / 16)
    assert sign_flip_p([0.0, 0.0, 0.0]) == 1.0


@pytest.mark.parametrize("alternative", ["greater", "less", "two-sided"])
@pytest.mark.parametrize("n", [2, 5, 9, 12])
def test_sign_flip_matches_brute_force_and_scipy(n, alternative):
    rng = np.random.default_rng(n)
    d = np.round(rng.normal(0.2, 1.0, n), 1)  # rounding makes ties between flipped sums
    ref = stats.permutation_test((d,), lambda x, axis: np.sum(x, axis=axis), permutation_type="samples",
                                 n_resamples=np.inf, vectorized=True, alternative=alternative).pvalue
    assert sign_flip_p(d, alternative=alternative) == pytest.approx(ref, abs=1e-12)
    if n <= 9:
        assert sign_flip_p(d, alternative=alternative) == pytest.approx(_brute(d, alternative), abs=1e-12)


def test_sign_flip_batched_and_exact_at_twenty():
    rng = np.random.default_rng(3)
    d = rng.normal(0.3, 1.0, (5, 8))
    np.testing.assert_allclose(sign_flip_p(d, alternative="greater"),
                               [sign_flip_p(row, alternative="greater") for row in d])
    assert sign_flip_p(np.arange(1.0, 21.0), alternative="greater") == 2.0**-20  # exact: only the identity
    # above 20 pairs: Monte Carlo, counting the observed labelling once
    assert sign_flip_p(np.arange(1.0, 26.0), alternative="greater", n_mc=999) == pytest.approx(1 / 1000)


def test_min_sign_flip_p():
    assert min_sign_flip_p(5) == 1 / 32 and min_sign_flip_p(5, alternative="two-sided") == 2 / 32
    assert min_sign_flip_p(4) == 0.0625  # > 0.05: four seeds can never reject one-sided at 0.05
    assert min_sign_flip_p(0) == 1.0


# ----------------------------------------------------------------- families, improvement, bootstrap rule
def test_holm_hand_worked():
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0]) and holm([0.2]) == pytest.approx([0.2])
    # sorted: .001*4=.004, .02*3=.06, .02*2=.04->.06, .3*1=.3
    assert holm([0.3, 0.001, 0.02, 0.02]) == pytest.approx([0.3, 0.004, 0.06, 0.06])


def test_prob_improvement_is_paired_by_seed_hand_counted_with_ties():
    # seed by seed: 1 < 2 (loss), 2 = 2 (tie, 1/2), 3 > 0 (win): (0 + 0.5 + 1) / 3
    assert prob_improvement([1, 2, 3], [2, 2, 0]) == pytest.approx(1.5 / 3)
    assert prob_improvement([2, 2, 0], [1, 2, 3]) == pytest.approx(1.5 / 3)
    # unpaired (all 9 pairs) this would be 6/9: pairing counts only same-seed comparisons
    assert prob_improvement([0.5, 0.6, 0.7, 0.8], [0.4, 0.7, 0.6, 0.9]) == pytest.approx(2 / 4)
    assert prob_improvement([1.0], [1.0]) == 0.5 and prob_improvement([5, 6], [1, 2]) == 1.0


def test_prob_improvement_refuses_unpaired_samples():
    with pytest.raises(ValueError, match="paired samples must have equal shapes"):
        prob_improvement([1, 2, 3], [1, 2])


def test_bootstrap_allowed_only_from_the_registered_seed_count():
    assert not bootstrap_allowed(3, 8) and not bootstrap_allowed(7, 8)
    assert bootstrap_allowed(8, 8) and bootstrap_allowed(10, 8)


# ----------------------------------------------------------------- power
def _mc_power(diff, std, n, alternative, sims=4000, seed=0):
    d = np.random.default_rng(seed).normal(diff, std, size=(sims, n))
    return float(np.mean(stats.ttest_1samp(d, 0.0, axis=1, alternative=alternative).pvalue < 0.05))


@pytest.mark.parametrize("n,alternative", [(5, "greater"), (12, "greater"), (8, "two-sided")])
def test_min_detectable_diff_power_by_simulation(n, alternative):
    mdd = min_detectable_diff(0.05, n, alternative=alternative)
    assert t_test_power(mdd, 0.05, n, alternative=alternative) == pytest.approx(0.8, abs=1e-9)
    assert _mc_power(mdd, 0.05, n, alternative, seed=n) == pytest.approx(0.8, abs=0.03)


def test_min_detectable_diff_monotone_and_scaling():
    vals = [min_detectable_diff(0.1, n) for n in range(2, 30)]
    assert all(v1 > v2 for v1, v2 in zip(vals, vals[1:]))
    assert min_detectable_diff(0.1, 1) == math.inf and min_detectable_diff(0.0, 5) == 0.0
    assert min_detectable_diff(0.2, 8) == pytest.approx(2 * min_detectable_diff(0.1, 8))
    # a one-sided test detects smaller effects than a two-sided one
    assert min_detectable_diff(0.1, 8) < min_detectable_diff(0.1, 8, alternative="two-sided")


def test_seeds_needed_matches_the_test_actually_run():
    std = 0.1
    for n in (5, 10, 25):  # the exact test can reject from n = 5 on (1/32 < 0.05), so t-power decides
        mdd = min_detectable_diff(std, n)
        assert seeds_needed(mdd, std) == n and seeds_needed(mdd * 0.999, std) == n + 1
    # a huge effect: 2 seeds give the t-test its power, but the exact check needs 1/2^n < 0.05: n = 5
    assert t_test_power(1.0, 0.01, 2) > 0.99 and seeds_needed(1.0, 0.01) == 5
    assert seeds_needed(1.0, 0.01, alternative="two-sided") == 6  # 2/2^5 = 0.0625, 2/2^6 < 0.05
    assert seeds_needed(0.0, std) is None and seeds_needed(-0.05, std) is None  # wrong direction, one-sided
    assert seeds_needed(1e-4, std, max_n=50) is None and seeds_needed(0.1, 0.0) == 5


def test_joint_power_by_simulation():
    # one contrast: the joint power is the t-test power
    assert joint_power([0.05], [[0.05**2]], 8, n_sim=6000) == pytest.approx(t_test_power(0.05, 0.05, 8), abs=0.02)
    # two independent contrasts: the product of the powers
    p = t_test_power(0.05, 0.05, 8)
    assert joint_power([0.05, 0.05], np.eye(2) * 0.05**2, 8, n_sim=6000) == pytest.approx(p * p, abs=0.025)


# ----------------------------------------------------------------- evaluation noise
def test_eval_noise_share_hand_computed():
    # seeds × tasks × samples; per-seed means 0.75 and 0.25 -> V = 0.125; within-task variances (ddof=1)
    # 0.5, 0, 0, 0.5 -> E_K = mean over seeds of (1/2)^2 * 0.5 / 2 = 0.0625
    x = [[[0, 1], [1, 1]], [[0, 0], [1, 0]]]
    r = eval_noise_share(x)
    assert r["seed_var"] == pytest.approx(0.125) and r["eval_var"] == pytest.approx(0.0625)
    assert r["share"] == pytest.approx(0.5)
    assert r["eval_var_1"] == pytest.approx(0.125) and r["share_1"] == pytest.approx(0.125 / 0.1875)
    # weights: all on task 0 -> m = (0.5, 0), V = 0.125; E_K = mean(1 * 0.5 / 2, 0) = 0.125: share 1
    r = eval_noise_share(x, weights=[1.0, 0.0])
    assert r["seed_var"] == pytest.approx(0.125) and r["eval_var"] == pytest.approx(0.125)
    assert r["share"] == pytest.approx(1.0)


# ----------------------------------------------------------------- bad input
# each bad call with the start of *our* message: numpy raises ValueError on some of these inputs by
# itself (e.g. float("a")), so a bare ValueError would pass even if our check were gone
@pytest.mark.parametrize("call, match", [
    (lambda: summarize([]), r"x needs at least 1 value"),
    (lambda: summarize([1.0, float("nan")]), r"x must contain only finite values"),
    (lambda: summarize([[1.0, 2.0]]), r"x must be 1-dimensional, got shape \(1, 2\)"),
    (lambda: summarize(["a", "b"]), r"x must be numbers"),
    (lambda: summarize([1.0, 2.0], confidence=1.5), r"confidence must be strictly between 0 and 1, got 1\.5"),
    (lambda: t_test([1.0, 2.0], alternative="bigger"), r"alternative must be one of .* got 'bigger'"),
    (lambda: paired_t([1, 2], [1, 2, 3]), r"paired samples must have equal shapes, got \(2,\) and \(3,\)"),
    (lambda: sign_flip_p([]), r"a needs at least 1 value"),
    (lambda: sign_flip_p([1, 2, 3], [1]), r"paired samples must have equal shapes"),
    (lambda: sign_flip_p([1.0, 2.0], n_mc=0), r"n_mc must be a positive integer, got 0"),
    (lambda: holm([]), r"pvals needs at least 1 value"),
    (lambda: holm([0.1, 1.2]), r"pvals must lie in \[0, 1\]"),
    (lambda: prob_improvement([], [1.0]), r"a needs at least 1 value"),
    (lambda: min_detectable_diff(-1.0, 5), r"std must be non-negative and finite"),
    (lambda: min_detectable_diff(1.0, 5, alpha=0.0), r"alpha must be strictly between 0 and 1, got 0\.0"),
    (lambda: min_detectable_diff(1.0, 5, power=0.01), r"power \(0\.01\) must exceed alpha \(0\.05\)"),
    (lambda: seeds_needed(0.1, -1.0), r"need finite diff, finite std ≥ 0 .*\(got 0\.1, -1\.0, "),
    (lambda: seeds_needed(0.1, 1.0, max_n=1), r"integer max_n ≥ 2 \(got 0\.1, 1\.0, 1\)"),
    (lambda: t_test_power(0.1, 0.0, 5), r"std must be positive and finite"),
    (lambda: joint_power([0.1, 0.1], [[1.0]], 5), r"cov must be a finite 2×2 matrix, got shape \(1, 1\)"),
    (lambda: eval_noise_share([[[1.0]], [[0.0]]]), r"samples must be \(seeds ≥ 2\) × tasks × \(K ≥ 2 samples\)"),
    (lambda: eval_noise_share([[[1.0, 0.0]], [[0.0, 1.0]]], weights=[0.5]),
     r"weights must be one non-negative weight per task, summing to 1"),
])
def test_bad_input_raises(call, match):
    """Bad input is refused by our own check (its message), not by a numpy error on the way."""
    with pytest.raises(ValueError, match=match):
        call()
