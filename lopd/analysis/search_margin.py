"""``reports/search.md``'s margin section: what the margin did in the search's trials.

Each trial's margin behaviour is the constraint status of each of its seeds' runs
(:func:`lopd.analysis.constraint.constraint_status`: binds / slack / degenerates / unsettled, over the last quarter
of its steps) and its β path; the selected trial's is spelled out, because at a margin Δ(φ) never reaches, dual
ascent raises β by about η_β·m per step whatever φ does: an open-loop β ramp. Then the η_β × m grid the search
tried, and where lopd_binding trains (or why it does not).
"""

from __future__ import annotations

from lopd.analysis.loading import num
from lopd.analysis.render import fmt, md_table
from lopd.analysis.search_record import Binding


def status_cell(t: dict | None) -> str:
    if not t:
        return "—"
    counts = {s: t["status"].count(s) for s in dict.fromkeys(t["status"])}
    return ", ".join(f"{s}" + (f" ×{n}" if n > 1 else "") for s, n in counts.items())


def margin_section(search: dict) -> list[str]:
    """What the margin did: at the selected point (status, β path), and across the search."""
    margins, sel = search.get("margins"), search["selection"]
    md = ["## What the margin did", ""]
    if not margins:
        return md + ["MISSING: hpo/margin_paths.csv (a search run before it was recorded): the trials' margin "
                     "behaviour is unknown.", ""]
    t = margins.get(str(sel.selected))
    if t is None:
        md += [f"The selected trial {sel.selected} has no recorded margin path.", ""]
    else:
        quarter = sorted({int(round(q * (len(t["steps"]) - 1))) for q in (0, 0.25, 0.5, 0.75, 1.0)}) if t["steps"] else []
        path = ", ".join(f"step {int(t['steps'][i])}: {fmt(t['beta_path'][i], 2)}" for i in quarter)
        md += [f"At the selected point (trial {sel.selected}, m = {fmt(t['m'], 3)}) the constraint's status is "
               f"**{status_cell(t)}** (one per seed's run, over the last quarter of its steps). Δ(φ) reached at "
               f"most {fmt(t['max_delta'], 4)}; β (mean over seeds) went {path}, a fitted rise of "
               f"{fmt(t['beta_per_step'], 3)} per step.", ""]
        if t["status"] and all(s == "degenerates" for s in t["status"]):
            md += ["**The margin never binds at the selected point: Δ(φ) stays below m, so dual ascent "
                   "(β ← max(0, β + η_β(m − Δ))) raises β by about η_β·m every step whatever φ does. The tested "
                   "objective is a β ramp, not the paper's binding privilege margin.** β weights φ's Δ(φ) term in "
                   "the composer's loss, not the student's distillation; `train.beta_max` only flags a run "
                   "infeasible, it does not cap β.", ""]
    statuses = [s for tr in margins.values() for s in tr["status"]]
    counts = ", ".join(f"{s} {statuses.count(s)}" for s in dict.fromkeys(statuses))
    md += [f"Across the search's {len(margins)} trials ({len(statuses)} runs): {counts}. No trial is pruned: a batch "
           "trains its trials to the horizon together, so every trial keeps its value and shows its margin's status "
           "(`docs/margin.md`: the rule counts shares of the last quarter's steps, so one noisy step does not decide "
           "it).", "", *_grid_lines(search)]
    binds = [n for n, tr in margins.items() if "binds" in tr["status"]]
    reached = max(((tr["max_delta"], n) for n, tr in margins.items() if tr["max_delta"] is not None), default=None)
    positive = [tr["m"] for tr in margins.values() if tr["m"] is not None and tr["m"] > 0]
    if binds:
        md += [f"Trials whose margin binds in at least one seed: {', '.join(sorted(binds, key=int))}."]
    elif all(s == "too short" for s in statuses):
        md += ["No run was long enough to tell whether its margin binds."]
    elif reached is not None:
        md += [f"**No trial's margin binds.** The largest Δ(φ) any run reached is {fmt(reached[0], 4)} (trial "
               f"{reached[1]}); the smallest positive m tried is {fmt(min(positive), 3) if positive else '—'}."]
    return md + ["", *_binding_lines(sel.binding_point), ""]


def _binding_lines(b: Binding | None) -> list[str]:
    """Where the lopd_binding arm trains (the best completed trial whose margin binds), or why it does not."""
    if b is None:
        return ["lopd_binding's point: not recorded (a search written before the arm existed)."]
    if b.trial is None:
        return [f"**lopd_binding is not run: {b.reason}.**"]
    p = b.point or {}
    return [f"lopd_binding (the paper's mechanism) trains at trial {b.trial}, the best completed trial whose "
            f"margin binds ({', '.join(b.statuses)}): m = {p.get('margin')}, η_β = {p.get('eta_beta', '—')}, K = "
            f"{p.get('K')}, n_ret = {p.get('n_ret')}, lr = {p.get('lr_student')}, val reward {fmt(b.value, 4)}."]


def _grid_lines(search: dict) -> list[str]:
    """The η_β × m grid the search tried: per cell, its trials' constraint statuses (one per seed) and the largest
    Δ(φ) any of their runs reached (the evidence behind "binds" or its absence)."""
    margins = search.get("margins") or {}
    cells: dict[tuple[float, float], list] = {}
    for t in search["trials"]:
        m, eta = num(t.get("margin")), num(t.get("eta_beta"))
        tr = margins.get(str(t.get("number")))
        if m is None or eta is None or tr is None:
            continue
        c = cells.setdefault((eta, m), [[], []])
        c[0] += tr["status"]
        c[1] += [tr["max_delta"]] if tr["max_delta"] is not None else []
    if not cells:
        return []
    etas, ms = sorted({e for e, _ in cells}), sorted({m for _, m in cells})

    def cell(e, m):
        c = cells.get((e, m))
        if c is None:
            return "—"
        return status_cell({"status": c[0]}) + (f"; max Δ {fmt(max(c[1]), 3)}" if c[1] else "")

    return ["The η_β × m grid the search tried (each cell: its trials' status per seed, and the largest Δ(φ) their "
            "runs reached):", "", md_table(["m", *(f"η_β = {e:g}" for e in etas)],
                                           [[f"{m:g}", *(cell(e, m) for e in etas)] for m in ms]), ""]
