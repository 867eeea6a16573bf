"""``lopd launch``: the out-of-date stages of ``dvc.yaml`` as Ray jobs; DVC keeps the record.

DVC runs one stage at a time in one workspace (a second ``dvc repro`` there fails on its
lock). ``lopd launch`` spreads the work while every result still comes out of DVC itself:

1. **Plan.** DVC's stage graph (``Repo.index.graph``) and ``dvc status``: a stage is out of
   date if DVC says it changed or any stage upstream of it is out of date.
2. **Fan-out.** Each out-of-date stage whose upstream jobs finished becomes a Ray task that
   reserves ``launch.resources[<stage name>]`` (CPUs, GPUs). Its job runs in its own
   ``git worktree`` of the current commit (the main workspace's uncommitted files copied in,
   ``dvc.lock`` merged from the main one and the jobs finished so far) that shares the main
   DVC cache. It checks out its upstream stages' outputs from that cache and runs
   ``dvc repro --single-item <stage>``: DVC hashes the inputs, runs the command and records
   the run-cache entry (DVC writes it only after the command succeeded). Stages DVC does not
   run-cache (a ``persist`` output, a ``cache: false`` output that is not a metric or plot,
   ``always_changed``) run as ``dvc repro <stage>`` in the main workspace, one at a time; that
   command restores their upstream results there from the run-cache first.
3. **Fan-in.** A plain ``dvc repro`` in the main workspace restores every stage from the
   run-cache and runs no stage command; ``dvc status`` is then clean. Outputs are never
   ``dvc commit``-ed from outside DVC.

A failed or killed job is retried up to ``launch.max_retries`` times in a fresh worktree,
then reported with its log path; its downstream stages are not started. Restarting after an
interrupt resumes: finished stages are restored from the run-cache without running.
Logs: ``<log dir>/<stage>.<attempt>.log`` and ``events.jsonl`` (one line per job start/end with
the GPU ids Ray granted). See docs/cluster.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from lopd.errors import BadInput
from lopd.utils import atomic_write_text
from lopd.launch.driver import INTERRUPTED, Driver, raise_if_interrupted, resources_for, slots_per_kind
from lopd.launch.job import dvc_env, event, run_job, run_logged, stages_run
from lopd.launch.plan import Plan, read_plan
from lopd.launch.worktree import git, remove_stale_worktrees, remove_worktree

if TYPE_CHECKING:
    from lopd.config import Params


ERROR_LOG_TAIL = 20  # lines of a failed job's log printed with its path
RAY_START_TRIES = 3


def fan_in(root: Path, targets: list[str], log_dir: Path) -> dict:
    """Plain ``dvc repro`` in the main workspace, then ``dvc status``: returns the stage
    commands the repro ran (should be none: every result comes from the run-cache)."""
    env = dvc_env()
    event(log_dir / "events.jsonl", "fan-in start")
    with open(log_dir / "fan-in.log", "w") as fh:
        rc = run_logged(["dvc", "repro", *targets], root, fh, env)
    lines = (log_dir / "fan-in.log").read_text(errors="replace").splitlines()
    ran = stages_run(lines)
    restored = [ln.split("'")[1] for ln in lines if "is cached - skipping run" in ln]
    st = subprocess.run(["dvc", "status", "--json", *targets], cwd=root, env=env, capture_output=True, text=True)
    status = json.loads(st.stdout) if st.returncode == 0 and st.stdout.strip() else {"error": st.stderr[-500:]}
    event(log_dir / "events.jsonl", "fan-in end", rc=rc, ran=ran)
    return {"rc": rc, "ran": ran, "restored": restored, "status_clean": status == {}, "status": status,
            "log": str(log_dir / "fan-in.log")}


def launch(params: Params, root: str | Path = ".", address: str | None = None, num_cpus: float | None = None,
           num_gpus: float | None = None, targets: list[str] | None = None, log_dir: str | Path | None = None,
           check_resources: bool = True, batch: bool = False) -> dict:
    """Run the out-of-date stages on Ray (``address``: an existing cluster; None: start a local
    one with ``num_cpus``/``num_gpus`` logical resources), then fan in. Returns the summary
    that is also written to ``<log dir>/summary.json``; ``summary["ok"]``: every job finished,
    the fan-in ran no stage command and ``dvc status`` is clean. ``batch``: the ready stages of one kind run as
    at most as many jobs as the cluster runs of that kind at once, each submitted when the cluster has room for
    it, the longest chain first (:func:`lopd.launch.driver.next_jobs`)."""
    root = Path(git(Path(root), "rev-parse", "--show-toplevel").strip())
    commit = subprocess.run(["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=root, capture_output=True,
                            text=True).stdout.strip()
    if not commit:
        raise BadInput(f"{root} has no commit: each job's worktree checks out the current commit (git commit first)")
    lp = getattr(params, "launch", params)  # a Params or its LaunchParams
    wt_root = _worktree_root(root, lp.worktree_root)
    with _exclusive(wt_root, root):
        plan = read_plan(root, targets or [])
        unknown = sorted(set(lp.resources) - {"default"} - plan.kinds)
        if unknown:
            raise BadInput(f"launch.resources names no stage of dvc.yaml: {unknown}; stages: {sorted(plan.kinds)}")
        log_dir = Path(log_dir) if log_dir else wt_root / "logs" / time.strftime("%Y%m%d-%H%M%S")
        log_dir.mkdir(parents=True, exist_ok=True)
        remove_stale_worktrees(root, wt_root)
        print(f"{len(plan.launch)} of {len(plan.jobs)} stages out of date; logs: {log_dir}", flush=True)
        t0 = time.time()
        summary: dict = {"launched": sorted(plan.launch), "log_dir": str(log_dir)}
        drv = None
        if plan.launch:
            drv = _fan_out(plan, lp, root, wt_root, log_dir, commit, address, num_cpus, num_gpus, check_resources,
                           batch)
            summary.update(done={k: _brief(v) for k, v in drv.done.items()},
                           failed={k: _brief(v) for k, v in drv.failed.items()}, blocked=drv.blocked)
        summary["jobs_s"] = round(time.time() - t0, 1)
        raise_if_interrupted()  # an interrupt the jobs' loop did not see still stops the launch before the fan-in
        if not summary.get("failed") and not summary.get("blocked"):
            summary["fan_in"] = fan_in(root, targets or [], log_dir)
            for out in (drv.done.values() if drv and not lp.keep_worktrees else ()):
                if out.get("worktree"):  # kept until now to serve uncached outputs downstream
                    remove_worktree(root, Path(out["worktree"]))
        summary["wall_s"] = round(time.time() - t0, 1)
        fi = summary.get("fan_in")
        summary["ok"] = bool(fi) and fi["rc"] == 0 and not fi["ran"] and fi["status_clean"]
        atomic_write_text(log_dir / "summary.json", json.dumps(summary, indent=1))
    return summary


@contextlib.contextmanager
def _exclusive(wt_root: Path, root: Path):
    """One ``lopd launch`` per repository at a time (it owns the worktrees under ``wt_root``)."""
    from filelock import FileLock, Timeout

    wt_root.mkdir(parents=True, exist_ok=True)
    lock = FileLock(wt_root / "launch.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise BadInput(f"another lopd launch is running on {root} (lock {wt_root / 'launch.lock'})") from None
    try:
        yield
    finally:
        lock.release()


def _fan_out(plan: Plan, lp, root: Path, wt_root: Path, log_dir: Path, commit: str, address, num_cpus, num_gpus,
             check_resources: bool, batch: bool = False) -> Driver:
    try:
        import ray
    except ImportError:
        raise BadInput("lopd launch needs Ray: pip install 'lopd[cluster]' (or: pip install ray)") from None
    _init_ray(ray, address, num_cpus, num_gpus)
    try:
        if check_resources:
            _check_resources(plan, lp, ray.cluster_resources())
        totals = ray.cluster_resources()
        slots = slots_per_kind(plan, lp.resources, totals) if batch else None
        drv = Driver(plan, lp, root, wt_root, log_dir, ray.remote(run_job), commit, batch_slots=slots, totals=totals)
        try:
            drv.run()
        except KeyboardInterrupt:
            drv.cancel()
            raise
        return drv
    finally:
        ray.shutdown()


def _init_ray(ray, address: str | None, num_cpus: float | None, num_gpus: float | None) -> None:
    """Connect to ``address``, or start a local cluster. Ray gives a starting node a fixed 30 s;
    on a loaded machine that can pass, so a local start is retried after stopping the processes
    it left (they are this process's children)."""
    if address:
        try:
            ray.init(address=address, logging_level="WARNING")
        except ConnectionError as e:
            hint = "" if os.environ.get("RAY_AUTH_MODE") else (
                " (a cluster started by `ray start` uses token authentication: export RAY_AUTH_MODE=token and "
                "make its token available, ~/.ray/auth_token or RAY_AUTH_TOKEN)")
            raise BadInput(f"cannot connect to the Ray cluster at {address}: {e}{hint}") from None
        return
    for attempt in range(1, RAY_START_TRIES + 1):
        try:
            ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False,
                     logging_level="WARNING")  # "local": a new cluster even if `ray start` left one
            return
        except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception for this
            if "timed out during startup" not in str(e) or attempt == RAY_START_TRIES:
                raise
            print(f"the local Ray node did not start in time (attempt {attempt}); retrying", flush=True)
            _stop_children()


