"""Calibration of the falsification rule by simulation (lopd.analysis.calibration).

On synthetic per-(arm, seed, task, sample) rewards with task effects, a training-seed random effect, an
upstream-draw (bank and φ0) random effect shared by the arms that use them, and sampling noise (common random
numbers across arms), the report's own verdict function is run on report.design.n_sim simulated experiments
per scenario, with the params.yaml rule and design and, as the final runs do (train.per_seed_draws), each
training seed its own upstream draw:

* with no content effect, the full verdict claims "content drives a gain" in at most α of them, up to
  Monte-Carlo error: the test fails if the exact one-sided binomial test rejects "rate ≤ α" at level 0.01
  (for α = 0.05 and 400 experiments: 32 or more false claims, 8%);
* with the planted effect the default is designed for (report.design.effect, report.design.n_seeds seeds
  for every arm the rule names), it claims it in at least POWER_FLOOR of them (the rate measured with the
  draw component, minus a Monte-Carlo margin; see the test);
* with one draw shared by every seed (train.per_seed_draws: false) the draw's shift does not average out
  over seeds, and the false-claim rate under the least favourable null exceeds α: why the draws are
  replicated;
* the simulated draw effect has the structure its docstring states (correlation between arms sharing a
  draw, none for base, constant over seeds with a shared draw).

Each test prints its empirical rate with a 95% Clopper–Pearson interval (``pytest -s`` or ``-rA``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from scipy import stats

import numpy as np

from lopd.analysis.calibration import claim_rates, scenarios, simulate_seed_means
from lopd.analysis.falsification import Rule
from lopd.config import load_params

FP_LEVEL = 0.01  # significance of the binomial check that the false-positive rate exceeds alpha
PARAMS = load_params(Path(__file__).resolve().parents[2] / "params.yaml")
RULE = Rule.from_params(PARAMS.report)
DESIGN = PARAMS.report.design
N_EXP = DESIGN.n_sim
PER_SEED = PARAMS.train.per_seed_draws
# With the between-draw component measured at the 96-step horizon (report.design.draw_sd 0.021, draw_corr 0.9,
# per-seed draws) the rule's power at the design effect with 10 seeds measured 0.671 over 2000 simulated
# experiments (claim_rates(RULE, scenarios(RULE, DESIGN.effect)["design"], DESIGN, n_exp=2000, seed=5)): under
# report.design.power (0.8; 12 seeds gave 0.787, 14 gave 0.864). The floor is that figure less 3 Monte-Carlo
# s.e. at N_EXP = 400; half the design effect must stay below it.
POWER_FLOOR = 0.671 - 3 * (0.671 * 0.329 / 400) ** 0.5


def _rate(name: str, rates: dict, key: str = "claim") -> tuple[float, int, tuple[float, float]]:
    k = round(rates[key] * rates["n_exp"])
    ci = stats.binomtest(k, rates["n_exp"]).proportion_ci(0.95, method="exact")
    print(f"\n[calibration] {name}: P({key}) = {rates[key]:.4f} ({k}/{rates['n_exp']}; 95% CI "
          f"[{ci.low:.4f}, {ci.high:.4f}]); gain {rates['gain']:.3f}, content {rates['content']:.3f}, "
          f"claim by the sign-flip tests {rates['claim_robust']:.4f}; alpha = {RULE.alpha}, "
          f"{DESIGN.n_seeds} seeds, effect {DESIGN.effect:g}")
    return rates[key], k, (ci.low, ci.high)


@pytest.mark.parametrize("scenario", ["global_null", "content_null", "least_favourable"])
def test_false_claim_rate_is_at_most_alpha(scenario):
    effects = scenarios(RULE, DESIGN.effect)[scenario]
    rates = claim_rates(RULE, effects, DESIGN, n_exp=N_EXP, seed=11, per_seed_draws=PER_SEED)
    rate, k, _ = _rate(f"false-positive rate, {scenario}", rates)
    # exact one-sided binomial test of H0: rate <= alpha; fails only on strong evidence of a rate above alpha
    assert stats.binomtest(k, N_EXP, RULE.alpha, alternative="greater").pvalue >= FP_LEVEL, rate
    assert rates["claim_robust"] <= rate + 0.03  # the robustness check is no more liberal than the t-test
    if scenario != "global_null":
        assert rates["gain"] > 0.99  # part (i) is true here: only part (ii) can stop a false claim


def test_planted_design_effect_is_detected_with_the_designed_power():
    effects = scenarios(RULE, DESIGN.effect)["design"]
    rates = claim_rates(RULE, effects, DESIGN, n_exp=N_EXP, seed=12, per_seed_draws=PER_SEED)
    rate, _, _ = _rate("power at the design effect", rates)
    assert rate >= POWER_FLOOR


def test_half_the_design_effect_is_underpowered():
    """The power figure is informative: the same rule misses half the designed effect most of the time."""
    effects = scenarios(RULE, DESIGN.effect / 2)["design"]
    rate, _, _ = _rate("power at half the design effect", claim_rates(RULE, effects, DESIGN, n_exp=N_EXP, seed=13,
                                                                      per_seed_draws=PER_SEED))
    assert rate < POWER_FLOOR


def test_a_shared_draw_makes_the_rule_claim_too_often():
    """With one bank and cold-start draw for every seed, the draw's shift of lopd − control is the same in
    every paired unit, so the tests over seeds take it for an effect: under the least favourable null the
    false-claim rate is above α (exact binomial test, as above). Replicating the draws per seed removes it."""
    effects = scenarios(RULE, DESIGN.effect)["least_favourable"]
    rates = claim_rates(RULE, effects, DESIGN, n_exp=N_EXP, seed=14, per_seed_draws=False)
    rate, k, _ = _rate("false-positive rate, least_favourable, one shared draw", rates)
    assert stats.binomtest(k, N_EXP, RULE.alpha, alternative="greater").pvalue < FP_LEVEL, rate


def test_the_draw_effect_has_the_stated_structure():
    """No task, seed or sampling noise worth the name (seed_sd 0, rewards mid-range, many samples): the
    per-seed means then show the draw effect alone. Arms that use the draw correlate at draw_corr with sd
    draw_sd; base is untouched; with a shared draw every seed of an experiment has the same shift."""
    design = DESIGN.model_copy(update={"seed_sd": 0.0, "draw_sd": 0.05, "draw_corr": 0.5, "task_reward_low": 0.45,
                                       "task_reward_high": 0.5, "n_tasks": 64, "samples_per_task": 64})
    arms = {"lopd": 0.0, "lopd_shuffled": 0.0, "base": 0.0}
    v = simulate_seed_means(arms, design, n_exp=200, n_seeds=4, seed=3)
    dev = {a: (x - x.mean()).ravel() for a, x in v.items()}
    assert np.std(dev["lopd"]) == pytest.approx(0.05, rel=0.15)
    assert np.corrcoef(dev["lopd"], dev["lopd_shuffled"])[0, 1] == pytest.approx(0.5, abs=0.1)
    assert np.std(dev["base"]) < 0.01  # sampling noise only: base does not use the bank or φ0
    shared = simulate_seed_means(arms, design, n_exp=200, n_seeds=4, seed=3, per_seed_draws=False)
    within = shared["lopd"] - shared["lopd"].mean(axis=1, keepdims=True)
    assert np.std(within) < 0.01 < np.std(shared["lopd"].mean(axis=1))


def test_the_confirmation_design_from_a_pilot_covariance():
    """The registration's design (lopd.confirmation.registration.design) on a pilot of 10 seeds whose rule
    contrasts have sd 0.05 and correlation 0.5: the simulated false-claim rates of the primary are at most α
    (every contrast at 0; one at 0 and the others far above, the least favourable boundary: ≈ α), power grows
    with the seeds, the robust label's power is at most the primary's, and at the seeds it says it needs
    the primary's power reaches the target."""
    from lopd.analysis.power import joint_power
    from lopd.confirmation.registration import design

    rng = np.random.default_rng(3)
    cov = 0.05 ** 2 * (0.5 * np.ones((4, 4)) + 0.5 * np.eye(4))
    pilot = rng.multivariate_normal(np.full(4, 0.1), cov, size=10)
    names = [f"t{i}" for i in range(4)]
    kw = dict(effect=0.04, n_points=3, alpha=0.05, power=0.8, upper=0.8, n_sim=2000, n_sim_null=20000)
    d10, d40 = design(names, pilot, n_seeds=10, **kw), design(names, pilot, n_seeds=40, **kw)
    for d in (d10, d40):
        assert d["false_claim_all_null"] <= 0.05
        # the others far above 0 always reject: each boundary's rate is α less nothing; the plain shares
        # (20000 experiments each) scatter around α within 4 s.e.
        assert d["false_claim_by_boundary"] == [0.05] * 4 and d["false_claim_boundary"] == 0.05
        assert d["false_claim_se"] == 0.0
        for r, se in zip(d["false_claim_raw"], d["false_claim_raw_se"]):
            assert abs(r - 0.05) < 4 * se and se == pytest.approx(np.sqrt(r * (1 - r) / 20000))
        assert d["power_robust"] <= d["power_primary"]
    assert d10["power_primary"] < d40["power_primary"]
    need = d10["seeds_needed_primary"]
    assert need is not None and need == d40["seeds_needed_primary"]
    cov_u = np.atleast_2d(np.cov(pilot, rowvar=False)) * d10["factor"]
    assert joint_power(np.full(4, 0.04), cov_u, need, n_sim=2000) >= 0.8
    assert design(names, pilot[:2], n_seeds=10, **kw) == {"why": "the pilot has fewer than 3 seeds shared by every "
                                                                 "test of the rule"}


