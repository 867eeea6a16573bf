"""The driver of ``lopd launch`` (:mod:`lopd.launch.main`): submits each ready stage as a Ray task,
collects results, retries failures in a fresh worktree, and on an interrupt stops its jobs and
waits until every job command this host started is gone.

An interrupt stops jobs by a stop file in the log directory, which every job polls (the log directory is
on the filesystem the jobs share: they append their events there). ``ray.cancel`` is kept for a job
that has not returned ``CANCEL_WAIT_S`` after that: cancelling a task whose reply is on its way crashes
Ray's driver (``Check failed: it != submissible_tasks_.end() Tried to complete task that was not pending``,
ray-project/ray#54846; seen with Ray 2.60 in a fresh-clone ``make test``, where the launch then exited 1,
not 130)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

from lopd.utils import atomic_write_text
from lopd.launch.plan import Plan, ready_stages
from lopd.launch.watchdog import wait_group_gone
from lopd.launch.worktree import main_cache_dir, prepare_worktree, read_locks, remove_worktree

CANCEL_WAIT_S = 30  # an interrupted launch waits this long for its jobs to stop (then cancels the rest)
STOP_FILE = "stop-requested"  # in the log directory: written on an interrupt; every job polls for it
WAIT_S = 1.0  # the driver's longest wait between two looks at INTERRUPTED
TERM_AFTER_S = 2.0  # an interrupted launch SIGTERMs a local job's group that its cancel has not stopped by then
KILL_WAIT_S = 5.0  # after SIGKILL, how long it waits for the groups to be gone

# Set by lopd launch's SIGINT/SIGTERM handler (:func:`lopd.launch.main.main`), which also raises
# KeyboardInterrupt. The flag makes an interrupt stick even if that KeyboardInterrupt is lost (raised in
# Python code that Ray's C++ core calls back, it may be dropped there; a fresh-clone make test once saw a
# launch run to the end after its SIGINT, cause unproven), so the driver looks at it after every wait.
INTERRUPTED = threading.Event()


def raise_if_interrupted() -> None:
    if INTERRUPTED.is_set():
        raise KeyboardInterrupt


class Driver:
    """Submits ready stages, collects results, retries failures (the loop of :func:`lopd.launch.main.launch`)."""

    def __init__(self, plan: Plan, lp, root: Path, wt_root: Path, log_dir: Path, remote, commit: str,
                 batch_slots: dict[str, int] | None = None, totals: dict | None = None):
        self.plan, self.lp, self.root, self.wt_root, self.log_dir, self.remote = plan, lp, root, wt_root, log_dir, remote
        # batch mode (lopd launch --batch): stage kind -> jobs of it the cluster runs at once, and the cluster's
        # CPUs and GPUs; None: every ready stage is its own job, submitted at once, and Ray queues them
        self.batch_slots, self.totals = batch_slots, totals or {}
        self.level = stage_levels(plan) if batch_slots is not None else {}
        self.commit, self.cache_dir = commit, main_cache_dir(root)
        self.main_locks = read_locks(root, plan.lockfiles)  # before any main-workspace job writes them
        self.entries: dict[str, dict[str, dict]] = {}  # lock file -> stage -> entry, of the jobs finished so far
        self.done: dict[str, dict] = {}
        self.failed: dict[str, dict] = {}
        self.running: dict = {}  # ray ref -> (its stages, attempt, worktree or None)
        self.blocked: list[str] = []  # not started: an upstream stage failed
        self.token = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        self.stop_file = log_dir / STOP_FILE
        self.stop_file.unlink(missing_ok=True)  # a rerun given the same --log-dir starts unstopped

    def run(self) -> None:
        import ray

        pending = set(self.plan.launch)
        while pending or self.running:
            main_busy = any(self.plan.jobs[g[0]].in_main for g, _, _ in self.running.values())
            ready = ready_stages(self.plan, pending, set(self.done), main_busy)
            groups = [(n,) for n in ready] if self.batch_slots is None else next_jobs(
                self.plan, ready, self.batch_slots, self.level, self.lp.resources, self._free())
            for group in groups:
                pending.difference_update(group)
                self._submit(group, 1)
            if not self.running:
                break  # the rest waits on failed stages
            ready, _ = ray.wait(list(self.running), num_returns=1, timeout=WAIT_S)
            raise_if_interrupted()
            if ready:
                self._collect(ready[0])
        self.blocked = sorted(pending)

    def _free(self) -> dict[str, float]:
        """The cluster's CPUs and GPUs that no running job of this launch reserves."""
        free = {"CPU": float(self.totals.get("CPU", 0)), "GPU": float(self.totals.get("GPU", 0))}
        for group, _, _ in self.running.values():
            res = resources_for(self.lp.resources, self.plan.jobs[group[0]].kind)
            free["CPU"] -= res.num_cpus
            free["GPU"] -= res.num_gpus
        return free

    def _name(self, group: tuple[str, ...]) -> tuple[str, str]:
        """A job's name (its first stage, ``+N`` for the others of a batch) and that name as a file name."""
        more = "" if len(group) == 1 else f"+{len(group) - 1}"
        return group[0] + more, self.plan.jobs[group[0]].slug + more

    def _submit(self, group: tuple[str, ...], attempt: int) -> None:
        job, members = self.plan.jobs[group[0]], [self.plan.jobs[n] for n in group]
        label, slug = self._name(group)
        log = self.log_dir / f"{slug}.{attempt}.log"
        wt = None
        if not job.in_main:
            wt = self.wt_root / f"{slug}.{attempt}-{self.token}"
            prepare_worktree(self.root, wt, self.commit, self.main_locks, self.entries, self.lp.shared_paths,
                             self.cache_dir)
        sources = {s: self.done[s].get("worktree") for s in self.done}
        checkout = list(dict.fromkeys(c for m in members for c in m.checkout))
        copy_inputs = list(dict.fromkeys(c for m in members for c in m.copy_inputs))
        spec = {"stage": label, "attempt": attempt, "cwd": str(wt or self.root), "in_main": job.in_main,
                "checkout": [] if job.in_main else checkout,
                "copy_missing": [] if job.in_main else [
                    [rel, str(sources.get(prod) or self.root)] for rel, prod in copy_inputs],
                "lockfile": job.lockfile, "lock_key": job.lock_key, "log": str(log),
                "events": str(self.log_dir / "events.jsonl"), "stop": str(self.stop_file)}
        if len(group) > 1:
            spec["members"] = [{"stage": m.name, "lockfile": m.lockfile, "lock_key": m.lock_key} for m in members]
        res = resources_for(self.lp.resources, job.kind)
        ref = self.remote.options(num_cpus=res.num_cpus, num_gpus=res.num_gpus, max_retries=0,
                                  name=f"lopd:{label}").remote(spec)
        self.running[ref] = (group, attempt, wt)
        print(f"submitted {' '.join(group)} (attempt {attempt}, {res.num_cpus:g} CPU, {res.num_gpus:g} GPU) log: {log}",
              flush=True)

    def _collect(self, ref) -> None:
        import ray

        group, attempt, wt = self.running.pop(ref)
        name, slug = self._name(group)
        log = self.log_dir / f"{slug}.{attempt}.log"
        try:
            out = ray.get(ref)
        except Exception as e:  # noqa: BLE001 - a killed worker, a cancelled task: a failed attempt
            out = {"rc": None, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        out.update(attempt=attempt, log=str(log))
        if out["rc"] == 0:
            entries, restored = out.pop("entries"), out.pop("restored")
            for n in group:
                job = self.plan.jobs[n]
                self.entries.setdefault(job.lockfile, {})[job.lock_key] = entries[n]
            if wt:
                keep_timings(wt, self.root)
            keep = self.lp.keep_worktrees or any(n in self.plan.keep for n in group)
            out["worktree"] = str(wt) if (wt and keep) else None
            if wt and not keep:
                remove_worktree(self.root, wt)
            for n in group:
                self.done[n] = {**out, "restored": n in restored, **({"batch": list(group)} if len(group) > 1 else {})}
            how = ("restored from the run-cache" if len(restored) == len(group)
                   else f"ran {len(out['ran'])} command(s)")
            print(f"finished {' '.join(group)} ({how})", flush=True)
        elif attempt <= self.lp.max_retries:
            print(f"attempt {attempt} of {name} failed (rc={out['rc']} {out.get('error', '')}); log: {log}; retrying",
                  flush=True)
            self._submit(group, attempt + 1)
        else:
            for n in group:
                self.failed[n] = out
            print(f"FAILED {name} after {attempt} attempt(s); log: {log}", flush=True)

    def cancel(self) -> None:
        """Stop every running job (its dvc process group is stopped) and wait for them: the stop file
        first, which each job sees within its poll and answers by stopping its group and returning; then
        ``ray.cancel`` for a job that has not returned within ``CANCEL_WAIT_S`` (one still queued, or one
        that cannot see the file), never for one that may be returning (see the module docstring)."""
        import ray

        refs = list(self.running)
        atomic_write_text(self.stop_file, f"{time.time():.3f}\n")
        # this host's job groups: SIGTERMed from here too if their job does not stop them
        stop_local_groups(self.log_dir / "events.jsonl", CANCEL_WAIT_S)
        if not refs:
            return
        _, left = ray.wait(refs, num_returns=len(refs), timeout=CANCEL_WAIT_S)
        for ref in left:
            ray.cancel(ref)
        if left:
            ray.wait(left, num_returns=len(left), timeout=CANCEL_WAIT_S)


def stage_levels(plan: Plan) -> dict[str, float]:
    """Each stage's priority: the number of stages on its longest chain to the end of the graph, itself
    included (``lopd.launch.makespan.levels`` with every stage counted 1: no stage times are known before a
    clean run). The search's chain (cold start, hpo, the trains, register, the confirmation) outranks the
    confirmation draws, which only the confirmation's trains wait on."""
    from lopd.launch.makespan import levels

    upstream = {n: tuple(u for u in j.upstream if u in plan.jobs) for n, j in plan.jobs.items()}
    return levels({n: 1.0 for n in upstream}, upstream)


def next_jobs(plan: Plan, ready: list[str], slots: dict[str, int], level: dict[str, float], resources: dict,
              free: dict[str, float]) -> list[tuple[str, ...]]:
    """Batch mode: the jobs to submit now, as many as the ``free`` CPUs and GPUs hold, the highest ``level``
    first (a highest-level-first list schedule, as ``bench/makespan.py`` estimates it; a lower stage whose job
    still fits may go when a higher one does not). A job takes its stage and the other ready stages of its kind,
    in level order, up to ``ceil(n / slots[kind])`` of the ``n`` ready: a batch pays a worktree, DVC's start-up
    and checkout and the warm worker's imports once for all its stages (about 6.5 s and 4.7 s CPU a job on
    smoke, ``docs/benchmarks.md``). A main-workspace stage is always its own job. Stages left wait for a free
    slot: submitted at once, Ray would start them in submission order, and 32 confirmation draws could then
    hold both slots while the search's chain waits."""
    position = {n: i for i, n in enumerate(plan.order)}
    order = sorted(ready, key=lambda n: (-level.get(n, 0.0), position[n]))
    free, taken, out = dict(free), set(), []
    for n in order:
        if n in taken:
            continue
        job = plan.jobs[n]
        res = resources_for(resources, job.kind)
        if res.num_cpus > free.get("CPU", 0) + 1e-9 or res.num_gpus > free.get("GPU", 0) + 1e-9:
            continue
        if job.in_main:
            group = (n,)
        else:
            same = [m for m in order if m not in taken and not plan.jobs[m].in_main and plan.jobs[m].kind == job.kind]
            k = max(1, slots.get(job.kind, 1))
            group = tuple(same[:-(-len(same) // k)])
        taken.update(group)
        out.append(group)
        free["CPU"], free["GPU"] = free.get("CPU", 0) - res.num_cpus, free.get("GPU", 0) - res.num_gpus
    return out


def slots_per_kind(plan: Plan, resources: dict, total: dict) -> dict[str, int]:
    """Per stage kind: how many of its jobs the cluster's ``total`` (``ray.cluster_resources()``) runs at once
    under ``launch.resources`` (CPUs and GPUs one job reserves); at least 1."""
    out = {}
    for kind in sorted(plan.kinds):
        res = resources_for(resources, kind)
        fits = [int(total.get(key, 0) // want) for key, want in (("CPU", res.num_cpus), ("GPU", res.num_gpus))
                if want > 0]
        out[kind] = max(1, min(fits)) if fits else 1
    return out


TIMING = Path(".lopd") / "timing"


def keep_timings(worktree: Path, root: Path) -> list[str]:
    """Copy a finished job's stage time records (``.lopd/timing/*.json``: process start, work start, end, CPU
    seconds; side files, not DVC outputs) from its worktree into the main workspace, before the worktree is
    removed: ``bench/makespan.py`` and ``bench/pipeline_report.py`` read a launched run's stage times there as
    they read a serial one's. Returns the names copied."""
    src, dst = Path(worktree) / TIMING, Path(root) / TIMING
    names = sorted(f.name for f in src.glob("*.json")) if src.is_dir() else []
    if names:
        dst.mkdir(parents=True, exist_ok=True)
        for n in names:
            shutil.copy2(src / n, dst / n)
    return names


def resources_for(resources: dict, kind: str):
    """What a job of stage ``kind`` reserves: ``resources[kind]``; for an extra-seed stage
    (``bank_draw_extra``) that of the stage it repeats (``bank_draw``); else ``resources["default"]``."""
    for k in (kind, kind.removesuffix("_extra")):
        if k in resources:
            return resources[k]
    return resources["default"]


def _live_local_groups(events_file: Path) -> list[int]:
    """Process groups of this host's jobs that started a command and have not ended."""
    import socket

    if not events_file.exists():
        return []
    started, ended = {}, set()
    for line in events_file.read_text().splitlines():
        e = json.loads(line)
        key = (e.get("stage"), e.get("attempt"))
        if e["event"] == "running" and e.get("host") == socket.gethostname():
            started[key] = e["pid"]
        elif e["event"] == "end":
            ended.add(key)
    alive = []
    for key, pgid in started.items():
        if key in ended:  # its group is gone; the id may belong to another process by now
            continue
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            continue
        alive.append(pgid)
    return alive


def stop_local_groups(events_file: Path, wait_s: float) -> None:
    """Return only once every job command this host started is gone. Ray's cancel is asked first (the job
    stops its group itself); a group still alive after ``TERM_AFTER_S`` gets SIGTERM from here (its watchdog
    then stops the whole group within its grace period), because a cancel can fail to reach a running task
    (a fresh-clone make test saw a job outlive its cancel); one still alive after ``wait_s`` is SIGKILLed,
    and the call waits up to ``KILL_WAIT_S`` more for the kernel to finish it."""
    t0 = time.monotonic()
    termed: set[int] = set()
    while (alive := _live_local_groups(events_file)) and time.monotonic() - t0 < wait_s:
        if time.monotonic() - t0 >= TERM_AFTER_S:
            for pgid in set(alive) - termed:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGTERM)
                termed.add(pgid)
        time.sleep(0.2)
    for pgid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    for pgid in alive:
        wait_group_gone(pgid, max(0.0, deadline - time.monotonic()))
