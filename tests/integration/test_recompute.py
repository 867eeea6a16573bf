"""Activation checkpointing of a KD step's context passes (``train.recompute_context_passes``).

Recomputing the composer's and the teacher's decoder layers in backward must give the same
training run as keeping their activations: the replay runs the same kernels on the same inputs,
under the role (LoRA branch) the forward ran with, although backward runs after the trainer moved
on to other roles. A replay under the wrong role, or no replay at all, fails these tests.
"""

from __future__ import annotations

import pytest
import torch

from lopd.arms import ARMS
from lopd.model import backbone as backbone_mod
from lopd.training.trainer import HParams, Trainer


def _run(resources, workspace, arm: str, recompute: bool, steps: int = 2):
    hp = HParams.from_params(workspace.params(), steps=steps, val_every=100, margin=0.5,
                             recompute_context_passes=recompute)
    tr = Trainer(resources, ARMS[arm], hp, seed=3)
    tr.prepare(resources.train_tasks)
    rows = [tr.train_step() for _ in range(steps)]
    bb = resources.bb
    state = {"student": [p.detach().clone() for p in bb.adapter_params("student")],
             "composer": [p.detach().clone() for p in bb.adapter_params("composer")],
             "block": [p.detach().clone() for p in tr.composer.block.parameters()] if tr.composer else []}
    return rows, state


@pytest.mark.parametrize("arm", ["lopd", "lopd_frozen"])
def test_recomputed_context_passes_train_the_same_run(resources, workspace, arm):
    rows_keep, keep = _run(resources, workspace, arm, recompute=False)
    rows_re, re = _run(resources, workspace, arm, recompute=True)
    for a, b in zip(rows_keep, rows_re):
        for k in ("loss", "kd_loss", "delta_phi", "beta"):
            if k in a:
                assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-7, nan_ok=True), k
    for name in keep:
        for x, y in zip(keep[name], re[name]):
            torch.testing.assert_close(y, x, rtol=1e-5, atol=1e-7, msg=f"{arm}: {name} differs under recompute")
    # the composer and the query block did move in the lopd arm: the comparison is not between two no-ops
    if arm == "lopd":
        tr0 = Trainer(resources, ARMS[arm], HParams.from_params(workspace.params(), steps=1), seed=3)
        assert any(not torch.equal(p0.detach(), p1) for p0, p1 in zip(tr0.composer.block.parameters(), keep["block"]))


def test_recompute_replays_each_layer_with_gradients_only(resources):
    """Inside the context a decoder layer run with gradients runs twice (its forward, then the replay
    in backward), one run without gradients once; on exit the layer's own forward is back."""
    bb = resources.bb
    blocks = backbone_mod._decoder_layers(bb.model)
    assert blocks, "the tiny model's decoder layers were not found"
    calls = {"n": 0}

    def counting(forward):
        def f(*args, **kwargs):
            calls["n"] += 1
            return forward(*args, **kwargs)
        return f

    ids = torch.tensor([[2, 3, 10, 11, 6, 4]])
    attn = torch.ones_like(ids)
    for b in blocks:
        b.forward = counting(b.forward)
    with bb.recompute_in_backward(True):
        bb.logits(ids, attn, "composer").sum().backward()
    assert calls["n"] == 2 * len(blocks), "each layer: one forward and one replay"
    assert all(vars(b)["forward"].__name__ == "f" for b in blocks), "a forward patched before must be restored"
    calls["n"] = 0
    with bb.recompute_in_backward(True), torch.no_grad():
        bb.logits(ids, attn, "composer")
    assert calls["n"] == len(blocks), "a pass without gradients runs once"
    for b in blocks:
        del b.forward
    with bb.recompute_in_backward(True):
        pass
    assert all("forward" not in vars(b) for b in blocks), "the per-instance wrapper must be removed on exit"


def test_a_population_with_recomputed_context_passes_trains_the_same_runs(resources, workspace):
    """In a population the replay must also route each row through its member's adapters as the
    forward did (backward runs after the routing is off): without that, the members' composer LoRA
    gets no gradient under recompute and this test fails."""
    from lopd.population.trainer import Member, Population

    def run(recompute: bool):
        hp = HParams.from_params(workspace.params(), steps=2, val_every=100, margin=0.5,
                                 recompute_context_passes=recompute)
        pop = Population(resources, ARMS["lopd"], [Member(hp, s) for s in (0, 3)])
        for tr in pop.trainers:
            tr.prepare(resources.train_tasks)
        init = [[p.detach().clone() for p in tr.bb.adapter_params("composer")] for tr in pop.trainers]
        rows = [pop.train_step() for _ in range(2)]
        state = [[p.detach().clone() for p in tr.bb.adapter_params("student") + tr.composer.phi_params()]
                 for tr in pop.trainers]
        moved = [any(not torch.equal(a, p.detach()) for a, p in zip(i, tr.bb.adapter_params("composer")))
                 for i, tr in zip(init, pop.trainers)]
        return rows, state, moved

    rows_keep, keep, moved = run(False)
    rows_re, re, _ = run(True)
    assert all(moved), "a member's composer LoRA did not move: the comparison would not test the replay"
    for step_keep, step_re in zip(rows_keep, rows_re):
        for a, b in zip(step_keep, step_re):
            for k in ("loss", "kd_loss", "delta_phi", "beta"):
                assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-7, nan_ok=True), k
    for m, (xs, ys) in enumerate(zip(keep, re)):
        for x, y in zip(xs, ys):
            torch.testing.assert_close(y, x, rtol=1e-5, atol=1e-7, msg=f"member {m} differs under recompute")
