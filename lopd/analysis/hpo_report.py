"""``reports/search.md``: what the validation search can tell apart, and what every arm was tuned on.

Reads the hpo stage's outputs only (``hpo/trials.csv``, ``hpo/margin_paths.csv``, ``hpo/selection.json``,
``hpo/baselines.yaml``; the selection logic is :mod:`lopd.hpo.selection`) and the runs'
``result.json`` (the hyper-parameters each final run used). What the margin did: :mod:`lopd.analysis.search_margin`.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from lopd.analysis.constraint import trial_margins
from lopd.analysis.loading import num, read_csv_rows
from lopd.analysis.render import fmt, md_table
from lopd.analysis.search_margin import margin_section, status_cell
from lopd.analysis.search_record import Selection

RULES = {"best": "the highest validation reward",
         "median_margin": "among the trials tied with the best, the median margin (the lower median of an even "
                          "set), then the highest value, then the lowest trial number",
         "smallest_margin": "among the trials tied with the best, the smallest margin, then the highest value"}


def load_search(root: Path) -> dict | None:
    sel_path = root / "hpo" / "selection.json"
    if not sel_path.exists():
        return None
    base_path, paths = root / "hpo" / "baselines.yaml", root / "hpo" / "margin_paths.csv"
    runs_path, reruns_path = root / "hpo" / "baselines.csv", root / "hpo" / "reruns.csv"
    arms = {}
    for d in sorted((root / "hpo" / "arms").glob("*/selection.json")):  # every other arm's own search
        a = d.parent
        arms[a.name] = {"selection": Selection.from_json(json.loads(d.read_text())), "trials": read_csv_rows(a / "trials.csv"),
                        "reruns": read_csv_rows(a / "reruns.csv") if (a / "reruns.csv").exists() else None}
    return {"selection": Selection.from_json(json.loads(sel_path.read_text())),
            "trials": read_csv_rows(root / "hpo" / "trials.csv"),
            "baselines": (yaml.safe_load(base_path.read_text()) or {}) if base_path.exists() else None,
            "margins": trial_margins(read_csv_rows(paths)) if paths.exists() else None,
            "baseline_runs": read_csv_rows(runs_path) if runs_path.exists() else None,
            "reruns": read_csv_rows(reruns_path) if reruns_path.exists() else None, "arms": arms}


def search_metrics(search: dict | None) -> dict:
    """The selected point and its tie count, for ``dvc metrics``."""
    if search is None:
        return {}
    sel = search["selection"]
    return {**{k: v for k, v in sel.point.items()}, "val_reward": sel.value, "tie_count": sel.tie_count,
            "tie_unit": sel.unit,
            "distinguishable_from_runner_up": sel.distinguishable, "selected_by_tie_rule": sel.by_rule,
            "on_boundary": sorted(k for k, v in sel.boundary.items() if v)}


def _verdict(sel: Selection) -> list[str]:
    ru = sel.runner_up
    level = f"{100 * (1 - sel.alpha):.0f}%"
    if ru is None:
        return ["Only one trial completed: nothing to compare it with."]
    unit = (f"paired by seed over {len(sel.seeds)} seeds" if sel.unit == "seed" else "paired over val tasks")
    gap = (f"best − runner-up (trial {ru['number']}) = {fmt(ru['diff'], 4)}, {unit}, {level} CI "
           f"[{fmt(ru['low'], 4)}, {fmt(ru['high'], 4)}], p = {fmt(ru['p'], 3)}.")
    if sel.distinguishable:
        head = "**The best trial is distinguishable from the runner-up**: " + gap
    else:
        head = (f"**The best trial is not distinguishable from the runner-up**: {gap} {sel.tie_count} trial(s) are "
                f"statistically tied with the best, and the registered tie rule chose among them.")
    how = (f"Selected: trial {sel.selected} "
           + ("(the best trial itself)." if not sel.by_rule else f"(by the tie rule; the best was trial {sel.best})."))
    return [head, "", how, "", *_boundary_lines(sel)]


def _boundary_lines(sel: Selection) -> list[str]:
    """Where the selected point sits in its (extended) space, and what the registered boundary rule did."""
    edge = [f"{k} = {sel.point[k]} is the {v}est choice" for k, v in sel.boundary.items() if v]
    rule = sel.boundary_rule
    if rule is None:
        return [("**On the boundary of the search space:** " + "; ".join(edge) + ": the optimum may lie outside it."
                 if edge else "The selected point is inside the search space on every coordinate.")]
    md = [f"Boundary rule (registered before the search: at most {rule['max_extensions']} extension(s), "
          "`hpo.max_extensions`): " + ("no extension was made." if not rule["extensions"] else
                                       f"{len(rule['extensions'])} extension(s).")]
    for i, e in enumerate(rule["extensions"], 1):
        md.append(f"- extension {i}, after {e['after_trials']} trials (selected then: trial {e['selected']}): "
                  + "; ".join(e["notes"]))
    if rule["flag"]:
        md += ["", f"**Flagged: after the last extension the selected value is still on an edge of "
                   f"{', '.join(rule['flag'])}** ({'; '.join(edge)}): the optimum may lie outside the searched range."]
    else:
        nat = rule.get("natural_bounds") or []
        md += ["", "No selected value is on an edge the rule can extend"
               + (f"; {', '.join(nat)} at a natural bound (m = 0, K or n_ret at 1 or at what the cold start "
                  "trained, a group of 2)." if nat else ".")]
    return md


def _trials_table(search: dict, sel: Selection, axes: list[str], margins: dict | None) -> str:
    """Every finished trial: its val reward with its CI, Δ vs the best paired over tasks, whether it ties by seed
    with the best, its point and (an arm with a margin) its constraint status, max Δ(φ) and final β."""
    rows = []
    task_sel = (sel.search or sel)  # the task-paired comparison of every trial on the search's seeds
    for t in search["trials"]:
        n = str(t.get("number"))
        vs = task_sel.vs_best.get(n)
        lo, hi = num(t.get("ci_low")), num(t.get("ci_high"))
        m = [] if margins is None else [status_cell(margins.get(n)), fmt((margins.get(n) or {}).get("max_delta"), 4),
                                        fmt((margins.get(n) or {}).get("beta_final"), 2)]
        rows.append([n, t.get("state", ""), fmt(num(t.get("value")), 4),
                     f"[{fmt(lo, 3)}, {fmt(hi, 3)}]" if lo is not None and hi is not None else "—",
                     "best" if n == str(task_sel.best) else (f"{fmt(vs['diff'], 4)} [{fmt(vs['low'], 3)}, {fmt(vs['high'], 3)}]"
                                                            if vs else "—"),
                     "yes" if str(t.get("tied_with_best")).lower() == "true" else "no",
                     *(str(t.get(k, "")) for k in axes), *m, "**selected**" if n == str(sel.selected) else ""])
    names = {"margin": "m", "lr_student": "lr", "group_size": "group size", "eta_beta": "η_β"}
    return md_table(["trial", "state", "val reward", "95% CI", "Δ vs best [CI]", "tied", *(names.get(a, a) for a in axes),
                     *([] if margins is None else ["constraint (per seed)", "max Δ(φ)", "β end"]), ""], rows)


def _arm_sections(search: dict) -> list[str]:
    """Each other arm's own search (``hpo/arms/<arm>``): its verdict, ties by seed, boundary rule and trials."""
    md = []
    for arm, s in (search.get("arms") or {}).items():
        sel = s["selection"]
        axes = list(sel.space or sel.point)
        md += [f"## {arm}'s own search ({', '.join(axes)})", "",
               f"{len(s['trials'])} trials on val; {arm} has no privilege margin, so its trials have no constraint "
               "status." if "margin" not in axes else f"{len(s['trials'])} trials on val.", "", *_verdict(sel), ""]
        md += _rerun_section(sel, "###")
        md += ["### Trials", "", _trials_table(s, sel, axes, None), ""]
        if sel.unit == "seed":
            md += ["Val reward, CI and Δ vs best: on the search's own seeds, paired over val tasks; *tied*: by seed "
                   "with the best rerun trial.", ""]
    return md


