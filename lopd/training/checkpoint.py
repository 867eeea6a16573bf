"""Checkpoints that are either complete or absent.

A checkpoint is a directory holding ``tensors.safetensors`` (adapter and composer weights),
``state.pt`` (optimiser states, β, RNG states, step, rollouts used, history) and
``meta.json`` with the SHA-256 of both. It is written to ``<dir>.tmp`` and renamed into
place, so a kill mid-write leaves the previous checkpoint intact. Loading verifies the
hashes; a corrupt or truncated checkpoint is a clear :class:`BadInput`, never a silent
restart.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from lopd.errors import BadInput


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def save_checkpoint(ckpt_dir: Path, tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
    ckpt_dir = Path(ckpt_dir)
    tmp = ckpt_dir.with_name(ckpt_dir.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "tensors.safetensors"))
    torch.save(state, tmp / "state.pt")
    meta = {n: _sha(tmp / n) for n in ("tensors.safetensors", "state.pt")}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
    old = ckpt_dir.with_name(ckpt_dir.name + ".old")
    if ckpt_dir.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(ckpt_dir, old)
    os.replace(tmp, ckpt_dir)
    if old.exists():
        shutil.rmtree(old)


def load_checkpoint(ckpt_dir: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    ckpt_dir = Path(ckpt_dir)
    meta_p = ckpt_dir / "meta.json"
    try:
        meta = json.loads(meta_p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise BadInput(f"checkpoint {ckpt_dir} is corrupt: cannot read meta.json ({e}); delete it to restart the run") from None
    for name, digest in meta.items():
        p = ckpt_dir / name
        if not p.exists() or _sha(p) != digest:
            raise BadInput(f"checkpoint {ckpt_dir} is corrupt or truncated: {name} does not match its hash; "
                           "delete the checkpoint directory to restart the run")
    tensors = load_file(str(ckpt_dir / "tensors.safetensors"))
    state = torch.load(ckpt_dir / "state.pt", weights_only=False)  # our own, hash-verified file
    return tensors, state


def load_tensors_verified(path: Path) -> dict[str, torch.Tensor]:
    """Load a safetensors file with a sibling ``<name>.sha256``; clear error when corrupt."""
    path = Path(path)
    if not path.exists():
        raise BadInput(f"weights file not found: {path}")
    sha_p = path.with_name(path.name + ".sha256")
    if sha_p.exists() and sha_p.read_text().strip() != _sha(path):
        raise BadInput(f"weights file {path} is corrupt or truncated (hash mismatch with {sha_p.name})")
    try:
        return load_file(str(path))
    except Exception as e:  # noqa: BLE001 - safetensors raises several types for bad files
        raise BadInput(f"weights file {path} is corrupt or truncated ({type(e).__name__}: {e})") from None


def save_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
    os.replace(tmp, path)
    path.with_name(path.name + ".sha256").write_text(_sha(path) + "\n")
