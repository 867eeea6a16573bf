"""The rollout engine (lopd/engine/rollout.py): greedy token-for-token equivalence with the former
one-position-per-forward engine (bench/reference_rollout.py), finished sequences leaving
the batch, one prefill forward per turn, and the ragged cache's positions and masks."""

from __future__ import annotations

import pytest
import torch

from lopd.engine.fast_decoder import FastDecoder
from lopd.engine.kv_cache import RaggedKVCache, full_sequence_plan
from lopd.engine.rollout import rollout_batch
from tests import tiny_policy as tp
from tests.near_ties import assert_no_near_ties
from bench.reference_rollout import rollout_batch as reference_rollout_batch


def _fields(r):
    return r.task.task_id, r.ids, r.gen_mask, r.messages, r.n_generated, r.finished, r.reward


def _assert_same(new, ref):
    assert len(new) == len(ref)
    for a, b in zip(new, ref):
        assert _fields(a) == _fields(b), f"rollout of {b.task.task_id} differs from the reference engine"


def _coverage(rolls, fmt) -> dict:
    """What a batch exercised: multi-turn episodes, forced turn ends, length cuts, finished ones."""
    forced_end = any(t == fmt.end_id and g == 0 and i > 0 and r.gen_mask[i - 1] == 1
                     for r in rolls for i, (t, g) in enumerate(zip(r.ids, r.gen_mask)))
    return {"multi_turn": any(sum(m[0] == "assistant" for m in r.messages) >= 2 for r in rolls),
            "forced_end": forced_end, "cut": any(not r.finished for r in rolls),
            "finished": any(r.finished for r in rolls), "obs": any(m[0] == "obs" for r in rolls for m in r.messages)}


# fused against unfused maps: two kernel paths, compared within float32 rounding (see the test)
FUSED_TOL = dict(atol=1e-5, rtol=1e-5)

# (max_new_tokens, max_len): the pipeline's lengths, and short ones that force turn ends and cut episodes
LENGTHS = [(24, 160), (3, 40)]


@pytest.mark.parametrize("arch", ["qwen3", "llama", "gpt2"])
def test_greedy_equals_reference_random_init(arch):
    model, fmt = tp.random_policy(arch)
    tasks = tp.tasks(5, 3)
    seen = {}
    for mnt, max_len in LENGTHS:
        ref = reference_rollout_batch(model, fmt, tp.envs(), tasks, max_new_tokens=mnt, max_len=max_len, greedy=True)
        new = rollout_batch(model, fmt, tp.envs(), tasks, max_new_tokens=mnt, max_len=max_len, greedy=True)
        assert_no_near_ties(model, ref)
        _assert_same(new, ref)
        for k, v in _coverage(ref, fmt).items():
            seen[k] = seen.get(k, False) or v
    assert all(seen.values()), f"the batches did not exercise every case: {seen}"


def test_greedy_equals_reference_trained_lora_policy():
    bb = tp.trained_backbone()
    tasks = tp.tasks(10, 6, seed=11)
    seen, solved = {}, False
    for mnt, max_len in LENGTHS:
        ref = reference_rollout_batch(bb.model, bb.fmt, tp.envs(), tasks, max_new_tokens=mnt, max_len=max_len,
                                      greedy=True)
        new = rollout_batch(bb.model, bb.fmt, tp.envs(), tasks, max_new_tokens=mnt, max_len=max_len, greedy=True)
        assert_no_near_ties(bb.model, ref)
        _assert_same(new, ref)
        for k, v in _coverage(ref, bb.fmt).items():
            seen[k] = seen.get(k, False) or v
        solved = solved or any(r.reward > 0 for r in ref)  # short caps cut every episode before its goal
    assert all(seen.values()), f"the batches did not exercise every case: {seen}"
    assert solved, "the trained policy should solve some task"


