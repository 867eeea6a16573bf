"""What a repro that has nothing to do costs, in a workspace where every stage is up to date.

    python bench/noop_repro.py WORKSPACE [--repeats 5]

Times, ``--repeats`` times each, alone: bare ``dvc repro``; ``lopd repro --by-hash`` (the lock guard,
DVC's hashes, the MLflow parent's check; it leaves the stamp); ``lopd repro`` (the stamp of
:mod:`lopd.workflow.stamp` answers). Prints the median and range of each, and fails if any of them
ran a stage (then the workspace was not up to date and the figures would not be a no-op's).
WORKSPACE is a finished run: ``bash bench/pipeline.sh`` keeps one, the smoke fixture's copy is another.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def _time(cmd: list[str], cwd: Path) -> tuple[float, str]:
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True,
                       env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"})
    dt = time.perf_counter() - t
    if r.returncode != 0 or "Running stage" in r.stdout:
        raise SystemExit(f"{' '.join(cmd)} did not find the workspace up to date (rc {r.returncode}):\n"
                         f"{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return dt, r.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workspace", type=Path)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    cases = {"dvc repro": [str(BIN / "dvc"), "repro"],
             "lopd repro --by-hash": [str(BIN / "lopd"), "repro", "--by-hash"],
             "lopd repro (stamped)": [str(BIN / "lopd"), "repro"]}
    n_stages = sum(1 for line in (a.workspace / "dvc.lock").read_text().splitlines()
                   if line.startswith("  ") and not line.startswith("   "))
    print(f"{a.workspace}: {n_stages} stages in dvc.lock; {a.repeats} runs each, alone")
    for name, cmd in cases.items():
        times = []
        for _ in range(a.repeats):
            dt, out = _time(cmd, a.workspace)
            times.append(dt)
        stamped = "nothing DVC reads has changed" in out
        print(f"{name:<24} median {statistics.median(times):6.2f} s  (min {min(times):.2f}, max {max(times):.2f})"
              f"{'  [answered by the stamp]' if stamped else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
