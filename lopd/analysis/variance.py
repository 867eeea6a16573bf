"""Seed variance: how noisy the seeds are (the evaluation-noise share of each arm's seed variance), the power
of the pre-registered rule at the planned design, and the design the pilot's own covariance implies."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from lopd.analysis import power as power_mod
from lopd.analysis import stats as st
from lopd.analysis.render import arm_order, fmt, md_table, write_text


def _samples_array(by_seed: dict[int, dict]) -> tuple[np.ndarray | None, np.ndarray | None, str]:
    """(seeds × tasks × K) per-sample rewards on the tasks every seed evaluated, per-task weights that make
    the per-seed value the mean of domain means, or (None, None, why not)."""
    if len(by_seed) < 2:
        return None, None, "fewer than 2 seeds with per-task rewards"
    tasks = sorted(set.intersection(*(set(s) for s in by_seed.values())))
    ks = {len(by_seed[s][t][1]) for s in by_seed for t in tasks}
    if not tasks or len(ks) != 1:
        return None, None, f"samples per task differ across tasks/seeds ({sorted(ks)})" if tasks else "no common tasks"
    k = ks.pop()
    if k < 2:
        return None, None, "per-sample rewards absent (1 sample per task)"
    x = np.array([[by_seed[s][t][1] for t in tasks] for s in sorted(by_seed)])
    doms = [by_seed[min(by_seed)][t][0] for t in tasks]
    counts = {d: doms.count(d) for d in set(doms)}
    w = np.array([1.0 / (len(counts) * counts[d]) for d in doms])
    return x, w, ""


def seed_variance(evals, table: dict) -> list[dict]:
    """Per arm: seed-to-seed std of the mean test reward and, where per-sample rewards exist, the
    evaluation-noise share of the seed variance with K samples and predicted for 1 sample
    (:func:`st.eval_noise_share`)."""
    rows = []
    for arm in arm_order(evals):
        vals = np.array([e["mean"] for e in evals[arm].values()])
        row = {"arm": arm, "n": vals.size, "std": float(np.std(vals, ddof=1)) if vals.size > 1 else math.nan}
        x, w, why = _samples_array(table.get(arm, {}))
        row.update(st.eval_noise_share(x, weights=w) if x is not None else {"why": why})
        rows.append(row)
    return rows


def rule_variance(fal: dict, alpha: float, power: float) -> dict:
    """For each pre-registered test: the sd of its per-seed contrast and the minimum detectable effect
    (:func:`power_mod.min_detectable_diff`: the smallest true effect the one-sided t-test at ``alpha`` detects
    with ``power`` at this n and this sd). No power at the observed estimate: that is the p-value restated
    (observed power), so it is not reported; the design's power at its planned effect is in falsification.md."""
    rows = []
    for r in fal["tests"]:
        if r["n"] < 2:
            rows.append({"name": r["name"], "n": r["n"]})
            continue
        sd = float(np.std(r["contrast"], ddof=1))
        rows.append({"name": r["name"], "n": r["n"], "diff": r["diff"], "sd": sd,
                     "mdd": power_mod.min_detectable_diff(sd, r["n"], alpha=alpha, power=power)})
    return {"tests": rows}


def pilot_design(fal: dict, effect: float, alpha: float, power: float, n_design: int, upper: float) -> dict:
    """This run as the pilot of a confirmatory one: the seeds the rule needs at the registered effect.

    The per-seed contrasts of every test of the rule on the seeds all tests share (n of them) give the
    covariance Σ̂ (k × k). It is inflated to its one-sided ``upper`` confidence bound as a variance,
    Σ_u = Σ̂ · (n − 1) / χ²_{1−upper, n−1} (correlations kept), because a pilot's variance is itself noisy
    and the design must not rest on its luck. With every contrast's mean at the registered ``effect``
    (not the observed one: that would be observed power), :func:`power_mod.joint_power` gives the power of the
    whole rule (every test rejects) at ``n_design`` seeds, and :func:`power_mod.joint_seeds_needed` the
    smallest n reaching ``power``. Fewer than 3 shared seeds: ``why``."""

    rows = [r for r in fal["tests"] if r["n"] >= 2]
    common = sorted(set.intersection(*(set(r["seeds"]) for r in rows))) if rows and len(rows) == len(fal["tests"]) else []
    if len(common) < 3:
        return {"why": "fewer than 3 seeds shared by every test of the rule"}
    m = np.array([[r["contrast"][r["seeds"].index(s)] for r in rows] for s in common])
    n = len(common)
    cov = np.atleast_2d(np.cov(m, rowvar=False))
    factor = power_mod.variance_upper_factor(n, upper)
    mean = np.full(len(rows), float(effect))
    return {"n": n, "tests": [r["name"] for r in rows], "sd": [float(v) for v in np.sqrt(np.diag(cov))],
            "sd_upper": [float(v) for v in np.sqrt(np.diag(cov) * factor)], "factor": factor, "effect": float(effect),
            "upper": upper, "n_design": n_design,
            "power_at_design": power_mod.joint_power(mean, cov * factor, n_design, alpha=alpha),
            "power_at_design_pilot_cov": power_mod.joint_power(mean, cov, n_design, alpha=alpha),
            "seeds_needed": power_mod.joint_seeds_needed(mean, cov * factor, alpha=alpha, power=power)}


