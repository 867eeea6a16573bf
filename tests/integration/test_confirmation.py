"""The confirmation (lopd.confirmation, lopd.analysis.confirmation): the amended rule on planted data, S from
the search's val outputs only, the registration's seal, the sealed confirmatory split and the stage that
refuses to read it without a registration. Hand-made inputs only (no pipeline); the smoke pipeline's
confirmation is checked in tests/e2e/test_pipeline.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from lopd.analysis.confirmation import NO_CLAIM, POINT_DEPENDENT, ROBUST, analyse_amended, decide_amended
from lopd.analysis.falsification import Rule
from lopd.confirmation import registration as regmod
from lopd.confirmation.split import ROLE, ConfirmReader, generate_confirm, solution_key
from lopd.errors import BadInput, SplitAccessError
from tests.conftest import default_params

RULE = Rule("registered", "lopd", ("base", "lopd_frozen"), ("lopd_shuffled", "lopd_unrelated"), None, "base", 0.05)
SEEDS = list(range(10))


def _arms(effect_by_arm: dict[str, float], noise: float, rng) -> dict[str, dict[int, float]]:
    """Per-seed values: lopd at 0.5 + a seed effect; each other arm at lopd − its gap, with small noise."""
    seed_fx = rng.normal(0, 0.02, len(SEEDS))
    lopd = 0.5 + seed_fx
    out = {"lopd": dict(zip(SEEDS, lopd))}
    for arm, gap in effect_by_arm.items():
        out[arm] = dict(zip(SEEDS, lopd - gap + rng.normal(0, noise, len(SEEDS))))
    return out


def _point(gap: float, rng, base=None) -> dict:
    arms = _arms({"lopd_frozen": gap, "lopd_shuffled": gap, "lopd_unrelated": gap}, 0.005, rng)
    arms["base"] = base
    return arms


def test_the_amended_rule_labels_planted_data():
    rng = np.random.default_rng(0)
    base = dict(zip(SEEDS, 0.2 + rng.normal(0, 0.005, len(SEEDS))))  # shared: far below every lopd
    robust = {f"p{i}": _point(0.05, rng, base) for i in range(3)}
    assert analyse_amended(RULE, robust)["label"] == ROBUST
    # one point with no gap over its controls: the average still holds (two points +0.05), that point does not
    dep = {**robust, "p2": _point(0.0, rng, base)}
    a = analyse_amended(RULE, dep)
    assert a["primary"]["verdict"]["claim"] and not a["every"] and a["label"] == POINT_DEPENDENT
    # the average fails (gaps +0.05, −0.05, −0.05) while one point holds: point-dependent too
    mixed = {"p0": _point(0.05, rng, base), "p1": _point(-0.05, rng, base), "p2": _point(-0.05, rng, base)}
    a = analyse_amended(RULE, mixed)
    assert not a["primary"]["verdict"]["claim"] and a["some"] and a["label"] == POINT_DEPENDENT
    none = {f"p{i}": _point(-0.02, rng, base) for i in range(3)}
    assert analyse_amended(RULE, none)["label"] == NO_CLAIM


def test_the_primary_averages_contrasts_over_points_by_hand():
    """Two points, two seeds: the primary's lopd − lopd_frozen estimate is the mean over seeds of the
    per-seed contrast averaged over points, computed here by hand."""
    base = {0: 0.1, 1: 0.1}
    p0 = {"lopd": {0: 0.5, 1: 0.6}, "lopd_frozen": {0: 0.4, 1: 0.4}, "lopd_shuffled": {0: 0.3, 1: 0.3},
          "lopd_unrelated": {0: 0.3, 1: 0.3}, "base": base}
    p1 = {"lopd": {0: 0.3, 1: 0.5}, "lopd_frozen": {0: 0.3, 1: 0.2}, "lopd_shuffled": {0: 0.3, 1: 0.3},
          "lopd_unrelated": {0: 0.3, 1: 0.3}, "base": base}
    a = analyse_amended(RULE, {"p0": p0, "p1": p1})
    frozen = next(t for t in a["primary"]["tests"] if t["name"] == "lopd > lopd_frozen")
    # seed 0: (0.1 + 0.0) / 2 = 0.05; seed 1: (0.2 + 0.3) / 2 = 0.25; mean 0.15
    assert frozen["diff"] == pytest.approx(0.15)
    assert a["seeds"] == [0, 1]
    # the exact sign-flip p beside the t-test's: contrasts (0.05, 0.25), 4 sign patterns, only (+, +) sums to ≥ 0.30
    assert frozen["p_exact"] == pytest.approx(0.25)
    from lopd.analysis.confirmation import spec_curve_rows

    rows = spec_curve_rows(a, [{"name": "p0", "trial": 0}, {"name": "p1", "trial": 1}])
    primary = next(r for r in rows if r["role"] == "primary" and r["test"] == "lopd > lopd_frozen")
    assert primary["p_exact"] == pytest.approx(0.25)
    # at p0 alone: contrasts (0.1, 0.2): again only (+, +) reaches 0.3
    assert next(r for r in rows if r["point"] == "p0" and r["test"] == "lopd > lopd_frozen")["p_exact"] == pytest.approx(0.25)


def test_decide_amended_is_the_rule_on_each_point_and_on_the_average():
    rng = np.random.default_rng(1)
    by_point = [{a: rng.normal(0.5 if a == "lopd" else 0.4, 0.05, (7, 10)) for a in RULE.arms()} for _ in range(3)]
    d = decide_amended(by_point, RULE)
    labels = set(np.unique(d["label"]))
    assert labels <= {ROBUST, POINT_DEPENDENT, NO_CLAIM}
    assert np.array_equal(d["label"] == ROBUST, d["primary"]["claim"] & d["every"])
    with pytest.raises(ValueError, match="S is empty"):
        decide_amended([], RULE)


def test_the_amended_rule_keeps_its_level_under_the_null():
    """All contrasts 0 at every point, 3 correlated points, 10 seeds: the primary claims in at most α of
    2000 simulated experiments (binomial upper bound), and the robust label no more often."""
    rng = np.random.default_rng(2)
    n_sim, n = 2000, 10
    shared = rng.normal(0, 0.05, (n_sim, n))  # a seed effect shared by every arm and point
    by_point = []
    base = 0.3 + shared + rng.normal(0, 0.02, (n_sim, n))
    for _ in range(3):
        pt = {a: 0.4 + shared + rng.normal(0, 0.03, (n_sim, n)) for a in RULE.arms() if a != "base"}
        pt["base"] = base  # lopd > base holds by 0.1: the least favourable null is in the content tests
        by_point.append(pt)
    d = decide_amended(by_point, RULE)
    from scipy import stats
    k = int(d["primary"]["claim"].sum())
    assert stats.binomtest(k, n_sim, 0.05, alternative="greater").pvalue > 0.01, k
    assert (d["label"] == ROBUST).sum() <= k


TRIALS = [{"number": str(n), "value": str(v), "margin": str(m), "K": str(k), "n_ret": str(r), "lr_student": "0.005"}
          for n, v, m, k, r in [(0, 0.40, 1.0, 4, 2), (1, 0.41, 1.0, 8, 5), (2, 0.42, 1.0, 8, 5),
                                (3, 0.43, 0.5, 4, 5), (4, 0.30, 0.01, 4, 2)]]
SELECTION = {"rule": "best", "alpha": 0.05, "unit": "seed", "best": 0, "selected": 0, "point": {}, "value": 0.45,
             "tied": [0, 1, 2, 3], "tie_count": 4, "runner_up": None, "distinguishable": False, "by_rule": False,
             "boundary": {}, "vs_best": {},
             "intervals": {"0": {"mean": 0.45}, "1": {"mean": 0.44}, "2": {"mean": 0.44}, "3": {"mean": 0.43}},
             "per_seed": {str(n): [0.4] * 6 for n in range(4)}}


def _selection(binding):
    """SELECTION as the register stage reads hpo/selection.json, with ``binding`` (absent: no key)."""
    from lopd.analysis.search_record import Selection

    return Selection.from_json(SELECTION if binding == "absent" else {**SELECTION, "binding": binding})


def test_s_is_the_selected_point_its_seed_ties_and_the_binding_point_capped_by_val_rank():
    pts, notes = regmod.points_of_s(_selection({"trial": 4}), TRIALS, None, 0.002, cap=3)
    assert [(p["trial"], p["role"]) for p in pts] == [(0, "selected"), (1, "tied"), (4, "binding")]
    assert pts[0]["lr_frozen"] == 0.002 and [p["name"] for p in pts] == ["p0", "p1", "p2"]
    assert any("repeats trial 1" in x for x in notes)  # trial 2 is trial 1's point
    assert any("trial 3" in x and "S is full" in x for x in notes)
    pts, notes = regmod.points_of_s(_selection({"trial": None, "reason": "none binds"}), TRIALS, None, None, cap=3)
    assert [p["trial"] for p in pts] == [0, 1, 3]
    assert pts[1]["lr_frozen"] == pts[1]["lr_student"]  # lopd_frozen untuned: the point's lr
    assert any("none binds" in x for x in notes)
    for binding in (None, "absent"):  # another arm's search; a search written before the binding point
        assert [p["trial"] for p in regmod.points_of_s(_selection(binding), TRIALS, None, None, cap=1)[0]] == [0]


def test_s_reads_only_the_search_outputs():
    """points_of_s takes the search's selection (the binding point in it), trials and margins (all val): its
    signature has no place for a test result, and the register stage passes it nothing else (checked by reading
    the stage)."""
    import inspect

    from lopd.stages import register

    assert list(inspect.signature(regmod.points_of_s).parameters) == ["selection", "trials", "margins",
                                                                       "frozen_lr", "cap"]
    src = inspect.getsource(register.run)
    call = src[src.index("regmod.points_of_s("):].split("\n")[0]
    assert "eval" not in call and "test" not in call


def test_the_registration_seal_catches_any_change(tmp_path):
    reg = regmod.seal({"rule": {"text": "r"}, "points": [{"trial": 1}], "arms": {"trained": ["lopd"]}, "seeds": [100],
                       "effect": 0.04, "design": {}, "confirm_split": {"sha256": "x"}})
    path = tmp_path / "registration.json"
    path.write_text(json.dumps(reg))
    assert regmod.load(path)["sha256"] == reg["sha256"]
    for part, value in (("seeds", [101]), ("effect", 0.02), ("points", [{"trial": 2}])):
        path.write_text(json.dumps({**reg, part: value}))
        with pytest.raises(BadInput, match="altered after registration"):
            regmod.load(path)
    path.unlink()
    with pytest.raises(BadInput, match="not registered"):
        regmod.load(path)


def test_confirm_evaluate_refuses_without_a_valid_registration(tmp_path):
    from lopd.paths import Paths
    from lopd.stages import confirm_evaluate

    params = default_params({"confirm": {"slots": [0], "seeds": [100]}})
    paths = Paths(tmp_path)
    (tmp_path / "data" / "confirm").mkdir(parents=True)
    (tmp_path / "data" / "confirm" / "manifest.json").write_text("{}")
    with pytest.raises(BadInput, match="not registered"):
        confirm_evaluate.run(params, paths)
    reg = regmod.seal({"points": [{"name": "p0"}], "arms": {"trained": ["lopd"], "shared": []}, "seeds": [100],
                       "confirm_split": {"manifest_sha256": "0" * 64}})
    paths.registration.parent.mkdir(parents=True)
    paths.registration.write_text(json.dumps(reg))
    with pytest.raises(BadInput, match="not trained under the current registration"):
        confirm_evaluate.run(params, paths)
    paths.confirm_runs(0).mkdir(parents=True)
    (paths.confirm_runs(0) / "registration.json").write_text(json.dumps({"sha256": "another"}))
    with pytest.raises(BadInput, match="not trained under the current registration"):
        confirm_evaluate.run(params, paths)
    assert not paths.confirm_eval.exists()


def test_the_confirmatory_split_is_sealed(tmp_path):
    for role in ("evaluate", "train", "hpo", "report"):
        with pytest.raises(SplitAccessError, match="confirmatory split is sealed"):
            ConfirmReader(tmp_path, role)
    with pytest.raises(BadInput, match="manifest not found"):
        ConfirmReader(tmp_path, ROLE)
    from lopd import data as data_mod

    with pytest.raises(BadInput, match="unknown split 'confirm'"):
        data_mod.SplitReader.__new__(data_mod.SplitReader).load("confirm")


def test_the_confirmatory_split_shares_no_prompt_or_solution_with_the_sealed_splits(tmp_path):
    from lopd import data as data_mod
    from lopd.envs import make_env

    params = default_params({"envs": {"n_train": 48, "n_val": 16, "n_test": 16, "n_target_worlds": 4,
                                      "n_pretrain_worlds": 96}})
    splits = data_mod.generate_splits(params.envs)
    manifest = data_mod.write_splits(tmp_path, splits)
    tasks, audit = generate_confirm(params.envs, 16, manifest)
    envs = {d: make_env(d, params.envs) for d in params.envs.domains}
    sealed = [t for ts in splits.values() for t in ts]
    prompts = {data_mod.content_key(t) for t in sealed}
    sols = {solution_key(envs[t.domain], t) for t in sealed}
    assert len(tasks) == 16 * len(params.envs.domains)
    assert not {data_mod.content_key(t) for t in tasks} & prompts
    assert not {solution_key(envs[t.domain], t) for t in tasks} & sols
    assert len({solution_key(envs[t.domain], t) for t in tasks}) == len(tasks)
    assert audit["pilot_test_n"] == 32
    twins = sum(solution_key(envs[t.domain], t) in {solution_key(envs[x.domain], x) for x in splits["train"]}
                for t in splits["test"])
    assert audit["pilot_test_solution_twins"] == twins
    # a later round is a fresh split: none of round 0's prompts or solutions, nor the sealed splits'
    again, _ = generate_confirm(params.envs, 16, manifest, 0)
    assert [t.to_json() for t in again] == [t.to_json() for t in tasks]  # round 0 is the split of before
    fresh, audit1 = generate_confirm(params.envs, 16, manifest, 1)
    assert len(fresh) == len(tasks) and audit1["split_round"] == 1 and "split_round" not in audit
    assert not {data_mod.content_key(t) for t in fresh} & ({data_mod.content_key(t) for t in tasks} | prompts)
    assert not {solution_key(envs[t.domain], t) for t in fresh} & ({solution_key(envs[t.domain], t) for t in tasks} | sols)
    # splits on disk that these params do not make: nothing is generated
    manifest["files"]["val"]["content"] = manifest["files"]["val"]["content"][::-1]
    with pytest.raises(BadInput, match="content keys differ"):
        generate_confirm(params.envs, 16, manifest)


def test_register_refuses_a_split_or_seed_an_earlier_registration_read(tmp_path):
    """The ledger (registration/ledger.yaml) is a dependency of register: a registration whose split (manifest md5)
    or any seed an earlier registration read is refused, exit 2, naming it; its own entry (the same hash) and a
    fresh split with fresh seeds pass. Planted fault: the call to the ledger removed from register; then nothing
    is refused and this test fails on its first ``pytest.raises``."""
    import hashlib

    from lopd.paths import Paths
    from lopd.stages.register import _refuse_earlier_reads

    paths = Paths(tmp_path)
    paths.confirm_split.mkdir(parents=True)
    manifest = paths.confirm_split / "manifest.json"
    manifest.write_text('{"file": "round 0"}\n')
    md5 = hashlib.md5(manifest.read_bytes()).hexdigest()
    (tmp_path / "registration").mkdir()
    (tmp_path / "registration" / "ledger.yaml").write_text(yaml.safe_dump({"reads": [{
        "registration": "a" * 64, "commit": "c" * 40, "date": "2026-12-04", "points": [], "seeds": [100, 101],
        "split_manifest_md5": md5, "verdict": "v", "label": "robust to selection"}]}))
    with pytest.raises(BadInput, match=r"not be fresh: registration aaaaaaaaaaaa… .* read the same split and seed\(s\) 100"):
        _refuse_earlier_reads(paths, {"sha256": "b" * 64, "seeds": [100, 200]})
    manifest.write_text('{"file": "round 1"}\n')  # a fresh split, but a seed read before
    with pytest.raises(BadInput, match=r"read seed\(s\) 101: verdict 'v'"):
        _refuse_earlier_reads(paths, {"sha256": "b" * 64, "seeds": [101, 200]})
    _refuse_earlier_reads(paths, {"sha256": "b" * 64, "seeds": [200, 201]})  # fresh: passes
    manifest.write_text('{"file": "round 0"}\n')
    _refuse_earlier_reads(paths, {"sha256": "a" * 64, "seeds": [100, 101]})  # its own read, not an earlier one


def test_the_committed_design_is_fresh_by_the_ledger():
    """The default confirm.seeds and confirm.split_round were read by no registration but the one the committed
    report names (its own read, the ledger's last entry): a clean repro of the committed tree can register."""
    import re

    from lopd.confirmation import ledger
    from tests.conftest import REPO

    raw = yaml.safe_load((REPO / "params.yaml").read_text())["confirm"]
    named = re.search(r"Registration: sha256 `([0-9a-f]{64})`", (REPO / "reports" / "falsification.md").read_text())
    own = named.group(1) if named else None
    read = {s for r in ledger.load(REPO / ledger.LEDGER) if r.registration != own for s in r.seeds}
    assert not read & set(raw["seeds"]) and raw["split_round"] >= 1


def test_confirm_params_are_validated():
    with pytest.raises(BadInput, match="fresh"):
        default_params({"confirm": {"seeds": [0, 100]}})
    with pytest.raises(BadInput, match="slots of S"):
        default_params({"confirm": {"slots": [1, 2]}})


def test_the_leakage_audit_flags_a_confirmatory_read_outside_confirm_evaluate(tmp_path):
    import yaml

    from lopd.analysis.audits import _declared_problems, _dvc_deps

    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {
        "hpo": {"cmd": "lopd hpo", "deps": ["data/splits/val.jsonl"]},
        "register": {"cmd": "lopd register", "deps": ["data/confirm/manifest.json"]},
        "confirm_evaluate": {"cmd": "lopd confirm-evaluate", "deps": ["registration/registration.json", "data/confirm"]}}}))
    assert _declared_problems(_dvc_deps(tmp_path)) == ([], [])
    doc = yaml.safe_load((tmp_path / "dvc.yaml").read_text())
    doc["stages"]["train"] = {"cmd": "lopd train", "deps": ["data/confirm"]}
    doc["stages"]["confirm_evaluate"]["deps"] = ["data/confirm"]
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(doc))
    violations, _ = _declared_problems(_dvc_deps(tmp_path))
    assert any("`train` depends on the confirmatory split" in v for v in violations)
    assert any("`confirm_evaluate` does not depend on registration" in v for v in violations)


