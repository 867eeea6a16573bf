"""lopd.analysis.dynamics.constraint_status (does the margin constraint bind over the last quarter of
training?) on hand-built histories with hand-computed expectations, and its place in margin_dynamics.md."""

from __future__ import annotations

import numpy as np
import pytest

from lopd.analysis.dynamics import (BAND_FLOOR, BETA_ZERO, constraint_band, constraint_status, margin_dynamics,
                                    render_margin_dynamics)

M = 0.05
STEPS = np.arange(41.0)  # 0..40: the window (steps ≥ 0 + 0.75·40) is steps 30..40, 11 steps


def _hist(delta, beta, steps=STEPS) -> dict[str, np.ndarray]:
    return {"step": np.asarray(steps, dtype=float), "delta_phi": np.asarray(delta, dtype=float),
            "beta": np.asarray(beta, dtype=float)}


def _binding(m=M):
    """β rises 0.1 per step, then holds at 2.0 from step 20; Δ = m ± 0.002 (+ at even steps)."""
    return _hist(m + np.where(STEPS % 2 == 0, 0.002, -0.002), np.minimum(0.1 * STEPS, 2.0))


def test_band_is_relative_with_a_floor():
    assert constraint_band(0.05) == pytest.approx(0.0125)
    assert constraint_band(0.2) == pytest.approx(0.05)
    assert constraint_band(0.0) == BAND_FLOOR == 0.01
    assert constraint_band(0.02) == 0.01  # 0.25·0.02 = 0.005 < floor


def test_binding_run():
    c = constraint_status(_binding(), M)
    # window 30..40: 6 even steps (+0.002), 5 odd (−0.002); β = 2.0 throughout
    assert c["status"] == "binds" and c["reason"] == ""
    assert c["n_window"] == 11 and c["band"] == pytest.approx(0.0125)
    assert c["mean_delta"] == pytest.approx(M + 0.002 / 11)
    assert c["beta_first"] == c["beta_last"] == c["mean_beta"] == 2.0 and c["active"] == 1.0
    assert c["beta_slope"] == pytest.approx(0.0, abs=1e-12) and c["beta_change"] == pytest.approx(0.0, abs=1e-10)


def test_delta_oscillating_around_m_with_beta_level_binds():
    """Δ swings ±0.01 around m (as large as the band allows), β wobbles ±0.3 around 2: the means decide."""
    d = M + np.where(STEPS % 2 == 0, 0.01, -0.01)
    b = 2.0 + np.where(STEPS % 2 == 0, -0.3, 0.3)
    c = constraint_status(_hist(d, b), M)
    # window: 6 even (1.7), 5 odd (2.3): mean β (6·1.7 + 5·2.3)/11 = 21.7/11; slope ≠ 0 but its change is far below 0.2 × mean β
    assert c["status"] == "binds" and c["mean_beta"] == pytest.approx(21.7 / 11)
    assert abs(c["beta_change"]) <= 0.2 * c["mean_beta"]


def test_beta_drifting_within_a_fifth_of_its_mean_still_binds_beyond_it_is_unsettled():
    # window β 2.0 → 2.3 (change 0.3 ≤ 0.2 × mean 2.15 = 0.43): level; 2.0 → 2.5 (0.5 > 0.2 × 2.25 = 0.45): rising
    d = np.full(STEPS.size, M)
    slow = np.where(STEPS >= 30, 2.0 + 0.03 * (STEPS - 30), 0.0667 * STEPS)
    c = constraint_status(_hist(d, slow), M)
    assert c["status"] == "binds" and c["beta_change"] == pytest.approx(0.3)
    fast = np.where(STEPS >= 30, 2.0 + 0.05 * (STEPS - 30), 0.0667 * STEPS)
    c = constraint_status(_hist(d, fast), M)
    assert c["status"] == "unsettled" and c["beta_change"] == pytest.approx(0.5)
    assert "β still rising" in c["reason"] and "tolerance 0.45" in c["reason"]


