"""The pre-registered two-part falsification rule (``params.yaml`` → ``report.rule``).

(i) *LOPD has a gain*: the treatment beats every arm in ``gain_over``; (ii) *content drives it*: the
treatment beats every arm in ``content_controls``. Every test is one-sided at α on per-seed values (the
training seed is the unit): a paired t-test decides (primary), the exact sign-flip test is reported as a
robustness check. A part holds iff all its tests reject: an intersection–union test, whose level is α
without any multiplicity correction across its members; the claim needs both parts, so its level is α too.
With ``rho`` set, a content test asks (T − C) > ρ·(T − B) instead of T > C, i.e. its per-seed contrast is
(1 − ρ)·T − C + ρ·B.

:func:`decide` evaluates the rule on aligned arrays with any leading batch axes (many simulated experiments
at once, see :mod:`lopd.analysis.calibration`); :func:`analyse` evaluates it on the report's per-seed
values (each test on the seeds its arms share) with CIs; :func:`render` writes ``falsification.md``: the
rule first, then every test's statistic, p and CI, then the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from lopd.analysis import stats as st
from lopd.analysis.render import CONDITIONAL, fmt, fmt_p, md_table

CLAIM_SENTENCE = "Retrieved content drives a gain"
NO_CLAIM_SENTENCE = "No claim that retrieved content drives a gain"
DESIGN_OK = "the verdict is not determined by the design"
DESIGN_FLAG = "DESIGN-DETERMINED"
PARTS = {"gain": "(i) LOPD has a gain", "content": "(ii) content drives it"}


@dataclass(frozen=True)
class TestSpec:
    """One one-sided test of the rule: H1 is E[Σ_a weights[a]·value_a] > 0 over seeds."""

    name: str
    part: str  # "gain" or "content"
    comparator: str
    weights: dict[str, float]


@dataclass(frozen=True)
class Rule:
    text: str
    treatment: str
    gain_over: tuple[str, ...]
    content_controls: tuple[str, ...]
    rho: float | None
    rho_baseline: str
    alpha: float

    @classmethod
    def from_params(cls, report) -> "Rule":
        r = report.rule
        return cls(r.text, r.treatment, tuple(r.gain_over), tuple(r.content_controls), r.rho, r.rho_baseline,
                   report.alpha)

    def tests(self) -> list[TestSpec]:
        t = self.treatment
        out = [TestSpec(f"{t} > {x}", "gain", x, {t: 1.0, x: -1.0}) for x in self.gain_over]
        for c in self.content_controls:
            if self.rho is None:
                out.append(TestSpec(f"{t} > {c}", "content", c, {t: 1.0, c: -1.0}))
            else:
                b, r = self.rho_baseline, self.rho
                out.append(TestSpec(f"{t} − {c} > {r:g}·({t} − {b})", "content", c,
                                    {t: 1.0 - r, c: -1.0, b: r}))
        return out

    def arms(self) -> list[str]:
        return list(dict.fromkeys(a for s in self.tests() for a in s.weights))


def _contrast(values: Mapping[str, np.ndarray], spec: TestSpec) -> np.ndarray:
    return sum(w * np.asarray(values[a], dtype=float) for a, w in spec.weights.items())


def _combine(rule: Rule, reject: dict[str, np.ndarray], robust: dict[str, np.ndarray]) -> dict:
    specs = rule.tests()
    out = {}
    for part in PARTS:
        names = [s.name for s in specs if s.part == part]
        out[part] = np.logical_and.reduce([reject[n] for n in names])
        out[f"{part}_robust"] = np.logical_and.reduce([robust[n] for n in names])
    out["claim"] = out["gain"] & out["content"]
    out["claim_robust"] = out["gain_robust"] & out["content_robust"]
    return out


def decide(values: Mapping[str, np.ndarray], rule: Rule, *, sign_flip: bool = True) -> dict:
    """The verdict on aligned per-seed values ``values[arm]`` of shape (..., n_seeds).

    Returns boolean arrays over the leading axes: ``reject``/``robust`` per test name (t-test p < α,
    sign-flip p < α), ``gain``, ``content``, ``claim`` (decided by the t-tests) and their ``*_robust``
    counterparts (decided by the sign-flip tests). ``sign_flip=False`` skips the sign-flip tests (their
    Monte-Carlo p costs 10⁵ sign vectors per row above 20 seeds): every ``robust`` entry is then False."""
    reject, robust = {}, {}
    for spec in rule.tests():
        c = _contrast(values, spec)
        reject[spec.name] = np.nan_to_num(np.asarray(st.t_test(c, alternative="greater")["p"]), nan=1.0) < rule.alpha
        robust[spec.name] = (np.asarray(st.sign_flip_p(c, alternative="greater")) < rule.alpha if sign_flip
                             else np.zeros(np.shape(reject[spec.name]), dtype=bool))
    return {"reject": reject, "robust": robust, **_combine(rule, reject, robust)}


def analyse(rule: Rule, by_seed: Mapping[str, Mapping[int, float]]) -> dict:
    """The rule on the report's data: ``by_seed[arm][seed]`` = mean test reward. Each test uses the seeds
    shared by its arms.

    Returns ``tests`` (one dict per test: n, diff, t, df, p, lower (one-sided 1−α bound), ci95 (two-sided
    t), p_exact, reject, robust, missing), ``verdict`` (:func:`_combine` as plain bools) and
    ``design`` (the smallest n and whether the exact test can reject with it)."""
    rows = []
    for spec in rule.tests():
        missing = [a for a in spec.weights if not by_seed.get(a)]
        seeds = sorted(set.intersection(*(set(by_seed.get(a, {})) for a in spec.weights)))
        row = {"spec": spec, "name": spec.name, "part": spec.part, "n": len(seeds), "missing": missing,
               "reject": False, "robust": False}
        if seeds:
            c = _contrast({a: np.array([by_seed[a][s] for s in seeds]) for a in spec.weights}, spec)
            one = st.t_test(c, alternative="greater", confidence=1 - rule.alpha)
            two = st.t_test(c, alternative="two-sided", confidence=st.DESCRIPTIVE_CONFIDENCE)
            p_exact = st.sign_flip_p(c, alternative="greater")
            row.update(diff=one["diff"], t=one["t"], df=one["df"], p=one["p"], lower=one["ci_low"],
                       ci95=(two["ci_low"], two["ci_high"]), p_exact=p_exact, contrast=c, seeds=seeds,
                       reject=bool(one["p"] < rule.alpha), robust=bool(p_exact < rule.alpha))
        rows.append(row)
    combined = _combine(rule, {r["name"]: np.bool_(r["reject"]) for r in rows},
                        {r["name"]: np.bool_(r["robust"]) for r in rows})
    n_min = min(r["n"] for r in rows)
    floor = st.min_sign_flip_p(n_min, alternative="greater")
    return {"tests": rows, "verdict": {k: bool(v) for k, v in combined.items()},
            "design": {"n_min": n_min, "floor": floor, "can_reject": n_min >= 2 and floor < rule.alpha}}


def margin_contrast_tests(pairs, by_seed: Mapping[str, Mapping[int, float]],
                          not_run: Mapping[str, str] | None = None) -> list[dict]:
    """Outside the rule, two-sided: ``a − b`` per shared seed for each pair of ``report.margin_contrasts``
    (lopd against arms whose β never reads Δ(φ); the binding-margin arm against the frozen composer). Each
    row: a, b, n, diff, ci95 (t), p (t), p_exact (sign flip); or ``missing`` (arms without seeds) with the
    reason an arm was not run (``not_run[arm]``) where one is given."""
    rows, not_run = [], not_run or {}
    for a, b in pairs:
        missing = [x for x in (a, b) if not by_seed.get(x)]
        seeds = sorted(set(by_seed.get(a, {})) & set(by_seed.get(b, {})))
        row = {"a": a, "b": b, "n": len(seeds), "missing": missing,
               "not_run": {x: not_run[x] for x in missing if x in not_run}}
        if len(seeds) >= 2:
            d = np.array([by_seed[a][s] - by_seed[b][s] for s in seeds])
            two = st.t_test(d, alternative="two-sided", confidence=st.DESCRIPTIVE_CONFIDENCE)
            row.update(diff=two["diff"], ci95=(two["ci_low"], two["ci_high"]), p=two["p"],
                       p_exact=st.sign_flip_p(d, alternative="two-sided"))
        rows.append(row)
    return rows


def render_margin_contrasts(rows: list[dict]) -> list[str]:
    """The section of ``falsification.md`` for :func:`margin_contrast_tests`."""
    if not rows:
        return []
    md = ["", "## What the margin did for the result (outside the rule)", "",
          "Each row pairs two arms over the seeds they share (same seeds and draws): two-sided paired t over seeds, "
          "sign-flip p beside it, not part of the registered rule and not corrected for multiplicity. lopd against "
          "lopd_ramp (β_t = r·t) or lopd_fixbeta (β held): an interval holding 0 means this design cannot tell dual "
          "ascent from that schedule. lopd_binding (the best val trial whose margin binds) against lopd_frozen: "
          "the paper's mechanism against a composer that is not trained.", ""]
    table = []
    for r in rows:
        name = f"{r['a']} − {r['b']}"
        if "diff" not in r:
            why = "; ".join(f"{x} not run: {r['not_run'][x]}" if x in r["not_run"] else f"{x} has no seeds"
                            for x in r["missing"]) or f"n = {r['n']} < 2"
            table.append([name, str(r["n"]), why, "—", "—", "—"])
            continue
        lo, hi = r["ci95"]
        table.append([name, str(r["n"]), fmt(r["diff"], 4), f"[{fmt(lo, 4)}, {fmt(hi, 4)}]", fmt_p(r["p"]),
                      fmt_p(r["p_exact"])])
    return md + [md_table(["contrast", "n", "diff", "95% CI (t)", "p (t, two-sided)", "p (sign flip)"], table)]


# --------------------------------------------------------------------------- rendering
def _structure(rule: Rule) -> list[str]:
    a, t = rule.alpha, rule.treatment
    rho = ("off (report.rule.rho: null)" if rule.rho is None else
           f"ρ = {rule.rho:g}: a content test asks ({t} − control) > ρ·({t} − {rule.rho_baseline})")
    return [f"- Part {PARTS['gain']}: {t} > " + f" and {t} > ".join(rule.gain_over) + f", each one-sided at α = {a}.",
            f"- Part {PARTS['content']}: {t} > " + f" and {t} > ".join(rule.content_controls)
            + f", each one-sided at α = {a}. Smallest effect of interest: {rho}.",
            "- A part holds iff all its tests reject (intersection–union: no multiplicity correction across "
            "its members); the claim needs both parts.",
            "- Decisive test: paired t-test on per-seed mean test reward (seed = unit of replication). "
            "Robustness check: exact one-sided sign-flip test on the same per-seed contrasts (reported; it does "
            "not change the verdict). CIs: one-sided (1 − α) t bound (matches the test) and two-sided 95% t.",
            f"- {CONDITIONAL}"]


def _premise_lines(premise: dict) -> list[str]:
    d = "; ".join(f"δ {k} = {fmt(v, 4)}" for k, v in premise.get("delta", {}).items())
    return ["## Premise gate", "", f"Premise gate ({premise['path']}): **{premise['status']}**"
            + (f" ({d})." if d else "."), ""]


def _test_table(analysis: dict) -> str:
    def ci(pair):
        return "n/a" if pair is None else f"[{fmt(pair[0], 4)}, {fmt(pair[1], 4)}]"

    rows = []
    for r in analysis["tests"]:
        if not r["n"]:
            why = "missing: " + ", ".join(r["missing"]) if r["missing"] else "no shared seeds"
            rows.append([PARTS[r["part"]], r["name"], "0", why, *["—"] * 5, "no"])
            continue
        rows.append([PARTS[r["part"]], r["name"], str(r["n"]), f"{r['diff']:+.4f}", f"{fmt(r['t'], 2)} ({r['df']})",
                     fmt_p(r["p"]), fmt(r["lower"], 4), ci(r["ci95"]), fmt_p(r["p_exact"]),
                     "yes" if r["reject"] else "no"])
    return md_table(["part", "test", "n seeds", "estimate", "t (df)", "p (t)", "lower bound (1−α)", "95% t-CI",
                     "p (sign-flip, exact)", "rejects"], rows)


def _verdict_lines(rule: Rule, analysis: dict) -> list[str]:
    v, rows, a = analysis["verdict"], analysis["tests"], rule.alpha
    out = []
    for part in PARTS:
        failed = [r for r in rows if r["part"] == part and not r["reject"]]
        why = "; ".join(f"{r['name']}: " + (f"missing ({', '.join(r['missing'])})" if not r["n"] else
                                               f"p = {fmt_p(r['p'])} not < {a}") for r in failed)
        out.append(f"- Part {PARTS[part]}: " + ("**holds**." if v[part] else f"**fails** ({why})."))
    if v["claim"]:
        out.append(f"\n**{CLAIM_SENTENCE}**: both parts hold at α = {a}.")
    else:
        which = " and ".join(PARTS[p] for p in PARTS if not v[p])
        out.append(f"\n**{NO_CLAIM_SENTENCE}**: part {which} failed.")
    off = [r for r in rows if r["n"] and r["reject"] != r["robust"]]
    out.append("\nRobustness (exact sign-flip): " + ("agrees with the t-test on every test." if not off else
               "disagrees on " + ", ".join(f"{r['name']} (sign-flip p = {fmt_p(r['p_exact'])})" for r in off)
               + "; the claim " + ("also" if v["claim_robust"] else "does not") + " hold by the sign-flip tests."))
    return out


SHARED_DRAW_SCOPE = (
    "**The training seed only.** Every seed of every arm shares one draw of the upstream randomness: the "
    "base policy (`base.seed`), the experience bank (`bank.seed`) and the cold-started composer φ0 "
    "(`cold_start.seed`). The intervals and p-values below describe the spread over training seeds given that "
    "draw, not over draws. A verdict here is a verdict about this draw.")
PER_SEED_DRAW_SCOPE = (
    "**The training seed and the bank and cold-start draws, not the base draw.** Training seed s of every arm "
    "uses its own experience bank and cold-started composer φ0 (`train.per_seed_draws: true`: draw s, seeded "
    "from `bank.seed`, `cold_start.seed` and s, in `models/draws/`), so each unit of the paired tests below is a "
    "(draw, seed) pair, and the intervals and p-values cover the spread over bank and cold-start draws as well as "
    "over training seeds. They do not cover the base policy: every seed shares its one draw (`base.seed`, not "
    "replicated: its pretraining is the most expensive stage), so a verdict here is a verdict about this base "
    "policy. The search, probe and sensitivity use the shared draw (`models/bank`, `models/cold_start`).")


def ci_scope(per_seed_draws: bool) -> str:
    """What the intervals of the rule's tests cover, given how the final runs drew the bank and φ0."""
    return PER_SEED_DRAW_SCOPE if per_seed_draws else SHARED_DRAW_SCOPE


