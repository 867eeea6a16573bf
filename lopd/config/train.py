"""The ``train`` section: the final runs, every arm × every seed."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from lopd.config.section import Bound, DistinctList, DistinctOrEmptyList, Section
from lopd.config.stages import ARMS


class TrainParams(Section):
    """The final runs (stages train@{arm}, evaluate@{arm}: every seed of an arm in one process) and the
    shared training loop's knobs (lopd.training.trainer)."""

    arms: DistinctList[str] = Field(description="arms run with every seed of train.seeds (lopd.arms)")
    seeds: DistinctList[int, Bound(ge=0)] = Field(description="training seeds of every arm (runs/{arm}/seed-{seed})")
    # more seeds for some arms: the falsification rule's arms need >= 10 seeds, the other arms fewer
    extra_arms: DistinctOrEmptyList[str] = Field(description="arms of train.arms that also run train.extra_seeds "
                                                             "(the falsification rule's arms need more seeds)")
    extra_seeds: DistinctOrEmptyList[int, Bound(ge=0)] = Field(description="more seeds for train.extra_arms, "
                                                                           "disjoint from train.seeds")
    steps: int = Field(ge=1, description="training steps per run")
    tasks_per_step: int = Field(ge=1, description="rollouts per step for every arm (GRPO: tasks_per_step / "
                                                  "group_size tasks × group_size), so equal steps = equal budgets")
    group_size: int = Field(ge=1, description="GRPO: rollouts per task whose rewards are normalised together")
    lr_student: float = Field(gt=0, description="learning rate of the student's LoRA (θ)")
    lr_composer: float = Field(gt=0, description="learning rate of the composer (φ)")
    margin: float = Field(ge=0.0, description="m, nats per token: the constraint Δ(φ) ≥ m on the teacher's "
                                              "log-ratio over the student; used only when use_best_params is false")
    K: int = Field(ge=1, description="latent tokens per retrieved experience (≤ cold_start.k_max); used only "
                                     "when use_best_params is false")
    n_ret: int = Field(ge=1, description="retrieved experiences per task (≤ cold_start.n_ret_max); used only "
                                         "when use_best_params is false")
    lambda_anchor: float = Field(ge=0.0, description="λ: weight of the anchor λ‖c_φ − c_φ0‖² keeping the "
                                                     "latents near the cold start")
    eta_beta: float = Field(ge=0.0, description="η_β: dual-ascent step of β ← max(0, β + η_β (m − Δ(φ))); used only "
                                                "when use_best_params is false (else searched)")
    beta_init: float = Field(ge=0.0, description="β at step 0 (the margin's Lagrange multiplier)")
    beta_rate: float | None = Field(ge=0.0, description=(
        "lopd_ramp's open-loop slope: β_t = beta_init + beta_rate·t, Δ(φ) never read; null = η_β·m (the arm's m): "
        "what dual ascent adds per step while Δ(φ) ≪ m"))
    beta_fixed: float = Field(ge=0.0, description=(
        "lopd_fixbeta's β, held for the whole run (no dual ascent); used only when use_best_params is false, "
        "else chosen on val from hpo.beta_fixed_choices"))
    top_m: int = Field(ge=1, description="support of the distillation KL(π_S ‖ π_T) (reverse KL, student "
                                         "first): top-M tokens plus one tail bucket")
    support: Literal["teacher", "student", "union"] = Field(description="whose top-M tokens form that support: "
                                                                        "teacher, student, or their union")
    temperature: float = Field(gt=0, description="sampling temperature of training rollouts")
    rollout_budget: int | None = Field(ge=1, description="if set, steps = rollout_budget / tasks_per_step for "
                                                         "every arm; null = train.steps")
    val_every: int = Field(ge=1, description="validate every this many steps (learning curves)")
    val_tasks: int = Field(ge=1, description="val tasks in each intermediate validation")
    val_samples_per_task: int = Field(ge=1, description="validation rollouts per task, the same sampling seeds "
                                                        "in every run of a seed")
    checkpoint_every: int = Field(ge=1, description="checkpoint every this many steps (a killed run resumes)")
    beta_max: float = Field(gt=0, description="β above this marks the margin infeasible (tag infeasible_margin)")
    infeasible_patience: int = Field(ge=1, description="consecutive steps with Δ(φ) < m that mark the margin "
                                                       "infeasible")
    recompute_context_passes: bool = Field(description=(
        "true: the passes a KD step adds to the student's (the composer over the retrieved experiences, the "
        "teacher given c_φ) keep only each decoder layer's input and run the layer again in backward "
        "(activation checkpointing): the same gradients, LOPD's step memory near an SFT step's, one more "
        "forward of those passes in time. On in the real-model profiles; off for the tiny model"))
    population_size: int | None = Field(ge=1, description=(
        "the most runs one process trains at once as a population (an arm's seeds; a search batch's trials x "
        "seeds; a baseline's rates x seeds; the sensitivity grid's points x seeds); the rest train in the next "
        "population. A memory knob for a real model on one device. null = all of them at once. The runs agree "
        "with any other grouping to the population tolerances (tests/integration/test_population.py), not to the bit"))
    use_best_params: bool = Field(description="true: margin, K, n_ret, lr_student and eta_beta come from the search "
                                              "(hpo/best_params.yaml); false: from this section")
    per_seed_draws: bool = Field(description=(
        "true: training seed s of the final runs uses its own experience-bank and cold-start draw "
        "(models/draws/bank-<s>, cold_start-<s>, seeded derive_seed('bank-draw', bank.seed, s) and "
        "derive_seed('cold_start-draw', cold_start.seed, s)), so the rule's seed-level tests cover those draws; "
        "false: every draw is seeded bank.seed / cold_start.seed, i.e. one draw shared by every seed"))

    @field_validator("arms")
    @classmethod
    def _arms(cls, v):
        bad = [a for a in v if a not in ARMS]
        if bad:
            raise ValueError(f"unknown arm(s) {bad}; known arms: {', '.join(ARMS)}")
        return v

    @model_validator(mode="after")
    def _extra(self):
        if not set(self.extra_arms) <= set(self.arms):
            raise ValueError(f"train.extra_arms must be arms of train.arms {self.arms}, got {self.extra_arms}")
        s = self.extra_seeds
        if set(s) & set(self.seeds):
            raise ValueError(f"train.extra_seeds must be seeds not in train.seeds {self.seeds}, got {s}")
        return self

    def run_steps(self) -> int:
        """A run's training steps: ``steps``, or ``rollout_budget // tasks_per_step`` (at least 1) when set."""
        budget, per_step = self.rollout_budget, self.tasks_per_step  # both read: what the result depends on
        return self.steps if budget is None else max(1, budget // per_step)

    def seeds_of(self, arm: str) -> list[int]:
        """Every training seed of ``arm``: ``seeds``, plus ``extra_seeds`` if it is an extra arm."""
        return [*self.seeds, *(self.extra_seeds if arm in self.extra_arms else [])]


# What each ``train`` key is for: every field in exactly one group (tests/unit/test_train_keys.py). A key is
# defined once, with its type, range and description, in TrainParams above; these groups say where it goes.
MATRIX_KEYS = ("arms", "seeds", "extra_arms", "extra_seeds")  # which runs exist
# one run's hyper-parameters, in field order: lopd.training.trainer.HParams is built from exactly these
RUN_KEYS = ("steps", "tasks_per_step", "group_size", "lr_student", "lr_composer", "margin", "K", "n_ret",
            "lambda_anchor", "eta_beta", "beta_init", "beta_rate", "beta_fixed", "top_m", "support", "temperature",
            "val_every", "val_tasks", "val_samples_per_task", "checkpoint_every", "beta_max", "infeasible_patience",
            "recompute_context_passes")
SCHEDULE_KEYS = ("rollout_budget", "population_size")  # how many steps a run takes; how runs are batched
SELECTED_KEYS = ("margin", "K", "n_ret", "lr_student", "eta_beta")  # the selected point's coordinates a run reads
SOURCE_KEYS = ("use_best_params", "per_seed_draws")  # where a run's point and its upstream draw come from
CONTROL_KEYS = ("beta_rate", "beta_fixed")  # the margin controls' β schedules (lopd_ramp, lopd_fixbeta)
# what defines a search trial's training: a trial is lopd with dual ascent, on the shared draw
TRIAL_KEYS = tuple(k for k in TrainParams.model_fields if (k in RUN_KEYS and k not in CONTROL_KEYS)
                   or k in SCHEDULE_KEYS)
