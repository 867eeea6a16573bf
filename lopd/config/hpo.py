"""Sections of the validation-only search (``hpo``) and the sensitivity grid (``sensitivity``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from lopd.arms import ARMS as ARM_REGISTRY
from lopd.config.section import Bound, DistinctList, DistinctOrEmptyList, Section


def training_arms(arms: list[str], key: str) -> list[str]:
    """``arms`` if each is a registered arm that trains; else the error naming ``key`` and the others."""
    bad = [a for a in arms if a not in ARM_REGISTRY or not ARM_REGISTRY[a].trains]
    if bad:
        raise ValueError(f"{key} must be training arms; not training arms: {bad}")
    return arms


class HpoParams(Section):
    """Optuna TPE over margin, K, n_ret, the student learning rate and η_β, on the VALIDATION split only."""

    n_trials: int = Field(ge=1, description="search trials in all (a rerun with more resumes the study)")
    seed: int = Field(ge=0, description="seed of the TPE sampler")
    study_name: str = Field(description="Optuna study name in the journal file")
    margin_choices: DistinctList[float, Bound(ge=0)] = Field(description="margins m searched (nats per token, ≥ 0)")
    k_choices: DistinctList[int, Bound(ge=1)] = Field(description="K searched: latent tokens per experience "
                                                                 "(each ≤ cold_start.k_max)")
    eta_beta_choices: DistinctList[float, Bound(gt=0)] = Field(description=(
        "η_β searched: the dual step of β ← max(0, β + η_β (m − Δ(φ))), on a log grid wide enough that a margin the "
        "runs can reach moves β as fast as an open-loop ramp does"))
    n_ret_min: int = Field(ge=1, description="smallest n_ret searched (retrieved experiences per task)")
    n_ret_max: int = Field(ge=1, description="largest n_ret searched (≤ cold_start.n_ret_max)")
    lr_choices: DistinctList[float, Bound(gt=0)] = Field(description="student learning rates: searched for LOPD, "
                                                                    "chosen for each baseline arm")
    baseline_arms: DistinctOrEmptyList[str] = Field(description="training arms tuned on val, each over its own "
                                                                "knob: lopd_fixbeta its β over beta_fixed_choices "
                                                                "(at the selected point), the others their student "
                                                                "learning rate over lr_choices")
    group_size_choices: DistinctList[int, Bound(ge=2)] = Field(description="GRPO group sizes searched (each "
                                                                        "divides train.tasks_per_step)")
    searched_arms: DistinctOrEmptyList[str] = Field(description=(
        "arms searched like LOPD over their own coordinates (search_axes), with the same trial budget, seeds, "
        "confirmation, tie rule and boundary rule (lopd.hpo.search); LOPD itself always searches margin, K, "
        "n_ret, lr_student and eta_beta"))
    search_axes: dict[str, list[str]] = Field(description=(
        "the coordinates each searched arm searches, of margin, K, n_ret, lr_student, eta_beta, group_size (each one the "
        "arm reads); what it does not search it takes from LOPD's selection where it reads it, else train"))
    max_extensions: int = Field(ge=0, description=(
        "the boundary rule, registered before the search: a selected value on an edge of its coordinate's "
        "choices (not a natural bound) extends that coordinate one step and the search continues, at most this "
        "many times per arm (and per one-knob grid of baseline_arms); a value still on an edge after the last is "
        "flagged"))
    trials_per_extension: int = Field(ge=1, description="trials each extension adds to an arm's search")
    beta_fixed_choices: DistinctList[float, Bound(ge=0)] = Field(description="lopd_fixbeta's constant β values "
                                                                             "tuned on val")
    binding_min_frac: float = Field(gt=0.0, le=1.0, description=(
        "lopd_binding's point is the best completed trial whose margin binds (constraint status 'binds', "
        "lopd.analysis.dynamics) in at least this fraction of its seeds; none: lopd_binding is not run and the "
        "report says why"))
    tie_rule: Literal["best", "median_margin", "smallest_margin"] = Field(
        description="registered before the search: among trials tied with the best (paired val difference "
                    "whose (1 − tie_alpha) t-interval holds 0), take the best, the median margin or the smallest")
    tie_alpha: float = Field(gt=0.0, lt=1.0, description="significance level of that tie test")
    seeds_per_trial: int = Field(ge=1, description="training seeds averaged per trial")
    rerun_top: int = Field(ge=0, description=(
        "the search's best trials (by val reward on seeds_per_trial seeds) rerun on rerun_seeds more seeds; the "
        "selection among them takes the seed as the unit (lopd.hpo.selection.select_by_seed). 0: no rerun, the "
        "selection pairs all trials over val tasks"))
    rerun_seeds: int = Field(ge=0, description="more seeds for each rerun trial (trained as one population)")
    trials_per_batch: int = Field(ge=1, description="trials asked at a time (TPE with constant_liar) and trained "
                                                    "together, each × seeds_per_trial, as one population")
    steps: int | None = Field(ge=1, description="training steps per trial; null = train.steps (the final "
                                                "runs' horizon)")
    val_every: int = Field(ge=1, description=(
        "steps between a trial's intermediate val rewards (its learning curve; no pruner stops a trial: a batch "
        "trains its members to the horizon together, so pruning saved no compute and only dropped values)"))

    @field_validator("baseline_arms")
    @classmethod
    def _baselines(cls, v):
        return training_arms(v, "hpo.baseline_arms")

    @field_validator("search_axes")
    @classmethod
    def _searches(cls, v):
        reads = {"margin": lambda a: a.margin, "K": lambda a: a.context == "latent",
                 "n_ret": lambda a: a.bank_mode != "none" and a.context in ("latent", "text"),
                 "lr_student": lambda a: True, "group_size": lambda a: a.grouped,
                 "eta_beta": lambda a: a.margin and a.beta_schedule == "dual"}
        for arm, axes in v.items():
            spec = ARM_REGISTRY.get(arm)
            if spec is None or not spec.trains or arm == "lopd":
                raise ValueError(f"hpo.search_axes: {arm!r} is not a training arm other than lopd (lopd's search "
                                 "is the hpo section itself)")
            bad = [a for a in axes if a not in reads or not reads[a](spec)]
            if not axes or bad or len(set(axes)) != len(axes):
                raise ValueError(f"hpo.search_axes.{arm}: {axes} must be distinct coordinates the arm reads, of "
                                 f"{', '.join(k for k in reads if reads[k](spec))}")
        return v

    @model_validator(mode="after")
    def _range(self):
        both = sorted(set(self.searched_arms) & set(self.baseline_arms))
        if both:
            raise ValueError(f"hpo: {both} both searched (searched_arms) and tuned over one knob (baseline_arms)")
        lacking = [a for a in self.searched_arms if a not in self.search_axes]
        if lacking:
            raise ValueError(f"hpo.searched_arms {lacking} have no entry in hpo.search_axes (what each searches)")
        if self.n_ret_min > self.n_ret_max:
            raise ValueError("hpo.n_ret_min must be <= hpo.n_ret_max")
        if self.rerun_top and self.seeds_per_trial + self.rerun_seeds < 2:
            raise ValueError("hpo.rerun_top > 0 ties trials by seed: seeds_per_trial + rerun_seeds must be >= 2")
        return self


class SensitivityParams(Section):
    """One-at-a-time validation grid around the selected point (validation only)."""

    seeds: list[int] = Field(description="training seeds of every grid point")
    margins: list[float] = Field(description="margins m varied (nats per token), K and n_ret held at the selection")
    ks: list[int] = Field(description="K values varied, margin and n_ret held at the selection")
    n_rets: list[int] = Field(description="n_ret values varied, margin and K held at the selection")
    eta_betas: DistinctOrEmptyList[float, Bound(gt=0)] = Field(description=(
        "the margin's dose-response: every positive m of margins is run at each of these η_β too (the selected "
        "η_β's are the margin axis itself), the other coordinates at the selection; each run's constraint status "
        "is recorded"))
    references: DistinctOrEmptyList[str] = Field(description=(
        "arms trained beside the grid on its seeds, as the final runs train them (their selected or tuned point): "
        "the dose-response's reference lines"))
    steps: int | None = Field(ge=1, description="training steps per grid run; null = train.steps")

    @field_validator("references")
    @classmethod
    def _references(cls, v):
        return training_arms(v, "sensitivity.references")
