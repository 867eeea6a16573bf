"""Hand-computed tests for lopd.training.objectives.

Every expected value is written out from the probabilities with plain ``math`` — never by
calling the function under test or ``torch.nn.functional.kl_div``.
"""

from __future__ import annotations

import math

import pytest
import torch

from lopd.training.objectives import (
    KLResult,
    anchor_loss,
    dual_update,
    grpo_advantages,
    margin_penalty,
    margin_sat_frac,
    outcome_weighted_delta,
    policy_gradient_loss,
    reverse_kl_topm_tail,
    sft_loss,
    token_delta,
    token_logprobs,
)

ln = math.log


def logp(*rows):
    """Probability rows -> (1, len(rows), V) float64 log-prob tensor."""
    return torch.log(torch.tensor([list(rows)], dtype=torch.float64))


ONE = torch.ones(1, 1)

# --- 4-token pair used by the top-M tests --------------------------------------------
#   p_S = [0.50, 0.30, 0.15, 0.05]   student top-2 = {0, 1}
#   p_T = [0.20, 0.10, 0.40, 0.30]   teacher top-2 = {2, 3}
PS4 = [0.50, 0.30, 0.15, 0.05]
PT4 = [0.20, 0.10, 0.40, 0.30]

# --- 3-token pair -------------------------------------------------------------------
#   p_S = [0.5, 0.3, 0.2], p_T = [0.25, 0.25, 0.5]
PS3 = [0.5, 0.3, 0.2]
PT3 = [0.25, 0.25, 0.5]
# Full reverse KL(p_S || p_T) = .5 ln(.5/.25) + .3 ln(.3/.25) + .2 ln(.2/.5)
#                             = .5 ln 2 + .3 ln 1.2 + .2 ln 0.4 ≈ 0.218012
KL3_REV = 0.5 * ln(2.0) + 0.3 * ln(1.2) + 0.2 * ln(0.4)
# Full forward KL(p_T || p_S) = .25 ln(.25/.5) + .25 ln(.25/.3) + .5 ln(.5/.2)
#                             = .25 ln .5 + .25 ln(5/6) + .5 ln 2.5 ≈ 0.239278
KL3_FWD = 0.25 * ln(0.5) + 0.25 * ln(0.25 / 0.3) + 0.5 * ln(2.5)


# ===================================================================== token_logprobs


def test_token_logprobs_hand_value_and_float32():
    # logits = ln[0.5, 0.3, 0.2] + 7 (a shift does not change softmax) -> target 1: ln 0.3
    base = [ln(0.5) + 7.0, ln(0.3) + 7.0, ln(0.2) + 7.0]
    logits = torch.tensor([[base, base]], dtype=torch.bfloat16)
    targets = torch.tensor([[1, 2]])
    out = token_logprobs(logits, targets)
    assert out.shape == (1, 2)
    assert out.dtype == torch.float32
    assert out[0, 0].item() == pytest.approx(ln(0.3), abs=2e-2)  # bf16 logits
    logits64 = torch.tensor([[base, base]], dtype=torch.float64)
    out64 = token_logprobs(logits64, targets)
    assert out64[0, 0].item() == pytest.approx(ln(0.3), abs=1e-12)
    assert out64[0, 1].item() == pytest.approx(ln(0.2), abs=1e-12)


def test_token_logprobs_bad_shapes():
    with pytest.raises(ValueError, match=r"targets must have shape \(N, T\) = \(1, 2\), got \(1, 3\)"):
        token_logprobs(torch.zeros(1, 2, 3), torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"logits must have shape \(N, T, V\), got \(2, 3\)"):
        token_logprobs(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="targets must be an integer tensor"):
        token_logprobs(torch.zeros(1, 2, 3), torch.zeros(1, 2))  # float targets


# ===================================================================== reverse KL, top-M


def test_reverse_kl_support_teacher_m2():
    # S = teacher top-2 = {2, 3}.
    # student: in S .15, .05; tail 1 - .2 = .80     teacher: in S .4, .3; tail .30
    # KL = .15 ln(.15/.4) + .05 ln(.05/.3) + .80 ln(.80/.30)
    expected = 0.15 * ln(0.15 / 0.4) + 0.05 * ln(0.05 / 0.3) + 0.80 * ln(0.80 / 0.30)
    res = reverse_kl_topm_tail(logp(PS4), logp(PT4), ONE, top_m=2, support="teacher")
    assert isinstance(res, KLResult)
    assert res.loss.item() == pytest.approx(expected, abs=1e-9)
    assert res.per_token[0, 0].item() == pytest.approx(expected, abs=1e-9)
    assert res.tail_mass.item() == pytest.approx(0.80, abs=1e-9)  # student's tail


