"""What scoring a code rollout costs: one sandboxed program's phases, and a batch of programs on a pool.

    python bench/scoring.py [--runs 60] [--batch 80] [--workers 1 2 4 8]

Per program (one after another, ``--runs`` of them, three calls each as ``bench/sandbox.py``): the median
wall time of each phase of :class:`lopd.sandbox.Session` as the parent sees it — ``spawn`` (payload
pipes, the fork server's round trip, the payload queued), ``ready`` (the child's
confinement, audit hook and the definition of the code), ``calls`` (the three calls and the finish),
``close`` (kill, reap, join, remove the temp dir) — and the CPU the whole machine spent per program
(``/proc/stat``, so the fork server, the children and the kernel's network-namespace teardown count),
with and without the network namespace. Then ``--batch`` programs on a thread pool of each size in
``--workers`` (the rollout engine scores on ``SCORING_WORKERS`` threads): wall time per batch; its floor
is the machine CPU per program over the cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CODE = "def f(x):\n    return x * 13 + 2\n"
PHASES = {"spawn": "_spawn", "ready": "_await_ready", "close": "close"}


def _busy_cpu_s() -> float:
    v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def _one(sandbox) -> None:
    r = sandbox.run_calls(CODE, "f", [[1], [2], [3]], timeout_s=2.0)
    assert r.status == "ok" and r.outputs == [15, 28, 41], r


def _phases(sandbox, session_mod, runs: int) -> dict:
    spent: dict[str, float] = {}

    def timed(name, fn):
        def wrapper(self, *a, **k):
            t = time.perf_counter()
            try:
                return fn(self, *a, **k)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
        return wrapper

    originals = {m: getattr(session_mod.Session, m) for m in PHASES.values()}
    for name, m in PHASES.items():
        setattr(session_mod.Session, m, timed(name, originals[m]))
    per: dict[str, list[float]] = {k: [] for k in (*PHASES, "calls", "total")}
    try:
        for _ in range(runs):
            spent.clear()
            t = time.perf_counter()
            _one(sandbox)
            total = time.perf_counter() - t
            for k in PHASES:
                per[k].append(spent.get(k, 0.0))
            per["calls"].append(total - sum(spent.values()))
            per["total"].append(total)
    finally:
        for m, fn in originals.items():
            setattr(session_mod.Session, m, fn)
    return {k: statistics.median(v) * 1000 for k, v in per.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--batch", type=int, default=80)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    a = ap.parse_args()

    from lopd import sandbox
    from lopd.sandbox import limits, session

    iso = limits.isolation()
    _one(sandbox)  # warm: the isolation probe and the fork server start once per process
    print(f"isolation: {iso}; {os.cpu_count()} cores")
    print(f"{'netns':>6} {'spawn ms':>9} {'ready ms':>9} {'calls ms':>9} {'close ms':>9} {'total ms':>9} "
          f"{'machine CPU ms':>15} {'parent CPU ms':>14}")
    for netns in ([True, False] if iso["netns"] else [False]):
        limits._ISO = {**iso, "netns": netns}
        cpu0, p0 = _busy_cpu_s(), os.times()
        ph = _phases(sandbox, session, a.runs)
        cpu1, p1 = _busy_cpu_s(), os.times()
        own = (p1.user + p1.system - p0.user - p0.system) / a.runs * 1000
        print(f"{str(netns):>6} {ph['spawn']:>9.2f} {ph['ready']:>9.2f} {ph['calls']:>9.2f} {ph['close']:>9.2f} "
              f"{ph['total']:>9.2f} {(cpu1 - cpu0) / a.runs * 1000:>15.2f} {own:>14.2f}")
    limits._ISO = iso
    for w in a.workers:
        t = time.perf_counter()
        with ThreadPoolExecutor(w) as pool:
            list(pool.map(lambda _: _one(sandbox), range(a.batch)))
        dt = time.perf_counter() - t
        print(f"{a.batch} programs on {w} thread(s): {dt:.3f} s ({dt / a.batch * 1000:.2f} ms per program)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
