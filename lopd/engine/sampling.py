"""Counter-based sampling: each row's random draws depend only on (its seed, the position).

A token is drawn by the Gumbel-max trick, ``argmax_v (logits_v / T + g_v)`` with
``g_v = -log(-log(u_v))``, which samples exactly from ``softmax(logits / T)``. The uniform
``u_v`` is not taken from a stateful generator but *computed* from the key
``(row seed, position, v)`` by a 32-bit integer hash (:func:`mix32`, absorbing one key word
per round). Hence the draw of a row at a position does not depend on which other rows share
the batch, in what order, or which of them already finished: this is what makes common
random numbers possible (the same task and sample index see the same random numbers in
every arm).

Every integer operation runs on int64 tensors holding values in ``[0, 2**32)``, and the
hash's multiplier is below ``2**27``, so no product reaches ``2**63``: nothing relies on
signed overflow, and CPU and GPU compute the same bits.
"""

from __future__ import annotations

import hashlib
import json

import torch

_M32 = 0xFFFFFFFF
_MUL = 0x045D9F3B  # T. Mueller's 32-bit integer hash multiplier (< 2**27)
_GOLDEN = 0x9E3779B9  # 2**32 / golden ratio: a fixed word folded into the vocabulary term
_ROUND = (0x243F6A88, 0x85A308D3, 0x13198A2E)  # digits of pi: a distinct constant per absorbed word
SEED_BITS = 63
_VOCAB_TERMS: dict[tuple[int, str], torch.Tensor] = {}


def mix32(h: torch.Tensor) -> torch.Tensor:
    """``x ← ((x >> 16) ^ x) · 0x45d9f3b mod 2**32`` twice, then ``x ← (x >> 16) ^ x``: a
    bijection of ``[0, 2**32)`` with good avalanche (T. Mueller's integer hash)."""
    h = ((h >> 16) ^ h).mul_(_MUL).bitwise_and_(_M32)  # in place on fresh tensors: same values, fewer buffers
    h = ((h >> 16) ^ h).mul_(_MUL).bitwise_and_(_M32)
    return (h >> 16).bitwise_xor_(h)


def _vocab_term(vocab_size: int, device: torch.device) -> torch.Tensor:
    key = (vocab_size, str(device))
    if key not in _VOCAB_TERMS:
        v = torch.arange(vocab_size, dtype=torch.long, device=device)
        _VOCAB_TERMS[key] = mix32(mix32(v) ^ _GOLDEN)
    return _VOCAB_TERMS[key]


def seed_states(seeds: torch.Tensor) -> torch.Tensor:
    """The hash state (B,) after absorbing each seed's two 32-bit words: the part of
    :func:`uniforms` that a row keeps for its whole rollout (computed once per row)."""
    seeds = seeds.to(torch.long)
    state = mix32((seeds & _M32) ^ _ROUND[0])
    return mix32(state ^ ((seeds >> 32) & _M32) ^ _ROUND[1])


def uniforms(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int, *,
             states: torch.Tensor | None = None) -> torch.Tensor:
    """``u[i, v]`` in ``(0, 1)`` (float64) = (hash(seeds[i], positions[i], v) + ½) / 2**32.

    ``seeds``: (B,) int64 in ``[0, 2**63)``; ``positions``: (B,) int64 in ``[0, 2**32)``.
    The row state absorbs the seed's two 32-bit words and the position, one hash round each;
    the vocabulary index enters through a precomputed hashed term. ``states``: the rows'
    :func:`seed_states` if already known (then ``seeds`` is not read).
    """
    state = seed_states(seeds) if states is None else states
    state = mix32(state ^ (positions.to(torch.long) & _M32) ^ _ROUND[2])  # (B,)
    h = mix32(state[:, None] ^ _vocab_term(vocab_size, state.device)[None, :])
    return h.to(torch.float64).add_(0.5).mul_(1.0 / 2.0**32)


def choose_tokens(logits: torch.Tensor, *, greedy: bool, temperature: float, seeds: torch.Tensor | None = None,
                  positions: torch.Tensor | None = None, states: torch.Tensor | None = None) -> torch.Tensor:
    """Next tokens (B,) from last-position logits (B, V): ``argmax`` if ``greedy``, else the
    Gumbel-max draw keyed by (seed, position) of each row (``states``: the seeds'
    :func:`seed_states`, to skip recomputing them)."""
    if greedy:
        return logits.argmax(-1)
    if temperature <= 0:
        raise ValueError(f"sampling temperature must be > 0 (got {temperature})")
    g = uniforms(seeds, positions, logits.shape[-1], states=states).log_().neg_().log_().neg_()  # −log(−log u)
    scaled = logits.to(torch.float64)
    if temperature != 1.0:  # x / 1 is x: skipping it changes no bit
        scaled = scaled / temperature
    return (scaled + g).argmax(-1)


def derive_seed(*parts: object) -> int:
    """A sampling seed in ``[0, 2**63)`` from a key, e.g. (evaluation seed, task_id, sample
    index); stable across processes and machines (BLAKE2b of the key's JSON)."""
    digest = hashlib.blake2b(json.dumps([str(p) for p in parts]).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> (64 - SEED_BITS)


def seeds_from_generator(n: int, generator: torch.Generator | None) -> list[int]:
    """``n`` row seeds drawn from ``generator`` (the caller's stream of randomness)."""
    return torch.randint(0, 2**SEED_BITS - 1, (n,), generator=generator).tolist()
