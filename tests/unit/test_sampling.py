"""Counter-based sampling and common random numbers (lopd/engine/sampling.py, lopd/engine/evaluation.py):
a row's draws depend only on (its seed, the position) — not on the batch — and they sample
from softmax(logits / T); evaluation seeds each (task, sample) from (seed, task_id, index)."""

from __future__ import annotations

import math

import pytest
import torch

from lopd.errors import BadInput
from lopd.engine.evaluation import evaluate_policy, sample_seed
from lopd.engine.rollout import rollout_batch
from lopd.engine.sampling import choose_tokens, derive_seed, mix32, uniforms
from tests import tiny_policy as tp
from tests.near_ties import assert_no_near_ties


def _mix32_python(x: int) -> int:
    x = (((x >> 16) ^ x) * 0x45D9F3B) % 2**32
    x = (((x >> 16) ^ x) * 0x45D9F3B) % 2**32
    return (x >> 16) ^ x


def test_mix32_matches_plain_python():
    a = torch.tensor([0, 1, 2, 0xFFFFFFFF, 0x12345678, 0x80000000])
    assert mix32(a).tolist() == [_mix32_python(int(x)) for x in a]
    assert _mix32_python(1) == 0x31251BA7  # pinned: the hash must not change silently (it keys every draw)
    assert len(set(mix32(torch.arange(1 << 16)).tolist())) == 1 << 16  # a bijection: no collisions


def _uniform_python(seed: int, pos: int, v: int) -> float:
    """lopd.engine.sampling.uniforms of one entry, in plain Python integers (the documented hash)."""
    m = 2**32 - 1
    state = _mix32_python((seed & m) ^ 0x243F6A88)
    state = _mix32_python(state ^ ((seed >> 32) & m) ^ 0x85A308D3)
    state = _mix32_python(state ^ (pos & m) ^ 0x13198A2E)
    return (_mix32_python(state ^ _mix32_python(_mix32_python(v) ^ 0x9E3779B9)) + 0.5) / 2**32


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_uniforms_and_draws_match_plain_python(temperature):
    seeds, pos, vocab = [5, 2**62 + 3, 17], [0, 9, 2**31 + 4], 23
    u = uniforms(torch.tensor(seeds), torch.tensor(pos), vocab)
    want = [[_uniform_python(s, p, v) for v in range(vocab)] for s, p in zip(seeds, pos)]
    assert u.tolist() == want
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(0))
    picks = choose_tokens(logits, greedy=False, temperature=temperature, seeds=torch.tensor(seeds),
                          positions=torch.tensor(pos)).tolist()
    lg = logits.double().tolist()
    assert picks == [max(range(vocab), key=lambda v: lg[i][v] / temperature - math.log(-math.log(want[i][v])))
                     for i in range(3)]


def test_draws_depend_only_on_seed_and_position():
    seeds = torch.tensor([5, 2**62 + 3, 17])
    pos = torch.tensor([0, 9, 4])
    u = uniforms(seeds, pos, 50)
    assert u.dtype == torch.float64 and bool(((u > 0) & (u < 1)).all())
    alone = uniforms(seeds[1:2], pos[1:2], 50)
    assert torch.equal(u[1], alone[0])  # same row, other batch
    assert not torch.equal(uniforms(torch.tensor([5]), torch.tensor([1]), 50)[0], u[0])  # next position
    assert not torch.equal(uniforms(torch.tensor([6]), torch.tensor([0]), 50)[0], u[0])  # next seed
    hi = uniforms(torch.tensor([5 + 2**40]), torch.tensor([0]), 50)[0]
    assert not torch.equal(hi, u[0])  # the seed's high word matters too


@pytest.mark.parametrize("vary", ["seed", "position"])
def test_gumbel_max_samples_softmax(vary):
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, -3.0])
    T, n = 0.7, 40_000
    idx = torch.arange(n)
    seeds = idx * 7919 + 11 if vary == "seed" else torch.full((n,), 12345)
    pos = torch.zeros(n, dtype=torch.long) if vary == "seed" else idx
    tok = choose_tokens(logits.expand(n, -1), greedy=False, temperature=T, seeds=seeds, positions=pos)
    freq = torch.bincount(tok, minlength=5).double() / n
    p = torch.softmax(logits.double() / T, -1)
    sigma = torch.sqrt(p * (1 - p) / n)
    assert bool(((freq - p).abs() <= 4.5 * sigma + 1e-4).all()), (freq.tolist(), p.tolist())


def test_greedy_is_argmax():
    logits = torch.tensor([[0.1, 3.0, -1.0], [2.0, 1.0, 2.5]])
    assert choose_tokens(logits, greedy=True, temperature=1.0).tolist() == [1, 2]


