"""The composer encodes each distinct retrieved experience once, packed in length buckets
(:func:`lopd.model.composer.encode_distinct`), and that is the padded pass it replaced: latents and
φ's gradients agree to 1e-5 (the buckets' shapes sum in another order, so not bitwise)."""

from __future__ import annotations

import pytest
import torch

from lopd.model.composer import Composer, distinct_rows, length_buckets


def test_length_buckets_by_hand():
    lengths = [3, 10, 3, 7, 10, 2]
    # distinct lengths 2, 3, 7, 10 with counts 1, 2, 1, 2; two buckets: {2,3} | {7,10} pads 3·3 + 3·10 = 39
    # positions, {2,3,7} | {10} 4·7 + 2·10 = 48, {2} | {3,7,10} 1·2 + 5·10 = 52
    assert length_buckets(lengths, 2) == [[0, 2, 5], [1, 3, 4]]
    assert length_buckets(lengths, 1) == [[0, 1, 2, 3, 4, 5]]
    assert length_buckets(lengths, 4) == [[5], [0, 2], [3], [1, 4]]
    assert length_buckets(lengths, 9) == [[5], [0, 2], [3], [1, 4]]  # never more buckets than lengths
    assert length_buckets([5, 5, 5], 4) == [[0, 1, 2]]
    assert length_buckets([], 4) == []
    with pytest.raises(ValueError, match="max_buckets"):
        length_buckets([1], 0)


def test_distinct_rows_by_hand():
    seqs = [[1, 2], [3], [1, 2], [3], [4]]
    assert distinct_rows(seqs) == ([0, 1, 4], [0, 1, 0, 1, 2])
    # the same experience under two members is two rows: each member encodes with its own adapter
    assert distinct_rows(seqs, owner=[0, 0, 0, 1, 1]) == ([0, 1, 3, 4], [0, 1, 0, 2, 3])


def _tiny_backbone():
    from lopd.model.backbone import Backbone, build_tiny_model
    from lopd.model.tokenizer import build_tokenizer, env_vocabulary
    from tests.conftest import default_params

    mp = default_params({"model": dict(arch="qwen3", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                                       intermediate_size=64, device="cpu", dtype="float32")}).model
    tok = build_tokenizer(env_vocabulary(["tool", "code"]))
    bb = Backbone(build_tiny_model(mp, tok, seed=0), tok, mp, arch="qwen3")
    torch.manual_seed(0)
    for p in bb.adapter_params("composer"):
        torch.nn.init.normal_(p, std=0.1)  # B starts at 0: give the adapter a gradient path through A too
    return bb, len(tok)


def _padded_reference(comp: Composer, experiences, K: int) -> torch.Tensor:
    """The pass before packing: every row (duplicates too) padded to the longest, then the block."""
    from lopd.model.chat import pad_sequences

    n_ret = comp.n_ret(experiences)
    ids, mask = pad_sequences([x for e in experiences for x in e], comp.bb.fmt.pad_id, comp.bb.device)
    h = comp.bb.hidden_states(ids, mask, role="composer")
    z = comp.block(h, mask, K)
    return z.reshape(len(experiences), n_ret * K, -1)


def test_a_distinct_packed_composer_pass_equals_the_padded_one():
    bb, vocab = _tiny_backbone()
    comp = Composer(bb, k_max=4, gate_init=0.5)  # gate ≠ 0: the latents are not all zero
    gen = torch.Generator().manual_seed(1)
    pool = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (3, 5, 9, 17, 30, 31)]
    # 6 tasks × n_ret 3 from a pool of 6 experiences: repeats within and across tasks, widths 3..31
    pick = [[0, 5, 2], [5, 1, 1], [3, 4, 0], [2, 2, 5], [4, 3, 1], [0, 1, 2]]
    experiences = [[pool[i] for i in row] for row in pick]
    phi = comp.phi_params()
    for p in phi:
        p.requires_grad_(True)
    weight = torch.linspace(-1, 1, 6 * 3 * 4 * 32).reshape(6, 12, 32)
    out = []
    for run in (lambda: comp(experiences, 4), lambda: _padded_reference(comp, experiences, 4)):
        for p in phi:
            p.grad = None
        c = run()
        (c * weight).sum().backward()
        out.append((c.detach(), [p.grad.clone() for p in phi]))
    (packed, g_packed), (padded, g_padded) = out
    assert packed.shape == padded.shape == (6, 12, 32)
    assert float(padded.abs().max()) > 1e-3, "the latents are zero: the comparison is vacuous"
    assert torch.allclose(packed, padded, atol=1e-5, rtol=0), float((packed - padded).abs().max())
    moved = [g for g in g_padded if float(g.abs().max()) > 0]
    assert len(moved) >= len(g_padded) // 2, "most of φ got no gradient: the comparison is vacuous"
    for a, b in zip(g_packed, g_padded):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), float((a - b).abs().max())
