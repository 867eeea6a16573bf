"""Composer cold start and the privilege probe.

Cold start (composer SFT): for a successful train-split trajectory ``τ`` of task ``x``,
retrieve ``n_ret`` *other* successes (never ``x`` itself), compose ``c_φ``, and maximise the
frozen teacher's log-likelihood of ``τ``'s policy tokens given ``c_φ``:

    min_φ  − Σ_t mask_t · log π_T(τ_t | τ_<t, c_φ) / Σ_t mask_t

``K`` and ``n_ret`` are drawn per batch (``K`` from the search's choices, ``n_ret`` from
``1..n_ret_max``) so that φ0 serves every configuration the search may pick.

Privilege probe: on successful validation trajectories, the mean token margin
``δ = log π_T(y|s, c) − log π_S(y|s)`` of the cold-started teacher with ``relevant`` vs
``shuffled`` vs ``none`` context (student = the base policy). It tests the premise that a
useful context exists at all.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from lopd.bank import ExperienceBank
from lopd.model.composer import Composer
from lopd.training.objectives import sft_loss, token_logprobs
from lopd.rollout import pad_sequences


def cold_start(bb, bank: ExperienceBank, task_emb: dict, *, steps: int, batch_size: int, lr: float, k_choices: list[int],
               n_ret_max: int, k_max: int, seed: int, on_step=None) -> tuple[Composer, list[float]]:
    from lopd.envs.base import Task

    torch.manual_seed(seed)
    rng = random.Random(seed)
    comp = Composer(bb, k_max)
    phi = comp.phi_params()
    for p in phi:
        p.requires_grad_(True)
    for p in bb.adapter_params("student"):
        p.requires_grad_(False)
    opt = torch.optim.AdamW(phi, lr=lr, weight_decay=0.0)
    n_ret_cap = min(n_ret_max, max(1, len(bank) - 1))
    losses = []
    bb.model.train()
    for step in range(steps):
        K = rng.choice(k_choices)
        n_ret = rng.randint(1, n_ret_cap)
        batch = [bank.entries[i] for i in rng.sample(range(len(bank)), min(batch_size, len(bank)))]
        exps, seqs, masks = [], [], []
        for e in batch:
            task = Task(e.task_id, e.domain, e.family, e.prompt)
            idx = bank.nearest(e.task_id, task_emb[e.task_id], n_ret)
            exps.append([bb.fmt.experience_ids(bank.entries[j].messages) for j in idx])
            ids, gm = bb.fmt.encode_messages(e.messages)
            seqs.append(ids)
            masks.append(gm)
        ids, attn = pad_sequences(seqs, bb.fmt.pad_id, bb.device)
        gm, _ = pad_sequences(masks, 0, bb.device)
        c_phi = comp(exps, K)
        logits = bb.teacher_logits(c_phi, torch.ones(c_phi.shape[:2], dtype=torch.long, device=bb.device), ids, attn)
        loss = sft_loss(token_logprobs(logits[:, :-1], ids[:, 1:]), gm[:, 1:].float())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(phi, 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
    for p in bb.adapter_params("student"):
        p.requires_grad_(True)
    bb.model.eval()
    return comp, losses


@torch.no_grad()
def privilege_probe(bb, comp: Composer, bank: ExperienceBank, rollouts, val_emb: dict, *, K: int, n_ret: int,
                    seeds: list[int]) -> dict:
    """Mean δ over policy tokens of successful val rollouts, per bank mode and seed."""
    from lopd.training.objectives import outcome_weighted_delta, token_delta
    from lopd.rollout import collate

    succ = [r for r in rollouts if r.reward >= 1.0]
    out: dict = {"n_trajectories": len(succ), "K": K, "n_ret": n_ret, "by_mode": {}}
    if not succ:
        return out
    ids, attn, mask = collate(succ, bb.fmt.pad_id, bb.device)
    targets = ids[:, 1:]
    s_logits = bb.logits(ids, attn, "student")[:, :-1]
    s_tok = token_logprobs(s_logits, targets)
    rewards = torch.ones(len(succ))
    for mode in ("relevant", "shuffled", "none"):
        vals = []
        for seed in seeds if mode == "shuffled" else seeds[:1]:
            if mode == "none":
                t_logits = bb.teacher_logits(None, None, ids, attn)[:, :-1]
            else:
                exps = [[bb.fmt.experience_ids(e.messages)
                         for e in bank.retrieve(r.task, val_emb[r.task.task_id], n_ret, mode, seed=seed)] for r in succ]
                c = comp(exps, K)
                t_logits = bb.teacher_logits(c, torch.ones(c.shape[:2], dtype=torch.long), ids, attn)[:, :-1]
            d, _ = outcome_weighted_delta(token_delta(token_logprobs(t_logits, targets), s_tok), mask, rewards)
            vals.append(float(d))
        out["by_mode"][mode] = {"mean_delta": float(np.mean(vals)), "per_seed": vals}
    return out