def pilot_design_lines(pd: dict, alpha: float, power: float) -> list[str]:
    md = ["", "## Seeds a confirmatory run needs, with this run as its pilot", ""]
    if "why" in pd:
        return md + [f"Not computed: {pd['why']}."]
    need = f"no n ≤ 100 reaches {power:.0%}" if pd["seeds_needed"] is None else f"**{pd['seeds_needed']} seeds**"
    md += [f"The rule's per-seed contrasts on the {pd['n']} seeds every test shares give their covariance; it is "
           f"inflated to its {pd['upper']:.0%} upper confidence bound (variances × {pd['factor']:.2f}, correlations "
           f"kept), and every contrast's mean is set to the registered effect {pd['effect']:g} "
           "(report.design.effect), not to the observed estimate. Power of the whole rule (every test rejects, "
           f"one-sided t at α = {alpha}), by simulation: {pd['power_at_design']:.2f} with {pd['n_design']} seeds "
           f"({pd['power_at_design_pilot_cov']:.2f} with the covariance as observed); {power:.0%} power needs {need}.",
           "", md_table(["test", "sd (per seed)", f"sd at its {pd['upper']:.0%} upper bound"],
                        [[t, fmt(s, 4), fmt(u, 4)] for t, s, u in zip(pd["tests"], pd["sd"], pd["sd_upper"])])]
    return md


def write_seed_variance(out: Path, rows: list[dict], pw: dict, alpha: float, power: float,
                        pilot: dict | None = None) -> None:
    md = ["# Seed variance, evaluation noise and power", "",
          "## Seed-to-seed spread and its evaluation-noise share", "",
          "Per arm: std over seeds of the mean test reward. With K ≥ 2 samples per test task, the evaluation "
          "(sampling) noise of a seed's mean is estimated from the within-task variance over samples; its share of "
          "the seed-to-seed variance is shown as measured (K samples) and as predicted for one sample per task "
          "(before multi-sample evaluation). A share near 1 means the seeds differ by no more than evaluation noise "
          "(expected for base, which does not train); shares are estimates and can exceed 1.", ""]
    table = []
    for r in rows:
        if "share" in r:
            table.append([r["arm"], str(r["n"]), fmt(r["std"], 4), str(r["samples"]), fmt(math.sqrt(r["eval_var"]), 4),
                          fmt(r["share"], 2), fmt(math.sqrt(r["eval_var_1"]), 4), fmt(r["share_1"], 2)])
        else:
            table.append([r["arm"], str(r["n"]), fmt(r["std"], 4), "—", "—", "—", "—", r["why"]])
    md.append(md_table(["arm", "n seeds", "seed std", "K", "eval-noise sd (K)", "eval share (K)",
                        "eval-noise sd (1 sample, predicted)", "eval share (1 sample, predicted)"], table) if table else
              "MISSING: no evaluation results.")
    md += ["", "## Spread of the pre-registered tests' contrasts", "",
           f"Per test of the rule: the sd over seeds of its per-seed contrast, and the minimum detectable effect "
           f"(MDD): the smallest true effect the one-sided paired t-test at α = {alpha} detects with {power:.0%} "
           "power at this n and this sd. No power at the observed estimate is given: it restates the p-value "
           "(observed power). The design's power at its planned effect is in falsification.md.", ""]
    md.append(md_table(["test", "n seeds", "estimate", "sd (per seed)", f"MDD ({power:.0%})"],
                       [[t["name"], str(t["n"]), *([f"{t['diff']:+.4f}", fmt(t["sd"], 4), fmt(t["mdd"], 4)]
                         if "sd" in t else ["n/a"] * 3)] for t in pw["tests"]]))
    if pilot is not None:
        md += pilot_design_lines(pilot, alpha, power)
    write_text(out / "seed_variance.md", "\n".join(md))
