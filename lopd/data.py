"""Sealed task splits.

``prepare`` writes ``train``/``val``/``test`` task files (JSON lines, disjoint by task id *and by
content*, all in the *target* worlds) and a manifest holding each file's SHA-256, each task's
content hash (:func:`content_key`), the splits' content overlap (0 by construction) and the worlds
record (per domain: target and pretraining world names with their families, a hash of
their conventions, ``null_world``). :class:`SplitReader` is the only way to read
them: it checks the hash against the manifest, and it refuses ``test`` unless it was
created with the evaluation role. The role is an explicit constructor argument given by
the stage entry point, not a convention.

Every successful read is appended to :data:`ACCESS_LOG` (split, role, hash) so each stage
can record in its own outputs which splits it read — the leakage audit reads those.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

from lopd.envs import make_env
from lopd.envs.base import Task
from lopd.errors import BadInput, SplitAccessError
from lopd.utils import atomic_write_text, content_overlap, hash_files, verify_files, write_manifest

SPLITS = ("train", "val", "test")
Role = Literal["prepare", "base", "bank", "cold_start", "probe", "hpo", "train", "sensitivity", "evaluate", "test"]
EVAL_ROLE = "evaluate"
ACCESS_LOG: list[dict] = []


def content_key(task: Task) -> str:
    """A task's content: its domain and prompt, which name the world, the family, the operation and
    every argument (the canonical spec the policy sees). Two tasks with one key are the same task
    whatever their ids; in a null world their hidden conventions may differ, and they still count
    as one (a prompt learnt in train must not come back in test). 16 hex digits of SHA-256."""
    return hashlib.sha256(json.dumps([task.domain, " ".join(task.prompt.split())]).encode()).hexdigest()[:16]


# candidates drawn per world before a family's space counts as too small for the requested sizes
_MAX_DRAWS_PER_TASK = 64


def generate_splits(envs_params) -> dict[str, list[Task]]:
    """Tasks for every domain and split, drawn **without replacement** from the space of task contents
    (:func:`content_key`): no task appears twice in one split, and no val or test task shares its
    content with a train task or with each other.

    Per domain, one seeded stream of candidates is dealt round-robin over the target worlds (as
    the worlds' own generator does), train first, then val, then test; a candidate whose content
    was already dealt is skipped. If a world runs out of distinct candidates (its family's space is
    smaller than the sizes ask), generation stops with an error naming the family and the sizes."""
    counts = {"train": envs_params.n_train, "val": envs_params.n_val, "test": envs_params.n_test}
    out: dict[str, list[Task]] = {s: [] for s in SPLITS}
    for d_i, domain in enumerate(envs_params.domains):
        env = make_env(domain, envs_params)
        n_worlds = len(env.worlds["target"])
        per_world = -(-sum(counts.values()) // n_worlds)
        cands = env.generate(envs_params.seed * 1000 + d_i, _MAX_DRAWS_PER_TASK * per_world * n_worlds)
        queues = [iter(cands[w::n_worlds]) for w in range(n_worlds)]
        seen: set[str] = set()
        for split in SPLITS:
            for j in range(counts[split]):
                out[split].append(_next_fresh(queues[j % n_worlds], seen, domain, counts, n_worlds))
    ids = [t.task_id for s in SPLITS for t in out[s]]
    if len(set(ids)) != len(ids):  # ids embed the stream index: a guard, not an expected case
        raise RuntimeError("task ids collide across splits")
    return out


def _next_fresh(queue, seen: set[str], domain: str, counts: dict, n_worlds: int) -> Task:
    first = None
    for t in queue:
        first = first or t
        key = content_key(t)
        if key not in seen:
            seen.add(key)
            return t
    sizes = ", ".join(f"n_{s} {n}" for s, n in counts.items())
    raise BadInput(f"envs: the {domain} family {getattr(first, 'family', '?')!r} has fewer distinct tasks per world "
                   f"than the splits ask ({sizes} over {n_worlds} target worlds, about "
                   f"{-(-sum(counts.values()) // n_worlds)} per world, none repeated): lower envs.n_train / n_val / "
                   f"n_test or raise envs.n_target_worlds")


def worlds_record(envs_params) -> dict:
    """Per world-based domain: the target and pretraining worlds (name -> family) and the
    SHA-256 of their conventions; plus the world settings."""
    rec: dict = {"null_world": envs_params.null_world, "n_options": envs_params.n_options, "domains": {}}
    for domain in envs_params.domains:
        env = make_env(domain, envs_params)
        if hasattr(env, "worlds_summary"):
            rec["domains"][domain] = env.worlds_summary()
    return rec


def write_splits(out_dir: Path, splits: dict[str, list[Task]], worlds: dict | None = None) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest: dict = {"files": {}}
    if worlds is not None:
        manifest["worlds"] = worlds
    names = {split: f"{split}.jsonl" for split in splits}
    for split, tasks in splits.items():
        text = "".join(json.dumps(t.to_json(), sort_keys=True) + "\n" for t in tasks)
        atomic_write_text(out_dir / names[split], text)
    hashes = hash_files(out_dir, names.values())
    for split, tasks in splits.items():
        manifest["files"][split] = {"path": names[split], "sha256": hashes[names[split]], "n": len(tasks),
                                    "content": [content_key(t) for t in tasks]}
    manifest["content_overlap"] = content_overlap({s: e["content"] for s, e in manifest["files"].items()})
    write_manifest(out_dir / "manifest.json", manifest)
    return manifest


def read_manifest(path: Path, what: str, first: str) -> dict:
    """A split's ``manifest.json``; a clear error when it is missing (``first``: what writes it) or corrupt."""
    if not path.exists():
        raise BadInput(f"{what} manifest not found: {path} ({first})")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise BadInput(f"{what} manifest {path} is corrupt: {e}") from None


def read_verified_tasks(root: Path, entry: dict, what: str, rerun: str) -> tuple[list[Task], str]:
    """The tasks of a manifest ``entry``'s file (``path``, ``sha256``) once its SHA-256 matches, and the digest."""
    digest = verify_files(root, {entry["path"]: entry["sha256"]}, lambda p, got: (
        f"{what} file missing: {p}" if got is None else
        f"{what} file {p} is corrupt: sha256 {got[:12]}… does not match the manifest's "
        f"{entry['sha256'][:12]}… ({rerun})"))[entry["path"]]
    lines = (root / entry["path"]).read_text().splitlines()
    return [Task.from_json(json.loads(line)) for line in lines if line.strip()], digest


class SplitReader:
    """Reads sealed splits for one stage role. Only ``role='evaluate'`` may read ``test``."""

    def __init__(self, root: str | Path, role: Role):
        self.root = Path(root)
        self.role = role
        self.manifest = read_manifest(self.root / "manifest.json", "split", "run the prepare stage first")

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
        tasks, digest = read_verified_tasks(self.root, entry, "split", "rerun prepare: dvc repro -f prepare")
        self._check_worlds(split, tasks)
        ACCESS_LOG.append({"split": split, "role": self.role, "sha256": digest})
        return tasks

    def worlds(self) -> dict:
        """The manifest's worlds record (empty when the splits were written without one)."""
        return self.manifest.get("worlds", {}) if isinstance(self.manifest, dict) else {}

    def _check_worlds(self, split: str, tasks: list[Task]) -> None:
        """Every task of a split must live in a target world of its domain: a pretraining
        world in a split would let the base policy's training data reach the evaluation."""
        domains = self.worlds().get("domains", {})
        for t in tasks:
            if t.domain in domains and t.world not in domains[t.domain]["target"]:
                raise BadInput(f"split {split!r}: task {t.task_id} is in world {t.world!r}, which is not a target "
                               f"world of domain {t.domain!r} in {self.root / 'manifest.json'} (rerun prepare)")
