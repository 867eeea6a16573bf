"""The confirmation in the report: ``registration.json`` and ``confirm/eval/``, read back; the amended rule
(:mod:`lopd.analysis.confirmation`), the specification curve (table and figure) and the registered design.
These open ``falsification.md``; the final runs' analysis follows as the pilot (exploratory)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lopd.analysis.confirmation import LABEL_TEXT, analyse_amended, spec_curve_rows
from lopd.analysis.falsification import CLAIM_SENTENCE, NO_CLAIM_SENTENCE, Rule
from lopd.analysis.render import fmt, fmt_p, md_table
from lopd.errors import BadInput
from lopd.utils import read_json

EVAL_DIR = Path("confirm") / "eval"

INFERENCE_SCOPE = ("The unit is the training seed: each p-value is a paired test over seeds (the t-test, and the exact "
                   "sign-flip test that assumes no normality: every sign pattern of the per-seed contrasts, or a "
                   "Monte-Carlo sample of them), so inference is conditional on the confirmatory split's tasks and "
                   "the worlds they come from; another draw of tasks could move every estimate.")


def load_confirmation(root: Path, reg: dict) -> tuple[dict, list[str]]:
    """(``by_point[point][arm][seed]`` = mean confirmatory test reward, the shared arms under every point;
    problems: results evaluated under another registration than ``reg``, which are not used)."""
    problems, shared, by_point = [], {}, {p["name"]: {} for p in reg["points"]}
    for f in sorted((root / EVAL_DIR).glob("*/*/seed-*/result.json")):
        r = json.loads(f.read_text())
        if r.get("registration") != reg["sha256"]:
            problems.append(f"{f.relative_to(root)} was evaluated under another registration: not used")
            continue
        if not np.isfinite(r.get("test_reward", np.nan)):
            raise BadInput(f"{f}: no finite test_reward")
        dest = shared if r["point"] == "shared" else by_point.setdefault(r["point"], {})
        dest.setdefault(r["arm"], {})[int(r["seed"])] = float(r["test_reward"])
    for p in by_point.values():
        p.update(shared)
    for point, arms in (reg.get("shared_runs") or {}).items():  # trained once, at an earlier point: counts at both
        for arm, src in arms.items():
            if arm in by_point.get(src, {}):
                by_point.setdefault(point, {})[arm] = by_point[src][arm]
    return by_point, problems


def confirmation(rule: Rule, root: Path, reg: dict | None, ledger: str | None = None) -> dict | None:
    """Everything the report shows of the confirmation under registration ``reg`` (already loaded and
    checked by the report stage), or None when there is none. The registered rule decides; ``rule`` (the
    params' one) is only compared with it."""
    if reg is None:
        return None
    by_point, problems = load_confirmation(root, reg)
    # the rule as registered decides, whatever params.yaml says now; a difference is named
    r = reg["rule"]
    registered = Rule(r["text"], r["treatment"], tuple(r["gain_over"]), tuple(r["content_controls"]), r["rho"],
                      r["rho_baseline"], r["alpha"])
    if registered != rule:
        problems.append("report.rule in params.yaml differs from the registered rule: the registered rule decides")
    rule = registered
    out = {"registration": reg, "problems": problems, "by_point": by_point, "ledger": ledger}
    if not any(by_point.values()):
        out["why"] = "no confirmatory evaluation results under confirm/eval/ (run confirm_evaluate)"
        return out
    am = analyse_amended(rule, by_point)
    out["amended"] = am
    mech = reg.get("mechanism") or {}
    if "point" in mech:
        from lopd.analysis.confirmation import mechanism_rule
        from lopd.analysis.falsification import analyse

        out["mechanism"] = analyse(mechanism_rule(mech), by_point.get(mech["point"], {}))
    out["spec_curve"] = spec_curve_rows(am, reg["points"])
    return out


def _ci(t: dict) -> str:
    lo, hi = t.get("ci95") or (None, None)
    return "—" if lo is None else f"[{lo:+.3f}, {hi:+.3f}]"


def render_confirmation(conf: dict | None, spec_png: str | None) -> list[str]:
    """The lines that open ``falsification.md``: registration hash, primary verdict and label, specification
    curve, design, S."""
    if conf is None:
        return ["# Falsification test", "", "**No registration** (registration/registration.json is absent): there is "
                "no confirmatory verdict; the pilot below is exploratory.", ""]
    reg = conf["registration"]
    md = ["# Falsification test", "", f"Registration: sha256 `{reg['sha256']}` (`registration/registration.json`, "
          "written by stage `register` from the search's val outputs and the pilot's results; `confirm_evaluate`, the "
          "only stage that reads the confirmatory split, refuses to run without it and checks every run was trained "
          "under this hash).", ""]
    led = conf.get("ledger")
    md += [f"Ledger: {led}." if led else "Ledger: **this registration is not in `registration/ledger.yaml`**: append "
           "its entry (the fields its header names) in the commit that commits this verdict, then `dvc repro` again "
           "(register and report read the ledger).", ""]
    md += [f"- {p}" for p in conf["problems"]] + ([""] if conf["problems"] else [])
    if "why" in conf:
        return md + [f"**No confirmatory verdict: {conf['why']}.**", ""]
    am, pts = conf["amended"], reg["points"]
    v = am["primary"]["verdict"]
    n = len(am["seeds"])
    md += ["## Confirmatory verdict", "",
           f"**{CLAIM_SENTENCE if v['claim'] else NO_CLAIM_SENTENCE}** on the average over S ({len(pts)} point(s), "
           f"{n} fresh seeds, the confirmatory split). Label: **{am['label']}** ({LABEL_TEXT[am['label']]}).", "",
           f"Primary ({reg['rule']['primary']}): part (i) {'holds' if v['gain'] else 'fails'}, part (ii) "
           f"{'holds' if v['content'] else 'fails'}. The rule holds at "
           f"{sum(am['points'][p['name']]['verdict']['claim'] for p in pts)} of {len(pts)} points.", ""]
    if am["missing"]:
        md += ["**Missing runs** (their seeds are left out at every point, so the contrasts stay paired): "
               + "; ".join(am["missing"]) + ".", ""]
    md += [md_table(["test (average over S)", "n", "estimate", "95% CI", "one-sided p (t)", "one-sided p (sign flip)",
                     "rejects at α"],
                    _test_rows(am["primary"]["tests"])), "", INFERENCE_SCOPE, ""]
    if reg.get("mechanism"):
        md += ["## H2: the paper's mechanism (registered)", "", *mechanism_lines(reg["mechanism"], conf.get("mechanism"))]
    md += ["## Specification curve", "",
           "Every contrast of the rule at every point of S, in val-rank order, each with its point's margin status on "
           "val (the search's runs at that point), then the average over S (the primary). Estimates are mean "
           "per-seed contrasts, 95% t-intervals over the seeds.", ""]
    if spec_png:
        md += [f"![specification curve]({spec_png})", ""]
    md += [md_table(["point", "trial", "role", "margin on val", "test", "n", "estimate", "95% CI", "one-sided p (t)",
                     "p (sign flip)", "rejects"],
                    [[r["point"], "—" if r["trial"] is None else str(r["trial"]), r["role"] or "",
                      ", ".join(r["margin_status"] or []) or "—", r["test"], str(r["n"]),
                      f"{r['diff']:+.4f}" if r.get("diff") is not None else "n/a", _ci(r),
                      fmt_p(r["p"]) if r.get("p") is not None else "n/a",
                      fmt_p(r["p_exact"]) if r.get("p_exact") is not None else "n/a", "yes" if r["reject"] else "no"]
                     for r in conf["spec_curve"]]), ""]
    md += design_lines(reg)
    md += ["## S: the points the search cannot tell apart", "",
           md_table(["point", "trial", "role", "val reward", "val seeds", "m", "K", "n_ret", "lr", "η_β", "lopd_frozen lr",
                     "margin on val", "max Δ(φ) on val"],
                    [[p["name"], str(p["trial"]), p["role"], fmt(p["val_value"], 4), str(p["val_seeds"]), f"{p['margin']:g}",
                      str(p["K"]), str(p["n_ret"]), f"{p['lr_student']:g}",
                      f"{p['eta_beta']:g}" if "eta_beta" in p else "—", f"{p['lr_frozen']:g}",
                      ", ".join(p["margin_status"] or []) or "—",
                      "—" if p.get("max_delta") is None else fmt(p["max_delta"], 4)] for p in pts]), ""]
    md += [f"- {x}" for x in reg.get("notes", [])] + ([""] if reg.get("notes") else [])
    md += shared_run_lines(reg)
    return md


def shared_run_lines(reg: dict) -> list[str]:
    """Which runs count at two points of S (``registration.json``'s ``shared_runs``), and why that is exact."""
    pairs = [(pt, arm, src) for pt, arms in (reg.get("shared_runs") or {}).items() for arm, src in arms.items()]
    if not pairs:
        return ["No run is shared between points: every (arm, point) reads a coordinate that differs.", ""]
    return ["**Runs trained once and counted at two points** (no run trained twice: the arm reads nothing that differs "
            "between the points, e.g. no m or η_β without a margin, so the two runs would be the same bits): "
            + "; ".join(f"{arm} at {pt} is {src}'s run" for pt, arm, src in pairs) + ".", ""]


def _test_rows(tests: list[dict]) -> list[list[str]]:
    return [[t["name"], str(t["n"]), f"{t['diff']:+.4f}" if t.get("diff") is not None else "n/a", _ci(t),
             fmt_p(t["p"]) if t.get("p") is not None else "n/a",
             fmt_p(t["p_exact"]) if t.get("p_exact") is not None else "n/a", "yes" if t["reject"] else "no"]
            for t in tests]


def mechanism_lines(mech: dict, result: dict | None) -> list[str]:
    """H2's verdict (the paper's mechanism at the binding point), its tests and registered power; or why H2 is not
    registered. A registered negative is stated as a finding."""
    if not mech:
        return []
    if "point" not in mech:
        return [f"**H2 (the paper's mechanism) not registered:** {mech['why']}.", ""]
    d = mech.get("design") or {}
    power = (f"registered power {fmt(d['power'], 2)} at effect {d['effect']:g} with {d['n_seeds']} seeds (pilot "
             f"covariance at its {d.get('upper', 0.8):.0%} upper bound)" if "power" in d else
             f"no registered power ({d.get('why', 'no design')})")
    head = f"H2, the paper's mechanism, at {mech['point']} (trial {mech['trial']}, the binding point): lopd beats " \
           + " and ".join(mech["controls"])
    if result is None or not result.get("tests"):
        return [f"**{head}: no verdict** (no confirmatory results at {mech['point']}); {power}.", ""]
    holds = result["verdict"]["claim"]
    verdict = "**holds**" if holds else "**does not hold: a registered negative, a finding about the mechanism**"
    return [f"{head}: {verdict} ({sum(t['reject'] for t in result['tests'])} of {len(result['tests'])} tests reject "
            f"at α = {mech['alpha']:g}; {power}).", "",
            md_table(["test (H2, at its point)", "n", "estimate", "95% CI", "one-sided p (t)", "one-sided p (sign flip)",
                      "rejects at α"], _test_rows(result["tests"])), ""]


def design_lines(reg: dict) -> list[str]:
    d = reg["design"]
    md = ["## Design (registered)", ""]
    if "why" in d:
        return md + [f"Not computed: {d['why']}.", ""]

    def need(x):
        return f"more than {d.get('max_n', 200)}" if x is None else str(x)

    md += [f"From the pilot's per-seed contrasts of the rule ({d['pilot_n']} seeds), covariance inflated to its "
           f"{d['upper']:.0%} upper bound (variances × {d['factor']:.2f}), every contrast at the registered smallest "
           f"effect {d['effect']:g}, one-sided t at α = {d['alpha']}, {d['n_sim']} simulated experiments each:", "",
           md_table(["", f"with {d['n_seeds']} seeds", f"seeds for {d['power_target']:.0%} power"],
                    [["power of the primary (average over S; points taken as perfectly correlated)",
                      fmt(d["power_primary"], 2), need(d["seeds_needed_primary"])],
                     [f"power of the robust label ({d['n_points']} point(s) taken as independent)",
                      fmt(d["power_robust"], 2), need(d["seeds_needed_robust"])]]), "",
           *false_claim_lines(d), "", procedure_power_line(d), ""]
    if d["power_primary"] < d["power_target"]:
        md += [f"**Under-powered by its own registered design: {d['n_seeds']} seeds give power "
               f"{d['power_primary']:.2f} for the primary at effect {d['effect']:g}, not {d['power_target']:.0%}. A "
               "no-claim verdict would be weak evidence of no effect; a claim keeps its level α, but a test this weak "
               "rejects mostly where noise adds to the effect, so its estimates may overstate it.**", ""]
    elif d["power_robust"] < d["power_target"]:
        md += [f"**The primary is powered ({d['power_primary']:.2f}), the robust label is not: {d['n_seeds']} seeds give "
               f"it power {d['power_robust']:.2f} at effect {d['effect']:g} (points taken as independent, a lower "
               f"bound). A point-dependent label is weak evidence against robustness.**", ""]
    else:
        md += [f"Powered by its own registered design: {d['n_seeds']} seeds give the primary power "
               f"{d['power_primary']:.2f} and the robust label at least {d['power_robust']:.2f} at effect "
               f"{d['effect']:g}, against the {d['power_target']:.0%} asked.", ""]
    md += [md_table(["test", "pilot sd (per seed)", f"sd at its {d['upper']:.0%} upper bound"],
                    [[t, fmt(s, 4), fmt(u, 4)] for t, s, u in zip(d["tests"], d["sd"], d["sd_upper"])]), ""]
    return md


IU_THEORY = ("Theory: each one-sided t-test has size α on normal contrasts, so an intersection–union rule's "
             "false-claim rate is at most α at every null; the simulation checks it under binary rewards, shared "
             "tasks, draws and base.")
CLAIM_NAMES = {"primary": "the primary", "robust": "the robust label"}


def rate_cell(r: dict) -> str:
    """A simulated rate: share, k/n and its Clopper–Pearson 95% interval (bounds to 3 decimals, 4 where one
    lies within 0.01 of 0 or 1, so a small interval does not read [0.000, 0.000])."""
    nd = 3 if all(0.01 <= x <= 0.99 for x in (r["ci_low"], r["ci_high"])) else 4
    return f"{r['rate']:.4f} ({r['k']}/{r['n']}; 95% CI [{r['ci_low']:.{nd}f}, {r['ci_high']:.{nd}f}])"


def _scenario(r: dict) -> str:
    return r["scenario"] if r["test_at_0"] is None else f"{r['scenario']}: {r['test_at_0']} at 0"


def false_claim_lines(d: dict) -> list[str]:
    """The procedure's false-claim rates (``false_claim``, :func:`lopd.analysis.procedure.procedure_rates`): what
    was simulated, one row per scenario with the primary's and the robust label's rate (k/n, Clopper–Pearson 95%
    interval), whether each interval reaches α or below (ci_low ≤ α), the others' rejection share at a boundary;
    then every rate whose interval lies wholly above α, flagged with what follows, or that none does; then the
    intersection–union theory in one sentence."""
    alpha, pr = d["alpha"], d["procedure"]
    m = pr["model"]
    rows: dict[str, dict] = {}
    for r in d["false_claim"]:
        rows.setdefault(_scenario(r), {})[r["claim"]] = r

    def others(cells: dict) -> str:
        shares = [cells[c]["others_reject"] for c in CLAIM_NAMES if c in cells]
        return "—" if shares[0] is None else ", ".join(f"{x:.4f}" for x in shares)

    table = [[name, others(cells), *(rate_cell(cells[c]) for c in CLAIM_NAMES),
              ", ".join("yes" if cells[c]["ci_low"] <= alpha else "**no**" for c in CLAIM_NAMES)]
             for name, cells in rows.items()]
    out = [f"False-claim rate of the procedure as registered (the primary: the rule on per-seed values averaged over "
           f"S's {pr['n_points']} point(s); the label robust to selection: the primary and the rule at every point; "
           f"{pr['n_seeds']} seeds, one-sided t at α = {alpha}), simulated under the project's model "
           f"(report.design): binary rewards, {m['n_tasks']} test tasks × {m['samples_per_task']} samples with "
           f"common random numbers across arms and points, task success probabilities U({m['task_reward_low']:g}, "
           f"{m['task_reward_high']:g}) shared by every arm and seed, a training-seed effect of sd {m['seed_sd']:g} "
           f"per run, a bank and φ0 draw per seed (sd {m['draw_sd']:g}, correlation {m['draw_corr']:g} between the "
           f"arms using it) shared by the points, one base run shared by every point; {pr['n_exp']} experiments per "
           f"scenario. At a boundary one contrast is at 0 and every other at {pr['far']:g} in mean reward; 'others "
           "reject' is the share of experiments in which every other test rejected (on the average; on the average "
           "and at every point).", "",
           md_table(["scenario", "others reject (primary, robust)", "false-claim rate of the primary",
                     "false-claim rate of the robust label", "≤ α within its interval (primary, robust)"], table), ""]
    above = [r for r in d["false_claim"] if r["ci_low"] > alpha]
    if not above:
        out.append(f"Every rate is ≤ α = {alpha} within its Clopper–Pearson interval: under this model the procedure "
                   "keeps its level at every null simulated, the primary and the robust label alike.")
    for r in above:
        out.append(f"**{CLAIM_NAMES[r['claim']].capitalize()} at the {_scenario(r)}: {rate_cell(r)}, its interval "
                   f"wholly above α = {alpha}: under this model it is not level-α there, so its claim carries a "
                   f"false-claim risk near {r['rate']:.3f}, not α (a rate exactly at α misses its interval with "
                   "probability 2.5%, so across many rows one such flag can be chance: rerun with more experiments "
                   "before relying on it).**")
    for name, cells in rows.items():
        shares = {c: cells[c]["others_reject"] for c in CLAIM_NAMES if c in cells}
        if any(x is not None and x < 0.999 for x in shares.values()):
            out.append(f"At the {name}, every other test rejected in only "
                       + " and ".join(f"{x:.4f} ({c})" for c, x in shares.items())
                       + f" of experiments: {pr['far']:g} is not far enough at this design, so the rates there may "
                       "understate the least favourable ones.")
    return out + ["", IU_THEORY]


def procedure_power_line(d: dict) -> str:
    """The procedure's power at the registered effect under the simulation model (``procedure_power``)."""
    p = {r["claim"]: r for r in d["procedure_power"]}
    return (f"The procedure's power under the same simulation model, every contrast at {d['effect']:g}, "
            f"{d['n_seeds']} seeds, {d['n_points']} point(s): {rate_cell(p['primary'])} for the primary, "
            f"{rate_cell(p['robust'])} for the robust label (the sizing above uses the pilot's contrasts instead).")


def spec_curve_png(out: Path, conf: dict | None) -> str | None:
    """``figures/spec_curve.png``: each rule contrast ± 95% CI at each point of S and the average; None if
    there is nothing to draw."""
    from matplotlib.figure import Figure

    from lopd.analysis.figures import save_fig

    rows = [r for r in (conf or {}).get("spec_curve", []) if r.get("diff") is not None]
    if not rows:
        return None
    tests = list(dict.fromkeys(r["test"] for r in rows))
    points = list(dict.fromkeys(r["point"] for r in rows))
    fig = Figure(figsize=(1.6 + 1.3 * len(tests) * len(points) / 2, 3.6))
    ax = fig.add_subplot(111)
    x, labels = 0, []
    for ti, t in enumerate(tests):
        for pi, p in enumerate(points):
            r = next((r for r in rows if r["test"] == t and r["point"] == p), None)
            if r is None:
                continue
            lo, hi = r["ci95"]
            color = "#1f77b4" if p != "average over S" else "#d62728"
            ax.errorbar([x], [r["diff"]], yerr=[[r["diff"] - lo], [hi - r["diff"]]], fmt="o", color=color, capsize=3)
            labels.append((x, f"{p}" if pi else f"{t}\n{p}"))
            x += 1
        x += 0.6
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks([a for a, _ in labels])
    ax.set_xticklabels([b for _, b in labels], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("per-seed contrast (confirmatory test reward)")
    ax.set_title("Specification curve: the rule's contrasts at every point of S (95% CI)")
    save_fig(fig, out / "figures" / "spec_curve.png")
    return "figures/spec_curve.png"


def summary(conf: dict | None) -> dict | None:
    """The confirmation's headline numbers for ``summary.json``."""
    if conf is None:
        return None
    reg = conf["registration"]
    out = {"registration_sha256": reg["sha256"], "points": [{k: p[k] for k in ("name", "trial", "role", "margin", "K",
                                                                              "n_ret", "lr_student", "eta_beta") if k in p}
                                                            for p in reg["points"]],
           "seeds": reg["seeds"], "effect": reg["effect"], "design": reg["design"], "problems": conf["problems"]}
    if "amended" in conf:
        am = conf["amended"]
        out.update(label=am["label"], claim=am["primary"]["verdict"]["claim"], every=am["every"], some=am["some"],
                   n_seeds=len(am["seeds"]),
                   primary={t["name"]: {"diff": t.get("diff"), "ci95": t.get("ci95"), "p": t.get("p"),
                                        "reject": t["reject"]} for t in am["primary"]["tests"]},
                   points={p: {"claim": a["verdict"]["claim"],
                               "tests": {t["name"]: {"diff": t.get("diff"), "ci95": t.get("ci95"), "p": t.get("p"),
                                                     "reject": t["reject"]} for t in a["tests"]}}
                           for p, a in am["points"].items()})
    else:
        out["why"] = conf.get("why")
    return out


def confirm_split_audit(root: Path, content: dict, violations: list[str]) -> dict | None:
    """The confirmatory split's manifest: its prompt overlap with each sealed split (recomputed from the content
    keys; must be 0) and its own audit (solutions excluded; the pilot test's solution twins of train)."""
    path = root / "data" / "confirm" / "manifest.json"
    if not path.exists():
        return None
    m = read_json(path) or {}
    keys = set((m.get("file") or {}).get("content") or [])
    overlap = {s: len(keys & set(v)) for s, v in content.items() if isinstance(v, list)}
    for s, n in overlap.items():
        if n:
            violations.append(f"the confirmatory split shares {n} tasks with {s} by content (same prompt)")
    return {"n": (m.get("file") or {}).get("n"), "sha256": (m.get("file") or {}).get("sha256"), "overlap": overlap,
            "audit": m.get("audit") or {}}


def confirm_split_lines(cf: dict | None) -> list[str]:
    """The leakage audit's section on the confirmatory split."""
    md: list[str] = []
    md += ["", "## The confirmatory split (data/confirm/manifest.json)", ""]
    if cf is None:
        md.append("Not written (no confirm_split stage output).")
    else:
        a = cf["audit"]
        md += [f"{cf['n']} tasks, SHA-256 `{cf['sha256']}`. Drawn from its own candidate stream, excluding every task "
               "whose prompt or scripted solution equals a train, val or test task's (lopd.confirmation.split). Prompt "
               "overlap, recomputed from the content keys: " + ", ".join(f"{s} {n}" for s, n in cf["overlap"].items())
               + f". The pilot's test split has {a.get('pilot_test_solution_twins', '?')} of {a.get('pilot_test_n', '?')} "
               "tasks whose solution equals a train task's (a different prompt, the same actions): the leak by "
               "solution this split closes."]
    return md