def _knob_sections(search: dict) -> list[str]:
    """Each arm tuned over one knob's grid (``hpo.baseline_arms``, e.g. lopd_fixbeta's held β): the val reward
    of every value, the selected one, and what the boundary rule did with the grid's edges."""
    md = []
    for arm, b in sorted((search.get("baselines") or {}).items()):
        if b.get("knob") == "search":
            continue
        knob = b.get("knob", "lr_student")
        what = {"lr_student": "student lr", "beta_fixed": "held β"}.get(knob, knob)
        by_value = sorted(b["values"].items(), key=lambda kv: float(kv[0]))  # yaml sorts keys as text
        rows = [[v, fmt(r, 4), "**selected**" if float(v) == float(b[knob]) else ""] for v, r in by_value]
        seeds = sorted({r["seed"] for r in search.get("baseline_runs") or [] if r.get("arm") == arm})
        md += [f"## {arm}'s {what} (one knob's grid)", "",
               f"{len(rows)} values on val, each the mean of {len(seeds) or '?'} seeds' runs; selected: {b[knob]:g} "
               "(the highest mean val reward, the smaller value of an exact tie).", "",
               md_table([what, "val reward", ""], rows), ""]
        rule = b.get("boundary_rule")
        if rule is None:
            md += ["The boundary rule was not applied to this grid (an hpo run before it was).", ""]
            continue
        md.append(f"Boundary rule (the search's, `hpo.max_extensions` = {rule['max_extensions']}): "
                  + ("no extension was made." if not rule["extensions"] else f"{len(rule['extensions'])} extension(s)."))
        for i, e in enumerate(rule["extensions"], 1):
            md.append(f"- extension {i}, after {e['after_values']} values (selected then: {e['selected']:g}): "
                      + "; ".join(e["notes"]))
        if rule["flag"]:
            md += ["", f"**Flagged: after the last extension the selected {what} = {b[knob]:g} is still on an edge of "
                       "its grid**: the optimum may lie outside the tuned range.", ""]
        else:
            nat = rule.get("natural_bounds") or []
            md += ["", "The selected value is not on an edge the rule can extend"
                   + (f" ({what} = 0 is a natural bound)." if nat else "."), ""]
    return md


