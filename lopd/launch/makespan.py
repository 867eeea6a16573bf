"""The design's wall time on N workers, estimated from recorded stage times and DVC's stage graph.

Each stage runs on one worker (a machine of this size: it uses every core of it), takes the seconds it
took in a recorded run (``.lopd/timing/<stage>.json``: from its process start to its end, start-up
included), and may start once every upstream stage has ended. Then:

- the **critical path** is the longest chain of stages by summed time: no number of workers finishes
  sooner (:func:`critical_path`);
- the **makespan on N workers** is that of a list schedule: whenever a worker is free, it takes the ready
  stage with the longest remaining path to the end (highest level first, a classic rule within a few
  per cent of optimal on such graphs; :func:`list_schedule`). With one worker it is the sum of the times.

What it leaves out, so the figure is a floor for a real cluster: moving outputs between machines (the
DVC cache or run-cache), job start-up outside the stage's process (Ray, a worktree), and stages that must
run in the main workspace one at a time (``lopd launch`` runs those there: they are seconds here).
"""

from __future__ import annotations

import heapq
import json
from pathlib import Path


def stage_seconds(timing_dir: Path) -> dict[str, float]:
    """``{stage address: seconds}`` from a run's timing side files (``t_end - t_process``: the stage's
    process from start to end). A stage without a file is absent."""
    out: dict[str, float] = {}
    for f in sorted(Path(timing_dir).glob("*.json")):
        rec = json.loads(f.read_text())
        if "stage" in rec and "t_end" in rec:
            out[rec["stage"]] = float(rec["t_end"]) - float(rec.get("t_process", rec.get("t_work", rec["t_end"])))
    return out


def levels(seconds: dict[str, float], upstream: dict[str, tuple[str, ...]]) -> dict[str, float]:
    """Each stage's longest path to the end of the graph, its own time included."""
    downstream: dict[str, list[str]] = {s: [] for s in upstream}
    for s, ups in upstream.items():
        for u in ups:
            downstream.setdefault(u, []).append(s)
    level: dict[str, float] = {}

    def visit(s: str) -> float:
        if s not in level:
            level[s] = seconds.get(s, 0.0) + max((visit(d) for d in downstream.get(s, ())), default=0.0)
        return level[s]

    for s in upstream:
        visit(s)
    return level


def critical_path(seconds: dict[str, float], upstream: dict[str, tuple[str, ...]]) -> tuple[float, list[str]]:
    """The longest chain of stages by summed time, and its length in seconds (a stage with no recorded
    time counts 0)."""
    level = levels(seconds, upstream)
    downstream: dict[str, list[str]] = {}
    for s, ups in upstream.items():
        for u in ups:
            downstream.setdefault(u, []).append(s)
    roots = [s for s, ups in upstream.items() if not ups]
    if not roots:
        return 0.0, []
    node = max(sorted(roots), key=lambda s: level[s])
    path = [node]
    while downstream.get(node):
        node = max(sorted(downstream[node]), key=lambda s: level[s])
        path.append(node)
    return level[path[0]], path


def list_schedule(seconds: dict[str, float], upstream: dict[str, tuple[str, ...]], workers: int,
                  overhead: float = 0.0) -> float:
    """The makespan of a highest-level-first list schedule of the graph on ``workers`` workers; every stage
    costs its seconds plus ``overhead`` (a job's start-up outside the stage's process: Ray, a worktree, DVC's
    own checkout and lock; 0 for the floor)."""
    if overhead:
        seconds = {s: seconds.get(s, 0.0) + overhead for s in upstream}
    if workers < 1:
        raise ValueError("workers must be >= 1")
    level = levels(seconds, upstream)
    waiting = {s: set(ups) for s, ups in upstream.items()}
    downstream: dict[str, list[str]] = {}
    for s, ups in upstream.items():
        for u in ups:
            downstream.setdefault(u, []).append(s)
    ready = [(-level[s], s) for s, ups in waiting.items() if not ups]
    heapq.heapify(ready)
    running: list[tuple[float, str]] = []  # (end time, stage)
    now, free, done = 0.0, workers, 0
    while done < len(upstream):
        while free and ready:
            _, s = heapq.heappop(ready)
            heapq.heappush(running, (now + seconds.get(s, 0.0), s))
            free -= 1
        now, s = heapq.heappop(running)
        free += 1
        done += 1
        for d in downstream.get(s, ()):
            waiting[d].discard(s)
            if not waiting[d]:
                heapq.heappush(ready, (-level[d], d))
    return now
