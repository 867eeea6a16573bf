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
grows with ``n_ret·K``; ``tests/integration/test_premise.py`` states and checks the tolerance. Why a gate and
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
the stand-in, ``lopd make-standin``; reproduced by ``tests/unit/test_path_check.py`` on a 28-layer
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

# The encoder pass runs the distinct experiences in at most this many length buckets, each padded to its own
# longest: more buckets pad less but pay a forward's fixed cost each (bench/roofline.py times the pass).
MAX_BUCKETS = 2


def length_buckets(lengths: list[int], max_buckets: int = MAX_BUCKETS) -> list[list[int]]:
    """Row indices grouped into at most ``max_buckets`` buckets, each padded to its longest row: of every
    split of the rows sorted by length into contiguous runs, the one with the fewest padded positions
    ``Σ_b |b| · max_len(b)`` (dynamic programming over the distinct lengths; ties: fewer buckets, then the
    earliest split). Buckets come shortest first; within one, rows keep their input order."""
    if not lengths:
        return []
    if max_buckets < 1:
        raise ValueError(f"max_buckets must be >= 1, got {max_buckets}")
    distinct = sorted(set(lengths))
    count = [sum(1 for n in lengths if n == v) for v in distinct]
    m = len(distinct)
    before = [0]
    for c in count:
        before.append(before[-1] + c)
    # cost[b][j]: fewest padded positions covering the j shortest distinct lengths with b buckets
    inf = float("inf")
    cost = [[inf] * (m + 1) for _ in range(max_buckets + 1)]
    cut = [[0] * (m + 1) for _ in range(max_buckets + 1)]
    cost[0][0] = 0
    for b in range(1, max_buckets + 1):
        for j in range(1, m + 1):
            for i in range(j):  # the last bucket holds distinct lengths i..j-1, padded to distinct[j-1]
                c = cost[b - 1][i] + (before[j] - before[i]) * distinct[j - 1]
                if c < cost[b][j]:
                    cost[b][j], cut[b][j] = c, i
    best = min(range(1, max_buckets + 1), key=lambda b: (cost[b][m], b))
    bounds, j = [], m
    for b in range(best, 0, -1):
        bounds.append((cut[b][j], j))
        j = cut[b][j]
    out = []
    for i, j in reversed(bounds):
        lo, hi = distinct[i], distinct[j - 1]
        rows = [r for r, n in enumerate(lengths) if lo <= n <= hi]
        if rows:
            out.append(rows)
    return out


def distinct_rows(seqs: list[list[int]], owner: list[int] | None = None) -> tuple[list[int], list[int]]:
    """The first occurrence of each distinct ``(owner, token ids)`` row, in input order, and for every row the
    position of its distinct row in that list (``inverse``): ``seqs[i] == seqs[first[inverse[i]]]``. Two
    members' copies of one experience are distinct rows (each member encodes with its own adapter)."""
    seen: dict[tuple, int] = {}
    first, inverse = [], []
    for i, s in enumerate(seqs):
        key = (owner[i] if owner is not None else 0, tuple(s))
        if key not in seen:
            seen[key] = len(first)
            first.append(i)
        inverse.append(seen[key])
    return first, inverse


def encode_distinct(bb, seqs: list[list[int]], owner: list[int] | None = None, n_members: int = 0):
    """The composer encoder's last hidden states of the *distinct* rows of ``seqs``, packed by length.

    Returns ``(h, mask, inverse)``: ``h`` (n_distinct, S, d) and ``mask`` (n_distinct, S) with 1 on real
    tokens, S the longest row, the distinct rows in order of first occurrence (:func:`distinct_rows`), and
    ``inverse`` (len(seqs),) mapping each input row to its distinct row. Each experience is encoded once per
    call, and in :func:`length_buckets` rather than padded to the longest: the encoder is causal and the
    padding is on the right, so a row's real positions do not see how far it was padded; the positions
    past a row's length hold 0 here and are masked wherever they are read. ``owner``: the member whose
    ``composer`` adapter encodes each row (a population, :meth:`lopd.model.backbone.Backbone.member_rows`)."""
    first, inverse = distinct_rows(seqs, owner)
    rows = [seqs[i] for i in first]
    S = max(len(r) for r in rows)
    parts, masks, order = [], [], []
    for bucket in length_buckets([len(r) for r in rows]):
        ids, mask = pad_sequences([rows[j] for j in bucket], bb.fmt.pad_id, bb.device)
        if owner is None:
            h = bb.hidden_states(ids, mask, role="composer")
        else:
            who = torch.tensor([owner[first[j]] for j in bucket], dtype=torch.long)
            with bb.member_rows("composer", who, n_members, segments=True):  # rows come member by member
                h = bb.hidden_states(ids, mask, role="composer")
        parts.append(nn.functional.pad(h, (0, 0, 0, S - h.shape[1])))
        masks.append(nn.functional.pad(mask, (0, S - mask.shape[1])))
        order += bucket
    h, mask = torch.cat(parts), torch.cat(masks)
    if order != sorted(order):  # back to the order of first occurrence
        back = torch.empty(len(order), dtype=torch.long)
        back[torch.tensor(order)] = torch.arange(len(order))
        back = back.to(h.device)
        h, mask = h.index_select(0, back), mask.index_select(0, back)
    return h, mask, torch.tensor(inverse, dtype=torch.long, device=h.device)


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
        h, mask, inverse = encode_distinct(self.bb, [x for e in experiences for x in e])
        return self.compress(h, mask, n_ret, K, inverse)

    @staticmethod
    def n_ret(experiences: list[list[list[int]]]) -> int:
        n_ret = {len(e) for e in experiences}
        if len(n_ret) != 1:
            raise ValueError(f"every task needs the same number of experiences, got {sorted(n_ret)}")
        return n_ret.pop()

    def compress(self, h: torch.Tensor, mask: torch.Tensor, n_ret: int, K: int,
                 inverse: torch.Tensor | None = None) -> torch.Tensor:
        """The block over the encoder's hidden states ``h`` of the experiences → c_φ (N, n_ret·K, d).

        Without ``inverse``, ``h`` is (N·n_ret, S, d), task by task. With it, ``h`` holds distinct
        experiences (:func:`encode_distinct`) and row ``i`` of the N·n_ret is distinct row ``inverse[i]``:
        the block runs once per distinct experience (its latents depend on that experience alone)."""
        z = self.block(h.to(self.block.queries.dtype), mask, K)  # (rows of h, K, d)
        if inverse is not None:
            # index_select, not z[inverse]: the backward of advanced indexing with repeated indices
            # accumulates with CPU atomics in a different order every run (a repro that is not
            # reproducible); index_select's backward (index_add_) adds the rows in index order
            z = z.index_select(0, inverse)
        return z.reshape(z.shape[0] // n_ret, n_ret * K, -1)

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