def test_reverse_kl_support_student_m2():
    # S = student top-2 = {0, 1}.
    # student: .5, .3, tail .2      teacher: .2, .1, tail .7
    # KL = .5 ln(.5/.2) + .3 ln(.3/.1) + .2 ln(.2/.7)
    expected = 0.5 * ln(0.5 / 0.2) + 0.3 * ln(0.3 / 0.1) + 0.2 * ln(0.2 / 0.7)
    res = reverse_kl_topm_tail(logp(PS4), logp(PT4), ONE, top_m=2, support="student")
    assert res.loss.item() == pytest.approx(expected, abs=1e-9)
    assert res.tail_mass.item() == pytest.approx(0.20, abs=1e-9)


def test_reverse_kl_union_covering_all_equals_full_kl():
    # union of {0,1} and {2,3} = whole vocabulary -> tail ~ 0 -> full reverse KL
    expected = sum(s * ln(s / t) for s, t in zip(PS4, PT4))
    # = .5 ln 2.5 + .3 ln 3 + .15 ln .375 + .05 ln(1/6)
    assert expected == pytest.approx(
        0.5 * ln(2.5) + 0.3 * ln(3.0) + 0.15 * ln(0.375) + 0.05 * ln(1 / 6), abs=1e-15
    )
    res = reverse_kl_topm_tail(logp(PS4), logp(PT4), ONE, top_m=2, support="union")
    assert res.loss.item() == pytest.approx(expected, abs=1e-5)
    assert res.tail_mass.item() < 1e-6


def test_reverse_kl_union_variable_size_per_position():
    # position 0 (V=5): p_S = [.4,.3,.2,.05,.05] top2 {0,1}; p_T = [.1,.4,.3,.1,.1] top2 {1,2}
    #   union {0,1,2}: student tail .1, teacher tail .2
    #   KL0 = .4 ln(.4/.1) + .3 ln(.3/.4) + .2 ln(.2/.3) + .1 ln(.1/.2)
    # position 1: identical top-2 sets {0,1}: p_S = [.6,.2,.1,.05,.05], p_T = [.3,.4,.1,.1,.1]
    #   union = {0,1}: student tail .2, teacher tail .3
    #   KL1 = .6 ln(.6/.3) + .2 ln(.2/.4) + .2 ln(.2/.3)
    s = logp([0.4, 0.3, 0.2, 0.05, 0.05], [0.6, 0.2, 0.1, 0.05, 0.05])
    t = logp([0.1, 0.4, 0.3, 0.1, 0.1], [0.3, 0.4, 0.1, 0.1, 0.1])
    kl0 = 0.4 * ln(4.0) + 0.3 * ln(0.75) + 0.2 * ln(0.2 / 0.3) + 0.1 * ln(0.5)
    kl1 = 0.6 * ln(2.0) + 0.2 * ln(0.5) + 0.2 * ln(0.2 / 0.3)
    res = reverse_kl_topm_tail(s, t, torch.ones(1, 2), top_m=2, support="union")
    assert res.per_token[0, 0].item() == pytest.approx(kl0, abs=1e-9)
    assert res.per_token[0, 1].item() == pytest.approx(kl1, abs=1e-9)
    assert res.loss.item() == pytest.approx((kl0 + kl1) / 2, abs=1e-9)
    assert res.tail_mass.item() == pytest.approx((0.1 + 0.2) / 2, abs=1e-9)
    # where the sets coincide, union == teacher support == student support
    for sup in ("teacher", "student"):
        r = reverse_kl_topm_tail(s, t, torch.ones(1, 2), top_m=2, support=sup)
        assert r.per_token[0, 1].item() == pytest.approx(kl1, abs=1e-9)


