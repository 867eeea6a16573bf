"""``lopd launch``: the out-of-date stages as Ray jobs in git worktrees, fanned back in from
DVC's run-cache.

Fast part: the scheduling and plan logic on a hand-made graph, then a toy DVC pipeline (tiny
Python commands, a 2 x 2 matrix, a ``persist`` stage, an uncached output read downstream) on a
local Ray cluster. Slow part (``-m slow``): the smoke matrix of the real pipeline, compared
with a serial ``dvc repro``. Every command a stage runs is counted by a ``sitecustomize`` hook
that appends each Python process's argv and cwd to a marker file (independent of DVC's log).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import yaml

from lopd.launch_plan import Job, Plan, ready_stages

BIN = Path(sys.executable).parent
REPO_ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- pure scheduling

def _job(name, upstream=(), in_main=False):
    return Job(name=name, kind=name.split("@")[0], lockfile="dvc.lock", lock_key=name, upstream=tuple(upstream),
               in_main=in_main, checkout=tuple(upstream), copy_inputs=())


def _plan(jobs, launch):
    order = [j.name for j in jobs]
    return Plan(jobs={j.name: j for j in jobs}, launch=set(launch), order=order, lockfiles=["dvc.lock"])


def test_ready_stages_follow_the_graph():
    jobs = [_job("prep"), _job("search", ["prep"], in_main=True), _job("probe", ["prep"], in_main=True),
            _job("train@a", ["prep", "search"]), _job("train@b", ["prep", "search"]),
            _job("report", ["train@a", "train@b"])]
    plan = _plan(jobs, [j.name for j in jobs])
    pending = set(plan.launch)
    assert ready_stages(plan, pending, set(), False) == ["prep"]
    # both main-workspace stages are ready, but DVC's lock allows one repro per workspace
    assert ready_stages(plan, pending - {"prep"}, {"prep"}, False) == ["search"]
    assert ready_stages(plan, pending - {"prep"}, {"prep"}, True) == []
    assert ready_stages(plan, {"probe", "train@a", "train@b", "report"}, {"prep", "search"}, False) == \
        ["probe", "train@a", "train@b"]
    assert ready_stages(plan, {"report"}, {"prep", "search", "train@a"}, False) == []
    assert ready_stages(plan, {"report"}, {"prep", "search", "train@a", "train@b"}, False) == ["report"]


def test_ready_stages_ignore_upstream_that_is_up_to_date():
    jobs = [_job("prep"), _job("train@a", ["prep"]), _job("report", ["train@a"])]
    plan = _plan(jobs, ["train@a", "report"])  # prep is up to date in the main workspace
    assert ready_stages(plan, {"train@a", "report"}, set(), False) == ["train@a"]


# ----------------------------------------------------------------------------- toy pipeline

TOY_DVC = """
stages:
  gen:
    cmd: python gen.py
    deps: [gen.py]
    params: [gen]
    outs: [data/gen.txt]
  search:
    cmd: python search.py
    deps: [search.py, data/gen.txt]
    outs:
      - search/journal.log: {persist: true, cache: false}
      - search/best.txt
  work:
    matrix: {arm: [a, b], seed: [0, 1]}
    cmd: python work.py ${item.arm} ${item.seed}
    deps: [work.py, data/gen.txt, search/best.txt]
    params: [work.sleep, "work.${item.arm}"]
    outs:
      - out/${item.arm}-${item.seed}.txt
    metrics:
      - out/${item.arm}-${item.seed}.json: {cache: false}
  summary:
    cmd: python summary.py
    deps: [summary.py, out]
    outs: [summary.txt]
