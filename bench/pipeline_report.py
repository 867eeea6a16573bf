"""Where a pipeline's time went, from the side files every stage writes under ``.lopd/timing/``.

    python bench/pipeline_report.py WORKSPACE WALL_SECONDS

Prints: start-up summed over processes (process start → stage work begins: interpreter, imports,
model load; with the warm worker, its one-time imports are counted as well), CPU time in the stages'
work as a share of cores × wall time, and wall time per stage kind.
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from pathlib import Path


def main(ws: Path, wall: float) -> None:
    rows = [json.loads(p.read_text()) for p in sorted((ws / ".lopd" / "timing").glob("*.json"))]
    stages = [r for r in rows if r["kind"] != "warm-worker"]
    workers = [r for r in rows if r["kind"] == "warm-worker"]
    startup = sum(max(0.0, r["t_work"] - r["t_process"]) for r in stages)
    worker_imports = sum(r["cpu_startup"] for r in workers)
    cpu_work = sum(r["cpu_work"] for r in stages)
    cores = os.cpu_count() or 1
    print(f"stages timed: {len(stages)} ({sum(r.get('warm', False) for r in stages)} forked from the warm worker)")
    print(f"start-up summed over stage processes: {startup:.1f} s ({100 * startup / wall:.1f}% of wall)")
    print(f"warm worker one-time imports: {worker_imports:.1f} s CPU in {len(workers)} worker(s)")
    print(f"CPU in stage work: {cpu_work:.0f} s = {100 * cpu_work / (cores * wall):.0f}% of {cores} cores x wall")
    by_kind: dict[str, list[float]] = defaultdict(list)
    for r in stages:
        by_kind[r["kind"]].append(r["t_end"] - r["t_work"])
    print("wall time per stage kind (work only):")
    for kind, ts in sorted(by_kind.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {kind:12s} {len(ts):4d} x  total {sum(ts):7.1f} s  mean {sum(ts) / len(ts):6.1f} s")


if __name__ == "__main__":
    main(Path(sys.argv[1]), float(sys.argv[2]))
