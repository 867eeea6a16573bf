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
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache


class RaggedKVCache(Cache):
    def __init__(self, n_rows: int, capacity: int, device: torch.device):
        super().__init__(layers=[])
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
