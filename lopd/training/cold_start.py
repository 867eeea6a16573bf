"""Composer cold start (φ0) and the privilege probe (the premise gate).

**Cold start.** For a successful train-split trajectory ``τ`` of task ``x``, retrieve ``n_ret``
*other* successes ``e_1..e_n`` (never ``x`` itself), compose ``c_φ`` from them, and minimise

    L(φ) = NLL + w · KL

    NLL = − Σ_t m_t log π_T(τ_t | τ_<t, c_φ) / Σ_t m_t
    KL  = Σ_t m_t KL( π_T^text(·| τ_<t) ‖ π_T^latent(·| τ_<t, c_φ) ) / Σ_t m_t

over the policy tokens of ``τ`` (``m_t = 1`` where the policy generated the token). ``π_T^text``
is the frozen base model reading the raw text of ``e_1..e_n`` before ``τ`` — exactly the
``opsd_text`` teacher — so the second term distils what the text teacher reads from the
retrieved trajectories into the latents (``w = cold_start.distill_weight``). The KL is the
*forward* direction from the text teacher (mass-covering: the latent teacher must put mass
wherever the text teacher does), on the text teacher's top-M support plus one tail bucket
(``cold_start.distill_top_m``), computed by :func:`lopd.training.objectives.reverse_kl_topm_tail` with the
text teacher in the first slot. ``K`` and ``n_ret`` are drawn per batch (``K`` from the search's
choices, ``n_ret`` from ``1..n_ret_max``) so that φ0 serves every configuration the search may
pick. The composer starts as a near no-op (zero latents, :mod:`lopd.model.composer`).

**Privilege probe.** :func:`privilege_probe` measures the teacher under every context condition
as a policy (rollout reward) and as a scorer of the student's own rollouts (δ), and applies the
pre-registered rule of :mod:`lopd.analysis.probe`.
"""

from __future__ import annotations

import random

import torch

from lopd.bank import ExperienceBank
from lopd.errors import RunFailed
from lopd.model.composer import Composer
from lopd.model.prefix_policy import PrefixedPolicy
from lopd.training.objectives import KLResult, reverse_kl_topm_tail, sft_loss, token_delta, token_logprobs
from lopd.engine.rollout import collate, rollout_batch
from lopd.model.chat import pad_sequences