def _stop_children() -> None:
    import psutil

    kids = psutil.Process().children(recursive=True)
    for k in kids:
        k.terminate()
    _, alive = psutil.wait_procs(kids, timeout=10)
    for k in alive:
        k.kill()


def _brief(out: dict) -> dict:
    return {k: out.get(k) for k in ("rc", "attempt", "ran", "restored", "log", "error", "batch") if k in out}


def _worktree_root(root: Path, setting: str | None) -> Path:
    path = (root / ".dvc" / "tmp" / "launch") if setting is None else (root / setting).resolve()
    inside = path == root or root in path.parents
    if inside and (root / ".dvc") not in path.parents:
        raise BadInput(f"launch.worktree_root {path} is inside the repository: DVC would collect the worktrees' "
                       "dvc.yaml; use a path outside it or under .dvc/tmp")
    return path


def _check_resources(plan: Plan, lp, total: dict) -> None:
    """A job asking more than the whole cluster has would wait forever: say so instead."""
    for kind in sorted({plan.jobs[s].kind for s in plan.launch}):
        res = resources_for(lp.resources, kind)
        for key, want in (("CPU", res.num_cpus), ("GPU", res.num_gpus)):
            if want > total.get(key, 0):
                raise BadInput(f"launch.resources.{kind if kind in lp.resources else 'default'} asks "
                               f"{want:g} {key} per job but the Ray cluster has {total.get(key, 0):g} "
                               f"(local cluster: --num-{key.lower()}s; or lower launch.resources)")


