"""Seeds the confirmation's registered design needs, over registered effects and sizes of S.

    python bench/design_seeds.py [--workdir DIR] [--effects 0.04 0.05 0.06] [--points 1 2 3]

From a pipeline directory's pilot (``results/eval``: the rule's per-seed contrasts, as stage ``register``
reads them) and its ``params.yaml``: for each effect and number of points of S, the seeds for
``report.design.power`` of the primary and of the robust label (points taken as independent), by
:func:`lopd.confirmation.registration.design`, exactly as ``register`` computes them. What a smaller
confirmation would cost in what it can detect.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", type=Path, default=Path("."))
    ap.add_argument("--effects", type=float, nargs="+", default=[0.04, 0.05, 0.06])
    ap.add_argument("--points", type=int, nargs="+", default=[1, 2, 3])
    args = ap.parse_args()

    import lopd.confirmation.registration as regmod
    from lopd.analysis.falsification import Rule
    from lopd.analysis.loading import load_evals, values
    from lopd.config import load_params

    params = load_params(args.workdir / "params.yaml")
    rp = params.report
    rule = Rule.from_params(rp)
    evals = load_evals(args.workdir)
    names, contrasts = regmod.pilot_contrasts(rule, {a: values(evals, a) for a in rule.arms()})
    print(f"pilot: {contrasts.shape[0]} seeds, tests {', '.join(names)}; power {rp.design.power:.0%}, "
          f"covariance at its {rp.design.pilot_upper:.0%} upper bound, {rp.design.n_sim} experiments per figure")
    print(f"{'effect':>7} {'points':>6} {'seeds (primary)':>16} {'seeds (robust)':>15}")
    for effect in args.effects:
        for n_points in args.points:
            d = regmod.design(names, contrasts, rule=rule, model=rp.design, effect=effect,
                              n_seeds=len(params.confirm.seeds), n_points=n_points,
                              alpha=rp.alpha, power=rp.design.power, upper=rp.design.pilot_upper,
                              n_sim=rp.design.n_sim, n_sim_null=100)
            print(f"{effect:>7g} {n_points:>6} {str(d['seeds_needed_primary']):>16} {str(d['seeds_needed_robust']):>15}")


if __name__ == "__main__":
    main()