def test_slack_run():
    c = constraint_status(_hist(np.full(STEPS.size, 0.1), np.zeros(STEPS.size)), M)
    assert c["status"] == "slack" and c["mean_delta"] == pytest.approx(0.1) and c["active"] == 0.0
    # β ≈ 0 with Δ inside the band below m: slack (0.045 ≥ 0.05 − 0.0125)
    assert constraint_status(_hist(np.full(STEPS.size, 0.045), np.zeros(STEPS.size)), M)["status"] == "slack"
    # β ≈ 0 but Δ below the band: not slack (the margin does not hold), and the reason says so
    c = constraint_status(_hist(np.full(STEPS.size, 0.03), np.zeros(STEPS.size)), M)
    assert c["status"] == "unsettled" and "β ≈ 0 but mean Δ 0.0300 < m − band 0.0375" in c["reason"]


def test_beta_at_zero_with_one_noisy_dip_is_slack():
    """Δ at 0.1 but one step of the window dips to 0.0 (a noisy minibatch): dual ascent (η_β = 0.5) lifts β to
    0.025 for that step, and the next step's Δ − m pushes it back to 0. The old rule (β ≤ ε at every step)
    called this unsettled."""
    d = np.full(STEPS.size, 0.1)
    d[35] = 0.0
    b = np.zeros(STEPS.size)
    b[35] = 0.5 * (M - 0.0)  # 0.025
    c = constraint_status(_hist(d, b), M)
    assert c["status"] == "slack" and c["active"] == pytest.approx(1 / 11)


def test_a_pure_ramp_degenerates():
    c = constraint_status(_hist(np.full(STEPS.size, -0.02), 0.05 * STEPS), M)
    # window 30..40: β 1.5 → 2.0, slope 0.05, mean 1.75 (change 0.5 > 0.2 × 1.75); mean Δ −0.02 < 0.05 − 0.0125
    assert c["status"] == "degenerates"
    assert c["beta_first"] == pytest.approx(1.5) and c["beta_last"] == pytest.approx(2.0)
    assert c["beta_slope"] == pytest.approx(0.05) and c["beta_change"] == pytest.approx(0.5)
    assert c["mean_delta"] == pytest.approx(-0.02) and c["mean_beta"] == pytest.approx(1.75)
    # the ramp of dual ascent itself, η_β (m − Δ) = 0.5 × 0.07 per step from β = 0: degenerates too
    c = constraint_status(_hist(np.full(STEPS.size, -0.02), 0.035 * STEPS), M)
    assert c["status"] == "degenerates"


def test_beta_flat_but_delta_off_the_band_is_unsettled_not_degenerate():
    c = constraint_status(_hist(np.full(STEPS.size, 0.02), np.minimum(0.1 * STEPS, 2.0)), M)
    assert c["status"] == "unsettled" and "mean Δ 0.0200 below m ± 0.0125" in c["reason"]
    c = constraint_status(_hist(np.full(STEPS.size, 0.1), np.minimum(0.1 * STEPS, 2.0)), M)
    assert c["status"] == "unsettled" and c["reason"] == "mean Δ 0.1000 above m ± 0.0125"


def test_beta_chattering_between_zero_and_active_is_unsettled():
    """β > ε on half the window's steps (a dual step so large that β is clamped at 0 every other step)."""
    b = np.where(STEPS % 2 == 0, 0.0, 3.0)
    c = constraint_status(_hist(np.full(STEPS.size, M), b), M)
    assert c["status"] == "unsettled" and c["active"] == pytest.approx(5 / 11)
    assert "on 45% of the window" in c["reason"]


@pytest.mark.parametrize("n", [0, 1, 2])
def test_short_history(n):
    h = _hist(np.full(n, M), np.ones(n), steps=np.arange(n))
    c = constraint_status(h, M)
    assert c["status"] == "too short" and c["mean_delta"] is None and c["beta_slope"] is None
    assert constraint_status({}, M)["status"] == "too short"  # no columns at all


def test_three_steps_suffice_and_a_one_point_window_is_too_short():
    c = constraint_status(_hist([0.1, 0.1, 0.1], [0.0, 0.0, 0.0], steps=[0, 9, 10]), M)
    assert c["status"] == "slack" and c["n_window"] == 2  # window: steps ≥ 7.5
    # evenly spaced: 0..2 and 0..3 leave only the last step in the window (≥ 1.5, ≥ 2.25); 0..4 leaves 3, 4
    for n, status in ((3, "too short"), (4, "too short"), (5, "slack")):
        c = constraint_status(_hist(np.full(n, 0.1), np.zeros(n), steps=np.arange(n)), M)
        assert c["status"] == status and c["n_window"] == (1 if n < 5 else 2), n


