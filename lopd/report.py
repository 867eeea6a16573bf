"""The `report` stage: tables, statistical comparisons, audits and figures under ``reports/``.

:func:`build_report` reads only files written by the other stages (``runs/``, ``results/``,
``hpo/``, ``data/splits/manifest.json``, ``dvc.yaml``) and writes

* ``main_table.md`` / ``main_table.tex``: test reward per domain and mean, ``mean ± t-CI``;
* ``comparisons.md``: lopd vs every other arm (paired over seeds, Holm over the family);
* ``falsification.md``: the pre-registered rule, then the numbers, then the verdict;
* ``margin_dynamics.md`` + ``figures/margin_dynamics.png``: Δ(φ), β, margin satisfaction;
* ``efficiency.md`` + ``figures/efficiency.png``: rollouts lopd needs to reach GRPO's final
  validation reward;
* ``figures/sensitivity.png``: validation reward vs m, K, n_ret;
* ``seed_variance.md``: seed spread and power analysis;
* ``leakage_audit.md``: which stage depends on / read which split;
* ``figures/learning_curves.png``; ``summary.json`` (DVC metrics); ``README.md`` (index).

Every output is always written (DVC expects all declared outs): when an optional input is
missing, the file says what is missing instead. No runs at all raises :class:`BadInput`.
No torch here: the report must be fast and run anywhere.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from lopd import stats as st
from lopd.arms import ARMS
from lopd.errors import BadInput
from lopd.utils import write_json

REPORT_DIR = "reports"
MEAN_COL = "mean"
MARGIN_ARMS = ("lopd", "lopd_shuffled", "lopd_unrelated")  # arms where the margin constraint is active
DYNAMICS_ARMS = (*MARGIN_ARMS, "lopd_nomargin")
EFFICIENCY_ARMS = ("lopd", "grpo", "opsd_text")
CONTROLS = ("lopd_shuffled", "lopd_unrelated")
SPLITS = ("train", "val", "test")
PAPER_EFFICIENCY_CLAIM = 0.30
POWER = 0.8
NULL_SENTENCE = "The control did not falsify the null"
CLEAN_LEAKAGE_SENTENCE = (
    "The hyper-parameters (m, K, n_ret) were selected on the validation split only; "
    "no stage other than evaluate depends on or read the test split."
)
EVAL_STAGE = "evaluate"
HPO_STAGE = "hpo"

_COLORS = {
    "base": "#7f7f7f", "sft": "#8c564b", "grpo": "#d62728", "opsd_text": "#ff7f0e", "lopd_frozen": "#bcbd22",
    "lopd_nomargin": "#9467bd", "lopd": "#1f77b4", "lopd_shuffled": "#2ca02c", "lopd_unrelated": "#17becf",
}


# --------------------------------------------------------------------------- #
# small helpers
# --------------------------------------------------------------------------- #
def _write_text(path: Path, text: str) -> None:
    """Atomic text write (tmp + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text if text.endswith("\n") else text + "\n")
    os.replace(tmp, path)


def _save_fig(fig: Figure, path: Path) -> None:
    """Atomic PNG write through the Agg canvas (no pyplot global state)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    os.replace(tmp, path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise BadInput(f"{path}: not valid JSON: {e}") from None


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _f(x: Any, nd: int = 3) -> str:
    """Format a number for a table; n/a for None/nan, inf as such."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if isinstance(x, float) and math.isinf(x):
        return "∞" if x > 0 else "-∞"
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return str(int(x))
    return f"{x:.{nd}f}"


def _fp(p: Any) -> str:
    """Format a p-value."""
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "n/a"
    if p < 1e-4:
        return f"{p:.1e}"
    return f"{p:.4f}"


def _none_if_nan(x: Any) -> Any:
    if isinstance(x, (float, np.floating)) and not math.isfinite(float(x)):
        return None
    if isinstance(x, np.generic):
        return x.item()
    return x


def _arm_order(names) -> list[str]:
    names = set(names)
    return [a for a in ARMS if a in names] + sorted(names - set(ARMS))


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _tex_escape(s: str) -> str:
    return (s.replace("\\", r"\textbackslash{}").replace("_", r"\_").replace("%", r"\%")
            .replace("&", r"\&").replace("#", r"\#"))


# --------------------------------------------------------------------------- #
# loading
# --------------------------------------------------------------------------- #
def _read_history(path: Path) -> dict[str, np.ndarray]:
    """history.csv -> {column: float array}, empty cell = nan."""
    if not path.exists():
        return {}
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return {}
    cols = rows[0].keys()
    out = {}
    for c in cols:
        vals = []
        for r in rows:
            v = (r.get(c) or "").strip()
            try:
                vals.append(float(v) if v else math.nan)
            except ValueError:
                vals.append(math.nan)
        out[c] = np.asarray(vals, dtype=float)
    return out


def _load_runs(root: Path) -> dict[str, dict[int, dict]]:
    runs: dict[str, dict[int, dict]] = {}
    for p in sorted((root / "runs").glob("*/result.json")):
        r = _read_json(p)
        if not isinstance(r, dict) or "arm" not in r or "seed" not in r:
            raise BadInput(f"{p}: a run result needs 'arm' and 'seed'")
        runs.setdefault(str(r["arm"]), {})[int(r["seed"])] = {
            "result": r, "history": _read_history(p.parent / "history.csv"), "dir": p.parent}
    return runs


def _load_evals(root: Path) -> dict[str, dict[int, dict]]:
    evals: dict[str, dict[int, dict]] = {}
    for p in sorted((root / "results" / "eval").glob("*/result.json")):
        r = _read_json(p)
        if not isinstance(r, dict) or "arm" not in r or "seed" not in r or not _finite(r.get("test_reward")):
            raise BadInput(f"{p}: an evaluation result needs 'arm', 'seed' and a finite 'test_reward'")
        by_dom = {str(k): float(v) for k, v in (r.get("test_reward_by_domain") or {}).items() if _finite(v)}
        evals.setdefault(str(r["arm"]), {})[int(r["seed"])] = {"mean": float(r["test_reward"]), "by_domain": by_dom}
    return evals


def _series(hist: dict[str, np.ndarray], xcol: str, ycol: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows of history where both x and y were measured."""
    if xcol not in hist or ycol not in hist:
        return np.array([]), np.array([])
    x, y = hist[xcol], hist[ycol]
    ok = np.isfinite(x) & np.isfinite(y)
    order = np.argsort(x[ok], kind="stable")
    return x[ok][order], y[ok][order]


def _aggregate(curves: list[tuple[np.ndarray, np.ndarray]]) -> dict | None:
    """Seeds' curves on the union grid: mean, std, min, max (nan outside a seed's range)."""
    curves = [(x, y) for x, y in curves if x.size]
    if not curves:
        return None
    grid = np.unique(np.concatenate([x for x, _ in curves]))
    Y = np.full((len(curves), grid.size), np.nan)
    for i, (x, y) in enumerate(curves):
        # duplicate x (shouldn't happen) -> keep the last measurement
        xu, idx = np.unique(x[::-1], return_index=True)
        yu = y[::-1][idx]
        inside = (grid >= xu[0]) & (grid <= xu[-1])
        Y[i, inside] = np.interp(grid[inside], xu, yu)
    n = np.sum(np.isfinite(Y), axis=0)  # every grid point is some seed's measurement: n >= 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # ddof=1 on a single seed
        mean = np.nanmean(Y, axis=0)
        std = np.where(n > 1, np.nanstd(Y, axis=0, ddof=1), 0.0)
        lo, hi = np.nanmin(Y, axis=0), np.nanmax(Y, axis=0)
    return {"x": grid, "Y": Y, "mean": mean, "std": std, "min": lo, "max": hi, "n": n}


def _plot_band(ax, agg: dict, label: str, color: str, *, marker: str | None = None) -> None:
    ax.plot(agg["x"], agg["mean"], color=color, label=label, lw=1.8, marker=marker, ms=3.5)
    if np.nanmax(agg["n"]) > 1:
        ax.fill_between(agg["x"], agg["min"], agg["max"], color=color, alpha=0.2, lw=0)


def _finish_reward_axes(fig: Figure, ax, xlabel: str, title: str, path: Path, **legend_kw) -> None:
    """Label a one-axes validation-reward figure, add its legend (if anything is labelled) and save it."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel("validation reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=9, frameon=False, **legend_kw)
    fig.tight_layout()
    _save_fig(fig, path)


