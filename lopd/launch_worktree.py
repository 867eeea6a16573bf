"""Worktrees, processes and logs for ``lopd launch`` (git and DVC driven through their CLIs)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from lopd.errors import BadInput

STOP_GRACE_S = 10  # SIGTERM -> SIGKILL for a job's process group
POLL_S = 0.2


def git(cwd: Path, *args: str) -> str:
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise BadInput(f"git {' '.join(args)} failed in {cwd}: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout


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


def run_logged(cmd: list[str], cwd: str | Path, fh, env: dict, on_start=None) -> int:
    """Run ``cmd`` under :mod:`lopd.launch_guard` in a new process group, output to ``fh``. An
    interrupt (Ray's cancel) stops the whole group; so does the guard if this process dies: no
    stage command outlives its job. ``on_start`` gets the group id."""
    print(f"$ {' '.join(cmd)}  (in {cwd})", file=fh, flush=True)
    guard = [sys.executable, str(Path(__file__).with_name("launch_guard.py"))]
    proc = subprocess.Popen(guard + cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                            start_new_session=True)
    if on_start is not None:
        on_start(proc.pid)
    try:
        while proc.poll() is None:  # not proc.wait(): Ray's cancel raises between bytecodes, not in waitpid
            time.sleep(POLL_S)
        return proc.returncode
    except BaseException:
        _stop_group(proc)
        raise


def _stop_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=STOP_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def read_lock_entry(cwd: str | Path, lockfile: str, key: str) -> dict | None:
    path = Path(cwd) / lockfile
    if not path.exists():
        return None
    return ((yaml.safe_load(path.read_text()) or {}).get("stages") or {}).get(key)


def prepare_worktree(root: Path, wt: Path, commit: str, lockfiles: list[str], entries: dict[str, dict[str, dict]],
                     shared_paths: list[str], cache_dir: str) -> None:
    """A worktree of ``commit`` that mirrors the main workspace for DVC: its uncommitted files,
    ``dvc.lock`` = the main one updated with the entries of the jobs finished so far, the main
    DVC cache (and with it the run-cache), and ``shared_paths`` linked to the main copies."""
    wt.parent.mkdir(parents=True, exist_ok=True)
    git(root, "worktree", "add", "--detach", str(wt), commit)
    _mirror_uncommitted(root, wt, set(lockfiles))
    for rel in lockfiles:
        src = root / rel
        lock = (yaml.safe_load(src.read_text()) or {}) if src.exists() else {}
        if not lock and not entries.get(rel):
            (wt / rel).unlink(missing_ok=True)
            continue
        lock.setdefault("schema", "2.0")
        lock["stages"] = {**(lock.get("stages") or {}), **entries.get(rel, {})}
        (wt / rel).write_text(yaml.safe_dump(lock, sort_keys=False))
    _share_cache(root, wt, cache_dir)
    for rel in shared_paths:
        link = wt / rel
        if link.exists() or link.is_symlink():
            raise BadInput(f"launch.shared_paths: {rel} is part of the commit; only untracked state can be shared")
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(root / rel, link)


def _mirror_uncommitted(root: Path, wt: Path, skip: set[str]) -> None:
    """Copy what differs from the commit (modified and untracked, not ignored), delete what the
    main workspace deleted: the job sees the code and params the main workspace has."""
    out = git(root, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames")
    for item in out.split("\0"):
        if len(item) < 4:
            continue
        rel = item[3:]
        if rel in skip:
            continue
        src, dst = root / rel, wt / rel
        if src.is_symlink() or src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.unlink(missing_ok=True)
            shutil.copy2(src, dst, follow_symlinks=False)
        elif not src.exists():
            dst.unlink(missing_ok=True)


def _share_cache(root: Path, wt: Path, cache_dir: str) -> None:
    from dvc.config import Config

    local = root / ".dvc" / "config.local"
    if local.exists():
        shutil.copy2(local, wt / ".dvc" / "config.local")
    with Config(dvc_dir=str(wt / ".dvc"), validate=False).edit("local", validate=False) as conf:
        conf.setdefault("cache", {})["dir"] = cache_dir


def main_cache_dir(root: Path) -> str:
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        return os.path.abspath(repo.cache.local_cache_dir)


def remove_worktree(root: Path, wt: Path) -> None:
    subprocess.run(["git", "worktree", "remove", "--force", "--force", str(wt)], cwd=root, capture_output=True)
    if wt.exists():
        shutil.rmtree(wt, ignore_errors=True)


def remove_stale_worktrees(root: Path, wt_root: Path) -> None:
    """Worktrees left by an interrupted launch (the launch lock is held: none is in use)."""
    listing = git(root, "worktree", "list", "--porcelain")
    for line in listing.splitlines():
        if line.startswith("worktree "):
            path = Path(line[len("worktree "):])
            if wt_root in path.parents:
                remove_worktree(root, path)
    git(root, "worktree", "prune")
    for p in wt_root.iterdir():
        if p.is_dir() and p.name != "logs":
            shutil.rmtree(p, ignore_errors=True)
