"""The word-level tokenizer and the chat format (gen_mask)."""

from __future__ import annotations

import random

import pytest

from lopd.envs.code import CodeEnv
from lopd.envs.tool import ToolEnv, run_actions
from lopd.model.chat import ChatFormat
from lopd.model.tokenizer import (ASSISTANT, BOS, END, EXP, OBS, PAD, SPECIALS, UNK, USER, build_tokenizer,
                                  env_vocabulary, load_tokenizer, save_tokenizer)


@pytest.fixture(scope="module")
def words():
    return env_vocabulary(["tool", "code"])


@pytest.fixture(scope="module")
def tok(words):
    return build_tokenizer(words)


@pytest.fixture(scope="module")
def reloaded(tok, tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    save_tokenizer(tok, d)
    assert (d / "tokenizer.json").exists()
    return load_tokenizer(d)


@pytest.fixture(scope="module")
def texts():
    tool, code = ToolEnv(), CodeEnv()
    out = []
    rng = random.Random(0)
    for t in tool.generate(3, 12):
        msgs, _ = run_actions(tool, t, tool.solve(t, rng=rng, noise=0.4))
        out += [m for _, m in msgs]
        out += tool.solve(t)
    for t in code.generate(3, 12):
        out += [t.prompt, t.spec["solution"], code.solve(t, rng=rng, noise=1.0)[0]]
    return out


def test_vocabulary_union(words):
    assert set(words) == set(ToolEnv().vocabulary()) | set(CodeEnv().vocabulary())
    assert words == sorted(set(words))


def test_specials_first(tok, words):
    vocab = tok.get_vocab()
    assert [vocab[s] for s in SPECIALS] == list(range(len(SPECIALS)))
    assert len(tok) == len(SPECIALS) + len(set(words) - set(SPECIALS))
    assert tok.pad_token == PAD and tok.unk_token == UNK and tok.bos_token == BOS and tok.eos_token == END
    assert tok.pad_token_id == 0 and tok.unk_token_id == 1


def test_every_env_word_known(tok, words):
    vocab = tok.get_vocab()
    for w in words:
        ids = tok.encode(w, add_special_tokens=False)
        assert ids == [vocab[w]], w
        assert tok.unk_token_id not in ids
    # and distinct words get distinct ids
    assert len({vocab[w] for w in words}) == len(words)


def test_unknown_word_is_unk(tok):
    assert tok.encode("zebra", add_special_tokens=False) == [tok.unk_token_id]
    assert tok.encode("set zebra", add_special_tokens=False)[1] == tok.unk_token_id


def test_env_texts_have_no_unk(tok, texts):
    for s in texts:
        assert tok.unk_token_id not in tok.encode(s, add_special_tokens=False), s


def test_round_trip_ids_identical(tok, reloaded, texts):
    assert reloaded.get_vocab() == tok.get_vocab()
    assert len(reloaded) == len(tok)
    for attr in ("pad_token_id", "unk_token_id", "bos_token_id", "eos_token_id"):
        assert getattr(reloaded, attr) == getattr(tok, attr)
    for s in texts:
        assert reloaded.encode(s, add_special_tokens=False) == tok.encode(s, add_special_tokens=False)


def test_round_trip_decode(tok, reloaded, texts):
    for t in (tok, reloaded):
        fmt = ChatFormat(t)
        assert fmt.native
        for s in texts:
            norm = " ".join(s.split())
            assert fmt.decode(fmt.words(s)) == norm
            assert fmt.decode(fmt.words(s) + [fmt.end_id]) == norm  # the end token is dropped


def test_chat_format_special_ids(reloaded):
    fmt = ChatFormat(reloaded)
    v = reloaded.get_vocab()
    assert fmt.bos == [v[BOS]] and fmt.user == [v[USER]] and fmt.assistant == [v[ASSISTANT]]
    assert fmt.obs == [v[OBS]] and fmt.exp == [v[EXP]] and fmt.end_id == v[END] and fmt.pad_id == v[PAD]


def test_gen_mask_two_turns(reloaded):
    fmt = ChatFormat(reloaded)
    v = reloaded.get_vocab()
    msgs = [("user", "bank : send 3 to ana"), ("assistant", "login"), ("obs", "ok"), ("assistant", "pay ana 3")]
    ids, mask = fmt.encode_messages(msgs)
    expected = ([v[BOS], v[USER], v["bank"], v[":"], v["send"], v["3"], v["to"], v["ana"], v[END], v[ASSISTANT]]
                + [v["login"], v[END]]
                + [v[OBS], v["ok"], v[END], v[ASSISTANT]]
                + [v["pay"], v["ana"], v["3"], v[END]])
    exp_mask = [0] * 10 + [1, 1] + [0] * 4 + [1, 1, 1, 1]
    assert ids == expected
    assert mask == exp_mask
    generated = [i for i, m in zip(ids, mask) if m]
    assert generated == [v["login"], v[END], v["pay"], v["ana"], v["3"], v[END]]


def test_gen_mask_on_env_trajectories(reloaded):
    fmt = ChatFormat(reloaded)
    env = ToolEnv()
    for t in env.generate(9, 16):
        msgs, _ = run_actions(env, t, env.solve(t))
        ids, mask = fmt.encode_messages(msgs)
        assert len(ids) == len(mask)
        n_assist = sum(len(m.split()) + 1 for role, m in msgs if role == "assistant")
        assert sum(mask) == n_assist
        # every masked run ends with END, and the generated text decodes to the actions
        runs, cur = [], []
        for i, m in zip(ids, mask):
            if m:
                cur.append(i)
            elif cur:
                runs.append(cur)
                cur = []
        if cur:
            runs.append(cur)
        assert all(r[-1] == fmt.end_id for r in runs)
        assert [fmt.decode(r) for r in runs] == [m for role, m in msgs if role == "assistant"]


def test_encode_messages_rejects_bad_roles(reloaded):
    fmt = ChatFormat(reloaded)
    with pytest.raises(ValueError, match="unknown role"):
        fmt.encode_messages([("user", "bank : send 3 to ana"), ("system", "ok")])
    with pytest.raises(AssertionError):
        fmt.encode_messages([("assistant", "login")])


def test_experience_ids_drop_bos(reloaded):
    fmt = ChatFormat(reloaded)
    msgs = [("user", "bank : send 3 to ana"), ("assistant", "login")]
    ids, _ = fmt.encode_messages(msgs)
    assert fmt.experience_ids(msgs) == ids[1:]
    assert fmt.context_ids([msgs, msgs]) == (fmt.exp + ids[1:]) * 2


def test_join_context_is_the_one_rendering(reloaded):
    """Base pretraining, the opsd_text teacher and context rollouts share join_context: each
    experience is <|exp|> + its trajectory without <|bos|>; the task's own trajectory follows."""
    fmt = ChatFormat(reloaded)
    e1 = [("user", "bank : send 3 to ana"), ("assistant", "login")]
    e2 = [("user", "bank : send 4 to bob"), ("assistant", "pay bob 4")]
    task = [("user", "bank : send 5 to cy"), ("assistant", "login")]
    ex = [fmt.experience_ids(e) for e in (e1, e2)]
    assert fmt.join_context(ex) == fmt.exp + ex[0] + fmt.exp + ex[1]
    assert fmt.context_ids([e1, e2]) == fmt.join_context(ex)
    assert fmt.join_context([]) == []
    ids, mask = fmt.encode_with_context([e1, e2], task)
    own, own_mask = fmt.encode_messages(task)
    n = len(fmt.join_context(ex))
    assert ids == fmt.join_context(ex) + own and ids[n:n + 1] == fmt.bos
    assert mask == [0] * n + own_mask  # the context is never supervised
    assert fmt.encode_with_context([], task) == (own, own_mask)


def test_world_names_use_a_fixed_vocabulary():
    """World names are syllable pairs: the vocabulary (and so the tokenizer) does not depend on
    how many worlds there are, and every syllable of a target world's name is a known word."""
    from lopd.envs import make_env
    from tests.conftest import default_params
    from lopd.envs.base import SYLLABLES

    small = default_params({"envs": {"n_target_worlds": 3, "n_pretrain_worlds": 5}})
    big = default_params({"envs": {"n_target_worlds": 16, "n_pretrain_worlds": 240}})
    words = env_vocabulary(["tool", "code"], small.envs)
    assert words == env_vocabulary(["tool", "code"], big.envs)
    assert set(SYLLABLES) <= set(words)
    for d in ("tool", "code"):
        for w in make_env(d, big.envs).worlds["target"]:
            assert len(w.name.split()) == 2 and set(w.name.split()) <= set(SYLLABLES)


def test_prompt_ids_many_equals_one_by_one(reloaded, texts):
    fmt = ChatFormat(reloaded)
    prompts = texts[:40] + ["", "bank : send 3 to ana"]
    assert fmt.prompt_ids_many(prompts) == [fmt.prompt_ids(p) for p in prompts]
    assert fmt.prompt_ids_many([]) == []


def test_decode_memo_gives_the_tokenizers_text(reloaded, texts, monkeypatch):
    import lopd.model.chat as chat

    fmt = ChatFormat(reloaded)
    ids = [fmt.words(t) + [fmt.end_id] for t in texts[:30]]
    want = [reloaded.decode([i for i in x if i != fmt.end_id], skip_special_tokens=True).strip() for x in ids]
    assert [fmt.decode(x) for x in ids] == want
    assert [fmt.decode(x) for x in ids] == want  # second time from the memo
    x = list(ids[0])
    x.insert(0, fmt.words("ok")[0])  # the caller's list changes: the memo is keyed by its contents
    assert fmt.decode(x) == reloaded.decode([i for i in x if i != fmt.end_id], skip_special_tokens=True).strip()
    assert fmt.decode(x) != want[0]
    monkeypatch.setattr(chat, "DECODE_MEMO", 4)
    small = ChatFormat(reloaded)
    assert [small.decode(x) for x in ids] == want  # a full memo is cleared, not trusted stale
    assert len(small._decoded) <= 4
