"""Reading the files the other stages wrote: runs, evaluation results, per-sample rewards, the probe.

Only files, never MLflow: the report works after DVC restores stages from its run cache.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from lopd.analysis.render import finite
from lopd.errors import BadInput
from lopd.paths import NOT_RUN
from lopd.utils import read_json

MEAN_COL = "mean"


def read_csv_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(v) -> float | None:
    """A finite float, or None."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def read_history(path: Path) -> dict[str, np.ndarray]:
    """history.csv → {column: float array}; an empty or non-numeric cell is nan."""
    rows = read_csv_rows(path)
    if not rows:
        return {}
    return {c: np.array([math.nan if num(r.get(c)) is None else num(r.get(c)) for r in rows]) for c in rows[0]}


def series(hist: dict[str, np.ndarray], xcol: str, ycol: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a history where x and y were both measured, sorted by x."""
    if xcol not in hist or ycol not in hist:
        return np.array([]), np.array([])
    x, y = hist[xcol], hist[ycol]
    ok = np.isfinite(x) & np.isfinite(y)
    order = np.argsort(x[ok], kind="stable")
    return x[ok][order], y[ok][order]


def load_runs(root: Path) -> dict[str, dict[int, dict]]:
    """runs/<arm>/seed-<s>/result.json (+ history.csv) → {arm: {seed: {"result", "history", "dir"}}}."""
    runs: dict[str, dict[int, dict]] = {}
    for p in sorted((root / "runs").glob("*/seed-*/result.json")):
        r = read_json(p)
        if not isinstance(r, dict) or "arm" not in r or "seed" not in r:
            raise BadInput(f"{p}: a run result needs 'arm' and 'seed'")
        runs.setdefault(str(r["arm"]), {})[int(r["seed"])] = {
            "result": r, "history": read_history(p.parent / "history.csv"), "dir": p.parent}
    return runs


def load_not_run(root: Path) -> dict[str, str]:
    """runs/<arm>/not_run.json → {arm: reason}: arms whose train stage ran none of their seeds, and why."""
    out = {}
    for p in sorted((root / "runs").glob(f"*/{NOT_RUN}")):
        r = read_json(p)
        if not isinstance(r, dict) or "arm" not in r or "reason" not in r:
            raise BadInput(f"{p}: a not-run record needs 'arm' and 'reason'")
        out[str(r["arm"])] = str(r["reason"])
    return out


def load_evals(root: Path) -> dict[str, dict[int, dict]]:
    """results/eval/<arm>/seed-<s>/result.json → {arm: {seed: {"mean", "by_domain", "dir"}}}."""
    evals: dict[str, dict[int, dict]] = {}
    for p in sorted((root / "results" / "eval").glob("*/seed-*/result.json")):
        r = read_json(p)
        if not isinstance(r, dict) or "arm" not in r or "seed" not in r or not finite(r.get("test_reward")):
            raise BadInput(f"{p}: an evaluation result needs 'arm', 'seed' and a finite 'test_reward'")
        by_dom = {str(k): float(v) for k, v in (r.get("test_reward_by_domain") or {}).items() if finite(v)}
        evals.setdefault(str(r["arm"]), {})[int(r["seed"])] = {"mean": float(r["test_reward"]), "by_domain": by_dom,
                                                              "dir": p.parent}
    return evals


def values(evals, arm: str, col: str = MEAN_COL) -> dict[int, float]:
    """{seed: test reward} of one arm, overall (``mean``) or for one domain."""
    out = {}
    for seed, e in evals.get(arm, {}).items():
        v = e["mean"] if col == MEAN_COL else e["by_domain"].get(col)
        if v is not None:
            out[seed] = v
    return out


def load_task_samples(eval_dir: Path, domains) -> dict[str, tuple[str, list[float]]] | None:
    """Per-sample test rewards of one evaluation: {task_id: (domain, [reward per sample])}.

    Reads ``per_task.json``: a list of records with ``task_id``, ``domain`` and either ``rewards`` (one
    value per sample) or ``reward`` (one sample; several records of one task are several samples). Only
    tasks of ``domains`` (the domains averaged into test_reward; None = all) are kept. None if the file is
    absent."""
    path = eval_dir / "per_task.json"
    if not path.exists():
        return None
    recs = read_json(path)
    if not isinstance(recs, list):
        raise BadInput(f"{path}: expected a list of per-task records")
    out: dict[str, tuple[str, list[float]]] = {}
    for r in recs:
        if not isinstance(r, dict) or "task_id" not in r:
            raise BadInput(f"{path}: every record needs a 'task_id'")
        if domains is not None and str(r.get("domain")) not in domains:
            continue
        vals = r["rewards"] if isinstance(r.get("rewards"), list) else [r.get("reward")]
        if not all(finite(v) for v in vals):
            raise BadInput(f"{path}: task {r['task_id']}: rewards must be finite numbers, got {vals}")
        out.setdefault(str(r["task_id"]), (str(r["domain"]), []))[1].extend(float(v) for v in vals)
    return out


def task_means(samples: dict[str, tuple[str, list[float]]]) -> dict[str, tuple[str, float]]:
    return {t: (d, float(np.mean(v))) for t, (d, v) in samples.items()}


def mean_of_domain_means(tm: dict[str, tuple[str, float]]) -> float:
    doms: dict[str, list[float]] = {}
    for d, v in tm.values():
        doms.setdefault(d, []).append(v)
    return float(np.mean([np.mean(v) for v in doms.values()])) if doms else math.nan


def load_premise(root: Path) -> dict:
    """The premise gate from results/probe/result.json: ``status`` is "not run" (no file), "holds",
    "does not hold", or "unknown (no premise_holds key)"; ``delta`` holds the mean δ per context that the
    probe reports (``by_mode.<mode>.mean_delta``) for the relevant and shuffled modes."""
    path = root / "results" / "probe" / "result.json"
    out = {"path": "results/probe/result.json", "holds": None, "delta": {}}
    if not path.exists():
        return out | {"status": "not run"}
    r = read_json(path)
    if not isinstance(r, dict):
        raise BadInput(f"{path}: expected a JSON object")
    by_mode = r.get("by_mode") if isinstance(r.get("by_mode"), dict) else {}
    for mode in ("relevant", "shuffled"):
        v = (by_mode.get(mode) or {}).get("mean_delta") if isinstance(by_mode.get(mode), dict) else None
        if finite(v):
            out["delta"][mode] = float(v)
    holds = r.get("premise_holds")
    if not isinstance(holds, bool):
        return out | {"status": "unknown (no premise_holds key)"}
    return out | {"holds": holds, "status": "holds" if holds else "does not hold"}


def load_task_table(evals) -> tuple[dict, list[str]]:
    """Per-sample rewards of every evaluation, {arm: {seed: {task_id: (domain, [samples])}}}, restricted to
    the domains averaged into that evaluation's test_reward, and the problems found: a missing
    per_task.json, or one whose mean of domain means disagrees with result.json (then left out)."""
    table: dict[str, dict[int, dict]] = {}
    problems = []
    for arm, by_seed in evals.items():
        for seed, e in by_seed.items():
            samples = load_task_samples(e["dir"], set(e["by_domain"]) or None)
            if samples is None:
                problems.append(f"{arm}-{seed}: no per_task.json")
                continue
            got = mean_of_domain_means(task_means(samples))
            if not abs(got - e["mean"]) <= 1e-6:
                problems.append(f"{arm}-{seed}: per_task.json gives {got:.6f}, result.json test_reward {e['mean']:.6f}")
                continue
            table.setdefault(arm, {})[seed] = samples
    return table, problems
