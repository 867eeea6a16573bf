"""Every arm searched alike, and the boundary rule: each arm's own validation search, extended past an edge.

Each arm of ``hpo.searched_arms`` (and LOPD, over m, K, n_ret and its learning rate) is searched over its own
coordinates with the same budget: ``hpo.n_trials`` trials of ``hpo.seeds_per_trial`` seeds (TPE after its
start-ups, the median pruner), its ``hpo.rerun_top`` best rerun on ``hpo.rerun_seeds`` more seeds, the
selection tied by seed under the registered ``hpo.tie_rule`` (:mod:`lopd.hpo.selection`). What an arm does not
search it takes from LOPD's selected point where it reads the point (``use_selected``), else from ``train``.
A space with no more points than the budget (sft's learning rates, GRPO's rates × group sizes) is searched
whole, each point once, since TPE would repeat points; so is an extension that adds no more points than its
trials.

**The boundary rule** (registered in ``params.yaml`` before the search runs: ``hpo.max_extensions``,
``hpo.trials_per_extension``): when the selected value of a numeric coordinate is the smallest or largest of
its choices and not a natural bound (:mod:`lopd.hpo.boundary`), the coordinate gains one step past that edge
and the search continues: a new study over the extended space that starts with every finished trial of the
last one, first trains the selected point moved one step along each extended coordinate, then TPE's
proposals, ``hpo.trials_per_extension`` trials in all; the new best trials are rerun on more seeds
(the ones rerun before are not rerun again) and the selection is made again among every rerun trial. After
``hpo.max_extensions`` extensions, a selected value still on an extendable edge is flagged
(``selection.json``: ``boundary_rule.flag``), and the report says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from lopd.config.train import SELECTED_KEYS
from lopd.hpo.boundary import AxisRule, extend, record
from lopd.hpo.study import BASELINE_COLUMNS, horizon
from lopd.utils import atomic_write_text, write_csv

if TYPE_CHECKING:
    from lopd.config import Params
    from lopd.training.trainer import Resources


def axis_rules(params: Params) -> dict[str, AxisRule]:
    """How each coordinate steps past an edge, and its natural bounds: m ≥ 0 (m = 0 is the unconstrained
    objective), 1 ≤ K ≤ cold_start.k_max, 1 ≤ n_ret ≤ cold_start.n_ret_max (what the cold start trained), a GRPO
    group of at least 2 that divides the step's rollouts; the learning rate and η_β have none."""
    cs, tr = params.cold_start, params.train
    return {"margin": AxisRule("ratio", floor=0.0), "K": AxisRule("ratio", floor=1, ceil=cs.k_max, integer=True),
            "n_ret": AxisRule("difference", floor=1, ceil=cs.n_ret_max, integer=True),
            "lr_student": AxisRule("ratio"), "eta_beta": AxisRule("ratio"),
            "group_size": AxisRule("ratio", floor=2, ceil=tr.tasks_per_step, integer=True, divides=tr.tasks_per_step)}


def grid(space_: dict) -> list[dict]:
    """Every point of ``space_`` (coordinates in order, choices sorted)."""
    import itertools

    axes = list(space_)
    return [dict(zip(axes, vs)) for vs in itertools.product(*(sorted(space_[a]) for a in axes))]


def forced_points(point: dict, old: dict, new: dict) -> list[dict]:
    """The selected ``point`` moved to each value the extension added (``new`` choices beyond ``old``)."""
    out = []
    for axis in new:
        for v in new[axis]:
            if v not in old[axis]:
                out.append({**point, axis: v})
    return out


