"""Training dynamics: margin flags per run and the sample-efficiency ratio (LOPD vs GRPO).

Computed from the runs' ``history.csv`` and ``result.json`` (the same measurements the plot CSVs hold).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from lopd.analysis import stats as st
from lopd.analysis.loading import series
from lopd.analysis.plotdata import DYNAMICS_ARMS, MARGIN_ARMS
from lopd.analysis.constraint import (BAND_FLOOR, BAND_FRAC, BETA_ZERO, DRIFT_FRAC, SHARE, STATUSES, constraint_band,
                                      constraint_status)
from lopd.analysis.render import finite, fmt, md_table

PAPER_EFFICIENCY_CLAIM = 0.30


def aggregate(curves: list[tuple[np.ndarray, np.ndarray]]) -> dict | None:
    """Seeds' curves on the union grid (linear interpolation inside each seed's range, nan outside):
    ``Y`` (seeds × grid), and per grid point ``mean``, ``std``, ``min``, ``max``, ``n`` (seeds measured)."""
    curves = [(x, y) for x, y in curves if x.size]
    if not curves:
        return None
    grid = np.unique(np.concatenate([x for x, _ in curves]))
    Y = np.full((len(curves), grid.size), np.nan)
    for i, (x, y) in enumerate(curves):
        xu, idx = np.unique(x[::-1], return_index=True)  # duplicate x: keep the last measurement
        yu = y[::-1][idx]
        inside = (grid >= xu[0]) & (grid <= xu[-1])
        Y[i, inside] = np.interp(grid[inside], xu, yu)
    n = np.sum(np.isfinite(Y), axis=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # ddof=1 on a single seed
        mean, lo, hi = np.nanmean(Y, axis=0), np.nanmin(Y, axis=0), np.nanmax(Y, axis=0)
        std = np.where(n > 1, np.nanstd(Y, axis=0, ddof=1), 0.0)
    return {"x": grid, "Y": Y, "mean": mean, "std": std, "min": lo, "max": hi, "n": n}


# --------------------------------------------------------------------------- margin dynamics
def margin_value(runs) -> float | None:
    """The margin m of the lopd runs (their hparams), None if no lopd run recorded one."""
    for seed in sorted(runs.get("lopd", {})):
        m = (runs["lopd"][seed]["result"].get("hparams") or {}).get("margin")
        if finite(m):
            return float(m)
    return None


def beta_flags(hist: dict[str, np.ndarray]) -> dict:
    """β at mid-run and at the end; ``rising``: positive slope and last > first over the last 25% of
    steps; ``unbounded``: rising and final β > 5 × β at mid-run."""
    steps, beta = series(hist, "step", "beta")
    out = {"beta_final": None, "beta_mid": None, "rising": False, "unbounded": False}
    if steps.size < 3:
        return out
    s0, s1 = steps[0], steps[-1]
    mid = beta[np.argmin(np.abs(steps - (s0 + s1) / 2.0))]
    tail = steps >= s0 + 0.75 * (s1 - s0)
    bt, stt = beta[tail], steps[tail]
    rising = bool(bt.size >= 2 and bt[-1] > bt[0] and np.polyfit(stt, bt, 1)[0] > 0)
    return out | {"beta_final": float(beta[-1]), "beta_mid": float(mid), "rising": rising,
                  "unbounded": bool(rising and beta[-1] > 0 and beta[-1] > 5.0 * mid)}


def margin_dynamics(runs) -> dict:
    """Per run of the dynamics arms: m, max Δ(φ), β flags and, for margin-active arms, their flags and
    ``constraint`` (``constraint_status``; None for the reference arms)."""
    m_lopd = margin_value(runs)
    rows = []
    for arm in DYNAMICS_ARMS:
        for seed in sorted(runs.get(arm, {})):
            res, hist = runs[arm][seed]["result"], runs[arm][seed]["history"]
            m = (res.get("hparams") or {}).get("margin")
            m = float(m) if finite(m) else m_lopd
            b = beta_flags(hist)
            _, dphi = series(hist, "step", "delta_phi")
            max_d = float(np.max(dphi)) if dphi.size else None
            active, flags = arm in MARGIN_ARMS, []
            if active:
                flags += ["β grows without bound"] if b["unbounded"] else []
                flags += ["infeasible_margin"] if res.get("infeasible_margin") else []
                flags += ["Δ never reaches m"] if m is not None and max_d is not None and max_d < m else []
                flags += ["no Δ recorded"] if max_d is None else []
            rows.append({"arm": arm, "seed": seed, "m": m, "max_delta": max_d,
                         "infeasible": bool(res.get("infeasible_margin")), **b, "active": active, "flags": flags,
                         "constraint": constraint_status(hist, m) if active else None})
    return {"m": m_lopd, "rows": rows}


# --------------------------------------------------------------------------- efficiency
def _last_val(run) -> float | None:
    _, v = series(run["history"], "step", "val_reward")
    if v.size:
        return float(v[-1])
    v = run["result"].get("val_reward")
    return float(v) if finite(v) else None


def _total_rollouts(run) -> float | None:
    v = run["result"].get("rollouts_used")
    if finite(v):
        return float(v)
    r = run["history"].get("rollouts_used")
    return float(np.nanmax(r)) if r is not None and np.isfinite(r).any() else None


def first_crossing(grid: np.ndarray, curves: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Per row of ``curves``: the first x where it reaches its ``target`` (linear interpolation); inf if never."""
    reached = curves >= target[:, None]
    any_r, i = reached.any(axis=1), np.argmax(reached, axis=1)
    x = np.full(curves.shape[0], np.inf)
    x[any_r & (i == 0)] = grid[0]
    mid = any_r & (i > 0)
    if mid.any():
        r, j = np.nonzero(mid)[0], i[mid]
        y0, y1, x0, x1 = curves[r, j - 1], curves[r, j], grid[j - 1], grid[j]
        frac = np.where(y1 > y0, (target[mid] - y0) / np.where(y1 > y0, y1 - y0, 1.0), 1.0)
        x[mid] = x0 + np.clip(frac, 0.0, 1.0) * (x1 - x0)
    return x


