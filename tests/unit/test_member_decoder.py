"""The lean decoder routing a population's rows (lopd/engine/fused_linear.py, ``FastDecoder.build(members=)``):
each token through its own member's adapter, as that member's decoder alone computes it (to float32
rounding: the members' factors run as one masked matmul, not one per member), and the same rollouts as
the Hugging Face forward routed by ``on_rows``."""

from __future__ import annotations

import pytest
import torch

from lopd.engine.fast_decoder import FastDecoder
from lopd.engine.kv_cache import RaggedKVCache
from lopd.engine.rollout import RowMembers, rollout_batch
from lopd.model.members import adapter_name
from tests import tiny_policy as tp
from tests.near_ties import min_choice_margin, NEAR_TIE
from tests.unit.test_rollout_engine import _packed_steps

S = 3
TOL = dict(atol=1e-5, rtol=1e-5)


def _population(arch: str = "qwen3"):
    from lopd.model.backbone import Backbone

    model, _ = tp.random_policy(arch)
    bb = Backbone(model, tp.tokenizer(), tp.params(arch).model)
    views = bb.member_views(S)
    torch.manual_seed(5)
    with torch.no_grad():
        for name, prm in bb.model.named_parameters():
            if "lora_" in name:
                prm.normal_(0.0, 0.05)  # every member's adapter its own, none zero (B starts at zero)
    bb.mode("student")
    bb.model.eval()
    return bb, views


def _steps(fast, rows: list[int], member: int | None = None) -> list[torch.Tensor]:
    """Logits over prefill and decoding steps (:func:`tests.unit.test_rollout_engine._packed_steps`); ``member``
    None: the routed decoder, each token through its row's member; else ``fast`` is that member alone."""
    return _packed_steps(fast, fast.packed, n_rows=len(rows), members=rows if member is None else None)[0]


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("rows", [[0, 0, 1, 2, 2], [2, 0, 1, 0, 2]])  # member by member, and interleaved
def test_routed_packed_forward_equals_each_member_alone(arch, rows):
    bb, views = _population(arch)
    names = [adapter_name("student", i) for i in range(S)]
    routed = FastDecoder.build(bb.model, members=names)
    assert routed is not None and routed.members == S
    got = _steps(routed, rows)
    for i in range(S):
        views[i].mode("student")
        alone = FastDecoder.build(bb.model)
        want = _steps(alone, rows, member=i)
        mine = [r for r, m in enumerate(rows) if m == i]
        for a, b in zip(got, want):
            torch.testing.assert_close(a[mine], b[mine], **TOL)
    # the members differ: a row routed through another member's adapter would not pass
    views[0].mode("student")
    other = _steps(FastDecoder.build(bb.model), rows, member=0)
    assert not torch.allclose(got[-1][[r for r, m in enumerate(rows) if m == 1]],
                              other[-1][[r for r, m in enumerate(rows) if m == 1]], **TOL)


def test_routed_decoder_needs_each_tokens_member_and_declines_what_it_cannot_route():
    bb, _ = _population()
    names = [adapter_name("student", i) for i in range(S)]
    fast = FastDecoder.build(bb.model, members=names)
    cache = RaggedKVCache(2, capacity=8, device=torch.device("cpu"))
    with torch.inference_mode(), pytest.raises(ValueError, match="each token's member"):
        fast.packed(torch.tensor([9, 10]), cache.packed([1, 1], fast.kv_heads), cache)
    with pytest.raises(ValueError, match="only packed"):
        fast(torch.tensor([[9]]), torch.tensor([[0]]), None, None)
    assert FastDecoder.build(bb.model, members=[*names, "student_m9"]) is None  # an adapter the model lacks


def test_population_rollouts_through_the_lean_decoder_equal_the_hf_routed_ones():
    bb, views = _population()
    tasks = tp.tasks(3, 3, seed=29)  # 3 tool and 3 code tasks
    owner = [0, 0, 1, 1, 2, 2]
    seeds = [31, 32, 33, 34, 35, 36]
    kw = dict(max_new_tokens=6, max_len=80, greedy=False, seeds=seeds)
    names = [adapter_name("student", i) for i in range(S)]
    out = {}
    for engine in ("auto", "hf"):
        with bb.member_rows("student", torch.tensor(owner), S) as routing:
            def on_rows(live):
                routing.set_rows(torch.tensor([owner[i] for i in live]))
            extra = {"members": RowMembers(names, owner)} if engine == "auto" else {"engine": "hf"}
            out[engine] = rollout_batch(bb.model, bb.fmt, tp.envs(), tasks, on_rows=on_rows, **kw, **extra)
    for i in range(S):  # the precondition of token equality across kernel paths: no near-tie in any choice
        views[i].mode("student")
        for k, r in enumerate(out["hf"]):
            if owner[k] == i:
                assert min_choice_margin(bb.model, r, seed=seeds[k]) > NEAR_TIE, "a near-tie: pick other seeds"
    assert [r.ids for r in out["auto"]] == [r.ids for r in out["hf"]]
    assert [r.reward for r in out["auto"]] == [r.reward for r in out["hf"]]
    with pytest.raises(ValueError, match="one member per task"):
        rollout_batch(bb.model, bb.fmt, tp.envs(), tasks, on_rows=lambda live: None,
                      members=RowMembers(names, owner[:2]), **kw)