def search_arm(params: Params, res: Resources, arm: str, axes, out_dir: Path, *, storage: str, dep_files: list[Path],
               fixed: dict | None = None, parent_tracker=None, on_batch=None) -> tuple[dict, "optuna.Study"]:  # noqa: F821
    """``arm``'s search over ``axes`` with the boundary rule (module docstring); writes its ``trials.csv``,
    ``reruns.csv``, ``margin_paths.csv`` and ``selection.json`` to ``out_dir`` (LOPD's also
    ``best_params.yaml``) and returns the selection (:func:`lopd.hpo.study.write_outputs`) and the last study."""
    from lopd.hpo.selection import TrialScore, select, select_by_seed
    from lopd.hpo.study import (rerun_seeds, rerun_trials, finished_trials, run_search, search_seeds, space,
                                write_outputs)

    hp, rules = params.hpo, axis_rules(params)
    space_, have, levels = space(params, tuple(axes)), None, []
    kw = dict(storage=storage, dep_files=dep_files, arm=arm, fixed=fixed, parent_tracker=parent_tracker,
              on_batch=on_batch)
    # a space no larger than the budget is searched whole, each point once (TPE would repeat points)
    whole = grid(space_)
    whole = whole if len(whole) <= hp.n_trials else []
    study = run_search(params, res, space_=space_, forced=whole, n_trials=len(whole) or None, **kw)
    while True:
        have = rerun_trials(params, res, study, out_dir, parent_tracker, arm=arm, fixed=fixed, have=have)
        done = finished_trials(study)
        scores = [TrialScore(i, t.state.name, dict(t.params), t.value, tuple(t.user_attrs.get("val_per_task", ())))
                  for i, t in enumerate(done)]
        sel = (select_by_seed(scores, have, search_seeds(params) + rerun_seeds(params), hp.tie_rule,
                              hp.tie_alpha, space_) if have else select(scores, hp.tie_rule, hp.tie_alpha, space_))
        new, notes = extend(space_, sel.point, rules)
        if len(levels) >= hp.max_extensions or new == space_:
            break
        levels.append({"after_trials": len(done), "selected": sel.selected, "notes": notes,
                       "space": {k: list(v) for k, v in new.items()}})
        print(f"{arm}: boundary rule, extension {len(levels)}: " + "; ".join(notes))
        tried = [dict(t.params) for t in done]
        rest = [p for p in grid(new) if p not in tried]
        forced = rest if len(rest) <= hp.trials_per_extension else forced_points(sel.point, space_, new)
        study = run_search(params, res, space_=new, level=len(levels), parent=study, forced=forced,
                           n_trials=len(done) + min(len(rest), hp.trials_per_extension), **kw)
        space_ = new
    boundary = record(space_, sel.point, rules, levels, hp.max_extensions)
    return write_outputs(study, out_dir, params, have, arm=arm, space_=space_, boundary=boundary), study


def fixed_values(params: Params, arm: str, axes, sel: dict) -> dict:
    """What ``arm``'s search holds fixed: LOPD's selected m, K, n_ret, learning rate and η_β where the arm reads the
    selected point (``use_selected``) and does not search them; otherwise the ``train`` params."""
    from lopd.arms import get_arm

    if not get_arm(arm).use_selected:
        return {}
    return {k: sel[k] for k in SELECTED_KEYS if k not in axes and k in sel}


def tuned_knob(params: Params, arm: str) -> tuple[str, list[float]]:
    """The knob an arm of ``hpo.baseline_arms`` is tuned over and its values: lopd_fixbeta's held β
    (``hpo.beta_fixed_choices``), any other arm's student learning rate (``hpo.lr_choices``)."""
    from lopd.arms import get_arm

    if get_arm(arm).beta_schedule == "fixed":
        return "beta_fixed", list(params.hpo.beta_fixed_choices)
    return "lr_student", list(params.hpo.lr_choices)


def knob_rule(knob: str, params: Params) -> AxisRule:
    """How a one-knob grid (``hpo.baseline_arms``) steps past an edge: the held β by the grid's ratio, with β = 0
    (no weight on φ's Δ term) its natural bound; a learning rate as in the search (:func:`axis_rules`)."""
    return AxisRule("ratio", floor=0.0) if knob == "beta_fixed" else axis_rules(params)[knob]


