"""The rollout engine before the prefill/ragged-cache rewrite (commit 7b43669), verbatim: the reference
for tests/unit/test_rollout_engine.py's greedy-equivalence test (imported as ``bench.reference_rollout``) and
the former engine that bench/step.py and bench/rollouts.py time against the current one. Do not edit the
function bodies.

It feeds every sequence one position per forward pass from position 0 (prompt and
observation tokens included), keeps feeding padding to finished sequences, and decides each
token of each sequence in Python.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor

import torch

from lopd.envs.base import Task
from lopd.model.chat import ChatFormat
from lopd.engine.rollout import Rollout


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
