"""Which search trial is selected, and what the search can tell apart: pure functions over trials.

A trial's value is its mean validation reward; with common random numbers every trial is scored on
the same val tasks with the same sampling seeds, so two trials are compared **paired by task**: the
difference of their per-task rewards (each task's mean over samples and the trial's seeds), a
t-interval over tasks. A trial is *tied with the best* when that paired interval at ``alpha``
contains 0 (the two-sided paired t-test does not reject).

That test sees one source of noise (the tasks) on a mean over few seeds, and the training seed moves a
trial's value more than the tasks do. So the search's best trials (``hpo.rerun_top``) are rerun on more
seeds (``hpo.rerun_seeds``) and the selection among them (:func:`select_by_seed`) takes the **seed as the
unit**: for two trials trained with the same seeds (and, within a seed, the same tasks and sampling
seeds), the difference of their per-seed mean val rewards, a t-interval over seeds. Every source of noise
a final run has (its seed, its rollouts) is then in the interval; the val tasks are fixed.

The tie rule is registered in ``params.yaml`` (``hpo.tie_rule``) before the search runs:

- ``best``: the highest value (lowest trial number among equal values);
- ``median_margin``: among the tied set, the trial whose margin is the (lower) median of the tied
  margins, the highest value among trials with that margin, then the lowest trial number;
- ``smallest_margin``: among the tied set, the smallest margin (then value, then number).

An arm that searches no margin (the baselines' own searches) takes the best under either margin rule.

The selection also says whether each coordinate of the selected point lies on the boundary of the
search space (its smallest or largest choice): an optimum on the boundary may lie outside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lopd.analysis.search_record import Binding, Selection
from lopd.analysis.stats import paired_t, summarize

TIE_RULES = ("best", "median_margin", "smallest_margin")


@dataclass(frozen=True)
class TrialScore:
    """One finished trial: its number (position among finished trials), state, point and per-task rewards."""

    number: int
    state: str  # COMPLETE or PRUNED (a pruned trial is never selected)
    point: dict
    value: float | None
    per_task: tuple[float, ...] = field(default=())


def t_interval(x, alpha: float) -> tuple[float, float, float]:
    """(mean, low, high): the two-sided ``1 - alpha`` t-interval of the mean of ``x`` over tasks
    (:func:`lopd.analysis.stats.summarize`; zero width when ``x`` has no spread or one element)."""
    s = summarize(np.asarray(x, dtype=float), confidence=1 - alpha)
    if s["n"] < 2:
        return s["mean"], s["mean"], s["mean"]
    return s["mean"], s["ci_low"], s["ci_high"]


def paired(a: TrialScore, b: TrialScore, alpha: float) -> dict:
    """``a − b`` paired over tasks (:func:`lopd.analysis.stats.paired_t`): mean difference, its
    two-sided t-interval and p; ``tied`` if the interval holds 0."""
    if len(a.per_task) != len(b.per_task) or not a.per_task:
        raise ValueError(f"trials {a.number} and {b.number} were not scored on the same val tasks "
                         f"({len(a.per_task)} vs {len(b.per_task)} per-task rewards)")
    r = paired_t(np.asarray(a.per_task, float), np.asarray(b.per_task, float), confidence=1 - alpha)
    lo, hi = float(r["ci_low"]), float(r["ci_high"])
    return {"diff": float(r["diff"]), "low": lo, "high": hi, "p": float(r["p"]), "tied": bool(lo <= 0.0 <= hi)}


def boundary(point: dict, space: dict) -> dict:
    """Per coordinate of ``point``: ``"low"``/``"high"`` if it is the smallest/largest choice of
    ``space[name]`` (a list of choices), else None. A one-choice coordinate is not on a boundary."""
    out = {}
    for name, choices in space.items():
        v = point.get(name)
        if v is None or len(set(choices)) < 2:
            out[name] = None
        elif v == min(choices):
            out[name] = "low"
        elif v == max(choices):
            out[name] = "high"
        else:
            out[name] = None
    return out


def _pick(tied: list[TrialScore], rule: str) -> TrialScore:
    by_value = sorted(tied, key=lambda t: (-t.value, t.number))
    if rule == "best" or any("margin" not in t.point for t in tied):  # an arm with no margin: the best
        return by_value[0]
    margins = sorted(t.point["margin"] for t in tied)
    target = margins[(len(margins) - 1) // 2] if rule == "median_margin" else margins[0]
    return next(t for t in by_value if t.point["margin"] == target)




def select(trials: list[TrialScore], rule: str, alpha: float, space: dict) -> Selection:
    """The selected trial under ``rule`` with everything the search report states (see the module doc).

    Raises ValueError when no trial is COMPLETE or the rule is unknown."""
    if rule not in TIE_RULES:
        raise ValueError(f"unknown tie rule {rule!r}; known: {', '.join(TIE_RULES)}")
    complete = [t for t in trials if t.state == "COMPLETE" and t.value is not None]
    if not complete:
        raise ValueError("the search finished no COMPLETE trial: nothing to select")
    ranked = sorted(complete, key=lambda t: (-t.value, t.number))
    best = ranked[0]
    vs_best = {t.number: paired(best, t, alpha) for t in ranked[1:]}
    tied = [best] + [t for t in ranked[1:] if vs_best[t.number]["tied"]]
    chosen = _pick(tied, rule)
    runner = ranked[1] if len(ranked) > 1 else None
    return Selection(
        rule=rule, alpha=alpha, unit="task", best=best.number, selected=chosen.number, point=dict(chosen.point),
        value=chosen.value, tied=sorted(t.number for t in tied), tie_count=len(tied),
        runner_up=None if runner is None else {"number": runner.number, **vs_best[runner.number]},
        distinguishable=runner is not None and not vs_best[runner.number]["tied"],
        by_rule=chosen.number != best.number, boundary=boundary(chosen.point, space),
        vs_best={str(k): v for k, v in sorted(vs_best.items())},
        intervals={str(t.number): dict(zip(("mean", "low", "high"), t_interval(np.asarray(t.per_task), alpha)))
                   for t in complete if t.per_task},
    )


def paired_by_seed(a: list[float], b: list[float], alpha: float) -> dict:
    """``a − b`` paired by seed (each a trial's per-seed mean val rewards, the same seeds in the same order):
    mean difference, its two-sided ``1 − alpha`` t-interval over seeds and p; ``tied`` if the interval holds
    0. One seed, or no spread in the differences: the interval is the point (tied only at a zero difference)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"per-seed rewards must cover the same seeds ({len(a)} vs {len(b)})")
    d = np.asarray(a, float) - np.asarray(b, float)
    if len(d) < 2 or np.all(d == d[0]):
        m = float(d.mean())
        return {"diff": m, "low": m, "high": m, "p": 1.0 if m == 0 else 0.0, "tied": m == 0.0, "n_seeds": len(d)}
    r = paired_t(np.asarray(a, float), np.asarray(b, float), confidence=1 - alpha)
    lo, hi = float(r["ci_low"]), float(r["ci_high"])
    return {"diff": float(r["diff"]), "low": lo, "high": hi, "p": float(r["p"]), "tied": bool(lo <= 0.0 <= hi),
            "n_seeds": len(d)}


