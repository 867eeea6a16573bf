"""Stage ``sensitivity``: one-at-a-time validation grid around the selected point (m, K, n_ret)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from lopd.config import Params
from lopd.paths import Paths
from lopd.stages.common import load_resources, splits_read
from lopd.utils import write_csv, write_json

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


def _run_grid(params: Params, res, sel: dict, parent_run_id: str | None) -> list[dict]:
    """Every grid point and seed trained on train, scored on val (a progress bar over the runs)."""
    from lopd.tracking.names import sensitivity_run
    from lopd.training.run import run_arm
    from lopd.utils import progress

    sp = params.sensitivity
    jobs = [(axis, point, seed) for axis, point in grid_points(sel, sp) for seed in sp.seeds]
    rows = []
    with progress() as prog:
        bar = prog.add_task("sensitivity grid", total=len(jobs), info="")
        for axis, point, seed in jobs:
            tmp = Path(tempfile.mkdtemp(prefix="sens-"))
            try:
                r, _ = run_arm(params, res, "lopd", 2000 + seed, tmp, ckpt_dir=None,
                               tags={"stage": "sensitivity", "axis": axis, "split": "val"},
                               hp_over={**point, "steps": sp.steps or params.train.steps,
                                        "val_every": sp.steps or params.train.steps},
                               parent_run_id=parent_run_id, run_name=sensitivity_run(axis, point[axis], seed))
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            rows.append({"axis": axis, **point, "seed": seed, "val_reward": r["val_reward"]})
            prog.update(bar, advance=1, info=f"{axis}={point[axis]} seed {seed}: val {r['val_reward']:.3f}")
    return rows
