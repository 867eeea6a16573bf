"""A population member's run does not depend on who shares its batch.

Each arm's member (seed 3) is trained alone, by the plain :class:`~lopd.training.trainer.Trainer`,
and as member 2 of a population of five whose other members differ (other seeds; for LOPD also
other m, K, n_ret and learning rates, so the padded latent contexts differ in width). Alone, its
rollouts run through the lean decoder and its passes through peft's own LoRA layers; in the
population, its rollouts through the lean decoder's member-routed maps and its passes through the
member-routed layers, over a batch of five members' rows: different kernel paths, so the agreement is
to tolerances, on any x86-64 CPU:

* its first step's sampled tokens are identical;
* its per-step losses over the first 8 steps agree to 1e-5;
* its final adapter agrees to 1e-4 relative (norm of the difference over the norm).
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

from lopd.arms import ARMS
from lopd.population.trainer import Member, Population
from lopd.training.trainer import HParams, Trainer

STEPS = 8
SEED = 3
OTHERS = [0, 1, 2, 4]  # the other members' seeds
# LOPD's other members: search trials elsewhere in the space (their contexts have other widths)
LOPD_TRIALS = [dict(margin=0.0, K=2, n_ret=1, lr_student=0.005), dict(margin=0.2, K=4, n_ret=2, lr_student=0.001),
               dict(margin=1.0, K=2, n_ret=2, lr_student=0.002), dict(margin=0.05, K=4, n_ret=1, lr_student=0.005)]


def _hp(workspace, **over) -> HParams:
    base = dict(steps=STEPS, val_every=100, checkpoint_every=100, margin=0.5, K=4, n_ret=2)
    return HParams.from_params(workspace.params(), **{**base, **over})


def _recording(monkeypatch) -> dict:
    """Record every trainer's step batches (its sampled token ids) by trainer identity."""
    seen: dict[int, list[torch.Tensor]] = {}
    batch_of = Trainer.batch_of

    def spy(self, tasks, rollouts):
        b = batch_of(self, tasks, rollouts)
        seen.setdefault(id(self), []).append(b["ids"].clone())
        return b
    monkeypatch.setattr(Trainer, "batch_of", spy)
    return seen


def _adapter(tr: Trainer) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in tr.bb.adapter_params("student")])


@pytest.mark.parametrize("arm", ["lopd", "grpo", "sft", "opsd_text"])
def test_a_member_trains_as_it_would_alone(resources, workspace, monkeypatch, arm):
    seen = _recording(monkeypatch)
    alone = Trainer(resources, ARMS[arm], _hp(workspace), seed=SEED)
    alone.prepare()
    rows_alone = [alone.train_step() for _ in range(STEPS)]
    adapter_alone = _adapter(alone)
    tokens_alone = seen[id(alone)][0]

    others = [_hp(workspace, **LOPD_TRIALS[i]) if arm == "lopd" else _hp(workspace) for i in range(4)]
    hps = others[:2] + [_hp(workspace)] + others[2:]
    seeds = OTHERS[:2] + [SEED] + OTHERS[2:]
    pop = Population(resources, ARMS[arm], [Member(hp, s) for hp, s in zip(hps, seeds)])
    for tr in pop.trainers:
        tr.prepare()
    rows_pop = [pop.train_step() for _ in range(STEPS)]
    member = pop.trainers[2]

    assert torch.equal(seen[id(member)][0], tokens_alone), f"{arm}: the first step's sampled tokens differ"
    losses_alone = [r["loss"] for r in rows_alone]
    losses_member = [rows[2]["loss"] for rows in rows_pop]
    assert losses_member == pytest.approx(losses_alone, abs=1e-5), f"{arm}: per-step losses differ"
    assert any(x != 0.0 for x in losses_alone), f"{arm}: nothing was learnt from; the comparison is vacuous"
    adapter_member = _adapter(member)
    rel = float((adapter_member - adapter_alone).norm() / adapter_alone.norm())
    assert rel <= 1e-4, f"{arm}: final adapter differs by {rel:.2e} (relative)"
    moved = float((adapter_alone - torch.cat([v.flatten() for v in resources.student_init.values()])).norm())
    assert moved > 0, f"{arm}: the adapter never moved"
    # the members differ from each other: they were not all running member 2's stream
    assert not torch.equal(seen[id(pop.trainers[0])][0], seen[id(member)][0])
    # the batched validation gives the member the rewards its validation alone gives
    val_alone = alone.validate()
    per_task_alone = alone.last_val_per_task
    vals = pop.validate()
    assert vals[2] == pytest.approx(val_alone, abs=1e-12), f"{arm}: batched validation differs"
    assert member.last_val_per_task == pytest.approx(per_task_alone, abs=1e-12)
    assert len(set(vals)) > 1 or arm == "sft", "every member validated the same: the routing is suspect"