def render(rule: Rule, analysis: dict, premise: dict, design_note: str, scope: str,
           margin_contrasts: list[dict] | None = None) -> str:
    """``falsification.md``: rule text and structure (no data), premise gate, design check, what the intervals
    cover (``scope``, :func:`ci_scope`), tests, verdict; then, outside the rule, the margin contrasts
    (:func:`margin_contrast_tests`)."""
    d = analysis["design"]
    md = ["# Falsification test", "", "## Pre-registered rule", "", f"> {rule.text}", "", "Structure "
          "(params.yaml, report.rule):", *_structure(rule), "", design_note, "", *_premise_lines(premise),
          "## Design check", ""]
    if d["n_min"] == 0:
        md.append(f"**{DESIGN_FLAG}: a test of the rule has no paired seeds (missing arms), so the rule cannot be "
                  "decided: the verdict below is fixed by the missing data.**")
    elif d["can_reject"]:
        md.append(f"With n = {d['n_min']} paired seeds (the smallest over the tests) the smallest attainable "
                  f"one-sided exact sign-flip p is 1/2^{d['n_min']} = {fmt_p(d['floor'])} < α = {rule.alpha}, "
                  f"and the t-test has {d['n_min'] - 1} degrees of freedom: both tests can reject, so "
                  f"{DESIGN_OK}.")
    else:
        md.append(f"**{DESIGN_FLAG}: with n = {d['n_min']} paired seeds the smallest attainable one-sided exact "
                  f"sign-flip p is {fmt_p(d['floor'])}, not below α = {rule.alpha}: the exact test cannot reject "
                  "whatever the effect, so the verdict is not robustly decidable with this many seeds.**")
    md += ["", "## What the confidence intervals cover", "", scope,
           "", "## Tests", "", _test_table(analysis), "", "## Verdict", "", *_verdict_lines(rule, analysis),
           *render_margin_contrasts(margin_contrasts or [])]
    return "\n".join(md)