def test_reverse_kl_direction_swap_is_forward_kl():
    # Full vocabulary (M=3 >= V): rev ≈ 0.218012, fwd ≈ 0.239278 — they differ.
    rev = reverse_kl_topm_tail(logp(PS3), logp(PT3), ONE, top_m=3).loss.item()
    fwd = reverse_kl_topm_tail(logp(PT3), logp(PS3), ONE, top_m=3).loss.item()
    assert rev == pytest.approx(KL3_REV, abs=1e-6)
    assert fwd == pytest.approx(KL3_FWD, abs=1e-6)
    assert abs(rev - fwd) > 0.02
    # With a tail (V=4, M=2, teacher support): swapped, the "teacher" argument is p_S,
    # whose top-2 is {0,1}; the expectation is under p_T:
    #   .2 ln(.2/.5) + .1 ln(.1/.3) + .7 ln(.7/.2)
    swapped = reverse_kl_topm_tail(logp(PT4), logp(PS4), ONE, top_m=2, support="teacher")
    expected = 0.2 * ln(0.2 / 0.5) + 0.1 * ln(0.1 / 0.3) + 0.7 * ln(0.7 / 0.2)
    assert swapped.loss.item() == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("support", ["teacher", "student", "union"])
@pytest.mark.parametrize("top_m", [3, 10])
def test_reverse_kl_m_covering_vocab_equals_full_kl(support, top_m):
    res = reverse_kl_topm_tail(logp(PS3), logp(PT3), ONE, top_m=top_m, support=support)
    assert res.loss.item() == pytest.approx(KL3_REV, abs=1e-5)
    assert not torch.isnan(res.per_token).any()


@pytest.mark.parametrize("support", ["teacher", "student", "union"])
def test_reverse_kl_full_vocab_float32_random_logits(support):
    # float32 log_softmax of arbitrary logits; expected computed with math from the logits.
    zs = [1.3, -0.7, 2.1, 0.0, -2.5]
    zt = [0.2, 0.9, -1.1, 1.7, 0.4]

    def probs(z):
        e = [math.exp(x) for x in z]
        tot = sum(e)
        return [x / tot for x in e]

    ps, pt = probs(zs), probs(zt)
    expected = sum(a * ln(a / b) for a, b in zip(ps, pt))
    s = torch.log_softmax(torch.tensor([[zs]]), -1)
    t = torch.log_softmax(torch.tensor([[zt]]), -1)
    r5 = reverse_kl_topm_tail(s, t, ONE, top_m=5, support=support)
    assert r5.loss.item() == pytest.approx(expected, abs=1e-5)
    # union of two top-3 sets: student top3 {2,0,3}, teacher top3 {3,1,4} -> all 5
    if support == "union":
        r3 = reverse_kl_topm_tail(s, t, ONE, top_m=3, support="union")
        assert r3.loss.item() == pytest.approx(expected, abs=1e-5)


def test_reverse_kl_mask_and_token_mean():
    # N=2, T=3, V=3 (full vocab, M=3).  A = (p_S=PS3, p_T=PT3) -> KL3_REV;
    # B = swapped -> KL3_FWD; C = identical -> 0.
    # seq0: [A, B, C]  mask [1, 1, 0]
    # seq1: [A, B, B]  mask [1, 0, 0]
    # loss = (KL_A + KL_B + KL_A) / 3
    s = torch.log(torch.tensor([[PS3, PT3, PS3], [PS3, PT3, PT3]], dtype=torch.float64))
    t = torch.log(torch.tensor([[PT3, PS3, PS3], [PT3, PS3, PS3]], dtype=torch.float64))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    res = reverse_kl_topm_tail(s, t, mask, top_m=3)
    expected = (2 * KL3_REV + KL3_FWD) / 3
    assert res.loss.item() == pytest.approx(expected, abs=1e-6)
    assert res.per_token[0, 2].item() == 0.0
    assert res.per_token[1, 1].item() == 0.0 and res.per_token[1, 2].item() == 0.0
    assert res.per_token[0, 1].item() == pytest.approx(KL3_FWD, abs=1e-6)
    # masked positions contribute nothing: change them arbitrarily (also to garbage)
    s2, t2 = s.clone(), t.clone()
    s2[1, 1:] = torch.log(torch.tensor([0.9, 0.05, 0.05], dtype=torch.float64))
    t2[0, 2] = torch.tensor([-50.0, 3.0, float("nan")], dtype=torch.float64)
    res2 = reverse_kl_topm_tail(s2, t2, mask.bool(), top_m=3)
    assert res2.loss.item() == pytest.approx(expected, abs=1e-6)
    assert not torch.isnan(res2.per_token).any()
    # No supervised tokens -> loss 0 (denominator clamped to 1)
    res0 = reverse_kl_topm_tail(s, t, torch.zeros(2, 3), top_m=3)
    assert res0.loss.item() == 0.0 and res0.tail_mass.item() == 0.0