def test_a_missing_run_drops_its_seed_everywhere_and_is_named():
    rng = np.random.default_rng(4)
    base = dict(zip(SEEDS, 0.2 + rng.normal(0, 0.005, len(SEEDS))))
    pts = {f"p{i}": _point(0.05, rng, base) for i in range(2)}
    del pts["p1"]["lopd_frozen"][3]
    a = analyse_amended(RULE, pts)
    assert 3 not in a["seeds"] and len(a["seeds"]) == len(SEEDS) - 1
    assert a["missing"] == ["p1 lopd_frozen: seeds 3"]
    assert all(t["n"] == len(SEEDS) - 1 for t in a["points"]["p0"]["tests"])  # dropped at p0 too: still paired


def test_the_report_decides_with_the_registered_rule(tmp_path):
    """params.yaml's rule edited after registration does not change the confirmatory verdict: the
    registered rule decides, and the difference is named."""
    from lopd.analysis.confirm_report import confirmation

    rng = np.random.default_rng(5)
    base = dict(zip(SEEDS, 0.2 + rng.normal(0, 0.005, len(SEEDS))))
    reg = {"sha256": "h", "points": [{"name": "p0"}],
           "rule": {"text": "registered", "treatment": "lopd", "gain_over": ["base", "lopd_frozen"],
                    "content_controls": ["lopd_shuffled", "lopd_unrelated"], "rho": None, "rho_baseline": "base",
                    "alpha": 0.05}}
    pt = _point(0.05, rng, base)
    for arm, by_seed in pt.items():
        for s, v in by_seed.items():
            where = "shared" if arm == "base" else "p0"
            d = tmp_path / "confirm" / "eval" / where / arm / f"seed-{s}"
            d.mkdir(parents=True, exist_ok=True)
            (d / "result.json").write_text(json.dumps({"point": where, "arm": arm, "seed": s, "test_reward": v,
                                                       "registration": "h"}))
    edited = Rule("edited", "lopd", ("base",), ("lopd_shuffled",), None, "base", 0.05)
    conf = confirmation(edited, tmp_path, reg)
    assert [t["name"] for t in conf["amended"]["primary"]["tests"]] == [
        "lopd > base", "lopd > lopd_frozen", "lopd > lopd_shuffled", "lopd > lopd_unrelated"]
    assert any("differs from the registered rule" in p for p in conf["problems"])
    assert conf["amended"]["label"] == ROBUST