def select_by_seed(trials: list[TrialScore], per_seed: dict[int, list[float]], seeds: list[int], rule: str,
                   alpha: float, space: dict) -> Selection:
    """The selection among the rerun trials (``per_seed[number]``: a trial's mean val reward per seed of
    ``seeds``, the search's seeds and the confirmation's), with the seed as the unit (module docstring): the
    best is the highest mean over all seeds (lowest number among equal means), a trial is tied with it when
    :func:`paired_by_seed` holds 0, and ``rule`` chooses among the tied. The same keys as :func:`select`
    (``value`` is the mean over all seeds), plus ``unit`` = "seed", ``seeds``, ``per_seed`` and
    ``rerun`` (the trials rerun, best first)."""
    if rule not in TIE_RULES:
        raise ValueError(f"unknown tie rule {rule!r}; known: {', '.join(TIE_RULES)}")
    by_number = {t.number: t for t in trials}
    if not per_seed:
        raise ValueError("no trial was rerun on more seeds: nothing to select")
    for n, v in per_seed.items():
        if n not in by_number or by_number[n].state != "COMPLETE":
            raise ValueError(f"trial {n} is not a COMPLETE trial of the search")
        if len(v) != len(seeds):
            raise ValueError(f"trial {n} has {len(v)} per-seed rewards for {len(seeds)} seeds")
    mean = {n: float(np.mean(v)) for n, v in per_seed.items()}
    scored = [TrialScore(n, "COMPLETE", by_number[n].point, mean[n]) for n in per_seed]
    ranked = sorted(scored, key=lambda t: (-t.value, t.number))
    best = ranked[0]
    vs_best = {t.number: paired_by_seed(per_seed[best.number], per_seed[t.number], alpha) for t in ranked[1:]}
    tied = [best] + [t for t in ranked[1:] if vs_best[t.number]["tied"]]
    chosen = _pick(tied, rule)
    runner = ranked[1] if len(ranked) > 1 else None
    return Selection(
        rule=rule, alpha=alpha, unit="seed", seeds=list(seeds), best=best.number,
        selected=chosen.number, point=dict(chosen.point), value=chosen.value,
        tied=sorted(t.number for t in tied), tie_count=len(tied), rerun=[t.number for t in ranked],
        runner_up=None if runner is None else {"number": runner.number, **vs_best[runner.number]},
        distinguishable=runner is not None and not vs_best[runner.number]["tied"],
        by_rule=chosen.number != best.number, boundary=boundary(chosen.point, space),
        vs_best={str(k): v for k, v in sorted(vs_best.items())},
        per_seed={str(n): [float(x) for x in v] for n, v in sorted(per_seed.items())},
        intervals={str(n): dict(zip(("mean", "low", "high"), t_interval(np.asarray(v), alpha)))
                   for n, v in sorted(per_seed.items())},
    )


