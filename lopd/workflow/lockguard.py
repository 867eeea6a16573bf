"""A guard for ``dvc.lock``: a kill can no longer strand the pipeline.

DVC rewrites the whole ``dvc.lock`` in place (``open("w+")`` then dump) after every stage, so
a process killed during that write leaves it truncated, empty or cut mid-line, and every
later ``dvc repro`` / ``dvc status`` fails with "'./dvc.lock' validation failed".

* :func:`snapshot_lock` runs when each stage starts (DVC runs stages one after another and
  has finished writing the previous entry by then). It copies ``dvc.lock`` to
  ``.lopd/dvc.lock.good`` (git-ignored) only if the file is complete, atomically.
* :func:`guarded_repro` (``lopd repro [dvc repro args]``) checks ``dvc.lock`` before running
  ``dvc repro``. If it is damaged, or missing while a snapshot exists, it keeps the damaged
  file as ``.lopd/dvc.lock.damaged``, restores the snapshot, says so on stderr and goes on.
  A restored older lock never marks a stage done that is not: DVC compares every entry's
  command, params and dependency/output hashes with the workspace and reruns (or restores
  from its run-cache) each stage whose entry is missing or stale.
* Stale DVC locks: ``.dvc/tmp/lock`` is an ``flock`` that dies with its process, so a leftover
  file never blocks. ``.dvc/tmp/rwlock`` (JSON) can: the guard removes entries whose PID is
  dead or reused by a later process, and deletes a corrupt (torn) file, but only while holding
  DVC's own locks, so never while a DVC process holds them.

A lock is *complete* when it ends with a newline, parses as a YAML mapping with
``schema: '2.0'`` and a ``stages`` mapping, every stage has a ``cmd`` and every dependency
and output a ``path`` and a hash, it passes DVC's own lock schema (where DVC is importable),
and it is not the last snapshot cut short inside a stage entry (a write cut at a line end).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lopd.compat.dvc import lock_schema_problem, wrap_lock_writes
from lopd.faults import hit, kill_group, spec
from lopd.utils import atomic_write_bytes

LOCK_NAME = "dvc.lock"
KEEP_DIR = ".lopd"
SNAPSHOT_NAME = "dvc.lock.good"
META_NAME = "dvc.lock.good.json"  # sha256 of the snapshot, the stage that took it, when
DAMAGED_NAME = "dvc.lock.damaged"
HASH_KEYS = ("md5", "etag", "checksum")  # DVC's CHECKSUMS_SCHEMA: one of these names an entry's hash


def _say(msg: str) -> None:
    print(f"lopd repro: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- what a complete lock is


def _entry_problem(name: str, kind: str, items) -> str | None:
    if not isinstance(items, list):
        return f"stage '{name}': {kind} is not a list"
    for i, it in enumerate(items):
        if not isinstance(it, dict) or not isinstance(it.get("path"), str):
            return f"stage '{name}': {kind}[{i}] has no path"
        if not any(it.get(k) for k in HASH_KEYS):
            return f"stage '{name}': {kind} '{it['path']}' has no hash"
    return None


def structure_problem(data) -> str | None:
    """Why the parsed ``data`` is not a complete DVC 2.0 lock (``None`` if it is)."""
    if not isinstance(data, dict):
        return f"not a YAML mapping (a {type(data).__name__})"
    if data.get("schema") != "2.0":
        return f"schema is {data.get('schema')!r}, not '2.0'"
    stages = data.get("stages")
    if not isinstance(stages, dict):
        return "no 'stages' mapping"
    for name, st in stages.items():
        if not isinstance(st, dict) or not isinstance(st.get("cmd"), (str, list)) or not st.get("cmd"):
            return f"stage '{name}' has no cmd"
        for kind in ("deps", "outs"):
            if kind in st and (p := _entry_problem(name, kind, st[kind])):
                return p
        if "params" in st and not (isinstance(st["params"], dict)
                                   and all(isinstance(v, dict) for v in st["params"].values())):
            return f"stage '{name}': params is not a mapping of files to mappings"
    return None


def _cut_inside_an_entry(text: str, snapshot: str | None) -> bool:
    """Whether ``text`` is ``snapshot`` cut short at a line end inside a stage entry.

    A cut between two whole entries is left to DVC: that is also an older lock with fewer
    stages (e.g. one checked out from git), and DVC reruns the stages it lacks."""
    if snapshot is None or len(text) >= len(snapshot) or not snapshot.startswith(text):
        return False
    nxt = snapshot[len(text):].split("\n", 1)[0]
    return not (nxt.startswith("  ") and not nxt.startswith("   ") and nxt.endswith(":"))


def lock_problem(text: str, snapshot: str | None = None, *, use_dvc: bool = False) -> str | None:
    """Why ``text`` (the content of a ``dvc.lock``) is not complete, or ``None``.

    ``snapshot``: the last complete lock, if any; ``use_dvc``: also apply DVC's own parser and
    schema (0.3 s to import, so the per-stage snapshot skips it and the guard uses it).
    """
    import yaml

    if not text.strip():
        return "empty"
    if not text.endswith("\n"):
        return f"cut mid-line ({len(text)} characters, no final newline)"
    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as e:
        return f"not valid YAML ({' '.join(str(e).split())})"
    if problem := structure_problem(data):
        return problem
    if _cut_inside_an_entry(text, snapshot):
        return f"cut inside a stage entry ({len(text)} characters, a prefix of the last complete lock)"
    return lock_schema_problem(text, LOCK_NAME) if use_dvc else None


# ---------------------------------------------------------------- snapshots


def _sweep_temps(folder: Path, older_than: float = 60.0) -> None:
    """Delete temp files of :func:`lopd.utils.atomic_output` left by a killed process (a live writer's are newer)."""
    for tmp in folder.glob(".*.tmp") if folder.is_dir() else ():
        with contextlib.suppress(OSError):
            if time.time() - tmp.stat().st_mtime > older_than:
                tmp.unlink()


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def snapshot_lock(repo_root: str | Path, stage: str | None = None) -> bool:
    """Copy ``<repo_root>/dvc.lock`` to ``.lopd/dvc.lock.good`` if it is complete.

    Returns whether the snapshot now equals ``dvc.lock``. Never raises on a bad lock: a stage
    must not fail because a previous write was torn (the guard deals with that).
    """
    root = Path(repo_root)
    cur, snap_path = _read(root / LOCK_NAME), root / KEEP_DIR / SNAPSHOT_NAME
    if cur is None:
        return False
    old = _read(snap_path)
    if old == cur:
        return True
    try:
        text = cur.decode("utf-8")
    except UnicodeDecodeError:
        return False
    if lock_problem(text, old.decode("utf-8", "replace") if old is not None else None):
        return False
    _sweep_temps(snap_path.parent)
    atomic_write_bytes(snap_path, cur)
    meta = {"sha256": hashlib.sha256(cur).hexdigest(), "stage": stage, "time": time.time()}
    atomic_write_bytes(root / KEEP_DIR / META_NAME, json.dumps(meta).encode())
    return True


def snapshot_for_stage() -> bool:
    """The stage entry's hook: snapshot the lock of the DVC repo running this stage.

    Only under DVC (``DVC_ROOT`` set): then DVC waits for this stage and is not writing
    ``dvc.lock``. Run by hand, a stage takes no snapshot.
    """
    root = os.environ.get("DVC_ROOT")
    if not root:
        return False
    try:
        return snapshot_lock(root, os.environ.get("DVC_STAGE"))
    except OSError as e:  # a read-only checkout or a full disk must not fail the stage
        _say(f"warning: could not snapshot {LOCK_NAME}: {e}")
        return False


def _snapshot_origin(root: Path, snap: bytes) -> str:
    try:
        meta = json.loads((root / KEEP_DIR / META_NAME).read_text())
    except (OSError, ValueError):
        return ""
    if meta.get("sha256") != hashlib.sha256(snap).hexdigest():
        return ""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(meta.get("time", 0)))
    return f", saved {when}" + (f" when stage '{meta['stage']}' started" if meta.get("stage") else "")


