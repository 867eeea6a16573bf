"""A real-size stand-in for Qwen3-0.6B, built offline: ``lopd make-standin``.

No weights can be downloaded here, but the architecture and a tokenizer can be built locally.
The stand-in is a Hugging Face directory laid out as a downloaded checkpoint is
(``config.json``, ``generation_config.json``, ``model.safetensors`` in bf16, ``tokenizer.json``,
``tokenizer_config.json`` with a chat template), so the real-model path
(``model.name_or_path``; :func:`lopd.model.backbone.load_causal_lm`) loads it unchanged:

* a ``Qwen3ForCausalLM`` with Qwen3-0.6B's shape (:data:`QWEN3_0_6B`: hidden 1024, 28 layers,
  16 query / 8 key-value heads of width 128, MLP 3072, tied embeddings, RoPE θ = 10⁶,
  RMSNorm ε = 10⁻⁶) and seeded random weights ``N(0, 0.02²)`` (transformers' own init);
* a byte-level BPE tokenizer trained with the ``tokenizers`` library, with Qwen's special tokens
  (``<|endoftext|>`` pads, ``<|im_end|>`` ends a turn, no BOS), so
  :class:`lopd.model.chat.ChatFormat` takes its plain-text-header path as it does for Qwen.

The tokenizer's corpus is the environments' text (every domain's scripted trajectories in
both world pools, rendered with the plain-text headers) plus Python's standard-library source
as general text: the environments alone hold a few hundred distinct words, far from a real
vocabulary, and a general vocabulary is what makes an action span several tokens. The
embedding matrix is padded past the tokenizer to a multiple of 128 rows, as Qwen3's is
(151 936 rows for 151 669 tokens), so ids without a token exist and can be sampled.
Random weights solve nothing: a pipeline run on the stand-in checks the path, not a result.
"""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from lopd.errors import BadInput

if TYPE_CHECKING:
    from lopd.config import Params


STANDIN_DIR = "models/external/qwen3-0.6b-standin"
STANDIN_SEED = 0
TOKENIZER_VOCAB = 31_850          # BPE tokens incl. specials; the embedding has EMBED_MULTIPLE-padded rows
EMBED_MULTIPLE = 128
GENERAL_TEXT_BYTES = 8_000_000    # standard-library source read as general text (sorted files, capped)
ENV_TASKS_PER_POOL = 1_000        # scripted trajectories per domain and world pool in the corpus

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIALS = [ENDOFTEXT, IM_START, IM_END]

# Qwen/Qwen3-0.6B config.json, less the vocabulary (the stand-in's tokenizer decides it)
QWEN3_0_6B = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6,
                  rope_theta=1_000_000.0, tie_word_embeddings=True, hidden_act="silu", attention_bias=False,
                  attention_dropout=0.0, use_sliding_window=False, sliding_window=None, max_window_layers=28,
                  initializer_range=0.02)

# Qwen's template without the thinking blocks: <|im_start|>role\ncontent<|im_end|>\n per message
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def environment_text(envs_params) -> Iterator[str]:
    """Scripted trajectories of every domain in both world pools, one text per trajectory,
    with the plain-text role headers :class:`~lopd.model.chat.ChatFormat` uses for a real model."""
    from lopd.envs import make_env
    from lopd.training.base_policy import trajectory

    header = {"user": "User: ", "assistant": "\nAssistant: ", "obs": "\nTool: "}
    for d_i, domain in enumerate(envs_params.domains):
        env = make_env(domain, envs_params)
        for pool in ("target", "pretrain"):
            for task in env.generate(envs_params.seed * 1000 + 900 + d_i, ENV_TASKS_PER_POOL, pool=pool):
                msgs = trajectory(env, task, env.solve(task))
                yield "".join(header[role] + text for role, text in msgs)


def general_text(max_bytes: int = GENERAL_TEXT_BYTES) -> Iterator[str]:
    """Python standard-library source files (sorted paths, tests skipped) up to ``max_bytes``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for path in sorted(root.rglob("*.py")):
        if "test" in path.relative_to(root).parts[0] or "site-packages" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        total += len(text.encode())
        if total > max_bytes:
            return
        yield text


def train_bpe_tokenizer(texts, vocab_size: int = TOKENIZER_VOCAB):
    """A byte-level BPE tokenizer (GPT-2 pre-tokenisation, every byte in the base alphabet, so no
    text is ever unknown) trained on ``texts``, wrapped as a ``transformers`` fast tokenizer with
    Qwen's special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=ENDOFTEXT,
                                   additional_special_tokens=[IM_START], model_max_length=40960)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def standin_config(tokenizer):
    """Qwen3-0.6B's config with the stand-in's vocabulary (rows padded to ``EMBED_MULTIPLE``)."""
    from transformers import Qwen3Config

    n = len(tokenizer)
    rows = -(-n // EMBED_MULTIPLE) * EMBED_MULTIPLE
    vocab = tokenizer.get_vocab()
    return Qwen3Config(vocab_size=rows, bos_token_id=vocab[ENDOFTEXT], eos_token_id=vocab[IM_END],
                       pad_token_id=vocab[ENDOFTEXT], architectures=["Qwen3ForCausalLM"], **QWEN3_0_6B)


def build_standin(out_dir: str | Path, envs_params, seed: int = STANDIN_SEED,
                  vocab_size: int = TOKENIZER_VOCAB, general_bytes: int = GENERAL_TEXT_BYTES) -> dict:
    """Write the stand-in to ``out_dir`` (refusing a non-empty one) and return its summary."""
    import torch
    from transformers import AutoModelForCausalLM

    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise BadInput(f"{out} exists and is not empty: remove it to rebuild the stand-in")
    env_texts = list(environment_text(envs_params))
    random.Random(seed).shuffle(env_texts)
    tok = train_bpe_tokenizer(iter(env_texts + list(general_text(general_bytes))), vocab_size)
    cfg = standin_config(tok)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model = model.to(torch.bfloat16)  # a downloaded Qwen3 checkpoint is stored in bf16
    model.config.dtype = torch.bfloat16
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    n_params = sum(p.numel() for p in model.parameters())
    return {"dir": str(out), "n_params": n_params, "tokenizer_vocab": len(tok), "embedding_rows": cfg.vocab_size,
            "env_texts": len(env_texts)}


def make_standin(params: Params, root: str | Path, out: str | None) -> int:
    """``lopd make-standin``: build the stand-in under ``root`` (default :data:`STANDIN_DIR`)."""
    target = Path(out) if out else Path(root) / STANDIN_DIR
    info = build_standin(target, params.envs)
    print(f"stand-in written to {info['dir']}: {info['n_params'] / 1e6:.1f}M parameters, "
          f"tokenizer {info['tokenizer_vocab']} tokens, embedding {info['embedding_rows']} rows")
    return 0
