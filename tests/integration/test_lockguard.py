"""The dvc.lock guard (lopd/workflow/lockguard.py): what counts as a complete lock, snapshots, restoring a
torn lock, stale DVC locks, and, on a three-stage DVC project, that a restored lock makes DVC
rerun exactly the stages whose entries are missing or stale."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lopd.workflow import lockguard as lg
from tests.conftest import REPO

BIN = Path(sys.executable).parent


def _sample_lock() -> str:
    """The first three stage entries of the repository's own dvc.lock: text DVC wrote."""
    lines = (REPO / "dvc.lock").read_text().splitlines(keepends=True)
    heads = [i for i, ln in enumerate(lines) if ln.startswith("  ") and not ln.startswith("   ") and ln.endswith(":\n")]
    assert len(heads) >= 4, "the repository's dvc.lock has fewer than four stages"
    return "".join(lines[: heads[3]])


SAMPLE = _sample_lock()


# ---------------------------------------------------------------- what a complete lock is


def test_a_lock_dvc_wrote_is_complete():
    assert lg.lock_problem(SAMPLE) is None
    assert lg.lock_problem(SAMPLE, snapshot=SAMPLE, use_dvc=True) is None


@pytest.mark.parametrize("text", ["", "\n", "  \n\n"])
def test_an_empty_lock_is_damaged(text):
    assert lg.lock_problem(text) == "empty"


def test_a_lock_cut_mid_line_is_damaged_at_every_offset():
    line_ends = {i + 1 for i, c in enumerate(SAMPLE) if c == "\n"}
    cuts = [k for k in range(1, len(SAMPLE)) if k not in line_ends]
    assert len(cuts) > 1000
    assert all(lg.lock_problem(SAMPLE[:k]).startswith("cut mid-line") for k in cuts)


def _entry_heads(text: str) -> set[int]:
    """Offsets where a stage entry starts (a line indented by exactly two spaces)."""
    return {i + 1 for i, c in enumerate(text) if c == "\n" and text[i + 1:i + 3] == "  " and text[i + 3] != " "}


def test_a_lock_cut_at_a_line_end_inside_an_entry_is_damaged_given_the_snapshot():
    """A write cut at a line end can be valid YAML; the snapshot shows it is the last complete
    lock cut short inside an entry."""
    line_ends = [i + 1 for i, c in enumerate(SAMPLE) if c == "\n"][:-1]
    inside = [k for k in line_ends if k not in _entry_heads(SAMPLE) and k > SAMPLE.index("stages:\n") + 8]
    assert len(inside) > 50
    problems = [lg.lock_problem(SAMPLE[:k], snapshot=SAMPLE) for k in inside]
    assert all(problems), [k for k, p in zip(inside, problems) if not p]
    assert sum("cut inside a stage entry" in p for p in problems) > 20  # the others miss a hash or cmd


def test_an_older_lock_with_fewer_whole_stages_is_left_to_dvc():
    """Cut between whole entries, as an older lock checked out from git would be: complete."""
    heads = sorted(_entry_heads(SAMPLE))[1:]
    assert len(heads) == 2
    assert all(lg.lock_problem(SAMPLE[:k], snapshot=SAMPLE) is None for k in heads)


@pytest.mark.parametrize("cut_after, expected", [
    ("  base:\n", "stage 'base' has no cmd"),
    ("  base:\n    cmd: python stages/base.py\n    deps:\n    - path: data/splits/train.jsonl\n",
     "stage 'base': deps 'data/splits/train.jsonl' has no hash"),
    ("    - path: data/splits/train.jsonl\n      hash: md5\n", "has no hash"),
])
def test_an_entry_cut_short_at_a_line_end_is_incomplete(cut_after, expected):
    """Without a snapshot (the first write of a new entry), an entry cut before its hash or cmd."""
    head = SAMPLE[: SAMPLE.index("  base:\n")] if cut_after.startswith("  base") else ""
    text = head + cut_after if head else SAMPLE[: SAMPLE.index(cut_after) + len(cut_after)]
    assert expected in lg.lock_problem(text)


