"""Argument checks shared by the pure objectives (:mod:`lopd.training.objectives`,
:mod:`lopd.training.margin`): clear ``ValueError`` messages instead of silent broadcasting."""

from __future__ import annotations

import math

import torch
from torch import Tensor



def promote(x: Tensor) -> Tensor:
    """Half precision → float32; float32/float64 unchanged (differentiable cast)."""
    if x.dtype in (torch.float16, torch.bfloat16):
        return x.float()
    return x


def require_float(name: str, x: Tensor) -> None:
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")


def require_dim(name: str, x: Tensor, dim: int, what: str) -> None:
    if x.dim() != dim:
        raise ValueError(f"{name} must have shape {what}, got {tuple(x.shape)}")


def require_pair(a_name: str, a: Tensor, b_name: str, b: Tensor, dim: int, what: str) -> None:
    """Both float tensors of ``dim`` dimensions (shape ``what``) and of the same shape."""
    require_float(a_name, a)
    require_float(b_name, b)
    require_dim(a_name, a, dim, what)
    if a.shape != b.shape:
        raise ValueError(f"{a_name} and {b_name} must have the same {what} shape, "
                         f"got {tuple(a.shape)} and {tuple(b.shape)}")


def check_mask(mask: Tensor, shape: torch.Size | tuple[int, ...], against: str) -> Tensor:
    """Validate an (N, T) mask and return it as a 0/1-or-weight float32 tensor."""
    if not isinstance(mask, Tensor):
        raise ValueError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(
            f"mask must have shape {tuple(shape)} (the (N, T) of {against}), "
            f"got {tuple(mask.shape)}"
        )
    if mask.dtype == torch.bool:
        return mask.float()
    if not (mask.is_floating_point() or mask.dtype in (torch.int8, torch.int16, torch.int32,
                                                       torch.int64, torch.uint8)):
        raise ValueError(f"mask must be bool, integer or float, got dtype {mask.dtype}")
    return mask.float()


def check_scalar(name: str, value: float, *, nonneg: bool = False) -> float:
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a scalar, got shape {tuple(value.shape)}")
        value = value.item()
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {value!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if nonneg and value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value
