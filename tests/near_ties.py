"""Inputs with no near-ties: the precondition of every token-equality test across kernel paths.

Two kernel paths (fused against unfused maps, one batch make-up against another) give logits that
differ by float32 rounding (< 1e-6 here). A greedy token, or a Gumbel-max draw
``argmax(logits / T + g)`` (lopd.engine.sampling), can only flip between them if its winning margin is
that small. A test that asserts token equality first asserts that every choice in its rollouts
won by more than :data:`NEAR_TIE`, so it holds on any x86-64 CPU, not only on the one whose
rounding happened to agree. If a choice is a near-tie, the test says so: pick other inputs.
"""

from __future__ import annotations

import torch

from lopd.engine.sampling import seed_states, uniforms

NEAR_TIE = 1e-4


def min_choice_margin(model, roll, *, seed: int | None = None, temperature: float = 1.0) -> float:
    """The smallest top-1 minus top-2 score over the policy's own tokens of ``roll`` (score = the
    logit when greedy, ``logit / T + g`` with the row's Gumbel noise when ``seed`` is given), from one
    teacher-forced forward over the whole sequence."""
    gen = [i for i, g in enumerate(roll.gen_mask) if g and i > 0]
    if not gen:
        return float("inf")
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([roll.ids]), use_cache=False).logits[0]
        scores = logits[[i - 1 for i in gen]].to(torch.float64)
        if seed is not None:
            states = seed_states(torch.tensor([seed] * len(gen), dtype=torch.long))
            u = uniforms(None, torch.tensor(gen, dtype=torch.long), scores.shape[-1], states=states)
            scores = scores / temperature - (-u.log()).log()
    top2 = scores.topk(2, dim=-1).values
    return (top2[:, 0] - top2[:, 1]).min().item()


def assert_no_near_ties(model, rolls, *, seeds=None, temperature: float = 1.0) -> None:
    """Every choice of every rollout won by more than NEAR_TIE (``seeds``: the rows' sampling seeds)."""
    for k, r in enumerate(rolls):
        gap = min_choice_margin(model, r, seed=None if seeds is None else seeds[k], temperature=temperature)
        assert gap > NEAR_TIE, (f"{r.task.task_id}: a token choice is a near-tie (margin {gap:.1e}); a rounding "
                                "difference between kernel paths could flip it on another CPU: pick other inputs")
