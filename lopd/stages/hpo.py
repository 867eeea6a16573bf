"""Stage ``hpo``: Optuna TPE over m, K, n_ret and the student learning rate on the VALIDATION split only
(resumable journal), then every arm of ``hpo.searched_arms`` searched alike over its own knobs, each with the
registered boundary rule (:mod:`lopd.hpo.search`), then lopd_fixbeta's held β at the selected point (its grid
under the same boundary rule)."""

from __future__ import annotations

import os
import time

from lopd.config import Params
from lopd.paths import Paths
from lopd.stages.common import load_resources, splits_read, write_side


def run(params: Params, paths: Paths, worker: bool = False, storage: str | None = None,
        n_trials: int | None = None) -> dict:
    from lopd.hpo.progress import search_progress
    from lopd.hpo.search import fixed_values, search_arm, tune_baselines
    from lopd.hpo.study import LOPD_AXES, dep_files, interrupted_trials, run_search, write_result
    from lopd.tracking import Tracker

    res = load_resources(params, paths, role="hpo")
    storage = storage or str(paths.hpo / "journal.log")
    tracker = Tracker(params, f"search worker · pid {os.getpid()}" if worker else "search",
                      {"stage": "hpo", "arm": "lopd", "seed": params.hpo.seed, "split": "val", "bank_mode": "relevant",
                       "params_hash": params.section_hash("model", "envs", "base", "bank", "cold_start", "train", "hpo")})
    t0 = time.time()
    hp, deps = params.hpo, dep_files(paths)
    try:
        if worker:
            with search_progress(n_trials if n_trials is not None else hp.n_trials) as on_trial:
                run_search(params, res, storage=storage, dep_files=deps, n_trials=n_trials, worker=True,
                           parent_tracker=tracker, on_batch=lambda st: on_trial(st, None))
            tracker.end()
            return {}
        with search_progress(hp.n_trials) as on_trial:  # LOPD's search, its best trials on more seeds, its extensions
            best, study = search_arm(params, res, "lopd", LOPD_AXES, paths.hpo, storage=storage, dep_files=deps,
                                     parent_tracker=tracker, on_batch=lambda st: on_trial(st, None))
        tracker.log_params({f"best_{k}": v for k, v in best.items() if k not in ("binding", "binding_reason")})
        tracker.log_params({"binding_trial": (best["binding"] or {}).get("trial")})
        searched = {}
        for arm in hp.searched_arms:  # every other arm searched alike, over its own knobs
            axes = hp.search_axes[arm]
            out = paths.hpo / "arms" / arm
            out.mkdir(parents=True, exist_ok=True)
            with search_progress(hp.n_trials, label=f"{arm} search") as on_trial:
                searched[arm] = (axes, search_arm(params, res, arm, axes, out, storage=storage, dep_files=deps,
                                                  fixed=fixed_values(params, arm, axes, best), parent_tracker=tracker,
                                                  on_batch=lambda st: on_trial(st, None))[0])
        baselines = tune_baselines(params, res, best, paths.hpo, parent_tracker=tracker, searched=searched)
    except BaseException:
        tracker.end("FAILED")
        raise
    tracker.log_params({f"{k}_{arm}": b[k] for arm, b in baselines.items() for k in b.get("knobs") or [b["knob"]]})
    tracker.end()
    write_result(paths.hpo, best, study, splits_read())
    write_side(paths, "hpo", {"seconds": round(time.time() - t0, 1), "mlflow_run_id": tracker.run_id,
                              "tracking": tracker.status, "interrupted_trials": interrupted_trials(study)})
    print(f"selected on val: m={best['margin']} K={best['K']} n_ret={best['n_ret']} lr={best['lr_student']} "
          f"(val reward {best['value']:.3f}; {best['tie_count']} trial(s) tied with the best, rule {best['tie_rule']})")
    b = best["binding"]
    print(f"lopd_binding: trial {b['trial']}" if b else f"lopd_binding: not run ({best['binding_reason']})")
    for arm, b in baselines.items():
        print(f"  {arm}: " + " ".join(f"{k} {b[k]}" for k in b.get("knobs") or [b["knob"]]) + f" (val reward {b['value']:.3f})")
    return best
