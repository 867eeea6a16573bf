"""One backbone in memory, three roles.

* **student**  = base + LoRA adapter ``student`` (trained: θ)
* **composer** = base + LoRA adapter ``composer`` (trained with the query block: φ)
* **teacher**  = base with every adapter disabled (frozen)

All three share the base weights, which never receive gradients. Switching roles only flips
which LoRA branch is active (:meth:`Backbone.mode`, through peft's public
``enable_adapters`` / ``set_adapter``); the trainable flags are kept as the caller set them, so a
single backward pass can reach both adapters through graphs built under different roles, and an
adapter that was inactive in a forward pass gets no gradient from it.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import torch
from torch import nn

from lopd.compat import peft as compat_peft
from lopd.errors import BadInput
from lopd.model import members
from lopd.model.chat import ChatFormat

if TYPE_CHECKING:
    from lopd.config import Params


ROLES = ("student", "composer", "teacher")


def resolve_device(mp) -> torch.device:
    if mp.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if mp.device == "cuda" and not torch.cuda.is_available():
        raise BadInput("model.device is 'cuda' but no CUDA device is available (allowed: auto, cpu, cuda)")
    return torch.device(mp.device)


def resolve_dtype(mp, device: torch.device) -> torch.dtype:
    if mp.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, mp.dtype)


def tiny_config(mp, vocab_size: int, tokenizer) -> Any:
    """A small causal-LM config of the requested architecture."""
    from transformers import GPT2Config, LlamaConfig, Qwen3Config

    common = dict(vocab_size=vocab_size, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id)
    if mp.arch == "gpt2":
        return GPT2Config(n_embd=mp.hidden_size, n_layer=mp.num_layers, n_head=mp.num_heads,
                          n_positions=mp.max_seq_len + 256, n_inner=mp.intermediate_size, resid_pdrop=0.0,
                          embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True, **common)
    cls = Qwen3Config if mp.arch == "qwen3" else LlamaConfig
    extra = {"head_dim": mp.hidden_size // mp.num_heads}
    return cls(hidden_size=mp.hidden_size, num_hidden_layers=mp.num_layers, num_attention_heads=mp.num_heads,
               num_key_value_heads=mp.num_kv_heads, intermediate_size=mp.intermediate_size,
               max_position_embeddings=mp.max_seq_len + 256, tie_word_embeddings=True,
               attention_dropout=0.0, **extra, **common)


def build_tiny_model(mp, tokenizer, seed: int = 0) -> nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config(mp, len(tokenizer), tokenizer)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    return model.float()


def load_causal_lm(path: str | Path, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """Load a local Hugging Face CausalLM directory (never a hub download)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    if not (path / "config.json").exists():
        raise BadInput(f"model directory {path} has no config.json: not a Hugging Face model directory")
    try:
        cfg = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # noqa: BLE001 - report the cause, whatever transformers raised
        raise BadInput(f"model directory {path}: cannot read its config ({type(e).__name__}: {e})") from None
    archs = getattr(cfg, "architectures", None) or []
    if archs and not any(a.endswith("ForCausalLM") or a.endswith("LMHeadModel") for a in archs):
        raise BadInput(f"model directory {path} holds {archs}, not a causal LM (need *ForCausalLM)")
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=dtype,
                                                     attn_implementation="sdpa")
    except ValueError as e:
        raise BadInput(f"model directory {path} is not a causal LM: {e}") from None
    except Exception as e:  # noqa: BLE001
        raise BadInput(f"model directory {path} could not be loaded ({type(e).__name__}: {e}); "
                       "are the weights complete?") from None
    return model.to(device)


def lora_targets(base: nn.Module, override: list[str] | None, arch: str | None = None) -> list[str]:
    """``model.lora_target_modules`` if set, else peft's default for the architecture."""
    if override:
        return list(override)
    defaults = compat_peft.default_lora_targets()
    arch = arch or getattr(base.config, "model_type", None)
    if arch not in defaults:
        raise BadInput(f"peft has no default LoRA target modules for architecture {arch!r}; set "
                       f"model.lora_target_modules (peft knows: {', '.join(sorted(defaults))})")
    return list(defaults[arch])


