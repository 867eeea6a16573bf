"""lopd.analysis.report on synthetic stage outputs with known, planted effects."""

from __future__ import annotations

import csv
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from dvc_render.vega import VegaRenderer
from scipy import stats

from lopd.analysis import figures
from lopd.analysis.audits import CLEAN_LEAKAGE_SENTENCE, leakage, write_leakage
from lopd.analysis.falsification import (CLAIM_SENTENCE, DESIGN_FLAG, DESIGN_OK, NO_CLAIM_SENTENCE, Rule, analyse,
                                         decide, render)
from lopd.analysis.loading import load_evals, load_premise, load_runs, values
from lopd.analysis.plotdata import COLUMNS, DYNAMICS_ARMS, MARGIN_ARMS, plot_declarations
from lopd.analysis.report import build_report
from lopd.arms import ARMS
from lopd.config import deep_merge, parse_params, read_yaml_mapping
from lopd.errors import BadInput

REPO = Path(__file__).resolve().parents[2]
STEPS, PER_STEP, VAL_EVERY, MARGIN = 30, 16, 5, 0.05
N_TASKS, DOMAINS = 16, ("tool", "code")  # tasks 0-7 tool, 8-15 code
SHA = {s: (c * 64) for s, c in (("train", "a"), ("val", "b"), ("test", "c"))}
# planted test-reward levels; lopd_shuffled / lopd_unrelated are set relative to lopd below
ARM_MEAN = {"base": 0.40, "sft": 0.45, "grpo": 0.50, "opsd_text": 0.55, "lopd_frozen": 0.58, "lopd_nomargin": 0.62,
            "lopd": 0.75}
# validation curve: (start, plateau, time constant in steps)
VAL_CURVE = {"base": (0.45, 0.45, 1.0), "sft": (0.45, 0.48, 10.0), "grpo": (0.45, 0.50, 15.0),
             "opsd_text": (0.45, 0.55, 8.0), "lopd_frozen": (0.45, 0.56, 6.0), "lopd_nomargin": (0.45, 0.60, 6.0),
             "lopd": (0.45, 0.70, 5.0), "lopd_shuffled": (0.45, 0.47, 10.0), "lopd_unrelated": (0.45, 0.46, 10.0)}
EXPECTED_FILES = ["main_table.md", "main_table.tex", "comparisons.md", "falsification.md", "margin_dynamics.md",
                  "efficiency.md", "seed_variance.md", "leakage_audit.md", "summary.json", "README.md",
                  "figures/margin_dynamics.png", "figures/efficiency.png", "figures/sensitivity.png",
                  "figures/learning_curves.png", *[f"plots/{n}.csv" for n in COLUMNS],
                  "metrics/verdict/claim.json", "metrics/premise/gate.json"]
METRIC_KEYS = {"mean", "ci", "n", "p", "p_exact", "pass"}


def _params(**report):
    raw = read_yaml_mapping(REPO / "params.yaml")  # the defaults are params.yaml's
    return parse_params(deep_merge(raw, {"report": {"n_boot": 500, **report}}))


def _wjson(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1))


