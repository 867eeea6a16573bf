"""H2, the paper's mechanism (``confirm.mechanism_controls``): registered only when S has a binding point, trained
at that point only (``slot_arms``), decided by the rule's own tests at that point, and rendered with its verdict,
a negative stated as a finding. The amended rule names the clean content control."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lopd.analysis.confirm_report import confirmation, mechanism_lines, render_confirmation
from lopd.analysis.confirmation import mechanism_rule
from lopd.confirmation import registration as regmod
from lopd.errors import BadInput
from tests.conftest import default_params

SEEDS = list(range(200, 210))
CONTROLS = ["lopd_frozen", "lopd_nomargin"]


def _points(binding: bool) -> list[dict]:
    pts = [{"name": "p0", "trial": 3, "role": "selected"}, {"name": "p1", "trial": 5, "role": "tied"}]
    return pts + ([{"name": "p2", "trial": 13, "role": "binding"}] if binding else [])


def _pilot(gap_frozen: float, gap_nomargin: float, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    b = {s: 0.3 + rng.normal(0, 0.01) for s in range(10)}
    return {"lopd_binding": b, "lopd_frozen": {s: v - gap_frozen + rng.normal(0, 0.04) for s, v in b.items()},
            "lopd_nomargin": {s: v - gap_nomargin + rng.normal(0, 0.04) for s, v in b.items()}}


def _part(points, controls=CONTROLS, pilot=None, n_seeds=32):
    return regmod.mechanism_part(points, controls, pilot_by_seed=pilot or _pilot(0.05, 0.05), alpha=0.05,
                                 effect=0.04, n_seeds=n_seeds, upper=0.8, n_sim=400)


def test_h2_is_registered_only_at_a_binding_point_and_only_with_controls():
    assert "binding point" in _part(_points(False))["why"]
    assert "empty" in _part(_points(True), controls=[])["why"]
    mech = _part(_points(True))
    assert (mech["point"], mech["trial"], mech["treatment"], mech["controls"]) == ("p2", 13, "lopd", CONTROLS)
    assert mech["design"]["tests"] == ["lopd_binding > lopd_frozen", "lopd_binding > lopd_nomargin"]
    # the selected point can be the binding one ("selected, binding"): H2 sits there
    assert _part([{"name": "p0", "trial": 3, "role": "selected, binding"}])["point"] == "p0"


def test_h2s_power_grows_with_the_seeds_and_needs_a_pilot():
    small, large = _part(_points(True), n_seeds=4)["design"], _part(_points(True), n_seeds=64)["design"]
    assert 0 <= small["power"] < large["power"] <= 1 and large["power"] > 0.9
    no_pilot = _part(_points(True), pilot={"lopd_binding": {0: 0.3}, "lopd_frozen": {0: 0.2}})
    assert "fewer than 3 seeds" in no_pilot["design"]["why"]


def test_h2s_controls_train_at_the_binding_slot_only():
    reg = {"points": _points(True), "arms": {"trained": ["lopd", "lopd_frozen", "lopd_nocontent"], "shared": ["base"]},
           "mechanism": _part(_points(True))}
    assert regmod.slot_arms(reg, 0) == ["lopd", "lopd_frozen", "lopd_nocontent", "base"]
    assert regmod.slot_arms(reg, 1) == ["lopd", "lopd_frozen", "lopd_nocontent"]
    assert regmod.slot_arms(reg, 2) == ["lopd", "lopd_frozen", "lopd_nocontent", "lopd_nomargin"]
    assert regmod.slot_arms({**reg, "mechanism": {"why": "no binding point"}}, 2) == reg["arms"]["trained"]


def _write_eval(root, point: str, arm: str, by_seed: dict) -> None:
    for s, v in by_seed.items():
        d = root / "confirm" / "eval" / point / arm / f"seed-{s}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "result.json").write_text(json.dumps({"point": point, "arm": arm, "seed": s, "test_reward": v,
                                                   "registration": "h"}))


@pytest.mark.parametrize("gap, holds", [(0.06, True), (-0.03, False)])
def test_h2_is_decided_at_its_point_by_the_rules_tests_and_a_negative_is_a_finding(tmp_path, gap, holds):
    """Planted data: at p2, lopd beats (or trails) lopd_frozen and lopd_nomargin by ``gap``; elsewhere lopd
    trails everything, which H2 must not see."""
    rng = np.random.default_rng(1)
    lopd = {s: 0.3 + rng.normal(0, 0.01) for s in SEEDS}
    _write_eval(tmp_path, "shared", "base", {s: 0.2 for s in SEEDS})
    for arm in ("lopd_frozen", "lopd_nomargin"):
        _write_eval(tmp_path, "p2", arm, {s: v - gap + rng.normal(0, 0.005) for s, v in lopd.items()})
        _write_eval(tmp_path, "p0", arm, {s: v + 0.2 for s, v in lopd.items()})
    _write_eval(tmp_path, "p2", "lopd", lopd)
    _write_eval(tmp_path, "p0", "lopd", lopd)
    reg = {"sha256": "h", "points": [{"name": "p0"}, {"name": "p2"}], "mechanism": {**_part(_points(True))},
           "rule": {"text": "r", "treatment": "lopd", "gain_over": ["base", "lopd_frozen"], "content_controls": [],
                    "rho": None, "rho_baseline": "base", "alpha": 0.05}}
    conf = confirmation(mechanism_rule(reg["mechanism"]), tmp_path, reg)
    h2 = conf["mechanism"]
    assert [t["name"] for t in h2["tests"]] == ["lopd > lopd_frozen", "lopd > lopd_nomargin"]
    assert all(t["n"] == len(SEEDS) for t in h2["tests"]) and h2["verdict"]["claim"] is holds
    assert h2["tests"][0]["diff"] == pytest.approx(gap, abs=0.01)
    text = "\n".join(mechanism_lines(reg["mechanism"], h2))
    assert ("**holds**" in text) is holds and ("registered negative" in text) is (not holds)
    assert "| lopd > lopd_nomargin | 10 |" in text and "registered power" in text


def test_h2_not_registered_or_without_results_says_so():
    assert mechanism_lines({}, None) == []
    assert "not registered:** S has no binding point" in mechanism_lines(_part(_points(False)), None)[0]
    assert "no verdict** (no confirmatory results at p2)" in mechanism_lines(_part(_points(True)), None)[0]


def test_the_report_names_the_ledger_entry_or_its_absence(tmp_path):
    from lopd.confirmation.ledger import entry_line
    from tests.conftest import REPO

    reg = {"sha256": "e076c854" + "0" * 56, "points": [], "rule": {}}
    absent = "\n".join(render_confirmation({"registration": reg, "problems": [], "why": "none", "ledger": None}, None))
    assert "not in `registration/ledger.yaml`" in absent
    first = entry_line(REPO, "6c3c30e333c4b8625e0cce01981804787f09e848b0a178d865a42644ee1eeb8f")
    assert first.startswith("read 1 of ") and "`a5ec95e`" in first and "fresh: it shares no split or seed" in first
    fifth = entry_line(REPO, "e076c8542f1e9d0df7e17a01da2a84de3e1991c869118b3412f7dc0841bed5c8")
    assert fifth.startswith("read 5 of ") and "`f700b03`" in fifth and "**not fresh**" in fifth and "4 of the 4" in fifth
    present = "\n".join(render_confirmation({"registration": reg, "problems": [], "why": "none", "ledger": fifth}, None))
    assert f"Ledger: {fifth}." in present
    assert entry_line(tmp_path, "e" * 64) is None


def test_mechanism_controls_are_validated_and_the_rule_names_the_clean_content_control():
    for bad in (["lopd"], ["base"], ["nonesuch"]):
        with pytest.raises(BadInput, match="mechanism_controls"):
            default_params({"confirm": {"mechanism_controls": bad}})
    p = default_params()
    assert "lopd_nocontent" in p.report.rule.content_controls and "lopd_nocontent" in p.report.rule.text
    assert p.confirm.mechanism_controls == CONTROLS


def test_a_run_that_reads_nothing_that_differs_is_trained_once():
    """shared_runs by hand: p0 and p1 differ only in m and η_β, so lopd_frozen (no margin) at p1 is p0's run while
    lopd and lopd_nocontent (they read m) train at both; p2 differs in K, so nothing there is shared; H2's
    lopd_nomargin trains at p2 only. trained_at leaves the shared run out; the report maps it back and says so."""
    pt = {"K": 8, "n_ret": 1, "lr_student": 0.005, "lr_frozen": 0.002}
    points = [{"name": "p0", "trial": 3, "role": "selected", "margin": 1.0, "eta_beta": 500.0, **pt},
              {"name": "p1", "trial": 5, "role": "tied", "margin": 2.0, "eta_beta": 50.0, **pt},
              {"name": "p2", "trial": 13, "role": "binding", "margin": 0.005, "eta_beta": 0.5, **pt, "K": 4}]
    reg = {"points": points, "arms": {"trained": ["lopd", "lopd_frozen", "lopd_nocontent"], "shared": ["base"]},
           "mechanism": {"point": "p2", "controls": CONTROLS}}
    assert regmod.shared_runs(reg) == {"p1": {"lopd_frozen": "p0"}}
    reg["shared_runs"] = regmod.shared_runs(reg)
    assert regmod.trained_at(reg, 0) == ["lopd", "lopd_frozen", "lopd_nocontent", "base"]
    assert regmod.trained_at(reg, 1) == ["lopd", "lopd_nocontent"]
    assert regmod.trained_at(reg, 2) == ["lopd", "lopd_frozen", "lopd_nocontent", "lopd_nomargin"]
    # a different lopd_frozen lr breaks the sharing: lr is read
    assert regmod.shared_runs({**reg, "points": [points[0], {**points[1], "lr_frozen": 0.01}]}) == {}
    from lopd.analysis.confirm_report import shared_run_lines

    assert "lopd_frozen at p1 is p0's run" in shared_run_lines(reg)[0]
    assert shared_run_lines({**reg, "shared_runs": {}})[0].startswith("No run is shared")


def test_the_report_counts_a_shared_run_at_both_points(tmp_path):
    from lopd.analysis.confirm_report import load_confirmation

    _write_eval(tmp_path, "p0", "lopd_frozen", {200: 0.3, 201: 0.4})
    _write_eval(tmp_path, "p1", "lopd", {200: 0.5, 201: 0.6})
    reg = {"sha256": "h", "points": [{"name": "p0"}, {"name": "p1"}], "shared_runs": {"p1": {"lopd_frozen": "p0"}}}
    by_point, problems = load_confirmation(tmp_path, reg)
    assert by_point["p1"]["lopd_frozen"] == by_point["p0"]["lopd_frozen"] == {200: 0.3, 201: 0.4} and not problems
