"""Stage ``hpo``: Optuna TPE over m, K, n_ret and the student learning rate on the VALIDATION split only
(resumable journal), then the learning baselines' learning rates from the same grid."""

from __future__ import annotations

import os
import time

from lopd.config import Params
from lopd.paths import Paths
from lopd.stages.common import load_resources, splits_read, write_side


def run(params: Params, paths: Paths, worker: bool = False, storage: str | None = None,
        n_trials: int | None = None) -> dict:
    from lopd.hpo.progress import search_progress
    from lopd.hpo.study import (confirm_trials, dep_files, interrupted_trials, run_search, tune_baselines,
                                 write_outputs, write_result)
    from lopd.tracking import Tracker

    res = load_resources(params, paths, role="hpo")
    storage = storage or str(paths.hpo / "journal.log")
    tracker = Tracker(params, f"search worker · pid {os.getpid()}" if worker else "search",
                      {"stage": "hpo", "arm": "lopd", "seed": params.hpo.seed, "split": "val", "bank_mode": "relevant",
                       "params_hash": params.section_hash("model", "envs", "base", "bank", "cold_start", "train", "hpo")})
    t0 = time.time()
    try:
        with search_progress(n_trials if n_trials is not None else params.hpo.n_trials) as on_trial:
            study = run_search(params, res, storage=storage, dep_files=dep_files(paths), n_trials=n_trials,
                               worker=worker, parent_tracker=tracker, on_batch=lambda st: on_trial(st, None))
    except BaseException:
        tracker.end("FAILED")
        raise
    if worker:
        tracker.end()
        return {}
    try:  # the best trials on more seeds, so that the selection ties by seed (hpo.confirm_top)
        per_seed = confirm_trials(params, res, study, paths.hpo, parent_tracker=tracker)
    except BaseException:
        tracker.end("FAILED")
        raise
    sel = write_outputs(study, paths.hpo, params, per_seed)
    tracker.log_params({f"best_{k}": v for k, v in sel.items() if k not in ("binding", "binding_reason")})
    tracker.log_params({"binding_trial": (sel["binding"] or {}).get("trial")})
    try:
        baselines = tune_baselines(params, res, sel, paths.hpo, parent_tracker=tracker)
    except BaseException:
        tracker.end("FAILED")
        raise
    tracker.log_params({f"{b['knob']}_{arm}": b[b["knob"]] for arm, b in baselines.items()})
    tracker.end()
    write_result(paths.hpo, sel, study, splits_read())
    write_side(paths, "hpo", {"seconds": round(time.time() - t0, 1), "mlflow_run_id": tracker.run_id,
                              "tracking": tracker.status, "interrupted_trials": interrupted_trials(study)})
    print(f"selected on val: m={sel['margin']} K={sel['K']} n_ret={sel['n_ret']} lr={sel['lr_student']} "
          f"(val reward {sel['value']:.3f}; {sel['tie_count']} trial(s) tied with the best, rule {sel['tie_rule']})")
    b = sel["binding"]
    print(f"lopd_binding: trial {b['trial']}" if b else f"lopd_binding: not run ({sel['binding_reason']})")
    for arm, b in baselines.items():
        print(f"  {arm}: {b['knob']} {b[b['knob']]} (val reward {b['value']:.3f})")
    return sel