def _registered(paths, points: int = 1) -> dict:
    reg = regmod.seal({"points": [{"name": f"p{i}", "trial": i, "margin": 1.0, "K": 4, "n_ret": 2, "lr_student": 0.005,
                                   "lr_frozen": 0.002} for i in range(points)],
                       "arms": {"trained": ["lopd", "lopd_frozen"], "shared": ["base"]}, "seeds": [100, 101],
                       "confirm_split": {"manifest_sha256": "0" * 64}})
    paths.registration.parent.mkdir(parents=True, exist_ok=True)
    paths.registration.write_text(json.dumps(reg))
    return reg


def _fake_training(monkeypatch, calls: list, fail_at: str | None = None) -> None:
    """confirm_train's collaborators replaced: no model, no training; ``run_jobs`` records its checkpoint
    directory and jobs, writes each job's result, and raises (a kill) at arm ``fail_at``."""
    import lopd.population.jobs as jobs_mod
    import lopd.stages.common as common
    import lopd.training.run as run_mod

    def run_jobs(params, res, arm, jobs, *, ckpt_dir, label, **kw):
        calls.append((arm, Path(ckpt_dir).name, [Path(j.rid_key).name for j in jobs]))
        if arm == fail_at:
            raise RuntimeError("killed")
        out = []
        for j in jobs:
            j.out_dir.mkdir(parents=True, exist_ok=True)
            (j.out_dir / "result.json").write_text("{}")
            out.append(({"val_reward": 0.5}, {}))
        return out

    monkeypatch.setattr(jobs_mod, "run_jobs", run_jobs)
    monkeypatch.setattr(common, "load_resources", lambda *a, **k: object())
    monkeypatch.setattr(common, "with_draw", lambda *a, **k: object())
    monkeypatch.setattr(common, "write_side", lambda *a, **k: None)
    monkeypatch.setattr(run_mod, "job_hparams", lambda *a, **k: object())


