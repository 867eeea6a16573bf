"""The boundary rule's one step past an edge, by hand (lopd/hpo/boundary.py)."""

from __future__ import annotations

import json

import pytest

from lopd.hpo.boundary import AxisRule, extend, flag, next_choice

RULES = {"margin": AxisRule("ratio", floor=0.0), "K": AxisRule("ratio", floor=1, integer=True),
         "n_ret": AxisRule("difference", floor=1, integer=True), "lr_student": AxisRule("ratio")}
SPACE = {"margin": [0.0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0], "K": [4, 8, 16], "n_ret": [1, 2, 3, 4, 5],
         "lr_student": [0.001, 0.002, 0.005]}


def test_one_step_past_each_edge_by_hand():
    assert next_choice([0.001, 0.002, 0.005], "high", RULES["lr_student"]) == pytest.approx(0.0125)  # 0.005 · 0.005/0.002
    assert next_choice([0.001, 0.002, 0.005], "low", RULES["lr_student"]) == pytest.approx(0.0005)
    assert next_choice([4, 8, 16], "low", RULES["K"]) == 2 and next_choice([4, 8, 16], "high", RULES["K"]) == 32
    assert next_choice([1, 2, 3, 4, 5], "high", RULES["n_ret"]) == 6
    assert next_choice([1, 2, 3, 4, 5], "low", RULES["n_ret"]) is None  # 0 retrieved experiences: below the floor
    assert next_choice(SPACE["margin"], "low", RULES["margin"]) is None  # m = 0: the unconstrained objective
    assert next_choice(SPACE["margin"], "high", RULES["margin"]) == 2.0
    assert next_choice([1, 2], "low", RULES["K"]) is None  # K = 1 · 1/2 rounds to 0 < 1


def test_the_committed_selection_extends_three_axes_and_names_the_natural_bound():
    point = {"margin": 1.0, "K": 4, "n_ret": 2, "lr_student": 0.005}
    new, notes = extend(SPACE, point, RULES)
    assert new["margin"][-1] == 2.0 and new["K"] == [2, 4, 8, 16] and new["lr_student"][-1] == pytest.approx(0.0125)
    assert new["n_ret"] == SPACE["n_ret"]  # 2 is inside its range
    assert notes == ["margin: 1 is the highest choice; added 2", "K: 4 is the lowest choice; added 2",
                     "lr_student: 0.005 is the highest choice; added 0.0125"]
    assert flag(new, {"margin": 1.0, "K": 4, "n_ret": 2, "lr_student": 0.005}, RULES) == []  # interior now
    assert flag(new, {"margin": 2.0, "K": 2, "n_ret": 2, "lr_student": 0.005}, RULES) == ["margin", "K"]
    assert extend(SPACE, {"margin": 0.0, "K": 8, "n_ret": 1, "lr_student": 0.002}, RULES)[1] == [
        "margin: 0 is a natural bound", "n_ret: 1 is a natural bound"]


def test_natural_upper_bounds_and_divisors():
    k = AxisRule("ratio", floor=1, ceil=16, integer=True)
    assert next_choice([4, 8, 16], "high", k) is None  # past the cold start's k_max
    assert next_choice([1, 2, 4, 8], "high", k) == 16
    g = AxisRule("ratio", floor=2, ceil=16, integer=True, divides=16)
    assert next_choice([2, 4, 8], "high", g) == 16 and next_choice([4, 8, 16], "high", g) is None
    assert next_choice([2, 4, 8], "low", g) is None  # a group of 1 has no group-normalised advantage
    assert next_choice([3, 6], "high", AxisRule("ratio", integer=True, divides=16)) is None  # 12 does not divide 16
    assert extend({"group_size": [2, 4, 8]}, {"group_size": 8}, {"group_size": g})[0] == {"group_size": [2, 4, 8, 16]}


# --- the rule inside an arm's search (lopd.hpo.search.search_arm), with a toy objective instead of training ---