@pytest.mark.parametrize("support", ["teacher", "student", "union"])
def test_reverse_kl_gradient_flows_to_both(support):
    g = torch.Generator().manual_seed(0)
    zs = torch.randn(2, 3, 7, generator=g, requires_grad=True)
    zt = torch.randn(2, 3, 7, generator=g, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    res = reverse_kl_topm_tail(
        torch.log_softmax(zs, -1), torch.log_softmax(zt, -1), mask, top_m=2, support=support
    )
    res.loss.backward()
    for z in (zs, zt):
        assert z.grad is not None
        assert torch.isfinite(z.grad).all()
        assert z.grad.abs().sum() > 0
        assert torch.all(z.grad[0, 2] == 0)  # masked position gets no gradient


def test_reverse_kl_validation():
    s, t = logp(PS3), logp(PT3)
    with pytest.raises(ValueError, match="support"):
        reverse_kl_topm_tail(s, t, ONE, support="both")
    # each with our own message: torch raises its own errors on mismatched shapes further down
    with pytest.raises(ValueError, match=r"must have the same \(N, T, V\) shape, got \(1, 1, 3\) and \(1, 1, 4\)"):
        reverse_kl_topm_tail(s, logp(PS4), ONE)  # V mismatch
    with pytest.raises(ValueError, match=r"mask must have shape \(1, 1\) .* got \(1, 2\)"):
        reverse_kl_topm_tail(s, t, torch.ones(1, 2))  # mask shape
    with pytest.raises(ValueError, match=r"student_logp must have shape \(N, T, V\), got \(1, 3\)"):
        reverse_kl_topm_tail(s[0], t[0], ONE)  # 2-D inputs
    with pytest.raises(ValueError, match=r"top_m must be an integer >= 1, got 0"):
        reverse_kl_topm_tail(s, t, ONE, top_m=0)


# ===================================================================== δ and Δ(φ)


def test_token_delta_detaches_student():
    g = torch.Generator().manual_seed(1)
    zs = torch.randn(2, 3, 5, generator=g, requires_grad=True)
    zt = torch.randn(2, 3, 5, generator=g, requires_grad=True)
    y = torch.tensor([[0, 1, 2], [3, 4, 0]])
    ls, lt = token_logprobs(zs, y), token_logprobs(zt, y)
    delta = token_delta(lt, ls)
    assert torch.allclose(delta, lt - ls)
    delta.sum().backward()
    assert zs.grad is None or torch.all(zs.grad == 0)
    assert zt.grad is not None and zt.grad.abs().sum() > 0
    with pytest.raises(ValueError, match=r"must have the same \(N, T\) shape, got \(2, 3\) and \(2, 2\)"):
        token_delta(lt, ls[:, :2])


def test_outcome_weighted_delta_hand_value():
    # delta = [[1,2],[3,4],[5,6]], mask = [[1,1],[1,0],[1,1]], r = [1, .5, 0]
    # weights: seq0 1*2 tokens = 2, seq1 .5*1 = .5, seq2 0 -> sum 2.5
    # numerator: 1*(1+2) + .5*3 + 0 = 4.5 -> Δ = 4.5/2.5 = 1.8
    delta = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    r = torch.tensor([1.0, 0.5, 0.0])
    d, wsum = outcome_weighted_delta(delta, mask, r)
    assert wsum == pytest.approx(2.5)
    assert d.item() == pytest.approx(1.8, abs=1e-6)
    d.backward()
    # dΔ/dδ = r_n mask / 2.5
    expected_grad = torch.tensor([[0.4, 0.4], [0.2, 0.0], [0.0, 0.0]])
    assert torch.allclose(delta.grad, expected_grad, atol=1e-7)


def test_outcome_weighted_delta_zero_reward_sequence_has_no_weight():
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    r = torch.tensor([1.0, 0.5, 0.0])
    d1, _ = outcome_weighted_delta(torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), mask, r)
    d2, _ = outcome_weighted_delta(
        torch.tensor([[1.0, 2.0], [3.0, 4.0], [-100.0, float("inf")]]), mask, r
    )
    assert d1.item() == d2.item() == pytest.approx(1.8, abs=1e-6)


def test_outcome_weighted_delta_all_zero_rewards():
    delta = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    d, wsum = outcome_weighted_delta(delta, torch.ones(2, 2), torch.zeros(2))
    assert wsum == 0.0
    assert d.item() == 0.0
    assert d.requires_grad
    d.backward()
    assert torch.all(delta.grad == 0)


