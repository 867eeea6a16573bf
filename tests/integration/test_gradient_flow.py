"""Gradient routing of one LOPD step on the shared backbone (DESIGN §2).

After one step: base weights and the teacher path unchanged; the ``student`` LoRA moved;
the ``composer`` LoRA and the query block moved; with the ``lopd_frozen`` switches the
composer does not move; the margin term's gradient reaches φ and not θ.
"""

from __future__ import annotations

import torch

from lopd.training import objectives as obj
from lopd.arms import ARMS
from lopd.training.trainer import HParams, Trainer


def _snap(params):
    return [p.detach().clone() for p in params]


def _moved(before, params):
    return any(not torch.equal(b, p.detach()) for b, p in zip(before, params))


def _trainer(resources, arm, workspace, **over):
    params = workspace.params()
    hp = HParams.from_params(params, **{"steps": 1, "val_every": 100, "margin": 0.5, **over})
    return Trainer(resources, ARMS[arm], hp, seed=0)


def test_one_lopd_step_routes_gradients(resources, workspace):
    tr = _trainer(resources, "lopd", workspace)
    tr.prepare(resources.train_tasks)
    bb = resources.bb
    base = _snap(bb.base_params())
    student = _snap(bb.adapter_params("student"))
    comp_lora = _snap(bb.adapter_params("composer"))
    block = _snap(list(tr.composer.block.parameters()))
    # teacher logits on a fixed input before the step
    ids = torch.tensor([[2, 3, 10, 11, 6, 4]])
    attn = torch.ones_like(ids)
    with torch.no_grad():
        t_before = bb.teacher_logits(None, None, ids, attn).clone()
    tr.train_step()
    assert not _moved(base, bb.base_params()), "base weights must never change"
    with torch.no_grad():
        t_after = bb.teacher_logits(None, None, ids, attn)
    assert torch.equal(t_before, t_after), "the teacher path (adapters disabled) must be unchanged"
    assert _moved(student, bb.adapter_params("student")), "the student LoRA must move"
    assert _moved(comp_lora, bb.adapter_params("composer")), "the composer LoRA must move"
    assert _moved(block, list(tr.composer.block.parameters())), "the query block must move"


def test_frozen_composer_does_not_move(resources, workspace):
    tr = _trainer(resources, "lopd_frozen", workspace)
    tr.prepare(resources.train_tasks)
    bb = resources.bb
    comp_lora = _snap(bb.adapter_params("composer"))
    block = _snap(list(tr.composer.block.parameters()))
    student = _snap(bb.adapter_params("student"))
    tr.train_step()
    assert not _moved(comp_lora, bb.adapter_params("composer"))
    assert not _moved(block, list(tr.composer.block.parameters()))
    assert _moved(student, bb.adapter_params("student"))


def test_margin_term_reaches_phi_not_theta(resources, workspace):
    """Backprop only β·(m − Δ(φ)): φ gets a gradient, θ gets none."""
    tr = _trainer(resources, "lopd", workspace)
    bb = resources.bb
    tasks = resources.train_tasks[:4]
    tr.prepare(tasks)
    bb.mode("student")
    from lopd.engine.rollout import collate, rollout_batch

    rolls = rollout_batch(bb.model, bb.fmt, resources.envs, tasks, max_new_tokens=8, max_len=80,
                          generator=torch.Generator().manual_seed(0))
    ids, attn, mask = collate(rolls, bb.fmt.pad_id, bb.device)
    targets = ids[:, 1:]
    s_tok = obj.token_logprobs(bb.logits(ids, attn, "student")[:, :-1], targets)
    ctx = tr.context.build(tasks)
    t_tok = obj.token_logprobs(bb.teacher_logits(ctx.prefix, ctx.mask, ids, attn)[:, :-1], targets)
    delta = obj.token_delta(t_tok, s_tok)
    d_phi, _ = obj.outcome_weighted_delta(delta, mask, torch.ones(len(rolls)))  # all weights 1
    for p in tr.theta + tr.composer.phi_params():
        p.grad = None
    obj.margin_penalty(1.0, 0.5, d_phi).backward()
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in tr.theta), "θ must get no margin gradient"
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in tr.composer.phi_params())


def test_inactive_adapter_gets_no_gradient(resources):
    """A forward under the student role leaves the composer adapter without gradient."""
    bb = resources.bb
    ids = torch.tensor([[2, 3, 10, 11, 6, 4]])
    for p in bb.adapter_params("student") + bb.adapter_params("composer"):
        p.grad = None
    bb.logits(ids, torch.ones_like(ids), "student").sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in bb.adapter_params("student"))
    assert all(p.grad is None for p in bb.adapter_params("composer"))


def test_merged_student_equals_adapter_forward(resources, workspace):
    """Evaluation folds the student LoRA into the base weights: same logits as the adapter path."""
    from lopd.model.merged import load_student_policy

    bb = resources.bb
    with torch.no_grad():
        for p in bb.adapter_params("student"):
            p.add_(torch.randn_like(p) * 0.05)  # a non-trivial adapter (B starts at zero)
    state = bb.adapter_state("student")
    ids = torch.tensor([[2, 3, 10, 11, 6, 4, 12, 13]])
    with torch.no_grad():
        want = bb.logits(ids, torch.ones_like(ids), "student")
        model, _ = load_student_policy(workspace.params(), workspace.paths.base, state)
        got = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert not torch.allclose(want, bb.logits(ids, torch.ones_like(ids), "teacher"), atol=1e-4)
    assert torch.allclose(want, got, atol=1e-4), (want - got).abs().max()