"""

TOY_SCRIPTS = {
    "gen.py": """
        import pathlib, yaml
        n = yaml.safe_load(open("params.yaml"))["gen"]["n"]
        pathlib.Path("data").mkdir(exist_ok=True)
        pathlib.Path("data/gen.txt").write_text(" ".join(str(i * i) for i in range(n)))
    """,
    "search.py": """
        import pathlib
        pathlib.Path("search").mkdir(exist_ok=True)
        with open("search/journal.log", "a") as f:  # persistent state, like an Optuna journal
            f.write("trial\\n")
        total = sum(int(x) for x in pathlib.Path("data/gen.txt").read_text().split())
        pathlib.Path("search/best.txt").write_text(str(total % 7))
    """,
    "work.py": """
        import json, pathlib, sys, time, yaml
        arm, seed = sys.argv[1], int(sys.argv[2])
        p = yaml.safe_load(open("params.yaml"))["work"]
        time.sleep(p["sleep"])
        best = int(pathlib.Path("search/best.txt").read_text())
        value = (p[arm] * 10 + seed) * (best + 1)
        pathlib.Path("out").mkdir(exist_ok=True)
        pathlib.Path(f"out/{arm}-{seed}.txt").write_text(str(value))
        pathlib.Path(f"out/{arm}-{seed}.json").write_text(json.dumps({"value": value}))
    """,
    "summary.py": """
        import json, pathlib
        vals = {p.stem: json.loads(p.read_text())["value"] for p in sorted(pathlib.Path("out").glob("*.json"))}
        pathlib.Path("summary.txt").write_text(json.dumps(vals, sort_keys=True))
    """,
}

SITECUSTOMIZE = """
import json, os, sys, time
_p = os.environ.get("LAUNCH_TEST_MARKS")
if _p:
    with open(_p, "a") as _f:
        _f.write(json.dumps({"t": time.time(), "argv": sys.argv, "cwd": os.getcwd()}) + "\\n")
