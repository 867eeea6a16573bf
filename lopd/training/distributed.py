"""Data-parallel training across processes: one rank per device, LoRA gradients averaged.

Why not DDP/FSDP wrappers: every trainable parameter here is a LoRA adapter or the small
composer block (θ and φ together are < 1 % of the model), and one step runs the *same*
module under three roles (student, composer, teacher) with hand-routed gradients
(:mod:`lopd.model.backbone`). ``DistributedDataParallel`` hooks assume one forward per
backward and would fire on partial graphs, so :class:`World` does what DDP does by hand,
once per step, after ``loss.backward()``: every rank holds a full replica of the frozen base
model, rolls out *different* tasks, and the gradients of θ ∪ φ are averaged across ranks
(:meth:`World.all_reduce_grads`, one flat bucket per dtype). Identical initial adapters
(:meth:`World.broadcast_params`), identical averaged gradients, identical clipping and
identical AdamW updates keep every rank's adapters bit-identical; the dual variable β stays
identical because Δ is averaged (:meth:`World.mean_scalar` / :meth:`World.weighted_mean`)
before the dual update.

Launch (one process per GPU; ``torchrun`` sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT)::

    torchrun --standalone --nproc_per_node N -m lopd.cli train --arm lopd --seed 0

The train stage calls :meth:`World.from_env`, which returns ``None`` for a plain
single-process run (WORLD_SIZE unset or 1), so nothing changes there. Backend: NCCL when
the model runs on CUDA (each rank is pinned to ``cuda:LOCAL_RANK`` *before* the model is
loaded, so ``model.device: cuda`` lands on the rank's own GPU), gloo on CPU. Only rank 0
writes outputs, checkpoints and MLflow runs.

Memory: a replica of an 8B model in bf16 is ~16 GB, far below an H200's 141 GB, so
replication is the right choice up to that size. For a base model that does not fit one
device, shard the *frozen* base with FSDP2 (``torch.distributed.fsdp.fully_shard`` on each
decoder layer, then on the root, after the LoRA adapters are attached) and keep this class
for the adapters' gradients — FSDP reduces sharded parameter gradients itself, so in that
setup call :meth:`all_reduce_grads` only on parameters FSDP does not manage (the composer
block). On CPU, gloo with ``torchrun --standalone --nproc_per_node 2`` works for tests.

Note on ``accelerate``: on a CPU-only machine a plain ``Accelerator()`` silently trains each
rank alone, and ``accelerate launch --cpu --num_processes 2`` starts a single process; this
module therefore uses ``torch.distributed`` directly (if you ever switch to accelerate on CPU,
use ``Accelerator(cpu=True)`` under ``torchrun``).

Deadlock rule: every rank must issue the same collectives in the same order. A collective
that only some ranks reach (e.g. a mean taken only when *this* rank saw a success) hangs or,
with gloo, silently pairs with the next collective; :meth:`weighted_mean` and
:meth:`any_true` exist so callers can make such decisions collectively. Collectives time out
after ``LOPD_DIST_TIMEOUT`` seconds (default 600) instead of hanging forever.
"""

from __future__ import annotations

import atexit
import datetime
import hashlib
import math
import os
from typing import Iterable

import torch


