"""Plot data: long-format CSV files under ``reports/plots/``, one row per measurement.

The same files feed ``dvc plots`` (declared in ``dvc.yaml``, see :func:`plot_declarations`, with the
custom Vega-Lite templates in ``.dvc/plots/``) and the PNG figures of the Markdown reports
(:mod:`lopd.analysis.figures` reads them back from disk).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import yaml

from lopd.analysis import dose
from lopd.analysis.loading import num, read_csv_rows
from lopd.analysis.render import arm_order
from lopd.arms import ARMS
from lopd.utils import write_csv

PLOTS_DIR = "plots"
#: Arms whose margin constraint is active (β, margin flags) and arms whose dynamics are plotted.
MARGIN_ARMS = tuple(a for a, s in ARMS.items() if s.margin)
DYNAMICS_ARMS = tuple(a for a, s in ARMS.items() if s.margin or (s.context == "latent" and s.train_composer))
EFFICIENCY_ARMS = ("lopd", "grpo", "opsd_text")
SENSITIVITY_AXES = ("margin", "K", "n_ret")

#: file -> columns; the column order is the CSV header.
COLUMNS = {
    "learning_curves": ["step", "arm", "seed", "val_reward"],
    "margin_dynamics": ["step", "arm", "seed", "delta_phi", "beta", "margin_sat_frac"],
    "efficiency": ["rollouts_used", "arm", "seed", "val_reward"],
    "sensitivity": ["param", "value", "seed", "source", "val_reward"],
    "margin_dose": dose.COLUMNS,
}
#: dvc plots: id -> (file, x, y, template, title). Templates live in .dvc/plots/<template>.json.
PLOT_SPECS = {
    "learning_curves": ("learning_curves", "step", "val_reward", "arm_band",
                        "Validation reward per step (mean over seeds, band min-max)"),
    "delta_phi": ("margin_dynamics", "step", "delta_phi", "arm_band", "Privilege margin Delta(phi) per step"),
    "beta": ("margin_dynamics", "step", "beta", "arm_band", "Dual variable beta per step"),
    "margin_sat_frac": ("margin_dynamics", "step", "margin_sat_frac", "arm_band",
                        "Fraction of supervised tokens with delta >= m, per step"),
    "efficiency": ("efficiency", "rollouts_used", "val_reward", "arm_band",
                   "Validation reward vs rollouts used (mean over seeds, band min-max)"),
    "sensitivity": ("sensitivity", "value", "val_reward", "param_facet",
                    "Validation reward vs m, K, n_ret (grid mean, search trials as points)"),
    "margin_dose": ("margin_dose", "margin", "val_reward", "arm_band",
                    "Validation reward vs margin m, one line per eta_beta; reference arms flat"),
}


def csv_path(out: Path, name: str) -> Path:
    return out / PLOTS_DIR / f"{name}.csv"


def plot_declarations(report_dir: str = "reports") -> list[dict]:
    """The ``plots:`` entries of dvc.yaml for :data:`PLOT_SPECS` (top-level plot definitions)."""
    return [{pid: {"template": tpl, "x": x, "y": {f"{report_dir}/{PLOTS_DIR}/{f}.csv": y}, "title": title}}
            for pid, (f, x, y, tpl, title) in PLOT_SPECS.items()]


def _run_rows(runs, arms, xcol: str, ycols: list[str]) -> list[dict]:
    rows = []
    for arm in arm_order(a for a in runs if a in arms):
        for seed in sorted(runs[arm]):
            hist = runs[arm][seed]["history"]
            if xcol not in hist:
                continue
            cols = {c: hist.get(c, np.full(hist[xcol].shape, np.nan)) for c in ycols}
            for i in np.argsort(hist[xcol], kind="stable"):
                x, ys = hist[xcol][i], {c: cols[c][i] for c in ycols}
                if math.isfinite(x) and any(math.isfinite(v) for v in ys.values()):
                    rows.append({xcol: int(x) if float(x).is_integer() else x, "arm": arm, "seed": seed, **ys})
    return rows


def sensitivity_rows(root: Path) -> list[dict]:
    """One-at-a-time grid runs (results/sensitivity/grid.csv) and COMPLETE search trials (hpo/trials.csv)."""
    rows = []
    for r in read_csv_rows(root / "results" / "sensitivity" / "grid.csv"):
        axis = r.get("axis")
        x, y = num(r.get(axis)), num(r.get("val_reward"))
        if axis in SENSITIVITY_AXES and x is not None and y is not None:
            rows.append({"param": axis, "value": x, "seed": r.get("seed"), "source": "grid", "val_reward": y})
    for t in read_csv_rows(root / "hpo" / "trials.csv"):
        if (t.get("state") or "").upper() != "COMPLETE" or num(t.get("value")) is None:
            continue
        for axis in SENSITIVITY_AXES:
            if num(t.get(axis)) is not None:
                rows.append({"param": axis, "value": num(t[axis]), "seed": None, "source": "search",
                             "val_reward": num(t["value"])})
    return rows


def write_plot_data(out: Path, root: Path, runs) -> dict[str, int]:
    """Write every CSV of :data:`COLUMNS` (header only when there is no data); returns rows per file."""
    tables = {
        "learning_curves": _run_rows(runs, set(runs), "step", ["val_reward"]),
        "margin_dynamics": _run_rows(runs, DYNAMICS_ARMS, "step", ["delta_phi", "beta", "margin_sat_frac"]),
        "efficiency": _run_rows(runs, EFFICIENCY_ARMS, "rollouts_used", ["val_reward"]),
        "sensitivity": sensitivity_rows(root),
        "margin_dose": dose.dose_rows(root),
    }
    for name, rows in tables.items():
        write_csv(csv_path(out, name), rows, COLUMNS[name])
    return {k: len(v) for k, v in tables.items()}


def read_plot_csv(out: Path, name: str) -> list[dict]:
    """A plot CSV back from disk, numbers as floats (None where empty)."""
    return [{c: (r[c] if c in ("arm", "param", "source", "status") else num(r[c])) for c in COLUMNS[name]}
            for r in read_csv_rows(csv_path(out, name))]


def curves(rows: list[dict], x: str, y: str, arm: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per seed of ``arm``: (x, y) arrays where y was measured, sorted by x."""
    by_seed: dict = {}
    for r in rows:
        if r["arm"] == arm and r[x] is not None and r[y] is not None:
            by_seed.setdefault(r["seed"], {})[r[x]] = r[y]
    out = []
    for _, d in sorted(by_seed.items()):
        xs = np.array(sorted(d), dtype=float)
        out.append((xs, np.array([d[k] for k in sorted(d)], dtype=float)))
    return out


def selected_point(root: Path) -> dict:
    """The search's selection (hpo/best_params.yaml), {} if absent."""
    path = root / "hpo" / "best_params.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
