"""Batched multi-turn rollouts with the KV cache.

All sequences of a batch advance one position per decoding step. At each position a
sequence either takes a *forced* token (its prompt, an environment observation, a role
header — queued by the environment loop) or a token *sampled* from the policy. Because
every sequence is fed token by token from position 0, there is no padding inside a
sequence and the KV cache stays aligned across the batch; when a policy closes a turn
(``<|end|>`` or ``max_new_tokens`` reached) the action is decoded, sent to the
environment, and its observation is queued. Finished sequences are fed padding that is
masked out afterwards.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from lopd.envs.base import Task
from lopd.model.chat import ChatFormat


@dataclass
class Rollout:
    task: Task
    messages: list[tuple[str, str]]
    ids: list[int]
    gen_mask: list[int]  # 1 where the policy generated the token
    reward: float
    n_generated: int = 0
    finished: bool = True  # False if the length cap cut the episode short
    meta: dict = field(default_factory=dict)


def _cache_kw(model) -> str:
    """transformers >= 5.x renamed ``past_key_values`` to ``cache``; support both."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


@torch.inference_mode()
def rollout_batch(model, fmt: ChatFormat, envs: dict, tasks: list[Task], *, max_new_tokens: int, max_len: int,
                  greedy: bool = False, temperature: float = 1.0, generator: torch.Generator | None = None,
                  use_cache: bool = True) -> list[Rollout]:
    """Roll the policy ``model`` out on ``tasks`` (one episode each).

    ``model`` is any Hugging Face causal LM (for a :class:`Backbone` pass ``bb.model`` after
    ``bb.mode('student')``). ``envs`` maps a domain name to its environment.
    """
    device = next(model.parameters()).device
    B = len(tasks)
    if B == 0:
        return []
    episodes = [envs[t.domain].episode(t) for t in tasks]
    queues = [deque(fmt.prompt_ids(t.prompt)) for t in tasks]
    seqs: list[list[int]] = [[] for _ in range(B)]
    gmask: list[list[int]] = [[] for _ in range(B)]
    msgs: list[list[tuple[str, str]]] = [[("user", t.prompt)] for t in tasks]
    cur: list[list[int]] = [[] for _ in range(B)]
    done = [False] * B
    n_gen = [0] * B
    for i in range(B):
        seqs[i].append(queues[i].popleft())
        gmask[i].append(0)
    past = None
    pad = fmt.pad_id
    cache_kw = _cache_kw(model)
    for _ in range(max_len - 1):
        if all(done):
            break
        if use_cache:
            inp = torch.tensor([[s[-1]] for s in seqs], device=device)
            out = model(input_ids=inp, use_cache=True, **{cache_kw: past})
            past = getattr(out, "cache", None) if cache_kw == "cache" else out.past_key_values
        else:
            inp = torch.tensor(seqs, device=device)
            out = model(input_ids=inp, use_cache=False)
        logits = out.logits[:, -1, :].float()
        if greedy:
            sampled = logits.argmax(-1)
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            sampled = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        sampled = sampled.tolist()
        for i in range(B):
            if done[i]:
                seqs[i].append(pad)
                gmask[i].append(0)
                continue
            if queues[i]:
                seqs[i].append(queues[i].popleft())
                gmask[i].append(0)
                continue
            tok = sampled[i]
            forced_end = len(cur[i]) >= max_new_tokens
            if forced_end:
                tok = fmt.end_id  # the turn ran out of tokens: close it (not the policy's choice)
            seqs[i].append(tok)
            gmask[i].append(0 if forced_end else 1)
            n_gen[i] += 1
            if tok != fmt.end_id:
                cur[i].append(tok)
                continue
            action = fmt.decode(cur[i])
            cur[i] = []
            msgs[i].append(("assistant", action))
            res = episodes[i].step(action)
            if res.done:
                done[i] = True
            else:
                obs = res.observation if res.observation is not None else ""
                msgs[i].append(("obs", obs))
                queues[i].extend(fmt.obs_ids(obs))
    # score every episode; sandboxed programs run concurrently (each is its own process)
    with ThreadPoolExecutor(max_workers=4) as pool:
        rewards = list(pool.map(lambda ep: float(ep.reward()), episodes))
    out_rollouts = []
    for i, t in enumerate(tasks):
        # trim trailing padding (everything after the last real token)
        n = len(seqs[i])
        if done[i]:
            n = len(seqs[i]) - next(j for j, tok in enumerate(reversed(seqs[i])) if tok == fmt.end_id)
        out_rollouts.append(Rollout(task=t, messages=msgs[i], ids=seqs[i][:n], gen_mask=gmask[i][:n],
                                    reward=rewards[i], n_generated=n_gen[i], finished=done[i]))
    return out_rollouts


def collate(rollouts: list[Rollout], pad_id: int, device: torch.device | str = "cpu"):
    """Right-padded ``ids`` (N,T), ``attn`` (N,T) and ``loss_mask`` (N,T-1) aligned with
    the next-token targets ``ids[:, 1:]``."""
    T = max(len(r.ids) for r in rollouts)
    ids = torch.full((len(rollouts), T), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rollouts), T), dtype=torch.long)
    gen = torch.zeros((len(rollouts), T), dtype=torch.float32)
    for i, r in enumerate(rollouts):
        n = len(r.ids)
        ids[i, :n] = torch.tensor(r.ids)
        attn[i, :n] = 1
        gen[i, :n] = torch.tensor(r.gen_mask, dtype=torch.float32)
    return ids.to(device), attn.to(device), gen[:, 1:].to(device)


def pad_sequences(seqs: list[list[int]], pad_id: int, device, left: bool = False):
    """Pad token lists into (ids, mask) tensors, right-padded unless ``left``."""
    L = max((len(s) for s in seqs), default=0)
    ids = torch.full((len(seqs), max(L, 1)), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), max(L, 1)), dtype=torch.long)
    for i, s in enumerate(seqs):
        if not s:
            continue
        if left:
            ids[i, L - len(s):] = torch.tensor(s)
            mask[i, L - len(s):] = 1
        else:
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
    return ids.to(device), mask.to(device)