def test_a_member_with_its_own_draw_trains_as_it_would_alone(resources, workspace):
    """A member may hold its own upstream draw (a final run's per-seed bank and φ0): here φ0 moved by
    noise. In a population of three whose other members hold the shared draw it trains as it does
    alone on that draw, and not as it does on the shared one (the draw reached its composer)."""
    from dataclasses import replace

    gen = torch.Generator().manual_seed(7)
    own = replace(resources, phi0={k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in resources.phi0.items()})
    steps, hp = 4, _hp(workspace)

    def alone_losses(res) -> list[float]:
        tr = Trainer(res, ARMS["lopd"], hp, seed=SEED)
        tr.prepare()
        return [tr.train_step()["kd_loss"] for _ in range(steps)]

    with_own, with_shared = alone_losses(own), alone_losses(resources)
    pop = Population(resources, ARMS["lopd"], [Member(hp, 0), Member(hp, SEED, res=own), Member(hp, 1)])
    for tr in pop.trainers:
        tr.prepare()
    member = [pop.train_step()[1]["kd_loss"] for _ in range(steps)]
    assert all(isinstance(x, float) for x in with_own + with_shared), (with_own, with_shared)
    assert member == pytest.approx(with_own, abs=1e-5)
    assert with_own != pytest.approx(with_shared, abs=1e-5), "the own draw changed nothing: the test is vacuous"


def _snapshot(pop: Population) -> list:
    out = []
    for tr in pop.trainers:
        weights = [p.detach().clone() for p in tr.bb.adapter_params("student")]
        weights += [p.detach().clone() for p in tr.phi]
        history = [{k: v for k, v in row.items() if k != "seconds"} for row in tr.history]
        out.append((weights, history, tr.beta, tr.opt_theta.state_dict()["state"]))
    return out


@contextmanager
def killed_in_step(monkeypatch, n: int):
    """Within the block, the n-th population step is killed inside its passes (KeyboardInterrupt)."""
    calls, passes = {"n": 0}, Population._passes

    def killed(self, batches):
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt("killed")
        return passes(self, batches)
    monkeypatch.setattr(Population, "_passes", killed)
    try:
        yield
    finally:
        monkeypatch.setattr(Population, "_passes", passes)


def test_a_population_killed_mid_step_resumes_bit_identically(resources, workspace, tmp_path, monkeypatch):
    """Killed inside step 4 (after the checkpoint of step 2), a new process's population resumes at
    step 2 and ends where the uninterrupted one ends: every member's weights, optimiser state, β and
    history equal to the bit."""
    hp = _hp(workspace, steps=5, checkpoint_every=2, val_every=3)
    members = [Member(hp, s) for s in (0, 3, 5)]
    whole = Population(resources, ARMS["lopd"], members, ckpt_dir=tmp_path / "whole")
    whole.fit()
    expected = _snapshot(whole)

    with killed_in_step(monkeypatch, 4), pytest.raises(KeyboardInterrupt):
        Population(resources, ARMS["lopd"], members, ckpt_dir=tmp_path / "killed").fit()
    resumed = Population(resources, ARMS["lopd"], members, ckpt_dir=tmp_path / "killed")
    assert resumed.fit()["resumed_from_step"] == 2
    got = _snapshot(resumed)
    for (w0, h0, b0, o0), (w1, h1, b1, o1) in zip(expected, got):
        assert all(torch.equal(a, b) for a, b in zip(w0, w1))
        assert repr(h0) == repr(h1) and b0 == b1  # repr: nan (no rewarded token) equals nan
        assert all(torch.equal(o0[k]["exp_avg"], o1[k]["exp_avg"]) for k in o0)