def _toy_search(workspace, tmp_path, monkeypatch, objective, **hpo):
    """sft's own search over its learning rate with ``objective(lr)`` as every seed's val reward (plus a seed's
    small offset); returns the selection and the study."""
    import math

    from lopd.hpo import batches as batches_mod
    from lopd.hpo.search import search_arm
    from lopd.population import points as points_mod
    from lopd.population.points import Score

    def reward(point, seed):
        return objective(point["lr_student"]) + 0.001 * math.sin(seed)

    def per_task(point, seed):
        return [reward(point, seed) + 0.01 * (i % 3 - 1) for i in range(6)]

    def fake_trials(params, res, arm, trials, points, *, seeds, **kw):
        return [batches_mod.Outcome(sum(reward(p, s) for s in seeds) / len(seeds),
                                    attrs={"val_per_task": [sum(x) / len(x) for x in zip(*(per_task(p, s) for s in seeds))],
                                           "val_per_seed": [reward(p, s) for s in seeds]}) for p in points]

    def fake_points(params, res, arm, points, seeds, **kw):
        return [[Score(reward(p, s), per_task(p, s)) for s in seeds] for p in points]

    monkeypatch.setattr(batches_mod, "train_trials", fake_trials)
    monkeypatch.setattr(points_mod, "train_points", fake_points)
    p = workspace.params(hpo={"lr_choices": [0.001, 0.002, 0.004], "n_trials": 4, "seeds_per_trial": 2,
                              "rerun_top": 2, "rerun_seeds": 2, "trials_per_extension": 2, **hpo})
    dep = tmp_path / "dep.txt"
    dep.write_text("x")
    _, study = search_arm(p, None, "sft", ["lr_student"], tmp_path, storage=str(tmp_path / "journal.log"),
                          dep_files=[dep])
    return json.loads((tmp_path / "selection.json").read_text()), study


def test_the_rule_extends_an_edge_and_flags_it_after_the_last_extension(workspace, tmp_path, monkeypatch):
    sel, study = _toy_search(workspace, tmp_path, monkeypatch, lambda lr: lr, max_extensions=2)
    rule = sel["boundary_rule"]
    assert [e["notes"] for e in rule["extensions"]] == [["lr_student: 0.004 is the highest choice; added 0.008"],
                                                        ["lr_student: 0.008 is the highest choice; added 0.016"]]
    assert rule["flag"] == ["lr_student"] and sel["point"]["lr_student"] == pytest.approx(0.016)
    assert sel["space"]["lr_student"] == pytest.approx([0.001, 0.002, 0.004, 0.008, 0.016])
    # the whole grid (3 points, within the budget of 4), then one new point per extension: no point twice
    pts = [t.params["lr_student"] for t in study.get_trials()]
    assert len(pts) == 5 and len(set(pts)) == 5


def test_the_rule_stops_once_the_selection_is_inside(workspace, tmp_path, monkeypatch):
    import math

    sel, _ = _toy_search(workspace, tmp_path, monkeypatch, lambda lr: -math.log(lr / 0.008) ** 2, max_extensions=3)
    rule = sel["boundary_rule"]
    assert len(rule["extensions"]) == 2 and rule["flag"] == []  # 0.008 added, selected, then 0.016 added: inside
    assert sel["point"]["lr_student"] == pytest.approx(0.008)


def test_no_extension_is_registered_none_is_made(workspace, tmp_path, monkeypatch):
    sel, _ = _toy_search(workspace, tmp_path, monkeypatch, lambda lr: lr, max_extensions=0)
    assert sel["boundary_rule"]["extensions"] == [] and sel["boundary_rule"]["flag"] == ["lr_student"]


def test_points_group_by_group_size_in_first_seen_order():
    from lopd.hpo.study import by_group_size

    pts = [{"lr_student": 0.1, "group_size": 4}, {"lr_student": 0.2, "group_size": 2},
           {"lr_student": 0.3, "group_size": 4}]
    assert by_group_size(pts) == [[0, 2], [1]]
    assert by_group_size([{"K": 4}, {"K": 8}]) == [[0, 1]]  # no group size: one population


