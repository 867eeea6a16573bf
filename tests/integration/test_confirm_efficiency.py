"""Efficiency on the confirmatory split: students kept at registered steps (the loop's snapshots, through a kill),
what the registration fixes, and the ratio from the checkpoints' rewards by hand."""

from __future__ import annotations

import json

import pytest
import torch

from lopd.arms import ARMS
from lopd.errors import BadInput
from lopd.population.trainer import Member, Population
from lopd.training.trainer import HParams
from tests.integration.test_population import killed_in_step


def _hp(workspace, **over) -> HParams:
    base = dict(val_every=100, checkpoint_every=100, margin=0.5, K=4, n_ret=2)
    return HParams.from_params(workspace.params(), **{**base, **over})


def _adapter(tr) -> dict:
    return {k: v.detach().clone() for k, v in tr.bb.adapter_state("student").items()}


def test_a_snapshot_is_the_student_a_run_of_that_many_steps_ends_with(resources, workspace):
    """Two members trained 3 steps keeping their students after steps 1 and 2: the step-1 snapshot equals, bit for
    bit, the student of the same members trained 1 step, and records the rollouts used by then."""
    long = Population(resources, ARMS["lopd"], [Member(_hp(workspace, steps=3, snapshot_steps=(1, 2)), s) for s in (0, 3)])
    long.fit()
    snaps = [dict(tr.snapshots) for tr in long.trainers]
    short = Population(resources, ARMS["lopd"], [Member(_hp(workspace, steps=1), s) for s in (0, 3)])
    short.fit()
    for snap, tr in zip(snaps, short.trainers):
        assert sorted(snap) == [1, 2]
        rollouts, weights = snap[1]
        assert rollouts == tr.rollouts_used > 0
        want = _adapter(tr)
        assert weights.keys() == want.keys() and all(torch.equal(weights[k], want[k]) for k in want)
    # and the snapshots differ from the end (the student moved after them)
    end = _adapter(long.trainers[0])
    assert any(not torch.equal(snaps[0][2][1][k], end[k]) for k in end)


def test_snapshots_survive_a_kill_and_a_resume(resources, workspace, tmp_path, monkeypatch):
    """Killed inside step 4 (checkpoint at step 2 holding the step-1 snapshot), a resumed population ends with the
    same snapshots, bit for bit, as one never killed."""
    hp = _hp(workspace, steps=4, checkpoint_every=2, snapshot_steps=(1, 3))
    whole = Population(resources, ARMS["sft"], [Member(hp, s) for s in (0, 3)], ckpt_dir=tmp_path / "whole")
    whole.fit()
    with killed_in_step(monkeypatch, 4), pytest.raises(KeyboardInterrupt):
        Population(resources, ARMS["sft"], [Member(hp, s) for s in (0, 3)], ckpt_dir=tmp_path / "killed").fit()
    resumed = Population(resources, ARMS["sft"], [Member(hp, s) for s in (0, 3)], ckpt_dir=tmp_path / "killed")
    assert resumed.fit()["resumed_from_step"] == 2
    for a, b in zip(whole.trainers, resumed.trainers):
        assert sorted(a.snapshots) == sorted(b.snapshots) == [1, 3]
        for step in (1, 3):
            assert a.snapshots[step][0] == b.snapshots[step][0]
            assert all(torch.equal(a.snapshots[step][1][k], b.snapshots[step][1][k]) for k in a.snapshots[step][1])


