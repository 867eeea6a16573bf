"""Checkpoints that are either complete or absent.

A checkpoint is a directory holding ``tensors.safetensors`` (adapter and composer weights),
``state.pt`` (optimiser states, β, RNG states, step, rollouts used, history) and
``meta.json`` with the SHA-256 of both. It is written to ``<dir>.tmp`` and renamed into
place, so a kill mid-write leaves the previous checkpoint intact. Loading verifies the
hashes; a corrupt or truncated checkpoint is a clear :class:`BadInput`, never a silent
restart.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from lopd.errors import BadInput
from lopd.faults import kill_point
from lopd.utils import (atomic_output, atomic_write_text, hash_files, sha256_file, swap_dir, verify_files,
                        write_manifest)

CHECKPOINT_FILES = ("tensors.safetensors", "state.pt")  # hashed in meta.json


def save_checkpoint(ckpt_dir: Path, tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
    ckpt_dir = Path(ckpt_dir)
    tmp = ckpt_dir.with_name(ckpt_dir.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "tensors.safetensors"))
    torch.save(state, tmp / "state.pt")
    write_manifest(tmp / "meta.json", hash_files(tmp, CHECKPOINT_FILES), sort_keys=False, end="")
    swap_dir(tmp, ckpt_dir)
    kill_point("checkpoint", detail=str(ckpt_dir))


def load_checkpoint(ckpt_dir: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    ckpt_dir = Path(ckpt_dir)
    meta_p = ckpt_dir / "meta.json"
    try:
        meta = json.loads(meta_p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise BadInput(f"checkpoint {ckpt_dir} is corrupt: cannot read meta.json ({e}); delete it to restart the run") from None
    verify_files(ckpt_dir, meta, lambda p, _: f"checkpoint {ckpt_dir} is corrupt or truncated: {p.name} does not "
                                              "match its hash; delete the checkpoint directory to restart the run")
    tensors = load_file(str(ckpt_dir / "tensors.safetensors"))
    state = torch.load(ckpt_dir / "state.pt", weights_only=False)  # our own, hash-verified file
    return tensors, state


def load_tensors_verified(path: Path) -> dict[str, torch.Tensor]:
    """Load a safetensors file with a sibling ``<name>.sha256``; clear error when corrupt."""
    path = Path(path)
    if not path.exists():
        raise BadInput(f"weights file not found: {path}")
    sha_p = path.with_name(path.name + ".sha256")
    if sha_p.exists() and sha_p.read_text().strip() != sha256_file(path):
        raise BadInput(f"weights file {path} is corrupt or truncated (hash mismatch with {sha_p.name})")
    try:
        return load_file(str(path))
    except Exception as e:  # noqa: BLE001 - safetensors raises several types for bad files
        raise BadInput(f"weights file {path} is corrupt or truncated ({type(e).__name__}: {e})") from None


def save_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    path = Path(path)
    with atomic_output(path) as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
    atomic_write_text(path.with_name(path.name + ".sha256"), sha256_file(path) + "\n")


# --------------------------------------------------------------------------- a trainer's full state
def _rng_state(py: random.Random, gen: torch.Generator) -> dict:
    return {"py": py.getstate(), "torch_gen": gen.get_state(), "torch": torch.get_rng_state(),
            "np": np.random.get_state()}


def _set_rng_state(st: dict, py: random.Random, gen: torch.Generator) -> None:
    py.setstate(st["py"])
    gen.set_state(st["torch_gen"])
    torch.set_rng_state(st["torch"])
    np.random.set_state(st["np"])


def trainer_tensors(tr) -> dict[str, torch.Tensor]:
    """A trainer's weights: student adapter, composer, learned context."""
    t = {f"student.{k}": v for k, v in tr.bb.adapter_state("student").items()}
    if tr.composer is not None:
        t.update({f"composer.{k}": v for k, v in tr.composer.state().items()})
    t.update({f"context.{k}": v for k, v in tr.context.state().items()})
    for step, (_, snap) in getattr(tr, "snapshots", {}).items():
        t.update({f"snapshot-{step}.{k}": v for k, v in snap.items()})
    return t


def prefixed(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def trainer_state(tr, extra: dict | None = None) -> dict:
    """Everything but the weights that a resumed run needs to continue bit-identically: optimisers,
    β, RNG states, counters and the history so far."""
    return {"step": tr.step, "rollouts_used": tr.rollouts_used, "beta": tr.beta, "history": tr.history,
            "opt_theta": tr.opt_theta.state_dict(), "opt_phi": tr.opt_phi.state_dict() if tr.opt_phi else None,
            "rng": _rng_state(tr.py_rng, tr.gen), "infeasible_streak": tr.infeasible_streak,
            "infeasible": tr.infeasible, "last_val": tr.last_val,
            "snapshots": {str(k): n for k, (n, _) in getattr(tr, "snapshots", {}).items()}, **(extra or {})}


def load_trainer_state(tr, tensors: dict[str, torch.Tensor], state: dict) -> None:
    """The inverse of :func:`trainer_tensors` and :func:`trainer_state`."""
    tr.bb.load_adapter_state("student", prefixed(tensors, "student."))
    if tr.composer is not None:
        tr.composer.load_state(prefixed(tensors, "composer."))
    tr.context.load_state(prefixed(tensors, "context."))
    tr.opt_theta.load_state_dict(state["opt_theta"])
    if tr.opt_phi and state["opt_phi"]:
        tr.opt_phi.load_state_dict(state["opt_phi"])
    tr.step, tr.rollouts_used, tr.beta = state["step"], state["rollouts_used"], state["beta"]
    tr.history = state["history"]
    tr.infeasible_streak, tr.infeasible, tr.last_val = state["infeasible_streak"], state["infeasible"], state["last_val"]
    _set_rng_state(state["rng"], tr.py_rng, tr.gen)
    tr.snapshots = {int(k): (n, prefixed(tensors, f"snapshot-{k}.")) for k, n in (state.get("snapshots") or {}).items()}


def save_trainer(tr, ckpt_dir: Path, extra: dict | None = None) -> None:
    """A run's checkpoint: its weights and its state (:func:`trainer_state`)."""
    save_checkpoint(ckpt_dir, trainer_tensors(tr), trainer_state(tr, extra))


def restore_trainer(tr, ckpt_dir: Path) -> dict:
    tensors, state = load_checkpoint(ckpt_dir)
    load_trainer_state(tr, tensors, state)
    return state
