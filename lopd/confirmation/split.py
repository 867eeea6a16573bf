"""The confirmatory test split: drawn by content exclusion from train, val and the pilot's test, sealed.

Content here is both what the policy reads and what solves the task: :func:`solution_key` is the task's
scripted solution (its actions in its world's conventions). Two tasks in different worlds can have different
prompts and the same solution (their conventions and arguments coincide); retrieval can then hand the
teacher a train task's actions for a test task, so the confirmatory split excludes every task whose prompt
(:func:`lopd.data.content_key`) *or* solution equals one of train, val or test, or of a task already drawn.

The split is generated from its own candidate stream (``envs.seed``, domain, and a fixed offset: unrelated to
the streams ``prepare`` deals from), dealt round-robin over the target worlds as ``prepare`` deals. The sealed
splits are regenerated in memory to know their solutions; their prompt keys must equal the manifest's (else
the splits on disk are not the ones these params make, and nothing is written). No sealed file is read.

:class:`ConfirmReader` is the only way to read it: only the role ``confirm_evaluate`` may, and the file's
SHA-256 must match its manifest.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from lopd import data as data_mod
from lopd.envs import make_env
from lopd.envs.base import Task
from lopd.errors import BadInput, SplitAccessError
from lopd.utils import atomic_write_text, hash_files, write_manifest

SPLIT = "confirm"
ROLE = "confirm_evaluate"
STREAM_OFFSET = 777_000  # the confirm stream's seed: envs.seed * 1000 + domain index + this (+ 1000 per round)


def solution_key(env, task: Task) -> str:
    """A task's solution: the scripted actions in its conventions (no noise). 16 hex digits of SHA-256."""
    actions = [" ".join(a.split()) for a in env.solve(task)]
    return hashlib.sha256(json.dumps([task.domain, actions]).encode()).hexdigest()[:16]


