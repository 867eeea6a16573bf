"""The trainer's margin wiring (lopd.training.trainer.Trainer.train_step → _dual_update →
_feasibility), driven step by step with scripted Δ(φ) values and hand-computed expectations.

The trainer is built by its own constructor on the test workspace's resources. The model is left
out of the step: the objective is replaced by one that reports a scripted ``delta_phi`` and
``delta_weight`` (what ``_kd`` reports) and no loss, so no optimiser step is taken; everything after
it — the dual update of β from the logged Δ, the logged β, the infeasibility streak, ``beta_max``,
the tag on the tracker — is the production code."""

from __future__ import annotations

import pytest
import torch

from lopd.arms import ARMS
from lopd.training import arm_loss
from lopd.training.arm_loss import StepLoss
from lopd.training.trainer import HParams, Trainer


class Tags:
    def __init__(self):
        self.set = []

    def set_tag(self, key, value):
        self.set.append((key, value))


@pytest.fixture
def trainer_factory(monkeypatch, resources, workspace):
    """``make(arm, margin=…, eta=…, beta0=…, beta_max=…, patience=…)``: a Trainer built by its own
    constructor on the workspace's resources, with those margin settings, and the queue of
    ``(delta_phi, delta_weight)`` the stub objective reports, one per step."""

    def make(arm: str, *, margin: float, eta: float, beta0: float, beta_max: float = 100.0,
             patience: int = 100, **over) -> tuple[Trainer, list]:
        hp = HParams.from_params(workspace.params(), margin=margin, eta_beta=eta, beta_init=beta0, beta_max=beta_max,
                                 infeasible_patience=patience, **over)
        spec = ARMS[arm]
        tr = Trainer(resources, spec, hp, seed=0, tracker=Tags())
        # no model: the step's batch is two rewarded rows, and the objective reports the scripted Δ
        monkeypatch.setattr(tr, "_rollout_batch", lambda: {"rewards": torch.ones(2), "mask": torch.ones(2, 3)})
        script: list[tuple[float, float]] = []

        def objective(_tr, _batch, _passes):
            d, w = script.pop(0)
            return StepLoss(None, {"delta_phi": d, "delta_weight": w})

        monkeypatch.setitem(arm_loss.OBJECTIVES, spec.objective, objective)
        return tr, script
    return make


def _run(tr: Trainer, script: list, steps) -> list[dict]:
    script.extend(steps)
    return [tr.train_step() for _ in steps]


