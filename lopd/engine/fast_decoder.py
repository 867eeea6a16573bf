"""A lean forward pass over a Llama-family causal LM's own weights, for rollouts.

The tiny default model is overhead-bound: a Hugging Face forward of a 2-layer model spends
most of its time in Python (about a hundred module calls, peft's per-call adapter checks,
mask and rotary set-up) rather than in arithmetic. :class:`FastDecoder` runs the same
computation as ``model(input_ids, attention_mask=4-D mask, position_ids, cache)`` with the
same tensor operations in the same order — RMSNorm as ``w · (x · rsqrt(mean(x²) + ε))``,
each projection as ``x Wᵀ (+ b)`` plus ``s · (x Aᵀ) Bᵀ`` for every active LoRA adapter
(exactly peft's ``result + lora_B(lora_A(x)) * scaling``), the model's own rotary module,
and transformers' own SDPA attention function — but reads the weights once per rollout
batch instead of walking the module tree at every step. Which LoRA adapter is active (or
whether adapters are disabled: the teacher) is read when the decoder is built.

The packed forward that rollouts run (:meth:`FastDecoder.packed`) goes further: it runs maps
of the same input as one matmul (q|k|v, gate|up, the adapters' A), normalises q- and k-heads
in one call and reads rotary from a table: fewer, larger operations per layer. Each of those is the same arithmetic element by element, and on CPU the fused forward equals
the map-by-map one (:meth:`FastDecoder.packed_unfused`) to the last bit (tested).

It covers decoder-only Llama-family models whose layers are all full attention (llama,
qwen2, qwen3, mistral) with plain or peft-LoRA linear layers; :meth:`FastDecoder.build`
returns ``None`` for anything else (GPT-2, DoRA, merged or dropout adapters, ...) and the
caller then uses the Hugging Face forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lopd.engine.fused_linear import Fused, Linear, linear

FAMILY = ("llama", "qwen2", "qwen3", "mistral")
# Fusing copies the layers' weights once per rollout batch. Worth it only for small models, whose
# forward is bound by per-operation overhead; a large one is bound by arithmetic and would pay
# the copy in memory for nothing, so above this size the maps run one by one.
FUSE_MAX_PARAMS = 50_000_000


@dataclass
class _PackedLayer:
    """A decoder layer's weights as the packed forward uses them: q, k, v as one map, gate and
    up as one; q- and k-norm weights stacked per head so that both are normalised at once."""

    norm_in: tuple
    norm_post: tuple
    qkv: Fused
    o: Fused
    gate_up: Fused
    down: Fused
    qk_norm: tuple | None  # (weight (heads + kv_heads, head_dim), eps)
    act: object
    heads: int
    kv_heads: int
    head_dim: int
    scaling: float
    attn: nn.Module

    @classmethod
    def of(cls, ly: "_Layer", members: int = 1) -> "_PackedLayer | None":
        d = ly.attn.head_dim
        heads, kv_heads = ly.q.weight.shape[0] // d, ly.k.weight.shape[0] // d
        groups = [Fused.of(m, members) for m in ([ly.q, ly.k, ly.v], [ly.o], [ly.gate, ly.up], [ly.down])]
        if any(g is None for g in groups):
            return None
        qk_norm = None
        if ly.q_norm is not None:
            (wq, eq), (wk, ek) = ly.q_norm, ly.k_norm
            if eq != ek:
                return None
            qk_norm = (torch.cat([wq.expand(heads, d), wk.expand(kv_heads, d)]), eq)
        return cls(ly.norm_in, ly.norm_post, *groups, qk_norm, ly.act, heads, kv_heads, d, ly.attn.scaling, ly.attn)


def _norm(x: torch.Tensor, norm) -> torch.Tensor:
    """RMSNorm as the model's module computes it, ``w · (x · rsqrt(mean(x²) + ε))``: in float32
    through torch's ``rms_norm`` (the same operations in one call, bit-identical on CPU), else
    the module's own sequence. A 2-D weight (heads, head_dim) normalises stacked heads."""
    weight, eps = norm
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        if weight.dim() == 1:
            return F.rms_norm(x, (x.shape[-1],), weight, eps)
        return F.rms_norm(x, (x.shape[-1],), None, eps) * weight
    return _apply_rms(x, norm)


def _rms_norm(mod: nn.Module):
    if not type(mod).__name__.endswith("RMSNorm") or not hasattr(mod, "variance_epsilon"):
        return None
    return mod.weight, mod.variance_epsilon


