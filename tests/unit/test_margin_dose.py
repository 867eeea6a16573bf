"""The margin's dose-response: the sensitivity grid's points (lopd.stages.sensitivity.grid_points) and the
report's table (lopd.analysis.dose) on hand-built rows with hand-computed expectations."""

from __future__ import annotations

import types

import pytest

from lopd.analysis.dose import dose_response, dose_rows, line_name, render_dose_response
from lopd.stages.sensitivity import GRID_COLUMNS, grid_points
from lopd.utils import write_csv

SEL = {"margin": 0.05, "K": 4, "n_ret": 2, "lr_student": 0.002, "eta_beta": 5.0}


def test_grid_points_cross_each_positive_margin_with_the_other_eta_betas():
    sp = types.SimpleNamespace(margins=[0.0, 0.05, 0.2], ks=[8], n_rets=[1], eta_betas=[0.5, 5.0, 50.0])
    grid = grid_points(SEL, sp)
    one_at_a_time = [(a, p) for a, p in grid if a != "dose"]
    assert [(a, p[a]) for a, p in one_at_a_time] == [("margin", 0.0), ("margin", 0.05), ("margin", 0.2), ("K", 8),
                                                     ("n_ret", 1)]
    assert all(p["eta_beta"] == 5.0 for _, p in one_at_a_time)  # the selected η_β: the margin axis is its line
    dose = [(p["eta_beta"], p["margin"]) for a, p in grid if a == "dose"]
    # m = 0 is not crossed (β stays 0 whatever η_β while Δ ≥ 0); the selected η_β is not repeated
    assert dose == [(0.5, 0.05), (0.5, 0.2), (50.0, 0.05), (50.0, 0.2)]
    assert all(p["K"] == 4 and p["n_ret"] == 2 and p["lr_student"] == 0.002 for a, p in grid if a == "dose")
    sp.eta_betas = []
    assert [a for a, _ in grid_points(SEL, sp)] == ["margin"] * 3 + ["K", "n_ret"]


def _grid(tmp_path):
    rows = []
    def add(axis, arm, m, eta, seed, y, status):
        rows.append({"axis": axis, "arm": arm, "margin": m, "K": 4, "n_ret": 2, "lr_student": 0.002, "eta_beta": eta,
                     "seed": seed, "val_reward": y, "constraint": status})
    for seed, (y0, y1) in enumerate(((0.30, 0.40), (0.34, 0.44))):
        add("margin", "lopd", 0.0, 5.0, seed, 0.20, "slack")
        add("margin", "lopd", 0.05, 5.0, seed, y0, "binds")
        add("dose", "lopd", 0.05, 50.0, seed, y1, "binds" if seed == 0 else "degenerates")
        add("K", "lopd", 0.05, 5.0, seed, 0.9, "binds")  # not the margin's: left out
        add("reference", "lopd_frozen", 0.05, 5.0, seed, 0.25 + 0.02 * seed, None)
    write_csv(tmp_path / "results" / "sensitivity" / "grid.csv", rows, GRID_COLUMNS)


def test_dose_rows_and_summary_by_hand(tmp_path):
    _grid(tmp_path)
    rows = dose_rows(tmp_path)
    lopd = [r for r in rows if r["eta_beta"] is not None]
    assert len(lopd) == 6 and {r["arm"] for r in lopd} == {line_name(5.0), line_name(50.0)}
    refs = [r for r in rows if r["arm"] == "lopd_frozen"]
    assert sorted((r["margin"], r["val_reward"]) for r in refs) == [(0.0, 0.25), (0.0, 0.27), (0.05, 0.25),
                                                                    (0.05, 0.27)]  # at every grid m: a flat line
    info = dose_response(rows)
    # η_β = 5, m = 0.05: (0.30, 0.34): mean 0.32, sd 0.028284, t_{.975,1} = 12.7062, half 12.7062·0.028284/√2 = 0.25412
    c = info["lines"][5.0][0.05]
    assert c["n"] == 2 and c["mean"] == pytest.approx(0.32) and c["ci_half"] == pytest.approx(0.25412, abs=1e-4)
    assert info["lines"][50.0][0.05]["statuses"] == ["binds", "degenerates"]
    assert info["references"]["lopd_frozen"]["n"] == 2  # the repeated rows counted once per seed
    assert info["references"]["lopd_frozen"]["mean"] == pytest.approx(0.26)
    md = render_dose_response(info, SEL)
    assert "| m | η_β = 5 | η_β = 50 |" in md
    assert "| 0.05 | 0.3200 ± 0.254 (binds ×2) | 0.4200 ± 0.254 (binds, degenerates) |" in md
    assert "| 0 | 0.2000 ± 0.000 (slack ×2) | — |" in md
    assert "| lopd_frozen | 0.2600 ± 0.127 | 2 |" in md
    # binds in at least half the runs: (5, 0.05) both, (50, 0.05) one of two
    assert "at 2 of 3 grid points: m = 0.05, η_β = 5, m = 0.05, η_β = 50." in md


def test_no_margin_runs_say_so(tmp_path):
    write_csv(tmp_path / "results" / "sensitivity" / "grid.csv", [], GRID_COLUMNS)
    md = render_dose_response(dose_response(dose_rows(tmp_path)), None)
    assert "MISSING: results/sensitivity/grid.csv has no margin runs" in md