def efficiency(runs, n_boot: int, confidence: float = st.DESCRIPTIVE_CONFIDENCE, *,
               min_bootstrap_seeds: int, bank_rollouts: int = 0) -> dict:
    """Ratio = (rollouts lopd's mean validation curve needs to first reach GRPO's final validation reward,
    the mean over GRPO seeds of each seed's last value) / (GRPO's mean total rollouts), with a percentile
    bootstrap CI at ``confidence`` resampling the seeds of both arms (``n_boot`` resamples,
    ``default_rng(0)``; :func:`lopd.analysis.stats.percentile_interval`, outer order statistics: a
    resample that never reaches the target has ratio +inf). The CI only where both arms have at least
    ``min_bootstrap_seeds`` seeds (:func:`lopd.analysis.stats.bootstrap_allowed`); else ``ci`` is (None, None)
    and ``ci_note`` says why. ``bank_rollouts``: the base-policy rollouts that built the experience bank LOPD
    retrieves from (GRPO needs none); ``ratio_with_bank`` = (lopd's rollouts + the bank's) / GRPO's, and
    ``ci_with_bank`` its interval (the same resamples, shifted by bank_rollouts / GRPO's total)."""
    info: dict[str, Any] = {"ratio": None, "ci": (None, None), "missing": [], "reached": False}
    lopd, grpo = runs.get("lopd", {}), runs.get("grpo", {})
    info["missing"] = [a for a, d in (("lopd", lopd), ("grpo", grpo)) if not d]
    if info["missing"]:
        return info
    finals = np.array([v for v in (_last_val(r) for r in grpo.values()) if v is not None])
    totals = [t for t in (_total_rollouts(r) for r in grpo.values()) if t is not None]
    agg = aggregate([series(r["history"], "rollouts_used", "val_reward") for r in lopd.values()])
    if finals.size == 0 or not totals or agg is None:
        info["missing"].append("validation curves / rollout counts")
        return info
    total = float(np.mean(totals))
    # hold each seed's last value beyond its range so the mean curve is defined on the whole grid
    Y = np.array([np.where(np.isfinite(r), r, r[np.isfinite(r)][-1]) if np.isfinite(r).any() else r for r in agg["Y"]])
    return info | curve_ratio(agg["x"], Y, finals, total, n_boot, confidence,
                              min_bootstrap_seeds=min_bootstrap_seeds, bank_rollouts=bank_rollouts)


