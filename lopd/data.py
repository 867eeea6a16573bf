"""Sealed task splits.

``prepare`` writes ``train``/``val``/``test`` task files (JSON lines, disjoint by task id)
and a manifest holding each file's SHA-256. :class:`SplitReader` is the only way to read
them: it checks the hash against the manifest, and it refuses ``test`` unless it was
created with the evaluation role. The role is an explicit constructor argument given by
the stage entry point, not a convention.

Every successful read is appended to :data:`ACCESS_LOG` (split, role, hash) so each stage
can record in its own outputs which splits it read — the leakage audit reads those.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Literal

from lopd.envs import make_env
from lopd.envs.base import Task
from lopd.errors import BadInput, SplitAccessError

SPLITS = ("train", "val", "test")
Role = Literal["prepare", "base", "bank", "cold_start", "probe", "hpo", "train", "sensitivity", "evaluate", "test"]
EVAL_ROLE = "evaluate"
ACCESS_LOG: list[dict] = []


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def generate_splits(envs_params) -> dict[str, list[Task]]:
    """Tasks for every domain and split. Each split uses its own generator seed, and any
    task id that collides across splits is dropped from the later split (ids embed the seed,
    so collisions cannot happen by construction; the check is a guard)."""
    counts = {"train": envs_params.n_train, "val": envs_params.n_val, "test": envs_params.n_test}
    out: dict[str, list[Task]] = {s: [] for s in SPLITS}
    for d_i, domain in enumerate(envs_params.domains):
        env = make_env(domain, envs_params)
        for s_i, split in enumerate(SPLITS):
            seed = envs_params.seed * 1000 + 10 * s_i + d_i
            out[split].extend(env.generate(seed, counts[split]))
    seen: set[str] = set()
    for split in SPLITS:
        ids = [t.task_id for t in out[split]]
        if len(set(ids)) != len(ids) or seen & set(ids):
            raise RuntimeError(f"task ids collide in split {split}")
        seen |= set(ids)
    return out


def write_splits(out_dir: Path, splits: dict[str, list[Task]]) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = {"files": {}}
    for split, tasks in splits.items():
        path = out_dir / f"{split}.jsonl"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            for t in tasks:
                f.write(json.dumps(t.to_json(), sort_keys=True) + "\n")
        os.replace(tmp, path)
        manifest["files"][split] = {"path": path.name, "sha256": sha256_file(path), "n": len(tasks)}
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


class SplitReader:
    """Reads sealed splits for one stage role. Only ``role='evaluate'`` may read ``test``."""

    def __init__(self, root: str | Path, role: Role):
        self.root = Path(root)
        self.role = role
        mpath = self.root / "manifest.json"
        if not mpath.exists():
            raise BadInput(f"split manifest not found: {mpath} (run the prepare stage first)")
        try:
            self.manifest = json.loads(mpath.read_text())
        except json.JSONDecodeError as e:
            raise BadInput(f"split manifest {mpath} is corrupt: {e}") from None

    def load(self, split: str) -> list[Task]:
        if split not in SPLITS:
            raise BadInput(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
        if split == "test" and self.role != EVAL_ROLE:
            raise SplitAccessError(
                f"the test split is sealed: stage role {self.role!r} may not read it; "
                f"only the {EVAL_ROLE!r} stage may (tune on 'val')"
            )
        files = self.manifest.get("files") if isinstance(self.manifest, dict) else None
        if not isinstance(files, dict):
            raise BadInput(f"split manifest {self.root / 'manifest.json'} is corrupt: no 'files' table")
        entry = files.get(split)
        if entry is None:
            raise BadInput(f"split {split!r} missing from manifest {self.root / 'manifest.json'}")
        path = self.root / entry["path"]
        if not path.exists():
            raise BadInput(f"split file missing: {path}")
        digest = sha256_file(path)
        if digest != entry["sha256"]:
            raise BadInput(
                f"split file {path} is corrupt: sha256 {digest[:12]}… does not match the manifest's "
                f"{entry['sha256'][:12]}… (rerun prepare: dvc repro -f prepare)"
            )
        tasks = [Task.from_json(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
        ACCESS_LOG.append({"split": split, "role": self.role, "sha256": digest})
        return tasks
