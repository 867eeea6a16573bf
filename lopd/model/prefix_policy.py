"""The conditioned teacher as a *policy*: a causal LM that sees a fixed embedding prefix.

:class:`PrefixedPolicy` wraps a Hugging Face causal LM so that any decoding loop written for a
plain model (``lopd.rollout.rollout_batch`` or its successors) rolls out the teacher
conditioned on a prefix of embeddings — the composer's latents ``c_φ`` or the embedded text of
retrieved trajectories — without knowing about it. It follows exactly the conventions of
:meth:`lopd.model.backbone.Backbone.teacher_logits`:

* latent prefix (``latent=True``): the ``L`` prefix entries sit at position 0 and the real
  tokens keep the positions ``0..T-1`` the unwrapped model would give them;
* text prefix (``latent=False``): the prefix is ordinary text at positions ``0..L-1`` and the
  real tokens are shifted by ``L``;
* attention mask: ``prefix_mask`` (1 on real prefix entries, 0 on left padding) before the
  real tokens' mask (all ones when the caller passes none).

Interface: ``forward(input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None,
<cache>=None, use_cache=None, **kw)`` where ``<cache>`` is the wrapped model's cache keyword
(``cache`` in transformers ≥ 5.x, ``past_key_values`` before). ``attention_mask`` and
``position_ids`` refer to the *real* tokens only (as for the unwrapped model). A call whose
cache is missing or empty is a first call: the prefix is prepended (and written into the
cache); later calls read the prefix from the cache. The returned output is the wrapped model's,
with ``logits`` restricted to the real tokens of this call. The batch size must stay that of
``prefix`` for the whole rollout. ``prepare`` (optional) runs before every forward, e.g.
``lambda: bb.mode("teacher")`` so the shared backbone is in the teacher role even if other code
switched it between decoding steps.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

CACHE_KWS = ("cache", "past_key_values")


def _cache_len(cache) -> int:
    if cache is None:
        return 0
    if hasattr(cache, "get_seq_length"):
        return int(cache.get_seq_length())
    return int(cache[0][0].shape[-2]) if len(cache) else 0  # legacy tuple-of-tuples cache


class PrefixedPolicy(nn.Module):
    def __init__(self, model: nn.Module, prefix: torch.Tensor | None, prefix_mask: torch.Tensor | None = None, *,
                 latent: bool = True, prepare: Callable[[], object] | None = None):
        super().__init__()
        self.model = model
        if prefix is not None and prefix.dim() != 3:
            raise ValueError(f"prefix must have shape (B, L, d), got {tuple(prefix.shape)}")
        self.prefix = prefix
        L = 0 if prefix is None else prefix.shape[1]
        if prefix is not None and prefix_mask is None:
            prefix_mask = torch.ones(prefix.shape[:2], dtype=torch.long, device=prefix.device)
        if prefix is not None and tuple(prefix_mask.shape) != tuple(prefix.shape[:2]):
            raise ValueError(f"prefix_mask must have shape {tuple(prefix.shape[:2])}, got {tuple(prefix_mask.shape)}")
        self.prefix_mask = prefix_mask
        self.L = L
        self.latent = latent
        self.prepare = prepare

    # what decoding loops may look up on the model they are given
    def get_base_model(self) -> nn.Module:
        m = self.model
        return m.get_base_model() if hasattr(m, "get_base_model") else m

    @property
    def config(self):
        return self.model.config

    def positions(self, real_pos: torch.Tensor) -> torch.Tensor:
        """(B, n) positions of real tokens as the unwrapped model sees them → positions under the prefix."""
        return real_pos if self.latent else real_pos + self.L

    def prefix_positions(self, B: int, device) -> torch.Tensor:
        if self.latent:
            return torch.zeros(B, self.L, dtype=torch.long, device=device)
        return torch.arange(self.L, device=device).expand(B, self.L)

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, **kw):
        if self.prepare is not None:
            self.prepare()
        if self.L == 0:
            return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              inputs_embeds=inputs_embeds, **kw)
        cache_kw = next((k for k in CACHE_KWS if kw.get(k) is not None), None)
        past = _cache_len(kw[cache_kw]) if cache_kw else 0
        first = past == 0
        emb = inputs_embeds if inputs_embeds is not None else self.model.get_input_embeddings()(input_ids)
        B, n = emb.shape[:2]
        if B != self.prefix.shape[0]:
            raise ValueError(f"PrefixedPolicy: batch of {B} sequences but the prefix holds {self.prefix.shape[0]}")
        past_real = 0 if first else past - self.L
        if past_real < 0:
            raise ValueError(f"PrefixedPolicy: the cache holds {past} entries, fewer than the {self.L}-entry prefix")
        dev = emb.device
        if position_ids is None:
            position_ids = torch.arange(past_real, past_real + n, device=dev).expand(B, n)
        pos = self.positions(position_ids.expand(B, n))
        if attention_mask is None:
            attention_mask = torch.ones(B, past_real + n, dtype=torch.long, device=dev)
        mask = torch.cat([self.prefix_mask.to(device=dev, dtype=attention_mask.dtype), attention_mask], dim=1)
        if first:
            emb = torch.cat([self.prefix.to(device=dev, dtype=emb.dtype), emb], dim=1)
            pos = torch.cat([self.prefix_positions(B, dev), pos], dim=1)
        out = self.model(inputs_embeds=emb, attention_mask=mask, position_ids=pos, **kw)
        if out.logits.shape[1] > n:  # drop the prefix positions (logits_to_keep may already have)
            out.logits = out.logits[:, -n:]
        return out