class World:
    """The process group of a ``torchrun`` launch, seen from one rank."""

    def __init__(self, rank: int, world_size: int, local_rank: int, backend: str, device: torch.device):
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.backend = backend
        self.device = device  # where collective buffers live (cuda:LOCAL_RANK for nccl)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_env(cls, device: str | None = None, timeout_s: float | None = None) -> "World | None":
        """The world described by torchrun's environment, or ``None`` for a single process.

        ``device`` is ``model.device`` (``auto``, ``cpu`` or ``cuda``): ``cpu`` forces gloo;
        otherwise NCCL is used when CUDA is available. ``LOPD_DIST_BACKEND`` overrides.
        """
        import torch.distributed as dist

        world_size = int(os.environ.get("WORLD_SIZE", "1") or 1)
        if world_size <= 1:
            return None
        rank = int(os.environ["RANK"])
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        use_cuda = device != "cpu" and torch.cuda.is_available()
        backend = os.environ.get("LOPD_DIST_BACKEND") or ("nccl" if use_cuda else "gloo")
        if backend == "nccl":
            torch.cuda.set_device(local_rank)  # torch.device("cuda") now means this rank's GPU
            dev = torch.device("cuda", local_rank)
        else:
            dev = torch.device("cpu")
        timeout_s = timeout_s if timeout_s is not None else float(os.environ.get("LOPD_DIST_TIMEOUT", "600"))
        if not dist.is_initialized():
            kw = {"device_id": dev} if backend == "nccl" else {}
            dist.init_process_group(backend, rank=rank, world_size=world_size,
                                    timeout=datetime.timedelta(seconds=timeout_s), **kw)
            atexit.register(_destroy)
        return cls(rank, world_size, local_rank, backend, dev)

    # ------------------------------------------------------------------ identity
    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def rank_seed(self, seed: int) -> int:
        """The seed this rank samples its tasks with: ``seed * 1000 + rank`` (ranks differ)."""
        return seed * 1000 + self.rank

    # ------------------------------------------------------------------ collectives
    def barrier(self) -> None:
        import torch.distributed as dist

        if self.backend == "nccl":
            dist.barrier(device_ids=[self.local_rank])
        else:
            dist.barrier()

    def all_reduce_grads(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Average ``.grad`` over ranks. A parameter with ``grad is None`` gets zeros first,
        so every rank reduces the same tensors (an unused adapter on one rank must not
        desynchronise the collective)."""
        import torch.distributed as dist

        params = [p for p in params if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        # one flat bucket per (device, dtype): one collective instead of hundreds
        buckets: dict[tuple, list[torch.nn.Parameter]] = {}
        for p in params:
            buckets.setdefault((p.grad.device, p.grad.dtype), []).append(p)
        for (dev, _), ps in sorted(buckets.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
            flat = torch.cat([p.grad.reshape(-1) for p in ps])
            moved = flat.device != self.device
            buf = flat.to(self.device) if moved else flat
            dist.all_reduce(buf, op=dist.ReduceOp.SUM)
            buf /= self.world_size
            if moved:
                buf = buf.to(dev)
            off = 0
            for p in ps:
                n = p.grad.numel()
                p.grad.copy_(buf[off:off + n].view_as(p.grad))
                off += n

    def _sum(self, values: list[float]) -> list[float]:
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.cpu().tolist()

    def mean_scalar(self, x: float) -> float:
        """The mean of ``x`` over ranks (NaN if any rank's ``x`` is NaN)."""
        return self._sum([float(x)])[0] / self.world_size

    def weighted_mean(self, x: float, w: float) -> tuple[float, float]:
        """``(Σ w_r x_r / Σ w_r, Σ w_r)`` over ranks; ranks with ``w == 0`` (or NaN ``x``)
        contribute nothing. Returns ``(nan, 0.0)`` when no rank has weight."""
        x, w = float(x), float(w)
        if w <= 0 or math.isnan(x):
            x, w = 0.0, 0.0
        sx, sw = self._sum([w * x, w])
        return (sx / sw if sw > 0 else float("nan")), sw

    def any_true(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is true on any rank."""
        return self._sum([1.0 if flag else 0.0])[0] > 0

    def broadcast_params(self, params: Iterable[torch.Tensor], src: int = 0) -> None:
        """Copy rank ``src``'s values of ``params`` (in place) to every rank."""
        import torch.distributed as dist

        with torch.no_grad():
            for p in params:
                data = p.data
                if data.device != self.device:
                    buf = data.to(self.device)
                    dist.broadcast(buf, src=src)
                    data.copy_(buf.to(data.device))
                else:
                    dist.broadcast(data, src=src)

    def close(self) -> None:
        _destroy()


def _destroy() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def broadcast_trainer(world: World | None, trainer) -> None:
    """Make every rank start from rank 0's adapters: student θ and, if present, the composer
    φ (its LoRA *and* its query block, including frozen ones, so a frozen composer is also
    identical). Call right after the :class:`lopd.training.trainer.Trainer` is built (before
    ``fit``); a no-op for a single process."""
    if world is None:
        return
    params = list(trainer.bb.adapter_params("student"))
    if trainer.composer is not None:
        params += list(trainer.composer.block.parameters()) + list(trainer.bb.adapter_params("composer"))
    world.broadcast_params(params)


def params_digest(params: Iterable[torch.Tensor]) -> str:
    """SHA-256 of the parameters' bytes (for checking that ranks agree)."""
    h = hashlib.sha256()
    for p in params:
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()