def test_a_checkpoint_of_other_members_is_refused(resources, workspace, tmp_path):
    from lopd.errors import BadInput

    hp = _hp(workspace, steps=1, checkpoint_every=1, val_every=1)
    Population(resources, ARMS["sft"], [Member(hp, 0), Member(hp, 1)], ckpt_dir=tmp_path / "c").fit()
    with pytest.raises(BadInput, match="seeds"):
        Population(resources, ARMS["sft"], [Member(hp, 0), Member(hp, 2)], ckpt_dir=tmp_path / "c").fit()


def test_members_must_share_the_step_schedule(resources, workspace):
    from lopd.errors import BadInput

    with pytest.raises(BadInput, match="train.steps"):
        Population(resources, ARMS["lopd"], [Member(_hp(workspace), 0), Member(_hp(workspace, steps=3), 1)])


def test_a_run_alone_after_a_population_on_the_same_backbone_is_unchanged(resources, workspace):
    """The member adapters and the routed LoRA layers a population leaves on the backbone change
    nothing for a plain run afterwards: its losses and adapter equal those of the same run before."""
    def alone():
        tr = Trainer(resources, ARMS["lopd"], _hp(workspace, steps=3), seed=SEED)
        tr.prepare()
        return [tr.train_step()["loss"] for _ in range(3)], _adapter(tr), tr.validate()

    before = alone()
    pop = Population(resources, ARMS["lopd"], [Member(_hp(workspace, steps=3), s) for s in (0, SEED)])
    for tr in pop.trainers:
        tr.prepare()
    pop.train_step()
    assert resources.bb.routing.names is None, "the routing must be off outside a population's passes"
    after = alone()
    assert before[0] == after[0] and torch.equal(before[1], after[1]) and before[2] == after[2]


def test_a_kill_while_the_members_are_closed_reruns_every_member_linked(resources, workspace, tmp_path, monkeypatch):
    """Killed after the first member's outputs and MLflow run are closed, the rerun gives every member
    a run linked to its first attempt's (``resumed_from_run``), not only the members still open, and
    leaves no checkpoint or run-id file behind."""
    from mlflow.tracking import MlflowClient

    from lopd.population import jobs as pjobs
    from lopd.training import run as run_mod

    params = workspace.params(tracking={"experiment": "test-population-runs"})  # apart from the stages' runs
    hp = _hp(workspace, steps=1, checkpoint_every=1, val_every=1)
    ckpt = tmp_path / "checkpoints" / "sft"

    def jobs():
        return [pjobs.Job(s, hp, tmp_path / "runs" / f"seed-{s}", run_name=f"kill-close-{s}-{tmp_path.name}",
                         rid_key=tmp_path / "checkpoints" / f"sft-seed-{s}") for s in (0, 1)]

    close = run_mod.close_job
    closed = []

    def killed_after_first_close(*a, **k):
        if closed:
            raise KeyboardInterrupt("killed")
        closed.append(close(*a, **k))
        return closed[-1]
    monkeypatch.setattr(run_mod, "close_job", killed_after_first_close)
    with pytest.raises(KeyboardInterrupt):
        pjobs.run_jobs(params, resources, "sft", jobs(), ckpt_dir=ckpt)
    first = {s: run_mod.run_id_file(j.rid_key).read_text().strip() for s, j in zip((0, 1), jobs())}
    monkeypatch.setattr(run_mod, "close_job", close)
    done = pjobs.run_jobs(params, resources, "sft", jobs(), ckpt_dir=ckpt)

    client = MlflowClient(tracking_uri=params.tracking.uri)
    for s, (_, meta) in zip((0, 1), done):
        assert meta["resumed_from_run"] == first[s]
        assert client.get_run(meta["mlflow_run_id"]).data.tags.get("resumed_from_run") == first[s]
    assert client.get_run(first[0]).info.status == "FINISHED"  # closed before the kill, kept as it was
    assert not ckpt.exists() and not list((tmp_path / "checkpoints").glob("*.mlflow_run_id"))