# ---------------------------------------------------------------- DVC's own locks


class Busy(Exception):
    """A live DVC process works in this repository (the message says which)."""


@contextlib.contextmanager
def _flock(path: Path, what: str):
    """Hold ``path``'s ``flock`` as DVC's ``zc.lockfile`` does; :class:`Busy` if a live process has it.

    A missing file (or ``.dvc/tmp``) means nobody holds it: nothing is created then.
    """
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
            raise Busy(f"a DVC process{f' (pid {holder})' if holder else ''} holds {what} {path}") from None
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _rwlock_infos(lock: dict):
    for mode in ("read", "write"):
        for path, infos in (lock.get(mode) or {}).items():
            for info in infos if isinstance(infos, list) else [infos]:
                yield mode, path, info


def _tidy_rwlock(path: Path, say) -> None:
    """Drop the entries of dead processes (or of PIDs now reused by a later process) from DVC's
    ``rwlock``; delete it if it is not valid JSON (a write torn by a kill). :class:`Busy` if a
    live process holds an entry. The caller holds ``rwlock.lock``."""
    try:
        raw = path.read_text()
        written = path.stat().st_mtime
    except FileNotFoundError:
        return
    try:
        lock = json.loads(raw)
        infos = list(_rwlock_infos(lock))
        pids = {int(info["pid"]) for _, _, info in infos}
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        path.unlink()
        say(f"deleted {path}: it was not a valid DVC rwlock ({type(e).__name__}: {e}); "
            "a DVC process was killed while writing it and no DVC process holds DVC's locks now")
        return
    from lopd.utils import pid_started_before

    live = {p for p in pids if pid_started_before(p, written)}
    if live:
        who = "; ".join(sorted({f"pid {i['pid']}: {i.get('cmd')}" for _, _, i in infos if int(i["pid"]) in live}))
        raise Busy(f"a live DVC process holds paths in {path} ({who})")
    if not infos:
        return
    atomic_write_bytes(path, b"{}")
    stale = "; ".join(sorted({f"pid {i['pid']} ({i.get('cmd')})" for _, _, i in infos}))
    say(f"cleared {len(infos)} stale entries from {path}, left by processes that are gone: {stale}")


