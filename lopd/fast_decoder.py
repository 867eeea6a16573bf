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

FAMILY = ("llama", "qwen2", "qwen3", "mistral")


@dataclass
class _Linear:
    weight: torch.Tensor
    bias: torch.Tensor | None
    lora: list[tuple[torch.Tensor, torch.Tensor, float]]  # (A, B, scaling) of each active adapter

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        for a, b, s in self.lora:
            y = y + F.linear(F.linear(x.to(a.dtype), a), b) * s
        return y.to(self.weight.dtype) if self.lora else y


def _linear(mod: nn.Module) -> _Linear | None:
    """The computation of a plain ``nn.Linear`` or of a peft LoRA ``Linear`` wrapper, or None."""
    if type(mod) is nn.Linear:
        return _Linear(mod.weight, mod.bias, [])
    base = getattr(mod, "base_layer", None)
    if type(base) is not nn.Linear or not hasattr(mod, "lora_A") or getattr(mod, "merged", True):
        return None
    if getattr(mod, "fan_in_fan_out", False):
        return None
    if mod.disable_adapters:
        return _Linear(base.weight, base.bias, [])
    lora = []
    for name in mod.active_adapters:
        if name not in mod.lora_A:
            continue
        if name in getattr(mod, "lora_variant", {}) or type(mod.lora_dropout[name]) is not nn.Identity:
            return None
        a, b = mod.lora_A[name], mod.lora_B[name]
        if type(a) is not nn.Linear or type(b) is not nn.Linear or a.bias is not None or b.bias is not None:
            return None
        lora.append((a.weight, b.weight, mod.scaling[name]))
    return _Linear(base.weight, base.bias, lora)


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


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@dataclass
class _Layer:
    attn: nn.Module  # the attention module: head_dim, scaling, num_key_value_groups for SDPA
    norm_in: tuple
    norm_post: tuple
    q: _Linear
    k: _Linear
    v: _Linear
    o: _Linear
    q_norm: tuple | None
    k_norm: tuple | None
    gate: _Linear
    up: _Linear
    down: _Linear
    act: object


class FastDecoder:
    def __init__(self, backbone: nn.Module, lm_head: _Linear, layers: list[_Layer]):
        self.backbone, self.lm_head, self.layers = backbone, lm_head, layers

    @classmethod
    def build(cls, model: nn.Module) -> "FastDecoder | None":
        """A decoder over ``model``'s current weights and adapter state, or None if unsupported."""
        lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        cfg = getattr(lm, "config", None)
        if cfg is None or getattr(cfg, "model_type", None) not in FAMILY or lm.training:
            return None
        if cfg._attn_implementation != "sdpa" or any(t != "full_attention" for t in getattr(cfg, "layer_types", [])):
            return None
        backbone, head = getattr(lm, "model", None), _linear(getattr(lm, "lm_head", None))
        if backbone is None or head is None or not hasattr(backbone, "rotary_emb"):
            return None
        layers = [cls._layer(block) for block in backbone.layers[: cfg.num_hidden_layers]]
        norm = _rms_norm(backbone.norm)
        if any(x is None for x in layers) or norm is None:
            return None
        dec = cls(backbone, head, layers)
        dec.norm = norm
        return dec

    @staticmethod
    def _layer(block: nn.Module) -> _Layer | None:
        attn, mlp = block.self_attn, block.mlp
        parts = dict(q=_linear(attn.q_proj), k=_linear(attn.k_proj), v=_linear(attn.v_proj), o=_linear(attn.o_proj),
                     gate=_linear(mlp.gate_proj), up=_linear(mlp.up_proj), down=_linear(mlp.down_proj),
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
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

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
            a, _ = sdpa_attention_forward(ly.attn, q, k, v, mask, dropout=0.0, scaling=ly.attn.scaling)
            h = h + ly.o(a.reshape(shape).contiguous())
            x = _apply_rms(h, ly.norm_post)
            h = h + ly.down(ly.act(ly.gate(x)) * ly.up(x))
        return self.lm_head(_apply_rms(h, self.norm)[:, -1:])[:, -1]  # as the HF model: norm, then slice

    @property
    def kv_heads(self) -> int:
        return self.layers[0].k.weight.shape[0] // self.layers[0].attn.head_dim

    def packed(self, ids: torch.Tensor, plan, cache) -> torch.Tensor:
        """Logits (B, V) at each row's last token, from the rows' real tokens ``ids`` (N,) packed
        in row order (``plan``: :meth:`~lopd.kv_cache.RaggedKVCache.packed`); no padding is
        computed. The last layer needs only the rows' last tokens past its keys and values."""
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
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(ly.attn, q, keys, values, mask, dropout=0.0, scaling=ly.attn.scaling)[0]

    def _attend_all(self, ly: _Layer, q, keys, values, a_last, plan) -> torch.Tensor:
        """Attention outputs (N, heads, dim) of every packed token: the last tokens' ``a_last``
        and the other tokens' (a padded block over the rows that feed several)."""
        q_ext = q[plan.ext_idx].transpose(1, 2)  # (P, heads, E, dim)
        a_ext = self._attend(ly, q_ext, keys[plan.ext_rows], values[plan.ext_rows], plan.ext_mask)
        a = q.new_empty(q.shape)
        a.index_copy_(0, plan.last, a_last[:, 0])
        a.index_copy_(0, plan.ext_dest, a_ext.reshape(-1, *q.shape[1:])[plan.ext_take])
        return a
