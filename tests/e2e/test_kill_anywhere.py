"""Kill anywhere, rerun, same bytes: on the smoke profile, kill the whole process group of the
guarded ``dvc repro`` (``lopd repro``) at named points (``LOPD_KILL_AT``, lopd/faults.py): inside a
step of the search batch (hpo) and of the population trainer (train), after a checkpoint, after an
output write (evaluate), as MLflow closes a run (train, report), and while DVC rewrites ``dvc.lock``
after a stage; plus one kill by the clock inside the search. Rerun after each
kill, then until done, and compare with one uninterrupted run:
every deterministic output byte-identical, ``dvc status`` clean, no MLflow run left RUNNING, no
stale lock, no half-written file, no process left behind.

``pytest -m slow -s tests/e2e/test_kill_anywhere.py`` prints the kill log, the times and the files compared.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, copy_repo

BIN = Path(sys.executable).parent
GUARDED = [str(BIN / "lopd"), "repro"]  # the guarded repro `make repro` runs
# Outputs that may differ between two uninterrupted runs: a whole file (None) or the JSON keys that
# differ. None: every output is a deterministic function of its deps; run ids, timings
# and the search journal are side files, not outputs.
KNOWN_NONDETERMINISTIC: dict[str, list[str] | None] = {}
# What a search killed inside a trial must reproduce on restart (its sampler is seeded per trial
# from the number of finished trials, lopd/hpo/study.py, so the trials after the kill are the same).
SEARCH_RESTART_OUTPUTS = {"hpo/trials.csv", "hpo/margin_paths.csv", "hpo/result.json", "reports/figures/sensitivity.png"}


def _env() -> dict:
    return {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", "DVC_NO_ANALYTICS": "1",
            "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONUNBUFFERED": "1", "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}


class Run:
    """A command in its own process group; its merged stdout/stderr lines, timestamped, on a thread."""

    def __init__(self, cmd: list[str], cwd: Path, env: dict | None = None):
        self.proc = subprocess.Popen(cmd, cwd=cwd, env={**_env(), **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, bufsize=1, start_new_session=True)
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def text(self) -> str:
        return "\n".join(ln for _, ln in self.lines)

    def started(self, prefix: str) -> tuple[int, str] | None:
        """Index and name of the first stage whose name starts with ``prefix`` that started running."""
        for i, (_, ln) in enumerate(self.lines):
            if ln.startswith(f"Running stage '{prefix}"):
                return i, ln.split("'")[1]
        return None

    def after(self, i: int, text: str) -> bool:
        return any(text in ln for _, ln in self.lines[i + 1:])

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.finish()

    def finish(self, timeout: float | None = None) -> int:
        rc = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return rc


# The stages the chain kills. Every other stage of the reference is taken done from it (its outputs and
# its dvc.lock entry): rerunning a stage nobody kills would only cost the chain time (about a minute).
# Their entries stay valid only if what the killed stages rewrite is byte-identical, which the chain checks.
KILLED = ("hpo", "train@lopd", "evaluate@lopd", "report")


def _setup(root: Path, ref: Path) -> Path:
    repo = copy_repo(root / "repo")
    for cmd in (["git", "init", "-q"], [str(BIN / "lopd"), "apply-profile", "profiles/smoke.yaml"]):
        r = subprocess.run(cmd, cwd=repo, env=_env(), capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    # Start from the committed dvc.lock, as a fresh clone does: with its ~140 entries of the default
    # profile it is the size the lock guard meets in use. The stages not KILLED get the reference's entries.
    lock = yaml.safe_load((REPO / "dvc.lock").read_text())
    done = yaml.safe_load((ref / "dvc.lock").read_text())["stages"]
    for st in (s for s in done if s not in KILLED):
        lock["stages"][st] = done[st]
        for out in done[st].get("outs", []):
            src, dst = ref / out["path"], repo / out["path"]
            dst.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)
            # DVC's .gitignore beside an output is part of its parent directory's hash, and a stage that
            # depends on the parent (confirm_evaluate on confirm/runs) would see it changed without it
            if (ignore := src.parent / ".gitignore").exists():
                shutil.copy2(ignore, dst.parent / ".gitignore")
    (repo / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))
    # DVC checks a cached output against its cache object: link the reference's objects in (not its
    # run-cache, from which DVC would restore the killed stages instead of running them)
    shutil.copytree(ref / ".dvc/cache/files", repo / ".dvc/cache/files", copy_function=os.link, dirs_exist_ok=True)
    return repo


@dataclass
class Reference:
    repo: Path
    seconds: float
    stage_seconds: dict[str, float]
    stages: list[str]


@pytest.fixture(scope="session")
def smoke_reference(smoke_recorded) -> Reference:
    """The uninterrupted clean ``dvc repro`` of the smoke profile that the other end-to-end tests
    share (``smoke_recorded``: its warm worker preloaded the libraries only, while the chain's
    ``lopd repro`` preloads ``lopd`` and the tracking store too, so the byte comparison also checks
    that the two agree); a stage's seconds are its command's (``.lopd/timing``: process start to end)."""
    import json

    smoke = smoke_recorded
    timing = [json.loads(f.read_text()) for f in (smoke.repo / ".lopd/timing").glob("*.json")]
    stage_seconds = {t["stage"]: t["t_end"] - t["t_process"] for t in timing if t.get("kind") != "warm-worker"
                     and "t_process" in t}
    ran = [ln.split("'")[1] for ln in smoke.stdout.splitlines() if ln.startswith("Running stage '")]
    assert ran and set(ran) <= set(stage_seconds), (ran, sorted(stage_seconds))
    # a stage cannot outlast the repro: a larger figure is a mis-measured start (e.g. a stale LOPD_T0)
    assert all(0 < s <= smoke.seconds for s in stage_seconds.values()), (smoke.seconds, stage_seconds)
    return Reference(smoke.repo, smoke.seconds, stage_seconds, ran)


# ---------------------------------------------------------------- the kill chain


@dataclass
class Point:
    stage: str      # the DVC stage (LOPD_KILL_AT's stage), or for "timing" the stage's name prefix
    point: str      # a lopd.faults point (write, checkpoint, step, mlflow_close, lock), or "timing"
    nth: int = 1    # the n-th hit of the point in the stage's process
    at: float = 0.25  # timing only: the fraction of the reference's stage seconds after DVC starts its command

    @property
    def spec(self) -> str:
        return f"{self.stage}:{self.point}:{self.nth}"


# Every kill but one is at a named point (lopd/faults.py): the process that reaches it kills its own
# process group there, every time. hpo is killed inside a step of its search batch (a population of
# trials); train@lopd after its first checkpoint, then (resumed from it) inside its next population step,
# then as its MLflow runs close; evaluate after its first output file; the report as it closes the
# experiment's parent. The "lock" points tear dvc.lock (half the new lock on disk) and the next guard must
# restore it. The one kill by the clock (inside the resumed search's command) is a smoke check of a kill
# nobody chose.
# Each kill costs a guarded repro's start-up (about 11 s here), so there is one point per kind of state
# a kill can leave, not one per stage.
POINTS = [Point("hpo", "step", 3), Point("hpo", "timing"), Point("train@lopd", "checkpoint"),
          Point("train@lopd", "step"), Point("train@lopd", "mlflow_close"), Point("evaluate@lopd", "write"),
          Point("evaluate@lopd", "lock"), Point("report", "mlflow_close"), Point("report", "lock")]


@dataclass
class Kill:
    point: Point
    stage: str = "?"
    hit: str = ""         # named points: the line lopd.faults logged as it killed the group
    lock_after: str = ""  # the problem the next guard finds in dvc.lock, or "complete"
    pgid: int = 0
    guard_said: list[str] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)  # the stages DVC started in this run
    seconds: float = 0.0


def _wait(cond, timeout: float, poll: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(poll)
    return cond()


def _kill_by_time(run: Run, point: Point, ref: Reference) -> str:
    """The smoke check: SIGKILL the group ``point.at`` of the reference's stage time after DVC starts the
    first stage named ``point.stage*``. Returns the stage (where it lands is reported, not asserted)."""
    assert _wait(lambda: run.started(point.stage) or run.proc.poll() is not None, 1800, poll=0.02), "no start"
    assert run.proc.poll() is None, f"the repro ended before {point.stage} started:\n{run.text()[-3000:]}"
    i, stage = run.started(point.stage)
    _wait(lambda: run.after(i, "> lopd ") or run.proc.poll() is not None, 600, poll=0.01)
    time.sleep(point.at * ref.stage_seconds[stage])
    run.kill()
    return stage


def _kill_at(repo: Path, point: Point, ref: Reference, log: Path) -> Kill:
    k, t0 = Kill(point), time.monotonic()
    if point.point == "timing":
        run = Run(GUARDED, repo)
        k.stage = _kill_by_time(run, point, ref)
    else:
        before = log.read_text().splitlines() if log.exists() else []
        run = Run(GUARDED, repo, {"LOPD_KILL_AT": point.spec, "LOPD_KILL_LOG": str(log)})
        rc = run.finish(timeout=1800)
        hits = (log.read_text().splitlines() if log.exists() else [])[len(before):]
        assert rc == -signal.SIGKILL and len(hits) == 1, \
            f"{point.spec} was not reached (exit {rc}, kill log {hits}):\n{run.text()[-3000:]}"
        k.stage, k.hit = point.stage, hits[0]
    from lopd.workflow.lockguard import inspect_lock

    k.pgid = run.proc.pid
    k.lock_after = inspect_lock(repo).problem or "complete"
    k.guard_said = [ln for _, ln in run.lines if ln.startswith("lopd repro:")]
    k.ran = _ran(run)
    k.seconds = time.monotonic() - t0
    return k


def _ran(run: Run) -> list[str]:
    return [ln.split("'")[1] for _, ln in run.lines if ln.startswith("Running stage '")]


def _finish(repo: Path) -> Run:
    """One guarded repro after the kills: it must run to the end (no lock may block it)."""
    run = Run(GUARDED, repo)
    assert run.finish(timeout=3600) == 0, f"the rerun after the kills failed:\n{run.text()[-5000:]}"
    return run


# ---------------------------------------------------------------- the checks


def _out_files(repo: Path, stages: list[str]) -> dict[str, list[str]]:
    """Every file of every output of ``stages``, by stage (from the reference's dvc.lock)."""
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    files: dict[str, list[str]] = {}
    for st in stages:
        for out in lock[st].get("outs", []):
            p = repo / out["path"]
            found = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
            files.setdefault(st, []).extend(str(f.relative_to(repo)) for f in found)
    return files


def _rule(rel: str):
    return next((keys for pat, keys in KNOWN_NONDETERMINISTIC.items() if fnmatch.fnmatch(rel, pat)), False)


def _same(rel: str, a: bytes, b: bytes) -> str:
    """"same" (byte-identical), "known" (differs only where runs always differ), or "differs"."""
    if a == b:
        return "same"
    keys = _rule(rel)
    if keys is None:
        return "known"
    if keys:
        import json

        strip = lambda raw: {k: v for k, v in json.loads(raw).items() if k not in keys}  # noqa: E731
        return "known" if strip(a) == strip(b) else "differs"
    return "differs"


def compare_outputs(ref: Path, got: Path, stages: list[str]) -> dict[str, str]:
    """Every output file of ``stages`` (per the reference's dvc.lock): same / known / differs /
    missing / extra."""
    want = {f for fs in _out_files(ref, stages).values() for f in fs}
    have = {f for fs in _out_files(got, stages).values() for f in fs}
    out = {rel: _same(rel, (ref / rel).read_bytes(), (got / rel).read_bytes()) if rel in have else "missing"
           for rel in sorted(want)}
    out.update({rel: "extra" for rel in sorted(have - want)})
    return out


def lock_outs_differ(ref: Path, got: Path, stages: list[str]) -> list[str]:
    """Stages whose dvc.lock output hashes differ between the two runs."""
    a, b = (yaml.safe_load((r / "dvc.lock").read_text())["stages"] for r in (ref, got))
    outs = lambda e: [(o["path"], o.get("md5")) for o in e.get("outs", [])]  # noqa: E731
    return [st for st in stages if outs(a[st]) != outs(b[st])]


def running_mlflow_runs(repo: Path) -> list[tuple]:
    db = repo / "mlflow.db"
    if not db.exists():
        return []
    with sqlite3.connect(db) as con:
        return con.execute("SELECT run_uuid, name, status FROM runs WHERE status = 'RUNNING'").fetchall()


def leftovers(repo: Path) -> list[str]:
    """Stale locks, half-written files and checkpoints left in the workspace."""
    import json

    found = []
    rw = repo / ".dvc/tmp/rwlock"
    if rw.exists() and any(json.loads(rw.read_text() or "{}").get(m) for m in ("read", "write")):
        found.append(f".dvc/tmp/rwlock holds {rw.read_text()}")
    pats = ("*.lock", "*.tmp", ".*.tmp", "*.tmp/*", "*-journal")
    for f in repo.rglob("*"):
        rel = str(f.relative_to(repo))
        # mlflow.db.lock: the flock file of the tracking store (a kernel lock dies with its holder)
        if rel.startswith((".git/", ".dvc/", ".venv/")) or rel in ("dvc.lock", "mlflow.db.lock"):
            continue
        if any(fnmatch.fnmatch(f.name, p) or fnmatch.fnmatch(rel, p) for p in pats):
            found.append(rel)
    ck = repo / "checkpoints"
    found += [str(p.relative_to(repo)) for p in ck.iterdir()] if ck.exists() else []
    return found


def survivors(repo: Path, pgid: int) -> list[str]:
    """Live processes of the killed group, or working inside ``repo`` (none may outlive a kill)."""
    out = []
    for p in Path("/proc").iterdir():
        try:
            if not p.name.isdigit():
                continue
            stat = (p / "stat").read_text()
            state, _, pgrp = stat[stat.rindex(")") + 2:].split()[:3]
            if state != "Z" and (int(pgrp) == pgid or os.readlink(p / "cwd").startswith(str(repo))):
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                out.append(f"{p.name}: {cmd[:200]}")
        except (OSError, ValueError):
            continue
    return out


# ---------------------------------------------------------------- the test


def _report(ref: Reference, chain: "Chain") -> None:
    print(f"\nreference smoke dvc repro: {ref.seconds:.0f} s; stage seconds: "
          + ", ".join(f"{s} {t:.0f}" for s, t in ref.stage_seconds.items()))
    for n, k in enumerate(chain.kills, 1):
        print(f"kill {n:2d}: {k.point.spec if k.point.point != 'timing' else k.stage + ' (timing)':28s} "
              f"dvc.lock after: {k.lock_after}; {k.seconds:.0f} s" + (f"\n          {k.hit}" if k.hit else "")
              + "".join(f"\n          {s}" for s in k.guard_said))
    print(f"kill chain ({len(chain.kills)} kills + reruns to done): {chain.seconds:.0f} s = {chain.seconds / ref.seconds:.2f} x the reference")
    for cat in ("same", "known", "differs", "missing", "extra"):
        files = [f for f, c in chain.files.items() if c == cat]
        print(f"{cat} ({len(files)}): " + " ".join(files))


@dataclass
class Chain:
    repo: Path
    kills: list[Kill]
    final: Run
    seconds: float
    files: dict[str, str]  # output file -> same / known / differs / missing / extra


@pytest.fixture(scope="module")
def kill_chain(smoke_reference, tmp_path_factory) -> Chain:
    """Kill the guarded repro at every point of ``POINTS`` in turn, then rerun it until done."""
    ref = smoke_reference
    root = tmp_path_factory.mktemp("kill_chain")
    repo, log = _setup(root, ref.repo), root / "kills.log"
    t0, kills = time.monotonic(), []
    for point in POINTS:
        kills.append(k := _kill_at(repo, point, ref, log))
        print(f"killed {k.stage} at {point.point}: dvc.lock {k.lock_after}", flush=True)
        assert _wait(lambda: not survivors(repo, k.pgid), 10), f"survived the kill: {survivors(repo, k.pgid)}"
    final = _finish(repo)
    chain = Chain(repo, kills, final, time.monotonic() - t0, compare_outputs(ref.repo, repo, list(KILLED)))
    _report(ref, chain)
    return chain


def _said(run: Run) -> list[str]:
    return [ln for _, ln in run.lines if ln.startswith("lopd repro:")]


def test_every_named_point_was_hit_and_every_torn_lock_restored(kill_chain):
    kills = kill_chain.kills
    for k in kills:
        if k.point.point != "timing":  # the log line lopd.faults wrote as it killed: this stage, this point
            assert f" killed at {k.stage}:{k.point.point}:{k.point.nth}" in k.hit, (k.point, k.hit)
        # a named kill inside a stage's process leaves the lock DVC last wrote; a "lock" kill tears it
        if k.point.point in ("write", "checkpoint", "step", "mlflow_close"):
            assert k.lock_after == "complete", k
        if k.point.point == "lock":
            assert k.lock_after != "complete", k
    # what each kill left in dvc.lock is what the next guarded repro found and said
    for k, said in zip(kills, [k.guard_said for k in kills[1:]] + [_said(kill_chain.final)]):
        restored = any("restored the last complete lock" in s for s in said)
        assert restored == (k.lock_after != "complete"), (k, said)


def test_runs_killed_while_closing_are_marked_killed(kill_chain):
    """A stage killed as its MLflow run closes leaves it RUNNING; the reruns mark it KILLED (the report's
    parent, killed as it closed, is FINISHED by the report's rerun)."""
    closing = {k.point.stage: k.hit.rsplit(" ", 1)[1] for k in kill_chain.kills if k.point.point == "mlflow_close"}
    with sqlite3.connect(kill_chain.repo / "mlflow.db") as con:
        status = dict(con.execute("SELECT run_uuid, status FROM runs").fetchall())
    assert status[closing["train@lopd"]] == "KILLED", closing
    assert status[closing["report"]] == "FINISHED", closing


def test_the_rerun_after_kills_gives_the_same_bytes(kill_chain, smoke_reference):
    files = kill_chain.files
    bad = {f: c for f, c in files.items() if c not in ("same", "known")}
    assert not bad, f"outputs that differ from the uninterrupted run: {bad}"
    # a stage whose output files are all byte-identical has the same hashes in dvc.lock
    by_stage = _out_files(kill_chain.repo, list(KILLED))
    differ = [s for s in lock_outs_differ(smoke_reference.repo, kill_chain.repo, list(KILLED))
              if all(files.get(f) == "same" for f in by_stage.get(s, []))]
    assert not differ, f"dvc.lock output hashes differ for {differ}"
    assert sum(c == "same" for c in files.values()) > 30
    # the stages taken done stayed done: no kill run and not the final run ran them again
    ran = {s for k in kill_chain.kills for s in k.ran} | set(_ran(kill_chain.final))
    assert ran <= set(KILLED), f"stages taken done from the reference ran again: {sorted(ran - set(KILLED))}"


def test_the_rerun_after_kills_is_complete_and_leaves_nothing_behind(kill_chain):
    repo = kill_chain.repo
    st = subprocess.run([str(BIN / "dvc"), "status"], cwd=repo, env=_env(), capture_output=True, text=True)
    assert st.returncode == 0 and "up to date" in st.stdout, st.stdout + st.stderr
    assert not leftovers(repo), f"left in the workspace: {leftovers(repo)}"
    again = _finish(repo)
    assert "Running stage" not in again.text() and not _said(again), again.text()


def test_no_mlflow_run_is_left_running(kill_chain):
    assert not running_mlflow_runs(kill_chain.repo), running_mlflow_runs(kill_chain.repo)


def test_a_search_killed_inside_a_trial_resumes_with_the_same_trials(kill_chain):
    assert all(kill_chain.files[f] in ("same", "known") for f in SEARCH_RESTART_OUTPUTS), \
        {f: kill_chain.files[f] for f in SEARCH_RESTART_OUTPUTS}
