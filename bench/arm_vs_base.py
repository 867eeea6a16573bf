"""Paired test-reward difference of every arm against ``base``, per domain and overall.

    python bench/arm_vs_base.py [WORKSPACE]      (default: this checkout)

Reads ``results/eval/{arm}-{seed}/result.json`` of a finished ``dvc repro`` (the run directory that
``bash bench/pipeline.sh`` keeps, or this checkout after ``make repro``) and prints, for each arm,
``arm − base`` over the seeds both have: mean difference, Student-t 95% CI of the paired
differences, two-sided p (``lopd.analysis.stats.paired_t``). Exploratory: no multiplicity
correction (``reports/comparisons.md`` has the Holm-corrected comparisons against ``lopd``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv: list[str]) -> int:
    from lopd.analysis.stats import paired_t

    root = Path(argv[0]) if argv else REPO
    runs: dict[str, dict[int, dict]] = {}
    for f in sorted((root / "results" / "eval").glob("*/result.json")):
        r = json.loads(f.read_text())
        runs.setdefault(r["arm"], {})[int(r["seed"])] = r
    if "base" not in runs:
        print(f"no base evaluations under {root / 'results' / 'eval'}", file=sys.stderr)
        return 2
    domains = sorted(next(iter(runs["base"].values()))["test_reward_by_domain"])
    print(f"arm - base, paired over shared seeds ({root})")
    for arm, by_seed in runs.items():
        if arm == "base":
            continue
        seeds = sorted(set(by_seed) & set(runs["base"]))
        cells = []
        for dom in [None, *domains]:
            def val(r):
                return r["test_reward"] if dom is None else r["test_reward_by_domain"][dom]
            d = paired_t([val(by_seed[s]) for s in seeds], [val(runs["base"][s]) for s in seeds])
            cells.append(f"{dom or 'mean'} {d['diff']:+.4f} [{d['ci_low']:+.4f}, {d['ci_high']:+.4f}] p={d['p']:.2g}")
        print(f"  {arm:15s} n={len(seeds):2d}  " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