def _toy_knob(workspace, tmp_path, monkeypatch, reward, choices, **hpo):
    """lopd_fixbeta's held-β grid through ``tune_baselines`` with ``train_points`` replaced by ``reward(β)``
    (hand-made val rewards, two seeds alike): returns its baselines.yaml entry and the β values trained, call by
    call."""
    import yaml

    from lopd.hpo import search
    from lopd.population import points as points_mod
    from lopd.population.points import Score

    calls = []

    def fake(params, res, arm, pts, seeds, **kw):
        calls.append([pt["beta_fixed"] for pt in pts])
        return [[Score(reward(pt["beta_fixed"]), [reward(pt["beta_fixed"])]) for _ in seeds] for pt in pts]

    monkeypatch.setattr(points_mod, "train_points", fake)
    p = workspace.params(hpo={"baseline_arms": ["lopd_fixbeta"], "beta_fixed_choices": choices,
                              "seeds_per_trial": 2, **hpo})
    sel = {"margin": 0.05, "K": 4, "n_ret": 1, "lr_student": 0.003}
    out = search.tune_baselines(p, None, sel, tmp_path)
    assert yaml.safe_load((tmp_path / "baselines.yaml").read_text()) == out
    return out["lopd_fixbeta"], calls


def test_a_held_beta_on_the_top_edge_is_extended_then_flagged(workspace, tmp_path, monkeypatch):
    """Val reward rising with β: 50 (the top of 1, 5, 25, 50) extends by the grid's ratio there, 50/25: 100, then
    200; after max_extensions = 2 the selected 200 is still on the edge and is flagged. Each extension trains
    only its new value."""
    got, calls = _toy_knob(workspace, tmp_path, monkeypatch, lambda b: b / 1000, [1.0, 5.0, 25.0, 50.0],
                           max_extensions=2)
    assert calls == [[1.0, 5.0, 25.0, 50.0], [100.0], [200.0]]
    assert got["beta_fixed"] == 200.0 and set(got["values"]) == {"1.0", "5.0", "25.0", "50.0", "100.0", "200.0"}
    rule = got["boundary_rule"]
    assert [e["notes"] for e in rule["extensions"]] == [["beta_fixed: 50 is the highest choice; added 100"],
                                                       ["beta_fixed: 100 is the highest choice; added 200"]]
    assert rule["flag"] == ["beta_fixed"]


def test_a_held_beta_stops_inside_and_zero_is_a_natural_bound(workspace, tmp_path, monkeypatch):
    """A peak at 50 found by the first extension (100 scores less): the rule stops there, unflagged. A grid
    whose best is β = 0 (no weight on φ's Δ term) is at a natural bound: no extension, no flag."""
    got, calls = _toy_knob(workspace, tmp_path, monkeypatch, lambda b: -abs(b - 50.0), [5.0, 25.0, 50.0],
                           max_extensions=2)
    assert calls == [[5.0, 25.0, 50.0], [100.0]] and got["beta_fixed"] == 50.0
    assert got["boundary_rule"]["flag"] == [] and len(got["boundary_rule"]["extensions"]) == 1
    got, calls = _toy_knob(workspace, tmp_path, monkeypatch, lambda b: -b, [0.0, 5.0, 25.0], max_extensions=2)
    assert calls == [[0.0, 5.0, 25.0]] and got["beta_fixed"] == 0.0
    assert got["boundary_rule"] == {"max_extensions": 2, "extensions": [], "flag": [],
                                    "natural_bounds": ["beta_fixed"]}


def test_the_report_shows_the_held_betas_grid_and_its_flag():
    """search.md's section for a one-knob grid: every value's val reward, the selected one, each extension and
    the flag."""
    from lopd.analysis.hpo_report import _knob_sections

    b = {"knob": "beta_fixed", "beta_fixed": 100.0, "value": 0.5, "values": {"25.0": 0.4, "50.0": 0.45, "100.0": 0.5},
         "boundary_rule": {"max_extensions": 1, "flag": ["beta_fixed"], "natural_bounds": [],
                           "extensions": [{"after_values": 2, "selected": 50.0,
                                           "notes": ["beta_fixed: 50 is the highest choice; added 100"]}]}}
    runs = [{"arm": "lopd_fixbeta", "seed": s} for s in (1000, 1001)]
    md = "\n".join(_knob_sections({"baselines": {"lopd_fixbeta": b, "sft": {"knob": "search"}},
                                   "baseline_runs": runs}))
    assert "## lopd_fixbeta's held β (one knob's grid)" in md and "sft" not in md
    assert "3 values on val, each the mean of 2 seeds' runs; selected: 100" in md
    assert "| 100.0 | 0.5000 | **selected** |" in md
    assert "- extension 1, after 2 values (selected then: 50): beta_fixed: 50 is the highest choice; added 100" in md
    assert "**Flagged: after the last extension the selected held β = 100 is still on an edge" in md