def test_confirm_train_keys_its_checkpoints_by_the_registration_and_writes_its_hash_last(tmp_path, monkeypatch):
    from lopd.paths import NOT_RUN, REGISTRATION_MARKER, Paths
    from lopd.stages import confirm_train

    params = default_params({"confirm": {"slots": [0, 1], "seeds": [100, 101]}})
    paths = Paths(tmp_path)
    reg = _registered(paths)
    out0, out1 = paths.confirm_runs(0), paths.confirm_runs(1)
    out0.mkdir(parents=True)
    (out0 / NOT_RUN).write_text("{}")  # an earlier registration had no point for this slot
    (out0 / REGISTRATION_MARKER).write_text(json.dumps({"sha256": "an earlier one"}))
    calls: list = []
    _fake_training(monkeypatch, calls, fail_at="lopd_frozen")
    with pytest.raises(RuntimeError, match="killed"):
        confirm_train.run(params, paths, 0)
    # killed after lopd's runs: no marker (confirm_evaluate refuses the slot), and the stale records are gone
    assert not (out0 / REGISTRATION_MARKER).exists() and not (out0 / NOT_RUN).exists()
    key = reg["sha256"][:12]
    assert calls[0][1] == f"confirm-{key}-p0-lopd"
    assert calls[0][2] == [f"confirm-{key}-p0-lopd-seed-100", f"confirm-{key}-p0-lopd-seed-101"]
    calls.clear()
    _fake_training(monkeypatch, calls)
    confirm_train.run(params, paths, 0)
    assert [c[1] for c in calls] == [f"confirm-{key}-p0-{a}" for a in ("lopd", "lopd_frozen", "base")]
    assert json.loads((out0 / REGISTRATION_MARKER).read_text()) == {"sha256": reg["sha256"]}
    # a slot beyond S: its not-run record and the hash, no training
    calls.clear()
    confirm_train.run(params, paths, 1)
    assert not calls and (out1 / NOT_RUN).exists()
    assert json.loads((out1 / REGISTRATION_MARKER).read_text()) == {"sha256": reg["sha256"]}
    # another registration never resumes these checkpoints
    other = _registered(paths, points=2)
    calls.clear()
    confirm_train.run(params, paths, 1)
    assert calls[0][1] == f"confirm-{other['sha256'][:12]}-p1-lopd" and other["sha256"][:12] != key
    assert not (out1 / NOT_RUN).exists()


