"""Paired pilot contrasts of the margin arms (lopd_binding and lopd against lopd_frozen, lopd_nomargin, lopd_ramp,
lopd_fixbeta) from a workspace's results/eval: python bench/margin_contrasts.py WORKSPACE."""
import sys
from pathlib import Path

from lopd.analysis import stats as st
from lopd.analysis.loading import load_evals, values

root = Path(sys.argv[1])
ev = load_evals(root)
for arm in sorted(ev):
    s = st.summarize(list(values(ev, arm).values()))
    print(f"{arm:15s} n={s['n']} mean {s['mean']:.3f} ± {s['ci_half']:.3f}")
for a, b in [("lopd_binding", "lopd_frozen"), ("lopd_binding", "lopd_nomargin"), ("lopd_binding", "lopd_ramp"),
             ("lopd_binding", "lopd_fixbeta"), ("lopd_binding", "lopd"), ("lopd", "lopd_frozen"), ("lopd", "lopd_ramp"),
             ("lopd", "lopd_fixbeta"), ("lopd", "lopd_nomargin")]:
    va, vb = values(ev, a), values(ev, b)
    seeds = sorted(set(va) & set(vb))
    if not seeds:
        print(f"{a} - {b}: no shared seeds"); continue
    r = st.paired_t([va[s] for s in seeds], [vb[s] for s in seeds])
    print(f"{a} - {b}: {r['diff']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] p = {r['p']:.2g} (n = {len(seeds)})")