@pytest.mark.parametrize("text, expected", [
    ("schema: '1.0'\nstages: {}\n", "schema is '1.0'"),
    ("stages: {}\n", "schema is None"),
    ("schema: '2.0'\n", "no 'stages' mapping"),
    ("schema: '2.0'\nstages:\n- a\n", "no 'stages' mapping"),
    ("- just\n- a list\n", "not a YAML mapping"),
    ("schema: '2.0'\nstages:\n  a:\n    cmd: x\n    outs:\n    - path: [\n", "not valid YAML"),
    ("schema: '2.0'\nstages:\n  a:\n    cmd: x\n    params: [1]\n", "params is not a mapping"),
])
def test_half_written_or_foreign_content_is_damaged(text, expected):
    assert expected in lg.lock_problem(text)


def test_dvc_schema_catches_what_the_structure_check_lets_through():
    text = "schema: '2.0'\nstages:\n  a:\n    cmd: x\n    bogus_key: 1\n"
    assert lg.lock_problem(text) is None
    assert "DVC's lock schema rejects it" in lg.lock_problem(text, use_dvc=True)


# ---------------------------------------------------------------- snapshots


def _keep(root: Path) -> Path:
    return root / lg.KEEP_DIR / lg.SNAPSHOT_NAME


def test_snapshot_copies_only_a_complete_lock(tmp_path):
    (tmp_path / "dvc.lock").write_text(SAMPLE)
    assert lg.snapshot_lock(tmp_path, stage="base")
    assert _keep(tmp_path).read_text() == SAMPLE
    meta = json.loads((tmp_path / lg.KEEP_DIR / lg.META_NAME).read_text())
    assert meta["stage"] == "base"
    for torn in ("", SAMPLE[:-7], SAMPLE[: SAMPLE.rindex("      size:", 0, SAMPLE.index("  base:\n"))]):
        (tmp_path / "dvc.lock").write_text(torn)
        assert not lg.snapshot_lock(tmp_path)
        assert _keep(tmp_path).read_text() == SAMPLE, "a torn lock replaced the snapshot"
    assert sorted(p.name for p in (tmp_path / lg.KEEP_DIR).iterdir()) == [lg.SNAPSHOT_NAME, lg.META_NAME]


def test_snapshot_for_stage_acts_only_under_dvc(tmp_path, monkeypatch):
    (tmp_path / "dvc.lock").write_text(SAMPLE)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    assert not lg.snapshot_for_stage() and not _keep(tmp_path).exists()
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    monkeypatch.setenv("DVC_STAGE", "bank")
    assert lg.snapshot_for_stage() and _keep(tmp_path).read_text() == SAMPLE


# ---------------------------------------------------------------- repair


def _repair(root: Path) -> tuple[bool, str]:
    said: list[str] = []
    changed = lg.repair_lock(root, said.append)
    return changed, "\n".join(said)


