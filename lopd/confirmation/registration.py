"""``registration.json``: what the confirmation tests, fixed before its split is read.

The ``register`` stage writes it from val-only artifacts (the search: ``hpo/selection.json``,
``hpo/trials.csv``, ``hpo/margin_paths.csv``, ``hpo/baselines.yaml``) and the
pilot's test results (allowed: the pilot is exploratory; they size the design, they never choose a point):

* the rule (``report.rule``), its primary form and labels (:mod:`lopd.analysis.confirmation`);
* S (:func:`points_of_s`): the selected trial, the trials tied with it by seed, the best trial whose margin
  binds; distinct points only, capped at ``len(confirm.slots)``;
* the arms, the fresh seeds and the smallest effect of interest;
* the design (:func:`design`): power of the primary and of the robust label at these seeds, from the pilot's
  per-seed contrast covariance inflated to its ``report.design.pilot_upper`` upper bound, and the seeds each
  would need; the procedure's false-claim rates (global null, each least favourable boundary) and power,
  by simulating it under the project's binary-reward model (:mod:`lopd.analysis.procedure`);
* the efficiency curve (:func:`efficiency_part`): the checkpoints at which the selected point's lopd keeps its
  student, the arm it is measured against and that arm's values tuned on val, the bank's rollouts;
* the SHA-256 of each part and of the whole (:func:`seal`). :func:`load` refuses a file whose hashes do not
  match: ``confirm_train`` and ``confirm_evaluate`` read S and the seeds from it, and the report prints
  its hash first.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from lopd.errors import BadInput

if TYPE_CHECKING:
    from lopd.analysis.falsification import Rule
    from lopd.analysis.search_record import Selection
    from lopd.config import Params
    from lopd.config.report import DesignParams


PARTS = ("rule", "points", "arms", "seeds", "effect", "design", "confirm_split", "efficiency", "mechanism",
         "shared_runs")


def _h(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _same_point(a: dict, b: dict) -> bool:
    keys = ("margin", "K", "n_ret", "lr_student") + (("eta_beta",) if "eta_beta" in a and "eta_beta" in b else ())
    return all(float(a[k]) == float(b[k]) for k in keys)


def points_of_s(selection: Selection, trials: list[dict], margins: dict | None,
                frozen_lr: float | None, cap: int) -> tuple[list[dict], list[str]]:
    """S, from the search's outputs only (val). Candidates: the selected trial; every trial tied with it by
    seed (``selection.tied``, the seed-aware tie test), by val rank (mean val reward over the confirmation
    seeds, then trial number); the best trial whose margin binds (``selection.binding_point``, if any). A trial whose point
    (m, K, n_ret, lr, η_β) equals one already in S is a duplicate, not a new point. The selected point is always
    in S; the binding point, when one exists, takes a slot (it is the only test of a margin that binds);
    ties fill the rest by val rank up to ``cap``.

    Each point: name ``p<i>``, trial, role, the val value and seeds it rests on, m, K, n_ret, lr_student,
    ``eta_beta`` (where the search searched it; else the final runs' ``train.eta_beta`` applies), ``lr_frozen``
    (lopd_frozen's own tuned lr; the point's lr if lopd_frozen was not tuned), and its margin status on val (the statuses of its search runs). Also returns notes on what was left out and why."""
    by_number = {int(float(r["number"])): r for r in trials}
    intervals = selection.intervals or {}

    def value(n: int) -> tuple[float, int]:
        if str(n) in intervals:
            return float(intervals[str(n)]["mean"]), len((selection.per_seed or {}).get(str(n), []))
        return float(by_number[n]["value"]), 0

    def point(n: int, role: str) -> dict:
        r = by_number[n]
        v, k = value(n)
        m = (margins or {}).get(str(n)) or {}
        p = {"trial": n, "role": role, "val_value": v, "val_seeds": k, "margin": float(r["margin"]),
             "K": int(float(r["K"])), "n_ret": int(float(r["n_ret"])), "lr_student": float(r["lr_student"]),
             "margin_status": sorted(set(m.get("status") or [])) or None, "max_delta": m.get("max_delta")}
        if r.get("eta_beta") not in (None, ""):
            p["eta_beta"] = float(r["eta_beta"])
        p["lr_frozen"] = float(frozen_lr) if frozen_lr is not None else p["lr_student"]
        return p

    notes: list[str] = []
    sel = int(selection.selected)
    chosen = [point(sel, "selected")]
    tied = sorted((int(n) for n in selection.tied if int(n) != sel), key=lambda n: (-value(n)[0], n))
    bind = None
    binding = selection.binding_point
    if binding is not None and binding.trial is not None:
        bind = point(int(binding.trial), "binding")
        if _same_point(bind, chosen[0]):
            chosen[0]["role"] = "selected, binding"
            bind = None
    room = cap - 1 - (bind is not None)
    for n in tied:
        p = point(n, "tied")
        dup = next((q for q in chosen if _same_point(p, q)), None)
        if dup is not None:
            notes.append(f"trial {n} is tied but repeats trial {dup['trial']}'s point: not a new point")
        elif room <= 0:
            notes.append(f"trial {n} is tied (val {p['val_value']:.4f}) but S is full (cap {cap}): left out by val rank")
        elif bind is not None and _same_point(p, bind):
            notes.append(f"trial {n} is tied and is the binding point")
        else:
            chosen.append(p)
            room -= 1
    if bind is not None:
        chosen.append(bind)
    elif not (binding is not None and binding.trial is not None) and cap > 1:
        notes.append("no trial's margin binds: S has no binding point"
                     + (f" ({binding.reason})" if binding is not None and binding.reason else ""))
    for i, p in enumerate(chosen):
        p["name"] = f"p{i}"
    return chosen, notes


def pilot_contrasts(rule, pilot_by_seed: dict) -> tuple[list[str], np.ndarray]:
    """The rule's per-seed contrasts in the pilot, on the seeds every test shares: (test names, n × k)."""
    from lopd.analysis.falsification import analyse

    fal = analyse(rule, pilot_by_seed)
    rows = fal["tests"]
    if any(r["n"] < 2 for r in rows):
        return [r["name"] for r in rows], np.zeros((0, len(rows)))
    common = sorted(set.intersection(*(set(r["seeds"]) for r in rows)))
    return [r["name"] for r in rows], np.array([[r["contrast"][r["seeds"].index(s)] for r in rows] for s in common])


def _robust_power(mean, cov, n: int, n_points: int, alpha: float, n_sim: int) -> float:
    from lopd.analysis.power import joint_power

    # every point's rule rejects; points taken as independent, a lower bound when their contrasts
    # correlate positively (they share seeds, draws and base)
    return joint_power(mean, cov, n, alpha=alpha, n_sim=n_sim) ** n_points


def design(names: list[str], contrasts: np.ndarray, *, rule: Rule, model: DesignParams, effect: float, n_seeds: int,
           n_points: int, alpha: float, power: float, upper: float, n_sim: int, n_sim_null: int,
           max_n: int = 200) -> dict:
    """The confirmation's design.

    Sizing, from the pilot: the covariance Σ̂ of the rule's per-seed contrasts, inflated to its one-sided
    ``upper`` bound as a variance (× (n − 1)/χ²_{1−upper, n−1}), every contrast's mean at ``effect``,
    multivariate normal contrasts:

    * primary power: the rule on the contrasts averaged over S; the average's covariance is taken as Σ_u
      itself (points perfectly correlated: the average gains nothing), which does not overstate it;
    * robust power: the rule at every one of ``n_points`` points, points taken as independent (a lower bound
      for positively correlated points);
    * seeds each needs for ``power`` (None: more than ``max_n``).

    The procedure itself (:func:`lopd.analysis.procedure.procedure_rates`, ``n_sim_null`` experiments per
    scenario): the amended ``rule`` at ``n_seeds`` seeds and ``n_points`` points under the project's
    binary-reward model (``model`` = ``report.design``: tasks shared by every arm and seed, a bank and φ0 draw
    per seed shared by the points, one base run shared by every point), its false-claim rates
    (``false_claim``: the global null and each least favourable boundary, for the primary and the robust
    label) and its power at ``effect`` (``procedure_power``), each k of n with a Clopper–Pearson 95%
    interval; ``procedure`` says what was simulated."""
    from lopd.analysis.power import joint_power, joint_seeds_needed, variance_upper_factor
    from lopd.analysis.procedure import procedure_rates
    from lopd.analysis.stats import min_sign_flip_p

    if rule.alpha != alpha:
        raise ValueError(f"the rule's alpha {rule.alpha} is not the design's alpha {alpha}")
    n = contrasts.shape[0]
    if n < 3:
        return {"why": "the pilot has fewer than 3 seeds shared by every test of the rule"}
    cov = np.atleast_2d(np.cov(contrasts, rowvar=False))
    factor = variance_upper_factor(n, upper)
    cov_u = cov * factor
    k = len(names)
    mean = np.full(k, float(effect))
    out = {"pilot_n": n, "tests": names, "sd": np.sqrt(np.diag(cov)).tolist(),
           "sd_upper": np.sqrt(np.diag(cov_u)).tolist(), "factor": factor, "upper": upper, "effect": float(effect),
           "n_seeds": n_seeds, "n_points": n_points, "alpha": alpha, "power_target": power, "n_sim": n_sim,
           "max_n": max_n,
           "power_primary": joint_power(mean, cov_u, n_seeds, alpha=alpha, n_sim=n_sim),
           "power_robust": _robust_power(mean, cov_u, n_seeds, n_points, alpha, n_sim),
           "seeds_needed_primary": joint_seeds_needed(mean, cov_u, alpha=alpha, power=power, max_n=max_n)}
    robust_n = None
    if _robust_power(mean, cov_u, max_n, n_points, alpha, n_sim) >= power:
        lo, hi = next(n for n in range(2, 64) if min_sign_flip_p(n) < alpha), max_n  # the floor, as for the primary
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if _robust_power(mean, cov_u, mid, n_points, alpha, n_sim) >= power else (mid + 1, hi)
        robust_n = lo
    out["seeds_needed_robust"] = robust_n
    out["n_sim_null"] = n_sim_null
    out.update(procedure_rates(rule, model, n_points=n_points, n_seeds=n_seeds, effect=effect, n_exp=n_sim_null))
    return out


MECHANISM_TEXT = ("H2, the paper's mechanism: at S's binding point (the best val trial whose margin binds), lopd "
                  "beats each control trained at that point on the same fresh seeds; one-sided paired t-tests at "
                  "alpha on the per-seed mean confirmatory test reward, all must reject (intersection-union). A "
                  "registered negative is a finding.")


def mechanism_part(points: list[dict], controls: list[str], *, pilot_by_seed: dict, alpha: float, effect: float,
                   n_seeds: int, upper: float, n_sim: int) -> dict:
    """H2's registration: {"why"} when it is not registered (no controls, or S has no binding point), else the
    point, the treatment (lopd at that point), the controls, α, the text and its design: the power of H2 (every
    test rejects) at ``n_seeds`` seeds with every contrast at ``effect``, the pilot's covariance of
    lopd_binding − control (each control at its own pilot point: a sizing figure, not a test) inflated to its
    one-sided ``upper`` bound as :func:`design` does."""
    from lopd.analysis.falsification import Rule
    from lopd.analysis.power import joint_power, variance_upper_factor

    if not controls:
        return {"why": "confirm.mechanism_controls is empty: H2 is not registered"}
    bind = next((p for p in points if "binding" in p["role"]), None)
    if bind is None:
        return {"why": "S has no binding point (no search trial's margin binds in enough of its seeds on val): H2 "
                       "is not registered"}
    mech = {"point": bind["name"], "trial": bind["trial"], "treatment": "lopd", "controls": list(controls),
            "alpha": alpha, "text": MECHANISM_TEXT}
    names, contrasts = pilot_contrasts(Rule("", "lopd_binding", tuple(controls), (), None, "base", alpha),
                                       pilot_by_seed)
    n = contrasts.shape[0]
    if n < 3:
        mech["design"] = {"why": "the pilot has fewer than 3 seeds shared by lopd_binding and every control"}
        return mech
    factor = variance_upper_factor(n, upper)
    cov_u = np.atleast_2d(np.cov(contrasts, rowvar=False)) * factor
    mech["design"] = {"pilot_n": n, "tests": names, "sd_upper": np.sqrt(np.diag(cov_u)).tolist(), "upper": upper, "effect": effect,
                      "n_seeds": n_seeds, "n_sim": n_sim,
                      "power": joint_power(np.full(len(names), float(effect)), cov_u, n_seeds, alpha=alpha,
                                           n_sim=n_sim)}
    return mech


def efficiency_part(params: Params, baselines: dict, points: list[dict]) -> dict | None:
    """What the efficiency curve on the confirmatory split registers (None: ``confirm.efficiency_baseline`` is
    null): lopd at S's selected point keeps its student after each of ``confirm.efficiency_fractions``' steps (and its
    last step's is the run's own); the baseline trains at slot 0 on the confirmation seeds at its values tuned on
    val (``hpo/baselines.yaml``), kept at the same steps; the experience bank's base rollouts (train tasks ×
    ``bank.rollouts_per_task``: one seed's bank draw) that LOPD retrieves from and the baseline does not need."""
    cp = params.confirm
    if cp.efficiency_baseline is None:
        return None
    b = baselines.get(cp.efficiency_baseline)
    if not b:
        raise BadInput(f"confirm.efficiency_baseline {cp.efficiency_baseline!r} was not tuned on val (hpo/baselines.yaml "
                       "has no entry for it): add it to hpo.searched_arms or hpo.baseline_arms, or set "
                       "confirm.efficiency_baseline: null")
    knobs = b.get("knobs") or [b["knob"]]
    return {"arm": "lopd", "point": points[0]["name"], "baseline": cp.efficiency_baseline,
            "baseline_hparams": {k: b[k] for k in knobs}, "steps": cp.efficiency_steps(params.train.run_steps()),
            "bank_rollouts": params.envs.n_train * len(params.envs.domains) * params.bank.rollouts_per_task}


def slot_arms(reg: dict, slot: int) -> list[str]:
    """The arms trained at ``slot`` (``confirm_train@slot``, and evaluated by ``confirm_evaluate``): the rule's
    trained arms; at slot 0 also the shared ones (base) and the efficiency baseline (not point-dependent); at H2's
    point (the binding point) also H2's controls."""
    extra = [*reg["arms"]["shared"], *([reg["efficiency"]["baseline"]] if reg.get("efficiency") else [])]
    arms = [*reg["arms"]["trained"], *(a for a in dict.fromkeys(extra) if a not in reg["arms"]["trained"] and slot == 0)]
    mech = reg.get("mechanism") or {}
    points = reg.get("points") or []
    if mech.get("point") and slot < len(points) and mech["point"] == points[slot]["name"]:
        arms += [a for a in mech["controls"] if a not in arms]  # H2's controls at the binding point
    return arms


def snapshot_steps(reg: dict, point_name: str, arm: str) -> list[int]:
    """The registered efficiency checkpoints at which ``arm`` at point ``point_name`` keeps its student: the
    efficiency baseline's (at every point: it is trained once, at slot 0) and lopd's at the efficiency point; []
    for every other run."""
    eff = reg.get("efficiency") or {}
    if arm == eff.get("baseline") or (arm == eff.get("arm") and point_name == eff.get("point")):
        return list(eff["steps"])
    return []


def point_hparams(reg: dict, point: dict, arm: str) -> dict:
    """The hyper-parameters registration ``reg`` fixes for ``arm`` at ``point``: the point's, or the efficiency
    baseline's own tuned values; and the efficiency checkpoints where it registers them (``snapshot_steps``)."""
    eff = reg.get("efficiency") or {}
    if arm == eff.get("baseline"):
        hp = dict(eff["baseline_hparams"])
    else:
        hp = {k: point[k] for k in ("margin", "K", "n_ret", "lr_student", "eta_beta") if k in point}
        if arm == "lopd_frozen":
            hp["lr_student"] = point["lr_frozen"]
    steps = snapshot_steps(reg, point["name"], arm)
    return {**hp, "snapshot_steps": tuple(steps)} if steps else hp


def shared_runs(reg: dict) -> dict[str, dict[str, str]]:
    """No run trained twice: ``{point: {arm: earlier point}}`` for each arm whose runs at a point would read exactly
    what its runs at an earlier point of S read (:func:`point_hparams` less the arm's
    :meth:`~lopd.arms.ArmSpec.unread_coordinates`; the seeds and each seed's draw are the same at every point), e.g.
    lopd_frozen at two points that differ only in m or η_β. Such a run is trained and evaluated once, at the earlier
    point, and counts at both."""
    from lopd.arms import get_arm

    first: dict[str, str] = {}
    out: dict[str, dict[str, str]] = {}
    for slot, point in enumerate(reg["points"]):
        for arm in slot_arms(reg, slot):
            spec = get_arm(arm)
            if not spec.trains or arm in reg["arms"]["shared"]:
                continue  # base: one run for every point already
            hp = point_hparams(reg, point, arm)
            read = {k: v for k, v in hp.items() if k not in spec.unread_coordinates()}
            key = json.dumps({"arm": arm, **read}, sort_keys=True, default=list)
            if key in first:
                out.setdefault(point["name"], {})[arm] = first[key]
            else:
                first[key] = point["name"]
    return out


def trained_at(reg: dict, slot: int) -> list[str]:
    """The arms ``confirm_train@slot`` trains and ``confirm_evaluate`` evaluates there: :func:`slot_arms` less the
    runs an earlier point already trains (``reg["shared_runs"]``)."""
    shared = (reg.get("shared_runs") or {}).get(reg["points"][slot]["name"], {}) if slot < len(reg["points"]) else {}
    return [a for a in slot_arms(reg, slot) if a not in shared]


def seal(reg: dict) -> dict:
    """``reg`` with ``hashes`` (SHA-256 of each part's canonical JSON) and ``sha256`` (of everything else)."""
    body = {k: v for k, v in reg.items() if k not in ("hashes", "sha256")}
    body["hashes"] = {p: _h(body.get(p)) for p in PARTS}
    return {**body, "sha256": _h(body)}


def load(path: Path) -> dict:
    """The registration, its hashes checked; :class:`BadInput` if it is absent or altered."""
    if not path.exists():
        raise BadInput(f"{path} not found: the confirmation is not registered (run the register stage first: "
                       "dvc repro register); no confirmatory stage runs without it")
    try:
        reg = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise BadInput(f"{path} is corrupt: {e}") from None
    if not isinstance(reg, dict) or seal(reg).get("sha256") != reg.get("sha256"):
        raise BadInput(f"{path} does not match its own hashes: it was altered after registration "
                       "(rerun the register stage: dvc repro -f register)")
    return reg