def test_the_design_prints_its_false_claim_rates_with_their_monte_carlo_error():
    """The registered design's false-claim sentence, by hand: every-null rate, the least favourable rate (α
    less the chance another test fails) with its s.e. and each boundary's, the plain shares with their s.e.
    and the largest's distance from α in s.e. ((0.0543 − 0.05) / 0.0016 = +2.7); a share 4.4 s.e. above α
    is flagged."""
    from lopd.analysis.confirm_report import false_claim_lines

    d = {"n_sim_null": 20000, "false_claim_all_null": 0.0005, "false_claim_boundary": 0.05, "false_claim_se": 0.0,
         "false_claim_by_boundary": [0.0499, 0.05], "false_claim_raw": [0.0489, 0.0543],
         "false_claim_raw_se": [0.0016, 0.0016], "alpha": 0.05}
    (line,) = false_claim_lines(d)
    assert "0.0005 with every contrast at 0; **0.0500** ± 0.0000 at the least favourable boundary" in line
    assert "(by boundary 0.0499, 0.0500)" in line
    assert "0.0489 ± 0.0016, 0.0543 ± 0.0016 (largest +2.7 s.e. from α)" in line
    flagged = false_claim_lines({**d, "false_claim_raw": [0.0489, 0.057]})
    assert len(flagged) == 3 and "lies 4.4 s.e. above α" in flagged[2]