@pytest.mark.parametrize("torn, reason", [
    (SAMPLE[: len(SAMPLE) // 2], "cut mid-line"),             # half-written, cut mid-line
    ("", "empty"),                                             # truncated to 0 bytes
    (SAMPLE[: SAMPLE.rindex("      size:", 0, SAMPLE.index("  bank:\n"))], "cut inside a stage entry"),
    (None, "missing"),
])
def test_a_torn_lock_is_restored_from_the_snapshot(tmp_path, torn, reason):
    (tmp_path / "dvc.lock").write_text(SAMPLE)
    lg.snapshot_lock(tmp_path, stage="cold_start")
    if torn is None:
        (tmp_path / "dvc.lock").unlink()
    else:
        (tmp_path / "dvc.lock").write_text(torn)
    changed, said = _repair(tmp_path)
    assert changed and reason in said and "restored the last complete lock" in said
    assert "when stage 'cold_start' started" in said
    assert (tmp_path / "dvc.lock").read_text() == SAMPLE
    if torn is not None:
        assert (tmp_path / lg.KEEP_DIR / lg.DAMAGED_NAME).read_text() == torn


def test_a_complete_lock_is_left_alone_and_snapshotted(tmp_path):
    (tmp_path / "dvc.lock").write_text(SAMPLE)
    changed, said = _repair(tmp_path)
    assert not changed and said == ""
    assert (tmp_path / "dvc.lock").read_text() == SAMPLE == _keep(tmp_path).read_text()


def test_no_lock_and_no_snapshot_is_a_fresh_repository(tmp_path):
    assert _repair(tmp_path) == (False, "")
    assert not (tmp_path / "dvc.lock").exists()


def test_a_torn_lock_without_a_snapshot_is_moved_aside_not_trusted(tmp_path):
    (tmp_path / "dvc.lock").write_text(SAMPLE[:100])
    changed, said = _repair(tmp_path)
    assert changed and "no complete snapshot" in said and "reruns them" in said
    assert not (tmp_path / "dvc.lock").exists()
    assert (tmp_path / lg.KEEP_DIR / lg.DAMAGED_NAME).read_text() == SAMPLE[:100]


# ---------------------------------------------------------------- DVC's own locks


def _dvc_tmp(root: Path) -> Path:
    tmp = root / ".dvc" / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    return tmp


def _rwlock(pid: int, cmd: str) -> str:
    return json.dumps({"write": {"/r/out": {"pid": pid, "cmd": cmd}}, "read": {"/r/in": [{"pid": pid, "cmd": cmd}]}})


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_a_torn_rwlock_is_deleted(tmp_path):
    (_dvc_tmp(tmp_path) / "rwlock").write_text('{"write": {"/r/out": {"pid": 12')
    said: list[str] = []
    with lg.dvc_locks_held(tmp_path, said.append):
        pass
    assert not (tmp_path / ".dvc/tmp/rwlock").exists() and "not a valid DVC rwlock" in said[0]


def test_rwlock_entries_of_dead_or_reused_pids_are_cleared(tmp_path):
    rw = _dvc_tmp(tmp_path) / "rwlock"
    for pid in (_dead_pid(), os.getpid()):  # ours started before the entry below: "reused" once it is older
        rw.write_text(_rwlock(pid, "dvc repro"))
        if pid == os.getpid():
            os.utime(rw, (time.time() - 10**7, time.time() - 10**7))  # written long before we started
        said: list[str] = []
        with lg.dvc_locks_held(tmp_path, said.append):
            pass
        assert json.loads(rw.read_text()) == {} and f"pid {pid}" in said[0]


def test_a_live_dvc_blocks_the_guard_which_touches_nothing(tmp_path):
    (tmp_path / "dvc.lock").write_text(SAMPLE)
    lg.snapshot_lock(tmp_path)
    (tmp_path / "dvc.lock").write_text("")  # as if the live DVC were rewriting it right now
    rw = _dvc_tmp(tmp_path) / "rwlock"
    rw.write_text(_rwlock(os.getpid(), "dvc repro"))  # this process started before the entry
    said: list[str] = []
    assert lg.guard(tmp_path, said.append) == 1
    assert "live DVC process holds paths" in said[0] and "dvc repro" in said[0]
    assert (tmp_path / "dvc.lock").read_text() == "" and json.loads(rw.read_text())["write"]


def test_a_held_repository_lock_blocks_the_guard_a_leftover_one_does_not(tmp_path):
    lock = _dvc_tmp(tmp_path) / "lock"
    lock.write_text("4242\n")
    (tmp_path / "dvc.lock").write_text("")
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl,sys,time;f=open(sys.argv[1],'a');"
                               "fcntl.flock(f,fcntl.LOCK_EX);print('held',flush=True);time.sleep(60)", str(lock)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        said: list[str] = []
        assert lg.guard(tmp_path, said.append) == 1 and "holds the repository lock" in said[0]
        assert (tmp_path / "dvc.lock").read_text() == ""
    finally:
        holder.kill()
        holder.wait()
    said = []
    assert lg.guard(tmp_path, said.append) == 0  # the file is still there; nobody holds it
    fd = os.open(lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released by the guard
    os.close(fd)


# ---------------------------------------------------------------- with DVC: a three-stage project

STAGE_PY = """import os, pathlib, signal, sys
from lopd.workflow.lockguard import snapshot_for_stage
snapshot_for_stage()
name, src, dst = sys.argv[1:]
pathlib.Path(dst).write_text(pathlib.Path(src).read_text() + name + "\\n")
if os.environ.get("TEAR_AFTER") == name:  # as if DVC were killed half-way through writing this entry
    lock = pathlib.Path(os.environ["DVC_ROOT"], "dvc.lock")
    text = lock.read_text()
    lock.write_text(text[: text.index("md5: ", len(text) // 2) + 10])  # cut inside a hash
    os.killpg(0, signal.SIGKILL)
"""
DVC_YAML = "stages:\n" + "".join(
    f"  {n}:\n    cmd: python stage.py {n} {s} {n}.txt\n    deps: [stage.py, {s}]\n    outs: [{n}.txt]\n"
    for n, s in (("a", "in.txt"), ("b", "a.txt"), ("c", "b.txt")))


def _env() -> dict:
    return {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", "DVC_NO_ANALYTICS": "1",
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def _dvc(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "dvc"), *args], cwd=root, env=_env(), capture_output=True, text=True, timeout=120)


def _guarded(root: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lopd.workflow.lockguard", *args], cwd=root, env={**_env(), **env},
                          capture_output=True, text=True, timeout=120, start_new_session=True)


def _ran(out: str) -> list[str]:
    return [ln.split("'")[1] for ln in out.splitlines() if ln.startswith("Running stage")]


@pytest.fixture(scope="module")
def abc_project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("abc")
    (root / "stage.py").write_text(STAGE_PY)
    (root / "dvc.yaml").write_text(DVC_YAML)
    (root / "in.txt").write_text("in\n")
    assert _dvc(root, "init", "--no-scm", "-q").returncode == 0
    r = _guarded(root)
    assert r.returncode == 0 and _ran(r.stdout) == ["a", "b", "c"], r.stdout + r.stderr
    return root


@pytest.fixture
def project(abc_project, tmp_path) -> Path:
    return Path(shutil.copytree(abc_project, tmp_path / "p", symlinks=True))


def test_each_stage_start_snapshots_the_lock_dvc_finished_writing(project):
    snap = _keep(project).read_text()  # taken when c started: a and b have entries, c has none yet
    assert lg.lock_problem(snap, use_dvc=True) is None
    assert "  a:\n" in snap and "  b:\n" in snap and "  c:\n" not in snap
    assert "  c:\n" in (project / "dvc.lock").read_text()


@pytest.mark.parametrize("cut", ["empty", "mid-line"])
def test_guarded_repro_recovers_a_lock_torn_while_writing_the_last_entry(project, cut):
    full = (project / "dvc.lock").read_text()
    torn = "" if cut == "empty" else full[: full.index("  c:\n") + 30]  # killed mid-way through c's entry
    (project / "dvc.lock").write_text(torn)
    plain = _dvc(project, "status")
    if cut == "empty":  # what users hit without the guard
        assert plain.returncode != 0 and "'./dvc.lock' validation failed" in plain.stderr, plain.stderr
    else:  # DVC reads the torn entry's truncated cmd as a changed command: it would rerun c
        assert plain.returncode == 0 and "changed command" in plain.stdout, plain.stdout + plain.stderr
    r = _guarded(project)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "dvc.lock is damaged" in r.stderr and "restored the last complete lock" in r.stderr
    assert "when stage 'c' started" in r.stderr
    assert (project / lg.KEEP_DIR / lg.DAMAGED_NAME).read_text() == torn
    assert _ran(r.stdout) in ([], ["c"]) and "'a' didn't change" in r.stdout and "'b' didn't change" in r.stdout
    # c's entry was lost: DVC reran it, or restored it from its run-cache, and says which
    assert _ran(r.stdout) == ["c"] or "Stage 'c' is cached - skipping run, checking out outputs" in r.stdout, r.stdout
    assert (project / "c.txt").read_text() == "in\na\nb\nc\n"
    st = _dvc(project, "status")
    assert st.returncode == 0 and "up to date" in st.stdout, st.stdout + st.stderr


def test_a_restored_lock_older_than_the_workspace_marks_nothing_done(project):
    """The snapshot holds hashes from before ``in.txt`` and ``b.txt`` changed: DVC must see every
    stage as changed and rerun them, not take the old entries as done."""
    old_snapshot = _keep(project).read_bytes()
    (project / "in.txt").write_text("in, second version\n")
    r = _dvc(project, "repro")
    assert r.returncode == 0 and _ran(r.stdout) == ["a", "b", "c"], r.stdout + r.stderr
    (project / "b.txt").write_text("edited by hand\n")
    _keep(project).write_bytes(old_snapshot)
    (project / lg.KEEP_DIR / lg.META_NAME).unlink()
    (project / "dvc.lock").write_text("")
    assert lg.guard(project, lambda m: None) == 0 and (project / "dvc.lock").read_bytes() == old_snapshot
    st = _dvc(project, "status")
    assert "a:" in st.stdout and "b:" in st.stdout and "c:" in st.stdout, st.stdout  # all three changed
    r = _guarded(project)
    assert r.returncode == 0, r.stdout + r.stderr
    for n in "abc":  # each reruns, or DVC restores its outputs from the run-cache entry of the second run
        assert f"Running stage '{n}'" in r.stdout or f"Stage '{n}' is cached" in r.stdout, r.stdout
        assert f"'{n}' didn't change" not in r.stdout, r.stdout
    assert (project / "b.txt").read_text() == "in, second version\na\nb\n"
    assert (project / "c.txt").read_text() == "in, second version\na\nb\nc\n"
    assert "up to date" in _dvc(project, "status").stdout


def test_temp_files_of_a_killed_snapshot_are_swept(tmp_path):
    keep = tmp_path / lg.KEEP_DIR
    keep.mkdir()
    old, new = keep / ".dvc.lock.good.abc.tmp", keep / ".dvc.lock.good.def.tmp"
    old.write_text("half")
    new.write_text("a live writer's")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    (tmp_path / "dvc.lock").write_text(SAMPLE)
    assert lg.snapshot_lock(tmp_path)
    assert not old.exists() and new.exists()


def test_a_repro_killed_while_writing_the_lock_mid_run_recovers(project):
    """Mid-run: stage b's command cuts dvc.lock inside a hash, as an interrupted rewrite would, and SIGKILLs the
    whole process group (DVC included); the next guarded repro restores the lock snapshotted when
    b started and finishes, rerunning b and c only."""
    (project / "in.txt").write_text("in, v2\n")
    r = _guarded(project, TEAR_AFTER="b")
    assert r.returncode == -signal.SIGKILL and _ran(r.stdout) == ["a", "b"], r.stdout + r.stderr
    assert lg.inspect_lock(project).problem.startswith("cut mid-line")
    r = _guarded(project)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "restored the last complete lock" in r.stderr and "when stage 'b' started" in r.stderr
    assert "'a' didn't change" in r.stdout and _ran(r.stdout) == ["b", "c"], r.stdout
    assert (project / "c.txt").read_text() == "in, v2\na\nb\nc\n"
    assert "up to date" in _dvc(project, "status").stdout
