"""The ``report`` section: statistics, the pre-registered falsification rule and the seed-count design."""

from __future__ import annotations

from pydantic import Field, model_validator

from lopd.config.section import DistinctList, Section
from lopd.config.stages import ARMS


class RuleParams(Section):
    """The pre-registered falsification rule: its text (rendered first) and its structure."""

    text: str = Field(description="the rule as registered, rendered before any number")
    treatment: str = Field(description="the arm whose claim is tested")
    gain_over: DistinctList[str] = Field(description="part (i): the treatment must beat each of these arms")
    content_controls: DistinctList[str] = Field(description="part (ii): and each of these content controls")
    rho: float | None = Field(gt=0, lt=1, description="smallest effect of interest in (0, 1): a content test "
                                                      "asks (treatment − control) > rho·(treatment − rho_baseline); "
                                                      "null = off")
    rho_baseline: str = Field(description="the arm in rho·(treatment − rho_baseline)")

    @model_validator(mode="after")
    def _arms(self):
        named = [self.treatment, *self.gain_over, *self.content_controls, self.rho_baseline]
        unknown = sorted({a for a in named if a not in ARMS})
        if unknown:
            raise ValueError(f"report.rule names unknown arm(s) {unknown}; known arms: {', '.join(ARMS)}")
        others = [*self.gain_over, *self.content_controls]
        if len(set(others)) != len(others) or self.treatment in others:
            raise ValueError("report.rule: gain_over and content_controls must not share an arm, and must not "
                             "contain the treatment arm")
        return self


class DesignParams(Section):
    """What the default seed count is sized for; tests/unit/test_calibration.py simulates it."""

    effect: float = Field(gt=0, lt=1, description="content effect lopd − control (= lopd − base) in mean test "
                                                  "reward")
    n_seeds: int = Field(ge=2, description="seeds of every arm the rule names")
    seed_sd: float = Field(ge=0, description="training-seed sd of an arm's mean test reward")
    draw_sd: float = Field(ge=0, description=(
        "sd of the shift one bank and cold-start draw gives the mean test reward of an arm that uses them "
        "(every arm with a retrieval or learned context); base-like arms get none"))
    draw_corr: float = Field(ge=0, le=1, description=(
        "correlation of that shift between two such arms at the same draw (they share the bank and phi0); "
        "0.5 makes every contrast's between-draw sd equal draw_sd"))
    n_tasks: int = Field(ge=1, description="test tasks in the simulated evaluation")
    samples_per_task: int = Field(ge=1, description="test rollouts per task in the simulated evaluation")
    task_reward_low: float = Field(ge=0, le=1, description="per-task success probabilities ~ U(low, high): low")
    task_reward_high: float = Field(ge=0, le=1, description="per-task success probabilities ~ U(low, high): high")
    power: float = Field(gt=0, lt=1, description="the power the design must reach")
    pilot_upper: float = Field(gt=0, lt=1, description=(
        "sizing a confirmatory run from this run as a pilot: the rule's per-seed contrast covariance is inflated "
        "to this one-sided upper confidence bound of a variance before the power at the registered effect is "
        "simulated (reports/seed_variance.md)"))
    n_sim: int = Field(ge=50, description="simulated experiments per design-power figure (report and "
                                          "calibration tests)")
    n_sim_null: int = Field(ge=100, description=(
        "simulated experiments per scenario of a confirmation's registered design (the procedure's false-claim "
        "rates at the global null and each least favourable boundary, and its power, lopd.analysis.procedure): a "
        "rate near 0.05 gets a Clopper-Pearson 95% interval of about +-0.0043 at 10000, +-0.0030 at 20000; the "
        "time grows linearly (about 20 s at 10000 with 32 seeds, 3 points, 5 arms, 128 tasks x 4 samples)"))

    @model_validator(mode="after")
    def _range(self):
        if self.task_reward_low >= self.task_reward_high or self.task_reward_high + self.effect > 1:
            raise ValueError("report.design: need task_reward_low < task_reward_high and "
                             "task_reward_high + effect <= 1")
        return self


class ReportParams(Section):
    """Tables, figures, audits and the verdict under reports/."""

    alpha: float = Field(gt=0, lt=1, description="significance level of the rule's one-sided paired t-tests")
    n_boot: int = Field(ge=100, description="efficiency-CI bootstrap resamples")
    min_bootstrap_seeds: int = Field(ge=2, description="fewest seeds per arm for which a percentile bootstrap "
                                     "interval is reported; below, t-intervals only")
    rule: RuleParams = Field(description="the pre-registered falsification rule, rendered before any number")
    design: DesignParams = Field(description="what the seed count is sized for (tests/unit/test_calibration.py "
                                             "simulates it)")
    margin_contrasts: list[list[str]] = Field(description=(
        "pairs [a, b] compared as a − b over shared seeds, two-sided and outside the rule, in falsification.md: "
        "lopd against the arms whose β never reads Δ(φ) (does the margin's feedback matter?), lopd_binding "
        "against lopd_frozen (the paper's mechanism)"))

    @model_validator(mode="after")
    def _contrasts(self):
        for pair in self.margin_contrasts:
            if len(pair) != 2 or pair[0] == pair[1]:
                raise ValueError(f"report.margin_contrasts: each entry must be two different arms, got {pair}")
        unknown = sorted({a for pair in self.margin_contrasts for a in pair if a not in ARMS})
        if unknown:
            raise ValueError(f"report.margin_contrasts names unknown arm(s) {unknown}; known arms: {', '.join(ARMS)}")
        return self