def test_register_refuses_a_rule_arm_tuned_over_its_own_knobs(tmp_path):
    from lopd.paths import Paths
    from lopd.stages import register

    params = default_params({"report": {"rule": {"gain_over": ["base", "opsd_text"]}}})
    paths = Paths(tmp_path)
    paths.hpo.mkdir(parents=True)
    (paths.hpo / "selection.json").write_text(json.dumps({**SELECTION, "selected": 1, "tied": []}))
    (paths.hpo / "baselines.yaml").write_text("opsd_text: {lr_student: 0.002}\nlopd_frozen: {lr_student: 0.001}\n")
    with pytest.raises(BadInput, match="opsd_text, tuned on val over its own knobs"):
        register.run(params, paths)
    assert not paths.registration.exists()


def test_the_robust_labels_seeds_needed_starts_at_the_sign_flip_floor():
    """With contrasts far above their noise, any n has full power: seeds needed is the smallest n at which the
    exact sign-flip check can reject (1/2**n < alpha: 5 at alpha 0.05), for the robust label as for the primary."""
    rng = np.random.default_rng(0)
    contrasts = 0.5 + rng.normal(0, 0.001, (10, 2))
    rule = Rule("two tests", "lopd", ("base",), ("lopd_shuffled",), None, "base", 0.05)
    d = regmod.design([t.name for t in rule.tests()], contrasts, rule=rule, model=default_params().report.design,
                      effect=0.5, n_seeds=10, n_points=3, alpha=0.05, power=0.8, upper=0.8, n_sim=200, n_sim_null=200)
    assert d["seeds_needed_primary"] == 5 and d["seeds_needed_robust"] == 5 and d["max_n"] == 200
