"""Stage ``register``: ``registration/registration.json`` (:mod:`lopd.confirmation.registration`), written
before any confirmatory read. S comes from the search's outputs (val) only; the pilot's test results size
the design (the pilot is exploratory) and choose nothing."""

from __future__ import annotations

import json

from lopd.config import Params
from lopd.errors import BadInput
from lopd.paths import Paths


def _read(path, what: str):
    import yaml

    if not path.exists():
        raise BadInput(f"{path} not found ({what}): run the stage that writes it first")
    text = path.read_text()
    return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)


def run(params: Params, paths: Paths) -> dict:
    from lopd.analysis.constraint import trial_margins
    from lopd.analysis.falsification import Rule
    from lopd.analysis.loading import load_evals, read_csv_rows, values
    from lopd.arms import get_arm
    from lopd.confirmation import registration as regmod
    from lopd.analysis.search_record import Selection
    from lopd.utils import clean_json, sha256_file, write_json

    rp, cp = params.report, params.confirm
    rule = Rule.from_params(rp)
    hpo = paths.hpo
    try:
        selection = Selection.from_json(_read(hpo / "selection.json", "the search's selection"))
    except ValueError as e:
        raise BadInput(f"{hpo / 'selection.json'} is not a selection the hpo stage writes ({e}): rerun the hpo "
                       "stage (dvc repro -f hpo)") from None
    trials = read_csv_rows(hpo / "trials.csv") if (hpo / "trials.csv").exists() else []
    margins = trial_margins(read_csv_rows(hpo / "margin_paths.csv")) if (hpo / "margin_paths.csv").exists() else None
    baselines = _read(hpo / "baselines.yaml", "the baselines' tuning") or {}
    frozen_lr = (baselines.get("lopd_frozen") or {}).get("lr_student")
    own_lr = sorted(a for a in rule.arms() if a != "lopd_frozen" and get_arm(a).trains and a in baselines)
    if own_lr:  # a point records the selected lr and lopd_frozen's own: another tuned arm would train at lopd's
        raise BadInput(f"the rule names {', '.join(own_lr)}, tuned on val over its own knobs (hpo/baselines.yaml), "
                       "but a confirmatory point records only lopd's lr and lopd_frozen's own: compare against "
                       "lopd_frozen and the content controls, or extend the registration's points first")
    if len(cp.seeds) < 2:
        raise BadInput(f"confirm.seeds has {len(cp.seeds)} seed: the rule's paired t-tests need at least 2")
    try:
        points, notes = regmod.points_of_s(selection, trials, margins, frozen_lr, len(cp.slots))
    except KeyError as e:
        raise BadInput(f"hpo/trials.csv has no row for trial {e} that hpo/selection.json names: rerun the hpo stage "
                       "(dvc repro -f hpo)") from None
    if len(points) > len(cp.slots):  # a binding point beside the selected one needs a second slot
        raise BadInput(f"S has {len(points)} points (the selected one and the binding one) but confirm.slots has "
                       f"{len(cp.slots)} slot(s): give it at least {len(points)}")
    # the pilot: the final runs' test results (exploratory), for the design only
    evals = load_evals(paths.root)
    names, contrasts = regmod.pilot_contrasts(rule, {a: values(evals, a) for a in rule.arms()})
    design = regmod.design(names, contrasts, rule=rule, model=rp.design, effect=cp.effect, n_seeds=len(cp.seeds),
                           n_points=len(points), alpha=rp.alpha, power=rp.design.power, upper=rp.design.pilot_upper,
                           n_sim=rp.design.n_sim, n_sim_null=rp.design.n_sim_null)
    mech_arms = ["lopd_binding", *cp.mechanism_controls]
    mechanism = regmod.mechanism_part(points, list(cp.mechanism_controls), alpha=rp.alpha, effect=cp.effect,
                                      n_seeds=len(cp.seeds), upper=rp.design.pilot_upper, n_sim=rp.design.n_sim,
                                      pilot_by_seed={a: values(evals, a) for a in mech_arms})
    cmanifest = _read(paths.confirm_split / "manifest.json", "the confirmatory split's manifest")
    arms = rule.arms()
    reg = {"rule": {"text": rp.rule.text, "treatment": rule.treatment, "gain_over": list(rule.gain_over),
                    "content_controls": list(rule.content_controls), "rho": rule.rho, "rho_baseline": rule.rho_baseline,
                    "alpha": rule.alpha, "primary": "the two-part rule on per-seed contrasts averaged over S with "
                                                    "equal weights", "labels": _labels()},
           "points": points, "notes": notes,
           "arms": {"trained": [a for a in arms if get_arm(a).trains], "shared": [a for a in arms if not get_arm(a).trains]},
           "seeds": list(cp.seeds), "effect": cp.effect, "design": design,
           "confirm_split": {"manifest_sha256": sha256_file(paths.confirm_split / "manifest.json"),
                             "sha256": cmanifest["file"]["sha256"], "n": cmanifest["file"]["n"]},
           "efficiency": regmod.efficiency_part(params, baselines, points), "mechanism": mechanism,
           "inputs": {str(p.relative_to(paths.root)): sha256_file(p) for p in
                      (hpo / "selection.json", hpo / "trials.csv", hpo / "margin_paths.csv", hpo / "baselines.yaml")
                      if p.exists()}}
    reg["shared_runs"] = regmod.shared_runs(reg)
    reg = regmod.seal(clean_json(reg))  # sealed as written: write_json would clean it too
    _refuse_earlier_reads(paths, reg)
    write_json(paths.registration, reg)
    print(f"registered {paths.registration.relative_to(paths.root)} sha256 {reg['sha256'][:16]}…: S = "
          + ", ".join(f"{p['name']} trial {p['trial']} ({p['role']})" for p in points)
          + f"; {len(cp.seeds)} seeds; power at effect {cp.effect:g}: primary "
          + (f"{design['power_primary']:.2f}, robust {design['power_robust']:.2f}" if "why" not in design else design["why"])
          + ("; H2 " + (mechanism["why"] if "why" in mechanism else f"at {mechanism['point']}: lopd > "
                        + ", ".join(mechanism["controls"]))))
    return reg


def _refuse_earlier_reads(paths: Paths, reg: dict) -> None:
    """A confirmation no registration could have tuned: :class:`BadInput` (exit 2, nothing written) naming every
    earlier read of the ledger (``registration/ledger.yaml``, committed) that shares this split or a seed with
    ``reg`` under another registration (:func:`lopd.confirmation.ledger.earlier_reads`). No ledger: no earlier
    read on record (a workspace outside the repository)."""
    import hashlib

    from lopd.confirmation import ledger

    path = paths.root / ledger.LEDGER
    if not path.exists():
        return
    split_md5 = hashlib.md5((paths.confirm_split / "manifest.json").read_bytes()).hexdigest()
    earlier = ledger.earlier_reads(ledger.load(path), reg["sha256"], split_md5, reg["seeds"])
    if earlier:
        raise BadInput("this confirmation would not be fresh: " + "; ".join(earlier) + f" ({path}). Choose "
                       "confirm.seeds no registration has read and a split none has read (confirm.split_round + 1)")


def _labels() -> dict:
    from lopd.analysis.confirmation import LABEL_TEXT

    return dict(LABEL_TEXT)