def test_beta_follows_the_logged_delta(trainer_factory):
    """β_{t+1} = max(0, β_t + η (m − Δ_t)) with the Δ each step logs; m = 0.5, η = 0.5, β_0 = 1:
    Δ = 0.125 → 1 + 0.5·0.375 = 1.1875; Δ = 0.25 → +0.125 = 1.3125; Δ = 1 → −0.25 = 1.0625;
    Δ = 3.5 → 1.0625 − 1.5 < 0 → 0 (projected); Δ = 0.5 = m → stays 0."""
    tr, script = trainer_factory("lopd", margin=0.5, eta=0.5, beta0=1.0)
    rows = _run(tr, script, [(0.125, 1.0), (0.25, 2.0), (1.0, 1.0), (3.5, 4.0), (0.5, 1.0)])
    assert [r["delta_phi"] for r in rows] == [0.125, 0.25, 1.0, 3.5, 0.5]
    assert [r["beta"] for r in rows] == [1.1875, 1.3125, 1.0625, 0.0, 0.0]
    assert tr.beta == 0.0 and [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert all("delta_weight" not in r for r in rows)  # internal, not a history column


def test_no_dual_update_without_rewarded_tokens(trainer_factory):
    """Weight 0 (no rewarded supervised token; _kd then logs Δ = nan): Δ is undefined and β keeps its
    value. The guard is the weight, not the value: a finite Δ reported with weight 0 does not move β
    either. An undefined step is not a violation: it ends the streak (current rule: only a measured
    Δ < m extends it). m = 1, η = 1, β_0 = 2."""
    tr, script = trainer_factory("lopd", margin=1.0, eta=1.0, beta0=2.0, patience=100)
    betas, streaks = [], []
    for step in [(0.5, 1.0), (float("nan"), 0.0), (0.25, 0.0), (0.5, 1.0)]:
        row = _run(tr, script, [step])[0]
        betas.append(row["beta"])
        streaks.append(tr.infeasible_streak)
    # 2 + (1 − 0.5) = 2.5; unchanged; unchanged; 2.5 + (1 − 0.5) = 3.0
    assert betas == [2.5, 2.5, 2.5, 3.0]
    assert streaks == [1, 0, 1, 2] and not tr.infeasible


def test_patience_and_the_streak_reset(trainer_factory):
    """η = 0 keeps β fixed, so only the streak of Δ < m can flag. m = 0.5, patience 3: two
    violations, then Δ = m (satisfied: the streak resets), then two, then Δ above m (reset again),
    then three in a row: flagged at the third, once; a later satisfied step does not unflag."""
    tr, script = trainer_factory("lopd", margin=0.5, eta=0.0, beta0=0.0, patience=3)
    low, at, high = (0.25, 1.0), (0.5, 1.0), (0.75, 1.0)
    streaks, flags = [], []
    for step in [low, low, at, low, low, high, low, low, low, high]:
        _run(tr, script, [step])
        streaks.append(tr.infeasible_streak)
        flags.append(tr.infeasible)
    assert streaks == [1, 2, 0, 1, 2, 0, 1, 2, 3, 0]
    assert flags == [False] * 8 + [True, True]
    assert tr.tracker.set == [("infeasible_margin", "true")]


def test_beta_max_flags_only_above_it(trainer_factory):
    """m = 0.5, η = 1, β_0 = 0, beta_max = 1, patience far away: Δ = 0 three times gives β = 0.5,
    1.0 (= beta_max: not above it, not flagged), 1.5 (above: flagged)."""
    tr, script = trainer_factory("lopd", margin=0.5, eta=1.0, beta0=0.0, beta_max=1.0, patience=100)
    betas, flags = [], []
    for step in [(0.0, 1.0)] * 3:
        betas.append(_run(tr, script, [step])[0]["beta"])
        flags.append(tr.infeasible)
    assert betas == [0.5, 1.0, 1.5] and flags == [False, False, True]
    assert tr.tracker.set == [("infeasible_margin", "true")]


def test_a_feasible_run_is_not_flagged(trainer_factory):
    """Δ ≥ m at every step, with the strictest patience (1) and a small beta_max: β only falls
    (2 → 1.875 → 1.625 → 1.5 → 1.0 → 0.75, η = 1, m = 0.5) and the run is never flagged."""
    tr, script = trainer_factory("lopd", margin=0.5, eta=1.0, beta0=2.0, beta_max=2.0, patience=1)
    rows = _run(tr, script, [(0.625, 1.0), (0.75, 1.0), (0.625, 1.0), (1.0, 1.0), (0.75, 1.0)])
    assert [r["beta"] for r in rows] == [1.875, 1.625, 1.5, 1.0, 0.75]
    assert not tr.infeasible and tr.infeasible_streak == 0 and tr.tracker.set == []


@pytest.mark.parametrize("arm", ["lopd_nomargin", "lopd_frozen"])
def test_arms_without_an_active_margin_never_move_beta(trainer_factory, arm):
    """No margin (lopd_nomargin) or a frozen φ (lopd_frozen): β stays 0 and nothing is flagged, however
    far Δ falls below the m the run was given."""
    tr, script = trainer_factory(arm, margin=0.5, eta=1.0, beta0=1.0, beta_max=0.5, patience=1)
    rows = _run(tr, script, [(-3.0, 1.0)] * 3)
    assert [r["beta"] for r in rows] == [0.0, 0.0, 0.0]
    assert not tr.infeasible and tr.infeasible_streak == 0 and tr.tracker.set == []


def test_ramp_reproduces_dual_ascent_while_delta_is_held_below_m(trainer_factory):
    """lopd_ramp (β_t = β_0 + r·t, Δ never read) against lopd's dual ascent on the same scripted Δ, held
    below m. m = 1, η = 0.5, β_0 = 0.25. With Δ = 0 every step dual ascent adds η·m = 0.5 a step, and the
    ramp at its default r = η·m matches it exactly: 0.75, 1.25, 1.75, 2.25. With Δ held at 0.5 dual ascent
    adds η(m − Δ) = 0.25 a step, and a ramp given r = 0.25 matches it; the default ramp does not (it ignores
    Δ: still 0.5 a step)."""
    def betas(arm: str, held: list, **over) -> list[float]:
        tr, script = trainer_factory(arm, margin=1.0, eta=0.5, beta0=0.25, **over)  # one at a time: one objective
        return [r["beta"] for r in _run(tr, script, held)]

    held_zero, held_half = [(0.0, 1.0)] * 4, [(0.5, 1.0)] * 4
    assert betas("lopd", held_zero) == [0.75, 1.25, 1.75, 2.25]
    assert betas("lopd_ramp", held_zero) == [0.75, 1.25, 1.75, 2.25]
    assert betas("lopd", held_half) == [0.5, 0.75, 1.0, 1.25]
    assert betas("lopd_ramp", held_half, beta_rate=0.25) == [0.5, 0.75, 1.0, 1.25]
    assert betas("lopd_ramp", held_half) == [0.75, 1.25, 1.75, 2.25]


def test_ramp_is_open_loop(trainer_factory):
    """The ramp does not read Δ: Δ above m (which drives dual ascent's β to 0) and steps with no rewarded
    token (weight 0: dual ascent holds β) move it by r all the same. m = 0.2, η = 1, β_0 = 0, r = η·m."""
    tr, script = trainer_factory("lopd_ramp", margin=0.2, eta=1.0, beta0=0.0)
    rows = _run(tr, script, [(5.0, 1.0), (float("nan"), 0.0), (-1.0, 1.0)])
    assert [r["beta"] for r in rows] == pytest.approx([0.2, 0.4, 0.6])


def test_fixbeta_holds_beta(trainer_factory):
    """lopd_fixbeta starts at train.beta_fixed (not beta_init) and keeps it whatever Δ does: far below m,
    above it, undefined. Its β still counts for the flags: 3 > beta_max = 2 flags the run infeasible."""
    tr, script = trainer_factory("lopd_fixbeta", margin=0.5, eta=1.0, beta0=0.0, beta_fixed=3.0, beta_max=2.0)
    assert tr.beta == 3.0
    rows = _run(tr, script, [(-2.0, 1.0), (4.0, 1.0), (float("nan"), 0.0), (0.1, 1.0)])
    assert [r["beta"] for r in rows] == [3.0, 3.0, 3.0, 3.0]
    assert tr.infeasible and tr.tracker.set == [("infeasible_margin", "true")]