def test_outcome_weighted_delta_validation():
    """Bad shapes and rewards outside [0, 1] are refused by our checks (their messages), not by a
    broadcasting error in torch."""
    with pytest.raises(ValueError, match=r"rewards must have shape \(N,\) = \(2,\), got \(3,\)"):
        outcome_weighted_delta(torch.zeros(2, 2), torch.ones(2, 2), torch.zeros(3))
    with pytest.raises(ValueError, match=r"mask must have shape \(2, 2\) .* got \(2, 3\)"):
        outcome_weighted_delta(torch.zeros(2, 2), torch.ones(2, 3), torch.zeros(2))
    with pytest.raises(ValueError, match=r"rewards must be finite and lie in \[0, 1\]"):
        outcome_weighted_delta(torch.zeros(2, 2), torch.ones(2, 2), torch.tensor([0.5, 1.5]))


def test_margin_sat_frac_hand():
    # supervised δ: 0.1 (no), 0.5 (= m, yes), 0.5 (yes), -1 (no), 2 (yes) -> 3/5; 0.7 masked
    delta = torch.tensor([[0.1, 0.5, 0.7], [0.5, -1.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    assert margin_sat_frac(delta, mask, 0.5) == pytest.approx(0.6)
    assert math.isnan(margin_sat_frac(delta, torch.zeros(2, 3), 0.5))


def test_margin_penalty():
    # β(m − Δ) = 2 * (0.5 − 0.2) = 0.6; d/dΔ = −β = −2
    d = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
    p = margin_penalty(2.0, 0.5, d)
    assert p.item() == pytest.approx(0.6, abs=1e-12)
    p.backward()
    assert d.grad.item() == pytest.approx(-2.0)
    with pytest.raises(ValueError, match=r"delta_phi must be a scalar \(0-dim\) tensor, got \(2,\)"):
        margin_penalty(1.0, 0.5, torch.zeros(2))


# ===================================================================== dual update


def test_dual_update_rises_when_violated():
    # Δ = 0.4 < m = 1: β = 0 + 0.5 * (1 − 0.4) = 0.3, then 0.3 + 0.3 = 0.6
    b = dual_update(0.0, 1.0, 0.4, 0.5)
    assert b == pytest.approx(0.3)
    assert dual_update(b, 1.0, 0.4, 0.5) == pytest.approx(0.6)


def test_dual_update_falls_to_exactly_zero_and_stays():
    # Δ = 0.3 > m = 0.1, η = 0.5: each step β −= 0.1 -> 0 after ~10 steps
    beta, history = 1.0, []
    for _ in range(50):
        beta = dual_update(beta, 0.1, 0.3, 0.5)
        history.append(beta)
    assert history[0] == pytest.approx(0.9)
    assert all(b >= 0.0 for b in history)
    assert all(a >= b for a, b in zip(history, history[1:]))
    assert history[-1] == 0.0
    first_zero = history.index(0.0)
    assert first_zero <= 11
    assert all(b == 0.0 for b in history[first_zero:])


def test_dual_update_eta_zero_and_validation():
    assert dual_update(0.7, 0.1, 5.0, 0.0) == 0.7
    assert dual_update(0.7, 5.0, 0.1, 0.0) == 0.7
    with pytest.raises(ValueError, match="eta must be >= 0, got -0.1"):
        dual_update(1.0, 0.1, 0.3, -0.1)
    with pytest.raises(ValueError, match="delta_phi must be finite, got nan"):
        dual_update(1.0, 0.1, float("nan"), 0.1)
    # tensor Δ accepted
    assert dual_update(0.0, 1.0, torch.tensor(0.4), 0.5) == pytest.approx(0.3)


# ===================================================================== anchor


def test_anchor_loss_hand_and_grad():
    # vectors: [1,2,3]-[1,0,1] = [0,2,2] -> 8 ; [0,0,0]-[1,1,1] = [-1,-1,-1] -> 3
    # mean = 5.5, λ = 0.1 -> 0.55 ; grad = λ * 2 * diff / 2 vectors = 0.1 * diff
    c = torch.tensor([[[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]], requires_grad=True)
    c0 = torch.tensor([[[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]]], requires_grad=True)
    loss = anchor_loss(c, c0, 0.1)
    assert loss.item() == pytest.approx(0.55, abs=1e-6)
    loss.backward()
    assert c0.grad is None
    expected = 0.1 * torch.tensor([[[0.0, 2.0, 2.0], [-1.0, -1.0, -1.0]]])
    assert torch.allclose(c.grad, expected, atol=1e-7)
    with pytest.raises(ValueError, match=r"c_phi and c_phi0 must have the same \(\.\.\., H\) shape"):
        anchor_loss(c, c0[..., :2], 0.1)


# ===================================================================== GRPO


def test_grpo_advantages_hand():
    # group [1,0,0,1]: mean .5, population std .5 -> ±.5/(.5+1e-4)
    # group [0,1,2,...]: use [0,1,2,1]: mean 1, var (1+0+1+0)/4 = .5, std sqrt(.5)
    # group [.3,.3,.3,.3]: identical -> exactly 0
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 2.0, 1.0], [0.3, 0.3, 0.3, 0.3]])
    adv = grpo_advantages(r)
    a = 0.5 / (0.5 + 1e-4)
    assert adv[0].tolist() == pytest.approx([a, -a, -a, a], abs=1e-6)
    s = math.sqrt(0.5) + 1e-4
    assert adv[1].tolist() == pytest.approx([-1 / s, 0.0, 1 / s, 0.0], abs=1e-6)
    assert torch.all(adv[2] == 0)
    with pytest.raises(ValueError, match=r"rewards must have shape \(n_groups, G\), got \(4,\)"):
        grpo_advantages(torch.zeros(4))


def test_policy_gradient_loss_hand_value():
    # ratio = 1: loss = −Σ mask A / Σ mask; A = [1, −1, 2], mask [[1,1],[1,0],[0,1]]
    # = −(1 + 1 − 1 + 2) / 4 = −0.75 ; dloss/dlogp = −mask A / 4
    lp = torch.tensor([[-0.5, -1.0], [-2.0, -0.1], [-0.3, -0.7]], requires_grad=True)
    A = torch.tensor([1.0, -1.0, 2.0])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    loss = policy_gradient_loss(lp, A, mask)
    assert loss.item() == pytest.approx(-0.75, abs=1e-7)
    loss.backward()
    expected = torch.tensor([[-0.25, -0.25], [0.25, 0.0], [0.0, -0.5]])
    assert torch.allclose(lp.grad, expected, atol=1e-7)


def test_zero_variance_group_gives_zero_gradient():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    adv = grpo_advantages(r).reshape(-1)  # (8,)
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(8, 3, 6, generator=g, requires_grad=True)
    y = torch.randint(0, 6, (8, 3), generator=g)
    loss = policy_gradient_loss(token_logprobs(logits, y), adv, torch.ones(8, 3))
    loss.backward()
    assert torch.all(logits.grad[4:] == 0)  # zero-variance group
    assert logits.grad[:4].abs().sum() > 0


# ===================================================================== SFT


def test_sft_loss_hand():
    # logp [[ln .5, ln .25], [ln .1, ln .9]], mask [[1,1],[1,0]]
    # unweighted: (ln 2 + ln 4 + ln 10) / 3
    # weights [1, .5]: (ln 2 + ln 4 + .5 ln 10) / 2.5
    lp = torch.log(torch.tensor([[0.5, 0.25], [0.1, 0.9]], dtype=torch.float64))
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    assert sft_loss(lp, mask).item() == pytest.approx((ln(2) + ln(4) + ln(10)) / 3, abs=1e-12)
    w = torch.tensor([1.0, 0.5])
    assert sft_loss(lp, mask, w).item() == pytest.approx(
        (ln(2) + ln(4) + 0.5 * ln(10)) / 2.5, abs=1e-12
    )
    assert sft_loss(lp, torch.zeros(2, 2)).item() == 0.0
    with pytest.raises(ValueError, match=r"weights must be a tensor of shape \(N,\) = \(2,\), got \(3,\)"):
        sft_loss(lp, mask, torch.ones(3))


def test_ramp_beta_by_hand():
    """β_t = β_0 + r·t: β_0 = 0.5, r = 0.25 → 0.5, 0.75, 1.5 at t = 0, 1, 4; bad input is refused."""
    from lopd.training.objectives import ramp_beta

    assert [ramp_beta(0.5, 0.25, t) for t in (0, 1, 4)] == [0.5, 0.75, 1.5]
    with pytest.raises(ValueError, match="rate must be >= 0"):
        ramp_beta(0.0, -0.1, 1)
    with pytest.raises(ValueError, match="step must be an int >= 0"):
        ramp_beta(0.0, 0.1, -1)
    with pytest.raises(ValueError, match="step must be an int >= 0"):
        ramp_beta(0.0, 0.1, 1.5)
