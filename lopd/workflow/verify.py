"""``lopd verify``: does this machine reproduce the committed results? Reruns chosen stages in a
scratch copy of the workspace and compares every output with the hash the committed ``dvc.lock``
records for it.

1. The scratch copy holds the checkout's tracked and untracked-but-not-ignored files (the code,
   ``params.yaml``, ``dvc.yaml`` and the committed ``dvc.lock``), no outputs, and a git repository of
   its own; its stages import the copy's ``lopd`` (``PYTHONPATH``), so nothing of the user's
   workspace is read after the copy or written at all: not its outputs, not its ``dvc.lock``, not
   its MLflow store.
2. ``dvc repro <stages>`` there runs those stages and the upstream stages they need (their outputs
   are absent), each pinned to the same CPU kernels as every stage (:mod:`lopd.compat.kernels`).
3. For each output of each stage DVC ran, the hash the scratch ``dvc.lock`` now records is compared
   with the committed one: ``identical`` or ``DIFFERENT`` (a directory output is one hash of its
   file listing, so one differing file makes it differ).

The default stages are the cheap ones the committed ``dvc.lock`` records: the splits, the base
policy, the shared experience bank and training seed 0's bank draw. Exit status 0 when every output
is identical, 1 when one differs, 2 on bad input (an unknown stage, no committed lock entry).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from lopd.errors import BadInput
from lopd.utils import copy_checkout

DEFAULT_STAGES = ("prepare", "base", "bank", "bank_draw@0")


def lock_outputs(lock_text: str) -> dict[str, dict[str, str | None]]:
    """``{stage: {output path: md5}}`` as a ``dvc.lock`` records them."""
    stages = (yaml.safe_load(lock_text) or {}).get("stages") or {}
    return {name: {o["path"]: o.get("md5") for o in st.get("outs", [])} for name, st in stages.items()}


def compare(committed: dict[str, dict[str, str | None]], rerun: dict[str, dict[str, str | None]],
            stages: list[str]) -> list[tuple[str, str, bool]]:
    """``(stage, output, identical)`` for every output of ``stages`` in the committed lock; an output the
    rerun did not record counts as different."""
    rows = []
    for stage in stages:
        for path, md5 in committed[stage].items():
            rows.append((stage, path, rerun.get(stage, {}).get(path) == md5 and md5 is not None))
    return rows


def scratch_copy(root: Path, dst: Path) -> Path:
    """The checkout's source and committed ``dvc.lock`` copied to ``dst``, a new git repo (no outputs)."""
    copy_checkout(root, dst)
    subprocess.run(["git", "init", "-q"], cwd=dst, check=True)
    return dst


def verify(root: str | Path = ".", stages: list[str] | None = None, keep: bool = False) -> int:
    """Rerun ``stages`` (default :data:`DEFAULT_STAGES`) in a scratch copy of ``root`` and print, per
    output, whether it is identical to the committed ``dvc.lock``'s record."""
    root = Path(root).resolve()
    stages = list(stages or DEFAULT_STAGES)
    lock = root / "dvc.lock"
    if not lock.exists():
        raise BadInput(f"no committed dvc.lock in {root}: nothing to compare against")
    committed = lock_outputs(lock.read_text())
    unknown = [s for s in stages if s not in committed]
    if unknown:
        raise BadInput(f"stage(s) {unknown} have no entry in {lock}; stages it records: {', '.join(committed)}")
    scratch, t0 = Path(tempfile.mkdtemp(prefix="lopd-verify-")), time.time()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(scratch), os.environ.get("PYTHONPATH")])),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "DVC_NO_ANALYTICS": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}
    try:
        scratch_copy(root, scratch)
        print(f"lopd verify: rerunning {', '.join(stages)} (and what they need) in {scratch}", flush=True)
        r = subprocess.run(["dvc", "repro", *stages], cwd=scratch, env=env, capture_output=True, text=True)
    except BaseException:  # an interrupted copy or repro leaves nothing behind
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    if r.returncode != 0:  # kept: the log and the partial run are what a user needs to see why
        print(r.stdout[-3000:] + r.stderr[-3000:], file=sys.stderr)
        print(f"lopd verify: dvc repro failed (exit {r.returncode}); scratch kept in {scratch}", file=sys.stderr)
        return 1
    rows = compare(committed, lock_outputs((scratch / "dvc.lock").read_text()), stages)
    if not keep:
        shutil.rmtree(scratch, ignore_errors=True)
    for stage, path, same in rows:
        print(f"{'identical' if same else 'DIFFERENT'}  {path}  ({stage})")
    n_diff = sum(not same for _, _, same in rows)
    print(f"lopd verify: {len(rows) - n_diff} of {len(rows)} outputs identical to the committed dvc.lock "
          f"({time.time() - t0:.0f} s)" + ("" if not keep else f"; scratch kept in {scratch}"))
    return 0 if n_diff == 0 else 1