def _placeholder(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=10, color="0.3", wrap=True)


# --------------------------------------------------------------------------- #
# statistics over arms
# --------------------------------------------------------------------------- #
def _domains(params, evals) -> list[str]:
    found = {d for a in evals.values() for e in a.values() for d in e["by_domain"]}
    return [d for d in params.envs.domains if d in found] + sorted(found - set(params.envs.domains))


def _values(evals, arm: str, col: str) -> dict[int, float]:
    out = {}
    for seed, e in evals.get(arm, {}).items():
        v = e["mean"] if col == MEAN_COL else e["by_domain"].get(col)
        if v is not None:
            out[seed] = v
    return out


def _paired(a: dict[int, float], b: dict[int, float]) -> tuple[list[int], np.ndarray, np.ndarray]:
    seeds = sorted(set(a) & set(b))
    return seeds, np.array([a[s] for s in seeds]), np.array([b[s] for s in seeds])


def _min_attainable_p(n: int) -> float:
    """Smallest two-sided sign-flip p-value attainable with n pairs (see stats.paired_permutation_p)."""
    if n < 1:
        return 1.0
    if n <= st.EXACT_PERM_MAX_N:
        return min(1.0, 2.0 / 2**n)
    return 1.0 / (1.0 + st.MC_PERM_FLIPS)


def _main_table(params, evals) -> dict:
    alpha, n_boot = params.report.alpha, params.report.n_boot
    arms = _arm_order(evals)
    cols = [*_domains(params, evals), MEAN_COL]
    cells: dict[str, dict[str, dict]] = {}
    for arm in arms:
        cells[arm] = {}
        for c in cols:
            v = _values(evals, arm, c)
            if v:
                cells[arm][c] = st.summarize(list(v.values()), n_boot=min(n_boot, 1000), seed=0)
    tests = []
    for c in cols:
        ranked = sorted((a for a in arms if c in cells[a]), key=lambda a: -cells[a][c]["mean"])
        if len(ranked) < 2:
            tests.append({"col": c, "best": ranked[0] if ranked else None, "runner_up": None, "n": 0, "p": 1.0})
            continue
        best, second = ranked[0], ranked[1]
        seeds, x, y = _paired(_values(evals, best, c), _values(evals, second, c))
        p = st.paired_permutation_p(x, y) if seeds else 1.0
        tests.append({"col": c, "best": best, "runner_up": second, "n": len(seeds), "p": p,
                      "diff": float(np.mean(x - y)) if seeds else math.nan})
    p_holm = st.holm([t["p"] for t in tests]) if tests else []
    for t, ph in zip(tests, p_holm):
        t["p_holm"] = ph
        t["bold"] = bool(t["runner_up"] is not None and t["n"] >= 2 and ph < alpha)
    return {"arms": arms, "cols": cols, "cells": cells, "tests": tests}


def _seed_counts_text(evals, arms) -> str:
    ns = sorted({len(evals[a]) for a in arms})
    if len(ns) == 1:
        return f"n = {ns[0]} seeds per arm"
    return "n = " + ", ".join(f"{a}: {len(evals[a])}" for a in arms) + " seeds"


def _write_main_table(out: Path, params, evals, mt: dict) -> None:
    arms, cols, cells, tests = mt["arms"], mt["cols"], mt["cells"], mt["tests"]
    alpha = params.report.alpha
    bold = {t["col"]: t["best"] for t in tests if t["bold"]}
    if not arms:
        msg = "# Main table: test reward\n\nMISSING: no evaluation results under results/eval/*/result.json.\n"
        _write_text(out / "main_table.md", msg)
        _write_text(out / "main_table.tex", "% MISSING: no evaluation results under results/eval/*/result.json\n")
        return
    caption = (f"Test reward (per domain and mean of domain means). Cells: mean ± half-width of the "
               f"Student-t 95% confidence interval of the mean over seeds ({_seed_counts_text(evals, arms)}). "
               f"Bold: the best arm in a column, only where its paired difference to the runner-up "
               f"(sign-flip permutation test over shared seeds, Holm-adjusted across the {len(cols)} columns) "
               f"is significant at alpha = {alpha}.")

    def cell(arm, c, tex=False):
        s = cells[arm].get(c)
        if s is None:
            return "missing"
        txt = f"{_f(s['mean'])} ± {_f(s['ci_half'])}"
        if tex:
            txt = f"{_f(s['mean'])} $\\pm$ {_f(s['ci_half'])}"
            return f"\\textbf{{{txt}}}" if bold.get(c) == arm else txt
        return f"**{txt}**" if bold.get(c) == arm else txt

    header = ["arm", "n", *[("mean" if c == MEAN_COL else c) for c in cols]]
    rows = [[a, str(len(evals[a])), *[cell(a, c) for c in cols]] for a in arms]
    notes = []
    for t in tests:
        if t["runner_up"] is None:
            notes.append(f"- `{t['col']}`: fewer than two arms, no test.")
            continue
        status = "marked" if t["bold"] else "not marked"
        notes.append(f"- `{t['col']}`: best {t['best']} vs runner-up {t['runner_up']}: diff {_f(t.get('diff'))} "
                     f"over {t['n']} shared seeds, permutation p = {_fp(t['p'])}, Holm p = {_fp(t['p_holm'])} "
                     f"-> {status}.")
    if not bold:
        foot = (f"No cell is marked: in no column does the best arm differ significantly from the runner-up "
                f"(Holm-adjusted paired permutation p < {alpha}).")
    else:
        foot = "Marked columns: " + ", ".join(f"`{c}` ({a})" for c, a in bold.items()) + "."
    md = ["# Main table: test reward", "", f"*{caption}*", "", _md_table(header, rows), "", foot, "",
          "Best-vs-runner-up tests:", *notes]
    _write_text(out / "main_table.md", "\n".join(md))

    colspec = "l r " + " ".join("c" for _ in cols)
    tex = ["% generated by lopd.report -- do not edit", r"\begin{table}[t]", r"\centering",
           r"\caption{" + _tex_escape(caption).replace("±", r"$\pm$")
           + ("" if bold else r"\textsuperscript{*}") + "}",
           r"\label{tab:main}", f"\\begin{{tabular}}{{{colspec}}}", r"\hline",
           " & ".join(["arm", "$n$", *[_tex_escape("mean" if c == MEAN_COL else c) for c in cols]]) + r" \\",
           r"\hline"]
    for a in arms:
        tex.append(" & ".join([_tex_escape(a), str(len(evals[a])), *[cell(a, c, tex=True) for c in cols]]) + r" \\")
    tex += [r"\hline", r"\end{tabular}"]
    if not bold:
        tex.append(r"\par\smallskip{\footnotesize $^{*}$" + _tex_escape(foot) + "}")
    tex.append(r"\end{table}")
    _write_text(out / "main_table.tex", "\n".join(tex))


