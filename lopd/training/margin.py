"""The privilege margin and the anchor: pure tensor functions for φ's constraint.

Per sampled token ``δ_{t,n} = log π_T(y_t|s_t,c_φ) − log π_S(y_t|s_t)`` (student term
stop-gradient); ``Δ(φ)`` is its outcome-weighted mean over the batch; φ pays
``β·(m − Δ(φ))`` and β follows dual ascent ``β ← max(0, β + η_β (m − Δ(φ)))``. The anchor
``λ‖c_φ − sg[c_φ0]‖²`` keeps the latents near the cold start. Shapes and mask conventions as
in :mod:`lopd.training.objectives`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lopd.training.checks import check_mask, check_scalar, promote, require_dim, require_float, require_pair


def token_delta(teacher_token_logp: Tensor, student_token_logp: Tensor) -> Tensor:
    """Per-token log-ratio ``δ_t = log π_T(y_t | s_t, c_φ) − sg[log π_S(y_t | s_t)]``.

    The student term is detached (``sg`` = stop-gradient), so gradients reach only the
    teacher side (i.e. the composer φ through the latent context); the teacher term keeps
    its graph.

    Args:
        teacher_token_logp: ``(N, T)`` log-probs of the sampled tokens under π_T.
        student_token_logp: ``(N, T)`` log-probs of the same tokens under π_S.

    Returns:
        ``(N, T)`` δ.
    """
    require_pair("teacher_token_logp", teacher_token_logp, "student_token_logp", student_token_logp, 2, "(N, T)")
    return promote(teacher_token_logp) - promote(student_token_logp).detach()


def outcome_weighted_delta(delta: Tensor, mask: Tensor, rewards: Tensor) -> tuple[Tensor, float]:
    """Outcome-weighted mean log-ratio ``Δ(φ)``.

    ::

        Δ(φ) = Σ_n r_n Σ_t mask_{n,t} δ_{n,t}  /  Σ_n r_n Σ_t mask_{n,t}

    i.e. a token mean of δ in which each trajectory's tokens are weighted by its reward
    ``r_n ∈ [0, 1]``; trajectories with ``r_n = 0`` carry no weight (their δ is never read).

    Args:
        delta: ``(N, T)`` δ from :func:`token_delta` (graph kept).
        mask: ``(N, T)`` supervised-token mask.
        rewards: ``(N,)`` rewards in ``[0, 1]`` (treated as constants).

    Returns:
        ``(delta_phi, weight_sum)``: a scalar tensor with graph and the float denominator
        ``Σ_n r_n Σ_t mask_{n,t}``. If ``weight_sum == 0`` (no rewarded supervised token)
        this returns ``(0 · Σ δ, 0.0)`` — value 0 but still attached to the graph — and the
        **caller must skip the dual update** for this batch, since Δ is undefined.
    """
    require_float("delta", delta)
    require_dim("delta", delta, 2, "(N, T)")
    m = check_mask(mask, delta.shape, "delta")
    if not isinstance(rewards, Tensor):
        raise ValueError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    if tuple(rewards.shape) != (delta.shape[0],):
        raise ValueError(
            f"rewards must have shape (N,) = ({delta.shape[0]},), got {tuple(rewards.shape)}"
        )
    r = rewards.detach().to(torch.float64 if delta.dtype == torch.float64 else torch.float32)
    if not torch.isfinite(r).all() or (r < 0).any() or (r > 1).any():
        raise ValueError("rewards must be finite and lie in [0, 1]")

    d = promote(delta)
    w = (r[:, None] * m.to(r.dtype)).to(d.dtype)  # (N, T)
    used = w != 0
    d_used = torch.where(used, d, d.new_zeros(()))
    weight_sum = float(w.sum().item())
    if weight_sum == 0.0:
        return d_used.sum() * 0.0, 0.0
    return (w * d_used).sum() / weight_sum, weight_sum


def margin_sat_frac(delta: Tensor, mask: Tensor, margin: float) -> float:
    """Fraction of supervised tokens whose δ satisfies the margin: ``#{δ ≥ m} / #supervised``.

    Unweighted (rewards are ignored); ``δ == m`` counts as satisfied. Returns ``nan`` if
    there are no supervised tokens. Diagnostic only (no graph).
    """
    require_float("delta", delta)
    require_dim("delta", delta, 2, "(N, T)")
    m = check_mask(mask, delta.shape, "delta")
    margin = check_scalar("margin", margin)
    with torch.no_grad():
        sup = m != 0
        n = int(sup.sum().item())
        if n == 0:
            return math.nan
        hit = int(((delta.detach() >= margin) & sup).sum().item())
    return hit / n


def margin_penalty(beta: float, margin: float, delta_phi: Tensor) -> Tensor:
    """Lagrangian margin term ``β · (m − Δ(φ))``, minimised over φ (β held fixed).

    Minimising it pushes Δ(φ) up with force β; β itself is updated by :func:`dual_update`.
    """
    beta = check_scalar("beta", beta, nonneg=True)
    margin = check_scalar("margin", margin)
    require_float("delta_phi", delta_phi)
    if delta_phi.dim() != 0:
        raise ValueError(f"delta_phi must be a scalar (0-dim) tensor, got {tuple(delta_phi.shape)}")
    return beta * (margin - delta_phi)


def dual_update(beta: float, margin: float, delta_phi: float, eta: float) -> float:
    """Projected dual ascent on the margin constraint ``Δ(φ) ≥ m``.

    ``β ← max(0, β + η · (m − Δ))``: β grows while the constraint is violated (Δ < m),
    shrinks toward 0 when it holds with slack (Δ > m), and is never negative.
    Requires ``η ≥ 0`` and ``β ≥ 0``; ``η = 0`` leaves β unchanged. ``delta_phi`` may be a
    float or a one-element tensor (its value is used).
    """
    beta = check_scalar("beta", beta, nonneg=True)
    margin = check_scalar("margin", margin)
    delta_phi = check_scalar("delta_phi", delta_phi)
    eta = check_scalar("eta", eta, nonneg=True)
    return max(0.0, beta + eta * (margin - delta_phi))


def ramp_beta(beta_init: float, rate: float, step: int) -> float:
    """Open-loop β schedule of the ``lopd_ramp`` control: ``β_t = β_0 + r·t`` after step ``t``.

    Dual ascent gives ``β_t = β_0 + η Σ_{s≤t} (m − Δ_s)`` while it stays positive, so with
    ``r = η·(m − Δ)`` for a Δ held constant below m the two paths coincide; with ``r = η·m`` the
    ramp is what dual ascent does while Δ ≪ m, without reading Δ. Requires ``β_0, r ≥ 0``, ``t ≥ 0``.
    """
    beta_init = check_scalar("beta_init", beta_init, nonneg=True)
    rate = check_scalar("rate", rate, nonneg=True)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    return beta_init + rate * step


# --------------------------------------------------------------------------- anchor


def anchor_loss(c_phi: Tensor, c_phi0: Tensor, lam: float) -> Tensor:
    """Anchor of the latent context to its initial value: ``λ · mean ‖c_φ − sg[c_φ0]‖²``.

    The squared L2 norm is taken over the last (hidden) dimension; the mean is over all
    other dimensions (i.e. over latent vectors). ``c_phi0`` is detached here, so gradient
    flows only into ``c_phi``.

    Args:
        c_phi: ``(..., H)`` current latent vectors.
        c_phi0: ``(..., H)`` reference latent vectors (same shape).
        lam: λ ≥ 0.
    """
    lam = check_scalar("lam", lam, nonneg=True)
    require_float("c_phi", c_phi)
    require_float("c_phi0", c_phi0)
    if c_phi.dim() < 1 or c_phi.shape != c_phi0.shape:
        raise ValueError(
            "c_phi and c_phi0 must have the same (..., H) shape, got "
            f"{tuple(c_phi.shape)} and {tuple(c_phi0.shape)}"
        )
    a = promote(c_phi)
    diff = a - promote(c_phi0).detach().to(a.dtype)
    return lam * diff.pow(2).sum(-1).mean()