def curve_ratio(grid: np.ndarray, Y: np.ndarray, finals: np.ndarray, total: float, n_boot: int,
                confidence: float = st.DESCRIPTIVE_CONFIDENCE, *, min_bootstrap_seeds: int,
                bank_rollouts: int = 0) -> dict:
    """The efficiency ratio from curves: ``Y`` (lopd seeds × ``grid`` rollouts, a reward at each) first reaching
    the mean of ``finals`` (GRPO's final reward per seed), over ``total`` (GRPO's mean rollouts); the point
    estimate on lopd's mean curve, the percentile bootstrap over both arms' seeds (``default_rng(0)``) where
    both have ``min_bootstrap_seeds``, and the same with the bank's rollouts added (:func:`efficiency`)."""
    target = float(finals.mean())
    x_point = first_crossing(grid, np.nanmean(Y, axis=0)[None, :], np.array([target]))[0]
    point = {"target": target, "grpo_total": total, "x": float(x_point), "reached": bool(np.isfinite(x_point)),
             "ratio": float(x_point / total) if np.isfinite(x_point) else None, "n_lopd": Y.shape[0],
             "n_grpo": int(finals.size), "lopd_max_rollouts": float(grid[-1]), "bank_rollouts": int(bank_rollouts),
             "ratio_with_bank": float((x_point + bank_rollouts) / total) if np.isfinite(x_point) else None}
    if not st.bootstrap_allowed(min(Y.shape[0], finals.size), min_bootstrap_seeds):
        return point | {"frac_reached": None, "ci_note": (
            f"no CI: lopd has {Y.shape[0]} and grpo {finals.size} seeds, and a percentile bootstrap is reported "
            f"only from {min_bootstrap_seeds} seeds per arm (report.min_bootstrap_seeds)")}
    rng = np.random.default_rng(0)
    il = rng.integers(0, Y.shape[0], size=(n_boot, Y.shape[0]))
    ig = rng.integers(0, finals.size, size=(n_boot, finals.size))
    rb = np.sort(first_crossing(grid, np.nanmean(Y[il], axis=1), finals[ig].mean(axis=1)) / total)
    lo, hi = st.percentile_interval(rb, confidence, outer_order_statistics=True)
    shift = bank_rollouts / total
    return point | {"ci": (lo, hi), "ci_with_bank": (lo + shift, hi + shift),
                    "frac_reached": float(np.mean(np.isfinite(rb)))}


# --------------------------------------------------------------------------- rendering
def render_margin_dynamics(info: dict) -> str:
    m, rows = info["m"], info["rows"]
    md = ["# Margin dynamics", "", "Figure: `figures/margin_dynamics.png` (mean over seeds, band = min–max); data: "
          "`plots/margin_dynamics.csv`.", "β is the dual variable of Δ(φ) ≥ m: it weights φ's Δ(φ) term in the "
          "composer's loss (β·(m − Δ(φ))), not the student's distillation. Where Δ(φ) stays below m, β rises by about "
          "η_β·m per step whatever φ does (a β ramp); a binding margin holds β level with Δ(φ) at m. The controls "
          "lopd_ramp (β_t = r·t) and lopd_fixbeta (β held) move β without reading Δ(φ): their status describes "
          "Δ(φ) against m, not a feedback loop.",
          f"Margin m (from the lopd runs' hparams): {fmt(m, 4) if m is not None else 'MISSING (no lopd run)'}.", "",
          "Flags (only arms whose margin constraint is active: " + ", ".join(MARGIN_ARMS) + "; the other arms are "
          "listed for reference only):",
          "- **β grows without bound**: β still increasing over the last 25% of steps (positive slope and last > "
          "first in that window) and final β > 5 × β at mid-run;",
          "- **infeasible_margin**: the run itself reported the margin infeasible (result.json): β went above "
          "`train.beta_max`, or Δ(φ) stayed below m for `train.infeasible_patience` steps in a row. `beta_max` only "
          "flags; it does not cap β;",
          "- **Δ never reaches m**: max over steps of Δ(φ) < m.", "", *_constraint_legend(m), ""]
    if not rows:
        return "\n".join(md + ["MISSING: no runs of " + ", ".join(DYNAMICS_ARMS) + "."])
    table = [[r["arm"], str(r["seed"]), fmt(r["m"], 4), fmt(r["max_delta"], 4), fmt(r["beta_mid"], 4),
              fmt(r["beta_final"], 4), "yes" if r["rising"] else "no", "yes" if r["infeasible"] else "no",
              *_constraint_cells(r.get("constraint")),
              (", ".join(r["flags"]) or "—") if r["active"] else "(reference, not flagged)"] for r in rows]
    md.append(md_table(["arm", "seed", "m", "max Δ", "β mid", "β final", "β rising (last 25%)", "infeasible_margin",
                        "mean Δ (last 25%)", "constraint (last 25%)", "flags"], table))
    flagged = sum(1 for r in rows if r["active"] and r["flags"])
    return "\n".join(md + ["", f"{flagged} of {sum(r['active'] for r in rows)} margin-active runs flagged.", "",
                           "Constraint status per margin-active arm (last 25% of steps):", *_constraint_summary(rows)])


