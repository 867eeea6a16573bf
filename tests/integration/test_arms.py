"""Baselines as arms of one trainer: every arm runs through the same loop and writes the
same files; the arms differ only in their switches (what the teacher sees, which bank
mode, which objective), and every arm spends the same rollout budget."""

from __future__ import annotations

import csv
import json
import os

import pytest
import torch

from lopd.training import objectives as obj
from lopd.arms import ARMS
from lopd.engine.rollout import collate, rollout_batch

STEPS = 2
TASKS_PER_STEP = 4  # a multiple of group_size (4) so GRPO runs one group per step


def _small(workspace, **over):
    train = {"steps": STEPS, "tasks_per_step": TASKS_PER_STEP, "val_every": STEPS, "val_tasks": 2,
             "checkpoint_every": 1, "use_best_params": False, **over.pop("train", {})}
    return workspace.params(train=train, **over)


def _contains(hay: list[int], needle: list[int]) -> bool:
    n = len(needle)
    return n > 0 and any(hay[i:i + n] == needle for i in range(len(hay) - n + 1))


@pytest.fixture(scope="module")
def arm_runs(workspace, tmp_path_factory):
    """Every registered arm, 2 steps, seed 0, through ``run_arm`` (the stage's code path)."""
    from lopd.stages.common import load_resources
    from lopd.training.run import run_arm

    out = tmp_path_factory.mktemp("arms")
    params = _small(workspace)
    res = load_resources(params, workspace.paths, role="train")
    res.val_tasks = res.val_tasks[:4]  # the final validation: keep it cheap
    runs = {}
    for arm in ARMS:
        r, _ = run_arm(params, res, arm, 0, out / arm, ckpt_dir=None)
        runs[arm] = (r, out / arm)
    return runs


def test_every_arm_writes_result_and_same_history_columns(arm_runs):
    headers = {}
    for arm, (r, d) in arm_runs.items():
        assert (d / "result.json").is_file(), arm
        assert (d / "history.csv").is_file(), arm
        res = json.loads((d / "result.json").read_text())
        assert res["arm"] == arm and res["seed"] == 0
        assert res["arm_switches"] == ARMS[arm].to_dict()
        with open(d / "history.csv", newline="") as f:
            rows = list(csv.reader(f))
        headers[arm] = rows[0]
        if ARMS[arm].trains:
            assert [int(x[0]) for x in rows[1:]] == list(range(STEPS + 1)), arm
    first = next(iter(headers.values()))
    assert "step" in first and "rollouts_used" in first and "reward" in first
    assert all(h == first for h in headers.values()), headers



