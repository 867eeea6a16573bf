"""The margin constraint's status in one run, and each search trial's: pure functions over margin paths
(step, β, Δ(φ)). The search (:mod:`lopd.hpo.study`: which trial ``lopd_binding`` trains at) and the report
(``margin_dynamics.md``, ``search.md``) classify runs with the same code."""

from __future__ import annotations

import math

import numpy as np


def _value(v) -> float:
    """A CSV cell (or a float) as a float; nan where it is empty or not a number."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


# Binding of the constraint over the last quarter of training (see ``constraint_status``). Δ(φ) is a per-step
# minibatch estimate and dual ascent answers every step of it, so the rule counts shares of steps and compares
# window means, never one step: one noisy dip of Δ below m lifts β for a step or two and must not decide the status.
BAND_FRAC, BAND_FLOOR = 0.25, 0.01
"""Band around m: Δ(φ) "stays at m" if its last-quarter mean is within ``band(m) = max(0.25·|m|, 0.01)`` nats.
Dual ascent makes Δ oscillate around m, so a relative band is needed; 25% separates "held at m" from "well off m"
for the margins in use (0.005–0.2), and the 0.01-nat floor keeps the band non-empty at m = 0 (and near it)."""
BETA_ZERO = 1e-3
"""ε: β ≤ 1e-3 counts as zero (with η_β = 0.5 that is one dual step's push from a 0.002-nat shortfall of Δ)."""
SHARE = 0.9
"""A property holds "over the window" if it holds on at least 90% of its steps (β > ε, or β ≤ ε)."""
DRIFT_FRAC = 0.2
"""β is level if its fitted change across the window is ≤ max(0.2·mean β, ε). A pure ramp from 0 changes by
2/7 ≈ 0.29 of its window mean over the last quarter, so a ramp is never level."""
STATUSES = ("binds", "slack", "degenerates", "unsettled", "too short", "no m")


def constraint_band(m: float) -> float:
    return max(BAND_FRAC * abs(m), BAND_FLOOR)


def _tail_window(hist: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(steps, Δ, β) of the last quarter of the steps where step, Δ and β are all finite (steps ≥ s0 +
    0.75·(s1 − s0), as ``beta_flags``), sorted by step; and the number of such steps in the whole run."""
    if not all(k in hist for k in ("step", "delta_phi", "beta")):
        return np.array([]), np.array([]), np.array([]), 0
    st, d, b = (np.asarray(hist[k], dtype=float) for k in ("step", "delta_phi", "beta"))
    ok = np.isfinite(st) & np.isfinite(d) & np.isfinite(b)
    order = np.argsort(st[ok], kind="stable")
    st, d, b = st[ok][order], d[ok][order], b[ok][order]
    if st.size == 0:
        return st, d, b, 0
    tail = st >= st[0] + 0.75 * (st[-1] - st[0])
    return st[tail], d[tail], b[tail], int(st.size)


def constraint_status(hist: dict[str, np.ndarray], m: float | None) -> dict:
    """Whether the margin constraint binds over the last quarter of steps (window as ``beta_flags``; steps
    where step, Δ(φ) or β is nan are dropped first). With ``band = constraint_band(m)``, ``mean_delta`` the
    window-mean Δ, ``mean_beta`` the window-mean β, ``active`` the share of window steps with β > ε
    (``BETA_ZERO``) and ``beta_change`` the least-squares slope of β × the window's step span:

    - ``binds``: active ≥ SHARE, |beta_change| ≤ max(DRIFT_FRAC·mean_beta, ε) (β level) and |mean_delta − m| ≤ band;
    - ``slack``: 1 − active ≥ SHARE (β ≈ 0 on nearly every step) and mean_delta ≥ m − band (the margin holds
      without pressure);
    - ``degenerates``: active ≥ SHARE, β rising (slope > 0, beyond the level tolerance) and mean_delta < m − band:
      Δ stays well below m and dual ascent only ramps β (while β > 0 its rise is η_β·Σ(m − Δ), a ramp);
    - ``unsettled``: none of these (``reason`` says what is off);
    - ``too short``: < 3 usable steps in the run or < 2 in the window; ``no m``: m unknown.
    The four classes are mutually exclusive (binds and degenerates part on the band, slack on the share)."""
    st, d, b, n = _tail_window(hist)
    out = {"status": "too short", "reason": "", "m": m, "band": None, "n_window": int(st.size), "mean_delta": None,
           "mean_beta": None, "active": None, "beta_first": None, "beta_last": None, "beta_slope": None,
           "beta_change": None}
    if n < 3 or st.size < 2:
        return out | {"reason": f"{n} usable steps, {st.size} in the last quarter (need ≥ 3 and ≥ 2)"}
    slope = float(np.polyfit(st, b, 1)[0])
    out |= {"mean_delta": float(np.mean(d)), "mean_beta": float(np.mean(b)), "active": float(np.mean(b > BETA_ZERO)),
            "beta_first": float(b[0]), "beta_last": float(b[-1]), "beta_slope": slope,
            "beta_change": slope * float(st[-1] - st[0])}
    if m is None or not math.isfinite(m):
        return out | {"status": "no m", "reason": "margin m unknown"}
    out |= {"m": float(m), "band": constraint_band(float(m))}
    return out | _classify(out)


def _classify(c: dict) -> dict:
    """The status (and, for ``unsettled``, what is off) of a ``constraint_status`` window summary."""
    m, band, md, ch, active = c["m"], c["band"], c["mean_delta"], c["beta_change"], c["active"]
    tol = max(DRIFT_FRAC * abs(c["mean_beta"]), BETA_ZERO)
    level, rising, in_band = abs(ch) <= tol, ch > tol, abs(md - m) <= band
    if active >= SHARE and level and in_band:
        return {"status": "binds", "reason": ""}
    if 1.0 - active >= SHARE and md >= m - band:
        return {"status": "slack", "reason": ""}
    if active >= SHARE and rising and md < m - band:
        return {"status": "degenerates", "reason": ""}
    off = []
    if 1.0 - active >= SHARE:
        off.append(f"β ≈ 0 but mean Δ {md:.4f} < m − band {m - band:.4f}")
    elif active < SHARE:
        off.append(f"β > {BETA_ZERO:g} on {active:.0%} of the window (neither ≥ {SHARE:.0%} nor ≤ {1 - SHARE:.0%})")
    elif not level:
        off.append(f"β still {'rising' if ch > 0 else 'falling'} (change {ch:+.4g} > tolerance {tol:.4g})")
    if not in_band and active >= SHARE:
        off.append(f"mean Δ {md:.4f} {'above' if md > m else 'below'} m ± {band:.4f}")
    return {"status": "unsettled", "reason": "; ".join(off)}


def trial_margins(rows: list[dict]) -> dict[str, dict]:
    """Per trial (its number as a string): m, each seed's constraint status, the largest Δ(φ) any seed reached,
    β at the end (mean over seeds), β's fitted rise per step, and the β path (mean over seeds at each step)."""
    by: dict[str, dict[str, dict[str, list]]] = {}
    for r in rows:
        m = _value(r.get("margin"))
        run = by.setdefault(str(r["trial"]), {}).setdefault(str(r["seed"]), {
            "m": m if math.isfinite(m) else None, "step": [], "beta": [], "delta_phi": []})
        for k in ("step", "beta", "delta_phi"):
            run[k].append(_value(r.get(k)))
    out = {}
    for trial, seeds in by.items():
        hists = [{k: np.asarray(v, dtype=float) for k, v in run.items() if k != "m"} for run in seeds.values()]
        m = next(iter(seeds.values()))["m"]
        steps = hists[0]["step"]
        betas = np.vstack([h["beta"] for h in hists]) if len({h["step"].size for h in hists}) == 1 else None
        path = np.nanmean(betas, axis=0) if betas is not None else hists[0]["beta"]
        ok = np.isfinite(path) & np.isfinite(steps)
        deltas = np.concatenate([h["delta_phi"] for h in hists])
        out[trial] = {"m": m, "status": [constraint_status(h, m)["status"] for h in hists],
                      "max_delta": float(np.nanmax(deltas)) if np.isfinite(deltas).any() else None,
                      "beta_final": float(path[ok][-1]) if ok.any() else None,
                      "beta_per_step": float(np.polyfit(steps[ok], path[ok], 1)[0]) if ok.sum() >= 2 else None,
                      "steps": steps[ok].tolist(), "beta_path": path[ok].tolist()}
    return out