def _wcsv(path: Path, header: list[str], rows: list[list]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([header, *rows])


def _dvc_yaml(hpo_test: bool) -> dict:
    hpo_deps = ["data/splits/train.jsonl", "data/splits/val.jsonl", "models/bank"] + (
        ["data/splits/test.jsonl"] if hpo_test else [])
    return {"stages": {
        "prepare": {"cmd": "python stages/prepare.py", "deps": ["lopd/data.py"], "outs": ["data/splits"]},
        "base": {"cmd": "python stages/base.py", "deps": ["data/splits/train.jsonl", "data/splits/val.jsonl"]},
        "bank": {"cmd": "python stages/bank.py", "deps": ["data/splits/train.jsonl", "models/base"]},
        "hpo": {"cmd": "python stages/hpo.py", "deps": hpo_deps, "outs": ["hpo/best_params.yaml"]},
        # code fingerprints of the matrix stages (as in dvc.yaml): no data deps, so nothing to flag
        "code_train": {"cmd": "lopd fingerprint code_train", "deps": ["lopd/data.py", "lopd/training"],
                       "outs": [{"fingerprints/train.json": {"cache": False}}]},
        "code_evaluate": {"cmd": "lopd fingerprint code_evaluate", "deps": ["lopd/data.py", "lopd/engine/evaluation.py"],
                          "outs": [{"fingerprints/evaluate.json": {"cache": False}}]},
        "train": {"matrix": {"arm": list(ARMS), "seed": [0, 1]},
                  "cmd": "python stages/train.py --arm ${item.arm} --seed ${item.seed}",
                  "deps": ["data/splits/train.jsonl", "data/splits/val.jsonl", "hpo/best_params.yaml",
                           "fingerprints/train.json"],
                  "outs": ["runs/${item.arm}-${item.seed}"]},
        "evaluate": {"foreach": ["lopd-0", "grpo-0"], "do": {"cmd": "python stages/evaluate.py ${item}",
                                                              "deps": ["data/splits/test.jsonl", "runs/${item}",
                                                                       "fingerprints/evaluate.json"]}},
        # the extra-seed repeat of evaluate may read test too (the clean-audit tests check it is not flagged)
        "evaluate_extra": {"foreach": ["lopd-2"], "do": {"cmd": "python stages/evaluate.py ${item}",
                                                         "deps": ["data/splits/test.jsonl", "runs/${item}"]}},
        "report": {"cmd": "python stages/report.py", "deps": ["runs", "results/eval", "data/splits/manifest.json"]},
    }}


def _samples(rng, n_seeds: int, samples: int, arms, null: bool, effect: float, gain: bool) -> dict[str, np.ndarray]:
    """Per-(arm, seed, task, sample) rewards: arm level + seed effect + task effect + sampling noise."""
    task_eff = rng.normal(0, 0.05, N_TASKS)
    seed_eff = rng.normal(0, 0.02, n_seeds)
    levels = {a: ARM_MEAN.get(a, 0.5) for a in arms} | ({} if gain else {"base": 0.85})  # 0.5: an arm added later

    def draw(level):
        per_seed = level + seed_eff + rng.normal(0, 0.01, n_seeds)
        x = per_seed[:, None, None] + task_eff[None, :, None] + rng.normal(0, 0.04, (n_seeds, N_TASKS, samples))
        return np.clip(x, 0.0, 1.0)

    out = {a: draw(levels[a]) for a in arms}
    lopd = out.get("lopd", draw(levels["lopd"]))
    for ctrl in ("lopd_shuffled", "lopd_unrelated"):
        if ctrl in arms:
            shift = 0.0 if null else effect
            out[ctrl] = lopd.copy() if null else np.clip(lopd - shift + rng.normal(0, 0.01, (n_seeds, 1, 1)), 0, 1)
    return out


def _write_eval(root: Path, arm: str, s: int, x: np.ndarray) -> float:
    """results/eval/<arm>/seed-<s>/: per_task.json (samples) and result.json with the mean of domain means."""
    task_mean = x.mean(axis=1)
    by_dom = {"tool": float(task_mean[:8].mean()), "code": float(task_mean[8:].mean())}
    ev = root / "results" / "eval" / arm / f"seed-{s}"
    recs = [{"task_id": f"t{j}", "domain": DOMAINS[j >= 8], "family": "bank",
             **({"rewards": [float(v) for v in x[j]]} if x.shape[1] > 1 else {"reward": float(x[j, 0])})}
            for j in range(N_TASKS)]
    _wjson(ev / "per_task.json", recs)
    mean = (by_dom["tool"] + by_dom["code"]) / 2
    _wjson(ev / "result.json", {"arm": arm, "seed": s, "test_reward": mean, "test_reward_by_domain": by_dom,
                                "n_tasks": N_TASKS,
                                "splits_read": [{"split": "test", "role": "evaluate", "sha256": SHA["test"]}]})
    return mean


def _write_run(root: Path, rng, arm: str, s: int) -> None:
    d = root / "runs" / arm / f"seed-{s}"
    v0, v1, tau = VAL_CURVE.get(arm, (0.45, 0.5, 8.0))
    steps, rows, beta = (STEPS if arm != "base" else 0), [], 0.0
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
    _wjson(d / "result.json", {
        "arm": arm, "seed": s, "val_reward": [r[-1] for r in rows if r[-1] != ""][-1], "steps": steps,
        "rollouts_used": steps * PER_STEP, "beta_final": beta, "infeasible_margin": arm == "lopd_unrelated" and s == 0,
        "hparams": {"margin": MARGIN, "K": 8, "n_ret": 3, "steps": steps}, "arm_switches": ARMS[arm].to_dict()})


def _write_side_inputs(root: Path, rng, hpo: bool, sensitivity: bool, hpo_test_dep: bool, hpo_reads_test: bool):
    _wjson(root / "data" / "splits" / "manifest.json",
           {"files": {s: {"path": f"{s}.jsonl", "sha256": SHA[s], "n": 10,
                          "content": [f"{s}{i:014d}" for i in range(10)]} for s in ("train", "val", "test")}})
    (root / "dvc.yaml").write_text(yaml.safe_dump(_dvc_yaml(hpo_test_dep), sort_keys=False))
    _wjson(root / "results" / "base" / "result.json", {"splits_read": [
        {"split": "train", "role": "base", "sha256": SHA["train"]},
        {"split": "val", "role": "base", "sha256": SHA["val"]}]})
    _wjson(root / "models" / "bank" / "manifest.json",
           {"splits_read": [{"split": "train", "role": "bank", "sha256": SHA["train"]}]})
    if hpo:
        reads = [{"split": "train", "role": "hpo", "sha256": SHA["train"]},
                 {"split": "val", "role": "hpo", "sha256": SHA["val"]}]
        _wjson(root / "hpo" / "result.json", {"splits_read": reads + (
            [{"split": "test", "role": "hpo", "sha256": SHA["test"]}] if hpo_reads_test else [])})
        trials = [[n, "PRUNED" if n % 7 == 6 else "COMPLETE", 0.6 + rng.normal(0, 0.01), [0.0, 0.02, 0.05, 0.1][n % 4],
                   [4, 8, 16][n % 3], 1 + n % 5] for n in range(16)]
        _wcsv(root / "hpo" / "trials.csv", ["number", "state", "value", "margin", "K", "n_ret"], trials)
        (root / "hpo" / "best_params.yaml").write_text(yaml.safe_dump({"margin": MARGIN, "K": 8, "n_ret": 3}))
    if sensitivity:
        point = {"margin": MARGIN, "K": 8, "n_ret": 3, "eta_beta": 5.0}
        grid = [[axis, "lopd", *[v if a == axis else point[a] for a in point], s, 0.6 - 0.01 * v + rng.normal(0, 0.01),
                 "binds"] for axis, vals in (("margin", [0.0, 0.05, 0.2]), ("K", [4, 8, 16]), ("n_ret", [1, 3, 5]))
                for v in vals for s in (0, 1)]
        grid += [["dose", "lopd", m, 8, 3, 50.0, s, 0.55 + rng.normal(0, 0.01), "degenerates"] for m in (0.05, 0.2)
                 for s in (0, 1)]
        grid += [["reference", "lopd_frozen", MARGIN, 8, 3, 5.0, s, 0.5, ""] for s in (0, 1)]
        _wcsv(root / "results" / "sensitivity" / "grid.csv",
              ["axis", "arm", "margin", "K", "n_ret", "eta_beta", "seed", "val_reward", "constraint"], grid)


def make_fixture(root: Path, *, n_seeds: int = 10, effect: float = 0.3, null: bool = False, gain: bool = True,
                 samples: int = 4, hpo: bool = True, sensitivity: bool = True, hpo_test_dep: bool = False,
                 hpo_reads_test: bool = False, arms=tuple(ARMS), probe: dict | None = None, seed: int = 0) -> dict:
    """Every input of build_report under ``root``; returns {arm: per-seed test rewards, "_samples": ...}.

    ``null``: the controls' per-sample rewards equal lopd's (content makes no difference); otherwise they
    are ``effect`` lower. ``gain=False`` puts base above lopd (part (i) must fail)."""
    rng = np.random.default_rng(seed)
    x = _samples(rng, n_seeds, samples, arms, null, effect, gain)
    test = {a: np.array([_write_eval(root, a, s, x[a][s]) for s in range(n_seeds)]) for a in x}
    for arm in arms:
        for s in range(n_seeds):
            _write_run(root, rng, arm, s)
    _write_side_inputs(root, rng, hpo, sensitivity, hpo_test_dep, hpo_reads_test)
    if probe is not None:
        _wjson(root / "results" / "probe" / "result.json", probe)
    return test | {"_samples": x}


def _read(root: Path, name: str) -> str:
    return (root / "reports" / name).read_text()


def _metric(root: Path, name: str) -> dict:
    return json.loads((root / "reports" / "metrics" / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("planted")
    probe = {"premise_holds": True, "by_mode": {"relevant": {"mean_delta": 0.21}, "shuffled": {"mean_delta": -0.04}}}
    test = make_fixture(root, probe=probe)
    return root, build_report(_params(), root), test


# --------------------------------------------------------------------------- outputs
def test_all_files_exist_and_summary_is_json_safe(planted):
    root, summary, _ = planted
    for name in EXPECTED_FILES:
        p = root / "reports" / name
        assert p.exists() and p.stat().st_size > 0, name
    for png in (root / "reports" / "figures").glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    text = _read(root, "summary.json")
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}")) == summary
    assert set(summary["test_reward"]) == set(ARMS) and set(summary["n_seeds_by_arm"].values()) == {10}
    assert summary["infeasible_runs"] == 1 and summary["premise"] == "holds"
    assert not list((root / "reports").rglob("*.tmp"))


def test_planted_effect_claim_and_the_rule_comes_first(planted):
    root, summary, test = planted
    fal = _read(root, "falsification.md")
    rule = _params().report.rule.text
    # the rule (no data) before the premise gate, the design check, the tests and the verdict
    order = [fal.index(rule), fal.index("## Premise gate"), fal.index("## Design check"), fal.index("## Tests"),
             fal.index("## Verdict")]
    assert order == sorted(order) and not any(ch.isdigit() for ch in fal[:fal.index(rule)].replace("#", ""))
    assert CLAIM_SENTENCE in fal and NO_CLAIM_SENTENCE not in fal and DESIGN_OK in fal
    # what the intervals cover is stated before the tests: with per-seed draws (the default), the training seed
    # and the bank and cold-start draws, not the base draw
    assert fal.index("## What the confidence intervals cover") < fal.index("## Tests")
    assert "**The training seed and the bank and cold-start draws, not the base draw.**" in fal
    assert "a verdict here is a verdict about this base policy" in fal and "**The training seed only.**" not in fal
    f = summary["falsification"]
    assert f["gain"] and f["content"] and f["claim"] and f["claim_robust"] and f["design_can_reject"]
    # the statistics are scipy's paired t-test on the per-seed test rewards, one-sided
    for ctrl in ("base", "lopd_frozen", "lopd_shuffled", "lopd_unrelated"):
        ref = stats.ttest_rel(test["lopd"], test[ctrl], alternative="greater")
        row = f["tests"][f"lopd > {ctrl}"]
        assert row["t"] == pytest.approx(ref.statistic) and row["p"] == pytest.approx(ref.pvalue)
        assert row["n"] == 10 and row["p_exact"] == pytest.approx(2.0**-10)  # every seed favours lopd
        assert row["diff"] == pytest.approx(np.mean(test["lopd"] - test[ctrl]))
    assert f["tests"]["lopd > lopd_shuffled"]["diff"] == pytest.approx(0.3, abs=0.02)
    assert "Premise gate (results/probe/result.json): **holds** (δ relevant = 0.2100; δ shuffled = -0.0400)" in fal
    assert "Simulated with each training seed its own bank and cold-start draw" in fal
    assert "power of the full rule at that effect" in fal and "false-claim rate (α = 0.05) with no content effect: " \
        "global null" in fal and "least favourable" in fal
    design = _params().report.design
    assert f"upstream-draw sd {design.draw_sd:g} for every arm that uses the bank and φ0 (correlation {design.draw_corr:g}" in fal


def test_with_one_shared_draw_the_report_says_the_intervals_cover_the_seed_only(tmp_path):
    """train.per_seed_draws: false (the old design): the scope and the design note say one shared draw."""
    make_fixture(tmp_path, probe={"premise_holds": True, "by_mode": {}})
    raw = deep_merge(read_yaml_mapping(REPO / "params.yaml"), {"report": {"n_boot": 200},
                                                               "train": {"per_seed_draws": False}})
    build_report(parse_params(raw), tmp_path)
    fal = _read(tmp_path, "falsification.md")
    assert "**The training seed only.**" in fal and "A verdict here is a verdict about this draw." in fal
    assert "Simulated with one bank and cold-start draw shared by every seed" in fal
    assert "**The training seed and the bank and cold-start draws" not in fal


def test_main_table_and_comparisons(planted):
    root, summary, test = planted
    md = _read(root, "main_table.md")
    x = test["lopd"]
    half = stats.t.ppf(0.975, 9) * x.std(ddof=1) / math.sqrt(10)
    assert f"**{x.mean():.3f} ± {half:.3f}**" in md and "n = 10 seeds per arm" in md
    # lopd beats the runner-up (lopd_nomargin, 0.13 lower) in every column
    assert summary["bold_columns"] == {"tool": "lopd", "code": "lopd", "mean": "lopd"} and md.count("**") == 6
    tex = _read(root, "main_table.tex")
    assert tex.count(r"\textbf{") == 3 and r"lopd\_shuffled" in tex and r"$\pm$" in tex
    cmp = _read(root, "comparisons.md")
    assert "exploratory" in cmp and "P(improvement)" in cmp and cmp.count("| lopd_") >= 4
    grpo = summary["lopd_vs"]["grpo"]
    ref = stats.ttest_rel(test["lopd"], test["grpo"])
    assert grpo["p"] == pytest.approx(ref.pvalue) and grpo["p_exact"] == pytest.approx(2.0**-9)  # two-sided
    lo, hi = grpo["ci95"]  # the t-interval around the observed difference; no task-level bootstrap
    assert lo < grpo["diff"] < hi and "boot95" not in grpo and "hier. bootstrap" not in cmp
    d = test["lopd"] - test["grpo"]  # paired P(improvement): the share of seeds on which lopd is higher
    assert grpo["p_improve"] == pytest.approx(float(np.mean((d > 0) + 0.5 * (d == 0))))
    assert "conditional on these test tasks and their worlds" in cmp


def test_headline_metrics_are_flat_and_small(planted):
    root, summary, test = planted
    files = sorted((root / "reports" / "metrics").rglob("*.json"))
    n_tests = len(Rule.from_params(_params().report).tests())
    assert len(files) == len(ARMS) + n_tests + 3 + 3  # rewards, rule tests, verdict parts, premise gate + 2 δ
    for p in files:
        row = json.loads(p.read_text())
        assert set(row) <= METRIC_KEYS and all(not isinstance(v, (dict, list)) for v in row.values()), p
    assert _metric(root, "reward/lopd") == {"mean": float(f"{test['lopd'].mean():.5g}"),
                                            "ci": pytest.approx(summary["test_ci_half"]["lopd"], rel=1e-4), "n": 10}
    assert _metric(root, "vs/lopd_shuffled")["pass"] is True and _metric(root, "verdict/claim") == {"pass": True}
    assert _metric(root, "premise/gate") == {"pass": True} and _metric(root, "premise/relevant") == {"mean": 0.21}
    assert "run_id" not in json.dumps([json.loads(p.read_text()) for p in files])


def test_dvc_metrics_show_fits_120_columns(planted, tmp_path):
    """The real `dvc metrics show` over reports/metrics (one file per row) in a scratch repository."""
    root = planted[0]
    shutil.copytree(root / "reports" / "metrics", tmp_path / "reports" / "metrics")
    (tmp_path / "dvc.yaml").write_text("metrics:\n  - reports/metrics\n")
    env = {"DVC_NO_ANALYTICS": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True, env=env)
    dvc = [sys.executable, "-m", "dvc"]
    subprocess.run([*dvc, "init", "-q"], cwd=tmp_path, check=True, env=env)
    shown = subprocess.run([*dvc, "metrics", "show"], cwd=tmp_path, check=True, env=env, capture_output=True,
                           text=True).stdout
    lines = shown.splitlines()
    print(shown)
    assert len(lines) == 1 + len(list((tmp_path / "reports" / "metrics").rglob("*.json")))
    assert max(len(line) for line in lines) <= 120 and "reports/metrics/verdict/claim.json" in shown


def test_plot_data_matches_the_declarations_and_feeds_the_pngs(planted, tmp_path):
    root = planted[0]
    for decl in plot_declarations():
        (pid, spec), = decl.items()
        (path, y), = spec["y"].items()
        with open(root / path, newline="") as f:
            rows = list(csv.DictReader(f))
        assert rows and {spec["x"], y} <= set(rows[0]), pid
        assert all(float(r[spec["x"]]) >= 0 for r in rows) and any(r[y] != "" for r in rows), pid
        # the custom template (.dvc/plots/<name>.json) fills the way `dvc plots show/diff` fills it
        filled = VegaRenderer([dict(r, rev="workspace") for r in rows], pid, template=spec["template"],
                              template_dir=str(REPO / ".dvc" / "plots"), x=spec["x"], y=y,
                              title=spec["title"]).get_filled_template()
        assert "<DVC_METRIC" not in json.dumps(filled) and len(filled["data"]["values"]) == len(rows), pid
    with open(root / "reports" / "plots" / "learning_curves.csv", newline="") as f:
        lc = list(csv.DictReader(f))
    # base: one validation point per seed; every trained arm: STEPS / VAL_EVERY + 1 points per seed
    assert len(lc) == 10 * (1 + (len(ARMS) - 1) * (STEPS // VAL_EVERY + 1))
    with open(root / "reports" / "plots" / "margin_dynamics.csv", newline="") as f:
        assert {r["arm"] for r in csv.DictReader(f)} == set(DYNAMICS_ARMS)
    # the PNG is drawn from the CSV on disk: an emptied CSV gives a different (placeholder) figure
    out = tmp_path / "reports"
    shutil.copytree(root / "reports" / "plots", out / "plots")
    figures.learning_curves_png(out)
    full = (out / "figures" / "learning_curves.png").read_bytes()
    assert full == (root / "reports" / "figures" / "learning_curves.png").read_bytes()
    (out / "plots" / "learning_curves.csv").write_text(",".join(COLUMNS["learning_curves"]) + "\n")
    figures.learning_curves_png(out)
    assert (out / "figures" / "learning_curves.png").read_bytes() != full


def test_seed_variance_shows_the_evaluation_noise_share(planted):
    root, _, test = planted
    x = planted[2]["_samples"]["base"]  # (seeds, tasks, K); 8 + 8 tasks: equal weights
    v = np.var(x.mean(axis=(1, 2)), ddof=1)
    e_k = np.mean(x.var(axis=2, ddof=1).sum(axis=1) / N_TASKS**2 / x.shape[2])
    sv = _read(root, "seed_variance.md")
    line = next(l for l in sv.splitlines() if l.startswith("| base |"))
    assert f"| {e_k / v:.2f} |" in line and f"| {4 * e_k / (v + 3 * e_k):.2f} |" in line
    assert "MDD (80%)" in sv and "observed power" in sv
    assert "power at estimate" not in sv and "Power of the whole claim" not in sv  # no observed power


def test_margin_flags_efficiency_and_clean_audit(planted):
    root, summary, _ = planted
    md = _read(root, "margin_dynamics.md")
    shuffled = [l for l in md.splitlines() if l.startswith("| lopd_shuffled |")]
    assert len(shuffled) == 10 and all("β grows without bound" in l and "Δ never reaches m" in l for l in shuffled)
    assert all(l.rstrip().endswith("| — |") for l in md.splitlines() if l.startswith("| lopd |"))
    assert sum("infeasible_margin" in l for l in md.splitlines() if l.startswith("| lopd_unrelated |")) == 1
    assert all("reference, not flagged" in l for l in md.splitlines() if l.startswith("| lopd_nomargin |"))
    # lopd_shuffled: 10 runs; lopd_unrelated: seed 0 (infeasible); any margin arm added later: Δ stays < m
    extra = set(MARGIN_ARMS) - {"lopd", "lopd_shuffled", "lopd_unrelated"}
    assert summary["margin_flagged_runs"] == 11 + 10 * len(extra)
    assert summary["efficiency_ratio"] is not None and 0 < summary["efficiency_ratio"] < 0.3
    lo, hi = summary["efficiency_ci"]
    assert lo <= summary["efficiency_ratio"] <= hi and "30%" in _read(root, "efficiency.md")
    audit = _read(root, "leakage_audit.md")
    assert CLEAN_LEAKAGE_SENTENCE in audit and "VIOLATION" not in audit and SHA["test"] in audit
    assert summary["leakage_clean"] is True
    for code in ("code_train", "code_evaluate"):  # listed, with no split deps, and not flagged
        assert any(ln.startswith(f"| `{code}` | — | — |") for ln in audit.splitlines()), code


# --------------------------------------------------------------------------- verdicts
def test_no_content_effect_fails_part_two(tmp_path):
    root = tmp_path
    make_fixture(root, null=True)
    summary = build_report(_params(), root)
    fal = _read(root, "falsification.md")
    f = summary["falsification"]
    assert f["gain"] and not f["content"] and not f["claim"]
    assert NO_CLAIM_SENTENCE in fal and "part (ii) content drives it failed" in fal
    assert f["tests"]["lopd > lopd_shuffled"]["diff"] == 0.0 and f["tests"]["lopd > lopd_shuffled"]["p"] == 1.0
    assert _metric(root, "verdict/claim") == {"pass": False} and _metric(root, "premise/gate") == {"pass": "not run"}
    assert "Premise gate (results/probe/result.json): **not run**" in fal
    assert summary["bold_columns"] == {}  # lopd and lopd_shuffled tie at the top


def _rule_only(root: Path, **report) -> tuple[dict, str]:
    """The falsification analysis and falsification.md alone (no figures), as build_report makes them."""
    rule = Rule.from_params(_params(**report).report)
    evals = load_evals(root)
    fal = analyse(rule, {a: values(evals, a) for a in rule.arms()})
    return fal, render(rule, fal, load_premise(root), "(design note)", "(scope)")


def test_no_gain_fails_part_one_and_says_so(tmp_path):
    make_fixture(tmp_path, gain=False)
    fal, md = _rule_only(tmp_path)
    v = fal["verdict"]
    assert not v["gain"] and v["content"] and not v["claim"]
    assert "part (i) LOPD has a gain failed" in md and "lopd > base: p = " in md and NO_CLAIM_SENTENCE in md


def test_four_seeds_cannot_reject_exactly_and_the_report_flags_it(tmp_path):
    make_fixture(tmp_path, n_seeds=4)
    fal, md = _rule_only(tmp_path)
    # 1/2^4 = 0.0625 > 0.05: the exact test can never reject, whatever the effect
    assert DESIGN_FLAG in md and "0.0625" in md and DESIGN_OK not in md
    assert fal["design"]["can_reject"] is False and fal["verdict"]["claim_robust"] is False


def test_rho_contrast_is_hand_checkable(tmp_path):
    test = make_fixture(tmp_path)
    fal, md = _rule_only(tmp_path, rule={"rho": 0.5})
    name = "lopd − lopd_shuffled > 0.5·(lopd − base)"
    row = next(r for r in fal["tests"] if r["name"] == name)
    c = 0.5 * test["lopd"] - test["lopd_shuffled"] + 0.5 * test["base"]
    assert row["diff"] == pytest.approx(c.mean()) and row["t"] == pytest.approx(stats.ttest_1samp(c, 0).statistic)
    assert name in md


# --------------------------------------------------------------------------- missing / bad inputs
@pytest.mark.parametrize("kind", ["dvc_dep", "runtime_read"])
def test_leakage_violation_is_flagged(tmp_path, kind):
    make_fixture(tmp_path, n_seeds=2, hpo_test_dep=kind == "dvc_dep", hpo_reads_test=kind == "runtime_read")
    lk = leakage(tmp_path, load_runs(tmp_path), ["lopd", "lopd_shuffled", "lopd_unrelated"])
    write_leakage(tmp_path / "reports", lk)
    audit = _read(tmp_path, "leakage_audit.md")
    assert "LEAKAGE VIOLATION" in audit and "`hpo`" in audit.split("## Split files")[0]
    assert CLEAN_LEAKAGE_SENTENCE not in audit and lk["clean"] is False


def test_a_draw_that_read_the_test_split_is_a_violation(tmp_path):
    """The final runs' upstream draws (models/draws/bank-<s>, cold_start-<s>) are audited like the shared
    bank: a draw whose manifest records a test read is a violation naming that draw's stage."""
    make_fixture(tmp_path, n_seeds=2)
    assert leakage(tmp_path, load_runs(tmp_path), ["lopd"])["clean"] is True
    _wjson(tmp_path / "models" / "draws" / "bank-1" / "manifest.json",
           {"splits_read": [{"split": "train", "role": "bank", "sha256": SHA["train"]}]})
    _wjson(tmp_path / "models" / "draws" / "cold_start-1" / "manifest.json",
           {"splits_read": [{"split": "test", "role": "cold_start", "sha256": SHA["test"]}]})
    lk = leakage(tmp_path, load_runs(tmp_path), ["lopd"])
    assert lk["clean"] is False
    assert lk["violations"] == ["stage `cold_start_draw` (role 'cold_start') read the test split at run time "
                                "(models/draws/cold_start-1/manifest.json)"]


def test_content_overlap_between_splits_is_a_violation_and_missing_hashes_unverified(tmp_path):
    """Disjoint ids are not enough: a test task with a train task's content (its hash in both lists)
    is a leak; a manifest without content hashes leaves the audit unverified, not clean."""
    make_fixture(tmp_path, n_seeds=2)
    man_path = tmp_path / "data" / "splits" / "manifest.json"
    man = json.loads(man_path.read_text())
    man["files"]["test"]["content"][3] = man["files"]["train"]["content"][7]
    man["files"]["val"]["content"][1] = man["files"]["val"]["content"][0]
    man_path.write_text(json.dumps(man))
    lk = leakage(tmp_path, load_runs(tmp_path), ["lopd"])
    assert lk["content_overlap"] == {"between": {"train-val": 0, "train-test": 1, "val-test": 0},
                                     "within": {"train": 0, "val": 1, "test": 0}}
    assert lk["violations"] == ["splits train and test share 1 tasks by content (same prompt)"]
    assert any("split val holds 1 repeated tasks" in w for w in lk["warnings"]) and lk["clean"] is False
    write_leakage(tmp_path / "reports", lk)
    assert "| train-test | 1 |" in _read(tmp_path, "leakage_audit.md")
    for e in man["files"].values():
        e.pop("content")
    man_path.write_text(json.dumps(man))
    lk = leakage(tmp_path, load_runs(tmp_path), ["lopd"])
    assert lk["content_overlap"] is None and lk["clean"] is False
    assert any("no content hashes" in u for u in lk["unverified"])


def test_an_extra_seed_stage_is_audited_as_the_stage_it_repeats(tmp_path):
    make_fixture(tmp_path, n_seeds=2)
    dvc = yaml.safe_load((tmp_path / "dvc.yaml").read_text())
    dvc["stages"]["train_extra"] = {**dvc["stages"]["train"], "deps": ["data/splits/test.jsonl"]}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(dvc, sort_keys=False))
    lk = leakage(tmp_path, load_runs(tmp_path), ["lopd"])
    assert [v for v in lk["violations"] if "`train_extra`" in v] and not [v for v in lk["violations"] if "evaluate" in v]


def test_one_sample_per_task_and_bad_per_task_files_are_named(tmp_path):
    make_fixture(tmp_path, n_seeds=3, samples=1)
    (tmp_path / "results" / "eval" / "grpo" / "seed-1" / "per_task.json").write_text("[]")  # disagrees with result.json
    build_report(_params(), tmp_path)
    assert "per-sample rewards absent (1 sample per task)" in _read(tmp_path, "seed_variance.md")
    readme = _read(tmp_path, "README.md")
    assert "grpo-1: per_task.json gives nan" in readme


def test_missing_optional_inputs_do_not_crash(tmp_path):
    arms = tuple(a for a in ARMS if a not in ("opsd_text", "lopd_unrelated"))
    make_fixture(tmp_path, n_seeds=3, hpo=False, sensitivity=False, arms=arms)
    summary = build_report(_params(), tmp_path)
    for name in EXPECTED_FILES:
        assert (tmp_path / "reports" / name).exists(), name
    missing = " ".join(summary["missing_inputs"])
    assert all(m in missing for m in ("hpo/trials.csv", "results/sensitivity/grid.csv", "opsd_text", "lopd_unrelated"))
    fal = _read(tmp_path, "falsification.md")
    assert NO_CLAIM_SENTENCE in fal and "missing (lopd_unrelated)" in fal and DESIGN_FLAG in fal


def test_rule_params_are_validated():
    with pytest.raises(BadInput, match="report.rule"):
        _params(rule={"gain_over": ["base", "nope"]})
    with pytest.raises(BadInput, match="report.rule"):
        _params(rule={"content_controls": ["lopd"]})
    with pytest.raises(BadInput, match="report.rule.rho"):
        _params(rule={"rho": 1.5})


def test_missing_runs_raise_bad_input(tmp_path):
    with pytest.raises(BadInput, match="no training runs"):
        build_report(_params(), tmp_path)


def test_missing_eval_results_still_writes_every_file(tmp_path):
    make_fixture(tmp_path, n_seeds=2, arms=("grpo", "lopd"))
    for p in (tmp_path / "results" / "eval").glob("*/seed-*/result.json"):
        p.unlink()
    summary = build_report(_params(), tmp_path)
    for name in EXPECTED_FILES:
        assert (tmp_path / "reports" / name).exists(), name
    assert "MISSING" in _read(tmp_path, "main_table.md") and summary["test_reward"] == {}
    assert summary["falsification"]["claim"] is False


# --------------------------------------------------------------------------- falsification edge cases
def _rule(gain_over=("base",), content=("lopd_shuffled", "lopd_unrelated"), alpha=0.05) -> Rule:
    return Rule("(rule text)", "lopd", tuple(gain_over), tuple(content), None, "base", alpha)


def _row(fal: dict, name: str) -> dict:
    return next(r for r in fal["tests"] if r["name"] == name)


def test_one_content_control_passing_does_not_carry_part_two():
    """Intersection–union: lopd beats lopd_shuffled but not lopd_unrelated, so part (ii) fails and the
    verdict names only the failing test. Per-seed contrasts (5 seeds): vs base and vs shuffled
    d = (1..5)/8, mean 3/8, sd √(5/128), t = 3√2 on 4 df, every sign positive (exact p = 1/32); vs
    unrelated d = (−2..2)/8, mean 0, t = 0, p = 1/2, exact p = P(S ≥ 0) = (1 + 4/16)/2 = 0.625."""
    lopd = {s: 1.0 for s in range(5)}
    base = {s: 1.0 - (s + 1) / 8 for s in range(5)}
    unrelated = {s: 1.0 - (s - 2) / 8 for s in range(5)}
    rule = _rule()
    fal = analyse(rule, {"lopd": lopd, "base": base, "lopd_shuffled": dict(base), "lopd_unrelated": unrelated})
    for name in ("lopd > base", "lopd > lopd_shuffled"):
        r = _row(fal, name)
        assert r["diff"] == 0.375 and r["t"] == pytest.approx(3 * math.sqrt(2))
        assert r["p"] == pytest.approx(stats.t.sf(3 * math.sqrt(2), 4)) and r["p_exact"] == 1 / 32
        assert r["reject"] and r["robust"]
    r = _row(fal, "lopd > lopd_unrelated")
    assert (r["diff"], r["t"], r["p"], r["p_exact"], r["reject"]) == (0.0, 0.0, 0.5, 0.625, False)
    assert fal["verdict"] == {"gain": True, "gain_robust": True, "content": False, "content_robust": False,
                              "claim": False, "claim_robust": False}
    md = render(rule, fal, {"path": "results/probe/result.json", "status": "holds", "delta": {}}, "(note)", "(scope)")
    assert "- Part (i) LOPD has a gain: **holds**." in md
    assert "- Part (ii) content drives it: **fails** (lopd > lopd_unrelated: p = 0.5000 not < 0.05)." in md
    assert f"**{NO_CLAIM_SENTENCE}**: part (ii) content drives it failed." in md and f"**{CLAIM_SENTENCE}**" not in md


def test_each_test_uses_only_the_seeds_its_arms_share():
    """lopd has seeds 0-5, base 0-3, lopd_shuffled 2-6, lopd_unrelated 7-8; lopd's seeds 4 and 5 hold 0.0,
    so a test that used unshared seeds would be pulled far down. lopd > base on seeds 0-3:
    d = (.5, .375, .375, .25), mean 0.375; lopd > lopd_shuffled on seeds 2-5: d = (.25, .125, −.125, −.25),
    mean 0, t = 0; lopd > lopd_unrelated: no shared seed, n = 0 (both arms present, so not 'missing'),
    hence the design is flagged and part (ii) fails."""
    lopd = {0: 1.0, 1: 0.875, 2: 0.75, 3: 0.625, 4: 0.0, 5: 0.0}
    base = {0: 0.5, 1: 0.5, 2: 0.375, 3: 0.375}
    shuffled = {2: 0.5, 3: 0.5, 4: 0.125, 5: 0.25, 6: 0.0}
    unrelated = {7: 0.0, 8: 0.0}
    rule = _rule()
    fal = analyse(rule, {"lopd": lopd, "base": base, "lopd_shuffled": shuffled, "lopd_unrelated": unrelated})
    g, c, u = (_row(fal, f"lopd > {x}") for x in ("base", "lopd_shuffled", "lopd_unrelated"))
    assert (g["n"], g["seeds"], g["diff"]) == (4, [0, 1, 2, 3], 0.375)
    assert (c["n"], c["seeds"], c["diff"], c["t"], c["reject"]) == (4, [2, 3, 4, 5], 0.0, 0.0, False)
    assert (u["n"], u["missing"], u["reject"]) == (0, [], False) and "diff" not in u
    assert fal["design"] == {"n_min": 0, "floor": 1.0, "can_reject": False}
    assert not fal["verdict"]["content"] and not fal["verdict"]["claim"]
    md = render(rule, fal, {"path": "results/probe/result.json", "status": "holds", "delta": {}}, "(note)", "(scope)")
    assert "| (ii) content drives it | lopd > lopd_unrelated | 0 | no shared seeds |" in md
    assert f"**{DESIGN_FLAG}: a test of the rule has no paired seeds" in md


def test_p_exactly_alpha_does_not_reject():
    """Every test rejects only for p strictly below α. Exact sign-flip: 4 seeds all favouring lopd give
    p = 1/2⁴ = 0.0625; with α = 0.0625 that is not below α (robust: no), the design check says the exact
    test cannot reject (floor 0.0625 not below α), while the t-test (p ≈ 0.015) rejects. t-test: contrast
    (.25, −.25, .25, −.25) has mean 0, t = 0, p = 1/2 exactly; α = 0.5 does not reject, a hair above does."""
    lopd = {s: 1.0 for s in range(4)}
    base = {s: 1.0 - (s + 1) / 8 for s in range(4)}  # d = (1..4)/8
    fal = analyse(_rule(content=("lopd_shuffled",), alpha=0.0625),
                  {"lopd": lopd, "base": base, "lopd_shuffled": dict(base)})
    r = _row(fal, "lopd > base")
    assert r["p_exact"] == 0.0625 and r["robust"] is False
    # d = (1..4)/8: mean 5/16, sample variance 5/192, t = (5/16) / (√(5/192) / 2) ≈ 3.87 on 3 df
    assert r["p"] == pytest.approx(stats.t.sf(0.3125 / (math.sqrt(5 / 192) / 2), 3)) and r["reject"] is True
    assert fal["design"] == {"n_min": 4, "floor": 0.0625, "can_reject": False}
    assert fal["verdict"]["claim"] is True and fal["verdict"]["claim_robust"] is False
    shuffled = {s: 1.0 - (0.25 if s % 2 == 0 else -0.25) for s in range(4)}
    values = {"lopd": lopd, "base": {s: 0.0 for s in range(4)}, "lopd_shuffled": shuffled}
    for alpha, rejects in ((0.5, False), (math.nextafter(0.5, 1.0), True)):
        rule = _rule(content=("lopd_shuffled",), alpha=alpha)
        r = _row(analyse(rule, values), "lopd > lopd_shuffled")
        assert r["p"] == 0.5 and r["reject"] is rejects, alpha
        aligned = {a: np.array([v[s] for s in range(4)]) for a, v in values.items()}
        assert bool(decide(aligned, rule)["reject"]["lopd > lopd_shuffled"]) is rejects, alpha


def test_a_failed_premise_gate_is_rendered_as_not_holding(tmp_path):
    """premise_holds false in results/probe/result.json: the gate reads 'does not hold' in
    falsification.md (never 'holds') and its metric is pass false; a non-boolean premise_holds is
    'unknown', not a pass."""
    from lopd.analysis.tables import write_metrics

    _wjson(tmp_path / "results" / "probe" / "result.json",
           {"premise_holds": False, "by_mode": {"relevant": {"mean_delta": 0.0125}, "shuffled": {"mean_delta": 0.03}}})
    premise = load_premise(tmp_path)
    assert premise == {"path": "results/probe/result.json", "holds": False, "status": "does not hold",
                       "delta": {"relevant": 0.0125, "shuffled": 0.03}}
    rule = _rule()
    fal = analyse(rule, {a: {0: 1.0, 1: 0.5} for a in rule.arms()})
    md = render(rule, fal, premise, "(note)", "(scope)")
    gate = md[md.index("## Premise gate"):md.index("## Design check")]
    assert ("Premise gate (results/probe/result.json): **does not hold** (δ relevant = 0.0125; δ shuffled = 0.0300)."
            in gate) and "**holds**" not in gate
    write_metrics(tmp_path / "reports", {"arms": [], "cells": {}}, fal, premise)
    assert _metric(tmp_path, "premise/gate") == {"pass": False}
    _wjson(tmp_path / "results" / "probe" / "result.json", {"premise_holds": "false"})
    assert load_premise(tmp_path)["status"] == "unknown (no premise_holds key)"
    assert load_premise(tmp_path)["holds"] is None


# --------------------------------------------------------------------------- efficiency ratio
def _eff_run(rollouts, vals, total=None) -> dict:
    return {"result": {"rollouts_used": rollouts[-1] if total is None else total},
            "history": {"step": np.arange(len(rollouts), dtype=float), "rollouts_used": np.array(rollouts, float),
                        "val_reward": np.array(vals, float)}}


GRPO_RUNS = {0: _eff_run([0, 50, 100], [0.4, 0.5, 0.6], total=100), 1: _eff_run([0, 100], [0.4, 0.8], total=120)}


def test_efficiency_ratio_interpolates_the_mean_lopd_curve():
    """GRPO target = mean of each seed's last val reward = (0.6 + 0.8)/2 = 0.7; GRPO total = mean of
    rollouts_used = 110. lopd seed 0: (0, 0.4) → (40, 1.0); seed 1: (0, 0.4) → (20, 0.6), then held at
    0.6. On the union grid (0, 20, 40): seed 0 = (0.4, 0.7, 1.0), mean curve = (0.4, 0.65, 0.8); 0.7 is
    crossed 1/3 of the way from 20 to 40: x = 80/3, ratio = (80/3)/110 = 8/33."""
    from lopd.analysis.dynamics import efficiency, render_efficiency

    lopd = {0: _eff_run([0, 40], [0.4, 1.0]), 1: _eff_run([0, 20], [0.4, 0.6])}
    eff = efficiency({"grpo": GRPO_RUNS, "lopd": lopd}, 200, min_bootstrap_seeds=2)
    assert eff["target"] == pytest.approx(0.7) and eff["grpo_total"] == 110.0
    assert eff["x"] == pytest.approx(80 / 3) and eff["ratio"] == pytest.approx(8 / 33) and eff["reached"]
    # bootstrap: the smallest resample ratio (both lopd draws seed 0, both GRPO draws seed 0: 0.6 crossed
    # on 0.4 → 0.7 at x = 40/3) has probability 1/16 > 2.5%, and so has a never-reached one (both lopd
    # draws seed 1, max 0.6; both GRPO draws seed 1, target 0.8): lower bound 4/33, upper bound ∞
    lo, hi = eff["ci"]
    assert lo == pytest.approx(4 / 33) and hi == math.inf
    md = render_efficiency(eff, 200)
    assert "**Ratio: 0.242** (27 / 110 rollouts), 95% CI [0.121, not reached]" in md
    assert "The < 30% claim is NOT established by this data" in md and "Counting the bank" not in md
    # the bank's 55 base rollouts counted: (80/3 + 55) / 110, the interval shifted by 55/110
    banked = efficiency({"grpo": GRPO_RUNS, "lopd": lopd}, 200, min_bootstrap_seeds=2, bank_rollouts=55)
    assert banked["ratio"] == eff["ratio"] and banked["ratio_with_bank"] == pytest.approx((80 / 3 + 55) / 110)
    assert banked["ci_with_bank"][0] == pytest.approx(4 / 33 + 0.5) and banked["ci_with_bank"][1] == math.inf
    assert "**Counting the bank: 0.742**, 95% CI [0.621, not reached] ((27 + 55) / 110 rollouts)" in \
        render_efficiency(banked, 200)


def test_efficiency_not_reached_is_reported_as_such():
    """lopd's mean curve tops out at 0.5 < target 0.7 within its 40 rollouts: no ratio, and the report
    says 'not reached' (a finding), with every bootstrap resample unreached."""
    from lopd.analysis.dynamics import efficiency, render_efficiency

    eff = efficiency({"grpo": GRPO_RUNS, "lopd": {0: _eff_run([0, 40], [0.4, 0.5])}}, 200, min_bootstrap_seeds=1)
    assert eff["reached"] is False and eff["ratio"] is None and eff["x"] == math.inf
    assert eff["frac_reached"] == 0.0 and eff["lopd_max_rollouts"] == 40.0
    md = render_efficiency(eff, 200)
    assert "**Ratio: not reached.**" in md and "within the 40 rollouts it used" in md
    assert "CI [not reached, not reached]" in md and "**Ratio: degenerate" not in md


def test_efficiency_has_no_bootstrap_interval_below_the_registered_seed_count():
    """The same runs as the interpolation test (2 seeds per arm) under the default rule (8 seeds): the point
    ratio, no interval, and the report says why; from 8 seeds on the interval is there again."""
    from lopd.analysis.dynamics import efficiency, render_efficiency

    lopd = {0: _eff_run([0, 40], [0.4, 1.0]), 1: _eff_run([0, 20], [0.4, 0.6])}
    eff = efficiency({"grpo": GRPO_RUNS, "lopd": lopd}, 200, min_bootstrap_seeds=8)
    assert eff["ratio"] == pytest.approx(8 / 33) and eff["ci"] == (None, None) and eff["frac_reached"] is None
    md = render_efficiency(eff, 200)
    assert "no CI: lopd has 2 and grpo 2 seeds" in md and "from 8 seeds per arm" in md and "95% CI" not in md
    many = {s: lopd[s % 2] for s in range(8)}
    grpo8 = {s: GRPO_RUNS[s % 2] for s in range(8)}
    assert efficiency({"grpo": grpo8, "lopd": many}, 200, min_bootstrap_seeds=8)["ci"][0] is not None


def test_efficiency_degenerate_when_grpo_ends_at_or_below_the_start():
    """GRPO ends at 0.3, below the 0.4 every run starts from: lopd 'reaches' it at 0 rollouts. The ratio
    is 0 / 100, reported as degenerate (no test of the claim), not as lopd being infinitely efficient."""
    from lopd.analysis.dynamics import efficiency, render_efficiency

    eff = efficiency({"grpo": {0: _eff_run([0, 100], [0.4, 0.3])}, "lopd": {0: _eff_run([0, 40], [0.4, 0.5])}}, 200,
                     min_bootstrap_seeds=1)
    assert eff["reached"] and eff["x"] == 0.0 and eff["ratio"] == 0.0 and eff["target"] == 0.3
    md = render_efficiency(eff, 200)
    assert "**Ratio: degenerate (0 / 100).**" in md and "**Ratio: 0.000**" not in md
    assert "cannot test the paper's efficiency claim" in md


def test_margin_contrasts_by_hand():
    """a − b per shared seed, two-sided. lopd {0: .5, 1: .6, 2: .7, 3: .8}, lopd_ramp {0: .4, 1: .6, 2: .6, 3: .6,
    9: .1}: shared seeds 0-3, diffs .1, 0, .1, .2: mean .1, sd sqrt(.02/3) = .08165, se .040825, t = 2.4495 on
    3 df, two-sided p = 0.0917; sign flip: |sum| ≥ .4 only when .1, .1, .2 share a sign, 2 × 2 (either sign of
    the 0) of 16 sign vectors, p = 0.25. An arm without seeds is reported missing, with the reason it was not
    run where one is recorded."""
    from lopd.analysis.falsification import margin_contrast_tests, render_margin_contrasts

    by_seed = {"lopd": {0: .5, 1: .6, 2: .7, 3: .8}, "lopd_ramp": {0: .4, 1: .6, 2: .6, 3: .6, 9: .1},
               "lopd_frozen": {0: .3, 1: .3}}
    pairs = [["lopd", "lopd_ramp"], ["lopd", "lopd_fixbeta"], ["lopd_binding", "lopd_frozen"]]
    ramp, fix, binding = margin_contrast_tests(pairs, by_seed, {"lopd_binding": "no trial binds"})
    assert ramp["n"] == 4 and ramp["diff"] == pytest.approx(0.1)
    assert ramp["p"] == pytest.approx(0.0917, abs=5e-4)
    lo, hi = ramp["ci95"]
    assert lo == pytest.approx(0.1 - 3.18245 * 0.040825, abs=1e-4) and hi == pytest.approx(0.1 + 3.18245 * 0.040825, abs=1e-4)
    assert ramp["p_exact"] == pytest.approx(0.25)
    assert fix == {"a": "lopd", "b": "lopd_fixbeta", "n": 0, "missing": ["lopd_fixbeta"], "not_run": {}}
    assert binding["missing"] == ["lopd_binding"] and binding["not_run"] == {"lopd_binding": "no trial binds"}
    md = "\n".join(render_margin_contrasts([ramp, fix, binding]))
    assert "| lopd − lopd_ramp | 4 | 0.1000 |" in md and "lopd_fixbeta has no seeds" in md
    assert "lopd_binding not run: no trial binds" in md


def test_pilot_design_sizes_the_confirmatory_run_at_the_registered_effect_not_the_observed_one():
    """Two rule tests over 6 shared seeds. The covariance is inflated by (n − 1)/χ²_{0.2, n−1} (the 80% upper
    bound of a variance); every mean is set to the registered effect, so shifting the observed contrasts by a
    constant (a larger observed effect) changes nothing; the seeds needed are the smallest n with 80% power."""
    from lopd.analysis import power as power_mod
    from lopd.analysis.variance import pilot_design

    a = np.array([0.05, 0.01, 0.04, 0.08, 0.02, 0.06])
    b = np.array([0.03, 0.00, 0.05, 0.06, 0.01, 0.07])

    def fal(shift):
        return {"tests": [{"name": "x", "n": 6, "seeds": list(range(6)), "contrast": a + shift},
                          {"name": "y", "n": 6, "seeds": list(range(6)), "contrast": b + shift}]}

    pd = pilot_design(fal(0.0), 0.03, 0.05, 0.8, 10, 0.8)
    factor = 5 / stats.chi2.ppf(0.2, 5)
    assert pd["factor"] == pytest.approx(factor) and pd["n"] == 6
    assert pd["sd"] == pytest.approx([a.std(ddof=1), b.std(ddof=1)])
    assert pd["sd_upper"] == pytest.approx([a.std(ddof=1) * factor**0.5, b.std(ddof=1) * factor**0.5])
    cov = np.cov(np.stack([a, b]), rowvar=True) * factor
    assert pd["power_at_design"] == pytest.approx(power_mod.joint_power([0.03, 0.03], cov, 10))
    n = pd["seeds_needed"]
    assert power_mod.joint_power([0.03, 0.03], cov, n, n_sim=2000) >= 0.8 > power_mod.joint_power(
        [0.03, 0.03], cov, n - 1, n_sim=2000)
    shifted = pilot_design(fal(1.0), 0.03, 0.05, 0.8, 10, 0.8)
    assert shifted["power_at_design"] == pd["power_at_design"] and shifted["seeds_needed"] == n
    assert "why" in pilot_design({"tests": [{"name": "x", "n": 2, "seeds": [0, 1], "contrast": a[:2]}]},
                                 0.03, 0.05, 0.8, 10, 0.8)
