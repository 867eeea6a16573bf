"""lopd.report on synthetic stage outputs with known, planted effects."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from lopd.arms import ARMS
from lopd.config import Params
from lopd.errors import BadInput
from lopd.report import CLEAN_LEAKAGE_SENTENCE, NULL_SENTENCE, build_report

STEPS = 30
PER_STEP = 16
VAL_EVERY = 5
MARGIN = 0.05
SHA = {s: (c * 64) for s, c in (("train", "a"), ("val", "b"), ("test", "c"))}
# planted test-reward means; lopd_shuffled / lopd_unrelated are set relative to lopd below
ARM_MEAN = {"base": 0.40, "sft": 0.45, "grpo": 0.50, "opsd_text": 0.55, "lopd_frozen": 0.58,
            "lopd_nomargin": 0.62, "lopd": 0.75}
# validation curve: (start, plateau, time constant in steps)
VAL_CURVE = {"base": (0.45, 0.45, 1.0), "sft": (0.45, 0.48, 10.0), "grpo": (0.45, 0.50, 15.0),
             "opsd_text": (0.45, 0.55, 8.0), "lopd_frozen": (0.45, 0.56, 6.0), "lopd_nomargin": (0.45, 0.60, 6.0),
             "lopd": (0.45, 0.70, 5.0), "lopd_shuffled": (0.45, 0.47, 10.0), "lopd_unrelated": (0.45, 0.46, 10.0)}

EXPECTED_FILES = ["main_table.md", "main_table.tex", "comparisons.md", "falsification.md", "margin_dynamics.md",
                  "efficiency.md", "seed_variance.md", "leakage_audit.md", "summary.json", "README.md",
                  "figures/margin_dynamics.png", "figures/efficiency.png", "figures/sensitivity.png",
                  "figures/learning_curves.png"]


def _params():
    return Params.model_validate({"report": {"n_boot": 500}})


def _wjson(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1))


def _wcsv(path: Path, header: list[str], rows: list[list]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def _dvc_yaml(hpo_test: bool) -> dict:
    hpo_deps = ["data/splits/train.jsonl", "data/splits/val.jsonl", "models/bank"]
    if hpo_test:
        hpo_deps.append("data/splits/test.jsonl")
    return {"stages": {
        "prepare": {"cmd": "python stages/prepare.py", "deps": ["lopd/data.py"], "outs": ["data/splits"]},
        "base": {"cmd": "python stages/base.py", "deps": ["data/splits/train.jsonl", "data/splits/val.jsonl"]},
        "bank": {"cmd": "python stages/bank.py", "deps": ["data/splits/train.jsonl", "models/base"]},
        "hpo": {"cmd": "python stages/hpo.py", "deps": hpo_deps, "outs": ["hpo/best_params.yaml"]},
        "train": {"matrix": {"arm": list(ARMS), "seed": [0, 1]},
                  "cmd": "python stages/train.py --arm ${item.arm} --seed ${item.seed}",
                  "deps": ["data/splits/train.jsonl", "data/splits/val.jsonl", "hpo/best_params.yaml"],
                  "outs": ["runs/${item.arm}-${item.seed}"]},
        "evaluate": {"foreach": ["lopd-0", "grpo-0"],
                     "do": {"cmd": "python stages/evaluate.py ${item}",
                            "deps": ["data/splits/test.jsonl", "runs/${item}"]}},
        "report": {"cmd": "python stages/report.py", "deps": ["runs", "results/eval", "data/splits/manifest.json"],
                   "metrics": [{"reports/summary.json": {"cache": False}}]},
    }}


def make_fixture(root: Path, *, n_seeds: int = 10, effect: float = 0.3, null: bool = False, hpo: bool = True,
                 sensitivity: bool = True, hpo_test_dep: bool = False, hpo_reads_test: bool = False,
                 arms=tuple(ARMS), seed: int = 0) -> Path:
    """Write every input of build_report under ``root`` with known effects.

    ``null``: lopd_shuffled has exactly lopd's test rewards (and lopd_unrelated noise only), so
    retrieved content makes no difference. Otherwise lopd = control + ``effect`` (+ small noise).
    """
    rng = np.random.default_rng(seed)
    seeds = list(range(n_seeds))
    seed_eff = rng.normal(0, 0.02, n_seeds)
    test = {}
    for arm in arms:
        if arm in ARM_MEAN:
            test[arm] = ARM_MEAN[arm] + seed_eff + rng.normal(0, 0.01, n_seeds)
    lopd = test.get("lopd", ARM_MEAN["lopd"] + seed_eff)
    for ctrl in ("lopd_shuffled", "lopd_unrelated"):
        if ctrl in arms:
            if null:
                test[ctrl] = lopd.copy() if ctrl == "lopd_shuffled" else lopd + rng.normal(0, 0.01, n_seeds)
            else:
                test[ctrl] = lopd - effect + rng.normal(0, 0.01, n_seeds)

    for arm in arms:
        for i, s in enumerate(seeds):
            d = root / "runs" / f"{arm}-{s}"
            v0, v1, tau = VAL_CURVE[arm]
            steps = STEPS if arm != "base" else 0
            rows = []
            beta = 0.0
            jit = 1.0 + rng.normal(0, 0.1)  # per-run spread so seed bands are visible
            for t in range(steps + 1):
                val = v0 + (v1 - v0) * (1 - math.exp(-t / tau)) * jit + rng.normal(0, 0.008) if t % VAL_EVERY == 0 else ""
                if t == 0:
                    rows.append([0, 0, "", "", "", "", 0.0, "", "", "", "", val])
                    continue
                if arm == "lopd":
                    dphi, beta = -0.01 + 0.11 * jit * (1 - math.exp(-t / 6)), 0.5 * jit * (1 - math.exp(-t / 4))
                elif arm == "lopd_shuffled":  # margin never met, β explodes
                    dphi, beta = -0.02 + rng.normal(0, 0.003), 0.01 * jit * math.exp(t / 5)
                elif arm == "lopd_unrelated":
                    dphi, beta = 0.06 * (1 - math.exp(-t / 8 / jit)), 1.0 * jit * (1 - math.exp(-t / 6))
                elif arm.startswith("lopd") or arm == "opsd_text":
                    dphi, beta = 0.02 * jit * (1 - math.exp(-t / 8)), 0.0
                else:
                    dphi, beta = "", 0.0
                sat = "" if dphi == "" else float(np.clip(0.5 + 5 * (dphi - MARGIN), 0, 1))
                rows.append([t, t * PER_STEP, 0.4 + 0.01 * t, 0.1, 0.05, dphi, beta, sat, 0.01, 0.02, 200, val])
            _wcsv(d / "history.csv", ["step", "rollouts_used", "reward", "loss", "kd_loss", "delta_phi", "beta",
                                      "margin_sat_frac", "anchor", "tail_mass", "n_supervised", "val_reward"], rows)
            last_val = [r[-1] for r in rows if r[-1] != ""][-1]
            _wjson(d / "result.json", {
                "arm": arm, "seed": s, "val_reward": last_val, "final_train_reward": 0.5, "steps": steps,
                "rollouts_used": steps * PER_STEP, "beta_final": beta,
                "infeasible_margin": arm == "lopd_unrelated" and s == 0,
                "hparams": {"margin": MARGIN, "K": 8, "n_ret": 3, "steps": steps},
                "arm_switches": ARMS[arm].to_dict(), "params_hash": "abc"})
            if arm in test:
                m = float(test[arm][i])
                ev = root / "results" / "eval" / f"{arm}-{s}"
                _wjson(ev / "result.json", {
                    "arm": arm, "seed": s, "test_reward": m, "test_reward_by_domain": {"tool": m + 0.05, "code": m - 0.05},
                    "n_tasks": 8, "splits_read": [{"split": "test", "role": "evaluate", "sha256": SHA["test"]}]})
                _wjson(ev / "per_task.json", [{"task_id": f"t{j}", "domain": "tool" if j < 4 else "code",
                                               "family": "bank", "reward": float(j % 2)} for j in range(8)])

    _wjson(root / "data" / "splits" / "manifest.json",
           {"files": {s: {"path": f"{s}.jsonl", "sha256": SHA[s], "n": 10} for s in ("train", "val", "test")}})
    (root / "dvc.yaml").write_text(yaml.safe_dump(_dvc_yaml(hpo_test_dep), sort_keys=False))
    _wjson(root / "results" / "base" / "result.json", {"splits_read": [
        {"split": "train", "role": "base", "sha256": SHA["train"]}, {"split": "val", "role": "base", "sha256": SHA["val"]}]})
    _wjson(root / "models" / "bank" / "manifest.json",
           {"splits_read": [{"split": "train", "role": "bank", "sha256": SHA["train"]}]})
    if hpo:
        hpo_reads = [{"split": "train", "role": "hpo", "sha256": SHA["train"]},
                     {"split": "val", "role": "hpo", "sha256": SHA["val"]}]
        if hpo_reads_test:
            hpo_reads.append({"split": "test", "role": "hpo", "sha256": SHA["test"]})
        _wjson(root / "hpo" / "result.json", {"splits_read": hpo_reads})
        trials = []
        for n in range(16):
            m, k, r = [0.0, 0.02, 0.05, 0.1][n % 4], [4, 8, 16][n % 3], 1 + n % 5
            state = "PRUNED" if n % 7 == 6 else "COMPLETE"
            trials.append([n, state, 0.5 + 0.1 * math.exp(-abs(m - MARGIN) * 20) + rng.normal(0, 0.01), m, k, r])
        _wcsv(root / "hpo" / "trials.csv", ["number", "state", "value", "margin", "K", "n_ret"], trials)
        (root / "hpo" / "best_params.yaml").write_text(yaml.safe_dump({"margin": MARGIN, "K": 8, "n_ret": 3,
                                                                       "value": 0.6}))
    if sensitivity:
        grid = []
        for axis, values in (("margin", [0.0, 0.05, 0.2]), ("K", [4, 8, 16]), ("n_ret", [1, 3, 5])):
            for v in values:
                for s in (0, 1):
                    p = {"margin": MARGIN, "K": 8, "n_ret": 3, axis: v}
                    grid.append([axis, p["margin"], p["K"], p["n_ret"], s, 0.6 - 0.3 * abs(v - {"margin": MARGIN,
                                 "K": 8, "n_ret": 3}[axis]) / (1 + v) + rng.normal(0, 0.01)])
        _wcsv(root / "results" / "sensitivity" / "grid.csv", ["axis", "margin", "K", "n_ret", "seed", "val_reward"],
              grid)
    return root


def _read(root: Path, name: str) -> str:
    return (root / "reports" / name).read_text()


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = make_fixture(tmp_path_factory.mktemp("planted"))
    return root, build_report(_params(), root)


# --------------------------------------------------------------------------- #
def test_all_files_exist_and_summary_is_json_safe(planted):
    root, summary = planted
    for name in EXPECTED_FILES:
        p = root / "reports" / name
        assert p.exists() and p.stat().st_size > 0, name
    for png in (root / "reports" / "figures").glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    text = _read(root, "summary.json")
    assert "NaN" not in text and "Infinity" not in text
    on_disk = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert on_disk == summary
    assert set(summary["test_reward"]) == set(ARMS)
    assert summary["n_seeds"] == 10
    assert summary["infeasible_runs"] == 1
    assert not list((root / "reports").rglob("*.tmp"))


def test_planted_effect_is_detected_and_claim_survives(planted):
    root, summary = planted
    for ctrl in ("lopd_shuffled", "lopd_unrelated"):
        assert summary["lopd_vs"][ctrl]["p_holm"] < 0.05
        assert summary["lopd_vs"][ctrl]["diff"] == pytest.approx(0.3, abs=0.03)
    assert summary["falsification_survived"] is True
    fal = _read(root, "falsification.md")
    assert fal.index("Pre-registered rule") < fal.index(Params().report.falsification_rule) < fal.index("## Numbers")
    assert "The claim survived the falsification test" in fal and NULL_SENTENCE not in fal
    cmp = _read(root, "comparisons.md")
    assert cmp.count("| lopd_") >= 4 and "P(improvement)" in cmp
    # lopd beats the runner-up (lopd_nomargin, 0.13 lower) in every column -> bolded, and in the tex too
    assert summary["bold_columns"] == {"tool": "lopd", "code": "lopd", "mean": "lopd"}
    assert _read(root, "main_table.md").count("**") == 6
    tex = _read(root, "main_table.tex")
    assert tex.count(r"\textbf{") == 3 and r"lopd\_shuffled" in tex and r"$\pm$" in tex
    assert "95%" in _read(root, "main_table.md") and "n = 10 seeds" in _read(root, "main_table.md")


def test_margin_flags_efficiency_seed_variance_and_clean_audit(planted):
    root, summary = planted
    md = _read(root, "margin_dynamics.md")
    shuffled = [l for l in md.splitlines() if l.startswith("| lopd_shuffled |")]
    assert len(shuffled) == 10 and all("β grows without bound" in l and "Δ never reaches m" in l for l in shuffled)
    lopd = [l for l in md.splitlines() if l.startswith("| lopd |")]
    assert lopd and all(l.rstrip().endswith("| — |") for l in lopd)
    assert sum("infeasible_margin" in l for l in md.splitlines() if l.startswith("| lopd_unrelated |")) == 1
    assert all("reference, not flagged" in l for l in md.splitlines() if l.startswith("| lopd_nomargin |"))
    assert summary["margin_flagged_runs"] == 11

    assert summary["efficiency_ratio"] is not None and 0 < summary["efficiency_ratio"] < 0.3
    lo, hi = summary["efficiency_ci"]
    assert lo <= summary["efficiency_ratio"] <= hi
    assert "30%" in _read(root, "efficiency.md")

    sv = _read(root, "seed_variance.md")
    assert "MDD" in sv and "seeds" in sv
    assert isinstance(summary["seeds_needed_lopd_vs_grpo"], int) and summary["seeds_needed_lopd_vs_grpo"] >= 2

    audit = _read(root, "leakage_audit.md")
    assert CLEAN_LEAKAGE_SENTENCE in audit and "VIOLATION" not in audit
    assert SHA["test"] in audit and "`evaluate`" in audit
    assert summary["leakage_clean"] is True


def test_zero_difference_does_not_falsify_null(tmp_path):
    root = make_fixture(tmp_path, null=True)
    summary = build_report(_params(), root)
    fal = _read(root, "falsification.md")
    assert NULL_SENTENCE in fal and "The claim survived" not in fal
    assert "lopd_shuffled" in fal.split("## Verdict")[1]
    assert summary["falsification_survived"] is False
    assert summary["lopd_vs"]["lopd_shuffled"]["diff"] == 0.0
    assert summary["lopd_vs"]["lopd_shuffled"]["p_holm"] == 1.0
    # lopd and lopd_shuffled tie at the top: no cell may be bolded
    assert summary["bold_columns"] == {}
    assert "No cell is marked" in _read(root, "main_table.md")


def test_five_seeds_cannot_reject_and_report_says_so(tmp_path):
    root = make_fixture(tmp_path, n_seeds=5)
    summary = build_report(_params(), root)
    fal = _read(root, "falsification.md")
    # 2/2^5 = 0.0625 > 0.05: even a 0.3 planted effect cannot be declared significant with 5 seeds
    assert summary["falsification_survived"] is False
    assert NULL_SENTENCE in fal and "Design warning" in fal and "cannot reject" in fal


@pytest.mark.parametrize("kind", ["dvc_dep", "runtime_read"])
def test_leakage_violation_is_flagged(tmp_path, kind):
    root = make_fixture(tmp_path, n_seeds=3, hpo_test_dep=kind == "dvc_dep", hpo_reads_test=kind == "runtime_read")
    summary = build_report(_params(), root)
    audit = _read(root, "leakage_audit.md")
    assert "LEAKAGE VIOLATION" in audit and "`hpo`" in audit.split("## Split files")[0]
    assert CLEAN_LEAKAGE_SENTENCE not in audit
    assert summary["leakage_clean"] is False and summary["leakage_violations"] >= 1


def test_missing_optional_inputs_do_not_crash(tmp_path):
    arms = tuple(a for a in ARMS if a not in ("opsd_text", "lopd_unrelated"))
    root = make_fixture(tmp_path, n_seeds=3, hpo=False, sensitivity=False, arms=arms)
    summary = build_report(_params(), root)
    for name in EXPECTED_FILES:
        assert (root / "reports" / name).exists(), name
    assert (root / "reports" / "figures" / "sensitivity.png").stat().st_size > 5_000
    missing = " ".join(summary["missing_inputs"])
    for m in ("hpo/trials.csv", "results/sensitivity/grid.csv", "opsd_text", "lopd_unrelated"):
        assert m in missing
    assert "Missing inputs" in _read(root, "README.md")
    fal = _read(root, "falsification.md")
    assert NULL_SENTENCE in fal and "lopd_unrelated: no paired evaluation results" in fal
    # without an hpo stage record the audit still runs; the dvc.yaml hpo stage depends on val only
    assert "leakage_audit.md" in _read(root, "README.md")


def test_missing_runs_raise_bad_input(tmp_path):
    with pytest.raises(BadInput, match="no training runs"):
        build_report(_params(), tmp_path)


def test_missing_eval_results_still_writes_every_file(tmp_path):
    root = make_fixture(tmp_path, n_seeds=2, arms=("grpo", "lopd"))
    for p in (root / "results" / "eval").glob("*/result.json"):
        p.unlink()
    summary = build_report(_params(), root)
    for name in EXPECTED_FILES:
        assert (root / "reports" / name).exists(), name
    assert "MISSING" in _read(root, "main_table.md") and summary["test_reward"] == {}
    assert summary["falsification_survived"] is False