def _comparisons(params, evals) -> dict:
    n_boot = params.report.n_boot
    lopd = _values(evals, "lopd", MEAN_COL)
    rows = []
    skipped = []
    if not lopd:
        return {"rows": [], "skipped": [], "missing_lopd": True}
    for arm in _arm_order(evals):
        if arm == "lopd":
            continue
        other = _values(evals, arm, MEAN_COL)
        seeds, x, y = _paired(lopd, other)
        if not seeds:
            skipped.append(arm)
            continue
        pd = st.paired_diff(x, y, n_boot=n_boot, seed=0)
        rows.append({"arm": arm, "n": len(seeds), "diff": pd["diff_mean"], "ci_low": pd["boot_low"],
                     "ci_high": pd["boot_high"], "p": pd["p_perm"],
                     "p_improve": st.prob_improvement(list(lopd.values()), list(other.values())),
                     "diffs": x - y})
    if rows:
        for r, ph in zip(rows, st.holm([r["p"] for r in rows])):
            r["p_holm"] = ph
    return {"rows": rows, "skipped": skipped, "missing_lopd": False}


def _write_comparisons(out: Path, params, cmp: dict) -> None:
    alpha = params.report.alpha
    md = ["# lopd vs every other arm (test mean reward)", ""]
    if cmp["missing_lopd"]:
        md.append("MISSING: no evaluation results for lopd; no comparison possible.")
        _write_text(out / "comparisons.md", "\n".join(md))
        return
    md += [f"Paired over shared seeds. Difference = lopd − other. CI: percentile bootstrap 95% of the mean "
           f"paired difference ({params.report.n_boot} resamples). p: two-sided sign-flip permutation test. "
           f"Holm: adjusted over the family of all {len(cmp['rows'])} pairs below. P(improvement): "
           f"P(lopd seed > other seed) over all seed pairs (unpaired). Significant: Holm p < {alpha}.", ""]
    rows = [[r["arm"], str(r["n"]), f"{r['diff']:+.4f}", f"[{_f(r['ci_low'], 4)}, {_f(r['ci_high'], 4)}]",
             _fp(r["p"]), _fp(r["p_holm"]), _f(r["p_improve"]), "yes" if r["p_holm"] < alpha else "no"]
            for r in cmp["rows"]]
    md.append(_md_table(["other arm", "n seeds", "diff", "95% CI", "p (perm)", "p (Holm)", "P(improvement)",
                         "significant"], rows))
    if cmp["rows"]:
        n_min = min(r["n"] for r in cmp["rows"])
        floor = min(1.0, len(cmp["rows"]) * _min_attainable_p(n_min))
        if floor >= alpha:
            md += ["", f"**Note: with {n_min} paired seeds the smallest attainable permutation p is "
                       f"{_fp(_min_attainable_p(n_min))}, and the smallest Holm-adjusted p over this family of "
                       f"{len(cmp['rows'])} is {_fp(floor)} >= alpha = {alpha}: no comparison can be declared "
                       f"significant with this many seeds, whatever the effect size.**"]
    if cmp["skipped"]:
        md += ["", "No shared seeds with lopd (not compared): " + ", ".join(cmp["skipped"]) + "."]
    _write_text(out / "comparisons.md", "\n".join(md))


def _falsification(params, cmp: dict) -> dict:
    alpha = params.report.alpha
    by_arm = {r["arm"]: r for r in cmp["rows"]}
    failed = []
    for c in CONTROLS:
        r = by_arm.get(c)
        if r is None:
            failed.append(f"{c}: no paired evaluation results with lopd (missing)")
            continue
        if not r["diff"] > 0:
            failed.append(f"{c}: difference lopd − {c} = {r['diff']:+.4f} is not > 0")
        if not r["p_holm"] < alpha:
            failed.append(f"{c}: Holm-adjusted p = {_fp(r['p_holm'])} is not < alpha = {alpha}")
    return {"survived": not failed, "failed": failed, "rows": [by_arm[c] for c in CONTROLS if c in by_arm]}


def _write_falsification(out: Path, params, cmp: dict, fal: dict) -> None:
    alpha = params.report.alpha
    md = ["# Falsification test", "", "## Pre-registered rule", "", f"> {params.report.falsification_rule}", "",
          f"alpha = {alpha}. The null hypothesis: retrieved content makes no difference (lopd performs like "
          f"its controls lopd_shuffled and lopd_unrelated). Holm p-values are taken from the family of all "
          f"lopd-vs-other comparisons in comparisons.md.", "", "## Numbers", ""]
    if fal["rows"]:
        md.append(_md_table(["control", "n seeds", "diff (lopd − control)", "95% CI", "p (perm)", "p (Holm)"],
                            [[r["arm"], str(r["n"]), f"{r['diff']:+.4f}",
                              f"[{_f(r['ci_low'], 4)}, {_f(r['ci_high'], 4)}]", _fp(r["p"]), _fp(r["p_holm"])]
                             for r in fal["rows"]]))
    else:
        md.append("MISSING: no paired evaluation results for lopd and its controls.")
    md += ["", "## Verdict", ""]
    if fal["survived"]:
        md.append("The claim survived the falsification test: lopd beats both lopd_shuffled and lopd_unrelated on "
                  f"mean test reward with Holm-adjusted paired permutation p < {alpha}, so the null (retrieved "
                  "content makes no difference) is rejected.")
    else:
        md.append(f"{NULL_SENTENCE} (the null: retrieved content makes no difference). The claim that retrieved "
                  "content drives LOPD's gain is not supported. Conditions that failed:")
        md += [f"- {f}" for f in fal["failed"]]
    if cmp.get("rows"):
        n_min = min(r["n"] for r in fal["rows"]) if fal["rows"] else 0
        floor = min(1.0, len(cmp["rows"]) * _min_attainable_p(n_min)) if n_min else 1.0
        if n_min and floor >= alpha:
            md += ["", f"**Design warning: with {n_min} seeds the smallest attainable exact permutation p is "
                       f"2/2^{n_min} = {_fp(_min_attainable_p(n_min))}; after Holm over {len(cmp['rows'])} "
                       f"comparisons it is at least {_fp(floor)} >= alpha = {alpha}. This test cannot reject the "
                       f"null with this many seeds, whatever the effect size: the verdict above was predetermined "
                       f"by the seed count.**"]
    _write_text(out / "falsification.md", "\n".join(md))


# --------------------------------------------------------------------------- #
# margin dynamics
# --------------------------------------------------------------------------- #
def _margin_value(runs) -> float | None:
    for seed in sorted(runs.get("lopd", {})):
        m = (runs["lopd"][seed]["result"].get("hparams") or {}).get("margin")
        if _finite(m):
            return float(m)
    return None


