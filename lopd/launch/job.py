"""The job side of ``lopd launch``: what one Ray task does in its worktree, and its logs."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from lopd.launch.watchdog import stop_group, wait_group_gone

STOP_GRACE_S = 10  # SIGTERM -> SIGKILL for a job's process group
POLL_S = 0.2
STOPPED_RC = 130  # a job stopped by its launch's stop file (lopd.launch.driver), as an interrupted shell reports


def run_job(spec: dict) -> dict:
    """One job (runs inside a Ray worker): restore the upstream outputs, then let DVC run the stage, or the
    stages of a batch (``spec["members"]``: stages of one kind, run by one ``dvc repro --single-item A B ...``
    in one worktree, so that they share its DVC start-up, checkout and warm worker).

    Returns ``{"rc", "ran", "restored", "entries"}``: the exit status, the stage commands DVC ran
    ("Running stage" lines), the stages DVC restored from the run-cache, and each stage's ``dvc.lock``
    entry written by DVC (all of them, or none on failure)."""
    import ray

    gpu_ids = [str(g) for g in ray.get_gpu_ids()]
    cwd, stage, log, events = spec["cwd"], spec["stage"], spec["log"], spec["events"]
    members = spec.get("members") or [{"stage": stage, "lockfile": spec["lockfile"], "lock_key": spec["lock_key"]}]
    names = [m["stage"] for m in members]
    env = dvc_env()
    event(events, "start", stage=stage, attempt=spec["attempt"], cwd=cwd, gpu_ids=gpu_ids,
          cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"), **({"members": names} if len(names) > 1 else {}))
    stop = spec.get("stop")
    entries: dict[str, dict | None] = {}
    with open(log, "a") as fh:
        rc = run_logged(["dvc", "checkout", *spec["checkout"]], cwd, fh, env, stop_file=stop) \
            if spec["checkout"] else 0
        if rc == 0:
            rc = _copy_missing(spec, fh)
        if rc == 0:
            cmd = ["dvc", "repro", stage] if spec["in_main"] else ["dvc", "repro", "--single-item", *names]
            rc = run_logged(cmd, cwd, fh, env, stop_file=stop, on_start=lambda pid: event(
                events, "running", stage=stage, attempt=spec["attempt"], pid=pid))
        if rc == 0:
            entries = {m["stage"]: read_lock_entry(cwd, m["lockfile"], m["lock_key"]) for m in members}
            missing = [f"{m['lockfile']}: {m['lock_key']!r}" for m in members if entries[m["stage"]] is None]
            if missing:
                print(f"dvc repro exited 0 but these lock entries are absent: {', '.join(missing)}", file=fh)
                rc, entries = 1, {}
    lines = Path(log).read_text(errors="replace").splitlines()
    ran = stages_run(lines)
    restored = [n for n in names if any(ln.startswith(f"Stage '{n}' is cached - skipping run") for ln in lines)]
    event(events, "end", stage=stage, attempt=spec["attempt"], rc=rc, ran=ran, restored=len(restored) == len(names),
          gpu_ids=gpu_ids)
    return {"rc": rc, "ran": ran, "restored": restored, "entries": entries}


def stages_run(lines: list[str]) -> list[str]:
    """The stages whose command DVC ran, from its "Running stage '<name>':" lines."""
    return [ln.split("'")[1] for ln in lines if ln.startswith("Running stage '")]


def _copy_missing(spec: dict, fh) -> int:
    """Inputs ``dvc checkout`` cannot restore (outputs with ``cache: false``, files no stage
    produces) are copied from the workspace that holds them."""
    for rel, source in spec["copy_missing"]:
        dst, src = Path(spec["cwd"]) / rel, Path(source) / rel
        if dst.exists():
            continue
        if not src.exists():
            print(f"input {rel} is missing here and in {source}", file=fh)
            return 1
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)
        print(f"copied input {rel} from {source}", file=fh, flush=True)
    return 0


def dvc_env() -> dict[str, str]:
    """The job's environment: this Python's bin directory first on PATH (dvc and the stage
    commands come from the environment Ray runs the job in)."""
    bin_dir = os.path.dirname(sys.executable)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "DVC_NO_ANALYTICS": "1"}


def event(path: str | Path, kind: str, **fields) -> None:
    """One JSON line per event (O_APPEND: jobs on any node of a shared filesystem add lines)."""
    line = json.dumps({"t": round(time.time(), 3), "event": kind, "host": socket.gethostname(), **fields})
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def stop_requested(stop_file: str | Path | None) -> bool:
    return stop_file is not None and os.path.exists(stop_file)


def run_logged(cmd: list[str], cwd: str | Path, fh, env: dict, on_start=None,
               stop_file: str | Path | None = None) -> int:
    """Run ``cmd`` under :mod:`lopd.launch.watchdog` in a new process group, output to ``fh``. Once
    ``stop_file`` exists (the launch was interrupted) the whole group is stopped and ``STOPPED_RC``
    returned, without starting ``cmd`` if it was there first; an interrupt (Ray's cancel) stops the
    group too, and so does the watchdog if this process dies: no stage command outlives its job.
    ``on_start`` gets the group id."""
    if stop_requested(stop_file):
        print(f"not run: the launch was interrupted ({stop_file}): {' '.join(cmd)}", file=fh, flush=True)
        return STOPPED_RC
    print(f"$ {' '.join(cmd)}  (in {cwd})", file=fh, flush=True)
    watchdog = [sys.executable, str(Path(__file__).with_name("watchdog.py"))]
    proc = subprocess.Popen(watchdog + cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                            start_new_session=True)
    if on_start is not None:
        on_start(proc.pid)
    try:
        while proc.poll() is None:  # not proc.wait(): Ray's cancel raises between bytecodes, not in waitpid
            if stop_requested(stop_file):
                stop_group(proc.pid, proc, STOP_GRACE_S)
                wait_group_gone(proc.pid)
                print(f"stopped: the launch was interrupted ({stop_file})", file=fh, flush=True)
                return STOPPED_RC
            time.sleep(POLL_S)
        wait_group_gone(proc.pid)  # the job's end event then means its group is gone (lopd.launch.driver)
        return proc.returncode
    except BaseException:
        stop_group(proc.pid, proc, STOP_GRACE_S)
        raise


def read_lock_entry(cwd: str | Path, lockfile: str, key: str) -> dict | None:
    path = Path(cwd) / lockfile
    if not path.exists():
        return None
    return ((yaml.safe_load(path.read_text()) or {}).get("stages") or {}).get(key)