@contextlib.contextmanager
def dvc_locks_held(root: Path, say=_say):
    """Hold DVC's repository lock and rwlock guard (``flock``s, which die with their process, so
    their leftover files never block) and tidy DVC's ``rwlock``. :class:`Busy` if DVC runs here."""
    tmp = root / ".dvc" / "tmp"
    with _flock(tmp / "lock", "the repository lock"), _flock(tmp / "rwlock.lock", "the rwlock guard"):
        _tidy_rwlock(tmp / "rwlock", say)
        yield


# ---------------------------------------------------------------- the guard


@dataclass(frozen=True)
class LockState:
    problem: str | None  # why dvc.lock is unusable; None if it is complete (or absent with no snapshot)
    current: bytes | None
    snapshot: bytes | None


def inspect_lock(root: Path) -> LockState:
    cur, snap = _read(root / LOCK_NAME), _read(root / KEEP_DIR / SNAPSHOT_NAME)
    snap_text = snap.decode("utf-8", "replace") if snap is not None else None
    if cur is None:
        return LockState("missing" if snap is not None else None, cur, snap)
    try:
        text = cur.decode("utf-8")
    except UnicodeDecodeError:
        return LockState("not UTF-8 text", cur, snap)
    return LockState(lock_problem(text, snap_text, use_dvc=True), cur, snap)


