"""Calibration of the falsification rule by simulation (lopd.analysis.calibration).

On synthetic per-(arm, seed, task, sample) rewards with task effects, a training-seed random effect and
sampling noise (common random numbers across arms), the report's own verdict function is run on
report.design.n_sim simulated experiments per scenario, with the params.yaml rule and design:

* with no content effect, the full verdict claims "content drives a gain" in at most α of them, up to
  Monte-Carlo error: the test fails if the exact one-sided binomial test rejects "rate ≤ α" at level 0.01
  (for α = 0.05 and 400 experiments: 32 or more false claims, 8%);
* with the planted effect the default is designed for (report.design.effect, report.design.n_seeds seeds
  for every arm the rule names), it claims it in at least report.design.power (80%) of them.

Each test prints its empirical rate with a 95% Clopper–Pearson interval (``pytest -s`` or ``-rA``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from scipy import stats

from lopd.analysis.calibration import claim_rates, scenarios
from lopd.analysis.falsification import Rule
from lopd.config import load_params

FP_LEVEL = 0.01  # significance of the binomial check that the false-positive rate exceeds alpha
PARAMS = load_params(Path(__file__).resolve().parents[1] / "params.yaml")
RULE = Rule.from_params(PARAMS.report)
DESIGN = PARAMS.report.design
N_EXP = DESIGN.n_sim


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
    rates = claim_rates(RULE, effects, DESIGN, n_exp=N_EXP, seed=11)
    rate, k, _ = _rate(f"false-positive rate, {scenario}", rates)
    # exact one-sided binomial test of H0: rate <= alpha; fails only on strong evidence of a rate above alpha
    assert stats.binomtest(k, N_EXP, RULE.alpha, alternative="greater").pvalue >= FP_LEVEL, rate
    assert rates["claim_robust"] <= rate + 0.03  # the robustness check is no more liberal than the t-test
    if scenario != "global_null":
        assert rates["gain"] > 0.99  # part (i) is true here: only part (ii) can stop a false claim


def test_planted_design_effect_is_detected_with_the_designed_power():
    effects = scenarios(RULE, DESIGN.effect)["design"]
    rates = claim_rates(RULE, effects, DESIGN, n_exp=N_EXP, seed=12)
    rate, _, _ = _rate("power at the design effect", rates)
    assert rate >= DESIGN.power


def test_half_the_design_effect_is_underpowered():
    """The power figure is informative: the same rule misses half the designed effect most of the time."""
    effects = scenarios(RULE, DESIGN.effect / 2)["design"]
    rate, _, _ = _rate("power at half the design effect", claim_rates(RULE, effects, DESIGN, n_exp=N_EXP, seed=13))
    assert rate < DESIGN.power