def _beta_flags(hist: dict[str, np.ndarray]) -> dict:
    steps, beta = _series(hist, "step", "beta")
    out = {"beta_final": None, "beta_mid": None, "rising": False, "unbounded": False}
    if steps.size < 3:
        return out
    s0, s1 = steps[0], steps[-1]
    mid = beta[np.argmin(np.abs(steps - (s0 + s1) / 2.0))]
    tail = steps >= s0 + 0.75 * (s1 - s0)
    bt, stt = beta[tail], steps[tail]
    rising = bool(bt.size >= 2 and bt[-1] > bt[0] and np.polyfit(stt, bt, 1)[0] > 0) if bt.size >= 2 else False
    out.update(beta_final=float(beta[-1]), beta_mid=float(mid), rising=rising,
               unbounded=bool(rising and beta[-1] > 0 and beta[-1] > 5.0 * mid))
    return out


def _margin_dynamics(runs) -> dict:
    m_lopd = _margin_value(runs)
    rows = []
    for arm in DYNAMICS_ARMS:
        for seed in sorted(runs.get(arm, {})):
            run = runs[arm][seed]
            res, hist = run["result"], run["history"]
            m = (res.get("hparams") or {}).get("margin")
            m = float(m) if _finite(m) else m_lopd
            b = _beta_flags(hist)
            _, dphi = _series(hist, "step", "delta_phi")
            max_d = float(np.max(dphi)) if dphi.size else None
            active = arm in MARGIN_ARMS
            flags = []
            if active:
                if b["unbounded"]:
                    flags.append("β grows without bound")
                if bool(res.get("infeasible_margin")):
                    flags.append("infeasible_margin")
                if m is not None and max_d is not None and max_d < m:
                    flags.append("Δ never reaches m")
                if max_d is None:
                    flags.append("no Δ recorded")
            rows.append({"arm": arm, "seed": seed, "m": m, "max_delta": max_d, "infeasible": bool(res.get("infeasible_margin")),
                         **b, "active": active, "flags": flags})
    return {"m": m_lopd, "rows": rows}


def _write_margin_dynamics(out: Path, runs, md_info: dict) -> None:
    m = md_info["m"]
    fig = Figure(figsize=(16, 4.6))
    axes = fig.subplots(1, 3)
    panels = [("delta_phi", "Δ(φ) (teacher privilege margin)"), ("beta", "β (dual variable)"),
              ("margin_sat_frac", "margin-satisfaction fraction")]
    any_data = False
    for ax, (col, ylabel) in zip(axes, panels):
        for arm in DYNAMICS_ARMS:
            agg = _aggregate([_series(r["history"], "step", col) for r in runs.get(arm, {}).values()])
            if agg is None:
                continue
            any_data = True
            ls = "--" if arm == "lopd_nomargin" else "-"
            _plot_band(ax, agg, f"{arm} (n={len(runs[arm])})", _COLORS.get(arm, None))
            ax.lines[-1].set_linestyle(ls)
        ax.set_xlabel("training step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    if m is not None:
        axes[0].axhline(m, color="k", ls="--", lw=1.2, label=f"margin m = {m:g}")
    if not any_data:
        for ax in axes:
            _placeholder(ax, "MISSING: no history.csv for\nlopd / controls / nomargin")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False, fontsize=10,
                   bbox_to_anchor=(0.5, -0.06))
    fig.suptitle("Margin dynamics: mean over seeds, band = min–max across seeds")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    _save_fig(fig, out / "figures" / "margin_dynamics.png")

    rows = md_info["rows"]
    md = ["# Margin dynamics", "", "Figure: `figures/margin_dynamics.png` (mean over seeds, band = min–max).",
          f"Margin m (from the lopd runs' hparams): {_f(m, 4) if m is not None else 'MISSING (no lopd run)'}.", "",
          "Flags (only arms whose margin constraint is active: " + ", ".join(MARGIN_ARMS) + "; lopd_nomargin is "
          "listed for reference only):",
          "- **β grows without bound**: β still increasing over the last 25% of steps (positive slope and last > "
          "first in that window) and final β > 5 × β at mid-run;",
          "- **infeasible_margin**: the run itself reported the margin infeasible (result.json);",
          "- **Δ never reaches m**: max over steps of Δ(φ) < m.", ""]
    if not rows:
        md.append("MISSING: no runs of " + ", ".join(DYNAMICS_ARMS) + ".")
    else:
        table = []
        for r in rows:
            flags = ", ".join(r["flags"]) if r["active"] else "(reference, not flagged)"
            table.append([r["arm"], str(r["seed"]), _f(r["m"], 4) if r["m"] is not None else "n/a",
                          _f(r["max_delta"], 4), _f(r["beta_mid"], 4), _f(r["beta_final"], 4),
                          "yes" if r["rising"] else "no", "yes" if r["infeasible"] else "no", flags or "—"])
        md.append(_md_table(["arm", "seed", "m", "max Δ", "β mid", "β final", "β rising (last 25%)",
                             "infeasible_margin", "flags"], table))
        flagged = [r for r in rows if r["active"] and r["flags"]]
        n_active = sum(r["active"] for r in rows)
        md += ["", f"{len(flagged)} of {n_active} margin-active runs flagged."]
    _write_text(out / "margin_dynamics.md", "\n".join(md))


# --------------------------------------------------------------------------- #
# efficiency
# --------------------------------------------------------------------------- #
def _last_val(run) -> float | None:
    _, v = _series(run["history"], "step", "val_reward")
    if v.size:
        return float(v[-1])
    v = run["result"].get("val_reward")
    return float(v) if _finite(v) else None


def _total_rollouts(run) -> float | None:
    v = run["result"].get("rollouts_used")
    if _finite(v):
        return float(v)
    r = run["history"].get("rollouts_used")
    return float(np.nanmax(r)) if r is not None and np.isfinite(r).any() else None


