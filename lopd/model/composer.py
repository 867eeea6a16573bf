"""The latent composer Φ_φ.

Each retrieved experience (token ids of a successful trajectory) is encoded by the shared
backbone with the ``composer`` LoRA adapter; a QFormer-style block with ``K`` learned query
vectors compresses the encoder's last hidden states into ``K`` latent tokens in the
backbone's input-embedding space:

    q ← Q[:K]                                  (learned queries)
    q ← q + CrossAttn(LN(q), H, H)             (read the experience)
    q ← q + SelfAttn(LN(q))                    (queries exchange information)
    q ← q + MLP(LN(q))
    z ← g · s · Proj(LN(q))                    (into embedding space; s starts at the
                                                 RMS of the token embeddings, the gate g at 0)

``c_φ`` concatenates the ``n_ret`` experiences' latents: ``(N, n_ret·K, d)``.

**A fresh composer is (almost) a no-op.** The output passes through a learned scalar gate
``g`` initialised at 0, ``z ← g · s · Proj(LN(q))``, so fresh latents are exact zero vectors. In
a pre-norm decoder without attention biases (Qwen3, Llama) a zero input stays zero through every
layer (RMSNorm(0) = 0, no biases), so the prepended positions have key 0 and value 0: the only
effect on the real tokens is that each attention softmax gains ``n_ret·K`` extra entries of
score 0 and value 0, which scales every attention output by ``Z/(Z + n_ret·K)`` (``Z`` = the sum
of the real tokens' ``exp`` scores). The deviation from the teacher without context therefore
grows with ``n_ret·K``; ``tests/test_premise.py`` states and checks the tolerance. Why a gate and
not a zero-initialised ``Proj``: Adam's first update moves every weight by ``±lr``, which turns a
zero ``Proj`` into large latents in one step, while a zero gate grows by at most ``lr`` per step,
so the latents' scale ramps up smoothly (measured on the default profile, teacher NLL of 48 bank
trajectories at K=4, n_ret=2 after one cold-start step at lr 0.003: 0.132 → 0.965 with a zero
``Proj``, 0.132 → 0.173 with the zero gate). Only ``g`` receives gradient at the very first
step; every part of φ receives gradient once ``g ≠ 0``.

**Except in a deep model.** An exactly-zero prefix reaches the input RMSNorm of every layer at 0,
where its derivative is ``w/sqrt(ε)``; the prefix's residual stream stays exactly 0 through
every layer, so the gradient with respect to it is that factor compounded once per layer. At
Qwen3-0.6B's 28 layers and ε = 10⁻⁶ it overflows fp32 at the first cold-start step (found on
the stand-in, ``lopd make-standin``; reproduced by ``tests/test_path_check.py`` on a 28-layer
tiny model). ``cold_start.gate_init`` > 0 starts the gate off zero: the first layer's RMSNorm
then lifts the prefix to full scale and later layers see O(1) inputs (gradients finite), at
the price of a teacher that is no longer unchanged at init. The default (tiny, 2 layers) keeps
0; the real-model profiles set it.

φ = the ``composer`` LoRA weights + this block's weights. The block holds ``k_max`` queries
and a run uses the first ``K``; the cold start samples ``K`` per batch so that every prefix
is trained ("nested queries"), which lets the validation search vary ``K`` without a new
cold start per trial.
"""

from __future__ import annotations

import torch
from torch import nn

from lopd.model.chat import pad_sequences


