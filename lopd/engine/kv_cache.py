"""A ragged key/value cache for batched multi-turn decoding.

Each row of the batch keeps its own length: row ``i``'s keys and values for positions
``0..len_i-1`` sit contiguously at slots ``1..len_i`` of a preallocated buffer
``(rows, kv_heads, 1 + capacity, head_dim)`` per layer. Slot 0 is a scratch slot: the
padding columns of a chunk are written there and only padding queries ever read it, so
padding never lands among a row's real entries and the cache has no holes.

One forward feeds every row a *chunk* of new tokens (its prompt, or the token it just
sampled followed by the environment's observation), left-padded to a common width ``L``.
:meth:`RaggedKVCache.plan` returns, for that chunk, the position ids and the 4-D boolean
attention mask ``(rows, 1, L, W)`` (``W = 1 + max_i(len_i + n_i)``): a real query of row ``i``
at position ``p`` sees exactly slots ``1..p+1`` — its row's positions ``0..p``. Hugging
Face models take a 4-D mask as given, call :meth:`update` once per layer (which scatters
the chunk into the buffer and returns the first ``W`` slots), and :meth:`commit` then
advances the lengths. :meth:`keep` drops the rows of finished sequences.

:meth:`packed` serves the lean forward (:class:`~lopd.engine.fast_decoder.FastDecoder`) without
padding: the chunks' real tokens are packed into one sequence of ``N = Σ n_i`` tokens (so
linear maps, norms and rotary see no padding columns, which at a step where one row
prefills an observation would otherwise multiply the work of all rows). Attention runs in
two groups: every row's *last* new token (one query per row, over the row's cache) and the
*other* new tokens of the rows that feed several (a padded query block over those rows only).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from lopd.compat.transformers import Cache, empty_cache_layers


@dataclass
class PackedPlan:
    """Index tensors of one packed forward (see :meth:`RaggedKVCache.packed`). ``N`` packed
    tokens in row order; ``B`` rows; ``P`` rows feeding more than one token, ``E`` = the most
    non-last tokens of such a row; ``W`` key slots."""

    pos: torch.Tensor  # (N,) position id of each packed token
    dest: torch.Tensor  # (N·kv_heads,) row of each token's head in a layer's cache viewed as (rows·heads·slots, dim)
    last: torch.Tensor  # (B,) packed index of each row's last token
    last_mask: torch.Tensor  # (B, 1, 1, W): a row's last token sees its row's slots 1..p+1
    ext_rows: torch.Tensor | None  # (P,) rows with non-last tokens; None at a pure decoding step
    ext_idx: torch.Tensor | None  # (P, E) packed index of each non-last token (padding repeats a real one)
    ext_mask: torch.Tensor | None  # (P, 1, E, W)
    ext_take: torch.Tensor | None  # (M,) real entries of the flattened (P·E) block ...
    ext_dest: torch.Tensor | None  # (M,) ... and their packed indices
    width: int


class RaggedKVCache(Cache):
    def __init__(self, n_rows: int, capacity: int, device: torch.device):
        super().__init__(**empty_cache_layers())
        self.capacity = capacity
        self.device = device
        self.lengths = torch.zeros(n_rows, dtype=torch.long, device=device)  # tokens cached per row
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._slots: torch.Tensor | None = None  # (rows, L) slot of each chunk column
        self._rows: torch.Tensor | None = None  # (rows, L) row index of each chunk column
        self._n_new: torch.Tensor | None = None
        self._width = 0

    @property
    def n_rows(self) -> int:
        return int(self.lengths.shape[0])

    def plan(self, n_new: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Position ids ``(rows, L)`` and attention mask ``(rows, 1, L, W)`` for a chunk of
        ``width`` columns of which the last ``n_new[i] >= 1`` are row ``i``'s real tokens."""
        n_new = n_new.to(self.device)
        if bool((self.lengths + n_new > self.capacity).any()):
            raise ValueError(f"ragged cache capacity {self.capacity} exceeded")
        col = torch.arange(width, device=self.device)
        offset = col - (width - n_new)[:, None]  # index of the column within its row's real tokens
        real = offset >= 0
        pos = torch.where(real, self.lengths[:, None] + offset, torch.zeros_like(offset))
        slots = torch.where(real, pos + 1, torch.zeros_like(pos))
        w = 1 + int((self.lengths + n_new).max())
        key = torch.arange(w, device=self.device)
        # real query at position p: slots 1..p+1; padding query: the scratch slot only (keeps it finite)
        mask = torch.where(real[:, :, None], (key >= 1) & (key <= slots[:, :, None]), key == 0)
        self._slots, self._n_new, self._width = slots, n_new, w
        self._rows = torch.arange(self.n_rows, device=self.device)[:, None].expand_as(slots)
        return pos, mask[:, None]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Scatter the chunk's keys/values ``(rows, heads, L, dim)`` into the buffer; return the
        first ``W`` slots of every row."""
        if self._slots is None:
            raise RuntimeError("RaggedKVCache.plan must be called before the forward pass")
        if layer_idx == len(self.keys):
            shape = (self.n_rows, key_states.shape[1], 1 + self.capacity, key_states.shape[-1])
            self.keys.append(torch.zeros(shape, dtype=key_states.dtype, device=self.device))
            self.values.append(torch.zeros(shape[:-1] + (value_states.shape[-1],), dtype=value_states.dtype,
                                           device=self.device))
        k, v = self.keys[layer_idx], self.values[layer_idx]
        k[self._rows, :, self._slots] = key_states.transpose(1, 2).to(k.dtype)
        v[self._rows, :, self._slots] = value_states.transpose(1, 2).to(v.dtype)
        return k[:, :, : self._width], v[:, :, : self._width]

    def commit(self) -> None:
        """The forward pass is over: the chunk's tokens are now cached."""
        self.lengths = self.lengths + self._n_new
        self._slots, self._n_new = None, None

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in this order); the others' entries are dropped."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        self.lengths = self.lengths.index_select(0, idx)
        self.keys = [k.index_select(0, idx) for k in self.keys]
        self.values = [v.index_select(0, idx) for v in self.values]

    def packed(self, n_new: list[int], kv_heads: int) -> PackedPlan:
        """The plan of a packed forward feeding row ``i`` its next ``n_new[i] >= 1`` tokens."""
        lengths = self.lengths.tolist()
        ends_at = [c + n for c, n in zip(lengths, n_new)]  # = slot of each row's last token
        if max(ends_at) > self.capacity:
            raise ValueError(f"ragged cache capacity {self.capacity} exceeded")
        dev, slots, n_rows = self.device, 1 + self.capacity, len(n_new)
        n_t = torch.tensor(n_new, device=dev)
        rows = torch.arange(n_rows, device=dev)
        if max(n_new) == 1:  # a pure decoding step: token i is row i's
            pos, last = self.lengths, rows
        else:
            last = n_t.cumsum(0) - 1
            rows = torch.repeat_interleave(rows, n_t)
            pos = self.lengths[rows] + torch.arange(len(rows), device=dev) - (last - n_t + 1)[rows]
        heads = torch.arange(kv_heads, device=dev)
        width = 1 + max(ends_at)
        key = torch.arange(width, device=dev)
        last_slot = torch.tensor(ends_at, device=dev)
        plan = PackedPlan(pos=pos, dest=((rows[:, None] * kv_heads + heads) * slots + pos[:, None] + 1).reshape(-1),
                          last=last, last_mask=((key >= 1) & (key <= last_slot[:, None]))[:, None, None],
                          ext_rows=None, ext_idx=None, ext_mask=None, ext_take=None, ext_dest=None, width=width)
        if max(n_new) > 1:
            self._plan_others(plan, n_new, key)
        self._n_new = n_t
        return plan

    def _plan_others(self, plan: PackedPlan, n_new: list[int], key: torch.Tensor) -> None:
        """Fill ``plan.ext_*``: the non-last tokens of the rows that feed several, as a padded
        block (a short row repeats its last such token; the copies' outputs are dropped)."""
        ext = [i for i, n in enumerate(n_new) if n > 1]
        last = plan.last.tolist()
        e = max(n_new[i] for i in ext) - 1
        idx = torch.tensor([[last[i] - n_new[i] + 1 + min(j, n_new[i] - 2) for j in range(e)] for i in ext],
                           device=self.device)
        plan.ext_rows, plan.ext_idx = torch.tensor(ext, device=self.device), idx
        plan.ext_mask = ((key >= 1) & (key <= plan.pos[idx][:, :, None] + 1))[:, None]
        plan.ext_take = torch.tensor([k * e + j for k, i in enumerate(ext) for j in range(n_new[i] - 1)],
                                     device=self.device)
        plan.ext_dest = idx.reshape(-1)[plan.ext_take]

    def write(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, plan: PackedPlan):
        """Store a packed chunk's keys/values ``(N, heads, dim)`` of layer ``layer_idx``."""
        if layer_idx == len(self.keys):
            shape = (self.n_rows, key_states.shape[1], 1 + self.capacity, key_states.shape[-1])
            self.keys.append(torch.zeros(shape, dtype=key_states.dtype, device=self.device))
            self.values.append(torch.zeros(shape[:-1] + (value_states.shape[-1],), dtype=value_states.dtype,
                                           device=self.device))
        for buf, new in ((self.keys[layer_idx], key_states), (self.values[layer_idx], value_states)):
            buf.view(-1, buf.shape[-1]).index_copy_(0, plan.dest, new.reshape(-1, new.shape[-1]).to(buf.dtype))
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self.lengths.max()) if self.n_rows else 0

    def __len__(self) -> int:
        return len(self.keys)


def full_sequence_plan(n_new: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Position ids and 4-D mask for a forward pass *without* a cache over left-padded whole
    sequences (row ``i``'s ``n_new[i]`` tokens in the last columns): causal within a row's real
    tokens; a padding query sees only itself (keeps it finite)."""
    col = torch.arange(width, device=n_new.device)
    offset = col - (width - n_new)[:, None]
    real = offset >= 0
    pos = offset.clamp(min=0)
    causal = col[None, :, None] >= col[None, None, :]  # (1, q, k): k <= q
    mask = torch.where(real[:, :, None], causal & real[:, None, :], col[None, :, None] == col[None, None, :])
    return pos, mask[:, None]