def test_population_size_trains_the_runs_in_several_populations(resources, workspace, tmp_path, monkeypatch):
    """``train.population_size`` 2 trains three runs as a population of two, then one (each with its own
    checkpoint, removed when it is done); every run agrees with the same run in one population of three
    to the population tolerance."""
    from safetensors.torch import load_file

    from lopd.population import jobs as pjobs

    hp = _hp(workspace, steps=2, checkpoint_every=1, val_every=1)
    seen = []
    init = Population.__init__

    def spy(self, res, arm, members, **kw):
        seen.append(([m.seed for m in members], kw.get("ckpt_dir")))
        init(self, res, arm, members, **kw)
    monkeypatch.setattr(Population, "__init__", spy)

    def train(size, root):
        params = workspace.params(tracking={"experiment": "test-population-runs"}, train={"population_size": size})
        jobs = [pjobs.Job(s, hp, root / f"seed-{s}", run_name=f"size-{size}-{s}") for s in (0, 1, 3)]
        done = pjobs.run_jobs(params, resources, "sft", jobs, ckpt_dir=root / "ckpt" / "sft")
        assert [r["seed"] for r, _ in done] == [0, 1, 3]
        return {s: load_file(root / f"seed-{s}" / "student.safetensors") for s in (0, 1, 3)}

    split = train(2, tmp_path / "split")
    assert seen == [([0, 1], tmp_path / "split/ckpt/sft-part-0"), ([3], tmp_path / "split/ckpt/sft-part-1")]
    assert not any((tmp_path / "split" / "ckpt").iterdir())
    whole = train(None, tmp_path / "whole")
    assert seen[2] == ([0, 1, 3], tmp_path / "whole/ckpt/sft")
    moved = [s for s in (0, 1, 3) if any(not torch.equal(whole[s][k], resources.student_init[k]) for k in whole[s])]
    assert moved, "no run's adapter moved: the comparison below would be between two initial adapters"
    for s in (0, 1, 3):
        a = torch.cat([v.flatten() for _, v in sorted(split[s].items())])
        b = torch.cat([v.flatten() for _, v in sorted(whole[s].items())])
        assert float((a - b).norm() / b.norm()) <= 1e-4, f"seed {s}"


def test_a_frozen_composers_context_is_its_primed_latents_and_runs_no_composer_pass(resources, workspace, monkeypatch):
    """lopd_frozen keeps φ at φ0, so its per-step latents are c_φ0, computed once in prime(): the context
    it builds equals the composer's output on the same tasks (to 1e-5: another batch, another padding),
    and neither a run alone nor a population runs the composer's encoder during a step."""
    tr = Trainer(resources, ARMS["lopd_frozen"], _hp(workspace), seed=SEED)
    tr.prepare()
    tasks = tr.sample_tasks()
    with torch.no_grad():
        fresh = tr.composer([tr.context.experiences_for(t) for t in tasks], tr.hp.K)
    encodes = []
    hidden = type(resources.bb).hidden_states
    monkeypatch.setattr(type(resources.bb), "hidden_states", lambda self, *a, **k: encodes.append(1) or hidden(self, *a, **k))
    ctx = tr.context.build(tasks)
    assert torch.allclose(ctx.prefix, fresh, rtol=0, atol=1e-5) and float(fresh.abs().max()) > 0
    assert not ctx.prefix.requires_grad
    pop = Population(resources, ARMS["lopd_frozen"], [Member(_hp(workspace), s) for s in (SEED, 0)])
    for m in pop.trainers:
        m.prepare()  # prime(): the one composer pass per task
    encodes.clear()
    tr.train_step()
    pop.train_step()
    assert encodes == [], "a frozen composer ran its encoder during a step"
