"""An offline word-level tokenizer and the chat format shared by rollouts and losses.

The tiny default model uses a word-level tokenizer built with the ``tokenizers`` library
from the environments' vocabulary (every prompt, action and observation is whitespace-
separated words), wrapped as a ``transformers`` fast tokenizer so that saving/loading and
every downstream call go through the same API a real Hugging Face tokenizer offers.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from lopd.envs import make_env

PAD, UNK, BOS = "<|pad|>", "<|unk|>", "<|bos|>"
USER, ASSISTANT, OBS, END = "<|user|>", "<|assistant|>", "<|obs|>", "<|end|>"
EXP = "<|exp|>"  # separates retrieved experiences in a text context
SPECIALS = [PAD, UNK, BOS, USER, ASSISTANT, OBS, END, EXP]


def env_vocabulary(domains: list[str], envs_params=None) -> list[str]:
    words: set[str] = set()
    for d in domains:
        words.update(make_env(d, envs_params).vocabulary())
    return sorted(words)


def build_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    """Word-level tokenizer: specials first (ids 0..7), then ``words`` in sorted order."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for w in sorted(set(words)):
        if w not in vocab:
            vocab[w] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        unk_token=UNK,
        bos_token=BOS,
        eos_token=END,
        additional_special_tokens=[USER, ASSISTANT, OBS, EXP],
    )
    return fast


def save_tokenizer(tok: PreTrainedTokenizerFast, path: str | Path) -> None:
    tok.save_pretrained(str(path))


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