def _constraint_legend(m: float | None) -> list[str]:
    at_m = f" (= {constraint_band(m):.4f} at m = {m:.4f})" if m is not None else ""
    return ["Constraint status of each margin-active run over the last 25% of its steps (steps with a nan Δ(φ) or "
            f"β dropped), with band(m) = max({BAND_FRAC:g}·|m|, {BAND_FLOOR:g}) nats{at_m}, mean Δ = the window's "
            "mean Δ(φ), β change = least-squares slope of β × the window's step span:",
            f"- **binds**: β > ε = {BETA_ZERO:g} on ≥ {SHARE:.0%} of the window's steps, β level (|β change| ≤ "
            f"max({DRIFT_FRAC:g} × mean β, ε)) and |mean Δ − m| ≤ band;",
            f"- **slack**: β ≤ ε on ≥ {SHARE:.0%} of the steps and mean Δ ≥ m − band (the margin holds without "
            "pressure; a noisy dip of Δ that lifts β for a step or two does not change it);",
            f"- **degenerates**: β > ε on ≥ {SHARE:.0%} of the steps and rising beyond the level tolerance while mean "
            "Δ < m − band (dual ascent only ramps β);",
            "- **unsettled**: none of these (what is off is given); **too short**: < 3 usable steps (or < 2 in the "
            "window); **no m**: the margin is unknown."]


def _constraint_cells(c: dict | None) -> list[str]:
    if c is None:
        return ["—", "—"]
    return [fmt(c["mean_delta"], 4), c["status"] + (f" ({c['reason']})" if c["reason"] else "")]


def _constraint_summary(rows: list[dict]) -> list[str]:
    """One line per margin-active arm: "lopd: binds in 7 of 10 runs, degenerates in 2, slack in 1"."""
    lines = []
    for arm in dict.fromkeys(r["arm"] for r in rows if r.get("constraint") is not None):
        sts = [r["constraint"]["status"] for r in rows if r["arm"] == arm and r.get("constraint") is not None]
        counts = [(s, sts.count(s)) for s in STATUSES if sts.count(s)]
        parts = [f"{s} in {k}" + (f" of {len(sts)} runs" if i == 0 else "") for i, (s, k) in enumerate(counts)]
        lines.append(f"- {arm}: " + ", ".join(parts))
    return lines or ["- (no margin-active runs)"]


def _with_bank(eff: dict, confidence: float | None) -> list[str]:
    """The ratio counting the experience bank's base rollouts too (LOPD retrieves from it; GRPO needs none)."""
    if not eff.get("bank_rollouts") or eff.get("ratio_with_bank") is None:
        return []
    lo, hi = eff.get("ci_with_bank", (None, None))
    ci = "" if confidence is None or lo is None else f", {confidence:.0%} CI [{lo:.3f}, " + (
        "not reached]" if not math.isfinite(hi) else f"{hi:.3f}]")
    return ["", f"**Counting the bank: {eff['ratio_with_bank']:.3f}**{ci} (({eff['x']:.0f} + {eff['bank_rollouts']}) / "
                f"{eff['grpo_total']:.0f} rollouts): the experience bank LOPD retrieves from took "
                f"{eff['bank_rollouts']} base-policy rollouts on train (train tasks × bank.rollouts_per_task; each "
                "seed's bank draw as many), which GRPO does not need. The ratio above leaves them out; it is "
                "measured on val, the split the search selected on."]


