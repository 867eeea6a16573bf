"""Pure tensor objectives for LOPD (Latent On-Policy Self-Distillation) and its baselines.

Everything here is a plain function of tensors: no model, no tokenizer, no I/O. Shapes use

* ``N`` — sequences in the batch,
* ``T`` — positions per sequence,
* ``V`` — vocabulary size,

and ``mask`` is an ``(N, T)`` float or bool tensor that is 1 at supervised positions (the
tokens the student generated itself) and 0 elsewhere (prompt, observations, padding).
Masked positions never contribute to a loss or a statistic, and their values are never
read into a sum (``torch.where``, not multiplication), so junk there cannot produce NaN.

Roles: the *student* ``π_S(·|s_t)`` is the policy with parameters θ; the *teacher*
``π_T(·|s_t, c_φ)`` is the same network conditioned on the latent context ``c_φ`` produced
by the composer with parameters φ. Distillation is on-policy: ``y_t`` are the student's
own samples.

Half-precision inputs are promoted to float32 before any log/exp arithmetic; float32 and
float64 inputs are used as given.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = [
    "KLResult",
    "SUPPORTS",
    "token_logprobs",
    "reverse_kl_topm_tail",
    "token_delta",
    "outcome_weighted_delta",
    "margin_sat_frac",
    "margin_penalty",
    "dual_update",
    "ramp_beta",
    "anchor_loss",
    "grpo_advantages",
    "policy_gradient_loss",
    "sft_loss",
]

SUPPORTS = ("teacher", "student", "union")

# Upper clamp on the in-support log-mass L, so that log p(tail) = log(-expm1(L)) stays
# finite (≈ log 1e-7 ≈ -16.1) even when the support holds all of the probability mass.
_TAIL_LOGMASS_MAX = -1e-7


from lopd.training.checks import check_mask, check_scalar, promote, require_dim, require_float, require_pair  # noqa: E402

# --------------------------------------------------------------------------- log-probs


def token_logprobs(logits: Tensor, targets: Tensor) -> Tensor:
    """Log-probability of each target token: ``log_softmax(logits)[..., targets]``.

    Args:
        logits: ``(N, T, V)`` raw scores (any float dtype; the softmax is done in float32,
            or float64 if the logits are float64).
        targets: ``(N, T)`` integer token ids in ``[0, V)``.

    Returns:
        ``(N, T)`` tensor ``log π(y_t | s_t)``, float32 (float64 for float64 logits),
        differentiable with respect to ``logits``.

    Computed as ``logits[y] - logsumexp(logits)``, which equals the gathered log_softmax
    without materialising a second ``(N, T, V)`` tensor.
    """
    require_float("logits", logits)
    require_dim("logits", logits, 3, "(N, T, V)")
    if not isinstance(targets, Tensor) or targets.dtype not in (
        torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8
    ):
        raise ValueError("targets must be an integer tensor of token ids")
    if tuple(targets.shape) != tuple(logits.shape[:2]):
        raise ValueError(
            f"targets must have shape (N, T) = {tuple(logits.shape[:2])}, "
            f"got {tuple(targets.shape)}"
        )
    x = logits if logits.dtype == torch.float64 else logits.float()
    picked = x.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(x, dim=-1)


# --------------------------------------------------------------------------- reverse KL


class KLResult(NamedTuple):
    """Output of :func:`reverse_kl_topm_tail`.

    loss: scalar, token mean of the per-token KL over supervised tokens (has graph).
    per_token: ``(N, T)`` per-token KL, exactly 0 where ``mask == 0`` (has graph).
    tail_mass: scalar, detached: mean over supervised tokens of the *student's* probability
        mass outside the support, ``p_S(tail)`` (0 if there are no supervised tokens).
    """

    loss: Tensor
    per_token: Tensor
    tail_mass: Tensor


def _tail_logprob(in_support_logmass: Tensor) -> Tensor:
    """log p(tail) = log(1 - exp(L)) = log(-expm1(L)), with L clamped to <= -1e-7."""
    return torch.log(-torch.expm1(in_support_logmass.clamp(max=_TAIL_LOGMASS_MAX)))


def _support_terms(ls: Tensor, lt: Tensor, top_m: int, support: str) -> tuple[Tensor, Tensor, Tensor]:
    """On the support S: ``Σ_{v∈S} p_S(v)(log p_S(v) − log p_T(v))`` and the log-masses of S
    under the student and the teacher (each ``(N, T)``)."""
    vocab = ls.shape[-1]
    if top_m >= vocab:
        # Whole vocabulary: no selection needed.
        ls_in, lt_in = ls, lt
        in_support_term = (ls_in.exp() * (ls_in - lt_in)).sum(-1)
        ls_mass = torch.logsumexp(ls_in, dim=-1)
        lt_mass = torch.logsumexp(lt_in, dim=-1)
    elif support in ("teacher", "student"):
        # A fixed-size support: gather the M selected entries, (N, T, M).
        ref = lt if support == "teacher" else ls
        idx = ref.detach().topk(top_m, dim=-1).indices
        ls_in = ls.gather(-1, idx)
        lt_in = lt.gather(-1, idx)
        in_support_term = (ls_in.exp() * (ls_in - lt_in)).sum(-1)
        ls_mass = torch.logsumexp(ls_in, dim=-1)
        lt_mass = torch.logsumexp(lt_in, dim=-1)
    else:  # union: variable size, boolean (N, T, V) support mask
        idx_t = lt.detach().topk(top_m, dim=-1).indices
        idx_s = ls.detach().topk(top_m, dim=-1).indices
        sel = torch.zeros(ls.shape, dtype=torch.bool, device=ls.device)
        sel.scatter_(-1, idx_t, True)
        sel.scatter_(-1, idx_s, True)
        zero = ls.new_zeros(())
        neg_inf = ls.new_full((), -math.inf)
        # Substitute before exp/log so nothing outside S can leak NaN into the graph.
        ls_safe = torch.where(sel, ls, zero)
        lt_safe = torch.where(sel, lt, zero)
        in_support_term = torch.where(sel, ls_safe.exp() * (ls_safe - lt_safe), zero).sum(-1)
        ls_mass = torch.logsumexp(torch.where(sel, ls, neg_inf), dim=-1)
        lt_mass = torch.logsumexp(torch.where(sel, lt, neg_inf), dim=-1)
    return in_support_term, ls_mass, lt_mass


def reverse_kl_topm_tail(
    student_logp: Tensor,
    teacher_logp: Tensor,
    mask: Tensor,
    *,
    top_m: int = 20,
    support: str = "teacher",
) -> KLResult:
    """Reverse KL ``KL(π_S ‖ π_T)`` on a top-M support plus one tail bucket.

    Direction: *reverse* KL — expectation under the **student** π_S (mode-seeking), i.e.
    ``Σ_v p_S(v) (log p_S(v) − log p_T(v))``. Swapping the arguments gives the forward KL.

    Per position ``(n, t)`` let ``S`` be the support set and, for each distribution
    ``p ∈ {p_S, p_T}``, ``L_p = logsumexp_{v∈S} log p(v)`` clamped to at most ``-1e-7`` and
    ``log p(tail) = log(−expm1(L_p))`` (the mass outside S, finite even when S holds it all).
    Then::

        KL_{n,t} = Σ_{v∈S} p_S(v) (log p_S(v) − log p_T(v))
                   + p_S(tail) (log p_S(tail) − log p_T(tail))

    The tail term is computed as ``exp(ls_tail) * (ls_tail − lt_tail)`` so no ``0·log 0``
    NaN can arise. This is the KL between the two (|S|+1)-outcome coarsenings, hence ≥ 0
    and ≤ the full-vocabulary KL; when S is the whole vocabulary it equals the exact full
    reverse KL up to the clamp (the tail contributes ~1e-7·0).

    Support ``S`` (``support=``):

    * ``"teacher"`` — indices of the teacher's top-M log-probs (paper default);
    * ``"student"`` — indices of the student's top-M log-probs (SDPO);
    * ``"union"``   — union of both top-M sets (between M and 2M tokens, varies per
      position; built as a boolean ``(N, T, V)`` mask with ``scatter``).

    If ``top_m >= V`` the support is the whole vocabulary for every choice. The index
    selection itself is not differentiable (ties are broken by ``torch.topk``).

    Normalisation: token mean over the batch,
    ``loss = Σ_{n,t} mask·KL / max(Σ_{n,t} mask, 1)``.

    Gradients flow into **both** arguments — into θ through ``student_logp`` and into φ
    through ``teacher_logp`` (the teacher is conditioned on the composer's latent context).
    Nothing is detached here; detach at the call site if a side must be frozen.

    Args:
        student_logp: ``(N, T, V)`` full-vocabulary log-probabilities of π_S
            (already log_softmax'ed, finite).
        teacher_logp: ``(N, T, V)`` full-vocabulary log-probabilities of π_T.
        mask: ``(N, T)`` bool/float, 1 at supervised positions.
        top_m: M ≥ 1.
        support: ``"teacher"``, ``"student"`` or ``"union"``.

    Returns:
        :class:`KLResult` ``(loss, per_token, tail_mass)``.
    """
    require_pair("student_logp", student_logp, "teacher_logp", teacher_logp, 3, "(N, T, V)")
    if support not in SUPPORTS:
        raise ValueError(f"unknown support {support!r}; expected one of {SUPPORTS}")
    if isinstance(top_m, bool) or not isinstance(top_m, int) or top_m < 1:
        raise ValueError(f"top_m must be an integer >= 1, got {top_m!r}")
    m = check_mask(mask, student_logp.shape[:2], "student_logp")

    ls = promote(student_logp)
    lt = promote(teacher_logp)
    if ls.dtype != lt.dtype:
        common = torch.promote_types(ls.dtype, lt.dtype)
        ls, lt = ls.to(common), lt.to(common)
    in_support_term, ls_mass, lt_mass = _support_terms(ls, lt, top_m, support)
    ls_tail = _tail_logprob(ls_mass)
    lt_tail = _tail_logprob(lt_mass)
    tail_term = ls_tail.exp() * (ls_tail - lt_tail)
    kl = in_support_term + tail_term

    supervised = m != 0
    per_token = torch.where(supervised, kl, kl.new_zeros(()))
    denom = m.sum().clamp(min=1.0)
    loss = (per_token * m.to(per_token.dtype)).sum() / denom.to(per_token.dtype)

    with torch.no_grad():
        tail_p = torch.where(supervised, ls_tail.exp(), ls_tail.new_zeros(()))
        tail_mass = (tail_p * m.to(tail_p.dtype)).sum() / denom.to(tail_p.dtype)

    return KLResult(loss=loss, per_token=per_token, tail_mass=tail_mass.detach())


# --------------------------------------------------------------------------- GRPO / SFT


def grpo_advantages(rewards: Tensor, eps: float = 1e-4) -> Tensor:
    """Group-normalised advantages ``A = (r − mean_group) / (std_group + eps)``.

    ``std_group`` is the **population** standard deviation (``unbiased=False``,
    i.e. divide by G). Groups whose rewards are all identical get advantage exactly 0
    (set explicitly, independent of float rounding in the mean).

    Args:
        rewards: ``(n_groups, G)`` rewards, one row per prompt group.
        eps: added to the std, > 0.

    Returns:
        ``(n_groups, G)`` advantages (no graph).
    """
    if not isinstance(rewards, Tensor):
        raise ValueError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    require_dim("rewards", rewards, 2, "(n_groups, G)")
    if rewards.shape[1] < 1:
        raise ValueError("rewards must have at least one sample per group")
    eps = check_scalar("eps", eps, nonneg=True)
    if eps == 0:
        raise ValueError("eps must be > 0")
    r = rewards.detach()
    r = r if r.dtype == torch.float64 else r.float()
    mean = r.mean(dim=1, keepdim=True)
    std = r.std(dim=1, keepdim=True, correction=0)
    adv = (r - mean) / (std + eps)
    constant = (r == r[:, :1]).all(dim=1, keepdim=True)
    return torch.where(constant, torch.zeros_like(adv), adv)


def policy_gradient_loss(token_logp: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """On-policy GRPO surrogate, no KL penalty and no clipping.

    With one update per batch the importance ratio is 1, so clipping is inactive and the
    surrogate is written with ``exp(logp − sg[logp])`` (value 1, gradient ∇logp)::

        loss = − Σ_{n,t} mask_{n,t} · A_n · exp(logp_{n,t} − sg[logp_{n,t}])  /  max(Σ mask, 1)

    Normalisation is token-level over **all** supervised tokens of the batch (DAPO-style),
    not per-sequence-then-mean. Advantages are treated as constants (detached).

    Args:
        token_logp: ``(N, T)`` log-probs of the sampled tokens under the current policy.
        advantages: ``(N,)`` one advantage per sequence (e.g. flattened
            :func:`grpo_advantages`).
        mask: ``(N, T)`` supervised-token mask.
    """
    require_float("token_logp", token_logp)
    require_dim("token_logp", token_logp, 2, "(N, T)")
    m = check_mask(mask, token_logp.shape, "token_logp")
    if not isinstance(advantages, Tensor) or tuple(advantages.shape) != (token_logp.shape[0],):
        raise ValueError(
            f"advantages must be a tensor of shape (N,) = ({token_logp.shape[0]},), got "
            f"{tuple(advantages.shape) if isinstance(advantages, Tensor) else type(advantages)}"
        )
    lp = promote(token_logp)
    sup = m != 0
    lp_safe = torch.where(sup, lp, lp.new_zeros(()))
    ratio = torch.exp(lp_safe - lp_safe.detach())
    a = advantages.detach().to(lp.dtype)[:, None]
    w = m.to(lp.dtype)
    return -(w * a * ratio).sum() / w.sum().clamp(min=1.0)


def sft_loss(token_logp: Tensor, mask: Tensor, weights: Tensor | None = None) -> Tensor:
    """Negative log-likelihood, token mean over supervised tokens.

    ::

        loss = − Σ_{n,t} mask_{n,t} · w_n · logp_{n,t}  /  Σ_{n,t} mask_{n,t} · w_n

    ``weights`` is an optional ``(N,)`` non-negative per-sequence weight (default 1, which
    gives the plain token mean over supervised tokens); with weights the result is the
    weighted token mean. If the denominator is 0 the loss is 0 (graph kept).
    """
    require_float("token_logp", token_logp)
    require_dim("token_logp", token_logp, 2, "(N, T)")
    m = check_mask(mask, token_logp.shape, "token_logp")
    lp = promote(token_logp)
    if weights is None:
        w_seq = lp.new_ones(lp.shape[0])
    else:
        if not isinstance(weights, Tensor) or tuple(weights.shape) != (lp.shape[0],):
            raise ValueError(
                f"weights must be a tensor of shape (N,) = ({lp.shape[0]},), got "
                f"{tuple(weights.shape) if isinstance(weights, Tensor) else type(weights)}"
            )
        w_seq = weights.detach().to(lp.dtype)
        if not torch.isfinite(w_seq).all() or (w_seq < 0).any():
            raise ValueError("weights must be finite and >= 0")
    w = m.to(lp.dtype) * w_seq[:, None]
    used = w != 0
    lp_safe = torch.where(used, lp, lp.new_zeros(()))
    denom = w.sum()
    if float(denom.item()) == 0.0:
        return lp_safe.sum() * 0.0
    return -(w * lp_safe).sum() / denom


# Δ(φ), the margin and the anchor live in lopd.training.margin; re-exported so callers use one namespace.
from lopd.training.margin import (  # noqa: E402,F401
    anchor_loss,
    dual_update,
    margin_penalty,
    margin_sat_frac,
    outcome_weighted_delta,
    ramp_beta,
    token_delta,
)
