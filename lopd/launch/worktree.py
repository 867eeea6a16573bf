"""The worktrees of ``lopd launch``: one per job attempt, at the current commit, mirroring the
main workspace for DVC (git and DVC driven through their own interfaces)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import yaml

from lopd.errors import BadInput
from lopd.utils import atomic_write_text


def git(cwd: Path, *args: str) -> str:
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise BadInput(f"git {' '.join(args)} failed in {cwd}: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout


def read_locks(root: Path, lockfiles: list[str]) -> dict[str, dict]:
    """The main workspace's lock files, read once before any job can write them."""
    return {rel: (yaml.safe_load((root / rel).read_text()) or {}) if (root / rel).exists() else {}
            for rel in lockfiles}


def prepare_worktree(root: Path, wt: Path, commit: str, locks: dict[str, dict], entries: dict[str, dict[str, dict]],
                     shared_paths: list[str], cache_dir: str) -> None:
    """A worktree of ``commit`` that mirrors the main workspace for DVC: its uncommitted files,
    each ``dvc.lock`` = the main one (``locks``) updated with the entries of the jobs finished so
    far, the main DVC cache (and with it the run-cache), ``shared_paths`` linked to the main copies."""
    wt.parent.mkdir(parents=True, exist_ok=True)
    git(root, "worktree", "add", "--detach", str(wt), commit)
    _mirror_uncommitted(root, wt, set(locks))
    for rel, lock in locks.items():
        if not lock and not entries.get(rel):
            (wt / rel).unlink(missing_ok=True)
            continue
        merged = {**lock, "schema": lock.get("schema", "2.0"),
                  "stages": {**(lock.get("stages") or {}), **entries.get(rel, {})}}
        atomic_write_text(wt / rel, yaml.safe_dump(merged, sort_keys=False))
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
        # DVC's per-repository state and index (keyed by path) go with the worktree, not to /var/tmp
        conf.setdefault("core", {})["site_cache_dir"] = str(wt / ".dvc" / "tmp" / "site_cache")


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