def ratio_text(v: float | None) -> str:
    """A ratio or a CI bound as the efficiency sections print it: 3 decimals, or "not reached" (None, inf)."""
    return "not reached" if v is None or not math.isfinite(v) else f"{v:.3f}"


def render_efficiency(eff: dict, n_boot: int, confidence: float = st.DESCRIPTIVE_CONFIDENCE,
                      confirm: list[str] | None = None) -> str:
    """``efficiency.md``; ``confirm``: the confirmatory split's section
    (:func:`lopd.analysis.confirm_efficiency.render_confirm_efficiency`), put first, the val measurement after
    it as the pilot's."""
    r = ratio_text

    md = ["# Sample efficiency", "", f"The paper claims lopd needs < {PAPER_EFFICIENCY_CLAIM:.0%} of GRPO's rollouts "
          "to reach GRPO's final reward.", ""]
    if confirm is not None:
        md += [*confirm, "## On val (the pilot: the split the search selected on)", ""]
    md += ["Figure: `figures/efficiency.png`; data: `plots/efficiency.csv`.", "",
          "Ratio = (rollouts lopd needs to first reach GRPO's final validation reward) / (GRPO's total rollouts). "
          "GRPO's final validation reward is the mean over seeds of each seed's last validation reward; the lopd "
          "curve is the mean over seeds, interpolated linearly in rollouts. "
          f"CI: percentile bootstrap {confidence:.0%} ({n_boot} resamples of the seeds of both arms).", ""]
    if eff["missing"]:
        return "\n".join(md + ["MISSING: " + ", ".join(eff["missing"]) + " — ratio not computed."])
    lo, hi = eff["ci"]
    md += [f"- GRPO final validation reward (mean of {eff['n_grpo']} seeds): {eff['target']:.4f}",
           f"- GRPO total rollouts (mean over seeds): {eff['grpo_total']:.0f}",
           f"- lopd seeds: {eff['n_lopd']}; lopd rollouts observed: up to {eff['lopd_max_rollouts']:.0f}", ""]
    if eff["reached"] and eff["x"] <= 0:
        md.append(f"**Ratio: degenerate (0 / {eff['grpo_total']:.0f}).** GRPO did not improve on the shared starting "
                  "point: its final validation reward is at or below the validation reward every arm starts from "
                  "(step 0, before any rollout), so 'rollouts needed to reach it' is zero for any method. This data "
                  "cannot test the paper's efficiency claim; it says GRPO did not learn within this budget.")
    elif eff["reached"] and eff.get("ci_note"):
        md += [f"**Ratio: {eff['ratio']:.3f}** ({eff['x']:.0f} / {eff['grpo_total']:.0f} rollouts); {eff['ci_note']}.",
               "", f"The < {PAPER_EFFICIENCY_CLAIM:.0%} claim is NOT established by this data (no interval)."]
        md += _with_bank(eff, None)
    elif eff["reached"]:
        ok = hi is not None and math.isfinite(hi) and hi < PAPER_EFFICIENCY_CLAIM
        md += [f"**Ratio: {eff['ratio']:.3f}** ({eff['x']:.0f} / {eff['grpo_total']:.0f} rollouts), {confidence:.0%} CI "
               f"[{r(lo)}, {r(hi)}]; the target was reached in {eff['frac_reached']:.0%} of bootstrap resamples.", "",
               f"The < {PAPER_EFFICIENCY_CLAIM:.0%} claim is {'consistent with' if ok else 'NOT established by'} this "
               f"data (the upper CI bound must be below {PAPER_EFFICIENCY_CLAIM:.2f})."]
        md += _with_bank(eff, confidence)
    else:
        md.append("**Ratio: not reached.** The mean lopd validation curve never reaches GRPO's final validation "
                  f"reward within the {eff['lopd_max_rollouts']:.0f} rollouts it used. This is a finding: the "
                  f"< {PAPER_EFFICIENCY_CLAIM:.0%} claim is not supported here. " + (
                      f"({eff['ci_note']}.)" if eff.get("ci_note") else
                      f"(Bootstrap: reached in {eff['frac_reached']:.0%} of resamples; CI [{r(lo)}, {r(hi)}].)"))
    return "\n".join(md)
