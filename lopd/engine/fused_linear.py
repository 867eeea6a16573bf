"""The linear maps of a Llama-family layer as the lean decoder (:mod:`lopd.engine.fast_decoder`) runs them:
a plain or peft-LoRA ``nn.Linear`` read once (:class:`Linear`), and maps of one input fused into one matmul
(:class:`Fused`), optionally routing each row through its population member's adapter."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lopd.compat import peft as compat_peft


@dataclass
class Linear:
    weight: torch.Tensor
    bias: torch.Tensor | None
    lora: list[tuple[torch.Tensor, torch.Tensor, float]]  # (A, B, scaling) of each active adapter

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        for a, b, s in self.lora:
            y = y + F.linear(F.linear(x.to(a.dtype), a), b) * s
        return y.to(self.weight.dtype) if self.lora else y


def linear(mod: nn.Module, members: list[str] | None = None) -> Linear | None:
    """The computation of a plain ``nn.Linear`` or of a peft LoRA ``Linear`` wrapper, or None;
    ``members``: its lora list holds these adapters' factors, one per member, in member order."""
    if type(mod) is nn.Linear:
        return Linear(mod.weight, mod.bias, [])
    lora = compat_peft.lora_linear(mod, members)
    if lora is None:
        return None
    base, adapters = lora
    return Linear(base.weight, base.bias, adapters)


@dataclass
class Fused:
    """Linear maps of one input run as one: ``y = x [W_1; …; W_n]ᵀ (+ b)``, split back into
    the maps' outputs (column blocks of ``y``), each plus its LoRA terms ``s · (x Aᵀ) Bᵀ``;
    the A of every adapter of the group run as one matmul too (``h = x [A_1; …]ᵀ``, each B on its
    block of ``h``). Every output element is the same dot product as in the separate maps —
    on CPU bit-identical (``tests/unit/test_rollout_engine.py``). ``s`` is folded into B when it is a
    power of two (exact in binary floating point); else it is applied as peft does.

    With ``members`` = S > 1 (a population, :mod:`lopd.model.members`) each map's lora list holds
    one adapter per member and row ``n`` takes member ``μ(n)``'s: ``h = x [A_0; …; A_{S-1}]ᵀ``
    (member-major), ``h ← h ⊙ M[μ(n)]`` (the row keeps its member's columns, 0/1), then each map's
    ``B`` of every member side by side, ``s · h_map [B_0 | … | B_{S-1}]ᵀ``: the member-routed LoRA of
    the Hugging Face path's mask, as two matmuls per group instead of S."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    sizes: list[int]  # output width of each map
    a: torch.Tensor | None  # the adapters' A stacked (Σr, in)
    lora: list[tuple[int, int, int, torch.Tensor, float | None]]  # (map, h from, h to, B, s or None if folded)
    members: int = 1

    @classmethod
    def of(cls, maps: list[Linear], members: int = 1) -> "Fused | None":
        """The fused group, or None where fusing could change the arithmetic (mixed dtypes,
        some maps with a bias and some without, adapters in another dtype than the weights;
        members whose scalings differ)."""
        dtypes = {m.weight.dtype for m in maps} | {t.dtype for m in maps for a, b, _ in m.lora for t in (a, b)}
        if len(dtypes) > 1 or len({m.bias is None for m in maps}) > 1:
            return None
        cat = (lambda ts: ts[0]) if len(maps) == 1 else torch.cat  # one map: its own tensors, no copy
        bias = None if maps[0].bias is None else cat([m.bias for m in maps])
        if members > 1:
            return cls._of_members(maps, members, cat, bias)
        lora, a_rows, r = [], [], 0
        for j, m in enumerate(maps):
            for a, b, s in m.lora:
                exact = float(s) > 0 and math.frexp(float(s))[0] == 0.5  # a power of two
                lora.append((j, r, r + a.shape[0], b * s if exact else b, None if exact else s))
                a_rows.append(a)
                r += a.shape[0]
        a = (a_rows[0] if len(a_rows) == 1 else torch.cat(a_rows)) if a_rows else None
        return cls(cat([m.weight for m in maps]), bias, [m.weight.shape[0] for m in maps], a, lora)

    @classmethod
    def _of_members(cls, maps: list[Linear], S: int, cat, bias) -> "Fused | None":
        """The member-routed group: ``a`` (S·R, in), member ``i``'s rows ``i·R..(i+1)·R`` holding its maps'
        A one after another (R = Σ_map r); each map's entry ``(map, r0, r1, [B_0 | … | B_{S-1}], s)``."""
        if any(len(m.lora) not in (0, S) or len({float(s) for _, _, s in m.lora}) > 1 for m in maps):
            return None
        lora, r = [], 0
        for j, m in enumerate(maps):
            if not m.lora:  # a map without adapters (k_proj where only q and v are targets)
                continue
            s = float(m.lora[0][2])
            exact = s > 0 and math.frexp(s)[0] == 0.5  # a power of two
            b = torch.cat([b_i * s if exact else b_i for _, b_i, _ in m.lora], dim=1)  # (out, S·r)
            lora.append((j, r, r + m.lora[0][0].shape[0], b, None if exact else s))
            r += m.lora[0][0].shape[0]
        if not lora:
            return cls(cat([m.weight for m in maps]), bias, [m.weight.shape[0] for m in maps], None, [], S)
        a = torch.cat([m.lora[i][0] for i in range(S) for m in maps if m.lora])
        return cls(cat([m.weight for m in maps]), bias, [m.weight.shape[0] for m in maps], a, lora, S)

    def __call__(self, x: torch.Tensor, member_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``(y, [y_1, …, y_n])``: the whole output (N, Σ sizes) and its blocks (views of ``y``).
        ``member_mask`` (N, S, 1): row ``n``'s member as a one-hot, when the group routes members."""
        y = F.linear(x, self.weight, self.bias)
        parts = list(y.split(self.sizes, -1))
        if self.a is not None:
            h = F.linear(x, self.a)
            if self.members > 1:
                h = h.view(x.shape[0], self.members, -1) * member_mask
            for j, r0, r1, b, s in self.lora:
                lo = F.linear(h[..., r0:r1] if self.members == 1 else h[:, :, r0:r1].reshape(x.shape[0], -1), b)
                parts[j].add_(lo if s is None else lo * s)  # in place: y's block is updated too
        return y, parts
