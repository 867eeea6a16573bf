"""What each arm's objective computes on one step's batch: the loss θ (and φ) minimise and the
step's metrics. :class:`~lopd.training.trainer.Trainer` picks the arm's entry of :data:`OBJECTIVES`;
the pure tensor functions they call (KL, δ, Δ(φ), the margin and anchor terms) are in
:mod:`lopd.training.objectives`.

The passes an objective reads come from :class:`Passes` for a run alone, or from the population's
batched passes sliced per member (:class:`lopd.population.trainer.MemberPasses`); both offer the
same two methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from lopd.training import objectives as obj

# ``tr`` below is the calling lopd.training.trainer.Trainer (annotated by name: trainer imports this module)


@dataclass
class StepLoss:
    """What an objective contributes to one step: the loss (None: nothing to learn from) and metrics."""

    loss: torch.Tensor | None
    metrics: dict[str, float] = field(default_factory=dict)


class Passes:
    """The forward passes of one step of one run, computed when an objective asks for them.

    A population (:mod:`lopd.population`) hands each member the slices of its batched passes
    instead (:class:`lopd.population.trainer.MemberPasses`), through the same two methods.
    """

    def __init__(self, tr: "Trainer", batch: dict):
        self.tr, self.batch = tr, batch

    def student_logits(self) -> torch.Tensor:
        """(N, T−1, V): the student's logits at every position that predicts a next token."""
        b = self.batch
        return self.tr.bb.logits(b["ids"], b["attn"], "student")[:, :-1]

    def context_and_teacher(self):
        """(the teacher's context, its logits (N, T−1, V) given that context)."""
        tr, b = self.tr, self.batch
        # the passes LOPD adds to an SFT step (composer over the experiences, teacher given c_φ) carry φ's
        # gradient; recomputing them in backward keeps the step's memory near SFT's at real size
        with tr.bb.recompute_in_backward(tr.hp.recompute_context_passes):
            ctx = tr.context.build(b["tasks"])
            with torch.set_grad_enabled(ctx.latent and tr.arm.train_composer):
                logits = tr.bb.teacher_logits(ctx.prefix, ctx.mask, b["ids"], b["attn"], latent_prefix=ctx.latent)
        return ctx, logits[:, :-1]


def _sft(tr: "Trainer", batch: dict, passes: Passes) -> StepLoss:
    """NLL of the student's own successful rollouts (reward = 1)."""
    w = (batch["rewards"] >= 1.0).float()
    if w.sum() == 0:
        return StepLoss(None)
    logits = passes.student_logits()
    return StepLoss(obj.sft_loss(obj.token_logprobs(logits, batch["targets"]), batch["mask"], weights=w))


def _grpo(tr: "Trainer", batch: dict, passes: Passes) -> StepLoss:
    """Group-normalised advantages, token-level policy-gradient surrogate, no KL."""
    adv = obj.grpo_advantages(batch["rewards"].view(-1, tr.hp.group_size)).view(-1)
    if adv.abs().sum() == 0:
        return StepLoss(None)
    logits = passes.student_logits()
    return StepLoss(obj.policy_gradient_loss(obj.token_logprobs(logits, batch["targets"]), adv, batch["mask"]))


def _kd(tr: "Trainer", batch: dict, passes: Passes) -> StepLoss:
    """Reverse KL(π_S ‖ π_T) to the context-conditioned frozen teacher; for a trained φ also the
    anchor λ‖c_φ − c_φ0‖² and (margin arms) the Lagrangian term β·(m − Δ(φ))."""
    hp, arm = tr.hp, tr.arm
    targets, mask, rewards = batch["targets"], batch["mask"], batch["rewards"]
    student_logits = passes.student_logits()
    ctx, teacher_logits = passes.context_and_teacher()
    s_logp = torch.log_softmax(student_logits.float(), -1)
    t_logp = torch.log_softmax(teacher_logits.float(), -1)
    kl = obj.reverse_kl_topm_tail(s_logp, t_logp, mask, top_m=hp.top_m, support=hp.support)
    s_tok = s_logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    t_tok = t_logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    delta = obj.token_delta(t_tok, s_tok)
    delta_phi, weight = obj.outcome_weighted_delta(delta, mask, rewards)
    # every margin arm measures satisfaction against the same m (lopd_nomargin logs it without using it)
    m = {"kd_loss": float(kl.loss.detach()), "tail_mass": float(kl.tail_mass), "delta_weight": weight,
         "delta_phi": float(delta_phi.detach()) if weight > 0 else float("nan"),
         "margin_sat_frac": obj.margin_sat_frac(delta.detach(), mask, hp.margin)}
    loss = kl.loss
    if ctx.c_phi is not None:
        anchor = obj.anchor_loss(ctx.c_phi, ctx.c_phi0, hp.lambda_anchor)
        m["anchor"] = float(anchor.detach())
        if arm.train_composer:
            loss = loss + anchor
            if arm.margin and weight > 0:
                loss = loss + obj.margin_penalty(tr.beta, tr.margin, delta_phi)
    return StepLoss(loss, m)


OBJECTIVES: dict[str, Callable[["Trainer", dict, Passes], StepLoss]] = {"sft": _sft, "grpo": _grpo, "kd": _kd}