@pytest.mark.parametrize("arm", ["lopd_frozen", "lopd_nomargin", "opsd_text"])
def test_an_arm_without_the_margin_trains_the_same_student_at_every_m(workspace, tmp_path, arm):
    """A run is keyed by what it reads (no run trained twice): an arm whose margin is off (``ArmSpec.margin``) reads
    m and η_β (``ArmSpec.unread_coordinates``) only in the ``margin_sat_frac`` it logs. Trained at (m 0.05, η_β 0.5)
    and at (m 2, η_β 500), every weight file it writes (student, and composer where it trains one) is bit for bit
    the same, and so is its history but that column. So the confirmation trains such an arm once for points of S
    that differ only there (``lopd.confirmation.registration.shared_runs``)."""
    from lopd.arms import get_arm
    from lopd.stages.common import load_resources
    from lopd.training.run import run_arm

    assert get_arm(arm).unread_coordinates() == ("margin", "eta_beta")
    params = _small(workspace)
    got = {}
    for m, eta in ((0.05, 0.5), (2.0, 500.0)):
        res = load_resources(params, workspace.paths, role="train")
        res.val_tasks = res.val_tasks[:2]
        out = tmp_path / f"m{m}"
        run_arm(params, res, arm, 0, out, ckpt_dir=None, hp_over={"margin": m, "eta_beta": eta})
        with open(out / "history.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        weights = {p.name: p.read_bytes() for p in sorted(out.glob("*.safetensors"))}
        got[m] = (weights, rows)
    (weights_a, hist_a), (weights_b, hist_b) = got[0.05], got[2.0]
    assert "student.safetensors" in weights_a and weights_a == weights_b
    assert [{k: v for k, v in r.items() if k != "margin_sat_frac"} for r in hist_a] == \
           [{k: v for k, v in r.items() if k != "margin_sat_frac"} for r in hist_b]


def test_rollout_budget_is_equal_across_arms(arm_runs):
    for arm, (r, d) in arm_runs.items():
        res = json.loads((d / "result.json").read_text())
        assert res["rollouts_used"] == res["steps"] * res["hparams"]["tasks_per_step"], arm
        if ARMS[arm].trains:
            assert res["steps"] == STEPS, arm
            assert res["rollouts_used"] == STEPS * TASKS_PER_STEP, arm
        else:
            assert res["rollouts_used"] == 0


# ------------------------------------------------------------------ context of the teacher


def _trainer(resources, workspace, arm, seed=0):
    from lopd.training.trainer import HParams, Trainer

    hp = HParams.from_params(_small(workspace))
    return Trainer(resources, ARMS[arm], hp, seed)


def _prefix_ids(bb, prefix_emb: torch.Tensor, mask: torch.Tensor) -> list[int]:
    """Invert an embedded text prefix back to token ids (exact row match in the embedding table)."""
    W = bb.model.get_input_embeddings().weight.detach()
    out = []
    for v in prefix_emb[mask.bool()]:
        hits = torch.nonzero((W == v.detach()).all(dim=1)).flatten().tolist()
        assert len(hits) == 1, "prefix vector is not exactly one token embedding"
        out.append(hits[0])
    return out


def test_opsd_text_teacher_reads_retrieved_trajectories_student_does_not(resources, workspace, monkeypatch):
    import lopd.training.trainer as trainer_mod

    tr = _trainer(resources, workspace, "opsd_text")
    bb, fmt = resources.bb, resources.bb.fmt
    # what the trainer retrieves is exactly the bank's relevant retrieval for the task
    task = resources.train_tasks[0]
    got = tr.experiences_for(task)
    want = resources.bank.retrieve(task, resources.task_emb[task.task_id], tr.hp.n_ret, "relevant", seed=0)
    assert got == [fmt.experience_ids(e.messages) for e in want]
    assert len(got) == tr.hp.n_ret

    # one real train step, capturing the student's and the teacher's inputs
    seen: dict = {}
    real_collate, real_teacher = trainer_mod.collate, bb.teacher_logits

    def spy_collate(rollouts, *a, **k):
        out = real_collate(rollouts, *a, **k)
        seen["tasks"] = [r.task for r in rollouts]
        seen["student_ids"] = out[0].clone()
        seen["student_attn"] = out[1].clone()
        return out

    def spy_teacher(prefix, prefix_mask, ids, attn, latent_prefix=True):
        seen["prefix"], seen["prefix_mask"] = prefix.detach().clone(), prefix_mask.clone()
        seen["teacher_ids"], seen["latent"] = ids.clone(), latent_prefix
        return real_teacher(prefix, prefix_mask, ids, attn, latent_prefix=latent_prefix)

    monkeypatch.setattr(trainer_mod, "collate", spy_collate)
    monkeypatch.setattr(bb, "teacher_logits", spy_teacher)
    tr.train_step()

    assert seen["latent"] is False
    assert torch.equal(seen["teacher_ids"], seen["student_ids"])  # same rollouts after the prefix
    exp_marker = fmt.exp
    for i, task in enumerate(seen["tasks"]):
        exps = tr.experiences_for(task)
        teacher_ctx = _prefix_ids(bb, seen["prefix"][i], seen["prefix_mask"][i])
        # reconstruction of the context the way the trainer builds it
        assert teacher_ctx == fmt.context_ids([]) + [t for e in exps for t in exp_marker + e]
        student = seen["student_ids"][i][seen["student_attn"][i].bool()].tolist()
        for e in exps:
            assert _contains(teacher_ctx, e)
            assert not _contains(student, e), "a retrieved trajectory leaked into the student's input"
        assert not _contains(student, exp_marker), "the experience marker appears in the student's input"


def test_shuffled_and_unrelated_controls(resources, workspace):
    fmt = resources.bb.fmt
    # the controls differ from lopd only in the bank mode
    base = {k: v for k, v in ARMS["lopd"].to_dict().items() if k not in ("name", "description", "bank_mode")}
    for ctrl in ("lopd_shuffled", "lopd_unrelated"):
        d = {k: v for k, v in ARMS[ctrl].to_dict().items() if k not in ("name", "description", "bank_mode")}
        assert d == base, ctrl
        assert ARMS[ctrl].bank_mode != ARMS["lopd"].bank_mode
    rel = _trainer(resources, workspace, "lopd", seed=0)
    shuf = _trainer(resources, workspace, "lopd_shuffled", seed=0)
    unrel = _trainer(resources, workspace, "lopd_unrelated", seed=0)
    by_ids = {tuple(fmt.experience_ids(e.messages)): e for e in resources.bank.entries}
    tasks = resources.train_tasks[:12]
    for t in tasks:
        r, s, u = rel.experiences_for(t), shuf.experiences_for(t), unrel.experiences_for(t)
        assert len(r) == len(s) == len(u) == rel.hp.n_ret
        assert all(a != b for a, b in zip(r, s)), f"shuffled kept a relevant trajectory for {t.task_id}"
        for e in u:
            assert by_ids[tuple(e)].domain != t.domain, f"unrelated retrieved the same domain for {t.task_id}"
        for e in s + r:
            assert by_ids[tuple(e)].task_id != t.task_id
    # deterministic for a seed
    again = _trainer(resources, workspace, "lopd_shuffled", seed=0)
    assert [again.experiences_for(t) for t in tasks] == [shuf.experiences_for(t) for t in tasks]


# ------------------------------------------------------------------ GRPO


def test_grpo_advantages_on_hand_made_group():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    adv = obj.grpo_advantages(rewards)
    # mean 0.5, population std 0.5
    assert torch.allclose(adv[0], torch.tensor([1.0, -1.0, -1.0, 1.0]) * 0.5 / (0.5 + 1e-4), atol=1e-6)
    assert torch.equal(adv[1], torch.zeros(4)) and torch.equal(adv[2], torch.zeros(4))
    logp = torch.randn(12, 5, requires_grad=True)
    mask = torch.ones(12, 5)
    loss = obj.policy_gradient_loss(logp, adv.view(-1), mask)
    loss.backward()
    assert logp.grad[4:].abs().sum() == 0  # zero-variance groups: no gradient
    assert logp.grad[:4].abs().sum() > 0
    # the higher-reward rollouts are pushed up (gradient of the loss is negative)
    assert (logp.grad[[0, 3]] < 0).all() and (logp.grad[[1, 2]] > 0).all()


def test_grpo_trainer_zero_variance_group_makes_no_update(resources, workspace, monkeypatch):
    import lopd.training.trainer as trainer_mod

    real = trainer_mod.rollout_batch

    def constant_reward(*a, **k):
        rolls = real(*a, **k)
        for r in rolls:
            r.reward = 1.0
        return rolls

    monkeypatch.setattr(trainer_mod, "rollout_batch", constant_reward)
    tr = _trainer(resources, workspace, "grpo")
    before = resources.bb.adapter_state("student")
    m = tr.train_step()
    after = resources.bb.adapter_state("student")
    assert m["loss"] == 0.0
    assert tr.rollouts_used == TASKS_PER_STEP
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_same_seed_same_initial_student_and_task_order_in_every_arm(workspace, resources):
    """Pairing arms by training seed is meaningful only if a seed fixes the starting student and
    the tasks each step trains on, whatever the arm (GRPO samples whole groups, so it is exempt)."""
    from lopd.training.trainer import HParams, Trainer

    params = _small(workspace)
    hp = HParams.from_params(params)
    seen = {}
    for arm in [a for a in ARMS.values() if not a.grouped]:
        for seed in (0, 1):
            tr = Trainer(resources, arm, hp, seed)
            init = {k: v.clone() for k, v in resources.bb.adapter_state("student").items()}
            order = [[t.task_id for t in tr.sample_tasks()] for _ in range(3)]
            seen[(arm.name, seed)] = (init, order)
    for (arm, seed), (init, order) in seen.items():
        ref_init, ref_order = seen[("lopd", seed)]
        assert order == ref_order, f"{arm} seed {seed} trains on other tasks than lopd"
        assert all(torch.equal(init[k], ref_init[k]) for k in ref_init), f"{arm} seed {seed} starts elsewhere"
    assert seen[("lopd", 0)][1] != seen[("lopd", 1)][1], "different seeds must give different task orders"
