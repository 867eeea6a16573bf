"""Every read of a peft internal (a private module, a LoRA layer's attribute, the state-dict layout),
in one place.

lopd uses peft's public API (``LoraConfig``, ``get_peft_model``, ``add_adapter``,
``get/set_peft_model_state_dict``) for everything it offers, and this module for what it does not:

* the default LoRA target modules of an architecture (``peft.utils.constants``);
* the tuner-layer base class, to switch adapters layer by layer (:func:`tuner_layers`);
* a LoRA ``Linear`` layer's weights, scalings and flags, which the engine's fast decoder replays as
  plain matrix products (:func:`lora_linear`);
* the key layout of an adapter's state dict, which evaluation folds into the base weights without
  importing peft (:data:`STATE_DICT_PREFIX`, :data:`LORA_WEIGHT_SUFFIX`).

peft itself is imported only inside the functions: evaluation reads the layout constants alone.
:data:`INTERNALS` and :data:`LORA_LAYER_ATTRIBUTES` list what is read, checked against peft
:data:`CHECKED_VERSION`; ``tests/unit/test_compat.py`` fails with the name of whichever has moved.
"""

from __future__ import annotations

from torch import nn

CHECKED_VERSION = "0.21.2"
CONSTANTS_MODULE = "peft.utils.constants"
TUNERS_MODULE = "peft.tuners.tuners_utils"
TARGETS_MAPPING = "TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING"

# (module, attribute) pairs read below
INTERNALS = [(CONSTANTS_MODULE, TARGETS_MAPPING), (TUNERS_MODULE, "BaseTunerLayer")]
# attributes of a peft LoRA ``Linear`` read by :func:`lora_linear` (``fan_in_fan_out`` and
# ``lora_variant`` are optional: absent means a plain layer)
LORA_LAYER_ATTRIBUTES = ["base_layer", "lora_A", "lora_B", "scaling", "merged", "disable_adapters",
                         "active_adapters", "lora_dropout"]
# an adapter's state dict (``get_peft_model_state_dict``): ``<prefix><module path>.lora_A.weight``
STATE_DICT_PREFIX = "base_model.model."
LORA_WEIGHT_SUFFIX = {"lora_A": ".lora_A.weight", "lora_B": ".lora_B.weight"}


def default_lora_targets() -> dict[str, list[str]]:
    """peft's default LoRA target modules per ``model_type``."""
    from peft.utils import constants

    return getattr(constants, TARGETS_MAPPING)


def tuner_layers(model: nn.Module) -> list[nn.Module]:
    """The peft tuner layers (LoRA wrappers) inside ``model``, in module order."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


def lora_linear(mod: nn.Module, adapters: list[str] | None = None) -> tuple[nn.Linear, list[tuple]] | None:
    """A peft LoRA wrapper of a plain ``nn.Linear`` as ``(base, [(A, B, scaling) per active adapter])``,
    its output being ``base(x) + Σ B·(A·x)·scaling``; ``[]`` when the adapters are disabled. None for
    anything else: not a LoRA layer, a merged or transposed one, DoRA or another variant, dropout,
    biased LoRA factors. ``adapters``: the factors of these adapters, in this order, whichever is
    active (a population's members, each row routed through one of them); None if one is missing or
    the adapters are disabled."""
    base = getattr(mod, "base_layer", None)
    if type(base) is not nn.Linear or not hasattr(mod, "lora_A") or getattr(mod, "merged", True):
        return None
    if getattr(mod, "fan_in_fan_out", False):
        return None
    if adapters is not None and (mod.disable_adapters or any(n not in mod.lora_A for n in adapters)):
        return None
    if mod.disable_adapters:
        return base, []
    lora = []
    for name in (mod.active_adapters if adapters is None else adapters):
        if name not in mod.lora_A:
            continue
        if name in getattr(mod, "lora_variant", {}) or type(mod.lora_dropout[name]) is not nn.Identity:
            return None
        a, b = mod.lora_A[name], mod.lora_B[name]
        if type(a) is not nn.Linear or type(b) is not nn.Linear or a.bias is not None or b.bias is not None:
            return None
        lora.append((a.weight, b.weight, mod.scaling[name]))
    return base, lora
