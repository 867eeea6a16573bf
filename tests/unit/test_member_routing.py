"""The member-routed LoRA's per-member path (``segments``, :mod:`lopd.model.members`): rows that come
member by member in unequal runs go each through its own member's factors only. It must give what the
mask path and each member alone give, send each member's gradient to that member only, and be taken
only when the caller allows it and the rows are in member order.

The composer's packed pass (:func:`lopd.model.composer.encode_distinct`) gathers a distinct experience
back to every task that retrieved it; the gather's backward must be deterministic run to run (the
indexing ``z[inverse]`` it replaced accumulated with CPU atomics: 29 different gradients in 30 runs)."""

from __future__ import annotations

import torch

from lopd.model.composer import Composer
from tests.unit.test_composer_packing import _tiny_backbone


def _members(n: int):
    bb, vocab = _tiny_backbone()
    views = bb.member_views(n)
    torch.manual_seed(3)
    for name, p in bb.model.named_parameters():
        if "lora_" in name and "composer_m" in name:
            with torch.no_grad():
                p.normal_(std=0.1)  # B starts at 0: give every member's adapter a nonzero, distinct output
    return bb, views, vocab


def _ids(vocab: int, rows: int, width: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    return torch.randint(3, vocab, (rows, width), generator=gen), torch.ones(rows, width, dtype=torch.long)


def test_segments_equal_the_mask_path_and_each_member_alone():
    bb, views, vocab = _members(3)
    owner = torch.tensor([0, 0, 0, 1, 2, 2])  # member order, unequal runs: not the equal-blocks path
    ids, attn = _ids(vocab, len(owner))
    with bb.member_rows("composer", owner, 3, segments=True) as routing:
        assert routing.segments == [3, 1, 2] and routing.mask is None and routing.blocks is None
        seg = bb.hidden_states(ids, attn, role="composer")
    with bb.member_rows("composer", owner, 3) as routing:
        assert routing.mask is not None and routing.segments is None, "segments are taken only when asked for"
        masked = bb.hidden_states(ids, attn, role="composer")
    alone = torch.cat([views[int(m)].hidden_states(ids[i:i + 1], attn[i:i + 1], role="composer")
                       for i, m in enumerate(owner)])
    assert float((alone[:3] - alone[3]).abs().max()) > 1e-3, "the members' adapters agree: the test is vacuous"
    assert torch.allclose(seg, masked, atol=1e-5, rtol=0), float((seg - masked).abs().max())
    assert torch.allclose(seg, alone, atol=1e-5, rtol=0), float((seg - alone).abs().max())


def test_segments_are_refused_for_rows_out_of_member_order():
    bb, _, vocab = _members(3)
    with bb.member_rows("composer", torch.tensor([0, 2, 1, 1]), 3, segments=True) as routing:
        assert routing.segments is None and routing.mask is not None


def test_a_members_rows_send_gradient_to_that_member_only():
    bb, _, vocab = _members(3)
    owner = torch.tensor([0, 1, 1, 1, 2])
    ids, attn = _ids(vocab, len(owner))
    for p in bb.model.parameters():
        p.grad = None
    with bb.member_rows("composer", owner, 3, segments=True):
        h = bb.hidden_states(ids, attn, role="composer")
    h[1:4].sum().backward()  # member 1's rows only
    grads = {m: [p.grad for n, p in bb.model.named_parameters() if f"composer_m{m}" in n] for m in range(3)}
    assert any(g is not None and float(g.abs().max()) > 0 for g in grads[1])
    for m in (0, 2):
        assert all(g is None or float(g.abs().max()) == 0 for g in grads[m]), f"member {m} got member 1's gradient"


def test_the_packed_composers_gradient_is_the_same_every_run():
    bb, vocab = _tiny_backbone()
    comp = Composer(bb, k_max=4, gate_init=0.5)
    gen = torch.Generator().manual_seed(2)
    pool = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (4, 6, 9, 12, 5, 7, 8, 3)]
    # 512 tasks × n_ret 3 from 8 experiences: each distinct experience's latents reach ~190 rows, and the
    # gather's gradient (1536 × 4 × 32 values) is large enough for the kernels to split it across threads
    pick = torch.randint(0, 8, (512, 3), generator=gen).tolist()
    experiences = [[pool[i] for i in row] for row in pick]
    phi = comp.phi_params()
    for p in phi:
        p.requires_grad_(True)
    weight = torch.randn(512, 12, 32, generator=gen)
    digests = set()
    for _ in range(12):
        for p in phi:
            p.grad = None
        (comp(experiences, 4) * weight).sum().backward()
        digests.add(b"".join(p.grad.numpy().tobytes() for p in phi if p.grad is not None))
    assert len(digests) == 1, f"{len(digests)} different gradients in 12 identical backward passes"