def tune_baselines(params: Params, res: Resources, sel: dict, out_dir: Path, parent_tracker=None, searched: dict | None = None) -> dict:
    """Each arm of ``hpo.baseline_arms`` trained at every value of its knob (:func:`tuned_knob`; same
    horizon and seeds as a search trial, validation only; m, K, n_ret of the selected point where the arm
    reads them, and its learning rate too when the knob is not the rate): per arm, its values × seeds as
    one population. Selected: the highest mean val reward, the smaller value among equal ones. The boundary
    rule holds here too: a selected value at an edge of the grid that is not a natural bound (:func:`knob_rule`)
    adds the value one step past it, trained the same way, at most ``hpo.max_extensions`` times; a value still
    on an extendable edge after the last is flagged (``boundary_rule`` in the arm's entry). Writes
    ``baselines.csv`` (every run) and ``baselines.yaml`` (arm -> knob, its value, val reward by value), where
    ``searched`` (arm -> its own search's selection, :func:`search_arm`) is written too, as
    ``knob: search``, ``knobs`` (what it searched) and each knob's value."""
    from lopd.arms import get_arm

    rows = []
    chosen = {arm: {"knob": "search", "knobs": list(axes), **{k: got[k] for k in axes}, "value": float(got["value"]),
                    "trial": got["trial"], "selected_on": "val"}
              for arm, (axes, got) in (searched or {}).items()}
    for arm in params.hpo.baseline_arms:
        knob, values = tuned_knob(params, arm)
        fixed = {k: sel[k] for k in ("margin", "K", "n_ret", "eta_beta") if k in sel} if get_arm(arm).use_selected else {}
        if knob != "lr_student" and get_arm(arm).use_selected:
            fixed["lr_student"] = sel["lr_student"]
        chosen[arm] = _tune_knob(params, res, arm, knob, values, fixed, rows, parent_tracker)
    write_csv(out_dir / "baselines.csv", rows, BASELINE_COLUMNS)
    atomic_write_text(out_dir / "baselines.yaml", yaml.safe_dump(chosen, sort_keys=True))
    return chosen


def _tune_knob(params: Params, res: Resources, arm: str, knob: str, values: list[float], fixed: dict, rows: list,
               parent_tracker) -> dict:
    """``arm`` trained at each of ``values`` of ``knob`` (values × seeds as one population), then at each value
    the boundary rule adds (one population per extension); appends every run to ``rows``; returns the arm's
    ``baselines.yaml`` entry."""
    from lopd.population.points import train_points
    from lopd.tracking.names import baseline_run

    hp, steps, rule = params.hpo, horizon(params), {knob: knob_rule(knob, params)}
    seeds = [1000 + s for s in range(hp.seeds_per_trial)]
    means, levels, todo = {}, [], list(values)
    while True:
        def naming(p: int, seed: int, todo=tuple(todo)) -> tuple[dict, str]:
            return {"stage": "hpo-baselines", "split": "val", knob: todo[p]}, baseline_run(arm, todo[p], seed, knob)

        scores = train_points(params, res, arm, [{**fixed, knob: v} for v in todo], seeds, steps=steps,
                              val_every=hp.val_every, naming=naming,
                              parent_run_id=parent_tracker.run_id if parent_tracker else None,
                              label=f"baseline {arm}" + (f" (extension {len(levels)})" if levels else ""))
        for v, per_seed in zip(todo, scores):
            for seed, sc in zip(seeds, per_seed):
                rows.append({"arm": arm, "knob": knob, "knob_value": v, "seed": seed, "val_reward": sc.val_reward})
            means[v] = sum(sc.val_reward for sc in per_seed) / len(per_seed)
        best = max(sorted(means), key=lambda v: means[v])  # sorted: the smaller value wins an exact tie
        grid_ = {knob: sorted(means)}
        grown, notes = extend(grid_, {knob: best}, rule)
        if len(levels) >= hp.max_extensions or grown == grid_:
            break
        levels.append({"after_values": len(means), "selected": float(best), "notes": notes})
        print(f"{arm}: boundary rule, extension {len(levels)}: " + "; ".join(notes))
        todo = [v for v in grown[knob] if v not in means]
    return {knob: float(best), "knob": knob, "value": float(means[best]), "selected_on": "val",
            "values": {str(v): float(m) for v, m in sorted(means.items())},
            "boundary_rule": record(grid_, {knob: best}, rule, levels, hp.max_extensions)}
