"""The margin's dose-response on val (``reports/margin_dose.md``, ``figures/margin_dose.png``): the sensitivity
grid's val reward against m, one line per η_β, each point with its runs' constraint status, and the reference arms
(``sensitivity.references``: lopd_frozen, lopd_nomargin, lopd_fixbeta as the final runs train them) on the same
seeds. Everything but m and η_β is held at the selected point, so a line is the margin's effect at that η_β.

Reads ``reports/plots/margin_dose.csv`` (:func:`dose_rows` writes it from ``results/sensitivity/grid.csv``)."""

from __future__ import annotations

import math
from pathlib import Path

from lopd.analysis import stats as st
from lopd.analysis.loading import num, read_csv_rows
from lopd.analysis.render import fmt, md_table

COLUMNS = ["margin", "arm", "seed", "val_reward", "eta_beta", "status"]


def line_name(eta_beta: float) -> str:
    return f"lopd η_β={eta_beta:g}"


def dose_rows(root: Path) -> list[dict]:
    """The plot rows: lopd's grid runs on the margin axis and the dose block (``arm`` = :func:`line_name`), then
    each reference arm's runs repeated at every m of the grid (a flat line in ``dvc plots``; ``status`` empty)."""
    grid = read_csv_rows(root / "results" / "sensitivity" / "grid.csv")
    rows, ms = [], set()
    for r in grid:
        m, eta, y = num(r.get("margin")), num(r.get("eta_beta")), num(r.get("val_reward"))
        if r.get("axis") in ("margin", "dose") and None not in (m, eta, y):
            ms.add(m)
            rows.append({"margin": m, "arm": line_name(eta), "seed": r.get("seed"), "val_reward": y, "eta_beta": eta,
                         "status": r.get("constraint") or ""})
    for r in grid:
        y = num(r.get("val_reward"))
        if r.get("axis") == "reference" and y is not None:
            rows += [{"margin": m, "arm": r["arm"], "seed": r.get("seed"), "val_reward": y, "eta_beta": None,
                      "status": ""} for m in sorted(ms)]
    return rows


def dose_response(rows: list[dict]) -> dict:
    """``lines``: η_β -> m -> {n, mean, ci_half, statuses}; ``references``: arm -> {n, mean, ci_half} (one value per
    seed: the repeated rows of :func:`dose_rows` counted once)."""
    lines: dict[float, dict[float, dict]] = {}
    refs: dict[str, dict[str, float]] = {}
    for r in rows:
        if r.get("eta_beta") is None:
            refs.setdefault(r["arm"], {})[str(r["seed"])] = r["val_reward"]
            continue
        cell = lines.setdefault(float(r["eta_beta"]), {}).setdefault(float(r["margin"]), {"ys": [], "statuses": []})
        cell["ys"].append(r["val_reward"])
        cell["statuses"].append(r.get("status") or "")

    def summ(ys):
        s = st.summarize(ys)
        return {"n": s["n"], "mean": s["mean"], "ci_half": s["ci_half"] if math.isfinite(s["ci_half"]) else None}

    return {"lines": {eta: {m: {**summ(c["ys"]), "statuses": c["statuses"]} for m, c in sorted(by_m.items())}
                      for eta, by_m in sorted(lines.items())},
            "references": {arm: summ(list(by_seed.values())) for arm, by_seed in refs.items()}}


def _cell(c: dict | None) -> str:
    if c is None:
        return "—"
    counts = {s: c["statuses"].count(s) for s in dict.fromkeys(c["statuses"]) if s}
    status = ", ".join(s + (f" ×{k}" if k > 1 else "") for s, k in counts.items())
    ci = f" ± {fmt(c['ci_half'], 3)}" if c["ci_half"] is not None else ""
    return f"{fmt(c['mean'], 4)}{ci} ({status or 'no status'})"


def render_dose_response(info: dict, selected: dict | None) -> str:
    """``margin_dose.md``: the table (rows m, columns η_β) and the reference arms."""
    md = ["# The margin's dose-response (validation split)", ""]
    lines, refs = info["lines"], info["references"]
    if not lines:
        return "\n".join(md + ["MISSING: results/sensitivity/grid.csv has no margin runs (run the sensitivity stage)."])
    sel = selected or {}
    md += ["Val reward (mean ± t 95% CI half-width over the sensitivity grid's seeds) of lopd at each margin m and "
           "dual step η_β, K, n_ret and the learning rate held at the selected point "
           f"(K = {sel.get('K', '?')}, n_ret = {sel.get('n_ret', '?')}, lr = {sel.get('lr_student', '?')}; selected "
           f"m = {sel.get('margin', '?')}, η_β = {sel.get('eta_beta', '?')}). In brackets, each run's constraint status "
           "over its last quarter (`docs/margin.md`: binds, slack, degenerates, unsettled, too short).", ""]
    etas = list(lines)
    ms = sorted({m for by_m in lines.values() for m in by_m})
    md.append(md_table(["m", *(f"η_β = {e:g}" for e in etas)],
                       [[f"{m:g}", *(_cell(lines[e].get(m)) for e in etas)] for m in ms]))
    md += ["", "Reference arms on the same seeds and horizon, each at the point the final runs train it at:", ""]
    if refs:
        md.append(md_table(["arm", "val reward", "seeds"],
                           [[a, fmt(r["mean"], 4) + (f" ± {fmt(r['ci_half'], 3)}" if r["ci_half"] is not None else ""),
                             str(r["n"])] for a, r in refs.items()]))
    else:
        md.append("none (`sensitivity.references` is empty).")
    binds = [(e, m) for e in etas for m, c in lines[e].items() if c["statuses"].count("binds") * 2 >= len(c["statuses"])]
    md += ["", (f"The margin binds in at least half the runs at {len(binds)} of {sum(len(v) for v in lines.values())} "
                "grid points: " + ", ".join(f"m = {m:g}, η_β = {e:g}" for e, m in binds) + ".") if binds else
           "**At no grid point does the margin bind in at least half its runs.**"]
    return "\n".join(md)
