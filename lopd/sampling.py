"""Counter-based sampling: each row's random draws depend only on (its seed, the position).

A token is drawn by the Gumbel-max trick, ``argmax_v (logits_v / T + g_v)`` with
``g_v = -log(-log(u_v))``, which samples exactly from ``softmax(logits / T)``. The uniform
``u_v`` is not taken from a stateful generator but *computed* from the key
``(row seed, position, v)`` by a 32-bit integer hash (murmur3's finaliser, applied as a
sponge over the key words). Hence the draw of a row at a position does not depend on
which other rows share the batch, in what order, or which of them already finished: this
is what makes common random numbers possible (the same task and sample index see the same
random numbers in every arm).

Every integer operation runs on int64 tensors holding values in ``[0, 2**32)``; the only
multiplication, ``(a * c) mod 2**32``, is split into 16-bit halves of ``c`` so no product
reaches ``2**63`` (no reliance on signed overflow).
"""

from __future__ import annotations

import hashlib
import json

import torch

_M32 = 0xFFFFFFFF
_C1, _C2 = 0x85EBCA6B, 0xC2B2AE35  # murmur3 fmix32 constants
_GOLDEN = 0x9E3779B1  # 2**32 / golden ratio: spreads consecutive counters
SEED_BITS = 63


def _mul32(a: torch.Tensor, c: int) -> torch.Tensor:
    """``(a * c) mod 2**32`` for ``a`` in ``[0, 2**32)`` and a constant ``c < 2**32``."""
    lo, hi = c & 0xFFFF, c >> 16
    return (a * lo + (((a * hi) & 0xFFFF) << 16)) & _M32


def fmix32(h: torch.Tensor) -> torch.Tensor:
    """murmur3's 32-bit finaliser: a bijection of ``[0, 2**32)`` with full avalanche."""
    h = h ^ (h >> 16)
    h = _mul32(h, _C1)
    h = h ^ (h >> 13)
    h = _mul32(h, _C2)
    return h ^ (h >> 16)


def uniforms(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``u[i, v]`` in ``(0, 1)`` (float64) = hash(seeds[i], positions[i], v) / 2**32.

    ``seeds``: (B,) int64 in ``[0, 2**63)``; ``positions``: (B,) int64 ≥ 0.
    """
    seeds = seeds.to(torch.long)
    state = fmix32(seeds & _M32)
    state = fmix32(state ^ ((seeds >> 32) & _M32))
    state = fmix32(state ^ _mul32(positions.to(torch.long) & _M32, _GOLDEN))  # (B,)
    v = torch.arange(vocab_size, device=seeds.device, dtype=torch.long)
    h = fmix32(state[:, None] ^ _mul32(v, _GOLDEN)[None, :])
    h = fmix32(h ^ fmix32(state ^ _C2)[:, None])
    return (h.to(torch.float64) + 0.5) / 2.0**32


def choose_tokens(logits: torch.Tensor, *, greedy: bool, temperature: float, seeds: torch.Tensor | None = None,
                  positions: torch.Tensor | None = None) -> torch.Tensor:
    """Next tokens (B,) from last-position logits (B, V): ``argmax`` if ``greedy``, else the
    Gumbel-max draw keyed by (seed, position) of each row."""
    if greedy:
        return logits.argmax(-1)
    if temperature <= 0:
        raise ValueError(f"sampling temperature must be > 0 (got {temperature})")
    g = -torch.log(-torch.log(uniforms(seeds, positions, logits.shape[-1])))
    return (logits.to(torch.float64) / temperature + g).argmax(-1)


def derive_seed(*parts: object) -> int:
    """A sampling seed in ``[0, 2**63)`` from a key, e.g. (evaluation seed, task_id, sample
    index); stable across processes and machines (BLAKE2b of the key's JSON)."""
    digest = hashlib.blake2b(json.dumps([str(p) for p in parts]).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> (64 - SEED_BITS)


def seeds_from_generator(n: int, generator: torch.Generator | None) -> list[int]:
    """``n`` row seeds drawn from ``generator`` (the caller's stream of randomness)."""
    return torch.randint(0, 2**SEED_BITS - 1, (n,), generator=generator).tolist()