def test_without_cache_same_tokens():
    model, fmt = tp.random_policy("qwen3")
    tasks = tp.tasks(3, 2)
    a = rollout_batch(model, fmt, tp.envs(), tasks, max_new_tokens=6, max_len=60, greedy=True)
    b = rollout_batch(model, fmt, tp.envs(), tasks, max_new_tokens=6, max_len=60, greedy=True, use_cache=False)
    assert_no_near_ties(model, a)
    _assert_same(b, a)


def test_finished_rows_leave_the_batch_and_turns_prefill_in_one_forward(monkeypatch):
    import lopd.engine.rollout as engine

    bb = tp.trained_backbone()
    tasks = tp.tasks(6, 4, seed=5)  # code episodes end after one turn, tool episodes go on
    shapes: list[tuple[int, int]] = []  # (rows, width) of every forward pass
    real_forward = engine._forward

    def recording_forward(model, chunks, *args):
        shapes.append((len(chunks), max(len(c) for c in chunks)))
        return real_forward(model, chunks, *args)

    monkeypatch.setattr(engine, "_forward", recording_forward)
    rolls = rollout_batch(bb.model, bb.fmt, tp.envs(), tasks, max_new_tokens=24, max_len=160, greedy=True)
    monkeypatch.undo()
    assert_no_near_ties(bb.model, rolls)  # batch make-up changes the kernels' shapes: no choice may be a near-tie
    sampled = [sum(r.gen_mask) for r in rolls]  # tokens the policy chose (forced turn ends excluded)
    rows = [b for b, _ in shapes]
    # one forward per sampled token of the longest row; each live row samples exactly once per forward
    assert len(shapes) == max(sampled)
    assert sum(rows) == sum(sampled)
    assert rows == sorted(rows, reverse=True) and rows[-1] < rows[0], f"rows per forward: {rows}"
    # the first forward prefills every prompt; later wide forwards are observation prefills
    assert shapes[0][1] == max(len(bb.fmt.prompt_ids(t.prompt)) for t in tasks)
    assert any(w > 1 for _, w in shapes[1:]), "no observation was prefilled"
    # each row gives the same rollout alone as in the batch where others finish earlier
    for t, r in zip(tasks, rolls):
        alone = rollout_batch(bb.model, bb.fmt, tp.envs(), [t], max_new_tokens=24, max_len=160, greedy=True)[0]
        assert _fields(alone) == _fields(r)


def test_ragged_plan_positions_and_masks_hand_computed():
    cache = RaggedKVCache(2, capacity=8, device=torch.device("cpu"))
    pos, mask = cache.plan(torch.tensor([3, 1]), 3)
    assert pos.tolist() == [[0, 1, 2], [0, 0, 0]]
    # slot 0 is scratch; row 0's positions 0..2 go to slots 1..3, row 1's position 0 to slot 1
    assert mask[:, 0].int().tolist() == [[[0, 1, 0, 0], [0, 1, 1, 0], [0, 1, 1, 1]],
                                         [[1, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0]]]
    cache.commit()
    assert cache.lengths.tolist() == [3, 1]
    pos, mask = cache.plan(torch.tensor([1, 2]), 2)
    assert pos.tolist() == [[0, 3], [1, 2]]
    assert mask[:, 0].int().tolist() == [[[1, 0, 0, 0, 0], [0, 1, 1, 1, 1]],
                                         [[0, 1, 1, 0, 0], [0, 1, 1, 1, 0]]]
    cache.commit()
    cache.keep([1])
    assert cache.lengths.tolist() == [3]
    with pytest.raises(ValueError, match="capacity"):
        cache.plan(torch.tensor([6]), 6)


def test_full_sequence_plan_hand_computed():
    pos, mask = full_sequence_plan(torch.tensor([3, 2]), 3)
    assert pos.tolist() == [[0, 1, 2], [0, 0, 1]]
    assert mask[:, 0].int().tolist() == [[[1, 0, 0], [1, 1, 0], [1, 1, 1]],
                                         [[1, 0, 0], [0, 1, 0], [0, 1, 1]]]