def _rerun_section(sel: Selection, heading: str = "##") -> list[str]:
    """The rerun trials: each one's mean over every seed, its per-seed values and its difference to the best
    by seed (the test the selection ties by)."""
    if sel.unit != "seed":
        return []
    level = f"{100 * (1 - sel.alpha):.0f}%"
    rows = []
    for n in sel.rerun:
        k, vs = str(n), sel.vs_best.get(str(n))
        p = sel.per_seed[k]
        rows.append([k, fmt(sum(p) / len(p), 4),
                     ", ".join(fmt(v, 3) for v in p),
                     "best" if n == sel.best else f"{fmt(vs['diff'], 4)} [{fmt(vs['low'], 3)}, {fmt(vs['high'], 3)}]",
                     "yes" if n in sel.tied else "no", "**selected**" if n == sel.selected else ""])
    return [f"{heading} The best trials on more seeds (ties by seed)", "",
            md_table(["trial", f"mean over {len(sel.seeds)} seeds", f"per seed ({', '.join(map(str, sel.seeds))})",
                      f"Δ vs best by seed [{level} CI]", "tied", ""], rows), ""]


def render_search(search: dict | None, runs: dict) -> str:
    md = ["# Validation search", ""]
    if search is None:
        return "\n".join(md + ["MISSING: hpo/selection.json (run the hpo stage)."])
    sel = search["selection"]
    md += [f"Tie rule (registered in params.yaml before the search ran, `hpo.tie_rule: {sel.rule}`): "
           f"{RULES.get(sel.rule, sel.rule)}. Two trials are *tied* when the paired difference of their per-task "
           f"validation rewards (common random numbers: the same tasks and sampling seeds in every trial) has a "
           f"{100 * (1 - sel.alpha):.0f}% t-interval holding 0.", ""]
    if sel.unit == "seed":
        md += [f"That task-paired test sees the tasks' noise on a mean over the search's few seeds, and a trial's "
               f"seed moves its value more. So the search's {len(sel.rerun)} best trials were rerun on more "
               f"seeds, and the selection among them takes **the seed as the unit**: two trials are tied when the "
               f"difference of their per-seed mean val rewards (the same {len(sel.seeds)} seeds, "
               f"{', '.join(map(str, sel.seeds))}, for both) has a {100 * (1 - sel.alpha):.0f}% t-interval over "
               "seeds holding 0. The tie rule chose among those ties.", ""]
    md += _verdict(sel) + [""] + _rerun_section(sel) + margin_section(search) + ["## Trials", ""]
    axes = [a for a in ("margin", "K", "n_ret", "lr_student", "eta_beta") if any(a in t for t in search["trials"])]
    md.append(_trials_table(search, sel, axes, search.get("margins") or {}))
    if sel.unit == "seed":
        md += ["", "Val reward, 95% CI and Δ vs best: on the search's own seeds, paired over val tasks against the "
               "search's best trial. *tied*: tied by seed with the best rerun trial (rerun trials only: the "
               "table above)."]
    values = {num(t.get("value")) for t in search["trials"] if t.get("state") == "COMPLETE"}
    if len(values) == 1 and len([t for t in search["trials"] if t.get("state") == "COMPLETE"]) > 1:
        md += ["", "**Every completed trial scored exactly the same validation reward: the search told nothing apart.**"]
    md += ["", *_arm_sections(search), *_knob_sections(search)]
    md += ["## What each arm was tuned on (validation split only)", "", _tuning_table(search, runs)]
    return "\n".join(md)


