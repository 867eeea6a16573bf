"""The ``confirm`` section: the confirmatory run, registered (stage ``register``) before its split is read."""

from __future__ import annotations

from pydantic import Field, model_validator

from lopd.arms import ARMS
from lopd.config.section import Bound, DistinctList, DistinctOrEmptyList, Section


class ConfirmParams(Section):
    """The confirmation (lopd.confirmation): the rule's arms (report.rule; base shared) at every point of S on
    fresh seeds, evaluated on the confirmatory split."""

    slots: DistinctList[int, Bound(ge=0)] = Field(description=(
        "the slots of S (stages confirm_train@<slot>, slot i running point p<i>): 0, 1, ..., cap - 1. S = the selected trial, the trials tied "
        "with it by seed, the best trial whose margin binds; distinct points, at most this many, by val rank"))
    split_round: int = Field(ge=0, description=(
        "which fresh confirmatory split: round r is drawn after rounds 0..r-1 and shares no prompt or solution with "
        "them (lopd.confirmation.split); round 0 is the split the ledger's first five registrations read. A new "
        "registration needs a round and seeds no registration has read (registration/ledger.yaml: register refuses)"))
    seeds: DistinctList[int, Bound(ge=0)] = Field(description=(
        "fresh training seeds of every arm at every point (none a seed of train.seeds or train.extra_seeds); "
        "seed s's bank and cold-start draw (stage confirm_draw@s) is shared by every point"))
    effect: float = Field(gt=0, lt=1, description=(
        "the registered smallest effect of interest: every contrast of the rule, in mean test reward; the design "
        "(power, seeds needed) is computed at it"))

    mechanism_controls: DistinctOrEmptyList[str] = Field(description=(
        "H2, the paper's mechanism, registered when S has a binding point: at that point lopd (whose margin binds "
        "there) beats each of these arms, trained at that point on the confirmation seeds; one-sided paired t-tests "
        "at report.alpha, all must reject (intersection-union); [] = no H2"))
    efficiency_fractions: DistinctOrEmptyList[float, Bound(gt=0)] = Field(description=(
        "registered checkpoints of the efficiency curve on the confirmatory split, as fractions of the training "
        "steps: after round(f × steps) steps (at least 1, below the last, distinct; the last step's student is the "
        "run's own) the selected point's lopd and the baseline keep their students, and confirm_evaluate evaluates "
        "each; [] = no efficiency curve"))
    efficiency_baseline: str | None = Field(description=(
        "the arm lopd's efficiency is measured against (GRPO): trained at slot 0 on the confirmation seeds at its "
        "own values tuned on val (hpo/baselines.yaml), evaluated at the same checkpoints; null = none"))

    @model_validator(mode="after")
    def _slots(self):
        if self.slots != list(range(len(self.slots))):
            raise ValueError(f"confirm.slots must be 0, 1, ..., n - 1 (the slots of S), got {self.slots}")
        if any(f >= 1 for f in self.efficiency_fractions):
            raise ValueError(f"confirm.efficiency_fractions must be < 1 (the last step's student is the run's own), "
                             f"got {self.efficiency_fractions}")
        bad = [a for a in self.mechanism_controls if a not in ARMS or not ARMS[a].trains or a == "lopd"]
        if bad:
            raise ValueError(f"confirm.mechanism_controls: {', '.join(map(repr, bad))} is not a trained arm other "
                             f"than lopd (arms: {', '.join(ARMS)})")
        if self.efficiency_fractions and self.efficiency_baseline is None:
            raise ValueError("confirm.efficiency_fractions needs confirm.efficiency_baseline (the arm lopd is "
                             "measured against)")
        return self

    def efficiency_steps(self, steps: int) -> list[int]:
        """The registered checkpoints for runs of ``steps`` steps: round(f × steps) for each fraction, at least 1,
        below ``steps``, distinct, increasing."""
        return sorted({max(1, round(f * steps)) for f in self.efficiency_fractions} - {steps})
