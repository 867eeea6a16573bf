"""The ``confirm`` section: the confirmatory run, registered (stage ``register``) before its split is read."""

from __future__ import annotations

from pydantic import Field, model_validator

from lopd.config.section import Bound, DistinctList, Section


class ConfirmParams(Section):
    """The confirmation (lopd.confirmation): the rule's arms (report.rule; base shared) at every point of S on
    fresh seeds, evaluated on the confirmatory split."""

    points: DistinctList[int, Bound(ge=0)] = Field(description=(
        "the slots of S (stages confirm_train@<slot>, slot i running point p<i>): 0, 1, ..., cap - 1. S = the selected trial, the trials tied "
        "with it by seed, the best trial whose margin binds; distinct points, at most this many, by val rank"))
    seeds: DistinctList[int, Bound(ge=0)] = Field(description=(
        "fresh training seeds of every arm at every point (none a seed of train.seeds or train.extra_seeds); "
        "seed s's bank and cold-start draw (stage confirm_draw@s) is shared by every point"))
    effect: float = Field(gt=0, lt=1, description=(
        "the registered smallest effect of interest: every contrast of the rule, in mean test reward; the design "
        "(power, seeds needed) is computed at it"))

    @model_validator(mode="after")
    def _slots(self):
        if self.points != list(range(len(self.points))):
            raise ValueError(f"confirm.points must be 0, 1, ..., n - 1 (the slots of S), got {self.points}")
        return self
