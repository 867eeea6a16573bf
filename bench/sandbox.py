"""Wall time of one sandboxed program run (fork a confined child, define the code, three calls,
finish), the unit of cost of scoring a code rollout.

    python bench/sandbox.py [--runs 40] [--tree PATH ...]

``--tree`` times the ``lopd`` package of another checkout as well (e.g. ``git archive <rev> lopd |
tar -x -C /tmp/old``), alternating trees run by run, each in its own process, so both see the same
machine. Prints the median and the minimum over ``--runs`` runs per tree.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CODE = "def f(x):\n    return x * 13 + 2\n"
CHILD = """
import sys, time
sys.path.insert(0, sys.argv[1])
from lopd import sandbox
code, runs = {code!r}, int(sys.argv[2])
sandbox.run_calls(code, "f", [[1]])  # warm: the isolation probe and the fork server start once per process
for _ in range(runs):
    t = time.perf_counter()
    r = sandbox.run_calls(code, "f", [[1], [2], [3]], timeout_s=2.0)
    assert r.status == "ok" and r.outputs == [15, 28, 41], r
    print((time.perf_counter() - t) * 1000)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--tree", action="append", default=[], help="another checkout's root (holding lopd/)")
    a = ap.parse_args()
    trees = [str(REPO), *a.tree]
    times: dict[str, list[float]] = {t: [] for t in trees}
    for _ in range(max(1, a.runs // 10)):  # alternate trees in rounds of 10 runs
        for t in trees:
            out = subprocess.run([sys.executable, "-c", CHILD.format(code=CODE), t, "10"], check=True,
                                 capture_output=True, text=True).stdout
            times[t] += [float(x) for x in out.split()]
    for t, ms in times.items():
        print(f"{t}: {len(ms)} runs, median {statistics.median(ms):.1f} ms, min {min(ms):.1f} ms per program")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
