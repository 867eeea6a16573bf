"""The conditioned teacher as a *policy*: a causal LM that sees a fixed embedding prefix.

:class:`PrefixedPolicy` wraps a Hugging Face causal LM so that :func:`lopd.engine.rollout.rollout_batch`
rolls out the teacher conditioned on a prefix of embeddings — the composer's latents ``c_φ`` or
the embedded text of retrieved trajectories — without knowing about it. Conventions are those of
:meth:`lopd.model.backbone.Backbone.teacher_logits`:

* latent prefix (``latent=True``): the ``L`` prefix entries sit at position 0 and the real tokens
  keep the positions ``0..T-1`` the unwrapped model gives them;
* text prefix (``latent=False``): the prefix is ordinary text before the real tokens, whose
  positions follow it (row ``i``'s ``L_i`` real prefix entries at ``0..L_i-1``, its tokens from
  ``L_i``; ``teacher_logits`` counts the left padding too, which a rotary model cannot tell apart);
* ``prefix_mask`` marks the real prefix entries (0 on left padding; a text prefix only — every row of
  a latent prefix holds the same ``L = n_ret·K`` latents).

How it plugs into the rollout engine (``lopd.engine.rollout``: chunks left-padded to a common width, a
:class:`~lopd.engine.kv_cache.RaggedKVCache`, explicit position ids and a 4-D mask). ``forward`` takes
what the engine passes — ``input_ids (B, W)``, ``attention_mask (B, 1, W, S)`` (a real query's
row is true somewhere past the cache's scratch slot 0), ``position_ids (B, W)``, ``cache``,
``use_cache``, ``logits_to_keep`` — and:

* on the first call of a cache (no layer filled yet) it prepends each row's prefix to the row's
  real tokens, re-left-pads, grows the cache's capacity by ``L``, and re-plans the chunk with the
  cache's own :meth:`~lopd.engine.kv_cache.RaggedKVCache.plan` (so the engine's ``commit`` caches prefix
  and prompt together); the batch must then be the prefix's ``B`` rows, in order;
* on later calls the prefix is in the cache; for a latent prefix the engine's positions (which
  count the ``L`` cached prefix entries) are shifted back by ``L``;
* it returns the wrapped model's output with ``logits`` over the caller's ``W`` columns.

Rows that finish leave the batch through the cache (:meth:`~lopd.engine.kv_cache.RaggedKVCache.keep`);
nothing here is per row after the first call. Rollouts without the KV cache are refused (the
engine drops finished rows, and a cache-less call would need to know which rows remain).
The wrapper hides ``config``/``get_base_model`` so the engine's fast decoder — which reads the
wrapped model's weights directly and would skip the prefix — is never built for it. ``prepare``
(optional) runs before every forward, e.g. ``lambda: bb.mode("teacher")`` for the shared backbone.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn


class PrefixedPolicy(nn.Module):
    def __init__(self, model: nn.Module, prefix: torch.Tensor | None, prefix_mask: torch.Tensor | None = None, *,
                 latent: bool = True, prepare: Callable[[], object] | None = None):
        super().__init__()
        from lopd.compat.transformers import cache_kwarg

        self.model = model
        self.model_cache_kw = cache_kwarg(model)
        if prefix is not None and prefix.dim() != 3:
            raise ValueError(f"prefix must have shape (B, L, d), got {tuple(prefix.shape)}")
        if prefix is not None and prefix_mask is None:
            prefix_mask = torch.ones(prefix.shape[:2], dtype=torch.long, device=prefix.device)
        if prefix is not None and tuple(prefix_mask.shape) != tuple(prefix.shape[:2]):
            raise ValueError(f"prefix_mask must have shape {tuple(prefix.shape[:2])}, got {tuple(prefix_mask.shape)}")
        if prefix is not None and latent and not bool(prefix_mask.bool().all()):
            # the position shift of later calls is one number for every row: L real latents each
            raise ValueError("a latent prefix must have every entry real (prefix_mask all ones)")
        self.prefix, self.prefix_mask = prefix, prefix_mask
        self.L = 0 if prefix is None else prefix.shape[1]
        self.latent = latent
        self.prepare = prepare

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, use_cache=None,
                inputs_embeds=None, **kw):
        if self.prepare is not None:
            self.prepare()
        legacy = kw.pop("past_key_values", None)
        cache = cache if cache is not None else legacy
        if self.L == 0:
            return self._call(cache, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              use_cache=use_cache, inputs_embeds=inputs_embeds, **kw)
        if cache is None:
            raise ValueError("PrefixedPolicy needs the rollout's KV cache (use_cache=True)")
        emb = inputs_embeds if inputs_embeds is not None else self.model.get_input_embeddings()(input_ids)
        W = emb.shape[1]
        if len(cache) > 0:  # the first forward filled the cache's layers: the prefix is in it
            if self.latent:  # the engine counts the cached latents; the real tokens sit at 0..T-1
                position_ids = (position_ids - self.L).clamp(min=0)
            out = self._call(cache, inputs_embeds=emb, attention_mask=attention_mask, position_ids=position_ids,
                             use_cache=use_cache, **kw)
        else:
            emb, attention_mask, position_ids = self._prime(cache, emb, attention_mask)
            out = self._call(cache, inputs_embeds=emb, attention_mask=attention_mask, position_ids=position_ids,
                             use_cache=use_cache, **kw)
        if out.logits.shape[1] > W:
            out.logits = out.logits[:, -W:]
        return out

    def _call(self, cache, **kw):
        if cache is not None:
            kw[self.model_cache_kw] = cache
        return self.model(**kw)

    def _prime(self, cache, emb: torch.Tensor, mask4: torch.Tensor):
        """The first chunk with each row's real prefix entries before its real tokens, re-planned."""
        B, W = emb.shape[:2]
        if B != self.prefix.shape[0]:
            raise ValueError(f"PrefixedPolicy: the first forward has {B} rows but the prefix holds "
                             f"{self.prefix.shape[0]} (one per task, in the rollout's order)")
        if int(cache.get_seq_length()) != 0:
            raise ValueError("PrefixedPolicy: the cache already holds entries that are not this prefix")
        dev = emb.device
        real = mask4[:, 0, :, 1:].any(-1)  # (B, W) the caller's real columns (padding sees slot 0 only)
        pmask = self.prefix_mask.to(dev).bool()
        prefix = self.prefix.to(device=dev, dtype=emb.dtype)
        rows = [torch.cat([prefix[i][pmask[i]], emb[i][real[i]]]) for i in range(B)]
        n_new = torch.tensor([len(r) for r in rows], dtype=torch.long, device=dev)
        width = int(n_new.max())
        out = emb.new_zeros(B, width, emb.shape[-1])
        for i, r in enumerate(rows):
            out[i, width - len(r):] = r
        cache.capacity += self.L
        pos, mask = cache.plan(n_new, width)
        if self.latent:  # prefix entries at 0, real tokens at 0.. (plan counts from the prefix)
            pos = (pos - self.L).clamp(min=0)
        return out, mask, pos
