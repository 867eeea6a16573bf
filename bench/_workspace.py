"""Benchmarks run on the repo's pipeline outputs when they exist (``dvc repro cold_start``),
else on a tiny workspace built once under ``bench/out/ws`` (prepare → base → bank → cold start)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def workspace(workdir: str | None = None) -> Path:
    """A directory holding data/splits, models/base, models/bank, models/cold_start; becomes the cwd.
    ``workdir``: that pipeline directory (e.g. a ``bench/pipeline.sh`` run), as it is."""
    if workdir:
        os.chdir(workdir)
        return Path(workdir)
    if (REPO / "models/cold_start/phi0.safetensors").exists():
        os.chdir(REPO)
        return REPO
    ws = REPO / "bench/out/ws"
    ws.mkdir(parents=True, exist_ok=True)
    os.chdir(ws)
    if not (ws / "models/cold_start/phi0.safetensors").exists():
        from lopd.cli import main
        from lopd.config import deep_merge

        raw = yaml.safe_load((REPO / "params.yaml").read_text())
        raw = deep_merge(raw, {"envs": {"n_train": 96, "n_val": 32, "n_test": 16}, "cold_start": {"steps": 10},
                               "tracking": {"uri": f"sqlite:///{ws / 'mlflow.db'}"}})
        (ws / "params.yaml").write_text(yaml.safe_dump(raw))
        for cmd in ("prepare", "base", "bank", "cold-start"):
            assert main(["--params", "params.yaml", cmd]) == 0, cmd
    return ws


def params():
    from lopd.config import load_params

    return load_params(Path.cwd() / "params.yaml")


def selected_point() -> dict:
    """The search's selected m, K, n_ret and student lr (``hpo/best_params.yaml`` of the cwd; {} before the search)."""
    best = Path("hpo/best_params.yaml")
    found = yaml.safe_load(best.read_text()) if best.exists() else {}
    return {k: v for k, v in found.items() if k in ("margin", "K", "n_ret", "lr_student")}


def rollout_workload(batch: int):
    """The rollout benches' workload: ``(params, backbone, tasks, envs, rollout kwargs)`` = the
    default base policy (student adapter active, eval mode; torch threads from ``model.torch_threads``),
    the first ``batch`` tool tasks of the train split (multi-turn episodes), and the evaluation
    stage's lengths and temperature. Imports ``lopd`` only when called (a bench may first point
    ``sys.path`` at another checkout)."""
    import torch

    from lopd import data
    from lopd.engine.evaluation import make_envs
    from lopd.paths import Paths
    from lopd.stages.common import load_backbone

    p = params()
    torch.set_num_threads(p.model.torch_threads)
    paths = Paths(Path.cwd())
    bb = load_backbone(p, paths)
    bb.mode("student")
    bb.model.eval()
    tasks = [t for t in data.SplitReader(paths.splits, role="base").load("train") if t.domain == "tool"][:batch]
    kw = dict(max_new_tokens=p.evaluate.max_new_tokens, max_len=p.model.max_seq_len,
              temperature=p.evaluate.temperature)
    return p, bb, tasks, make_envs(p), kw


def child_results(argv: list[str], arms: tuple[str, ...], **run_kw) -> dict[str, dict]:
    """Run ``argv + ["--child", arm]`` in a fresh process per arm, one after the other (so each process's
    peak memory is its own); each child prints its figures as one JSON line, returned by arm."""
    import json
    import subprocess

    out = {}
    for arm in arms:
        r = subprocess.run([*argv, "--child", arm], capture_output=True, text=True, **run_kw)
        line = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        if r.returncode != 0 or not line:
            raise SystemExit(f"child {arm} failed:\n{r.stderr[-3000:]}")
        out[arm] = json.loads(line[-1])
    return out