def repair_lock(root: Path, say=_say) -> bool:
    """Restore the last complete snapshot over a damaged or missing ``dvc.lock``; snapshot a
    complete one. Returns whether it changed ``dvc.lock``. The caller holds DVC's locks."""
    st = inspect_lock(root)
    if st.problem is None:
        if st.current is not None:
            snapshot_lock(root, stage="before dvc repro")
        return False
    keep = root / KEEP_DIR
    if st.current is None:
        say(f"{LOCK_NAME} is missing, but an earlier run kept a complete copy of it.")
    else:
        say(f"{LOCK_NAME} is damaged: {st.problem} (most likely DVC was killed while rewriting it).")
        atomic_write_bytes(keep / DAMAGED_NAME, st.current)
    snap_problem = "absent" if st.snapshot is None else lock_problem(st.snapshot.decode("utf-8", "replace"),
                                                                      use_dvc=True)
    if snap_problem is None:
        atomic_write_bytes(root / LOCK_NAME, st.snapshot)
        kept = f"kept the damaged file as {keep / DAMAGED_NAME} and " if st.current is not None else ""
        say(f"{kept}restored the last complete lock {keep / SNAPSHOT_NAME} ({len(st.snapshot)} bytes"
            f"{_snapshot_origin(root, st.snapshot)}).")
        say("DVC checks every entry against the workspace: stages whose entries are missing or stale "
            "run again (or are restored from DVC's run-cache); no stage is taken as done unchecked.")
        return True
    moved = ""
    if st.current is not None:
        (root / LOCK_NAME).unlink()
        moved = f"moved the damaged file to {keep / DAMAGED_NAME}. "
    say(f"no complete snapshot to restore ({keep / SNAPSHOT_NAME}: {snap_problem}); {moved}DVC now treats "
        "every stage as not run: it reruns them, or restores from its run-cache those it has results for.")
    return st.current is not None


def find_root(start: Path) -> Path | None:
    """The nearest directory at or above ``start`` holding ``.dvc`` (DVC's repository root)."""
    for d in (start, *start.parents):
        if (d / ".dvc").is_dir():
            return d
    return None


def guard(root: Path, say=_say) -> int:
    """Everything ``lopd repro`` does before ``dvc repro``: 0 to go on, 1 if DVC is running here."""
    try:
        with dvc_locks_held(root, say):
            repair_lock(root, say)
    except Busy as e:
        say(f"{e}; not touching {LOCK_NAME} or DVC's locks while it runs. Wait for it to finish "
            "(or stop it), then run this again.")
        return 1
    return 0


def guarded_repro(argv: list[str]) -> int:
    """``lopd repro [dvc repro args]``: :func:`guard`, then ``dvc repro`` in this process.

    The interpreter's directory goes first on ``PATH`` so the stages' ``python`` is this one.
    """
    root = find_root(Path.cwd())
    if root is not None and (rc := guard(root)):
        return rc
    bindir = os.path.dirname(sys.executable)
    if os.environ.get("PATH", "").split(os.pathsep)[0] != bindir:
        os.environ["PATH"] = os.pathsep.join([bindir, os.environ.get("PATH", "")])
    from dvc.cli import main as dvc_main

    arm_lock_kill()  # LOPD_KILL_AT=<stage>:lock (fault injection): DVC's rewrite of dvc.lock torn mid-write
    return dvc_main(["repro", *argv])


def arm_lock_kill() -> None:
    """In ``lopd repro`` (DVC in this process): when ``LOPD_KILL_AT`` names ``<stage>:lock``, the
    ``n``-th rewrite of ``dvc.lock`` that records that stage writes half of the new lock, fsyncs it,
    and kills the group: the torn lock a kill inside DVC's own write leaves (DVC writes the lock in
    place), every time."""
    s = spec()
    if s is None or s.point != "lock":
        return
    armed: list[str] = []

    def on_stages(addresses: list[str]) -> None:
        names = [a for a in addresses if s.matches(a, "lock")]
        armed[:] = names if names and hit("lock") == s.nth else []

    def on_dump(text: str, stream) -> bool:
        if not armed:
            return False
        stream.write(text[:len(text) // 2])
        stream.flush()
        os.fsync(stream.fileno())
        kill_group(f"{armed[0]}:lock:{s.nth} ({len(text) // 2} of {len(text)} characters of dvc.lock written)")
        return True

    wrap_lock_writes(on_stages, on_dump)


if __name__ == "__main__":
    sys.exit(guarded_repro(sys.argv[1:]))