def test_nan_steps_are_dropped():
    h = _binding()
    d, b = h["delta_phi"].copy(), h["beta"].copy()
    b[41 - 1] = np.nan  # step 40: β nan, so the run ends at 39 → window 29.25..39 = steps 30..39
    d[33] = np.nan  # an odd step (−0.002) inside the window
    c = constraint_status(_hist(d, b), M)
    # 30..39 without 33: 9 steps, 5 even (+0.002), 4 odd (−0.002)
    assert c["status"] == "binds" and c["n_window"] == 9
    assert c["mean_delta"] == pytest.approx(M + 0.002 / 9)
    # nan steps before the first step do not move the window either
    h2 = _hist(np.r_[np.nan, _binding()["delta_phi"]], np.r_[np.nan, _binding()["beta"]], steps=np.r_[-100, STEPS])
    assert constraint_status(h2, M) == constraint_status(_binding(), M)
    # all nan: too short
    assert constraint_status(_hist(np.full(STEPS.size, np.nan), np.zeros(STEPS.size)), M)["status"] == "too short"


def test_zero_margin_uses_the_floor_band():
    c = constraint_status(_binding(m=0.0), 0.0)  # mean Δ 0.002/11, |·| ≤ 0.01
    assert c["status"] == "binds" and c["band"] == 0.01
    assert constraint_status(_hist(np.full(STEPS.size, 0.2), np.zeros(STEPS.size)), 0.0)["status"] == "slack"
    assert constraint_status(_hist(np.full(STEPS.size, -0.05), 0.05 * STEPS), 0.0)["status"] == "degenerates"
    # −0.005 is inside the floor band: β rising there is not "degenerates"
    c = constraint_status(_hist(np.full(STEPS.size, -0.005), 0.05 * STEPS), 0.0)
    assert c["status"] == "unsettled" and "β still rising" in c["reason"]


def test_unknown_margin():
    c = constraint_status(_binding(), None)
    assert c["status"] == "no m" and c["band"] is None and c["mean_delta"] == pytest.approx(M + 0.002 / 11)
    assert constraint_status(_binding(), float("nan"))["status"] == "no m"


def _run(hist, margin=M):
    return {"result": {"hparams": {"margin": margin}}, "history": hist}


def test_margin_dynamics_rows_table_and_summary():
    runs = {"lopd": {0: _run(_binding()), 1: _run(_binding()),
                     2: _run(_hist(np.full(STEPS.size, -0.02), 0.05 * STEPS))},
            "lopd_shuffled": {0: _run(_hist(np.full(STEPS.size, 0.1), np.zeros(STEPS.size)))},
            "lopd_nomargin": {0: _run(_hist(np.full(STEPS.size, 0.1), np.zeros(STEPS.size)), 0.0)}}
    info = margin_dynamics(runs)
    by = {(r["arm"], r["seed"]): r for r in info["rows"]}
    assert [by["lopd", s]["constraint"]["status"] for s in range(3)] == ["binds", "binds", "degenerates"]
    assert by["lopd_shuffled", 0]["constraint"]["status"] == "slack"
    assert by["lopd_nomargin", 0]["constraint"] is None  # reference arm
    assert by["lopd", 2]["flags"] == ["Δ never reaches m"]  # existing flags unchanged
    md = render_margin_dynamics(info)
    lines = md.splitlines()
    assert "| mean Δ (last 25%) | constraint (last 25%) | flags |" in md
    assert "band(m) = max(0.25·|m|, 0.01) nats (= 0.0125 at m = 0.0500)" in md
    assert f"β > ε = {BETA_ZERO:g} on ≥ 90% of the window's steps" in md and "**degenerates**" in md and "**slack**" in md
    lopd0 = next(l for l in lines if l.startswith("| lopd | 0 |"))
    assert lopd0.endswith(f"| {M + 0.002 / 11:.4f} | binds | — |")
    nm = next(l for l in lines if l.startswith("| lopd_nomargin |"))
    assert nm.endswith("| — | — | (reference, not flagged) |")
    assert "- lopd: binds in 2 of 3 runs, degenerates in 1" in lines
    assert "- lopd_shuffled: slack in 1 of 1 runs" in lines
    assert not any(l.startswith("- lopd_nomargin:") for l in lines)