def test_the_registration_fixes_the_baseline_its_values_and_the_checkpoints(workspace):
    """efficiency_part: the baseline's own tuned values from baselines.yaml, the steps, the bank's rollouts;
    an untuned baseline is refused. point_hparams: lopd at the efficiency point and the baseline keep snapshots,
    lopd elsewhere and the other arms do not; slot_arms: the baseline trains at slot 0 only."""
    from lopd.confirmation.registration import efficiency_part, point_hparams, slot_arms

    p = workspace.params(confirm={"efficiency_fractions": [0.25, 0.5, 0.75], "efficiency_baseline": "grpo"})
    pts = [{"name": "p0", "margin": 0.1, "K": 4, "n_ret": 2, "lr_student": 0.005, "lr_frozen": 0.002},
           {"name": "p1", "margin": 0.2, "K": 8, "n_ret": 1, "lr_student": 0.002, "lr_frozen": 0.002}]
    base = {"grpo": {"knob": "search", "knobs": ["lr_student", "group_size"], "lr_student": 0.005, "group_size": 4}}
    eff = efficiency_part(p, base, pts)
    n_bank = p.envs.n_train * len(p.envs.domains) * p.bank.rollouts_per_task
    assert eff == {"arm": "lopd", "point": "p0", "baseline": "grpo", "baseline_hparams": {"lr_student": 0.005,
                   "group_size": 4}, "steps": [1], "bank_rollouts": n_bank}
    with pytest.raises(BadInput, match="was not tuned on val"):
        efficiency_part(p, {}, pts)
    assert efficiency_part(workspace.params(), base, pts) is None  # no baseline registered
    reg = {"arms": {"trained": ["lopd", "lopd_frozen"], "shared": ["base"]}, "efficiency": eff}
    assert point_hparams(reg, pts[0], "lopd") == {"margin": 0.1, "K": 4, "n_ret": 2, "lr_student": 0.005,
                                                  "snapshot_steps": (1,)}
    assert "snapshot_steps" not in point_hparams(reg, pts[1], "lopd")
    assert point_hparams(reg, pts[0], "lopd_frozen") == {"margin": 0.1, "K": 4, "n_ret": 2, "lr_student": 0.002}
    assert point_hparams(reg, pts[1], "grpo") == {"lr_student": 0.005, "group_size": 4, "snapshot_steps": (1,)}
    assert slot_arms(reg, 0) == ["lopd", "lopd_frozen", "base", "grpo"] and slot_arms(reg, 1) == ["lopd", "lopd_frozen"]
    # 2 steps: 0.25 and 0.5 round to step 1, 0.75 to the last (the run's own student): one checkpoint
    assert p.confirm.efficiency_steps(2) == [1] and p.confirm.efficiency_steps(96) == [24, 48, 72]
    with pytest.raises(Exception, match="efficiency_baseline"):
        workspace.params(confirm={"efficiency_fractions": [0.5], "efficiency_baseline": None})


def _write(root, where, arm, seed, reward, rollouts, reg="r", step=None):
    d = root / "confirm" / "eval" / where / arm / f"seed-{seed}"
    d = d if step is None else d / "snapshots" / f"step-{step}"
    d.mkdir(parents=True, exist_ok=True)
    r = {"point": where, "arm": arm, "seed": seed, "test_reward": reward, "rollouts_used": rollouts, "registration": reg}
    (d / "result.json").write_text(json.dumps(r | ({} if step is None else {"step": step})))


def test_the_confirmatory_ratio_by_hand(tmp_path):
    """Two lopd seeds: base 0.2 (0 rollouts), 0.4 at 100, 0.6 at 200 (final); GRPO's two seeds end at 0.45 and
    0.55 (mean 0.5) after 200 rollouts. lopd's mean curve reaches 0.5 half-way from 100 to 200: 150 rollouts,
    ratio 150 / 200 = 0.75; with a 100-rollout bank (150 + 100) / 200 = 1.25. Below the bootstrap's seed floor: no
    CI. A result of another registration is not used."""
    from lopd.analysis.confirm_efficiency import confirm_efficiency, render_confirm_efficiency

    reg = {"sha256": "r", "seeds": [100, 101], "efficiency": {"arm": "lopd", "point": "p0", "baseline": "grpo",
           "baseline_hparams": {"lr_student": 0.005}, "steps": [1], "bank_rollouts": 100}}
    for s in (100, 101):
        _write(tmp_path, "shared", "base", s, 0.2, 0)
        _write(tmp_path, "p0", "lopd", s, 0.4, 100, step=1)
        _write(tmp_path, "p0", "lopd", s, 0.6, 200)
        _write(tmp_path, "shared", "grpo", s, 0.3, 100, step=1)
    _write(tmp_path, "shared", "grpo", 100, 0.45, 200)
    _write(tmp_path, "shared", "grpo", 101, 0.55, 200)
    ce = confirm_efficiency(tmp_path, reg, 200, min_bootstrap_seeds=8)
    assert ce["missing"] == [] and ce["target"] == pytest.approx(0.5) and ce["grpo_total"] == 200
    assert ce["x"] == pytest.approx(150) and ce["ratio"] == pytest.approx(0.75)
    assert ce["ratio_with_bank"] == pytest.approx(1.25) and "ci" not in ce and "no CI" in ce["ci_note"]
    md = "\n".join(render_confirm_efficiency(ce, 200))
    assert "**Ratio without the bank: 0.750**" in md and "**Ratio counting the bank: 1.250**" in md
    _write(tmp_path, "shared", "grpo", 101, 0.9, 200, reg="other")  # evaluated under another registration
    assert confirm_efficiency(tmp_path, reg, 200, min_bootstrap_seeds=8)["n_grpo"] == 1
