"""``reports/search.md``: what the validation search can tell apart, and what every arm was tuned on.

Reads the hpo stage's outputs only (``hpo/trials.csv``, ``hpo/selection.json``,
``hpo/baselines.yaml``; the selection logic is :mod:`lopd.hpo.selection`) and the runs'
``result.json`` (the hyper-parameters each final run used).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from lopd.analysis.loading import num, read_csv_rows
from lopd.analysis.render import fmt, md_table

RULES = {"best": "the highest validation reward",
         "median_margin": "among the trials tied with the best, the median margin (the lower median of an even "
                          "set), then the highest value, then the lowest trial number",
         "smallest_margin": "among the trials tied with the best, the smallest margin, then the highest value"}


def load_search(root: Path) -> dict | None:
    sel_path = root / "hpo" / "selection.json"
    if not sel_path.exists():
        return None
    base_path = root / "hpo" / "baselines.yaml"
    return {"selection": json.loads(sel_path.read_text()), "trials": read_csv_rows(root / "hpo" / "trials.csv"),
            "baselines": (yaml.safe_load(base_path.read_text()) or {}) if base_path.exists() else None}


def search_metrics(search: dict | None) -> dict:
    """The selected point and its tie count, for ``dvc metrics``."""
    if search is None:
        return {}
    sel = search["selection"]
    return {**{k: v for k, v in sel["point"].items()}, "val_reward": sel["value"], "tie_count": sel["tie_count"],
            "distinguishable_from_runner_up": sel["distinguishable"], "selected_by_tie_rule": sel["by_rule"],
            "on_boundary": sorted(k for k, v in sel["boundary"].items() if v)}


def _verdict(sel: dict) -> list[str]:
    ru = sel["runner_up"]
    level = f"{100 * (1 - sel['alpha']):.0f}%"
    if ru is None:
        return ["Only one trial completed: nothing to compare it with."]
    gap = (f"best − runner-up (trial {ru['number']}) = {fmt(ru['diff'], 4)}, paired over val tasks, {level} CI "
           f"[{fmt(ru['low'], 4)}, {fmt(ru['high'], 4)}], p = {fmt(ru['p'], 3)}.")
    if sel["distinguishable"]:
        head = "**The best trial is distinguishable from the runner-up**: " + gap
    else:
        head = (f"**The best trial is not distinguishable from the runner-up**: {gap} {sel['tie_count']} trial(s) are "
                f"statistically tied with the best, and the registered tie rule chose among them.")
    how = (f"Selected: trial {sel['selected']} "
           + ("(the best trial itself)." if not sel["by_rule"] else f"(by the tie rule; the best was trial {sel['best']})."))
    edge = [f"{k} = {sel['point'][k]} is the {v}est choice" for k, v in sel["boundary"].items() if v]
    bound = ("**On the boundary of the search space:** " + "; ".join(edge) + ": the optimum may lie outside it."
             if edge else "The selected point is inside the search space on every coordinate.")
    return [head, "", how, "", bound]


def render_search(search: dict | None, runs: dict) -> str:
    md = ["# Validation search", ""]
    if search is None:
        return "\n".join(md + ["MISSING: hpo/selection.json (run the hpo stage)."])
    sel = search["selection"]
    md += [f"Tie rule (registered in params.yaml before the search ran, `hpo.tie_rule: {sel['rule']}`): "
           f"{RULES.get(sel['rule'], sel['rule'])}. Two trials are *tied* when the paired difference of their per-task "
           f"validation rewards (common random numbers: the same tasks and sampling seeds in every trial) has a "
           f"{100 * (1 - sel['alpha']):.0f}% t-interval holding 0.", ""]
    md += _verdict(sel) + ["", "## Trials", ""]
    rows = []
    for t in search["trials"]:
        n = str(t.get("number"))
        vs = sel["vs_best"].get(n)
        lo, hi = num(t.get("ci_low")), num(t.get("ci_high"))
        rows.append([n, t.get("state", ""), fmt(num(t.get("value")), 4),
                     f"[{fmt(lo, 3)}, {fmt(hi, 3)}]" if lo is not None and hi is not None else "—",
                     "best" if n == str(sel["best"]) else (f"{fmt(vs['diff'], 4)} [{fmt(vs['low'], 3)}, {fmt(vs['high'], 3)}]"
                                                            if vs else "—"),
                     "yes" if str(t.get("tied_with_best")).lower() == "true" else "no",
                     *(str(t.get(k, "")) for k in ("margin", "K", "n_ret", "lr_student")),
                     "**selected**" if n == str(sel["selected"]) else ""])
    md.append(md_table(["trial", "state", "val reward", "95% CI", "Δ vs best [CI]", "tied", "m", "K", "n_ret",
                        "lr", ""], rows))
    values = {num(t.get("value")) for t in search["trials"] if t.get("state") == "COMPLETE"}
    if len(values) == 1 and len([t for t in search["trials"] if t.get("state") == "COMPLETE"]) > 1:
        md += ["", "**Every completed trial scored exactly the same validation reward: the search told nothing apart.**"]
    md += ["", "## What each arm was tuned on (validation split only)", "", _tuning_table(search, runs)]
    return "\n".join(md)


def _tuning_table(search: dict, runs: dict) -> str:
    point, base = search["selection"]["point"], search["baselines"] or {}
    rows = []
    for arm in sorted(runs):
        res = next(iter(runs[arm].values()))["result"]  # every seed of an arm runs the same hyper-parameters
        hp, sw = res.get("hparams") or {}, res.get("arm_switches") or {}
        if arm in base:
            vals = ", ".join(f"{lr}: {fmt(v, 3)}" for lr, v in base[arm]["values"].items())
            how = f"student lr from {{{vals}}} (val reward per rate)"
        elif sw.get("use_selected") and sw.get("trains", True):
            how = "the search's selected point (m, K, n_ret, student lr)"
        elif not sw.get("trains", True):
            how = "not trained"
        else:
            how = "**not tuned** (train.* defaults)"
        rows.append([arm, how, str(hp.get("lr_student", "—")), str(hp.get("margin", "—")), str(hp.get("K", "—")),
                     str(hp.get("n_ret", "—"))])
    note = f"Search's selected point: {', '.join(f'{k} = {v}' for k, v in point.items())}."
    return note + "\n\n" + md_table(["arm", "tuned on val", "lr used", "m", "K", "n_ret"], rows)