class QFormerBlock(nn.Module):
    def __init__(self, d: int, k_max: int, n_heads: int = 4, emb_rms: float = 1.0, gate_init: float = 0.0):
        super().__init__()
        n_heads = max(h for h in range(1, n_heads + 1) if d % h == 0)
        self.k_max = k_max
        self.queries = nn.Parameter(torch.randn(k_max, d) * 0.02)
        self.ln_q = nn.LayerNorm(d)
        self.ln_kv = nn.LayerNorm(d)
        self.cross = nn.MultiheadAttention(d, n_heads, batch_first=True)
        self.ln_s = nn.LayerNorm(d)
        self.self_attn = nn.MultiheadAttention(d, n_heads, batch_first=True)
        self.ln_m = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.ln_out = nn.LayerNorm(d)
        self.proj = nn.Linear(d, d)
        self.scale = nn.Parameter(torch.tensor(float(emb_rms)))
        # gate 0: fresh latents = 0, the teacher starts (almost) unchanged (module docstring)
        self.gate = nn.Parameter(torch.tensor(float(gate_init)))

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor, K: int) -> torch.Tensor:
        """hidden (n, S, d), mask (n, S) with 1 on real tokens → latents (n, K, d)."""
        if not 1 <= K <= self.k_max:
            raise ValueError(f"K={K} outside 1..{self.k_max} (the composer's k_max)")
        n = hidden.shape[0]
        q = self.queries[:K].unsqueeze(0).expand(n, K, -1)
        kv = self.ln_kv(hidden)
        q = q + self.cross(self.ln_q(q), kv, kv, key_padding_mask=mask == 0, need_weights=False)[0]
        s = self.ln_s(q)
        q = q + self.self_attn(s, s, s, need_weights=False)[0]
        q = q + self.mlp(self.ln_m(q))
        return self.gate * self.scale * self.proj(self.ln_out(q))


class Composer(nn.Module):
    """Encodes retrieved experiences with the backbone (``composer`` adapter) + the block."""

    def __init__(self, bb, k_max: int, gate_init: float = 0.0):
        super().__init__()
        with torch.no_grad():
            emb_rms = float(bb.model.get_input_embeddings().weight.float().pow(2).mean().sqrt())
        self.block = QFormerBlock(bb.hidden_size, k_max, emb_rms=emb_rms, gate_init=gate_init).to(bb.device)
        self.bb = bb

    def phi_params(self) -> list[nn.Parameter]:
        return list(self.block.parameters()) + self.bb.adapter_params("composer")

    def forward(self, experiences: list[list[list[int]]], K: int) -> torch.Tensor:
        """``experiences[i]`` = the n_ret token-id lists retrieved for task i → c_φ (N, n_ret·K, d)."""
        n_ret = self.n_ret(experiences)
        ids, mask = pad_sequences([x for e in experiences for x in e], self.bb.fmt.pad_id, self.bb.device)
        h = self.bb.hidden_states(ids, mask, role="composer")
        return self.compress(h, mask, n_ret, K)

    @staticmethod
    def n_ret(experiences: list[list[list[int]]]) -> int:
        n_ret = {len(e) for e in experiences}
        if len(n_ret) != 1:
            raise ValueError(f"every task needs the same number of experiences, got {sorted(n_ret)}")
        return n_ret.pop()

    def compress(self, h: torch.Tensor, mask: torch.Tensor, n_ret: int, K: int) -> torch.Tensor:
        """The block over the encoder's hidden states ``h`` (N·n_ret, S, d) of the experiences, task
        by task → c_φ (N, n_ret·K, d)."""
        z = self.block(h.to(self.block.queries.dtype), mask, K)  # (N·n_ret, K, d)
        return z.reshape(h.shape[0] // n_ret, n_ret * K, -1)

    def state(self) -> dict[str, torch.Tensor]:
        st = {f"block.{k}": v.detach().cpu().clone() for k, v in self.block.state_dict().items()}
        st.update({f"lora.{k}": v for k, v in self.bb.adapter_state("composer").items()})
        return st

    def load_state(self, st: dict[str, torch.Tensor]) -> None:
        block = {k[len("block."):]: v for k, v in st.items() if k.startswith("block.")}
        lora = {k[len("lora."):]: v for k, v in st.items() if k.startswith("lora.")}
        try:
            self.block.load_state_dict(block)
        except RuntimeError as e:
            from lopd.errors import BadInput

            raise BadInput(f"composer weights do not fit this model: {str(e).splitlines()[0]}") from None
        self.bb.load_adapter_state("composer", lora)