def text_context(bb, experiences: list[list[list[int]]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Embedded text context (left-padded) and its mask: per task, the retrieved experiences'
    token ids each preceded by the experience header — the ``opsd_text`` teacher's context."""
    ctx = [bb.fmt.join_context(exps) for exps in experiences]
    ids, mask = pad_sequences(ctx, bb.fmt.pad_id, bb.device, left=True)
    with torch.no_grad():
        return bb.embed(ids), mask


def distill_kl(text_logp: torch.Tensor, latent_logp: torch.Tensor, mask: torch.Tensor, top_m: int) -> KLResult:
    """``KL(π_T^text ‖ π_T^latent)`` per token on the text teacher's top-M + tail, token mean over
    ``mask``. :func:`reverse_kl_topm_tail` computes ``KL(first ‖ second)`` with the support taken
    from the first argument when ``support="student"``; the text side is a fixed target (detached)."""
    return reverse_kl_topm_tail(text_logp.detach(), latent_logp, mask, top_m=top_m, support="student")


class _Encoded:
    """What the steps keep re-deriving from the same bank entries, computed once per cold start: each
    entry's token ids as an experience (what the composer encodes) and as a trajectory (ids and
    policy-token mask), and each (entry, n_ret)'s nearest neighbours (the same list the bank returns)."""

    def __init__(self, bb, bank: ExperienceBank, task_emb: dict):
        self.fmt, self.bank, self.task_emb = bb.fmt, bank, task_emb
        self._exp: dict[int, list[int]] = {}
        self._traj: dict[int, tuple[list[int], list[int]]] = {}
        self._near: dict[tuple[int, int], list[int]] = {}

    def nearest(self, i: int, n_ret: int) -> list[int]:
        if (i, n_ret) not in self._near:
            e = self.bank.entries[i]
            self._near[i, n_ret] = self.bank.nearest(e.task_id, self.task_emb[e.task_id], n_ret)
        return self._near[i, n_ret]

    def experience(self, j: int) -> list[int]:
        if j not in self._exp:
            self._exp[j] = self.fmt.experience_ids(self.bank.entries[j].messages)
        return self._exp[j]

    def trajectory(self, i: int) -> tuple[list[int], list[int]]:
        if i not in self._traj:
            self._traj[i] = self.fmt.encode_messages(self.bank.entries[i].messages)
        return self._traj[i]


def _batch(bb, picks: list[int], n_ret: int, enc: _Encoded):
    """Retrieved experience ids per picked entry (indices into the bank), and the entries' padded ids,
    attention and policy-token mask."""
    exps, seqs, masks = [], [], []
    for i in picks:
        exps.append([enc.experience(j) for j in enc.nearest(i, n_ret)])
        ids, gm = enc.trajectory(i)
        seqs.append(ids)
        masks.append(gm)
    ids, attn = pad_sequences(seqs, bb.fmt.pad_id, bb.device)
    gm, _ = pad_sequences(masks, 0, bb.device)
    return exps, ids, attn, gm[:, 1:].float()


def cold_start_losses(bb, comp: Composer, exps, ids, attn, mask, *, K: int, distill_weight: float,
                      top_m: int) -> tuple[torch.Tensor, dict]:
    """The cold-start objective of one batch (module docstring) and its parts."""
    c_phi = comp(exps, K)
    ones = torch.ones(c_phi.shape[:2], dtype=torch.long, device=c_phi.device)
    latent_logits = bb.teacher_logits(c_phi, ones, ids, attn)[:, :-1].float()
    nll = sft_loss(token_logprobs(latent_logits, ids[:, 1:]), mask)
    row = {"nll": float(nll.detach())}
    loss = nll
    if distill_weight > 0:
        with torch.no_grad():
            prefix, pmask = text_context(bb, exps)
            text_logits = bb.teacher_logits(prefix, pmask, ids, attn, latent_prefix=False)[:, :-1].float()
        kl = distill_kl(torch.log_softmax(text_logits, -1), torch.log_softmax(latent_logits, -1), mask, top_m)
        loss = loss + distill_weight * kl.loss
        row["distill_kl"] = float(kl.loss.detach())
    row["loss"] = float(loss.detach())
    return loss, row


def cold_start(bb, bank: ExperienceBank, task_emb: dict, cp, *, k_choices: list[int],
               on_step=None, seed: int | None = None) -> tuple[Composer, list[dict]]:
    """Train φ0 (``cp`` = the ``cold_start`` params section) from ``seed`` (default ``cp.seed``); returns the
    composer and one row per step."""
    seed = cp.seed if seed is None else seed
    torch.manual_seed(seed)
    rng = random.Random(seed)
    comp = Composer(bb, cp.k_max, gate_init=cp.gate_init)
    phi = comp.phi_params()
    for p in phi:
        p.requires_grad_(True)
    for p in bb.adapter_params("student"):
        p.requires_grad_(False)
    opt = torch.optim.AdamW(phi, lr=cp.lr, weight_decay=0.0)
    n_ret_cap = min(cp.n_ret_max, max(1, len(bank) - 1))
    rows = []
    enc = _Encoded(bb, bank, task_emb)
    bb.model.train()
    for step in range(cp.steps):
        K = rng.choice(k_choices)
        n_ret = rng.randint(1, n_ret_cap)
        picks = rng.sample(range(len(bank)), min(cp.batch_size, len(bank)))
        exps, ids, attn, mask = _batch(bb, picks, n_ret, enc)
        loss, row = cold_start_losses(bb, comp, exps, ids, attn, mask, K=K, distill_weight=cp.distill_weight,
                                      top_m=cp.distill_top_m)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(phi, 1.0)
        if not torch.isfinite(grad_norm):  # clipping a non-finite norm would write NaN into φ0
            raise RunFailed(f"non-finite composer gradient at cold-start step {step + 1} (loss {row['loss']:.4g}); "
                            f"with cold_start.gate_init = {cp.gate_init:g} a deep model's zero latent prefix "
                            "overflows the gradient through its RMSNorms (lopd.model.composer): set gate_init > 0")
        opt.step()
        rows.append(row)
        if on_step is not None:
            on_step(step, row)
    for p in bb.adapter_params("student"):
        p.requires_grad_(True)
    bb.model.eval()
    return comp, rows


# ---------------------------------------------------------------------------- privilege probe
def condition_prefix(bb, comp: Composer, bank: ExperienceBank, task_emb: dict, tasks, cond: str, *, K: int,
                     n_ret: int, seed: int):
    """(prefix, prefix_mask, latent) of the teacher for ``tasks`` under probe condition ``cond``
    (``relevant``/``shuffled``/``unrelated`` latents, ``text`` = relevant trajectories as text, ``none``)."""
    if cond == "none":
        return None, None, True
    mode = "relevant" if cond == "text" else cond
    exps = [[bb.fmt.experience_ids(e.messages) for e in bank.retrieve(t, task_emb[t.task_id], n_ret, mode, seed=seed)]
            for t in tasks]
    if cond == "text":
        prefix, mask = text_context(bb, exps)
        return prefix, mask, False
    c = comp(exps, K)
    return c, torch.ones(c.shape[:2], dtype=torch.long, device=c.device), True


def _masked_sums(delta: torch.Tensor, mask: torch.Tensor) -> tuple[list[float], list[float]]:
    used = mask > 0
    return torch.where(used, delta, delta.new_zeros(())).sum(-1).tolist(), used.float().sum(-1).tolist()


@torch.no_grad()
def probe_batch(bb, comp, bank, envs, task_emb, tasks, *, K, n_ret, sample: int, seed: int, rollout_kw: dict,
                rewards: dict, deltas: dict) -> None:
    """One batch of one sample index: every condition rolled out with the same sampling seeds
    (row seed = ``sample_seed(seed, task, sample)``: common random numbers), and every teacher's δ
    on the student's rollouts; appends rows to ``rewards`` and ``deltas``."""
    from lopd.engine.evaluation import sample_seed

    seeds = [sample_seed(seed, t.task_id, sample) for t in tasks]
    bb.model.eval()
    bb.mode("student")
    stud = rollout_batch(bb.model, bb.fmt, envs, tasks, seeds=seeds, **rollout_kw)
    rewards["student"] += [(r.task.task_id, r.reward) for r in stud]
    ids, attn, gm = collate(stud, bb.fmt.pad_id, bb.device)
    s_tok = token_logprobs(bb.logits(ids, attn, "student")[:, :-1], ids[:, 1:])
    for cond in deltas:
        prefix, pmask, latent = condition_prefix(bb, comp, bank, task_emb, tasks, cond, K=K, n_ret=n_ret, seed=sample)
        policy = PrefixedPolicy(bb.model, prefix, pmask, latent=latent, prepare=lambda: bb.mode("teacher"))
        rolls = rollout_batch(policy, bb.fmt, envs, tasks, seeds=seeds, **rollout_kw)
        rewards[cond] += [(r.task.task_id, r.reward) for r in rolls]
        t_tok = token_logprobs(bb.teacher_logits(prefix, pmask, ids, attn, latent_prefix=latent)[:, :-1], ids[:, 1:])
        dsum, n = _masked_sums(token_delta(t_tok, s_tok), gm)
        deltas[cond] += [(r.task.task_id, r.reward, d, c) for r, d, c in zip(stud, dsum, n)]


def privilege_probe(bb, comp: Composer, bank: ExperienceBank, tasks, envs, task_emb: dict, *, K: int, n_ret: int,
                    pp, ev, max_len: int, progress=None) -> dict:
    """The premise gate on ``tasks`` (val): reward and δ per condition with intervals, and
    ``premise_holds`` by the rule of :mod:`lopd.analysis.probe` (``pp`` = the ``probe`` params section,
    ``ev`` = the ``evaluate`` section: sampling temperature, turn length, batch size)."""
    from lopd.analysis.probe import (CONDITIONS, DELTA_PAIRS, REWARD_PAIRS, TEACHERS, compare, per_task_delta,
                              per_task_reward, premise_rule)

    rollout_kw = dict(max_new_tokens=ev.max_new_tokens, max_len=max_len, greedy=ev.greedy, temperature=ev.temperature)
    rewards: dict = {c: [] for c in CONDITIONS}
    deltas: dict = {c: [] for c in TEACHERS}
    for s in range(pp.samples_per_task):
        for b0 in range(0, len(tasks), ev.batch_size):
            probe_batch(bb, comp, bank, envs, task_emb, tasks[b0:b0 + ev.batch_size], K=K, n_ret=n_ret, sample=s,
                        seed=pp.seed, rollout_kw=rollout_kw, rewards=rewards, deltas=deltas)
            if progress is not None:
                progress()
    reward = compare({c: per_task_reward(v) for c, v in rewards.items()}, REWARD_PAIRS, pp.confidence)
    delta = compare({c: per_task_delta(v) for c, v in deltas.items()}, DELTA_PAIRS, pp.confidence)
    gate = premise_rule(reward, delta, min_margin=pp.min_margin, min_delta=pp.min_delta, confidence=pp.confidence)
    return {"premise_holds": gate["premise_holds"], "rule": gate["rule"], "checks": gate["checks"], "K": K,
            "n_ret": n_ret, "samples_per_task": pp.samples_per_task, "n_tasks": len(tasks), "reward": reward,
            "delta": delta}