def dir_hash(path: str | Path) -> str:
    """SHA-256 over a model directory's files (relative names and contents), for provenance."""
    from lopd.utils import sha256_path

    return sha256_path(path)


def _switch_role(tuner_layers: list[nn.Module], lora_params: list[nn.Parameter], adapter: str | None) -> None:
    """Activate the LoRA adapter ``adapter`` in ``tuner_layers`` (None, the teacher: every adapter off).

    peft's public switches also set requires_grad; which parameters train is the caller's choice
    (θ always, φ unless frozen), not the role's, so the flags are restored after.
    """
    flags = [p.requires_grad for p in lora_params]
    for m in tuner_layers:
        if adapter is None:
            m.enable_adapters(False)
        else:
            m.enable_adapters(True)
            m.set_adapter(adapter)
    for p, f in zip(lora_params, flags):
        p.requires_grad_(f)


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a Hugging Face causal LM (each a ``GradientCheckpointingLayer``)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


class Backbone:
    """A base causal LM carrying the ``student`` and ``composer`` LoRA adapters."""

    def __init__(self, base: nn.Module, tokenizer, mp, arch: str | None = None):
        from peft import LoraConfig, get_peft_model

        self.tokenizer = tokenizer
        self.fmt = ChatFormat(tokenizer)
        targets = lora_targets(base, mp.lora_target_modules, arch)
        cfg = LoraConfig(r=mp.lora_r, lora_alpha=mp.lora_alpha, lora_dropout=0.0, target_modules=targets, bias="none")
        for p in base.parameters():
            p.requires_grad_(False)
        self.model = get_peft_model(base, cfg, adapter_name="student")
        self.model.add_adapter("composer", cfg)
        self._lora_config = cfg
        for name, p in self.model.named_parameters():
            p.requires_grad_("lora_" in name)
        self.hidden_size = base.config.get_text_config().hidden_size if hasattr(base.config, "get_text_config") else base.config.hidden_size
        self._layers = compat_peft.tuner_layers(self.model)
        self._lora = [p for n, p in self.model.named_parameters() if "lora_" in n]
        # role -> peft adapter; a population member's view maps the roles to its own adapters
        self.adapters = {"student": "student", "composer": "composer"}
        self.routing = members.MemberRouting()  # shared by every view: the rows' members while routed
        self.role = None
        self.mode("student")

    # ------------------------------------------------------------------ roles
    def _adapter(self, role: str) -> str | None:
        return None if role == "teacher" else self.adapters[role]

    def mode(self, role: str) -> "Backbone":
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; known: {ROLES}")
        _switch_role(self._layers, self._lora, self._adapter(role))
        self.role = role
        return self

    # ------------------------------------------------------------------ population members
    def member_views(self, n: int) -> list["Backbone"]:
        """Views of this backbone for ``n`` population members (:mod:`lopd.model.members`): view
        ``i`` is this backbone with its ``student`` and ``composer`` roles mapped to member ``i``'s
        own adapters (added here if missing, at the same LoRA config). Views share the model,
        so one forward can run every member (:meth:`member_rows`)."""
        import copy

        existing = set(self.model.peft_config)
        for i in range(n):
            for role in ("student", "composer"):
                name = members.adapter_name(role, i)
                if name not in existing:
                    self.model.add_adapter(name, self._lora_config)
        for name, p in self.model.named_parameters():
            p.requires_grad_("lora_" in name)
        self._lora[:] = [p for name, p in self.model.named_parameters() if "lora_" in name]  # every view's list
        members.install(self._layers, self.routing)
        self.mode(self.role or "student")
        views = []
        for i in range(n):
            v = copy.copy(self)
            v.adapters = {role: members.adapter_name(role, i) for role in ("student", "composer")}
            views.append(v)
        return views

    def member_rows(self, role: str, member_of_row: torch.Tensor, n_members: int, segments: bool = False):
        """Context: the forward passes inside run row ``n`` through member ``member_of_row[n]``'s
        ``role`` adapter (views from :meth:`members`); ``segments``: rows that come member by member
        may take the per-member path (:class:`lopd.model.members.MemberRouting`)."""
        dtype = next(iter(self._lora)).dtype
        return members.member_rows(self.routing, role, member_of_row.to(self.device), n_members,
                                   self._lora_config.r, dtype, segments)

    @contextmanager
    def recompute_in_backward(self, enabled: bool = True) -> Iterator[None]:
        """Activation checkpointing, decoder layer by decoder layer, for the passes run inside.

        A layer that runs with gradients keeps only its inputs; backward runs it again (the same
        kernels on the same inputs, so the same values) and then backpropagates through it. Memory:
        one layer's activations instead of every layer's; time: one more forward of those passes.
        The replay switches the layer's adapters to the role its forward ran under, and a population's
        member routing to the rows' members then (:mod:`lopd.model.members`), because backward runs
        after the trainer has moved on to other roles. Passes without gradients run unchanged.
        """
        if not enabled:
            yield
            return
        from torch.utils.checkpoint import checkpoint

        blocks = _decoder_layers(self.model)
        if not blocks:
            raise BadInput(f"{type(self.model.base_model.model).__name__} has no decoder layers this backbone can "
                           "recompute (transformers' GradientCheckpointingLayer); set "
                           "train.recompute_context_passes: false")
        lora_ids = {id(m) for m in self._layers}

        def wrap(block: nn.Module):
            forward = block.forward
            tuners = [m for m in block.modules() if id(m) in lora_ids]
            lora = [p for n, p in block.named_parameters() if "lora_" in n]

            @contextmanager
            def as_run(role: str, routing: tuple) -> Iterator[None]:
                current, current_routing = self.role, self.routing.state()
                _switch_role(tuners, lora, self._adapter(role))
                self.routing.restore(routing)
                try:
                    yield
                finally:
                    self.routing.restore(current_routing)
                    _switch_role(tuners, lora, self._adapter(current))

            def recomputed(*args, **kwargs):
                if not torch.is_grad_enabled():
                    return forward(*args, **kwargs)
                role, routing = self.role, self.routing.state()
                return checkpoint(forward, *args, use_reentrant=False,
                                  context_fn=lambda: (nullcontext(), as_run(role, routing)), **kwargs)
            return recomputed

        shadowed = [vars(block).get("forward") for block in blocks]  # a forward patched onto the instance
        for block in blocks:
            block.forward = wrap(block)  # an instance attribute shadows the class's forward
        try:
            yield
        finally:
            for block, prior in zip(blocks, shadowed):
                del block.forward
                if prior is not None:
                    block.forward = prior

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(ids)

    def adapter_params(self, name: str) -> list[nn.Parameter]:
        """The LoRA parameters of role ``name``'s adapter (``student`` or ``composer``)."""
        adapter = self.adapters[name]
        return [p for n, p in self.model.named_parameters() if f".{adapter}." in n and "lora_" in n]

    def base_params(self) -> list[nn.Parameter]:
        return [p for n, p in self.model.named_parameters() if "lora_" not in n]

    # ------------------------------------------------------------------ forward passes
    def logits(self, ids: torch.Tensor, attn: torch.Tensor, role: str) -> torch.Tensor:
        self.mode(role)
        return self.model(input_ids=ids, attention_mask=attn, use_cache=False).logits

    def teacher_logits(self, prefix: torch.Tensor | None, prefix_mask: torch.Tensor | None, ids: torch.Tensor,
                       attn: torch.Tensor, latent_prefix: bool = True,
                       prefix_shift: torch.Tensor | None = None) -> torch.Tensor:
        """Teacher (adapters disabled) logits over ``ids`` given a prefix of embeddings.

        ``prefix``: (N, L, d) — the composer's latents ``c_φ`` or embedded context text.
        Attention mask: ``prefix_mask`` (1 on real prefix entries) then ``attn``.
        Positions: the rollout tokens keep exactly the student's positions ``0..T-1``; a latent
        prefix sits at position 0 (it is a bag of ``n_ret·K`` summary vectors), while a text
        prefix is ordinary text and takes positions ``0..L-1`` with the rollout shifted by L.
        ``prefix_shift`` (N,): for a text prefix, how much extra left padding each row's prefix got
        beyond its own batch's width (a population pads its members' prefixes to one width); the
        row's positions are shifted back by it, so its real tokens keep their positions.
        Returns logits aligned with ``ids`` (N, T, V): the prefix positions are dropped.
        """
        self.mode("teacher")
        if prefix is None or prefix.shape[1] == 0:
            return self.model(input_ids=ids, attention_mask=attn, use_cache=False).logits
        n, L, _ = prefix.shape
        T = ids.shape[1]
        emb = torch.cat([prefix.to(self.embed(ids).dtype), self.embed(ids)], dim=1)
        mask = torch.cat([prefix_mask.to(attn.dtype), attn], dim=1)
        if latent_prefix:
            pos = torch.cat([torch.zeros(n, L, dtype=torch.long, device=ids.device),
                             torch.arange(T, device=ids.device).expand(n, T)], dim=1)
        else:
            pos = torch.arange(L + T, device=ids.device).expand(n, L + T)
            if prefix_shift is not None:  # the shifted-out positions are padding (masked): clamped, never read
                pos = (pos - prefix_shift.to(ids.device)[:, None]).clamp_min(0)
        out = self.model(inputs_embeds=emb, attention_mask=mask, position_ids=pos, use_cache=False).logits
        return out[:, L:]

    def hidden_states(self, ids: torch.Tensor, attn: torch.Tensor, role: str = "composer") -> torch.Tensor:
        """Last-layer hidden states (N, S, d) under ``role`` (the composer encoder by default), after the
        final norm: the decoder without its LM head (the logits were never read; the same tensor as the
        causal LM's ``hidden_states[-1]``, tests/test_model.py)."""
        self.mode(role)
        return self.model.get_base_model().base_model(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state

    # ------------------------------------------------------------------ adapter state
    def adapter_state(self, name: str) -> dict[str, torch.Tensor]:
        from peft import get_peft_model_state_dict

        state = get_peft_model_state_dict(self.model, adapter_name=self.adapters[name])
        return {k: v.detach().cpu().clone() for k, v in state.items()}

    def load_adapter_state(self, name: str, state: dict[str, torch.Tensor]) -> None:
        from peft import set_peft_model_state_dict

        expected = set(self.adapter_state(name))
        if set(state) != expected:
            raise BadInput(f"adapter {name!r} state does not match this backbone "
                           f"({len(set(state) ^ expected)} mismatched tensors)")
        set_peft_model_state_dict(self.model, state, adapter_name=self.adapters[name])
        for n, p in self.model.named_parameters():
            p.requires_grad_("lora_" in n)
        self.mode(self.role or "student")


def load_backbone(params: Params, base_dir: str | Path) -> Backbone:
    """The base policy written by the ``base`` stage (or a real model) with fresh adapters."""
    from lopd.model.tokenizer import load_tokenizer

    mp = params.model
    device = resolve_device(mp)
    dtype = resolve_dtype(mp, device)
    src = Path(mp.name_or_path) if mp.name_or_path else Path(base_dir) / "model"
    tok_dir = src if mp.name_or_path else Path(base_dir) / "model"
    if not src.exists():
        raise BadInput(f"model directory not found: {src}" + ("" if mp.name_or_path else " (run the base stage first)"))
    tok = load_tokenizer(tok_dir)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    base = load_causal_lm(src, device, dtype)
    torch.manual_seed(0)  # LoRA init is random: fix it so every run starts from the same adapters
    return Backbone(base, tok, mp)