def oversubscription(lp, torch_threads: int) -> list[str]:
    """One warning per job kind that reserves fewer CPUs than the torch threads its stage runs
    (``model.torch_threads``; every stage sets it when it loads the model). Ray then packs more threads than
    cores onto a machine, and OpenMP threads spin at their barriers while another job holds the cores: two
    2-thread processes side by side on 2 cores ran a population step at 0.15x of one (``bench/layout.py``,
    ``docs/benchmarks.md``)."""
    return [f"launch.resources.{kind} reserves {res.num_cpus:g} CPU per job, but each stage runs "
            f"model.torch_threads = {torch_threads} torch threads: jobs side by side will oversubscribe the cores "
            f"and spin. Reserve num_cpus: {torch_threads}, or set model.torch_threads to {res.num_cpus:g} "
            "(that changes what a run computes, to the last bits)"
            for kind, res in sorted(lp.resources.items()) if res.num_gpus == 0 and res.num_cpus < torch_threads]


def _report(summary: dict) -> int:
    for name, out in sorted(summary.get("failed", {}).items()):
        print(f"FAILED {name}: rc={out.get('rc')} {out.get('error') or ''} after {out['attempt']} attempt(s); "
              f"log: {out['log']}")
        lines = Path(out["log"]).read_text(errors="replace").splitlines() if Path(out["log"]).exists() else []
        print("  | " + "\n  | ".join(lines[-ERROR_LOG_TAIL:]))
    if summary.get("blocked"):
        print(f"not started (upstream failed): {', '.join(summary['blocked'])}")
    fi = summary.get("fan_in")
    if fi:
        print(f"fan-in: dvc repro restored {len(fi['restored'])} stage(s) from the run-cache and ran "
              f"{len(fi['ran'])} stage command(s) {fi['ran'] or ''}; dvc status clean: {fi['status_clean']}; "
              f"log: {fi['log']}")
    print(f"lopd launch: {'OK' if summary['ok'] else 'FAILED'} in {summary['wall_s']:.0f} s; "
          f"summary: {summary['log_dir']}/summary.json")
    return 0 if summary["ok"] else 1


