"""Stage ``sensitivity``: one-at-a-time validation grid around the selected point (m, K, n_ret)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lopd.config import Params
from lopd.paths import Paths
from lopd.stages.common import load_resources, splits_read
from lopd.utils import write_csv, write_json

if TYPE_CHECKING:
    from lopd.training.trainer import Resources


GRID_COLUMNS = ["axis", "margin", "K", "n_ret", "lr_student", "seed", "val_reward"]


def grid_points(sel: dict, sp) -> list[tuple[str, dict]]:
    """Each axis varied alone, the others held at the selected point."""
    base = {"margin": sel["margin"], "K": sel["K"], "n_ret": sel["n_ret"]}
    if "lr_student" in sel:
        base["lr_student"] = sel["lr_student"]
    axes = [("margin", m) for m in sp.margins] + [("K", k) for k in sp.ks] + [("n_ret", n) for n in sp.n_rets]
    return [(axis, {**base, axis: v}) for axis, v in axes]


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
    except BaseException:
        tracker.end("FAILED")
        raise
    tracker.end()
    out = paths.results / "sensitivity"
    write_csv(out / "grid.csv", rows, GRID_COLUMNS)
    write_json(out / "result.json", {"n_runs": len(rows), "selected": sel, "splits_read": splits_read()})
    return {"n_runs": len(rows)}


def _run_grid(params: Params, res: Resources, sel: dict, parent_run_id: str | None) -> list[dict]:
    """Every grid point × seed trained on train and scored on val, as one population."""
    from lopd.population.points import train_points
    from lopd.tracking.names import sensitivity_run

    sp = params.sensitivity
    grid = grid_points(sel, sp)
    steps = sp.steps or params.train.steps

    def naming(p: int, seed: int) -> tuple[dict, str]:
        axis, point = grid[p]
        return {"stage": "sensitivity", "axis": axis, "split": "val"}, sensitivity_run(axis, point[axis], seed)

    # the grid's training seeds: 2000 + s (the search's are 1000 + s, the final runs' s)
    scores = train_points(params, res, "lopd", [point for _, point in grid], [2000 + s for s in sp.seeds],
                          steps=steps, val_every=steps, naming=naming, parent_run_id=parent_run_id,
                          label="sensitivity grid")
    return [{"axis": axis, **point, "seed": seed, "val_reward": sc.val_reward}
            for (axis, point), per_seed in zip(grid, scores) for seed, sc in zip(sp.seeds, per_seed)]