@pytest.mark.parametrize("arch", ["qwen3", "gpt2"])
def test_ragged_cache_logits_equal_unpadded_forward(arch):
    """Rows of different lengths fed in uneven chunks through the ragged cache give, at every
    chunk end, the logits of a plain forward over that row's prefix alone."""
    model, _ = tp.random_policy(arch)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(8, 60, (n,), generator=g).tolist() for n in (11, 4, 9)]
    chunkings = [[5, 1, 4, 1], [2, 1, 1], [1, 6, 2]]
    cache = RaggedKVCache(3, capacity=16, device=torch.device("cpu"))
    fed = [0, 0, 0]
    with torch.inference_mode():
        for step in range(3):
            chunks = [s[f:f + c[step]] for s, f, c in zip(seqs, fed, chunkings)]
            width = max(len(c) for c in chunks)
            ids = torch.tensor([[0] * (width - len(c)) + c for c in chunks])
            pos, mask = cache.plan(torch.tensor([len(c) for c in chunks]), width)
            out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, cache=cache).logits
            cache.commit()
            fed = [f + len(c) for f, c in zip(fed, chunks)]
            for i, s in enumerate(seqs):
                plain = model(input_ids=torch.tensor([s[:fed[i]]]), use_cache=False).logits[0, -1]
                torch.testing.assert_close(out[i, -1], plain, atol=1e-5, rtol=1e-5)


def _lora_backbone(arch: str):
    from lopd.model.backbone import Backbone

    model, _ = tp.random_policy(arch)
    torch.manual_seed(1)
    bb = Backbone(model, tp.tokenizer(), tp.params(arch).model)
    with torch.no_grad():
        for prm in bb.adapter_params("student") + bb.adapter_params("composer"):
            prm.normal_(0.0, 0.05)
    bb.model.eval()
    return bb


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("role", ["student", "composer", "teacher"])
def test_fast_decoder_bitwise_equals_hf_forward(arch, role):
    """The lean forward computes exactly the Hugging Face + peft forward (same bits), for
    whichever adapter is active or with adapters disabled (the teacher)."""
    bb = _lora_backbone(arch)
    bb.mode(role)
    fast = FastDecoder.build(bb.model)
    assert fast is not None
    g = torch.Generator().manual_seed(0)
    caches = [RaggedKVCache(3, capacity=24, device=torch.device("cpu")) for _ in range(2)]
    with torch.inference_mode():
        for n_new in ([7, 3, 5], [1, 4, 1], [1, 1, 1]):
            width = max(n_new)
            ids = torch.randint(8, 60, (3, width), generator=g)
            outs = []
            for c, use_fast in zip(caches, (False, True)):
                pos, mask = c.plan(torch.tensor(n_new), width)
                if use_fast:
                    outs.append(fast(ids, pos, mask, c))
                else:
                    outs.append(bb.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                                         cache=c, logits_to_keep=1).logits[:, -1])
                c.commit()
            assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("role", ["student", "teacher"])