def _beta_cell(hp: dict, sw: dict) -> str:
    """How β moved in an arm's runs: dual ascent, an open-loop ramp, held, or no margin term."""
    if not sw.get("margin") or not sw.get("train_composer"):
        return "—"
    schedule = sw.get("beta_schedule", "dual")
    if schedule == "fixed":
        return f"held at {hp.get('beta_fixed')}"
    if schedule == "ramp":
        rate = hp.get("beta_rate")
        rate = rate if rate is not None else (hp.get("eta_beta") or 0.0) * (hp.get("margin") or 0.0)
        return f"ramp {fmt(rate, 3)}/step"
    return f"dual ascent, η_β = {hp.get('eta_beta')}"


def _budgets(search: dict) -> tuple[str, dict[str, str]]:
    """The val training runs each tuning spent: the search's (trials × its seeds, plus the rerun trials'
    extra seeds), which every arm at the selected point inherits, and each tuned baseline's (values × seeds),
    from ``trials.csv``, ``reruns.csv`` and ``baselines.csv``; "?" where a file is missing."""
    base_runs = search.get("baseline_runs")
    search_budget = _search_budget(search["trials"], search.get("reruns"), base_runs)
    by_arm: dict[str, str] = {}
    for r in base_runs or []:
        by_arm.setdefault(r["arm"], [])
        by_arm[r["arm"]].append((r["knob_value"], r["seed"]))
    budgets = {a: f"{len({v for v, _ in rs})} values × {len({s for _, s in rs})} seeds = {len(rs)} runs"
               for a, rs in by_arm.items()}
    for arm, s in (search.get("arms") or {}).items():
        budgets[arm] = _search_budget(s["trials"], s.get("reruns"), base_runs)
    return search_budget, budgets


