"""reports/search.md's margin behaviour per trial (lopd/analysis/hpo_report.py), on hand-made margin paths."""

from __future__ import annotations

from lopd.analysis.hpo_report import render_search, trial_margins
from lopd.analysis.search_record import Selection


def _paths(trial: int, m: float, beta, delta, seeds=(1000, 1001)) -> list[dict]:
    return [{"trial": trial, "seed": s, "margin": m, "step": i + 1, "beta": beta(i), "delta_phi": delta(i)}
            for s in seeds for i in range(40)]


RAMP = _paths(0, 1.0, lambda i: 0.5 * (i + 1), lambda i: 0.05)  # Δ far below m: β grows η_β·m per step
BINDS = _paths(1, 0.05, lambda i: min(0.1 * (i + 1), 2.0), lambda i: 0.05 + (0.004 if i % 2 else -0.004))


def test_each_trials_status_per_seed_and_its_beta_path():
    t = trial_margins(RAMP + BINDS)
    assert t["0"]["status"] == ["degenerates", "degenerates"] and t["1"]["status"] == ["binds", "binds"]
    assert abs(t["0"]["beta_per_step"] - 0.5) < 1e-9 and t["0"]["beta_final"] == 20.0
    assert abs(t["0"]["max_delta"] - 0.05) < 1e-12 and t["1"]["beta_path"][-1] == 2.0


def _search(selected: int, rows: list[dict]) -> dict:
    sel = Selection.from_json({"rule": "best", "alpha": 0.05, "runner_up": None, "selected": selected, "best": selected,
                               "by_rule": False, "boundary": {}, "point": {"margin": 1.0}, "value": 0.4,
                               "tied": [selected], "vs_best": {}, "tie_count": 1, "distinguishable": True})
    trials = [{"number": str(n), "state": "COMPLETE", "value": "0.4", "margin": str(r[0]["margin"])}
              for n, r in ((0, RAMP), (1, BINDS))]
    return {"selection": sel, "trials": trials, "baselines": {}, "margins": trial_margins(rows)}


def test_a_selected_point_whose_margin_degenerates_is_called_a_beta_ramp():
    md = render_search(_search(0, RAMP + BINDS), {})
    assert "constraint's status is **degenerates ×2**" in md and "The tested objective is a β ramp" in md
    assert "does not cap β" in md and "| degenerates ×2 | 0.0500 | 20.00 |" in md
    assert "Trials whose margin binds in at least one seed: 1." in md


def test_a_binding_selected_point_is_not_called_a_ramp_and_no_binding_trial_is_said():
    md = render_search(_search(1, RAMP + BINDS), {})
    assert "constraint's status is **binds ×2**" in md and "β ramp" not in md
    md = render_search(_search(0, RAMP), {})
    assert "**No trial's margin binds.** The largest Δ(φ) any run reached is 0.0500 (trial 0)" in md
