"""``lopd lock-status``: does the committed ``dvc.lock`` describe this tree? Results may be committed only from a
clean ``dvc repro`` of the tree that commits them; a lock whose recorded inputs differ from the tree's, or whose
recorded reports differ from the committed ones, describes some other tree.

:func:`stale` asks DVC (``dvc status --json``, which compares every stage's recorded deps and outs with the
workspace) and keeps what a checkout can judge without the DVC cache:

* a stage of ``dvc.yaml`` that the lock does not record, or whose command changed;
* a changed dependency that no stage produces: code, ``params.yaml`` keys, committed inputs such as
  ``registration/ledger.yaml`` (a dependency that a stage writes, e.g. ``models/base``, is judged where it is
  written: a fresh clone has not got it);
* a changed output under ``reports/`` (committed in git, not cached): an edited report, or a figure the lock
  does not know. Outputs merely absent from the cache (models, runs) are not staleness.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from lopd.errors import BadInput

COMMITTED_OUTS = ("reports/",)  # outputs committed in git: a checkout holds them, so they can be compared


def _lock_outs(root: Path) -> set[str]:
    lock = yaml.safe_load((root / "dvc.lock").read_text()) or {}
    return {o["path"].rstrip("/") for st in (lock.get("stages") or {}).values() for o in st.get("outs") or []}


def _produced(path: str, outs: set[str]) -> bool:
    """Whether a stage writes ``path``: it is an output, lies under one (``data/confirm/manifest.json`` in
    ``data/confirm``), or holds some (``models/draws`` over ``models/draws/bank-0``)."""
    path = path.rstrip("/")
    return any(path == o or path.startswith(o + "/") or o.startswith(path + "/") for o in outs)


def _dvc_status(root: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "dvc", "status", "--json"], cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BadInput(f"dvc status failed in {root} (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout or "{}")


def stale(root: Path) -> list[str]:
    """Why ``root``'s ``dvc.lock`` does not describe ``root``'s tree, one line per stage and cause; [] when it
    does. :class:`BadInput` when there is no ``dvc.lock`` or DVC cannot read the pipeline."""
    root = Path(root)
    if not (root / "dvc.lock").exists():
        raise BadInput(f"{root / 'dvc.lock'} not found: no committed results to check")
    produced = _lock_outs(root)
    lines = []
    for stage, entries in sorted(_dvc_status(root).items()):
        for e in entries:
            if isinstance(e, str):  # "changed command", "always changed"
                if e == "changed command":
                    lines.append(f"{stage}: its command changed")
                continue
            for path, what in (e.get("changed deps") or {}).items():
                if isinstance(what, dict):  # a params file: {key: new | modified | deleted}
                    lines.append(f"{stage}: params {', '.join(f'{k} {v}' for k, v in sorted(what.items()))}")
                elif path == "params.yaml":
                    lines.append(f"{stage}: params {what}")
                elif not _produced(path, produced):
                    lines.append(f"{stage}: dependency {path} {what}")
            for path, what in (e.get("changed outs") or {}).items():
                if path.startswith(COMMITTED_OUTS) and what != "not in cache":
                    lines.append(f"{stage}: committed output {path} {what}")
    return lines


def main(root: Path) -> int:
    """Print the verdict; 0 when the lock describes the tree, 1 when it is stale."""
    lines = stale(root)
    if not lines:
        print(f"{root / 'dvc.lock'} describes this tree: every recorded code, params and committed dependency and "
              "every committed report matches")
        return 0
    print(f"{root / 'dvc.lock'} is STALE: {len(lines)} difference(s) between what it records and this tree:")
    for line in lines[:200]:
        print(f"  {line}")
    if len(lines) > 200:
        print(f"  ... and {len(lines) - 200} more")
    return 1
