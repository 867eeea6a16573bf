"""Stage ``sensitivity``: the validation grid around the selected point: each of m, K and n_ret varied alone,
the margin's dose-response (every positive m at each ``sensitivity.eta_betas``), and the reference arms
(``sensitivity.references``) trained beside it on its seeds."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lopd.config import Params
from lopd.paths import Paths
from lopd.stages.common import load_resources, splits_read
from lopd.utils import write_csv, write_json

if TYPE_CHECKING:
    from lopd.training.trainer import Resources


GRID_COLUMNS = ["axis", "arm", "margin", "K", "n_ret", "lr_student", "eta_beta", "seed", "val_reward", "constraint"]


def grid_points(sel: dict, sp) -> list[tuple[str, dict]]:
    """Each axis varied alone, the others held at the selected point; then (axis ``dose``) every positive m of
    ``sp.margins`` at each η_β of ``sp.eta_betas`` other than the selected one (whose m line is the margin axis)."""
    base = {"margin": sel["margin"], "K": sel["K"], "n_ret": sel["n_ret"]}
    for k in ("lr_student", "eta_beta"):
        if k in sel:
            base[k] = sel[k]
    axes = [("margin", m) for m in sp.margins] + [("K", k) for k in sp.ks] + [("n_ret", n) for n in sp.n_rets]
    dose = [("dose", {**base, "margin": m, "eta_beta": eta}) for eta in sp.eta_betas if eta != base.get("eta_beta")
            for m in sp.margins if m > 0]
    return [(axis, {**base, axis: v}) for axis, v in axes] + dose


def run(params: Params, paths: Paths) -> dict:
    import yaml

    from lopd.tracking import Tracker

    sel = yaml.safe_load((paths.hpo / "best_params.yaml").read_text())
    res = load_resources(params, paths, role="sensitivity")
    # one MLflow run holds the grid's runs, as the search's run holds its trials
    seeds = " ".join(str(2000 + s) for s in params.sensitivity.seeds)  # the training seeds of the grid's runs
    tracker = Tracker(params, "sensitivity", {"stage": "sensitivity", "arm": "lopd", "seed": seeds, "split": "val",
                                              "bank_mode": "relevant", "params_hash": params.section_hash()})
    try:
        rows = _run_grid(params, res, sel, tracker.run_id)
        rows += _run_references(params, res, paths, tracker.run_id)
    except BaseException:
        tracker.end("FAILED")
        raise
    tracker.end()
    out = paths.results / "sensitivity"
    write_csv(out / "grid.csv", rows, GRID_COLUMNS)
    write_json(out / "result.json", {"n_runs": len(rows), "selected": sel, "splits_read": splits_read()})
    return {"n_runs": len(rows)}


def _status(score, margin) -> str:
    """The run's margin constraint status over its last quarter (:func:`lopd.analysis.constraint.constraint_status`)."""
    import numpy as np

    from lopd.analysis.constraint import constraint_status

    hist = {k: np.asarray(v, dtype=float) for k, v in score.margin_path.items()}
    return constraint_status(hist, None if margin is None else float(margin))["status"]


def _run_grid(params: Params, res: Resources, sel: dict, parent_run_id: str | None) -> list[dict]:
    """Every grid point × seed trained on train and scored on val, as one population."""
    from lopd.population.points import train_points
    from lopd.tracking.names import dose_run, sensitivity_run

    sp = params.sensitivity
    grid = grid_points(sel, sp)
    steps = sp.steps or params.train.steps

    def naming(p: int, seed: int) -> tuple[dict, str]:
        axis, point = grid[p]
        name = dose_run(point, seed) if axis == "dose" else sensitivity_run(axis, point[axis], seed)
        return {"stage": "sensitivity", "axis": axis, "split": "val"}, name

    # the grid's training seeds: 2000 + s (the search's are 1000 + s, the final runs' s)
    scores = train_points(params, res, "lopd", [point for _, point in grid], [2000 + s for s in sp.seeds],
                          steps=steps, val_every=steps, naming=naming, parent_run_id=parent_run_id,
                          label="sensitivity grid")
    return [{"axis": axis, "arm": "lopd", **point, "seed": seed, "val_reward": sc.val_reward,
             "constraint": _status(sc, point["margin"])}
            for (axis, point), per_seed in zip(grid, scores) for seed, sc in zip(sp.seeds, per_seed)]


def _run_references(params: Params, res: Resources, paths: Paths, parent_run_id: str | None) -> list[dict]:
    """Each arm of ``sensitivity.references`` at the point the final runs train it at (selected, or tuned:
    :func:`lopd.training.run.selected_hparams`), on the grid's seeds and horizon; one population per arm."""
    from lopd.arms import get_arm
    from lopd.population.points import train_points
    from lopd.config.train import SELECTED_KEYS
    from lopd.tracking.names import reference_run
    from lopd.training.run import selected_hparams

    sp = params.sensitivity
    steps, rows = sp.steps or params.train.steps, []
    for arm in sp.references:
        spec = get_arm(arm)
        point = selected_hparams(params, paths.hpo / "best_params.yaml", spec)

        def naming(p: int, seed: int, arm=arm) -> tuple[dict, str]:
            return {"stage": "sensitivity", "axis": "reference", "split": "val"}, reference_run(arm, seed)

        (per_seed,) = train_points(params, res, arm, [point], [2000 + s for s in sp.seeds], steps=steps,
                                   val_every=steps, naming=naming, parent_run_id=parent_run_id,
                                   label=f"sensitivity reference {arm}")
        hp = {k: point.get(k, getattr(params.train, k)) for k in SELECTED_KEYS}
        rows += [{"axis": "reference", "arm": arm, **hp, "seed": seed, "val_reward": sc.val_reward,
                  # a status only where dual ascent moves β (not lopd_fixbeta's held β, nor an arm without the margin)
                  "constraint": _status(sc, hp["margin"]) if spec.margin and spec.beta_schedule == "dual" else None}
                 for seed, sc in zip(sp.seeds, per_seed)]
    return rows
