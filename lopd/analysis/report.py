"""The `report` stage: a short orchestrator over :mod:`lopd.analysis`.

It reads only files the other stages wrote (``runs/``, ``results/``, ``hpo/``, ``data/splits/manifest.json``,
``registration/``, ``confirm/eval/``, ``data/confirm/manifest.json``, ``dvc.yaml``) and writes under ``reports/``:

* ``falsification.md``: the confirmation (registration hash, amended-rule verdict and label, specification
  curve, design, S: :mod:`lopd.analysis.confirm_report`), then the final runs as the pilot: the
  pre-registered rule, premise gate, design check, tests, verdict;
* ``main_table.md`` / ``.tex``, ``comparisons.md`` (exploratory family), ``seed_variance.md``,
  ``margin_dynamics.md``, ``efficiency.md``, ``leakage_audit.md``, ``README.md`` (index);
* ``metrics/**.json``: headline metrics for ``dvc metrics`` (one small file per row);
* ``plots/*.csv``: plot data for ``dvc plots``, and ``figures/*.png`` drawn from those same CSVs;
* ``summary.json``: everything above as numbers (not a DVC metric).

Every output is always written: a missing optional input is named in the file instead. No runs at all
raises :class:`BadInput`. No torch here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from lopd.analysis import audits, confirm_report, dose, dynamics, figures, plotdata, hpo_report, tables, variance
from lopd.analysis.calibration import NULLS, design_rates
from lopd.analysis.confirm_efficiency import confirm_efficiency, render_confirm_efficiency
from lopd.analysis.falsification import Rule, analyse, ci_scope, margin_contrast_tests, render
from lopd.analysis.loading import (MEAN_COL, load_evals, load_not_run, load_premise, load_runs, load_task_table,
                                   values)
from lopd.analysis.render import write_text
from lopd.arms import ARMS
from lopd.errors import BadInput
from lopd.utils import clean_json, write_json

if TYPE_CHECKING:
    from lopd.config import Params


REPORT_DIR = "reports"
OPTIONAL_FILES = ("hpo/trials.csv", "hpo/margin_paths.csv", "hpo/best_params.yaml", "hpo/selection.json", "hpo/baselines.yaml",
                  "results/sensitivity/grid.csv", "dvc.yaml",
                  "data/splits/manifest.json")
INDEX = [("falsification.md", "the registration's hash, the confirmatory verdict and its label, the specification "
                             "curve, the registered design, S; then the pilot (exploratory): the rule, premise gate, "
                             "design check, tests, verdict"),
         ("main_table.md", "test reward per domain and mean, mean ± t 95% CI over seeds (markdown)"),
         ("main_table.tex", "the same table for LaTeX"),
         ("comparisons.md", "lopd vs each arm (exploratory): paired t, t-CI, sign-flip, Holm, paired P(improvement); "
                            "then the margin's contrasts outside that family (report.margin_contrasts: lopd_binding "
                            "against lopd_frozen, lopd_nomargin, lopd_ramp, lopd_fixbeta)"),
         ("seed_variance.md", "seed spread, evaluation-noise share, and the sd and smallest detectable effect of the "
                              "rule's per-seed contrasts"),
         ("margin_dynamics.md", "per-run flags: β unbounded, infeasible margin, Δ never reaching m"),
         ("margin_dose.md", "the margin's dose-response on val: reward against m, one column per η_β, each point's "
                            "constraint status, and lopd_frozen, lopd_nomargin, lopd_fixbeta beside it "
                            "(figures/margin_dose.png)"),
         ("efficiency.md", "rollouts lopd needs to reach GRPO's final validation reward / GRPO's rollouts"),
         ("leakage_audit.md", "which stage depends on / read which split; split SHA-256; content overlap"),
         ("search.md", "every search trial's val reward with its CI, best vs runner-up, ties, boundary, tie rule; "
                       "what each arm was tuned on"),
         ("metrics/", "headline metrics for `dvc metrics show` (one file per row)"),
         ("plots/*.csv", "plot data for `dvc plots` (learning curves, margin dynamics, efficiency, sensitivity)"),
         ("figures/*.png", "the same plots as PNG, drawn from plots/*.csv"),
         ("summary.json", "every headline number (not a DVC metric)")]


PATH_CHECK_BANNER = ("> **PATH CHECK, NOT A RESULT.** `bank.scripted_demos` is set: the experience bank holds the "
                     "environments' scripted demonstrations, not the base policy's successes (a random-weight model "
                     "solves nothing). This run checks that every stage runs; no number here measures the method.\n\n")
PATH_CHECK_FILES = ("README.md", "falsification.md", "main_table.md", "comparisons.md")


def _mark_path_check(out: Path) -> None:
    """Open every headline report file with :data:`PATH_CHECK_BANNER`."""
    for name in PATH_CHECK_FILES:
        f = out / name
        write_text(f, PATH_CHECK_BANNER + f.read_text())


def _missing_inputs(root: Path, runs, evals, not_run: dict[str, str]) -> list[str]:
    missing = [] if evals else ["results/eval/<arm>/seed-<s>/result.json (no test results)"]
    for arm in ARMS:
        if arm in not_run:
            missing.append(f"arm {arm} not run by design: {not_run[arm]}")
            continue
        missing += [f"runs of arm {arm}"] if arm not in runs else []
        missing += [f"evaluation results of arm {arm}"] if evals and arm not in evals else []
    return missing + [p for p in OPTIONAL_FILES if not (root / p).exists()]


def _design_note(params: Params, rule: Rule, fal: dict) -> str:
    """The design the rule is sized for, and the simulated false-claim rates and power of the full rule at the
    design effect, with the upstream draws as the final runs drew them (``train.per_seed_draws``)."""
    d, per_seed = params.report.design, params.train.per_seed_draws

    def pct(p: float) -> str:
        return f"{p:.1%} ± {(p * (1 - p) / d.n_sim) ** 0.5:.1%}"

    rates = design_rates(rule, d, per_seed_draws=per_seed)
    n_used = fal["design"]["n_min"]
    used = ""
    if 2 <= n_used != d.n_seeds:
        at_used = design_rates(rule, d, per_seed_draws=per_seed, n_seeds=n_used)["design"]
        used = f"; with the {n_used} paired seeds of this run: {pct(at_used)}"
    other = design_rates(rule, d, per_seed_draws=not per_seed)
    how = ("each training seed its own bank and cold-start draw (train.per_seed_draws: true, as these runs)" if per_seed
           else "one bank and cold-start draw shared by every seed (train.per_seed_draws: false, as these runs)")
    return (f"Design (report.design): sized for a content effect of {d.effect:g} in mean test reward (treatment − "
            f"every other arm of the rule) with {d.n_seeds} seeds per arm of the rule, training-seed sd {d.seed_sd:g}, "
            f"upstream-draw sd {d.draw_sd:g} for every arm that uses the bank and φ0 (correlation {d.draw_corr:g} "
            f"between two such arms at one draw; none for base), {d.n_tasks} test tasks × {d.samples_per_task} "
            f"samples. Simulated with {how} (lopd.analysis.calibration, {d.n_sim} experiments per figure, ± "
            f"Monte-Carlo s.e.): power of the full rule at that effect {pct(rates['design'])} with {d.n_seeds} "
            f"seeds{'' if rates['design'] >= d.power else f' (under the {d.power:.0%} report.design.power asks)'}"
            f"{used}; false-claim rate (α = {rule.alpha:g}) with no content effect: "
            + ", ".join(f"{n.replace('_', ' ')} {pct(rates[n])}" for n in NULLS)
            + f". With {'one shared draw' if per_seed else 'a draw per seed'} instead: power {pct(other['design'])}, "
            f"false-claim rate least favourable {pct(other['least_favourable'])}.")


@dataclass(frozen=True)
class ReportParts:
    """What the report computed, named: the inputs of ``summary.json`` (:func:`summary`)."""

    main_table: dict  # tables.main_table
    comparisons: dict  # tables.comparisons: lopd against each arm (exploratory)
    falsification: dict  # falsification.analyse: the pilot's rule, tests and verdict
    margin_contrasts: list  # falsification.margin_contrast_tests: report.margin_contrasts' pairs
    rule_variance: dict  # variance.rule_variance: each rule test's per-seed sd and smallest detectable effect
    pilot_design: dict  # variance.pilot_design: the design the pilot's variance implies
    efficiency: dict  # dynamics.efficiency (the pilot's runs)
    confirm_efficiency: dict | None  # confirm_efficiency on the confirmatory split; None: no registration
    margin_dynamics: dict  # dynamics.margin_dynamics
    leakage: dict  # audits.leakage
    premise: dict  # the probe stage's premise gate
    runs: dict  # arm -> seed -> run record
    evals: dict  # arm -> seed -> evaluation record
    missing: list  # optional inputs that were absent
    extra: dict = field(default_factory=dict)  # further top-level entries, verbatim


def summary(p: ReportParts) -> dict:
    """``summary.json``: the headline numbers of every report file, as plain JSON."""
    mt, fal, pw, eff, ceff = p.main_table, p.falsification, p.rule_variance, p.efficiency, p.confirm_efficiency
    return clean_json({
        "test_reward": {a: mt["cells"][a][MEAN_COL]["mean"] for a in mt["arms"] if MEAN_COL in mt["cells"][a]},
        "test_ci_half": {a: mt["cells"][a][MEAN_COL]["ci_half"] for a in mt["arms"] if MEAN_COL in mt["cells"][a]},
        "n_seeds_by_arm": {a: len(p.evals[a]) for a in mt["arms"]},
        "premise": p.premise["status"],
        "falsification": {**fal["verdict"], "design_can_reject": fal["design"]["can_reject"],
                          "n_min": fal["design"]["n_min"],
                          "tests": {r["name"]: {k: r.get(k) for k in ("n", "diff", "t", "p", "lower", "p_exact",
                                                                       "reject", "robust")} for r in fal["tests"]},
                          "contrast_sd": {t["name"]: t.get("sd") for t in pw["tests"]},
                          "mdd": {t["name"]: t.get("mdd") for t in pw["tests"]},
                          "pilot_design": p.pilot_design,
                          "margin_contrasts": {f"{r['a']} - {r['b']}": {k: r.get(k) for k in ("n", "diff", "ci95", "p",
                                                                                              "p_exact", "not_run")}
                                               for r in p.margin_contrasts}},
        "lopd_vs": {r["arm"]: {"n": r["n"], "diff": r["diff"], "ci95": list(r["ci95"]), "p": r["p"],
                               "p_holm": r["p_holm"], "p_exact": r["p_exact"], "p_improve": r["p_improve"]}
                    for r in p.comparisons["rows"]},
        "bold_columns": {t["col"]: t["best"] for t in mt["tests"] if t["bold"]},
        "efficiency_ratio": eff.get("ratio") if eff.get("x", 0) and eff.get("x", 0) > 0 else None,
        "efficiency_ci": list(eff.get("ci", (None, None))),
        "efficiency_ratio_with_bank": eff.get("ratio_with_bank"),
        "efficiency_confirm": ({k: ceff.get(k) for k in ("ratio", "ci", "ratio_with_bank", "ci_with_bank", "target",
                                                         "grpo_total", "x", "reached", "n_lopd", "n_grpo")}
                               if ceff and not ceff.get("missing") else None),
        "infeasible_runs": sum(bool(r["result"].get("infeasible_margin")) for a in p.runs.values() for r in a.values()),
        "margin_flagged_runs": sum(1 for r in p.margin_dynamics["rows"] if r["active"] and r["flags"]),
        "leakage_clean": bool(p.leakage["clean"]), "leakage_violations": len(p.leakage["violations"]),
        "missing_inputs": p.missing, **p.extra})


def pilot_section(md: str) -> str:
    """The final runs' falsification analysis as the pilot: one heading level down, under its own title."""
    lines = md.split("\n")
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    body = ["#" + x if x.startswith("#") else x for x in lines]
    return "\n".join(["# Pilot (exploratory)", "",
                      "The final runs below, on the pilot's test split, are exploratory: the search chose their point, "
                      "and earlier versions of this pipeline read that test split at other points. They size the "
                      "confirmation's design (registration.json); the verdict above is the confirmatory one.", *body])


