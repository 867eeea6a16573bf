"""Sections of the pipeline's model-building stages: base policy, evaluation, experience bank,
composer cold start, premise gate and the final training runs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from lopd.arms import ARMS as ARM_REGISTRY
from lopd.config.section import Section

ARMS = tuple(ARM_REGISTRY)


class BaseParams(Section):
    """The base policy: the tiny model pretrained on noisy scripted demos in the pretraining worlds."""

    tasks_per_world: int = Field(ge=2, description="demo tasks generated per pretraining world")
    demos_per_task: int = Field(ge=1, description="scripted demonstrations per task")
    context_probs: list[float] = Field(description="P(n same-world successes in a demo's context) for "
                                                   "n = 0, 1, ..., len-1; non-negative, sums to 1")
    context_loss: bool = Field(description="also supervise the context's successes, each conditioned on those "
                                           "before it (lopd.training.base_policy.encode_demo)")
    noise: float = Field(ge=0.0, le=1.0, description="probability that a demo's action is corrupted")
    truncate_prob: float = Field(ge=0.0, le=1.0, description="probability that a demo is cut short")
    steps: int = Field(ge=1, description="pretraining optimizer steps")
    batch_size: int = Field(ge=1, description="demos per pretraining step")
    lr: float = Field(gt=0, description="pretraining learning rate")
    seed: int = Field(ge=0, description="seed of demo generation and pretraining")

    @field_validator("context_probs")
    @classmethod
    def _probs(cls, v):
        if not v or any(p < 0 for p in v) or abs(sum(v) - 1.0) > 1e-6:
            raise ValueError(f"base.context_probs must be non-negative and sum to 1, got {v}")
        return v

    @model_validator(mode="after")
    def _context_fits(self):
        if len(self.context_probs) > self.tasks_per_world:
            raise ValueError(f"base.context_probs allows {len(self.context_probs) - 1} same-world experiences in a "
                             f"context; base.tasks_per_world ({self.tasks_per_world}) must exceed that")
        return self


class EvalParams(Section):
    """The evaluate stage: test-split rollouts of every trained student (the only reader of the test split)."""

    temperature: float = Field(gt=0, description="sampling temperature of test rollouts")
    greedy: bool = Field(description="true: greedy decoding; false: sampled at temperature (the policy as "
                                     "trained, not its mode)")
    max_new_tokens: int = Field(ge=1, description="most tokens generated per assistant turn")
    batch_size: int = Field(ge=1, description="rollouts decoded together")
    samples_per_task: int = Field(ge=1, description="test rollouts per task; sample k of a task has the same "
                                                    "sampling seed in every arm (common random numbers)")


class BankParams(Section):
    """The experience bank: successful base-policy rollouts on train, retrieved by task embedding."""

    embedder: Literal["backbone", "minilm"] = Field(description="task embedder for retrieval: the backbone's "
                                                                "hidden states or MiniLM sentence embeddings")
    rollouts_per_task: int = Field(ge=1, description="base-policy rollouts per train task")
    min_reward: float = Field(ge=0.0, le=1.0, description="a rollout enters the bank if its reward is at least this")
    seed: int = Field(ge=0, description="seed of the bank's rollouts")
    scripted_demos: bool = Field(description=(
        "true only for a path check: a policy that solves nothing (random weights) gets a bank of the "
        "environments' scripted solutions, and the report is marked PATH CHECK, NOT A RESULT"))


class ColdStartParams(Section):
    """The composer's supervised cold start, giving φ0 for every K ≤ k_max and n_ret ≤ n_ret_max."""

    steps: int = Field(ge=1, description="cold-start optimizer steps")
    batch_size: int = Field(ge=1, description="trajectories per cold-start step")
    lr: float = Field(gt=0, description="cold-start learning rate of the composer")
    k_max: int = Field(ge=1, description="most latent tokens per experience (K) the composer is trained for")
    n_ret_max: int = Field(ge=1, description="most retrieved experiences (n_ret) the composer is trained for")
    seed: int = Field(ge=0, description="seed of the cold start")
    distill_weight: float = Field(ge=0.0, description="weight of KL(text-conditioned teacher ‖ latent-conditioned "
                                                      "teacher) on the trajectory tokens; 0 = NLL only")
    distill_top_m: int = Field(ge=1, description="that KL's support: the text teacher's top-M tokens plus "
                                                 "one tail bucket")
    gate_init: float = Field(ge=0.0, description=(
        "the composer's output gate at init; 0 = fresh latents are zero. A deep model needs > 0: zero latents "
        "reach every RMSNorm at 0, whose derivative is 1/sqrt(eps), once per layer (28 layers overflow fp32)"))


class ProbeParams(Section):
    """The premise gate (lopd.analysis.probe): rollouts per val task per condition, and the pre-registered rule."""

    samples_per_task: int = Field(ge=1, description="rollouts per val task per condition (relevant, shuffled, "
                                                    "none); common random numbers across conditions")
    seed: int = Field(ge=0, description="seed of the probe's rollouts")
    confidence: float = Field(gt=0, lt=1, description="confidence level of the paired lower bounds over val tasks")
    min_margin: float = Field(ge=0.0, description="reward units: the premise needs lower bounds of reward("
                                                  "relevant − student) and reward(relevant − shuffled) above this")
    min_delta: float = Field(ge=0.0, description="nats per policy token: the premise needs lower bounds of "
                                                 "Δ(relevant) and Δ(relevant − shuffled) above this")
