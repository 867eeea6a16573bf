"""A population's members on one backbone: each row of a batch through its own member's adapter.

A member ``i`` of a population owns the peft adapters ``student_m{i}`` and ``composer_m{i}`` (its θ
and the LoRA part of its φ), next to the backbone's own ``student`` and ``composer``. A member's
view of the backbone (:meth:`lopd.model.backbone.Backbone.members`) maps the roles to its adapters,
so a :class:`~lopd.training.trainer.Trainer` built on a view trains that member and nothing else
(its optimiser, checkpoints and state-dict layout are a single run's).

While :func:`member_rows` is active, every LoRA layer computes, for row ``n`` of its input
(member ``μ(n)``), ``y_n = W x_n + s · B_μ(n) A_μ(n) x_n`` for all members at once. Where the rows
are S equal consecutive blocks (a training step's passes: every member has the same number of
rollouts), as one batched matmul per factor: block ``i`` times ``A_iᵀ`` then ``B_iᵀ``. Otherwise (the
rollout engine's live rows, once some have finished) with a mask:

    h = x [A_0; …; A_{S-1}]ᵀ          (N, …, S·r)  every member's down-projection
    h ← h ⊙ M[μ(n)]                   the row keeps only its member's r columns (M: 0/1 blocks)
    y = W x + s · h [B_0 | … | B_{S-1}]ᵀ

Masking is exact (×1 or ×0), so a row's output is its member's LoRA output; only the order in
which the final sum adds the zeros of other members' columns differs from a member alone.
Masking computes every member's factors for every row (S× the LoRA arithmetic). Where a caller
knows its rows come member by member in unequal runs (the composer's distinct experiences,
:func:`lopd.model.composer.encode_distinct`), it asks for ``segments``: each member's run of rows
times its own ``A_iᵀ`` then ``B_iᵀ``, concatenated (the arithmetic of the members alone). Both
paths are other kernels than a member alone runs (a last-bit difference, which is why the
population's independence tests use tolerances). The gradient of ``A_i`` and ``B_i`` comes from
member ``i``'s rows only. Outside the context every
layer runs peft's own forward, unchanged.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F


@dataclass
class MemberRouting:
    """What the patched LoRA layers read: each member's adapter name for the role being run, and how
    the batch's rows map to members — ``blocks``: the rows are ``S`` equal consecutive blocks, member
    ``i``'s the ``i``-th (one ``bmm`` per map, no wasted arithmetic); ``segments``: the rows come member
    by member, ``segments[i]`` of member ``i`` (two small matmuls per member and map); else ``mask``,
    the (N, S·r) 0/1 mask. None set: peft's own forward runs."""

    names: list[str] | None = None
    mask: torch.Tensor | None = None
    blocks: int | None = None
    segments: list[int] | None = None
    r: int = 0
    dtype: torch.dtype = torch.float32
    device: torch.device | str = "cpu"

    def state(self) -> tuple:
        """Everything a routed forward reads, to route a replay (activation checkpointing) as the
        forward was routed."""
        return self.names, self.mask, self.blocks, self.segments, self.r, self.dtype, self.device

    def restore(self, state: tuple) -> None:
        self.names, self.mask, self.blocks, self.segments, self.r, self.dtype, self.device = state

    @property
    def active(self) -> bool:
        return self.names is not None and (self.blocks is not None or self.segments is not None
                                           or self.mask is not None)

    def set_rows(self, member_of_row: torch.Tensor, segments: bool = False) -> None:
        """Route row ``n`` of the next passes through member ``member_of_row[n]``. ``segments``: the caller
        allows the per-member path when the rows come member by member (else the mask)."""
        S = len(self.names)
        n = member_of_row.shape[0]
        rows = member_of_row.cpu()
        self.blocks = self.segments = self.mask = None
        if n % S == 0 and torch.equal(rows, torch.arange(S).repeat_interleave(n // S)):
            self.blocks = S
        elif segments and n > 0 and bool((rows[1:] >= rows[:-1]).all()):
            self.segments = torch.bincount(rows, minlength=S).tolist()
        else:
            self.mask = row_mask(member_of_row.to(self.device), S, self.r, self.dtype)


def adapter_name(role: str, member: int) -> str:
    return f"{role}_m{member}"


def row_mask(member_of_row: torch.Tensor, n_members: int, r: int, dtype: torch.dtype) -> torch.Tensor:
    """``M[n, i·r + j] = 1`` iff row ``n`` belongs to member ``i`` (``member_of_row``: (N,) long)."""
    cols = torch.arange(n_members, device=member_of_row.device).repeat_interleave(r)
    return (member_of_row[:, None] == cols[None, :]).to(dtype)


def install(tuner_layers: list, routing: MemberRouting) -> None:
    """Give every peft LoRA layer the member route (an instance ``forward``; idempotent)."""
    for mod in tuner_layers:
        if "forward" in vars(mod):
            continue
        mod.forward = _routed(mod, type(mod).forward.__get__(mod), routing)


def _routed(mod, peft_forward, routing: MemberRouting):
    def forward(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if not routing.active or mod.disable_adapters:
            return peft_forward(x, *args, **kwargs)
        names = routing.names
        result = mod.base_layer(x, *args, **kwargs)
        xa = x.to(mod.lora_A[names[0]].weight.dtype)
        if routing.blocks is not None:  # member i's rows are the i-th block: (S, rows·…, in) @ (S, in, r) @ (S, r, out)
            S = routing.blocks
            a = torch.stack([mod.lora_A[n].weight for n in names]).transpose(1, 2)
            b = torch.stack([mod.lora_B[n].weight for n in names]).transpose(1, 2)
            lora = torch.bmm(torch.bmm(xa.reshape(S, -1, xa.shape[-1]), a), b).reshape(*x.shape[:-1], -1)
        elif routing.segments is not None:  # member i's rows are the i-th run, of segments[i] rows
            parts = [F.linear(F.linear(xs, mod.lora_A[n].weight), mod.lora_B[n].weight)
                     for xs, n in zip(xa.split(routing.segments), names) if xs.shape[0]]
            lora = torch.cat(parts)
        else:
            a = torch.cat([mod.lora_A[n].weight for n in names])  # (S·r, in)
            b = torch.cat([mod.lora_B[n].weight for n in names], dim=1)  # (out, S·r)
            mask = routing.mask.view(routing.mask.shape[0], *([1] * (x.dim() - 2)), -1)
            lora = F.linear(F.linear(xa, a) * mask, b)
        return (result + lora * mod.scaling[names[0]]).to(result.dtype)
    return forward


@contextmanager
def member_rows(routing: MemberRouting, role: str, member_of_row: torch.Tensor, n_members: int,
                r: int, dtype: torch.dtype, segments: bool = False) -> Iterator[MemberRouting]:
    """Route the rows of the forward passes run inside through their members' ``role`` adapters
    (:meth:`MemberRouting.set_rows` may re-route inside: the rollout engine's rows change as rows
    finish). ``segments``: rows that come member by member may take the per-member path."""
    if role == "teacher":
        raise ValueError("the teacher runs without adapters: no member routing")
    prior = routing.state()
    routing.names = [adapter_name(role, i) for i in range(n_members)]
    routing.r, routing.dtype, routing.device = r, dtype, member_of_row.device
    routing.set_rows(member_of_row, segments)
    try:
        yield routing
    finally:
        routing.restore(prior)
