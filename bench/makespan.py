"""The design's critical path and its estimated wall time on N workers of this size, from a run's recorded
stage times (``.lopd/timing/``) and DVC's stage graph (``lopd/launch/makespan.py`` says what it models).

    python bench/makespan.py WORKSPACE [--workers 1 2 4 16 64] [--top 12] [--seconds FILE.json]

WORKSPACE: a pipeline directory that ran (``bash bench/pipeline.sh`` leaves one; ``bash bench/launch.sh``
prints this estimate for its serial smoke run beside the real ``lopd launch``), or a checkout with
``--seconds``: a JSON object of seconds per stage address (``train@lopd``) or per stage kind (``train``), used
for every stage the workspace has no timing file for (``bench/default_design_seconds.json``: the default
design's stage times as ``docs/benchmarks.md`` records them). Prints the stages timed, the critical path stage
by stage, and the estimate per worker count.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    from lopd.launch.makespan import critical_path, list_schedule, stage_seconds
    from lopd.launch.plan import read_plan

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workspace")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 16, 64])
    ap.add_argument("--top", type=int, default=12, help="critical-path stages to list (the longest first)")
    ap.add_argument("--overhead", type=float, nargs="+", default=[0.0],
                    help="seconds added to every stage: a job's start-up outside its process (0: the floor)")
    ap.add_argument("--seconds", default=None, help="JSON: seconds per stage address or kind, for untimed stages")
    a = ap.parse_args()
    ws = Path(a.workspace).resolve()
    seconds = stage_seconds(ws / ".lopd" / "timing")
    plan = read_plan(ws, [])
    if a.seconds:
        import json

        given = {k: float(v) for k, v in json.loads(Path(a.seconds).read_text()).items() if not k.startswith("_")}
        for n, job in plan.jobs.items():
            if n not in seconds and (n in given or job.kind in given):
                seconds[n] = given.get(n, given.get(job.kind))
    upstream = {n: tuple(u for u in j.upstream if u in plan.jobs) for n, j in plan.jobs.items()}
    missing = sorted(set(upstream) - set(seconds))
    print(f"stages in the graph: {len(upstream)}; timed: {len(upstream) - len(missing)}"
          + (f"; untimed (counted 0 s): {', '.join(missing[:8])}{' …' if len(missing) > 8 else ''}" if missing else ""))
    length, path = critical_path(seconds, upstream)
    print(f"critical path: {length:.0f} s over {len(path)} stages")
    for s in sorted(path, key=lambda s: -seconds.get(s, 0.0))[:a.top]:
        print(f"  {s:28s} {seconds.get(s, 0.0):8.1f} s")
    print(f"{'overhead s':>10} {'workers':>8} {'estimate s':>11} {'min':>7} {'speed-up':>9}")
    for oh in a.overhead:
        one = list_schedule(seconds, upstream, 1, oh)
        for w in a.workers:
            span = list_schedule(seconds, upstream, w, oh)
            print(f"{oh:>10g} {w:>8} {span:>11.0f} {span / 60:>7.1f} {one / span if span else 0:>8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