def test_derive_seed_is_stable_and_keyed():
    s = derive_seed("eval", 20_000, "tool/bank/1", 0)
    assert 0 <= s < 2**63
    assert s == derive_seed("eval", 20_000, "tool/bank/1", 0)
    assert len({s, derive_seed("eval", 20_001, "tool/bank/1", 0), derive_seed("eval", 20_000, "tool/bank/2", 0),
                derive_seed("eval", 20_000, "tool/bank/1", 1)}) == 4
    assert sample_seed(20_000, "tool/bank/1", 0) == s


def test_same_task_and_seed_same_tokens_in_any_batch():
    bb = tp.trained_backbone()
    ts = tp.tasks(6, 4, seed=13)
    a, b, c, d, e = ts[0], ts[1], ts[6], ts[2], ts[7]
    kw = dict(max_new_tokens=24, max_len=160, greedy=False, temperature=1.0)
    one = rollout_batch(bb.model, bb.fmt, tp.envs(), [a, b, c], seeds=[101, 202, 303], **kw)
    two = rollout_batch(bb.model, bb.fmt, tp.envs(), [d, c, e, a], seeds=[404, 303, 505, 101], **kw)
    assert_no_near_ties(bb.model, one, seeds=[101, 202, 303])  # another batch make-up is another kernel shape
    assert (one[0].ids, one[0].messages, one[0].gen_mask) == (two[3].ids, two[3].messages, two[3].gen_mask)
    assert (one[2].ids, one[2].messages) == (two[1].ids, two[1].messages)
    # and the seed matters: other seeds give other draws for the same task
    others = rollout_batch(bb.model, bb.fmt, tp.envs(), [a] * 6, seeds=[1, 2, 3, 4, 5, 6], **kw)
    assert len({tuple(r.ids) for r in others}) > 1


def test_generator_seeds_are_reproducible():
    bb = tp.trained_backbone()
    ts = tp.tasks(4, 2, seed=17)
    runs = [rollout_batch(bb.model, bb.fmt, tp.envs(), ts, max_new_tokens=24, max_len=160,
                          generator=torch.Generator().manual_seed(3)) for _ in range(2)]
    assert [r.ids for r in runs[0]] == [r.ids for r in runs[1]]


def test_evaluate_samples_per_task_common_random_numbers():
    bb = tp.trained_backbone()
    ts = tp.tasks(4, 3, seed=19)
    kw = dict(max_new_tokens=24, max_len=160, greedy=False, temperature=1.0, seed=20_000)
    full = evaluate_policy(bb.model, bb.fmt, tp.envs(), ts, batch_size=5, samples_per_task=3, **kw)
    assert full["samples_per_task"] == 3
    for row in full["per_task"]:
        assert len(row["rewards"]) == 3
        assert math.isclose(row["reward"], sum(row["rewards"]) / 3)
    dom = {d: [r["reward"] for r in full["per_task"] if r["domain"] == d] for d in ("tool", "code")}
    assert full["by_domain"] == {d: sum(v) / len(v) for d, v in sorted(dom.items())}
    # another subset, order and batch size: the shared tasks get the very same samples
    sub = [ts[5], ts[1], ts[3]]
    part = evaluate_policy(bb.model, bb.fmt, tp.envs(), sub, batch_size=2, samples_per_task=3, **kw)
    sub_rolls = rollout_batch(bb.model, bb.fmt, tp.envs(), [t for t in sub for _ in range(3)],
                              seeds=[sample_seed(20_000, t.task_id, k) for t in sub for k in range(3)],
                              max_new_tokens=24, max_len=160)
    assert_no_near_ties(bb.model, sub_rolls, seeds=[sample_seed(20_000, t.task_id, k) for t in sub for k in range(3)])
    by_id = {r["task_id"]: r["rewards"] for r in full["per_task"]}
    for row in part["per_task"]:
        assert row["rewards"] == by_id[row["task_id"]]
    # the samples of a task differ from each other (each sample index has its own seed)
    seeds = [sample_seed(20_000, ts[0].task_id, k) for k in range(3)]
    rolls = rollout_batch(bb.model, bb.fmt, tp.envs(), [ts[0]] * 3, seeds=seeds, max_new_tokens=24, max_len=160)
    assert len({tuple(r.ids) for r in rolls}) > 1


def test_evaluate_greedy_one_sample_and_bad_input():
    bb = tp.trained_backbone()
    ts = tp.tasks(2, 1, seed=23)
    res = evaluate_policy(bb.model, bb.fmt, tp.envs(), ts, max_new_tokens=8, max_len=80, greedy=True,
                          samples_per_task=4)
    assert res["samples_per_task"] == 1 and all(len(r["rewards"]) == 1 for r in res["per_task"])
    with pytest.raises(BadInput, match="samples_per_task"):
        evaluate_policy(bb.model, bb.fmt, tp.envs(), ts, max_new_tokens=8, max_len=80, samples_per_task=0)
    with pytest.raises(BadInput, match="distinct task_ids"):
        evaluate_policy(bb.model, bb.fmt, tp.envs(), ts + ts[:1], max_new_tokens=8, max_len=80)
