"""PNG figures for the Markdown reports, drawn from the plot CSVs under ``reports/plots/`` (the files
``dvc plots`` reads), read back from disk. Agg canvas only: no pyplot global state."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from lopd.analysis import stats as st
from lopd.analysis.dynamics import aggregate
from lopd.analysis.plotdata import DYNAMICS_ARMS, EFFICIENCY_ARMS, SENSITIVITY_AXES, curves, read_plot_csv
from lopd.analysis.render import arm_order
from lopd.utils import atomic_write_bytes

COLORS = {
    "base": "#7f7f7f", "sft": "#8c564b", "grpo": "#d62728", "opsd_text": "#ff7f0e", "lopd_frozen": "#bcbd22",
    "lopd_nomargin": "#9467bd", "lopd": "#1f77b4", "lopd_ramp": "#aec7e8", "lopd_fixbeta": "#393b79",
    "lopd_binding": "#8c6d31", "lopd_shuffled": "#2ca02c", "lopd_unrelated": "#17becf",
    "lopd_nocontent": "#e377c2",
}
CONTROL_STYLE = {"lopd_shuffled": ":", "lopd_unrelated": ":", "lopd_nocontent": ":", "base": "--", "sft": "--",
                 "grpo": "--", "opsd_text": "--", "lopd_nomargin": "--"}


def save_fig(fig: Figure, path: Path) -> None:
    """Atomic PNG write through the Agg canvas."""
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    atomic_write_bytes(path, buf.getvalue())


def _band(ax, agg: dict, label: str, color, *, marker: str | None = None, ls: str = "-") -> None:
    ax.plot(agg["x"], agg["mean"], color=color, label=label, lw=1.8, marker=marker, ms=3.5, ls=ls)
    if np.nanmax(agg["n"]) > 1:
        ax.fill_between(agg["x"], agg["min"], agg["max"], color=color, alpha=0.2, lw=0)


def _placeholder(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=10, color="0.3", wrap=True)


def _finish_reward_axes(fig: Figure, ax, xlabel: str, title: str, path: Path, **legend_kw) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel("validation reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=9, frameon=False, **legend_kw)
    fig.tight_layout()
    save_fig(fig, path)


def _arm_aggs(rows: list[dict], x: str, y: str, arms) -> dict[str, tuple[dict, int]]:
    out = {}
    for arm in arms:
        cs = curves(rows, x, y, arm)
        agg = aggregate(cs)
        if agg is not None:
            out[arm] = (agg, len(cs))
    return out


def learning_curves_png(out: Path) -> None:
    rows = read_plot_csv(out, "learning_curves")
    fig = Figure(figsize=(9, 5.5))
    ax = fig.subplots()
    for arm, (agg, n) in _arm_aggs(rows, "step", "val_reward", arm_order({r["arm"] for r in rows})).items():
        if agg["x"].size == 1:  # evaluation-only arm (base): one validation point -> horizontal reference
            ax.axhline(agg["mean"][0], color=COLORS.get(arm), ls="-.", lw=1.5, label=f"{arm} (n={n}, not trained)")
            if agg["n"][0] > 1:
                ax.axhspan(agg["min"][0], agg["max"][0], color=COLORS.get(arm), alpha=0.12, lw=0)
            continue
        _band(ax, agg, f"{arm} (n={n})", COLORS.get(arm), marker="o", ls=CONTROL_STYLE.get(arm, "-"))
    if not ax.lines:
        _placeholder(ax, "MISSING: no validation rewards in history.csv")
    _finish_reward_axes(fig, ax, "training step", "Learning curves: mean over seeds, band = min–max",
                        out / "figures" / "learning_curves.png", loc="center left", bbox_to_anchor=(1.01, 0.5))


def margin_dynamics_png(out: Path, m: float | None) -> None:
    rows = read_plot_csv(out, "margin_dynamics")
    fig = Figure(figsize=(16, 4.6))
    axes = fig.subplots(1, 3)
    panels = [("delta_phi", "Δ(φ) (teacher privilege margin)"), ("beta", "β (dual variable)"),
              ("margin_sat_frac", "margin-satisfaction fraction")]
    for ax, (col, ylabel) in zip(axes, panels):
        for arm, (agg, n) in _arm_aggs(rows, "step", col, DYNAMICS_ARMS).items():
            _band(ax, agg, f"{arm} (n={n})", COLORS.get(arm), ls="--" if arm == "lopd_nomargin" else "-")
        ax.set_xlabel("training step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    if m is not None:
        axes[0].axhline(m, color="k", ls="--", lw=1.2, label=f"margin m = {m:g}")
    if not rows:
        for ax in axes:
            _placeholder(ax, "MISSING: no history.csv for\nthe margin arms")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False, fontsize=10,
                   bbox_to_anchor=(0.5, -0.06))
    fig.suptitle("Margin dynamics: mean over seeds, band = min–max across seeds")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    save_fig(fig, out / "figures" / "margin_dynamics.png")


def efficiency_png(out: Path, eff: dict) -> None:
    rows = read_plot_csv(out, "efficiency")
    fig = Figure(figsize=(7.5, 5))
    ax = fig.subplots()
    for arm, (agg, n) in _arm_aggs(rows, "rollouts_used", "val_reward", EFFICIENCY_ARMS).items():
        _band(ax, agg, f"{arm} (n={n})", COLORS.get(arm), marker="o")
    if eff.get("target") is not None:
        ax.axhline(eff["target"], color=COLORS["grpo"], ls=":", lw=1.2,
                   label=f"GRPO final val reward = {eff['target']:.3f}")
        if eff.get("reached") and eff.get("x", 0) > 0:
            ax.axvline(eff["x"], color=COLORS["lopd"], ls=":", lw=1.2,
                       label=f"lopd reaches it at {eff['x']:.0f} rollouts")
    if not rows:
        _placeholder(ax, "MISSING: no validation curves for " + " / ".join(EFFICIENCY_ARMS))
    _finish_reward_axes(fig, ax, "rollouts used", "Sample efficiency: mean over seeds, band = min–max",
                        out / "figures" / "efficiency.png", loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)


def sensitivity_png(out: Path, best: dict) -> dict:
    """Grid means ± t 95% CI and search trials per axis; the selected value (hpo/best_params.yaml) as a line."""
    rows = read_plot_csv(out, "sensitivity")
    fig = Figure(figsize=(15, 4.5))
    axes = fig.subplots(1, 3)
    labels = {"margin": "margin m", "K": "K (latent tokens)", "n_ret": "n_ret (retrieved trajectories)"}
    points: dict[str, dict] = {}
    for ax, axis in zip(axes, SENSITIVITY_AXES):
        trials = [(r["value"], r["val_reward"]) for r in rows if r["param"] == axis and r["source"] == "search"]
        if trials:
            ax.scatter(*zip(*trials), s=18, color="0.5", alpha=0.35, label="search trials (COMPLETE)", zorder=1)
        groups: dict[float, list[float]] = {}
        for r in rows:
            if r["param"] == axis and r["source"] == "grid":
                groups.setdefault(r["value"], []).append(r["val_reward"])
        if groups:
            gx = sorted(groups)
            sums = [st.summarize(groups[x]) for x in gx]
            halves = [s["ci_half"] if np.isfinite(s["ci_half"]) else 0.0 for s in sums]
            ns = "/".join(map(str, sorted({s["n"] for s in sums})))
            ax.errorbar(gx, [s["mean"] for s in sums], yerr=halves, fmt="o-", color=COLORS["lopd"], capsize=4, lw=1.8,
                        zorder=3, label=f"one-at-a-time grid: mean ± t 95% CI (n={ns} seeds)")
            points[axis] = {str(x): s["mean"] for x, s in zip(gx, sums)}
        sel = best.get(axis)
        if isinstance(sel, (int, float)) and not isinstance(sel, bool):
            ax.axvline(float(sel), color="k", ls=":", lw=1.2, label="selected by the search (hpo/best_params.yaml)")
        ax.set_title(f"{axis}: selected {sel}" if sel is not None else f"{axis}: no selected value "
                     "(hpo/best_params.yaml missing)", fontsize=10)
        if not trials and not groups:
            _placeholder(ax, f"MISSING: no sensitivity grid\nnor search trials for {axis}")
        ax.set_xlabel(labels[axis])
        ax.set_ylabel("validation reward")
        ax.grid(alpha=0.3)
    handles: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=len(handles), frameon=False,
                   fontsize=9, bbox_to_anchor=(0.5, -0.04))
    fig.suptitle("Sensitivity of validation reward to m, K, n_ret (one at a time around the selected point)")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    save_fig(fig, out / "figures" / "sensitivity.png")
    return points


STATUS_MARKERS = {"binds": "o", "slack": "s", "degenerates": "^", "unsettled": "x", "too short": ".", "": "."}


def margin_dose_png(out: Path, info: dict) -> None:
    """Val reward against m (log-scaled past 0 with a linear stretch near it), one line per η_β, each point's
    marker its runs' majority constraint status; the reference arms as horizontal lines with their CI bands."""
    fig = Figure(figsize=(8, 5))
    ax = fig.subplots()
    lines, refs = info["lines"], info["references"]
    cmap = [COLORS.get("lopd", "C0"), "C1", "C2", "C3", "C4", "C5", "C6"]
    for i, (eta, by_m) in enumerate(lines.items()):
        ms = sorted(by_m)
        ax.plot(ms, [by_m[m]["mean"] for m in ms], "-", color=cmap[i % len(cmap)], lw=1.5, label=f"lopd η_β = {eta:g}")
        for m in ms:
            sts = by_m[m]["statuses"]
            top = max(dict.fromkeys(sts), key=sts.count) if sts else ""
            ax.errorbar([m], [by_m[m]["mean"]], yerr=[by_m[m]["ci_half"] or 0.0], fmt=STATUS_MARKERS.get(top, "."),
                        color=cmap[i % len(cmap)], ms=7, capsize=3)
    for j, (arm, r) in enumerate(refs.items()):
        color = COLORS.get(arm, f"C{7 + j}")
        ax.axhline(r["mean"], color=color, ls="--", lw=1.2, label=f"{arm} (n={r['n']})")
        if r["ci_half"]:
            ax.axhspan(r["mean"] - r["ci_half"], r["mean"] + r["ci_half"], color=color, alpha=0.1)
    for status, mk in STATUS_MARKERS.items():
        if status:
            ax.plot([], [], mk, color="0.3", label=f"status: {status}")
    if not lines:
        _placeholder(ax, "MISSING: no margin runs in results/sensitivity/grid.csv")
    elif any(m > 0 for by_m in lines.values() for m in by_m):
        ax.set_xscale("symlog", linthresh=min(m for by_m in lines.values() for m in by_m if m > 0))
    _finish_reward_axes(fig, ax, "margin m (nats per token)",
                        "Margin dose-response on val: mean ± t 95% CI over seeds; marker = majority status",
                        out / "figures" / "margin_dose.png", loc="upper left", bbox_to_anchor=(1.01, 1.0))