def _apply_rms(x: torch.Tensor, norm) -> torch.Tensor:
    weight, eps = norm
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def _signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """``[−sin₁, sin₂]`` (halves of the last dimension): ``rotate_half(x) · sin = roll(x) · that``."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), -1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@dataclass
class _Layer:
    attn: nn.Module  # the attention module: head_dim, scaling, num_key_value_groups for SDPA
    norm_in: tuple
    norm_post: tuple
    q: Linear
    k: Linear
    v: Linear
    o: Linear
    q_norm: tuple | None
    k_norm: tuple | None
    gate: Linear
    up: Linear
    down: Linear
    act: object


class FastDecoder:
    def __init__(self, backbone: nn.Module, lm_head: Linear, layers: list[_Layer]):
        self.backbone, self.lm_head, self.layers = backbone, lm_head, layers
        self.fused: list[_PackedLayer] | None = None  # set by build() where the maps can be fused
        self._rotary_table: torch.Tensor | None = None  # (positions, 2, head_dim): cos, signed sin
        self.members = 1  # > 1: the packed forward routes each token through its member's adapters

    @classmethod
    def build(cls, model: nn.Module, members: list[str] | None = None) -> "FastDecoder | None":
        """A decoder over ``model``'s current weights and adapter state, or None if unsupported.
        ``members``: a population's adapters, one per member (:mod:`lopd.model.members`); the
        decoder's :meth:`packed` then runs each token through its member's adapter (fused maps
        only: None where they cannot be fused, or where the LM head has an adapter)."""
        lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        cfg = getattr(lm, "config", None)
        if cfg is None or getattr(cfg, "model_type", None) not in FAMILY or lm.training:
            return None
        from lopd.compat import transformers as compat_transformers

        if compat_transformers.attn_implementation(cfg) != "sdpa" or any(t != "full_attention" for t in getattr(cfg, "layer_types", [])):
            return None
        backbone, head = getattr(lm, "model", None), linear(getattr(lm, "lm_head", None))
        if backbone is None or head is None or not hasattr(backbone, "rotary_emb"):
            return None
        layers = [cls._layer(block, members) for block in backbone.layers[: cfg.num_hidden_layers]]
        norm = _rms_norm(backbone.norm)
        if any(x is None for x in layers) or norm is None or (members and head.lora):
            return None
        dec = cls(backbone, head, layers)
        dec.norm, S = norm, len(members or [None])
        n_params = sum(m.weight.numel() for ly in layers for m in (ly.q, ly.k, ly.v, ly.o, ly.gate, ly.up, ly.down))
        fused = [_PackedLayer.of(ly, S) for ly in layers] if n_params <= FUSE_MAX_PARAMS else [None]
        dec.fused = None if any(f is None for f in fused) else fused
        if members:
            if dec.fused is None:
                return None
            dec.members = S
        return dec

    @staticmethod
    def _layer(block: nn.Module, members: list[str] | None = None) -> _Layer | None:
        attn, mlp = block.self_attn, block.mlp
        lin = lambda mod: linear(mod, members)  # noqa: E731
        parts = dict(q=lin(attn.q_proj), k=lin(attn.k_proj), v=lin(attn.v_proj), o=lin(attn.o_proj),
                     gate=lin(mlp.gate_proj), up=lin(mlp.up_proj), down=lin(mlp.down_proj),
                     norm_in=_rms_norm(block.input_layernorm), norm_post=_rms_norm(block.post_attention_layernorm))
        if any(v is None for v in parts.values()) or getattr(attn, "sliding_window", None):
            return None
        qn, kn = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        q_norm, k_norm = (_rms_norm(qn), _rms_norm(kn)) if qn is not None else (None, None)
        if qn is not None and (q_norm is None or k_norm is None):
            return None
        return _Layer(attn=attn, q_norm=q_norm, k_norm=k_norm, act=mlp.act_fn, **parts)

    def __call__(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, cache) -> torch.Tensor:
        """Logits (B, V) at the last column of ``ids`` (B, L); ``cache`` is updated in place."""
        from lopd.compat import transformers as compat_transformers

        if self.members > 1:
            raise ValueError("a decoder built for members runs only packed")
        h = self.backbone.embed_tokens(ids)
        cos, sin = self.backbone.rotary_emb(h, pos)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        shape = (*ids.shape, -1)
        for i, ly in enumerate(self.layers):
            x = _apply_rms(h, ly.norm_in)
            hd = (*ids.shape, -1, ly.attn.head_dim)
            q, k = ly.q(x).view(hd), ly.k(x).view(hd)
            if ly.q_norm is not None:
                q, k = _apply_rms(q, ly.q_norm), _apply_rms(k, ly.k_norm)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), ly.v(x).view(hd).transpose(1, 2)
            q = (q * cos) + (_rotate_half(q) * sin)
            k = (k * cos) + (_rotate_half(k) * sin)
            k, v = cache.update(k, v, i)
            a, _ = compat_transformers.sdpa_attention_forward(ly.attn, q, k, v, mask, scaling=ly.attn.scaling)
            h = h + ly.o(a.reshape(shape).contiguous())
            x = _apply_rms(h, ly.norm_post)
            h = h + ly.down(ly.act(ly.gate(x)) * ly.up(x))
        return self.lm_head(_apply_rms(h, self.norm)[:, -1:])[:, -1]  # as the HF model: norm, then slice

    @property
    def kv_heads(self) -> int:
        return self.layers[0].k.weight.shape[0] // self.layers[0].attn.head_dim

    def packed(self, ids: torch.Tensor, plan, cache, member_of_token: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, V) at each row's last token, from the rows' real tokens ``ids`` (N,) packed
        in row order (``plan``: :meth:`~lopd.engine.kv_cache.RaggedKVCache.packed`); no padding is
        computed. The last layer needs only the rows' last tokens past its keys and values.
        A decoder built for members needs ``member_of_token`` (N,): each token's member.

        Per layer this is a handful of operations: q, k and v as one matmul (their adapters' A
        as one more), q- and k-norm over the stacked heads in one call, rotary from a table
        built once per cache (the model's rotary module over every position; ``rotate_half(x) ·
        sin`` computed as ``roll(x) · [−sin₁, sin₂]``, which is the same products), the decoding
        queries' attention as transformers' SDPA path calls it, gate and up as one matmul. It
        equals :meth:`packed_unfused` (the maps one by one) to the last bit on CPU (tested);
        models whose maps cannot be fused that way (mixed dtypes) run :meth:`packed_unfused`."""
        if self.fused is None:
            return self.packed_unfused(ids, plan, cache)
        m = None
        if self.members > 1:
            if member_of_token is None or member_of_token.shape != ids.shape:
                raise ValueError("a decoder built for members needs each token's member")
            m = F.one_hot(member_of_token, self.members).to(self.fused[0].qkv.weight.dtype)[:, :, None]
        h = self.backbone.embed_tokens(ids)
        cos, sin = self._rotary(plan.pos, cache.capacity + 1, h)
        decoding = plan.ext_rows is None  # one token per row: packed index = row
        n_layers = len(self.fused)
        for i, ly in enumerate(self.fused):
            x = _norm(h, ly.norm_in)
            n, d = ids.shape[0], ly.head_dim
            y, (q, k, v) = ly.qkv(x, m)
            qk = y[:, : q.shape[1] + k.shape[1]].view(n, ly.heads + ly.kv_heads, d)  # q and k heads, side by side
            if ly.qk_norm is not None:
                qk = _norm(qk, ly.qk_norm)
            qk = qk * cos + qk.roll(d // 2, -1) * sin
            q, k = qk[:, : ly.heads], qk[:, ly.heads:]
            keys, values = cache.write(k, v.view(n, ly.kv_heads, d), i, plan)
            keys, values = keys[:, :, : plan.width], values[:, :, : plan.width]
            q_last = q if decoding else q.index_select(0, plan.last)
            a = self._attend_last(ly, q_last, keys, values, plan.last_mask)  # (B, heads·dim)
            if i == n_layers - 1:
                if not decoding:
                    h = h.index_select(0, plan.last)  # only the last tokens' logits are wanted
                    m = None if m is None else m.index_select(0, plan.last)
            elif not decoding:
                a = self._attend_all(ly, q, keys, values, a.view(-1, 1, ly.heads, d), plan).reshape(n, -1)
            h = h + ly.o(a, m)[0]
            x = _norm(h, ly.norm_post)
            _, (g, u) = ly.gate_up(x, m)
            h = h + ly.down(ly.act(g) * u, m)[0]
        return self.lm_head(_norm(h, self.norm))

    def _rotary(self, pos: torch.Tensor, length: int, like: torch.Tensor):
        """``cos`` and signed ``sin`` (N, 1, head_dim) at positions ``pos``, read from a table of
        the model's rotary module over positions ``0..length-1`` (rebuilt if too short)."""
        rotary = self.backbone.rotary_emb
        if getattr(rotary, "rope_type", "default") != "default":  # dynamic variants rescale with the length
            cos, sin = rotary(like[None], pos[None])
            return cos[0, :, None], _signed_sin(sin[0])[:, None]
        tab = self._rotary_table
        if tab is None or tab.shape[0] < length or tab.dtype != like.dtype or tab.device != like.device:
            cos, sin = rotary(like[None], torch.arange(length, device=like.device)[None])
            tab = self._rotary_table = torch.stack((cos[0], _signed_sin(sin[0])), 1)  # (length, 2, head_dim)
        cs = tab.index_select(0, pos)
        return cs[:, :1], cs[:, 1:]

    @staticmethod
    def _attend_last(ly: "_PackedLayer", q: torch.Tensor, keys, values, mask) -> torch.Tensor:
        """Attention of one query per row (B, heads, dim) → (B, heads·dim), exactly as
        transformers' SDPA integration computes a one-query step: with grouped heads the queries
        of a key/value head are packed as that head's query block (its ``pack_gqa``)."""
        b, n_rep = q.shape[0], ly.heads // ly.kv_heads
        qg = q.reshape(b, ly.kv_heads, n_rep, ly.head_dim) if n_rep > 1 else q[:, :, None]
        a = F.scaled_dot_product_attention(qg, keys, values, attn_mask=mask, dropout_p=0.0, scale=ly.scaling)
        return a.reshape(b, -1)

    def packed_unfused(self, ids: torch.Tensor, plan, cache) -> torch.Tensor:
        """:meth:`packed` with each linear map, norm and rotary computed as the model's modules
        do, one by one (transformers' SDPA function for attention)."""
        h = self.backbone.embed_tokens(ids)
        cos, sin = self.backbone.rotary_emb(h[None], plan.pos[None])
        cos, sin = cos[0, :, None], sin[0, :, None]  # (N, 1, head_dim): broadcast over heads
        for i, ly in enumerate(self.layers):
            x = _apply_rms(h, ly.norm_in)
            hd = (ids.shape[0], -1, ly.attn.head_dim)
            q, k = ly.q(x).view(hd), ly.k(x).view(hd)
            if ly.q_norm is not None:
                q, k = _apply_rms(q, ly.q_norm), _apply_rms(k, ly.k_norm)
            q = (q * cos) + (_rotate_half(q) * sin)
            k = (k * cos) + (_rotate_half(k) * sin)
            keys, values = cache.write(k, ly.v(x).view(hd), i, plan)
            keys, values = keys[:, :, : plan.width], values[:, :, : plan.width]
            a = self._attend(ly, q.index_select(0, plan.last)[:, :, None], keys, values, plan.last_mask)
            if i == len(self.layers) - 1:
                h = h.index_select(0, plan.last)  # only the last tokens' logits are wanted
            elif plan.ext_rows is not None:
                a = self._attend_all(ly, q, keys, values, a, plan)
            h = h + ly.o(a.reshape(h.shape[0], -1))
            x = _apply_rms(h, ly.norm_post)
            h = h + ly.down(ly.act(ly.gate(x)) * ly.up(x))
        return self.lm_head(_apply_rms(h, self.norm))

    @staticmethod
    def _attend(ly: _Layer, q: torch.Tensor, keys, values, mask) -> torch.Tensor:
        """transformers' SDPA attention of queries (rows, heads, L, dim) → (rows, L, heads, dim)."""
        from lopd.compat import transformers as compat_transformers

        return compat_transformers.sdpa_attention_forward(ly.attn, q, keys, values, mask, scaling=ly.attn.scaling)[0]

    def _attend_all(self, ly: _Layer, q, keys, values, a_last, plan) -> torch.Tensor:
        """Attention outputs (N, heads, dim) of every packed token: the last tokens' ``a_last``
        and the other tokens' (a padded block over the rows that feed several)."""
        q_ext = q[plan.ext_idx].transpose(1, 2)  # (P, heads, E, dim)
        a_ext = self._attend(ly, q_ext, keys[plan.ext_rows], values[plan.ext_rows], plan.ext_mask)
        a = q.new_empty(q.shape)
        a.index_copy_(0, plan.last, a_last[:, 0])
        a.index_copy_(0, plan.ext_dest, a_ext.reshape(-1, *q.shape[1:])[plan.ext_take])
        return a