def build_report(params: Params, root: Path = Path("."), registration: dict | None = None,
                 ledger: str | None = None) -> dict:
    """Write every report file under ``root/reports/`` and return the summary (also ``summary.json``).
    ``registration``: ``registration/registration.json`` as the report stage loaded and checked it
    (:func:`lopd.confirmation.registration.load`); None: no confirmatory verdict. ``ledger``: its read in the
    ledger, in words (:func:`lopd.confirmation.ledger.entry_line`); None: not recorded."""
    root = Path(root)
    out, rp = root / REPORT_DIR, params.report
    runs = load_runs(root)
    if not runs:
        raise BadInput(f"no training runs found under {root / 'runs'}/<arm>/seed-<s>/result.json: run the train stage "
                       "first")
    evals = load_evals(root)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    not_run = load_not_run(root)
    missing = _missing_inputs(root, runs, evals, not_run)
    rule, premise = Rule.from_params(rp), load_premise(root)
    table, task_problems = load_task_table(evals)

    mt = tables.main_table(params, evals)
    tables.write_main_table(out, params, evals, mt)
    pair_arms = sorted({a for pair in rp.margin_contrasts for a in pair})
    margin_contrasts = margin_contrast_tests(rp.margin_contrasts, {a: values(evals, a) for a in pair_arms}, not_run)
    cmp = tables.comparisons(params, evals, rule.treatment)
    tables.write_comparisons(out, params, cmp, margin_contrasts)
    fal = analyse(rule, {a: values(evals, a) for a in rule.arms()})
    conf = confirm_report.confirmation(rule, root, registration, ledger)
    head = confirm_report.render_confirmation(conf, confirm_report.spec_curve_png(out, conf))
    pilot = render(rule, fal, premise, _design_note(params, rule, fal), ci_scope(params.train.per_seed_draws),
                   margin_contrasts)
    write_text(out / "falsification.md", "\n".join(head) + "\n" + pilot_section(pilot))
    metric_rows = tables.write_metrics(out, mt, fal, premise)
    search = hpo_report.load_search(root)
    write_text(out / "search.md", hpo_report.render_search(search, runs))
    if search is not None:
        write_json(out / "metrics" / "search" / "selected.json", hpo_report.search_metrics(search))
        metric_rows.append("search/selected")

    plot_rows = plotdata.write_plot_data(out, root, runs)
    mdyn = dynamics.margin_dynamics(runs)
    write_text(out / "margin_dynamics.md", dynamics.render_margin_dynamics(mdyn))
    bank_rollouts = params.envs.n_train * len(params.envs.domains) * params.bank.rollouts_per_task
    eff = dynamics.efficiency(runs, rp.n_boot, min_bootstrap_seeds=rp.min_bootstrap_seeds, bank_rollouts=bank_rollouts)
    ceff = confirm_efficiency(root, registration, rp.n_boot, min_bootstrap_seeds=rp.min_bootstrap_seeds)
    write_text(out / "efficiency.md", dynamics.render_efficiency(eff, rp.n_boot,
                                                                 confirm=render_confirm_efficiency(ceff, rp.n_boot)))
    figures.margin_dynamics_png(out, mdyn["m"])
    figures.efficiency_png(out, eff)
    figures.learning_curves_png(out)
    selected = plotdata.selected_point(root)
    figures.sensitivity_png(out, selected)
    dose_info = dose.dose_response(plotdata.read_plot_csv(out, "margin_dose"))
    write_text(out / "margin_dose.md", dose.render_dose_response(dose_info, selected))
    figures.margin_dose_png(out, dose_info)

    pw = variance.rule_variance(fal, rp.alpha, rp.design.power)
    pilot_design = variance.pilot_design(fal, rp.design.effect, rp.alpha, rp.design.power, rp.design.n_seeds,
                                         rp.design.pilot_upper)
    variance.write_seed_variance(out, variance.seed_variance(evals, table), pw, rp.alpha, rp.design.power, pilot_design)
    lk = audits.leakage(root, runs, [rule.treatment, *rule.content_controls])
    audits.write_leakage(out, lk)

    readme = ["# Report index", ""] + [f"- `{p}`: {d}" for p, d in INDEX]
    if missing:
        readme += ["", "## Missing inputs", ""] + [f"- {m}" for m in missing]
    if task_problems:
        readme += ["", "## Per-task rewards not used (evaluation noise)", ""]
        readme += [f"- {p}" for p in task_problems]
    readme += ["", "Plot data rows: " + ", ".join(f"{k} {v}" for k, v in plot_rows.items()) + "."]
    write_text(out / "README.md", "\n".join(readme))
    extra = {"metrics_rows": metric_rows, "plot_rows": plot_rows, "confirmation": confirm_report.summary(conf),
             "margin_dose": {"lines": {f"{e:g}": {f"{m:g}": c for m, c in by_m.items()}
                                       for e, by_m in dose_info["lines"].items()},
                             "references": dose_info["references"]}}
    if params.bank.scripted_demos:  # the default report is unchanged
        _mark_path_check(out)
        extra["path_check"] = True
    parts = ReportParts(main_table=mt, comparisons=cmp, falsification=fal, margin_contrasts=margin_contrasts,
                        rule_variance=pw, pilot_design=pilot_design, efficiency=eff, confirm_efficiency=ceff,
                        margin_dynamics=mdyn, leakage=lk, premise=premise, runs=runs, evals=evals, missing=missing,
                        extra=extra)
    result = json.loads(json.dumps(summary(parts)))
    write_json(out / "summary.json", result)
    return result
