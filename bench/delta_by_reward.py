"""δ of each teacher condition on the student's own val rollouts, split by the rollout's reward
and domain: which rollouts the outcome weights r(τ) of Δ(φ) let in, and what the teacher says there.

    python bench/delta_by_reward.py <run dir>   (a run with models/base, models/bank,
                                                 models/cold_start and hpo/best_params.yaml)

Per (condition, domain, reward): the token mean of δ_t = log π_T(y_t | s_t, c) − log π_S(y_t | s_t)
over the policy tokens of those rollouts, and how many rollouts. The probe's Δ is the
r-weighted mean of these rows (lopd.analysis.probe.per_task_delta), so a negative row with r > 0
pulls it down. Rollouts: the probe's own (lopd.training.cold_start.probe_batch), 2 samples per val task.
"""

from __future__ import annotations

import collections
import os
import sys
from pathlib import Path


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__)
        return 2
    run = Path(argv[0]).resolve()
    os.chdir(run)
    import yaml

    from lopd.training.cold_start import probe_batch
    from lopd.config import load_params
    from lopd.model.composer import Composer
    from lopd.paths import Paths
    from lopd.stages.common import load_resources
    from lopd.training.checkpoint import load_tensors_verified

    params = load_params("params.yaml")
    paths = Paths(run)
    best = yaml.safe_load((paths.hpo / "best_params.yaml").read_text())
    res = load_resources(params, paths, role="probe")
    comp = Composer(res.bb, res.k_max)
    comp.load_state(load_tensors_verified(paths.cold_start / "phi0.safetensors"))
    ev = params.evaluate
    kw = dict(max_new_tokens=ev.max_new_tokens, max_len=params.model.max_seq_len, greedy=ev.greedy,
              temperature=ev.temperature)
    conds = ("relevant", "shuffled", "text")
    rewards: dict = {c: [] for c in ("student", *conds)}
    deltas: dict = {c: [] for c in conds}
    tasks = res.val_tasks
    domain = {t.task_id: t.domain for t in tasks}
    for s in range(2):
        for b0 in range(0, len(tasks), ev.batch_size):
            probe_batch(res.bb, comp, res.bank, res.envs, res.task_emb, tasks[b0:b0 + ev.batch_size], K=best["K"],
                        n_ret=best["n_ret"], sample=s, seed=0, rollout_kw=kw, rewards=rewards, deltas=deltas)
    print(f"K={best['K']} n_ret={best['n_ret']}; token-mean δ (rollouts) by condition, domain, reward")
    for c, rows in deltas.items():
        acc = collections.defaultdict(lambda: [0.0, 0.0, 0])
        for task, r, dsum, n in rows:
            a = acc[(domain[task], round(r, 2))]
            a[0], a[1], a[2] = a[0] + dsum, a[1] + n, a[2] + 1
        print(f"  {c:9s}", "  ".join(f"{d} r={r}: {v[0] / max(v[1], 1):+.3f} ({v[2]})" for (d, r), v in sorted(acc.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