def _search_budget(trials: list[dict], reruns: list[dict] | None, base_runs: list[dict] | None) -> str:
    """A search's val training runs: trials × its seeds, plus the rerun trials' extra seeds."""
    n_trials = len(trials)
    if reruns:
        per_trial: dict[str, int] = {}
        for r in reruns:
            if r.get("source") == "search":
                per_trial[r["trial"]] = per_trial.get(r["trial"], 0) + 1
        seeds = max(per_trial.values()) if per_trial else 0
        extra = sum(1 for r in reruns if r.get("source") == "rerun")
        n_conf = len({r["trial"] for r in reruns})
        more = f" + {n_conf} × {extra // n_conf if n_conf else 0} more seeds" if extra else ""
        search_budget = f"{n_trials} trials × {seeds} seeds{more} = {n_trials * seeds + extra} runs"
    elif base_runs:
        seeds = len({r["seed"] for r in base_runs})
        search_budget = f"{n_trials} trials × {seeds} seeds = {n_trials * seeds} runs"
    else:
        search_budget = f"{n_trials} trials × ? seeds"
    return search_budget


def _tuning_table(search: dict, runs: dict) -> str:
    point, base = search["selection"].point, search["baselines"] or {}
    search_budget, budgets = _budgets(search)
    rows = []
    for arm in sorted(runs):
        res = next(iter(runs[arm].values()))["result"]  # every seed of an arm runs the same hyper-parameters
        hp, sw = res.get("hparams") or {}, res.get("arm_switches") or {}
        if arm in base and base[arm].get("knob") == "search":
            got = base[arm]
            how = (f"its own search over {', '.join(got['knobs'])} (selected trial {got['trial']}, val reward "
                   f"{fmt(got['value'], 3)}; what it does not search: " + ("the search's selected point)"
                                                                         if sw.get("use_selected") else "train.*)"))
            budget = budgets.get(arm, "?")
        elif arm in base:
            knob = base[arm].get("knob", "lr_student")
            by_value = sorted(base[arm]["values"].items(), key=lambda kv: float(kv[0]))  # yaml sorts keys as text
            vals = ", ".join(f"{v}: {fmt(r, 3)}" for v, r in by_value)
            what = {"lr_student": "student lr", "beta_fixed": "held β"}.get(knob, knob)
            how = f"{what} from {{{vals}}} (val reward per value)"
            if knob != "lr_student" and sw.get("use_selected"):
                how += "; m, K, n_ret, lr of the selected point"
            budget = budgets.get(arm, "?") + (" at the search's point" if sw.get("use_selected") else "")
        elif sw.get("use_selected") and sw.get("trains", True):
            how = ("the search's binding point: its best trial whose margin binds (m, K, n_ret, student lr, η_β)"
                   if sw.get("point") == "binding" else "the search's selected point (m, K, n_ret, student lr, η_β)")
            budget = f"the search's ({search_budget})" if arm != "lopd" else search_budget
        elif not sw.get("trains", True):
            how, budget = "not trained", "—"
        else:
            how, budget = "**not tuned** (train.* defaults)", "0"
        rows.append([arm, how, budget, str(hp.get("lr_student", "—")), str(hp.get("margin", "—")),
                     str(hp.get("K", "—")), str(hp.get("n_ret", "—")),
                     str(hp.get("group_size", "—")) if sw.get("grouped") else "—", _beta_cell(hp, sw)])
    searched = sorted(a for a, b in base.items() if b.get("knob") == "search")
    one_knob = sorted(a for a, b in base.items() if b.get("knob") != "search")
    note = (f"Search's selected point: {', '.join(f'{k} = {v}' for k, v in point.items())}. Budget: the val "
            "training runs the tuning spent, at the final runs' horizon. "
            + (f"{', '.join(searched)} searched their own coordinates with LOPD's budget (trials × seeds, the "
               "confirmation of the best, the tie rule, the boundary rule; a space with no more points than the "
               "budget is searched whole, each point once). " if searched else "")
            + (f"{', '.join(one_knob)}: one knob's grid at the selected point (a control of the mechanism, not a "
               "competing method). " if one_knob else "")
            + ("" if searched else "**The budgets are not equal**: LOPD's search spends more runs over four "
               "coordinates than a baseline over its one knob; a method tuned harder than its controls can win on "
               "tuning."))
    return note + "\n\n" + md_table(["arm", "tuned on val", "val runs (budget)", "lr used", "m", "K", "n_ret",
                                      "group size", "β"], rows)