def load_launch_params(path: str | Path, raw: dict | None = None):
    """Only the ``launch`` section is read (each stage validates its own sections); ``raw``: the file's
    mapping when the caller has read it already."""
    from pydantic import ValidationError

    from lopd.config import LaunchParams, format_params_error, read_yaml_mapping

    raw = read_yaml_mapping(path, "params file") if raw is None else raw
    if "launch" not in raw:
        raise BadInput(f"{path} has no `launch` section (see params.yaml of this repository)")
    try:
        return LaunchParams.model_validate(raw["launch"])
    except ValidationError as e:
        raise BadInput(format_params_error(e, str(path), within=("launch",))) from None


def main(argv: list[str] | None = None) -> int:

    p = argparse.ArgumentParser(prog="lopd launch", description=__doc__.split("\n\n")[0])
    p.add_argument("targets", nargs="*", help="stages to bring up to date (default: the whole pipeline)")
    p.add_argument("--params", default="params.yaml", help="params file with the `launch` section")
    p.add_argument("--address", default=None, help="an existing Ray cluster (default: start a local one)")
    p.add_argument("--num-cpus", type=float, default=None, help="local cluster: logical CPUs (default: all)")
    p.add_argument("--num-gpus", type=float, default=None, help="local cluster: logical GPUs (default: detected)")
    p.add_argument("--log-dir", default=None, help="default: <worktree_root>/logs/<time>")
    p.add_argument("--batch", action="store_true",
                   help="a fixed cluster's schedule: the ready stages of one kind as one job per slot the cluster has for "
                        "it (one worktree, DVC start-up and warm worker for several stages), each submitted when the "
                        "cluster has room, the longest chain of stages first; default: a job per stage, all queued")
    p.add_argument("--no-resource-check", action="store_true",
                   help="submit jobs larger than the cluster's current total (an autoscaling cluster grows)")
    a = p.parse_args(argv)

    def on_signal(signum, frame):  # noqa: ARG001 - Ctrl-C, or a batch system's SIGTERM: stop the jobs cleanly
        INTERRUPTED.set()  # the driver re-raises from this flag if the KeyboardInterrupt is dropped
        raise KeyboardInterrupt

    from lopd.config import read_yaml_mapping

    try:
        raw = read_yaml_mapping(a.params, "params file")
        lp = load_launch_params(a.params, raw)
        threads = int((raw.get("model") or {}).get("torch_threads") or 1)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in oversubscription(lp, threads):
        print(f"lopd launch: warning: {line}", file=sys.stderr)
    INTERRUPTED.clear()
    old_term = signal.signal(signal.SIGTERM, on_signal)
    old_int = signal.signal(signal.SIGINT, on_signal)
    try:
        summary = launch(lp, ".", address=a.address, num_cpus=a.num_cpus, num_gpus=a.num_gpus,
                         targets=a.targets, log_dir=a.log_dir, check_resources=not a.no_resource_check, batch=a.batch)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("lopd launch interrupted: running jobs stopped; run it again to resume (finished stages are "
              "restored from the run-cache)", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGINT, old_int)
    return _report(summary)


if __name__ == "__main__":
    sys.exit(main())