def test_packed_forward_equals_hf_forward(arch, role):
    """The packed lean forward (real tokens only, no padding) gives the Hugging Face + peft
    forward's logits over the padded batch: equal to the last float32 rounding at a pure decoding
    step (one token per row; bit-identical with the per-family pools' larger vocabulary, up to
    2.4e-7 apart with the current 132-word one), and up to float
    rounding when some rows feed several tokens (the last token attends in a one-query block, the
    others in a padded block, not one padded batch). Token-for-token greedy identity with the
    reference engine is checked by the ``test_greedy_equals_reference_*`` tests."""
    bb = _lora_backbone(arch)
    bb.mode(role)
    fast = FastDecoder.build(bb.model)
    g = torch.Generator().manual_seed(0)
    caches = [RaggedKVCache(3, capacity=24, device=torch.device("cpu")) for _ in range(2)]
    with torch.inference_mode():
        for n_new in ([7, 3, 5], [1, 4, 1], [1, 1, 1], [2, 1, 3], [1, 1, 1]):
            width = max(n_new)
            ids = torch.randint(8, 60, (3, width), generator=g)
            pos, mask = caches[0].plan(torch.tensor(n_new), width)
            ref = bb.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, cache=caches[0],
                           logits_to_keep=1).logits[:, -1]
            plan = caches[1].packed(n_new, fast.kv_heads)
            out = fast.packed(torch.cat([ids[i, width - n:] for i, n in enumerate(n_new)]), plan, caches[1])
            for c in caches:
                c.commit()
            if max(n_new) == 1:
                torch.testing.assert_close(out, ref, atol=1e-6, rtol=0)
            else:
                torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        assert caches[1].lengths.tolist() == caches[0].lengths.tolist()
        with pytest.raises(ValueError, match="capacity"):
            caches[1].packed([1, 1, 20], fast.kv_heads)


def test_packed_plan_hand_computed():
    cache = RaggedKVCache(2, capacity=8, device=torch.device("cpu"))
    cache.lengths = torch.tensor([2, 0])
    plan = cache.packed([1, 3], kv_heads=1)  # row 0: position 2; row 1: positions 0, 1, 2
    assert plan.pos.tolist() == [2, 0, 1, 2] and plan.last.tolist() == [0, 3] and plan.width == 4
    assert plan.dest.tolist() == [3, 9 + 1, 9 + 2, 9 + 3]  # (row·heads + head)·9 slots + position + 1
    assert plan.last_mask[:, 0, 0].int().tolist() == [[0, 1, 1, 1], [0, 1, 1, 1]]
    assert plan.ext_rows.tolist() == [1] and plan.ext_idx.tolist() == [[1, 2]]
    assert plan.ext_mask[:, 0].int().tolist() == [[[0, 1, 0, 0], [0, 1, 1, 0]]]
    assert plan.ext_take.tolist() == [0, 1] and plan.ext_dest.tolist() == [1, 2]
    assert cache.packed([1, 1], kv_heads=1).ext_rows is None  # a pure decoding step


def test_fast_and_hf_engines_give_the_same_rollouts():
    bb = _lora_backbone("qwen3")
    bb.mode("student")
    tasks = tp.tasks(4, 2, seed=29)
    kw = dict(max_new_tokens=6, max_len=80, greedy=False, seeds=[21, 22, 23, 24, 25, 26])  # 11..16 hold a near-tie (2e-5)
    a = rollout_batch(bb.model, bb.fmt, tp.envs(), tasks, engine="auto", **kw)
    b = rollout_batch(bb.model, bb.fmt, tp.envs(), tasks, engine="hf", **kw)
    assert_no_near_ties(bb.model, b, seeds=kw["seeds"])
    _assert_same(a, b)
    with pytest.raises(ValueError, match="unknown rollout engine"):
        rollout_batch(bb.model, bb.fmt, tp.envs(), tasks, engine="vllm", **kw)


def test_fast_decoder_declines_what_it_does_not_cover():
    gpt2, _ = tp.random_policy("gpt2")
    assert FastDecoder.build(gpt2) is None  # another architecture: the HF forward runs
    model, _ = tp.random_policy("qwen3")
    assert FastDecoder.build(model) is not None
    model.train()
    assert FastDecoder.build(model) is None  # training mode (dropout) is not a rollout


