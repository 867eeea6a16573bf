"""Tables: the main table (Markdown + LaTeX), the exploratory comparisons, the headline metrics.

The main table and comparisons use the primary test (paired t on per-seed means) with Holm across the
family; the decisive tests of the pre-registered rule are in :mod:`lopd.analysis.falsification`, outside
any family.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from lopd.analysis import stats as st
from lopd.analysis.falsification import render_margin_contrasts
from lopd.analysis.loading import MEAN_COL, values
from lopd.analysis.render import CONDITIONAL, arm_order, fmt, fmt_p, md_table, tex_escape, write_text
from lopd.utils import write_json

if TYPE_CHECKING:
    from lopd.config import Params


def _paired(a: dict[int, float], b: dict[int, float]) -> tuple[list[int], np.ndarray, np.ndarray]:
    seeds = sorted(set(a) & set(b))
    return seeds, np.array([a[s] for s in seeds]), np.array([b[s] for s in seeds])


def domains(params: Params, evals) -> list[str]:
    found = {d for a in evals.values() for e in a.values() for d in e["by_domain"]}
    return [d for d in params.envs.domains if d in found] + sorted(found - set(params.envs.domains))


# --------------------------------------------------------------------------- main table
def main_table(params: Params, evals) -> dict:
    """Per arm and column (domains, mean): :func:`st.summarize`; per column, the best arm vs the
    runner-up by a two-sided paired t-test over shared seeds, Holm across columns."""
    arms = arm_order(evals)
    cols = [*domains(params, evals), MEAN_COL]
    cells = {a: {c: st.summarize(list(v.values())) for c in cols if (v := values(evals, a, c))} for a in arms}
    tests = []
    for c in cols:
        ranked = sorted((a for a in arms if c in cells[a]), key=lambda a: -cells[a][c]["mean"])
        t = {"col": c, "best": ranked[0] if ranked else None, "runner_up": None, "n": 0, "p": 1.0, "diff": math.nan}
        if len(ranked) >= 2:
            seeds, x, y = _paired(values(evals, ranked[0], c), values(evals, ranked[1], c))
            p = st.paired_t(x, y)["p"] if len(seeds) >= 2 else math.nan
            t.update(runner_up=ranked[1], n=len(seeds), p=1.0 if math.isnan(p) else p,
                     diff=float(np.mean(x - y)) if seeds else math.nan)
        tests.append(t)
    for t, ph in zip(tests, st.holm([t["p"] for t in tests]) if tests else []):
        t["p_holm"] = ph
        t["bold"] = bool(t["runner_up"] is not None and t["n"] >= 2 and ph < params.report.alpha)
    return {"arms": arms, "cols": cols, "cells": cells, "tests": tests}


def seed_counts_text(evals, arms) -> str:
    ns = sorted({len(evals[a]) for a in arms})
    if len(ns) == 1:
        return f"n = {ns[0]} seeds per arm"
    return "n = " + ", ".join(f"{a}: {len(evals[a])}" for a in arms) + " seeds"


def write_main_table(out: Path, params: Params, evals, mt: dict) -> None:
    arms, cols, cells, tests = mt["arms"], mt["cols"], mt["cells"], mt["tests"]
    if not arms:
        write_text(out / "main_table.md", "# Main table: test reward\n\nMISSING: no evaluation results under "
                   "results/eval/<arm>/seed-<s>/result.json.")
        write_text(out / "main_table.tex", "% MISSING: no evaluation results under results/eval/<arm>/seed-<s>/result.json")
        return
    alpha, bold = params.report.alpha, {t["col"]: t["best"] for t in tests if t["bold"]}
    caption = (f"Test reward (per domain and mean of domain means). Cells: mean ± half-width of the Student-t 95% "
               f"confidence interval of the mean over seeds ({seed_counts_text(evals, arms)}). Bold: the best arm "
               f"in a column, only where its paired difference to the runner-up (two-sided paired t-test over "
               f"shared seeds, Holm-adjusted across the {len(cols)} columns) is significant at alpha = {alpha}.")

    def cell(arm, c, tex=False):
        s = cells[arm].get(c)
        if s is None:
            return "missing"
        pm = r"$\pm$" if tex else "±"
        txt = f"{fmt(s['mean'])} {pm} {fmt(s['ci_half'])}"
        if bold.get(c) != arm:
            return txt
        return f"\\textbf{{{txt}}}" if tex else f"**{txt}**"

    rows = [[a, str(len(evals[a])), *[cell(a, c) for c in cols]] for a in arms]
    notes = []
    for t in tests:
        if t["runner_up"] is None:
            notes.append(f"- `{t['col']}`: fewer than two arms, no test.")
            continue
        notes.append(f"- `{t['col']}`: best {t['best']} vs runner-up {t['runner_up']}: diff {fmt(t['diff'])} over "
                     f"{t['n']} shared seeds, paired t p = {fmt_p(t['p'])}, Holm p = {fmt_p(t['p_holm'])} -> "
                     f"{'marked' if t['bold'] else 'not marked'}.")
    foot = ("Marked columns: " + ", ".join(f"`{c}` ({a})" for c, a in bold.items()) + "." if bold else
            "No cell is marked: in no column does the best arm differ significantly from the runner-up "
            f"(Holm-adjusted paired t p < {alpha}).")
    header = ["arm", "n", *[("mean" if c == MEAN_COL else c) for c in cols]]
    write_text(out / "main_table.md", "\n".join(["# Main table: test reward", "", f"*{caption}*", "",
                                                 md_table(header, rows), "", foot, "",
                                                 "Best-vs-runner-up tests:", *notes]))
    tex = ["% generated by lopd.analysis -- do not edit", r"\begin{table}[t]", r"\centering",
           r"\caption{" + tex_escape(caption).replace("±", r"$\pm$") + ("" if bold else r"\textsuperscript{*}") + "}",
           r"\label{tab:main}", f"\\begin{{tabular}}{{l r {' '.join('c' for _ in cols)}}}", r"\hline",
           " & ".join(["arm", "$n$", *[tex_escape(h) for h in header[2:]]]) + r" \\", r"\hline"]
    tex += [" & ".join([tex_escape(a), str(len(evals[a])), *[cell(a, c, tex=True) for c in cols]]) + r" \\"
            for a in arms]
    tex += [r"\hline", r"\end{tabular}"]
    if not bold:
        tex.append(r"\par\smallskip{\footnotesize $^{*}$" + tex_escape(foot) + "}")
    write_text(out / "main_table.tex", "\n".join([*tex, r"\end{table}"]))


# --------------------------------------------------------------------------- exploratory comparisons
def comparisons(params: Params, evals, treatment: str) -> dict:
    """``treatment`` vs every other arm on mean test reward, paired over shared seeds: two-sided paired t
    (primary), 95% t-CI, exact sign-flip p (robustness), Holm over the family (on the t p-values) and the
    paired probability of improvement (:func:`lopd.analysis.stats.prob_improvement`). No task-level
    bootstrap: the inference is over seeds, conditional on these test tasks and their worlds."""
    lopd = values(evals, treatment)
    if not lopd:
        return {"rows": [], "skipped": [], "missing_treatment": True, "treatment": treatment}
    rows, skipped = [], []
    for arm in arm_order(evals):
        other = values(evals, arm)
        seeds, x, y = _paired(lopd, other)
        if arm == treatment:
            continue
        if len(seeds) < 2:
            skipped.append(arm)
            continue
        t = st.paired_t(x, y)
        rows.append({"arm": arm, "n": len(seeds), "diff": t["diff"], "t": t["t"], "p": t["p"],
                     "ci95": (t["ci_low"], t["ci_high"]), "p_exact": st.sign_flip_p(x, y),
                     "p_improve": st.prob_improvement(x, y), "diffs": x - y})
    for r, ph in zip(rows, st.holm([r["p"] for r in rows]) if rows else []):
        r["p_holm"] = ph
    return {"rows": rows, "skipped": skipped, "missing_treatment": False, "treatment": treatment}


def write_comparisons(out: Path, params: Params, cmp: dict, margin_contrasts: list | None = None) -> None:
    """``comparisons.md``: the family of :func:`comparisons`, then the margin's contrasts outside it
    (:func:`lopd.analysis.falsification.margin_contrast_tests`: lopd_binding against each control of the
    mechanism among them), the same rows as in ``falsification.md``."""
    t, alpha = cmp["treatment"], params.report.alpha
    md = [f"# {t} vs every other arm (test mean reward), exploratory", ""]
    if cmp["missing_treatment"]:
        write_text(out / "comparisons.md", "\n".join(md + [f"MISSING: no evaluation results for {t}."]))
        return
    md += [f"Paired over shared seeds; difference = {t} − other. p (t): two-sided paired t-test on per-seed means "
           f"(primary). Holm: adjusted over this family of {len(cmp['rows'])}. p (sign-flip): exact two-sided "
           f"sign-flip test (robustness). CI: 95% Student-t over seeds. P(improvement): the share of shared seeds "
           f"on which {t} scores above the other arm (ties count ½), paired by seed. Significant: Holm p < {alpha}. "
           "The pre-registered decisive tests are in falsification.md, outside this family. "
           f"{CONDITIONAL}", ""]

    def ci(pair):
        return "n/a" if pair is None else f"[{fmt(pair[0], 4)}, {fmt(pair[1], 4)}]"

    md.append(md_table(["other arm", "n seeds", "diff", "95% t-CI", "p (t)", "p (Holm)",
                        "p (sign-flip)", "P(improvement), paired", "significant"],
                       [[r["arm"], str(r["n"]), f"{r['diff']:+.4f}", ci(r["ci95"]), fmt_p(r["p"]),
                         fmt_p(r["p_holm"]), fmt_p(r["p_exact"]), fmt(r["p_improve"]),
                         "yes" if r["p_holm"] < alpha else "no"] for r in cmp["rows"]]))
    if cmp["skipped"]:
        md += ["", f"Fewer than two seeds shared with {t} (not compared): " + ", ".join(cmp["skipped"]) + "."]
    md += render_margin_contrasts(margin_contrasts or [])
    write_text(out / "comparisons.md", "\n".join(md))


# --------------------------------------------------------------------------- headline metrics
def write_metrics(out: Path, mt: dict, fal: dict, premise: dict) -> list[str]:
    """``reports/metrics/``: one small flat JSON per row of ``dvc metrics show`` (one file = one row, so
    ten arms fit 120 columns): ``reward/<arm>`` (mean, ci half-width, n seeds), ``vs/<arm>`` (each test
    of the rule: estimate, 95% t-CI half-width, n, one-sided p of the t-test and of the exact sign-flip
    test, pass), ``verdict/{gain,content,claim}`` (pass), ``premise/gate`` (pass, or why not known) and
    ``premise/<mode>`` (mean δ). Stale files of an earlier run are removed first."""
    base = out / "metrics"
    for old in sorted(base.rglob("*.json")) if base.exists() else []:
        old.unlink()
    rows: dict[str, dict] = {}
    for a in mt["arms"]:
        s = mt["cells"][a].get(MEAN_COL)
        if s is not None:
            rows[f"reward/{a}"] = {"mean": s["mean"], "ci": s["ci_half"], "n": s["n"]}
    for r in fal["tests"]:
        half = (r["ci95"][1] - r["ci95"][0]) / 2 if r.get("ci95") else None
        rows[f"vs/{r['spec'].comparator}"] = {"mean": r.get("diff"), "ci": half, "n": r["n"], "p": r.get("p"),
                                              "p_exact": r.get("p_exact"), "pass": r["reject"]}
    for k in ("gain", "content", "claim"):
        rows[f"verdict/{k}"] = {"pass": fal["verdict"][k]}
    rows["premise/gate"] = {"pass": premise["holds"] if premise["holds"] is not None else premise["status"]}
    for mode, d in premise["delta"].items():
        rows[f"premise/{mode}"] = {"mean": d}
    for name, row in rows.items():
        write_json(base / f"{name}.json", {k: _round(v) for k, v in row.items()})
    return sorted(rows)


def _round(v):
    """5 significant digits: what ``dvc metrics show`` prints anyway, and no float noise in diffs."""
    if isinstance(v, (float, np.floating)) and math.isfinite(v) and v != 0:
        return float(f"{float(v):.5g}")
    return v