def _first_crossing(grid: np.ndarray, curves: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Vectorised: first x where each row of ``curves`` reaches its ``target`` (linear interp); inf if never."""
    reached = curves >= target[:, None]
    any_r = reached.any(axis=1)
    i = np.argmax(reached, axis=1)
    x = np.full(curves.shape[0], np.inf)
    at0 = any_r & (i == 0)
    x[at0] = grid[0]
    mid = any_r & (i > 0)
    if mid.any():
        r = np.nonzero(mid)[0]
        j = i[mid]
        y0, y1 = curves[r, j - 1], curves[r, j]
        x0, x1 = grid[j - 1], grid[j]
        frac = np.where(y1 > y0, (target[mid] - y0) / np.where(y1 > y0, y1 - y0, 1.0), 1.0)
        x[mid] = x0 + np.clip(frac, 0.0, 1.0) * (x1 - x0)
    return x


def _efficiency(params, runs) -> dict:
    info: dict[str, Any] = {"ratio": None, "ci": (None, None), "missing": [], "reached": False}
    lopd, grpo = runs.get("lopd", {}), runs.get("grpo", {})
    for a, d in (("lopd", lopd), ("grpo", grpo)):
        if not d:
            info["missing"].append(a)
    if info["missing"]:
        return info
    finals = np.array([v for v in (_last_val(r) for r in grpo.values()) if v is not None])
    totals = [t for t in (_total_rollouts(r) for r in grpo.values()) if t is not None]
    agg = _aggregate([_series(r["history"], "rollouts_used", "val_reward") for r in lopd.values()])
    if finals.size == 0 or not totals or agg is None:
        info["missing"].append("validation curves / rollout counts")
        return info
    total = float(np.mean(totals))
    target = float(finals.mean())
    Y = agg["Y"]
    # hold each seed's last value beyond its range so the mean curve is defined on the whole grid
    Y = np.array([np.where(np.isfinite(row), row, row[np.isfinite(row)][-1]) if np.isfinite(row).any() else row
                  for row in Y])
    grid = agg["x"]
    x_point = _first_crossing(grid, np.nanmean(Y, axis=0)[None, :], np.array([target]))[0]
    rng = np.random.default_rng(0)
    B = params.report.n_boot
    il = rng.integers(0, Y.shape[0], size=(B, Y.shape[0]))
    ig = rng.integers(0, finals.size, size=(B, finals.size))
    xb = _first_crossing(grid, np.nanmean(Y[il], axis=1), finals[ig].mean(axis=1))
    rb = np.sort(xb / total)
    lo = float(rb[int(math.floor(0.025 * (B - 1)))])
    hi = float(rb[int(math.ceil(0.975 * (B - 1)))])
    info.update(target=target, grpo_total=total, x=float(x_point), reached=bool(np.isfinite(x_point)),
                ratio=float(x_point / total) if np.isfinite(x_point) else None, ci=(lo, hi),
                frac_reached=float(np.mean(np.isfinite(xb))), n_lopd=Y.shape[0], n_grpo=int(finals.size),
                lopd_max_rollouts=float(grid[-1]))
    return info


def _write_efficiency(out: Path, params, runs, eff: dict) -> None:
    fig = Figure(figsize=(7.5, 5))
    ax = fig.subplots()
    plotted = False
    for arm in EFFICIENCY_ARMS:
        agg = _aggregate([_series(r["history"], "rollouts_used", "val_reward") for r in runs.get(arm, {}).values()])
        if agg is None:
            continue
        plotted = True
        _plot_band(ax, agg, f"{arm} (n={len(runs[arm])})", _COLORS.get(arm), marker="o")
    if eff.get("target") is not None:
        ax.axhline(eff["target"], color=_COLORS["grpo"], ls=":", lw=1.2,
                   label=f"GRPO final val reward = {eff['target']:.3f}")
        if eff.get("reached") and eff.get("x", 0) > 0:
            ax.axvline(eff["x"], color=_COLORS["lopd"], ls=":", lw=1.2,
                       label=f"lopd reaches it at {eff['x']:.0f} rollouts")
    if not plotted:
        _placeholder(ax, "MISSING: no validation curves for lopd / grpo / opsd_text")
    _finish_reward_axes(fig, ax, "rollouts used", "Sample efficiency: mean over seeds, band = min–max",
                        out / "figures" / "efficiency.png", loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)

    claim = f"The paper claims lopd needs < {PAPER_EFFICIENCY_CLAIM:.0%} of GRPO's rollouts to reach GRPO's final reward."
    md = ["# Sample efficiency", "", "Figure: `figures/efficiency.png`.", "",
          "Ratio = (rollouts lopd needs to first reach GRPO's final validation reward) / (GRPO's total rollouts). "
          "GRPO's final validation reward is the mean over seeds of each seed's last validation reward; the lopd "
          "curve is the mean over seeds, interpolated linearly in rollouts. CI: percentile bootstrap 95% "
          f"({params.report.n_boot} resamples of the seeds of both arms).", "", claim, ""]
    if eff["missing"]:
        md.append("MISSING: " + ", ".join(eff["missing"]) + " — ratio not computed.")
    else:
        lo, hi = eff["ci"]

        def r(v):
            return "not reached" if v is None or not math.isfinite(v) else f"{v:.3f}"

        md += [f"- GRPO final validation reward (mean of {eff['n_grpo']} seeds): {eff['target']:.4f}",
               f"- GRPO total rollouts (mean over seeds): {eff['grpo_total']:.0f}",
               f"- lopd seeds: {eff['n_lopd']}; lopd rollouts observed: up to {eff['lopd_max_rollouts']:.0f}", ""]
        if eff["reached"] and eff["x"] <= 0:
            md += [f"**Ratio: degenerate (0 / {eff['grpo_total']:.0f}).** GRPO did not improve on the shared "
                   "starting point: its final validation reward is at or below the validation reward every arm "
                   "starts from (step 0, before any rollout), so 'rollouts needed to reach it' is zero for any "
                   "method. This data cannot test the paper's efficiency claim; it says GRPO did not learn "
                   "within this budget."]
        elif eff["reached"]:
            verdict = ("consistent with" if hi is not None and math.isfinite(hi) and hi < PAPER_EFFICIENCY_CLAIM
                       else "NOT established by")
            md += [f"**Ratio: {eff['ratio']:.3f}** ({eff['x']:.0f} / {eff['grpo_total']:.0f} rollouts), "
                   f"95% CI [{r(lo)}, {r(hi)}]; the target was reached in {eff['frac_reached']:.0%} of bootstrap "
                   f"resamples.", "",
                   f"The < {PAPER_EFFICIENCY_CLAIM:.0%} claim is {verdict} this data "
                   f"(the upper CI bound must be below {PAPER_EFFICIENCY_CLAIM:.2f})."]
        else:
            md += ["**Ratio: not reached.** The mean lopd validation curve never reaches GRPO's final validation "
                   f"reward within the {eff['lopd_max_rollouts']:.0f} rollouts it used. This is a finding: the "
                   f"< {PAPER_EFFICIENCY_CLAIM:.0%} claim is not supported here. "
                   f"(Bootstrap: reached in {eff['frac_reached']:.0%} of resamples; CI [{r(lo)}, {r(hi)}].)"]
    _write_text(out / "efficiency.md", "\n".join(md))


# --------------------------------------------------------------------------- #
# sensitivity
# --------------------------------------------------------------------------- #
def _read_csv_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _num(v) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _write_sensitivity(out: Path, root: Path) -> dict:
    grid = _read_csv_rows(root / "results" / "sensitivity" / "grid.csv")
    trials = [t for t in _read_csv_rows(root / "hpo" / "trials.csv") if (t.get("state") or "").upper() == "COMPLETE"]
    best_path = root / "hpo" / "best_params.yaml"
    best = (yaml.safe_load(best_path.read_text()) or {}) if best_path.exists() else {}
    fig = Figure(figsize=(15, 4.5))
    axes = fig.subplots(1, 3)
    axis_labels = {"margin": "margin m", "K": "K (latent tokens)", "n_ret": "n_ret (retrieved trajectories)"}
    info = {"grid_rows": len(grid), "trials": len(trials), "points": {}}
    for ax, axis in zip(axes, ("margin", "K", "n_ret")):
        xs, ys = [], []
        for t in trials:
            x, y = _num(t.get(axis)), _num(t.get("value"))
            if x is not None and y is not None:
                xs.append(x)
                ys.append(y)
        if xs:
            ax.scatter(xs, ys, s=18, color="0.5", alpha=0.35, label="search trials (COMPLETE)", zorder=1)
        groups: dict[float, list[float]] = {}
        for r in grid:
            if r.get("axis") != axis:
                continue
            x, y = _num(r.get(axis)), _num(r.get("val_reward"))
            if x is not None and y is not None:
                groups.setdefault(x, []).append(y)
        if groups:
            gx = sorted(groups)
            sums = [st.summarize(groups[x], n_boot=100) for x in gx]
            means = [s["mean"] for s in sums]
            halves = [s["ci_half"] if math.isfinite(s["ci_half"]) else 0.0 for s in sums]
            ns = sorted({s["n"] for s in sums})
            ax.errorbar(gx, means, yerr=halves, fmt="o-", color=_COLORS["lopd"], capsize=4, lw=1.8, zorder=3,
                        label=f"one-at-a-time grid: mean ± t 95% CI (n={'/'.join(map(str, ns))} seeds)")
            info["points"][axis] = {str(x): m for x, m in zip(gx, means)}
        if _num(best.get(axis)) is not None:
            ax.axvline(float(best[axis]), color="k", ls=":", lw=1.2, label="selected by the search (hpo/best_params.yaml)")
            ax.set_title(f"{axis}: selected {best[axis]}", fontsize=10)
        else:
            ax.set_title(f"{axis}: no selected value (hpo/best_params.yaml missing)", fontsize=10)
        if not xs and not groups:
            _placeholder(ax, f"MISSING: no sensitivity grid\nnor search trials for {axis}")
        ax.set_xlabel(axis_labels[axis])
        ax.set_ylabel("validation reward")
        ax.grid(alpha=0.3)
    handles: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=len(handles), frameon=False,
                   fontsize=9, bbox_to_anchor=(0.5, -0.04))
    fig.suptitle("Sensitivity of validation reward to m, K, n_ret (one at a time around the selected point)")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    _save_fig(fig, out / "figures" / "sensitivity.png")
    return info


# --------------------------------------------------------------------------- #
# learning curves
# --------------------------------------------------------------------------- #
def _write_learning_curves(out: Path, runs) -> None:
    fig = Figure(figsize=(9, 5.5))
    ax = fig.subplots()
    for arm in _arm_order(runs):
        agg = _aggregate([_series(r["history"], "step", "val_reward") for r in runs[arm].values()])
        if agg is None:
            continue
        ls = ":" if arm in CONTROLS else ("--" if arm in ("base", "sft", "grpo", "opsd_text") else "-")
        if agg["x"].size == 1:  # evaluation-only arm (base): one validation point -> horizontal reference
            ax.axhline(agg["mean"][0], color=_COLORS.get(arm), ls="-.", lw=1.5,
                       label=f"{arm} (n={len(runs[arm])}, not trained)")
            if agg["n"][0] > 1:
                ax.axhspan(agg["min"][0], agg["max"][0], color=_COLORS.get(arm), alpha=0.12, lw=0)
            continue
        _plot_band(ax, agg, f"{arm} (n={len(runs[arm])})", _COLORS.get(arm), marker="o")
        ax.lines[-1].set_linestyle(ls)
    if not ax.lines:
        _placeholder(ax, "MISSING: no validation rewards in history.csv")
    _finish_reward_axes(fig, ax, "training step", "Learning curves: mean over seeds, band = min–max",
                        out / "figures" / "learning_curves.png", loc="center left", bbox_to_anchor=(1.01, 0.5))


# --------------------------------------------------------------------------- #
# seed variance / power
# --------------------------------------------------------------------------- #
def _seed_variance(params, evals, cmp) -> dict:
    alpha = params.report.alpha
    lopd = _values(evals, "lopd", MEAN_COL)
    rows = []
    for arm in _arm_order(evals):
        v = _values(evals, arm, MEAN_COL)
        vals = np.array(list(v.values()))
        std = float(np.std(vals, ddof=1)) if vals.size > 1 else math.nan
        seeds, x, y = _paired(lopd, v) if arm != "lopd" else ([], None, None)
        if len(seeds) >= 2:
            d = x - y
            std_d, src, n = float(np.std(d, ddof=1)), f"paired lopd − {arm}", len(seeds)
        else:
            std_d, src, n = std * math.sqrt(2.0), "arm std·√2", vals.size
        mdd = st.min_detectable_diff(std_d, n, alpha=alpha, power=POWER) if math.isfinite(std_d) else math.nan
        obs = float(np.mean(x - y)) if len(seeds) >= 1 else None
        rows.append({"arm": arm, "n": vals.size, "std": std, "std_d": std_d, "src": src, "n_pairs": n,
                     "mdd": mdd, "obs": obs})
    res = {"rows": rows, "seeds_needed": None, "needed_note": ""}
    g = next((r for r in cmp.get("rows", []) if r["arm"] == "grpo"), None)
    if g is None:
        res["needed_note"] = "MISSING: no paired lopd and grpo evaluation results; seeds_needed not computed."
    elif g["n"] < 2:
        res["needed_note"] = "Only one shared seed for lopd and grpo: the std of the paired difference is undefined."
    else:
        std_d = float(np.std(g["diffs"], ddof=1))
        n_need = st.seeds_needed(g["diff"], std_d, alpha=alpha, power=POWER)
        res.update(seeds_needed=n_need, grpo_diff=g["diff"], grpo_std_d=std_d)
        if n_need is None:
            res["needed_note"] = (f"seeds_needed returned None: the observed lopd − grpo difference ({g['diff']:+.4f}, "
                                  f"std of paired differences {std_d:.4f}) cannot be detected with {POWER:.0%} power "
                                  f"at alpha = {alpha} with any number of seeds up to 1000 (or it is exactly zero).")
        else:
            res["needed_note"] = (f"To detect the observed lopd − grpo difference ({g['diff']:+.4f}, std of paired "
                                  f"differences {std_d:.4f}) with {POWER:.0%} power at alpha = {alpha} (paired t-test, "
                                  f"no multiplicity correction) needs **{n_need} seeds** (used: {g['n']}).")
    return res


def _write_seed_variance(out: Path, params, sv: dict) -> None:
    md = ["# Seed variance and power", "",
          f"Per arm: std of the test mean reward across seeds; minimum detectable paired difference (MDD) at "
          f"{POWER:.0%} power, alpha = {params.report.alpha}, two-sided paired t-test, for the seed count used. "
          "The MDD uses the std of the paired differences lopd − arm where at least two seeds are shared, else "
          "the arm's std·√2 (independent seeds).", ""]
    if not sv["rows"]:
        md.append("MISSING: no evaluation results.")
    else:
        md.append(_md_table(["arm", "n seeds", "std", "std used for MDD", "source", "n for MDD", "MDD (80% power)",
                             "observed lopd − arm"],
                            [[r["arm"], str(r["n"]), _f(r["std"], 4), _f(r["std_d"], 4), r["src"], str(r["n_pairs"]),
                              _f(r["mdd"], 4), "—" if r["obs"] is None else f"{r['obs']:+.4f}"] for r in sv["rows"]]))
    md += ["", "## Seeds needed (lopd vs grpo)", "", sv["needed_note"]]
    _write_text(out / "seed_variance.md", "\n".join(md))


# --------------------------------------------------------------------------- #
# leakage audit
# --------------------------------------------------------------------------- #
_SPLIT_RE = re.compile(r"(?:^|[/\\\s'\"=])(train|val|test)\.jsonl\b")
_SPLIT_DIR_RE = re.compile(r"(?:^|[\s'\"=])(?:\./)?data/splits/?(?:$|[\s'\"])")


def _strings(obj) -> list[str]:
    """Every string inside a nested deps/cmd value (lists, dicts: keys and values)."""
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for k, v in obj.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(obj, (list, tuple)):
        return [s for v in obj for s in _strings(v)]
    return []


def _splits_in(texts: list[str]) -> set[str]:
    found = set()
    for t in texts:
        found |= set(_SPLIT_RE.findall(t))
        if _SPLIT_DIR_RE.search(t) or t.strip().rstrip("/") in ("data/splits", "./data/splits"):
            found |= set(SPLITS)  # the whole split directory, test included
    return found


def _dvc_deps(root: Path) -> dict | None:
    path = root / "dvc.yaml"
    if not path.exists():
        return None
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise BadInput(f"{path}: not valid YAML: {e}") from None
    out = {}
    for name, stage in (doc.get("stages") or {}).items():
        if not isinstance(stage, dict):
            continue
        body = [stage, stage.get("do") or {}]
        deps = [s for b in body if isinstance(b, dict) for s in _strings(b.get("deps", []))]
        cmds = [s for b in body if isinstance(b, dict) for s in _strings(b.get("cmd", []))]
        out[str(name)] = {"deps": _splits_in(deps), "cmd": _splits_in(cmds)}
    return out


def _stage_base(name: str) -> str:
    return name.split("@", 1)[0]


def _runtime_records(root: Path) -> list[dict]:
    cands: list[tuple[str, Path]] = []
    for p in sorted((root / "results").glob("*/result.json")):
        cands.append((p.parent.name, p))
    for p in sorted((root / "results" / "eval").glob("*/result.json")):
        cands.append((EVAL_STAGE, p))
    for p in sorted((root / "models").glob("*/manifest.json")):
        cands.append((p.parent.name, p))
    for p in (root / "hpo" / "result.json", root / "results" / "sensitivity" / "result.json"):
        if p.exists():
            cands.append((p.parent.name, p))
    seen, recs = set(), []
    for stage, p in cands:
        if p in seen:
            continue
        seen.add(p)
        try:
            d = json.loads(p.read_text())
        except json.JSONDecodeError:
            recs.append({"stage": stage, "path": p, "reads": None})
            continue
        if isinstance(d, dict) and isinstance(d.get("splits_read"), list):
            recs.append({"stage": stage, "path": p, "reads": [r for r in d["splits_read"] if isinstance(r, dict)]})
    return recs


def _leakage(root: Path, runs) -> dict:
    man_path = root / "data" / "splits" / "manifest.json"
    manifest = {}
    if man_path.exists():
        manifest = {k: v for k, v in ((_read_json(man_path) or {}).get("files") or {}).items()}
    dvc = _dvc_deps(root)
    recs = _runtime_records(root)
    violations, unverified, warnings_ = [], [], []
    if dvc is None:
        unverified.append("dvc.yaml not found: stage dependencies cannot be checked")
    else:
        for name, d in dvc.items():
            if _stage_base(name) != EVAL_STAGE and "test" in (d["deps"] | d["cmd"]):
                where = "depends on" if "test" in d["deps"] else "names in its cmd"
                violations.append(f"stage `{name}` {where} the test split (data/splits/test.jsonl)")
        hpo = [d for n, d in dvc.items() if _stage_base(n) == HPO_STAGE]
        if not hpo:
            unverified.append("no `hpo` stage in dvc.yaml: where m, K, n_ret were selected cannot be verified")
        elif not any("val" in d["deps"] for d in hpo):
            unverified.append("the `hpo` stage does not declare a dependency on the validation split")
    for r in recs:
        if r["reads"] is None:
            warnings_.append(f"{r['path'].relative_to(root)} is not valid JSON")
            continue
        for read in r["reads"]:
            split, role = read.get("split"), read.get("role")
            if split == "test" and (r["stage"] != EVAL_STAGE or role != EVAL_STAGE):
                violations.append(f"stage `{r['stage']}` (role {role!r}) read the test split at run time "
                                  f"({r['path'].relative_to(root)})")
            exp = (manifest.get(split) or {}).get("sha256")
            if exp and read.get("sha256") and read["sha256"] != exp:
                warnings_.append(f"{r['path'].relative_to(root)}: read {split} with SHA-256 {read['sha256'][:12]}… "
                                 f"but the manifest has {exp[:12]}…")
    notes = []
    if not any(r["stage"] == HPO_STAGE and r["reads"] for r in recs):
        notes.append("no run-time record from hpo (hpo/result.json with splits_read): the hpo part of the audit "
                     "rests on the dvc.yaml dependencies only")
    if not man_path.exists():
        unverified.append("data/splits/manifest.json not found: split hashes unknown")
    # the final runs should have used the selected hyper-parameters
    best_path = root / "hpo" / "best_params.yaml"
    if best_path.exists():
        best = yaml.safe_load(best_path.read_text()) or {}
        for arm in ("lopd", *CONTROLS):
            for seed, run in sorted(runs.get(arm, {}).items()):
                hp = run["result"].get("hparams") or {}
                bad = [k for k in ("margin", "K", "n_ret") if k in best and k in hp and hp[k] != best[k]]
                if bad:
                    warnings_.append(f"{arm} seed {seed} used {', '.join(f'{k}={hp[k]}' for k in bad)} but "
                                     f"hpo/best_params.yaml selected {', '.join(f'{k}={best[k]}' for k in bad)}")
    return {"manifest": manifest, "dvc": dvc, "records": recs, "violations": violations, "unverified": unverified,
            "warnings": warnings_, "notes": notes, "clean": not violations and not unverified}


def _write_leakage(out: Path, root: Path, lk: dict) -> None:
    md = ["# Leakage audit", ""]
    if lk["violations"]:
        md += ["## ⚠ LEAKAGE VIOLATION ⚠", "",
               "**The test split was used outside the evaluate stage. Test numbers in this report are NOT a clean "
               "held-out estimate.**", ""] + [f"- **VIOLATION:** {v}" for v in lk["violations"]] + [""]
    elif lk["unverified"]:
        md += ["**UNVERIFIED: the audit could not establish that the test split was used only by evaluate and that "
               "m, K, n_ret were selected on validation:**", ""] + [f"- {u}" for u in lk["unverified"]] + [""]
    else:
        md += [CLEAN_LEAKAGE_SENTENCE, ""]
    if lk["violations"] and lk["unverified"]:
        md += ["Also unverified:"] + [f"- {u}" for u in lk["unverified"]] + [""]
    md += ["## Split files (data/splits/manifest.json)", ""]
    if lk["manifest"]:
        md.append(_md_table(["split", "path", "n", "SHA-256"],
                            [[s, str(lk["manifest"][s].get("path", "")), str(lk["manifest"][s].get("n", "")),
                              f"`{lk['manifest'][s].get('sha256', '')}`"]
                             for s in [*[x for x in SPLITS if x in lk["manifest"]],
                                       *sorted(set(lk["manifest"]) - set(SPLITS))]]))
    else:
        md.append("MISSING: data/splits/manifest.json.")
    md += ["", "## Stages: declared dependencies (dvc.yaml) and run-time reads (splits_read records)", ""]
    runtime: dict[str, dict] = {}
    for r in lk["records"]:
        e = runtime.setdefault(r["stage"], {"splits": set(), "roles": set(), "n": 0})
        e["n"] += 1
        for x in r["reads"] or []:
            e["splits"].add(str(x.get("split")))
            e["roles"].add(str(x.get("role")))
    dvc = lk["dvc"] or {}
    rows, matched = [], set()

    def flag(name):
        return "**VIOLATION**" if any(f"`{name}`" in v for v in lk["violations"]) else ""

    def read_txt(rt):
        if rt is None:
            return "no record"
        return (", ".join(x for x in SPLITS if x in rt["splits"]) or "none") + (
            f" (roles: {', '.join(sorted(rt['roles']))}; {rt['n']} record{'s' if rt['n'] != 1 else ''})")

    for s in dvc:
        d = dvc[s]
        key = s if s in runtime else _stage_base(s)
        rt = runtime.get(key)
        if rt is not None:
            matched.add(key)
        rows.append([f"`{s}`", ", ".join(x for x in SPLITS if x in d["deps"]) or "—",
                     ", ".join(x for x in SPLITS if x in d["cmd"]) or "—", read_txt(rt), flag(s) or flag(key)])
    for s in sorted(set(runtime) - matched):
        rows.append([f"`{s}`", "(not in dvc.yaml)", "—", read_txt(runtime[s]), flag(s)])
    md.append(_md_table(["stage", "deps on splits", "splits named in cmd", "read at run time", ""], rows)
              if rows else "MISSING: neither dvc.yaml stages nor splits_read records found.")
    if lk["warnings"]:
        md += ["", "## Warnings", ""] + [f"- {w}" for w in lk["warnings"]]
    if lk["notes"]:
        md += ["", "## Notes", ""] + [f"- {n}" for n in lk["notes"]]
    _write_text(out / "leakage_audit.md", "\n".join(md))


# --------------------------------------------------------------------------- #
# entry point
# --------------------------------------------------------------------------- #
def build_report(params, root: Path = Path(".")) -> dict:
    """Write every report file under ``root/reports/`` and return the summary dict (also summary.json)."""
    root = Path(root)
    out = root / REPORT_DIR
    runs = _load_runs(root)
    if not runs:
        raise BadInput(f"no training runs found under {root / 'runs'}/*/result.json: run the train stage first")
    evals = _load_evals(root)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    missing = []
    if not evals:
        missing.append("results/eval/*/result.json (no test results)")
    for arm in ARMS:
        if arm not in runs:
            missing.append(f"runs of arm {arm}")
        if evals and arm not in evals:
            missing.append(f"evaluation results of arm {arm}")
    for p in ("hpo/trials.csv", "hpo/best_params.yaml", "results/sensitivity/grid.csv", "dvc.yaml",
              "data/splits/manifest.json"):
        if not (root / p).exists():
            missing.append(p)

    mt = _main_table(params, evals)
    _write_main_table(out, params, evals, mt)
    cmp = _comparisons(params, evals)
    _write_comparisons(out, params, cmp)
    fal = _falsification(params, cmp)
    _write_falsification(out, params, cmp, fal)
    mdyn = _margin_dynamics(runs)
    _write_margin_dynamics(out, runs, mdyn)
    eff = _efficiency(params, runs)
    _write_efficiency(out, params, runs, eff)
    sens = _write_sensitivity(out, root)
    _write_learning_curves(out, runs)
    sv = _seed_variance(params, evals, cmp)
    _write_seed_variance(out, params, sv)
    lk = _leakage(root, runs)
    _write_leakage(out, root, lk)

    seeds_by_arm = {a: len(evals[a]) for a in _arm_order(evals)}
    summary = {
        "test_reward": {a: mt["cells"][a][MEAN_COL]["mean"] for a in mt["arms"] if MEAN_COL in mt["cells"][a]},
        "test_ci_half": {a: _none_if_nan(mt["cells"][a][MEAN_COL]["ci_half"]) for a in mt["arms"]
                         if MEAN_COL in mt["cells"][a]},
        "lopd_vs": {r["arm"]: {"diff": r["diff"], "ci_low": _none_if_nan(r["ci_low"]),
                               "ci_high": _none_if_nan(r["ci_high"]), "p": r["p"], "p_holm": r["p_holm"], "n": r["n"],
                               "p_improve": r["p_improve"]} for r in cmp["rows"]},
        "falsification_survived": bool(fal["survived"]),
        "n_seeds": seeds_by_arm.get("lopd", max(seeds_by_arm.values(), default=0)),
        "n_seeds_by_arm": seeds_by_arm,
        "bold_columns": {t["col"]: t["best"] for t in mt["tests"] if t["bold"]},
        "efficiency_ratio": eff.get("ratio") if eff.get("x", 0) and eff.get("x", 0) > 0 else None,  # None: not reached or degenerate
        "efficiency_ci": [_none_if_nan(v) if v is not None else None for v in eff.get("ci", (None, None))],
        "infeasible_runs": sum(bool(r["result"].get("infeasible_margin")) for a in runs.values() for r in a.values()),
        "margin_flagged_runs": sum(1 for r in mdyn["rows"] if r["active"] and r["flags"]),
        "seeds_needed_lopd_vs_grpo": sv["seeds_needed"],
        "leakage_clean": bool(lk["clean"]),
        "leakage_violations": len(lk["violations"]),
        "missing_inputs": missing,
    }
    summary = json.loads(json.dumps(_json_safe(summary)))

    index = [("README.md", "this index"),
             ("summary.json", "headline numbers (DVC metrics)"),
             ("main_table.md", "test reward per domain and mean, mean ± t 95% CI over seeds (markdown)"),
             ("main_table.tex", "the same table for LaTeX"),
             ("comparisons.md", "lopd vs each arm: paired diff, bootstrap CI, permutation p, Holm p, P(improvement)"),
             ("falsification.md", "pre-registered rule, lopd vs shuffled/unrelated, verdict"),
             ("margin_dynamics.md", "per-run flags: β unbounded, infeasible margin, Δ never reaching m"),
             ("efficiency.md", "rollouts lopd needs to reach GRPO's final validation reward / GRPO's rollouts"),
             ("seed_variance.md", "seed std, minimum detectable difference, seeds needed"),
             ("leakage_audit.md", "which stage depends on / read which split; split SHA-256"),
             ("figures/margin_dynamics.png", "Δ(φ), β, margin satisfaction vs step"),
             ("figures/efficiency.png", "validation reward vs rollouts: lopd, grpo, opsd_text"),
             ("figures/sensitivity.png", "validation reward vs m, K, n_ret (grid + search trials)"),
             ("figures/learning_curves.png", "validation reward vs step, every arm")]
    readme = ["# Report index", ""] + [f"- `{p}`: {d}" for p, d in index]
    if missing:
        readme += ["", "## Missing inputs", ""] + [f"- {m}" for m in missing]
    readme += ["", f"Sensitivity inputs: {sens['grid_rows']} grid rows, {sens['trials']} COMPLETE search trials."]
    _write_text(out / "README.md", "\n".join(readme))
    write_json(out / "summary.json", summary)
    return summary


def _json_safe(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(float(x)) else None
    return x
