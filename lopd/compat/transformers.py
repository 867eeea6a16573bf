"""Every read of a transformers internal, in one place.

lopd loads models, tokenizers and configs through transformers' public API; the engine's KV cache
and fast decoder also need:

* the ``Cache`` base class and its ``layers=`` constructor argument (the engine's ragged cache is a
  ``Cache`` so that the model's attention layers accept it);
* a config's private ``_attn_implementation`` (the fast decoder replays SDPA attention only);
* the SDPA attention function of ``transformers.integrations`` (the prefill runs the model's own);
* the name of a model's cache argument, which transformers 5 renamed in some models.

:data:`INTERNALS` lists them, checked against transformers :data:`CHECKED_VERSION`;
``tests/unit/test_compat.py`` fails with the name of whichever has moved.
"""

from __future__ import annotations

from transformers.cache_utils import Cache

CHECKED_VERSION = "5.24.0"
CACHE_MODULE = "transformers.cache_utils"
SDPA_MODULE = "transformers.integrations.sdpa_attention"
ATTN_IMPLEMENTATION = "_attn_implementation"  # a PretrainedConfig attribute

# (module, attribute) pairs read below
INTERNALS = [(CACHE_MODULE, "Cache"), (SDPA_MODULE, "sdpa_attention_forward")]

__all__ = ["Cache", "attn_implementation", "cache_kwarg", "empty_cache_layers", "sdpa_attention_forward"]


def cache_kwarg(model) -> str:
    """The name under which ``model.forward`` takes a KV cache: transformers >= 5.x renamed
    ``past_key_values`` to ``cache`` in some models; support both (a peft wrapper: its base model's)."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def empty_cache_layers() -> dict:
    """Keyword arguments of ``Cache.__init__`` for a cache that manages its own tensors (no layers)."""
    return {"layers": []}


def attn_implementation(config) -> str:
    """The attention implementation a loaded model runs (``"sdpa"``, ``"eager"``, ...)."""
    return getattr(config, ATTN_IMPLEMENTATION)


def sdpa_attention_forward(module, query, key, value, mask, *, scaling: float):
    """transformers' SDPA attention over ``module``'s heads: returns (output, weights)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward as forward

    return forward(module, query, key, value, mask, dropout=0.0, scaling=scaling)