def _packed_steps(fast, forward, n_rows: int = 5, steps: int = 12, seed: int = 0, members: list[int] | None = None):
    """Logits of ``forward`` (a packed forward of ``fast``) over prefill and decoding steps of a
    fresh cache, and the cache's keys at the end. ``members`` (each row's member): ``forward`` is also
    given each token's member (a decoder that routes members)."""
    g = torch.Generator().manual_seed(seed)
    cache = RaggedKVCache(n_rows, capacity=64, device=torch.device("cpu"))
    outs = []
    with torch.inference_mode():
        for step in range(steps):
            n_new = torch.randint(1, 6, (n_rows,), generator=g).tolist() if step % 4 == 0 else [1] * n_rows
            ids = torch.randint(8, 60, (sum(n_new),), generator=g)
            extra = () if members is None else (torch.tensor([m for m, n in zip(members, n_new) for _ in range(n)]),)
            outs.append(forward(ids, cache.packed(n_new, fast.kv_heads), cache, *extra))
            cache.commit()
    return outs, cache.keys + cache.values


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("role", ["student", "composer", "teacher"])
@pytest.mark.parametrize("lora_alpha", [16, 12])  # scaling 2 (folded into B) and 1.5 (applied as peft does)
def test_fused_packed_forward_matches_unfused(arch, role, lora_alpha):
    """The packed forward with fused maps (q|k|v and gate|up as one matmul, the adapters' A as one,
    q- and k-norm at once, rotary from a table) agrees with the maps one by one to FUSED_TOL.

    Not bitwise: one matmul over stacked weights is another kernel call on another shape than one
    matmul per map, and how BLAS blocks it (hence the summation order) depends on the CPU: on an
    AVX-512 EPYC the adapters' stacked A gave other bits even under the AVX2 pin. Measured gap:
    at most a few float32 ulps of the logits (< 1e-6)."""
    from lopd.model.backbone import Backbone

    model, _ = tp.random_policy(arch)
    torch.manual_seed(1)
    mp = tp.params(arch).model.model_copy(update={"lora_alpha": lora_alpha})
    bb = Backbone(model, tp.tokenizer(), mp)
    with torch.no_grad():
        for prm in bb.adapter_params("student") + bb.adapter_params("composer"):
            prm.normal_(0.0, 0.05)
    bb.model.eval()
    bb.mode(role)
    fast = FastDecoder.build(bb.model)
    assert fast.fused is not None
    folded = [s is None for ly in fast.fused for *_, s in ly.qkv.lora]
    if role != "teacher":
        assert folded and all(folded) == (lora_alpha == 16)
    fused, keys_fused = _packed_steps(fast, fast.packed)
    plain, keys_plain = _packed_steps(fast, fast.packed_unfused)
    for a, b in zip(fused, plain):
        torch.testing.assert_close(a, b, **FUSED_TOL)
    for a, b in zip(keys_fused, keys_plain):
        torch.testing.assert_close(a, b, **FUSED_TOL)


def test_fused_forward_falls_back_for_mixed_dtypes():
    """Maps whose adapter is in another dtype than the weights are not fused (the arithmetic
    would change); the packed forward then runs the maps one by one."""
    bb = _lora_backbone("qwen3")
    bb.mode("student")
    for mod in bb.model.modules():
        if hasattr(mod, "lora_A") and "student" in mod.lora_A:
            mod.lora_A["student"].to(torch.float64)
            mod.lora_B["student"].to(torch.float64)
    fast = FastDecoder.build(bb.model)
    assert fast is not None and fast.fused is None
    # the fallback still computes the model: its logits equal the HF + peft forward's on the same tokens
    ids = torch.randint(8, 60, (3, 6), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        cache = RaggedKVCache(3, capacity=16, device=torch.device("cpu"))
        out = fast.packed(ids.reshape(-1), cache.packed([6, 6, 6], fast.kv_heads), cache)
        ref = bb.model(input_ids=ids, use_cache=False).logits[:, -1]
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_large_models_are_not_fused(monkeypatch):
    import lopd.engine.fast_decoder as fd

    bb = _lora_backbone("qwen3")
    bb.mode("student")
    assert FastDecoder.build(bb.model).fused is not None
    monkeypatch.setattr(fd, "FUSE_MAX_PARAMS", 10)
    assert FastDecoder.build(bb.model).fused is None  # the maps run one by one (no copy of the weights)