def generate_confirm(envs_params, n_confirm: int, manifest: dict, split_round: int = 0) -> tuple[list[Task], dict]:
    """``n_confirm`` tasks per domain, none sharing a prompt or a solution with train, val, test or each
    other; and the audit record: per split the solution keys' overlaps, and the pilot's own solution twins
    (test tasks whose solution equals a train task's: the leak this split closes).

    ``split_round`` r: the r-th fresh split. Rounds 0..r are drawn in turn, each from its own candidate stream
    and excluding by prompt and by solution the sealed splits and every earlier round; round r is returned. Round 0
    is the split of earlier versions (read under the ledger's registrations); a later round shares no task with it."""
    sealed = data_mod.generate_splits(envs_params)
    files = manifest.get("files", {})
    for split, tasks in sealed.items():
        want = (files.get(split) or {}).get("content")
        if want != [data_mod.content_key(t) for t in tasks]:
            raise BadInput(f"data/splits/manifest.json: the {split} split's content keys differ from what these "
                           "envs params generate (rerun prepare: dvc repro prepare)")
    out: list[Task] = []
    # round 0's manifest stays byte-identical to the earlier versions' (the ledger knows a split by its md5)
    audit: dict = {"pilot_test_solution_twins": 0, "by_domain": {}, **({"split_round": split_round} if split_round else {})}
    for d_i, domain in enumerate(envs_params.domains):
        env = make_env(domain, envs_params)
        mine = {s: [t for t in ts if t.domain == domain] for s, ts in sealed.items()}
        prompts = {data_mod.content_key(t) for ts in mine.values() for t in ts}
        sols = {s: {solution_key(env, t) for t in ts} for s, ts in mine.items()}
        twins = sum(solution_key(env, t) in sols["train"] for t in mine["test"])
        audit["pilot_test_solution_twins"] += twins
        banned = set().union(*sols.values())
        n_worlds = len(env.worlds["target"])
        per_world = -(-n_confirm // n_worlds)
        skipped = 0
        for r in range(split_round + 1):
            drawn, n_skip = _draw_round(env, domain, envs_params.seed * 1000 + d_i + STREAM_OFFSET + 1000 * r,
                                        data_mod._MAX_DRAWS_PER_TASK * per_world * n_worlds, n_worlds, n_confirm,
                                        prompts, banned)
            skipped += n_skip
        out += drawn  # the last round's
        audit["by_domain"][domain] = {"n": n_confirm, "candidates_skipped": skipped, "pilot_test_solution_twins": twins}
    audit["pilot_test_n"] = len(sealed["test"])
    return out, audit


def _draw_round(env, domain: str, seed: int, n_cands: int, n_worlds: int, n_confirm: int, prompts: set,
                banned: set) -> tuple[list[Task], int]:
    """``n_confirm`` tasks of ``domain`` from the candidate stream ``seed``, dealt round-robin over the target worlds,
    none whose prompt is in ``prompts`` or whose solution is in ``banned`` (both grow with every task drawn)."""
    cands = env.generate(seed, n_cands)
    queues = [iter(cands[w::n_worlds]) for w in range(n_worlds)]
    out: list[Task] = []
    skipped, live, w = 0, list(range(n_worlds)), 0
    while len(out) < n_confirm:
        if not live:
            raise BadInput(f"envs: the {domain} domain has too few tasks left, after excluding train, val and test (and "
                           f"every earlier confirmatory round) by prompt and by solution, for envs.n_confirm {n_confirm}: "
                           "lower it or raise envs.n_target_worlds")
        q = live[w % len(live)]
        for t in queues[q]:
            p, s = data_mod.content_key(t), solution_key(env, t)
            if p in prompts or s in banned:
                skipped += 1
                continue
            prompts.add(p)
            banned.add(s)
            out.append(t)
            w += 1
            break
        else:  # this world has no fresh task left: the others deal on (the split stays as even as it can)
            live.remove(q)
    return out, skipped


def write_confirm(out_dir: Path, tasks: list[Task], audit: dict, envs_params, splits_manifest_sha: str) -> dict:
    """``confirm.jsonl`` and its manifest: hash, prompt and solution keys, and the overlaps with the sealed
    splits (0 by construction, recomputed from the keys)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "confirm.jsonl", "".join(json.dumps(t.to_json(), sort_keys=True) + "\n" for t in tasks))
    sha = hash_files(out_dir, ["confirm.jsonl"])["confirm.jsonl"]
    envs = {d: make_env(d, envs_params) for d in envs_params.domains}
    manifest = {"file": {"path": "confirm.jsonl", "sha256": sha, "n": len(tasks),
                         "content": [data_mod.content_key(t) for t in tasks],
                         "solution": [solution_key(envs[t.domain], t) for t in tasks]},
                "splits_manifest_sha256": splits_manifest_sha, "audit": audit}
    write_manifest(out_dir / "manifest.json", manifest)
    return manifest


class ConfirmReader:
    """Reads the confirmatory split; only ``role='confirm_evaluate'`` may."""

    def __init__(self, root: str | Path, role: str):
        self.root, self.role = Path(root), role
        if role != ROLE:
            raise SplitAccessError(f"the confirmatory split is sealed: stage role {role!r} may not read it; only the "
                                   f"{ROLE!r} stage may, after the register stage wrote registration.json")
        self.manifest = data_mod.read_manifest(self.root / "manifest.json", "confirmatory split",
                                               "run the confirm_split stage first")

    def load(self) -> list[Task]:
        entry = self.manifest.get("file") if isinstance(self.manifest, dict) else None
        if not isinstance(entry, dict) or "sha256" not in entry:
            raise BadInput(f"confirmatory split manifest {self.root / 'manifest.json'} is corrupt: no 'file' entry")
        tasks, digest = data_mod.read_verified_tasks(self.root, entry, "confirmatory split",
                                                     "rerun confirm_split: dvc repro -f confirm_split")
        data_mod.ACCESS_LOG.append({"split": SPLIT, "role": self.role, "sha256": digest})
        return tasks
