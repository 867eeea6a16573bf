"""The third-party internals lopd reads (lopd/compat/peft.py, lopd/compat/transformers.py) are where
the adapters expect them in the installed versions; a moved one fails here with its name."""

from __future__ import annotations

import importlib
import inspect
from importlib.metadata import version

import pytest
import torch
from torch import nn

from lopd.compat import peft as compat_peft
from lopd.compat import transformers as compat_transformers


def missing_internals(internals: list[tuple[str, str]]) -> list[str]:
    """``module.attribute`` of every listed internal that cannot be imported."""
    missing = []
    for module, attr in internals:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            missing.append(f"{module} (module)")
            continue
        if not hasattr(mod, attr):
            missing.append(f"{module}.{attr}")
    return missing


def _moved(lib: str, checked: str, what: list[str]) -> str:
    return (f"{lib} {version(lib)} moved internals that lopd/compat/{lib}.py reads (checked against {checked}): "
            + ", ".join(what))


@pytest.mark.parametrize("adapter,lib", [(compat_peft, "peft"), (compat_transformers, "transformers")])
def test_every_listed_internal_is_present(adapter, lib):
    missing = missing_internals(adapter.INTERNALS)
    assert not missing, _moved(lib, adapter.CHECKED_VERSION, missing)


def test_a_moved_internal_is_named(monkeypatch):
    """The check can fail, and says which internal moved."""
    import peft.utils.constants as constants

    monkeypatch.delattr(constants, compat_peft.TARGETS_MAPPING)
    assert missing_internals(compat_peft.INTERNALS) == [
        f"peft.utils.constants.{compat_peft.TARGETS_MAPPING}"]
    assert missing_internals([("peft.no_such_module", "x")]) == ["peft.no_such_module (module)"]


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 3)

    def forward(self, x):
        return self.proj(x)


def _lora_model():
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(_Tiny(), LoraConfig(r=2, lora_alpha=4, target_modules=["proj"]), adapter_name="student")
    with torch.no_grad():  # B starts at zero: make the adapter visible in the output
        model.base_model.model.proj.lora_B["student"].weight.normal_()
    return model


def test_a_lora_layer_has_the_attributes_the_fast_decoder_replays():
    model = _lora_model()
    layers = compat_peft.tuner_layers(model)
    assert len(layers) == 1, layers
    layer = layers[0]
    missing = [a for a in compat_peft.LORA_LAYER_ATTRIBUTES if not hasattr(layer, a)]
    assert not missing, _moved("peft", compat_peft.CHECKED_VERSION, [f"LoRA Linear.{a}" for a in missing])
    base, adapters = compat_peft.lora_linear(layer)
    assert len(adapters) == 1
    x = torch.randn(5, 4)
    a, b, s = adapters[0]
    replayed = base(x) + (x @ a.T) @ b.T * s  # what the fast decoder computes
    torch.testing.assert_close(replayed, model(x), rtol=0, atol=1e-6)
    assert compat_peft.lora_linear(nn.Linear(4, 3)) is None


def test_the_adapter_state_dict_layout_is_the_one_evaluation_folds():
    from peft import get_peft_model_state_dict

    keys = sorted(get_peft_model_state_dict(_lora_model(), adapter_name="student"))
    expected = sorted(compat_peft.STATE_DICT_PREFIX + "proj" + s for s in compat_peft.LORA_WEIGHT_SUFFIX.values())
    assert keys == expected, _moved("peft", compat_peft.CHECKED_VERSION, [f"adapter state-dict keys {keys}"])


def test_the_default_lora_targets_cover_the_architectures_lopd_builds():
    defaults = compat_peft.default_lora_targets()
    missing = [arch for arch in ("qwen3", "llama", "gpt2") if arch not in defaults]
    assert not missing, _moved("peft", compat_peft.CHECKED_VERSION, [f"{compat_peft.TARGETS_MAPPING}[{m!r}]"
                                                                      for m in missing])


def test_transformers_cache_and_config_internals():
    params = inspect.signature(compat_transformers.Cache.__init__).parameters
    assert "layers" in params, _moved("transformers", compat_transformers.CHECKED_VERSION, ["Cache.__init__(layers=...)"])
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      intermediate_size=32, vocab_size=32, head_dim=8)
    model = Qwen3ForCausalLM._from_config(cfg, attn_implementation="sdpa") if hasattr(
        Qwen3ForCausalLM, "_from_config") else Qwen3ForCausalLM(cfg)
    try:
        impl = compat_transformers.attn_implementation(model.config)
    except AttributeError:
        pytest.fail(_moved("transformers", compat_transformers.CHECKED_VERSION,
                           [f"PretrainedConfig.{compat_transformers.ATTN_IMPLEMENTATION}"]))
    assert impl == "sdpa"
    attn = model.model.layers[0].self_attn
    q = torch.randn(1, 2, 3, 8)
    kv = torch.randn(1, 1, 3, 8)
    out, _ = compat_transformers.sdpa_attention_forward(attn, q, kv, kv, None, scaling=attn.scaling)
    assert out.shape == (1, 3, 2, 8)
