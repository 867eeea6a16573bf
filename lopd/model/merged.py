"""The trained student alone, for evaluation: the base weights with the student's LoRA adapter
folded in (no adapter wrappers, no composer, no teacher)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from lopd.compat import peft as compat_peft
from lopd.errors import BadInput
from lopd.model.backbone import load_causal_lm, resolve_device, resolve_dtype
from lopd.model.chat import ChatFormat

if TYPE_CHECKING:
    from lopd.config import Params


def merge_lora_state(base: nn.Module, state: dict[str, torch.Tensor], lora_alpha: int, lora_r: int) -> nn.Module:
    """Fold a LoRA adapter (peft state-dict layout) into ``base``'s weights, in place:
    ``W ← W + (α/r)·B·A`` (transposed for GPT-2's ``Conv1D``). Used where only the student is
    needed (evaluation), so the stage does not import peft or build the adapter wrappers."""
    scale = lora_alpha / lora_r
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for k, v in state.items():
        for part, tag in compat_peft.LORA_WEIGHT_SUFFIX.items():
            if k.endswith(tag):
                pairs.setdefault(k[: -len(tag)], {})[part] = v
                break
        else:
            raise BadInput(f"unexpected tensor {k!r} in a LoRA adapter state")
    prefix = compat_peft.STATE_DICT_PREFIX
    with torch.no_grad():
        for path, ab in pairs.items():
            if set(ab) != {"lora_A", "lora_B"}:
                raise BadInput(f"LoRA adapter state for {path} is incomplete")
            mod_path = path[len(prefix):] if path.startswith(prefix) else path
            try:
                mod = base.get_submodule(mod_path)
            except AttributeError:
                raise BadInput(f"LoRA adapter targets {mod_path}, which this model does not have") from None
            delta = (ab["lora_B"].float() @ ab["lora_A"].float()) * scale
            w = mod.weight
            if w.shape != delta.shape:
                delta = delta.T  # Conv1D stores (in, out)
            if w.shape != delta.shape:
                raise BadInput(f"LoRA adapter for {mod_path} has shape {tuple(delta.shape)}, weight is {tuple(w.shape)}")
            w.add_(delta.to(w.dtype).to(w.device))
    return base


def load_student_policy(params: Params, base_dir: str | Path, adapter_state: dict[str, torch.Tensor]):
    """(model, ChatFormat) of the trained student alone: base weights with the student adapter merged."""
    from lopd.model.tokenizer import load_tokenizer

    mp = params.model
    device = resolve_device(mp)
    src = Path(mp.name_or_path) if mp.name_or_path else Path(base_dir) / "model"
    if not src.exists():
        raise BadInput(f"model directory not found: {src}")
    tok = load_tokenizer(src)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = load_causal_lm(src, device, resolve_dtype(mp, device))
    merge_lora_state(model, adapter_state, mp.lora_alpha, mp.lora_r)
    return model.eval(), ChatFormat(tok)