def rerun_candidates(trials: list[TrialScore], top: int) -> list[TrialScore]:
    """The ``top`` COMPLETE trials by value on the search's seeds (lowest number among equal values), the
    ones rerun on more seeds."""
    complete = [t for t in trials if t.state == "COMPLETE" and t.value is not None]
    return sorted(complete, key=lambda t: (-t.value, t.number))[:top]


def select_binding(trials: list[TrialScore], statuses: dict[int, list[str]], min_frac: float,
                   max_delta: dict[int, float | None] | None = None) -> Binding:
    """The best COMPLETE trial whose margin binds (the ``lopd_binding`` arm's point): among the trials whose
    runs have status ``binds`` in at least ``min_frac`` of their seeds (``statuses[number]``, one per seed, as
    :func:`lopd.analysis.constraint.constraint_status`), the highest value, then the lowest number.

    Returns the :class:`Binding`, or one with ``trial`` None and the ``reason`` there is none: the largest Δ(φ) any run reached (``max_delta[number]``) against the smallest positive m tried."""
    def binds(t: TrialScore) -> bool:
        st = statuses.get(t.number) or []
        return bool(st) and st.count("binds") >= min_frac * len(st)

    ok = [t for t in trials if t.state == "COMPLETE" and t.value is not None and binds(t)]
    if ok:
        best = max(ok, key=lambda t: (t.value, -t.number))
        return Binding(trial=best.number, point=dict(best.point), value=float(best.value),
                       statuses=tuple(statuses[best.number]))
    reached = max(((d, n) for n, d in (max_delta or {}).items() if d is not None), default=None)
    positive = [float(t.point["margin"]) for t in trials if float(t.point.get("margin", 0.0)) > 0]
    any_bind = sorted(n for n, st in statuses.items() if "binds" in st)
    etas = sorted({float(t.point["eta_beta"]) for t in trials if "eta_beta" in t.point})
    why = (f"no completed trial's margin binds in at least {min_frac:.0%} of its seeds"
           + (f" (binds in some seed: trial(s) {', '.join(map(str, any_bind))})" if any_bind else "")
           + (f"; the largest Δ(φ) any run reached is {reached[0]:.4f} (trial {reached[1]})" if reached else "")
           + (f"; the smallest positive m tried is {min(positive):g}" if positive else "; no positive m was tried")
           + (f"; η_β tried: {', '.join(f'{e:g}' for e in etas)}" if etas else ""))
    return Binding(trial=None, reason=why)
