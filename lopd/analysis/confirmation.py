"""The amended rule: the registered two-part rule at every point of S (``registration.json``).

At each point p of S the confirmation trains the rule's arms on the same fresh seeds (each seed's bank and
cold-start draw shared by every point; base is shared by every point), so contrasts pair over seeds and points.

* **primary**: the two-part rule (:mod:`lopd.analysis.falsification`) on the per-seed contrasts averaged over
  S with equal weights. The rule is linear in the arms, so that is the rule on each arm's per-seed value
  averaged over the points (a shared arm, base, is its own average).
* **labels**: *robust to selection* when the primary holds and the rule holds at every point (an
  intersection–union test over points: its level is the rule's α without a correction); *point-dependent*
  when the primary holds but the rule fails at some point, or the primary fails while the rule holds at some
  point; *no claim* otherwise.

:func:`decide_amended` takes aligned arrays with leading batch axes (simulated experiments,
:mod:`tests.unit.test_calibration`); :func:`analyse_amended` takes the report's per-seed values and keeps each
point's one-point analysis (the one-point rule's output, with CIs) for the specification curve.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from lopd.analysis.falsification import Rule, analyse, decide

ROBUST = "robust to selection"
POINT_DEPENDENT = "point-dependent"
NO_CLAIM = "no claim"
LABEL_TEXT = {
    ROBUST: "the rule holds on the average over S and at every point of S (intersection–union over points)",
    POINT_DEPENDENT: "the rule holds on the average over S but not at every point, or fails on the average "
                     "and holds at some point",
    NO_CLAIM: "the rule holds neither on the average over S nor at any point",
}


def mechanism_rule(mech: Mapping) -> Rule:
    """H2 (``registration.json``'s ``mechanism``) as a :class:`Rule` with part (i) only: the treatment beats each
    control (part (ii) empty holds vacuously), so the rule's own tests, CIs and sign-flip p-values apply at H2's
    point."""
    return Rule(mech["text"], mech["treatment"], tuple(mech["controls"]), (), None, "base", mech["alpha"])


def _label(primary, every, some):
    robust = primary & every
    dependent = ~robust & (primary | some)
    return np.where(robust, ROBUST, np.where(dependent, POINT_DEPENDENT, NO_CLAIM))


def average_over_points(by_point: Sequence[Mapping[str, np.ndarray]], arms: Sequence[str]) -> dict[str, np.ndarray]:
    """Each arm's values averaged over the points with equal weights (arrays aligned over seeds)."""
    return {a: np.mean([np.asarray(v[a], dtype=float) for v in by_point], axis=0) for a in arms}


def decide_amended(by_point: Sequence[Mapping[str, np.ndarray]], rule: Rule, *, sign_flip: bool = True) -> dict:
    """The amended rule on aligned per-seed values: ``by_point[p][arm]`` of shape (..., n_seeds), the same
    seeds at every point (a shared arm has the same array at every point).

    Returns ``primary`` (:func:`decide` on the averaged values), ``points`` (:func:`decide` at each point),
    ``every``/``some`` (the rule holds at every / some point) and ``label`` (a string array). ``sign_flip``
    is passed to :func:`decide` (False: the t-tests only, which decide every claim and label)."""
    if not by_point:
        raise ValueError("S is empty: the amended rule needs at least one point")
    points = [decide(v, rule, sign_flip=sign_flip) for v in by_point]
    primary = decide(average_over_points(by_point, rule.arms()), rule, sign_flip=sign_flip)
    every = np.logical_and.reduce([p["claim"] for p in points])
    some = np.logical_or.reduce([p["claim"] for p in points])
    return {"primary": primary, "points": points, "every": every, "some": some,
            "label": _label(primary["claim"], every, some)}


def analyse_amended(rule: Rule, by_point: Mapping[str, Mapping[str, Mapping[int, float]]]) -> dict:
    """The amended rule on the report's data: ``by_point[point][arm][seed]`` = mean confirmatory test reward
    (a shared arm appears under every point). Only the seeds every arm has at every point enter (the
    registration's seeds, unless a run is missing: then ``missing`` says which).

    Returns ``points`` ({point: :func:`analyse`}), ``primary`` (:func:`analyse` on the averaged values),
    ``label``, ``every``, ``some``, ``seeds`` and ``missing`` (each (point, arm) lacking a seed some other
    run has: that seed is left out everywhere, so the contrasts stay paired)."""
    names = list(by_point)
    if not names:
        raise ValueError("S is empty: the amended rule needs at least one point")
    sets = [set(by_point[p].get(a, {})) for p in names for a in rule.arms()]
    seeds = sorted(set.intersection(*sets)) if sets else []
    every_seed = set.union(*sets) if sets else set()
    missing = [f"{p} {a}: " + ("no run" if not by_point[p].get(a) else
                               "seeds " + ", ".join(map(str, sorted(every_seed - set(by_point[p][a])))))
               for p in names for a in rule.arms() if every_seed - set(by_point[p].get(a, {}))]
    aligned = {p: {a: {s: by_point[p][a][s] for s in seeds} for a in rule.arms()} for p in names}
    points = {p: analyse(rule, aligned[p]) for p in names}
    avg = {a: {s: float(np.mean([aligned[p][a][s] for p in names])) for s in seeds} for a in rule.arms()}
    primary = analyse(rule, avg)
    claims = [points[p]["verdict"]["claim"] for p in names]
    every, some = all(claims), any(claims)
    label = str(_label(np.bool_(primary["verdict"]["claim"]), np.bool_(every), np.bool_(some)))
    return {"points": points, "primary": primary, "label": label, "every": every, "some": some,
            "seeds": seeds, "missing": missing}


def spec_curve_rows(amended: dict, points_meta: Sequence[Mapping]) -> list[dict]:
    """The specification curve's rows: every rule test at every point of S, in val-rank order (the order of
    ``points_meta``, the registration's points), with its estimate, 95% CI, one-sided p and the point's
    margin status on val; then the primary (averaged) tests."""
    rows = []
    for meta in points_meta:
        fal = amended["points"].get(meta["name"])
        if fal is None:
            continue
        for t in fal["tests"]:
            rows.append({"point": meta["name"], "trial": meta.get("trial"), "role": meta.get("role"),
                         "margin_status": meta.get("margin_status"), "test": t["name"], "n": t["n"],
                         "diff": t.get("diff"), "ci95": t.get("ci95"), "p": t.get("p"), "p_exact": t.get("p_exact"),
                         "reject": t["reject"]})
    for t in amended["primary"]["tests"]:
        rows.append({"point": "average over S", "trial": None, "role": "primary", "margin_status": None,
                     "test": t["name"], "n": t["n"], "diff": t.get("diff"), "ci95": t.get("ci95"), "p": t.get("p"),
                     "p_exact": t.get("p_exact"), "reject": t["reject"]})
    return rows
