"""Sample efficiency on the confirmatory split, at the registered checkpoints (``registration.json``:
``efficiency``), read back from ``confirm/eval``.

lopd at S's selected point kept its student after each registered step; the baseline (GRPO, at its values tuned
on val) trained on the same confirmation seeds, kept at the same steps. Each student was evaluated on the
confirmatory split, which the search never read. lopd's curve per seed: the base policy at 0 rollouts (every
student starts from it: its zero-initialised adapters leave the base's outputs as they are), each checkpoint at
the rollouts it had used, the run's own student at the end. The ratio is :func:`lopd.analysis.dynamics.curve_ratio`'s:
the rollouts lopd's mean curve needs to first reach GRPO's final mean reward over GRPO's mean total rollouts,
with and without the experience bank's base rollouts.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from lopd.analysis import stats as st
from lopd.analysis.dynamics import PAPER_EFFICIENCY_CLAIM, curve_ratio, ratio_text
from lopd.errors import BadInput

EVAL_DIR = Path("confirm") / "eval"


def load_curves(root: Path, reg: dict) -> dict:
    """``{arm: {seed: [(rollouts, reward), ...]}}`` for the efficiency arm (at its point) and the baseline, from 0
    rollouts (base, the same seed) to the final student, in rollout order; results of another registration
    are skipped."""
    eff = reg["efficiency"]
    where = {eff["arm"]: eff["point"], eff["baseline"]: "shared"}

    def read(d: Path) -> dict | None:  # None: absent, or evaluated under another registration
        f = d / "result.json"
        r = json.loads(f.read_text()) if f.exists() else {}
        return r if r.get("registration") == reg["sha256"] else None

    base = {}
    for s in reg["seeds"]:
        r = read(root / EVAL_DIR / "shared" / "base" / f"seed-{s}")
        if r is not None:
            base[s] = float(r["test_reward"])
    curves: dict = {}
    for arm, point in where.items():
        for s in reg["seeds"]:
            d = root / EVAL_DIR / point / arm / f"seed-{s}"
            got = [read(d / "snapshots" / f"step-{t}") for t in eff["steps"]] + [read(d)]  # the checkpoints, the end
            if any(r is None for r in got) or s not in base:
                continue
            rows = [(0.0, base[s])] + [(float(r["rollouts_used"]), float(r["test_reward"])) for r in got]
            if any(b[0] <= a[0] for a, b in zip(rows, rows[1:])):
                raise BadInput(f"{d}: the efficiency checkpoints' rollouts are not increasing: {rows}")
            curves.setdefault(arm, {})[s] = rows
    return curves


def confirm_efficiency(root: Path, reg: dict | None, n_boot: int, *, min_bootstrap_seeds: int,
                       confidence: float = st.DESCRIPTIVE_CONFIDENCE) -> dict | None:
    """The registered efficiency measurement (None: not registered). ``missing``: what is absent."""
    if reg is None or not reg.get("efficiency"):
        return None
    eff = reg["efficiency"]
    curves = load_curves(root, reg)
    out = {"registered": eff, "curves": curves,
           "missing": [a for a in (eff["arm"], eff["baseline"]) if not curves.get(a)]}
    if out["missing"]:
        return out
    lopd, base = curves[eff["arm"]], curves[eff["baseline"]]
    grids = {tuple(x for x, _ in rows) for rows in lopd.values()}
    if len(grids) != 1:
        raise BadInput(f"lopd's efficiency checkpoints differ in rollouts across seeds ({sorted(grids)}): one grid "
                       "is needed for the mean curve")
    grid = np.array(next(iter(grids)))
    Y = np.array([[y for _, y in rows] for _, rows in sorted(lopd.items())])
    finals = np.array([rows[-1][1] for _, rows in sorted(base.items())])
    total = float(np.mean([rows[-1][0] for rows in base.values()]))
    return out | curve_ratio(grid, Y, finals, total, n_boot, confidence, min_bootstrap_seeds=min_bootstrap_seeds,
                             bank_rollouts=int(eff["bank_rollouts"]))


def render_confirm_efficiency(ce: dict | None, n_boot: int, confidence: float = st.DESCRIPTIVE_CONFIDENCE) -> list[str]:
    """The confirmatory section of ``efficiency.md`` (its first)."""
    md = ["## On the confirmatory split (registered)", ""]
    if ce is None:
        return md + ["Not registered (`confirm.efficiency_baseline: null`, or no registration): the ratio below, on "
                     "val, is the only one, and val is the split the search selected on.", ""]
    e = ce["registered"]
    md += [f"Registered before the confirmatory split was read (`registration.json`, part `efficiency`): "
           f"{e['arm']} at {e['point']} keeps its student after step{'s' if len(e['steps']) > 1 else ''} "
           f"{', '.join(map(str, e['steps']))} and its last; "
           f"{e['baseline']} trains on the same {len(ce.get('curves', {}).get(e['baseline'], {})) or '?'} confirmation "
           f"seeds at its values tuned on val ({', '.join(f'{k} = {v}' for k, v in e['baseline_hparams'].items())}). "
           "Each student is evaluated on the confirmatory split, which the search never read. lopd's curve starts "
           "at the base policy (0 rollouts).", ""]
    if ce["missing"]:
        return md + ["MISSING: confirmatory efficiency evaluations of " + ", ".join(ce["missing"]) + ".", ""]
    lopd = ce["curves"][e["arm"]]
    grid = [x for x, _ in next(iter(lopd.values()))]
    mean_l = np.mean([[y for _, y in r] for r in lopd.values()], axis=0)
    base_rows = list(ce["curves"][e["baseline"]].values())
    mean_b = np.mean([[y for _, y in r] for r in base_rows], axis=0)
    grid_b = np.mean([[x for x, _ in r] for r in base_rows], axis=0)
    md += ["| rollouts | " + " | ".join(f"{x:.0f}" for x in grid) + " |",
           "|---|" + "---|" * len(grid),
           f"| {e['arm']} (mean of {len(lopd)} seeds) | " + " | ".join(f"{v:.3f}" for v in mean_l) + " |",
           f"| {e['baseline']} (mean of {len(base_rows)} seeds; at rollouts "
           + ", ".join(f"{x:.0f}" for x in grid_b) + ") | " + " | ".join(f"{v:.3f}" for v in mean_b) + " |", ""]

    r = ratio_text
    lo, hi = ce.get("ci", (None, None))
    lob, hib = ce.get("ci_with_bank", (None, None))
    ci = "" if lo is None else f", {confidence:.0%} CI [{r(lo)}, {r(hi)}]"
    cib = "" if lob is None else f", {confidence:.0%} CI [{r(lob)}, {r(hib)}]"
    md += [f"- {e['baseline']}'s final confirmatory reward (mean of {ce['n_grpo']} seeds): {ce['target']:.4f}; its "
           f"rollouts: {ce['grpo_total']:.0f}"]
    if not ce["reached"]:
        md += [f"- **lopd's mean curve never reaches it** within {ce['lopd_max_rollouts']:.0f} rollouts: no ratio. "
               f"The < {PAPER_EFFICIENCY_CLAIM:.0%} claim is not supported here.", ""]
        return md
    if ce["x"] <= 0:
        md += [f"- **Degenerate (0 / {ce['grpo_total']:.0f})**: {e['baseline']}'s final reward is at or below the "
               "base policy's, where every curve starts; this cannot test the efficiency claim.", ""]
        return md
    md += [f"- **Ratio without the bank: {r(ce['ratio'])}**{ci} ({ce['x']:.0f} / {ce['grpo_total']:.0f} rollouts)",
           f"- **Ratio counting the bank: {r(ce['ratio_with_bank'])}**{cib} (({ce['x']:.0f} + {ce['bank_rollouts']}) / "
           f"{ce['grpo_total']:.0f}: the bank's base rollouts on train, which {e['baseline']} does not need)"]
    if ce.get("ci_note"):
        md.append(f"- {ce['ci_note']}")
    ok = hi is not None and math.isfinite(hi) and hi < PAPER_EFFICIENCY_CLAIM
    md.append(f"- The < {PAPER_EFFICIENCY_CLAIM:.0%} claim, without the bank, is "
              f"{'consistent with' if ok else 'NOT established by'} this measurement (the upper CI bound must be "
              f"below {PAPER_EFFICIENCY_CLAIM:.2f}).")
    md += ["", f"Percentile bootstrap over both arms' seeds ({n_boot} resamples); lopd's curve is interpolated "
           "linearly between the registered checkpoints, so a crossing between two of them is an interpolation.", ""]
    return md