"""


def _env(marks: Path | None = None) -> dict:
    hook = marks.parent / "hook" if marks else None
    if hook is not None:
        hook.mkdir(exist_ok=True)
        (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    py_path = os.pathsep.join(p for p in (str(hook) if hook else "", str(REPO_ROOT), os.environ.get("PYTHONPATH", ""))
                              if p)
    env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", "PYTHONPATH": py_path, "DVC_NO_ANALYTICS": "1",
           "MLFLOW_DISABLE_TELEMETRY": "true", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com", "RAY_DISABLE_USAGE_STATS": "1"}
    if marks is not None:
        env["LAUNCH_TEST_MARKS"] = str(marks)
    return env


def _run(cmd, cwd, env, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _make_toy(root: Path, sleep: float = 3.0) -> Path:
    root.mkdir(parents=True)
    (root / "dvc.yaml").write_text(TOY_DVC)
    for name, src in TOY_SCRIPTS.items():
        (root / name).write_text(textwrap.dedent(src).lstrip())
    params = {"gen": {"n": 5}, "work": {"sleep": sleep, "a": 1, "b": 2},
              "launch": {"resources": {"default": {"num_cpus": 1, "num_gpus": 0},
                                       "work": {"num_cpus": 1, "num_gpus": 2}},
                         "max_retries": 0, "worktree_root": None, "shared_paths": [], "keep_worktrees": False}}
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (root / ".gitignore").write_text("/data/\n/search/\n/out/\n/summary.txt\n")
    env = _env()
    for cmd in (["git", "init", "-q"], [str(BIN / "dvc"), "init", "-q"], ["git", "add", "-A"],
                ["git", "commit", "-qm", "toy"]):
        r = _run(cmd, root, env)
        assert r.returncode == 0, r.stderr
    return root


def _launch_cmd(params: str, log_dir: Path, gpus: int = 4, cpus: int = 4) -> list[str]:
    return [sys.executable, "-m", "lopd.launch", "--params", params, "--num-cpus", str(cpus), "--num-gpus", str(gpus),
            "--log-dir", str(log_dir)]


def _events(log_dir: Path) -> list[dict]:
    return [json.loads(ln) for ln in (log_dir / "events.jsonl").read_text().splitlines()]


def _intervals(events: list[dict], kind: str) -> list[tuple[float, float, str, list[str]]]:
    """(start, end, stage, gpu ids) of every attempt of the jobs whose stage name starts with ``kind@``."""
    starts = {(e["stage"], e["attempt"]): e for e in events if e["event"] == "start"}
    out = []
    for e in events:
        if e["event"] == "end" and e["stage"].startswith(kind + "@"):
            s = starts[(e["stage"], e["attempt"])]
            out.append((s["t"], e["t"], e["stage"], s["gpu_ids"]))
    return out


def check_gpu_schedule(events: list[dict], kind: str, per_job: int, total: int) -> int:
    """Never more than total // per_job jobs of ``kind`` at once, concurrent ones on disjoint GPU
    ids, each with exactly ``per_job`` ids. Returns the largest number seen at once."""
    iv = _intervals(events, kind)
    assert iv, f"no {kind} jobs in the event log"
    peak = 0
    for t0, _, stage, gpus in iv:
        assert len(gpus) == per_job, (stage, gpus)
        live = [x for x in iv if x[0] <= t0 < x[1]]
        peak = max(peak, len(live))
        ids = [g for x in live for g in x[3]]
        assert len(ids) == len(set(ids)), f"concurrent {kind} jobs share GPU ids: {live}"
    assert peak <= total // per_job, f"{peak} {kind} jobs at once with {total} GPUs and {per_job} per job"
    return peak


def _marks(path: Path) -> list[dict]:
    """The stage commands among the Python processes the hook saw: not dvc, not Ray's own
    processes, not ``python -m``/``-c`` helpers (the launcher, an MLflow sidecar)."""
    rows = [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []
    return [m for m in rows if m["argv"] and m["argv"][0] not in ("-m", "-c")
            and Path(m["argv"][0]).name != "dvc" and "/ray/" not in m["argv"][0]]


def _ran_in(marks: list[dict], root: Path, since: float) -> list[list[str]]:
    return [m["argv"] for m in marks if m["t"] >= since and Path(m["cwd"]) == root]


def _lock_outs(root: Path) -> dict[str, str]:
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    return {o["path"]: o["md5"] for st in lock["stages"].values() for o in st.get("outs", [])}


ray = pytest.importorskip("ray", reason="lopd launch needs Ray (pip install 'lopd[cluster]')")


def test_toy_pipeline_fans_out_and_back_in(tmp_path):
    serial = _make_toy(tmp_path / "serial", sleep=0)
    r = _run([str(BIN / "dvc"), "repro"], serial, _env())
    assert r.returncode == 0, r.stdout + r.stderr

    root = _make_toy(tmp_path / "toy")
    marks, logs = tmp_path / "marks.jsonl", tmp_path / "logs"
    r = _run(_launch_cmd("params.yaml", logs), root, _env(marks))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    summary = json.loads((logs / "summary.json").read_text())
    events = _events(logs)
    # 4 logical GPUs, 2 per work job: at most 2 at once, and two did overlap, on disjoint ids
    assert check_gpu_schedule(events, "work", per_job=2, total=4) == 2
    # every stage command ran exactly once, in a worktree, except `search` (persist: main workspace)
    argv = [m["argv"] for m in _marks(marks)]
    assert sorted(a[0] for a in argv) == sorted(["gen.py", "search.py", "summary.py"] + ["work.py"] * 4), argv
    fan_in_t = next(e["t"] for e in events if e["event"] == "fan-in start")
    assert _ran_in(_marks(marks), root, fan_in_t) == []
    assert summary["fan_in"]["ran"] == [] and summary["fan_in"]["status_clean"]
    # `search` ran in the main workspace as `dvc repro search`, which restored `gen` there first
    assert summary["done"]["search"]["ran"] == ["search"]
    assert set(summary["fan_in"]["restored"]) == {"work@a-0", "work@a-1", "work@b-0", "work@b-1", "summary"}
    st = _run([str(BIN / "dvc"), "status", "--json"], root, _env())
    assert json.loads(st.stdout) == {}
    # the same outputs as a serial `dvc repro` (with cache: false metrics read downstream)
    assert _lock_outs(root) == _lock_outs(serial)
    assert (root / "summary.txt").read_text() == (serial / "summary.txt").read_text()
    assert not [p for p in (root / ".dvc/tmp/launch").iterdir() if p.is_dir() and p.name != "logs"], \
        "finished worktrees are removed"
    assert "worktree" not in _run(["git", "worktree", "list"], root, _env()).stdout.split("\n", 1)[-1]