def test_the_boundary_false_claim_rate_is_alpha_less_the_chance_another_test_fails():
    """lopd.analysis.power.boundary_false_claim on independent contrasts: with the others far above 0 they
    always reject, so the rate is α exactly (s.e. 0) and the plain share equals the test at 0's rejections;
    with the others at 0 too, P(test 0 rejects, another does not) is α·(1 − α²) = 0.049875 by independence, so
    both estimates are of α³ = 0.000125 (the control variate now the noisier), each within 4 s.e."""
    from lopd.analysis.power import boundary_false_claim, joint_rejections

    cov = np.eye(3) * 0.04 ** 2
    far = boundary_false_claim(0, np.full(3, 1.0), cov, 12, alpha=0.05, n_sim=20000)
    assert far["rate"] == 0.05 and far["rate_se"] == 0.0
    assert far["raw"] == float(np.mean(joint_rejections([0.0, 1.0, 1.0], cov, 12, alpha=0.05, n_sim=20000)[:, 0]))
    assert abs(far["raw"] - 0.05) < 4 * far["raw_se"]
    null = boundary_false_claim(0, np.zeros(3), cov, 12, alpha=0.05, n_sim=20000)
    assert abs(null["rate"] - 0.000125) < 4 * null["rate_se"]
    assert abs(null["raw"] - 0.000125) < 4 * max(null["raw_se"], 1e-4)


def test_the_design_section_says_which_of_primary_and_robust_label_is_powered():
    """design_lines, by hand, on the three cases: the primary under-powered (the warning of a weak test), the
    primary powered and the robust label not (robustness weakly tested), both powered (said so, with figures)."""
    from lopd.analysis.confirm_report import design_lines

    d = {"pilot_n": 10, "upper": 0.8, "factor": 1.67, "effect": 0.04, "alpha": 0.05, "n_sim": 400, "n_seeds": 32,
         "power_target": 0.8, "power_primary": 0.93, "seeds_needed_primary": 22, "n_points": 3, "power_robust": 0.81,
         "seeds_needed_robust": 32, "tests": ["t"], "sd": [0.05], "sd_upper": [0.065], "n_sim_null": 20000,
         "false_claim_all_null": 0.0, "false_claim_boundary": 0.05, "false_claim_se": 0.0,
         "false_claim_by_boundary": [0.05], "false_claim_raw": [0.05], "false_claim_raw_se": [0.0015]}

    def text(**kw):
        return "\n".join(design_lines({"design": {**d, **kw}}))

    both = text()
    assert ("Powered by its own registered design: 32 seeds give the primary power 0.93 and the robust label at "
            "least 0.81 at effect 0.04, against the 80% asked.") in both and "Under-powered" not in both
    robust = text(power_robust=0.5)
    assert "**The primary is powered (0.93), the robust label is not: 32 seeds give it power 0.50" in robust
    weak = text(n_seeds=10, power_primary=0.3, power_robust=0.03)
    assert "**Under-powered by its own registered design: 10 seeds give power 0.30" in weak
    assert "robust label is not" not in weak and "Powered by" not in weak
