"""Multi-token actions: with a byte-level BPE tokenizer (the stand-in's kind, trained small here so
that words split into several tokens) the rollout engine decodes and scores actions in both
domains exactly as with the word-level tokenizer: the same messages and the same rewards for
the same action texts.

The policy is a *replay* model: its logits put all mass on the next token of a scripted
trajectory (the prefix so far is looked up in a table built from the scripted trajectories
encoded by the format under test), and on the turn end where the script has nothing more to
say. So both tokenizers play the same action texts, and any difference in what the engine
decodes, sends to the environment or scores shows up as a difference in the rollouts.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from lopd.engine.rollout import rollout_batch
from lopd.envs.tool import run_actions
from lopd.model.chat import ChatFormat
from lopd.training.standin import environment_text, train_bpe_tokenizer
from lopd.training.base_policy import trajectory
from tests import tiny_policy as tp

BPE_VOCAB = 400  # small: convention words and names split into several tokens
N_TOOL, N_CODE = 10, 4


class ReplayPolicy(nn.Module):
    """Next token = ``table[prefix]`` (``end_id`` for an unknown prefix), as one-hot logits."""

    def __init__(self, table: dict[tuple[int, ...], int], vocab_size: int, pad_id: int, end_id: int):
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1))  # the engine reads the device from the parameters
        self.table, self.vocab_size, self.pad_id, self.end_id = table, vocab_size, pad_id, end_id
        self.unknown_prefixes = 0

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False, logits_to_keep=1, **_):
        logits = torch.full((input_ids.shape[0], 1, self.vocab_size), -1e4)
        for i, row in enumerate(input_ids.tolist()):
            start = next(j for j, t in enumerate(row) if t != self.pad_id)  # the engine left-pads
            nxt = self.table.get(tuple(row[start:]))
            if nxt is None:
                self.unknown_prefixes += 1
                nxt = self.end_id
            logits[i, 0, nxt] = 0.0
        return SimpleNamespace(logits=logits)


def scripted_trajectories(envs: dict, tasks: list) -> dict[str, list[tuple[str, str]]]:
    """A scripted trajectory per task: clean for even tasks, noisy (some fail) for odd ones."""
    rng = random.Random(3)
    out = {}
    for i, t in enumerate(tasks):
        env = envs[t.domain]
        actions = env.solve(t) if i % 2 == 0 else env.solve(t, rng, 0.6)
        out[t.task_id] = trajectory(env, t, actions)
    return out


def replay_table(fmt: ChatFormat, tasks: list, scripts: dict) -> dict[tuple[int, ...], int]:
    table: dict[tuple[int, ...], int] = {}
    for t in tasks:
        ids, gen = fmt.encode_messages(scripts[t.task_id])
        for j, g in enumerate(gen):
            if g:
                key = tuple(ids[:j])
                assert table.get(key, ids[j]) == ids[j], "two scripts share a prefix but differ after it"
                table[key] = ids[j]
    return table


def replay(fmt: ChatFormat, envs: dict, tasks: list, scripts: dict):
    table = replay_table(fmt, tasks, scripts)
    model = ReplayPolicy(table, len(fmt.tok), fmt.pad_id, fmt.end_id)
    rolls = rollout_batch(model, fmt, envs, tasks, max_new_tokens=96, max_len=4096, greedy=True,
                          use_cache=False, engine="hf")
    return rolls, model


@pytest.fixture(scope="module")
def setting():
    envs = tp.envs()
    tasks = envs["tool"].generate(11, N_TOOL) + envs["code"].generate(11, N_CODE)
    bpe = train_bpe_tokenizer(list(environment_text(tp.params().envs)), BPE_VOCAB)
    return envs, tasks, scripted_trajectories(envs, tasks), ChatFormat(tp.tokenizer()), ChatFormat(bpe)


def test_bpe_format_is_the_real_model_path_and_splits_words(setting):
    envs, tasks, scripts, word_fmt, bpe_fmt = setting
    assert word_fmt.native and not bpe_fmt.native  # the BPE tokenizer has Qwen's specials, not ours
    actions = [text for t in tasks for role, text in scripts[t.task_id] if role == "assistant" and text]
    words = {w for a in actions for w in a.split()}
    split = [w for w in words if len(bpe_fmt.words(" " + w)) > 1]
    assert len(split) >= 10, f"only {len(split)} action words span several BPE tokens"
    for a in actions:  # every action text survives encode -> decode
        assert bpe_fmt.decode(bpe_fmt.words(a) + [bpe_fmt.end_id]) == a


def test_rollouts_play_the_same_actions_with_either_tokenizer(setting):
    envs, tasks, scripts, word_fmt, bpe_fmt = setting
    word_rolls, word_model = replay(word_fmt, envs, tasks, scripts)
    bpe_rolls, bpe_model = replay(bpe_fmt, envs, tasks, scripts)
    for w, b in zip(word_rolls, bpe_rolls):
        assert w.task.task_id == b.task.task_id
        assert b.messages == w.messages, f"{b.task.task_id}: BPE rollout messages differ"
        assert b.reward == w.reward, f"{b.task.task_id}: BPE rollout reward differs"
        assert b.finished == w.finished
        # the scripted part is played verbatim: the rollout starts with the script's messages
        script = scripts[b.task.task_id]
        assert b.messages[:len(script)] == script[:len(b.messages)]
    assert bpe_model.unknown_prefixes == word_model.unknown_prefixes  # the same turns ran past the scripts
    rewards = [r.reward for r in bpe_rolls]
    assert 0.0 < sum(rewards) < len(rewards), f"rewards {rewards}: need both successes and failures"
    for domain in ("tool", "code"):
        assert any(r.reward == 1.0 for r in bpe_rolls if r.task.domain == domain), f"no {domain} success"
    # the BPE policy generated more tokens for the same texts: its actions span several tokens each
    assert sum(r.n_generated for r in bpe_rolls) > sum(r.n_generated for r in word_rolls)


def test_replayed_rewards_equal_the_environment_on_the_script(setting):
    envs, tasks, scripts, _, bpe_fmt = setting
    bpe_rolls, _ = replay(bpe_fmt, envs, tasks, scripts)
    for r in bpe_rolls:
        if r.task.domain != "tool":
            continue
        actions = [text for role, text in r.messages if role == "assistant"]
        _, reward = run_actions(envs["tool"], r.task, actions)
        assert r.reward == reward


def test_standin_config_and_tokenizer_load_as_a_downloaded_checkpoint(setting, tmp_path):
    from lopd.training.standin import EMBED_MULTIPLE, IM_END, QWEN3_0_6B, standin_config
    from lopd.model.tokenizer import load_tokenizer

    bpe = setting[4].tok
    bpe.save_pretrained(str(tmp_path))
    tok = load_tokenizer(tmp_path)  # AutoTokenizer, local files only
    assert tok.eos_token == IM_END and tok.bos_token is None and tok.pad_token == "<|endoftext|>"
    text = tok.apply_chat_template([{"role": "user", "content": "ro mu bank : send 8 to cy"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == "<|im_start|>user\nro mu bank : send 8 to cy<|im_end|>\n<|im_start|>assistant\n"
    cfg = standin_config(tok)
    assert cfg.architectures == ["Qwen3ForCausalLM"] and cfg.model_type == "qwen3"
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "rms_norm_eps", "tie_word_embeddings", "max_position_embeddings"):
        assert getattr(cfg, key) == QWEN3_0_6B[key], key
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (1024, 28, 16, 8)
    assert cfg.vocab_size % EMBED_MULTIPLE == 0 and len(tok) <= cfg.vocab_size < len(tok) + EMBED_MULTIPLE
    assert cfg.eos_token_id == tok.eos_token_id
