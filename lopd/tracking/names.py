"""Names a person can scan in the MLflow UI: run names that say what a run is, and the DVC
experiment a run belongs to (tags ``dvc.exp_name``, ``dvc.rev``).

Run names (``·`` separates the parts)::

    lucky-dove @ 22197f6 · params 3fa2c1d0     the experiment parent (DVC experiment, commit, params hash)
    trial 3 · m=0.05 K=8 n_ret=3 lr=0.002       a search trial (with `` · seed 1001`` when a trial trains several)
    baseline grpo · lr=0.002 · seed 1000        a baseline's learning-rate tuning run
    sensitivity · margin=0.2 · seed 1           a sensitivity grid run (the axis varied and its value)
    lopd · seed 4                               a final training run;  evaluate · lopd · seed 4: its test run
"""

from __future__ import annotations

import os

DVC_EXP_TAG, DVC_REV_TAG = "dvc.exp_name", "dvc.rev"
# each history column's MLflow metric name (namespaced, so the UI groups the training signals)
HISTORY_METRICS = {"rollouts_used": "train/rollouts_used", "reward": "train/reward", "loss": "train/loss",
                   "kd_loss": "train/kd_loss", "tail_mass": "train/tail_mass", "n_supervised": "train/n_supervised",
                   "delta_phi": "margin/delta_phi", "beta": "margin/beta", "margin_sat_frac": "margin/sat_frac",
                   "anchor": "phi/anchor", "val_reward": "val/reward"}
WORKSPACE = "workspace"  # what `dvc exp show` calls results not saved as an experiment


def dvc_experiment(commit: str) -> dict[str, str]:
    """The DVC experiment this process runs in: ``DVC_EXP_NAME`` and ``DVC_EXP_BASELINE_REV``, which
    ``dvc exp run`` sets for every stage command; a plain ``dvc repro`` (or a stage run by hand)
    writes to the workspace at ``commit``."""
    return {DVC_EXP_TAG: os.environ.get("DVC_EXP_NAME") or WORKSPACE,
            DVC_REV_TAG: os.environ.get("DVC_EXP_BASELINE_REV") or commit}


def _num(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def point_label(point: dict) -> str:
    """``m=0.05 K=8 n_ret=3 lr=0.002 η_β=5``: the keys of a search point that ``point`` holds."""
    short = {"margin": "m", "K": "K", "n_ret": "n_ret", "lr_student": "lr", "eta_beta": "η_β"}
    return " ".join(f"{label}={_num(point[k])}" for k, label in short.items() if k in point)


def parent_run(exp_name: str, commit: str, params_hash: str) -> str:
    return f"{exp_name} @ {commit[:7]} · params {params_hash[:8]}"


def trial_run(number: int, point: dict, seed: int | None = None) -> str:
    return f"trial {number} · {point_label(point)}" + (f" · seed {seed}" if seed is not None else "")


def baseline_run(arm: str, value: float, seed: int, knob: str = "lr_student") -> str:
    name = {"lr_student": "lr", "beta_fixed": "β"}.get(knob, knob)
    return f"baseline {arm} · {name}={_num(value)} · seed {seed}"


def sensitivity_run(axis: str, value, seed: int) -> str:
    return f"sensitivity · {axis}={_num(value)} · seed {seed}"


def dose_run(point: dict, seed: int) -> str:
    """A run of the margin's dose-response: ``sensitivity · m=0.05 η_β=50 · seed 2000``."""
    return f"sensitivity · {point_label({k: point[k] for k in ('margin', 'eta_beta')})} · seed {seed}"


def reference_run(arm: str, seed: int) -> str:
    """A reference arm's run beside the sensitivity grid: ``sensitivity · lopd_frozen · seed 2000``."""
    return f"sensitivity · {arm} · seed {seed}"


def final_run(arm: str, seed: int) -> str:
    return f"{arm} · seed {seed}"


def evaluate_run(arm: str, seed: int) -> str:
    return f"evaluate · {arm} · seed {seed}"
