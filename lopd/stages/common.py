"""What several stages share: the backbone, the run resources, side files."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lopd import data as data_mod
from lopd.config import Params
from lopd.paths import Paths
from lopd.utils import write_json

if TYPE_CHECKING:
    from lopd.training.trainer import Resources


def load_backbone(params: Params, paths: Paths):
    from lopd.model.backbone import load_backbone as _load
    from lopd.compat.kernels import seed_everything

    seed_everything(0, params.model.torch_threads)
    return _load(params, paths.base)


def experience_task(e):
    """The (prompt-only) task an experience came from, for embedding it."""
    from lopd.envs.base import Task

    return Task(e.task_id, e.domain, e.family, e.prompt)


def task_embeddings(params: Params, bb, tasks) -> dict:
    from lopd.bank import embed_tasks

    return {t.task_id: e for t, e in zip(tasks, embed_tasks(params.bank.embedder, bb, tasks))}


def upstream_seed(params: Params, kind: str, draw: int) -> int:
    """Seed of upstream draw ``draw`` of ``kind`` (``bank`` or ``cold_start``): with
    ``train.per_seed_draws``, ``derive_seed(f"{kind}-draw", <kind>.seed, draw)`` (BLAKE2b of the key: draws of
    different seeds are unrelated streams, none equal to the shared draw's); without, ``<kind>.seed`` (every draw
    is the shared draw that the search, probe and sensitivity use)."""
    from lopd.engine.sampling import derive_seed

    own = getattr(params, kind).seed
    return derive_seed(f"{kind}-draw", own, draw) if params.train.per_seed_draws else own


def load_resources(params: Params, paths: Paths, role: str, need_bank: bool = True, draw: int | None = None,
                   dirs=None):
    """Backbone, bank, φ0 and the train/val tasks shared by every run of a process. ``draw=None``: the shared
    draw (``models/bank``, ``models/cold_start``: the search, probe and sensitivity); else that upstream draw
    (``models/draws/bank-<draw>``, ``cold_start-<draw>``: final run of training seed ``draw``); ``dirs``: these
    (bank, φ0) directories instead (a confirmation seed's draw, :meth:`Paths.confirm_draw`)."""
    from lopd.engine.evaluation import make_envs
    from lopd.training.trainer import Resources

    bb = load_backbone(params, paths)
    reader = data_mod.SplitReader(paths.splits, role=role)
    train, val = reader.load("train"), reader.load("val")
    bank, phi0 = _load_draw(paths, draw, dirs) if need_bank else (None, None)
    res = Resources(params=params, bb=bb, bank=bank, train_tasks=train, val_tasks=val, envs=make_envs(params),
                    phi0=phi0, k_max=params.cold_start.k_max)
    if need_bank:
        res.task_emb = task_embeddings(params, bb, train + val)
    return res


def with_draw(paths: Paths, res: Resources, draw: int, dirs=None):
    """``res`` with upstream draw ``draw``'s bank and φ0 (``models/draws/*-<draw>``): a population
    member's own draw on the shared backbone, tasks and task embeddings (those depend on the
    backbone only)."""
    from dataclasses import replace

    bank, phi0 = _load_draw(paths, draw, dirs)
    return replace(res, bank=bank, phi0=phi0)


def _load_draw(paths: Paths, draw: int | None, dirs=None):
    """(the experience bank, φ0) of upstream draw ``draw`` (None: the shared draw), or in ``dirs``."""
    from lopd.bank import ExperienceBank
    from lopd.training.checkpoint import load_tensors_verified

    bank_dir, cold_dir = dirs or paths.upstream(draw)
    return ExperienceBank.load(bank_dir), load_tensors_verified(cold_dir / "phi0.safetensors")


def splits_read() -> list[dict]:
    """Which splits this process opened (role and hash): the leakage audit reads it."""
    return list(data_mod.ACCESS_LOG)


def write_side(paths: Paths, stage: str, meta: dict) -> None:
    """Run ids, timings and tracking status: beside the outputs, never inside a DVC output."""
    write_json(paths.meta_file(stage), meta)
