"""Batched multi-turn rollouts: one prefill per turn, a ragged KV cache, vectorised sampling.

A sequence is its prompt, then turns of policy tokens and environment observations. Tokens
that need no decision — the prompt, an observation and the role header after it, the
``<|end|>`` that closes a turn which reached ``max_new_tokens`` — are appended without the
model. Every forward pass feeds each live row its whole pending *chunk* (the prompt; or the
token it just sampled, followed by the observation if that token closed the turn), so a
turn's prefill costs one forward. Chunks are left-padded to a common width; the
:class:`~lopd.engine.kv_cache.RaggedKVCache` keeps every row's keys contiguous at its own length
and gives the model explicit position ids and a 4-D mask, so padding is never attended to.
For Llama-family models the forward is :class:`~lopd.engine.fast_decoder.FastDecoder` (the same
arithmetic as the Hugging Face + peft forward, without its per-call Python overhead), fed
the chunks *packed* instead: only real tokens go through the model (a step where a few rows
prefill an observation would otherwise run every row at that observation's width).
The next token of every row is chosen at once (:func:`lopd.engine.sampling.choose_tokens`):
``argmax`` when greedy, else a Gumbel-max draw keyed by (row seed, position) — a row's draws
do not depend on the other rows of the batch. A finished row (episode over, or ``max_len``
tokens) leaves the batch at once: its cache rows are dropped and, when its reward runs a
sandboxed program, that program is scored in a worker thread while the others decode.

Under greedy decoding the outputs equal the former one-token-per-forward engine's token for
token (``tests/unit/test_rollout_engine.py`` checks it against ``bench/reference_rollout.py``),
except that a finished sequence is never followed by padding.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache

import torch

from lopd.envs.base import Episode, Task
from lopd.envs.sandboxed import SandboxedEpisode
from lopd.engine.fast_decoder import FastDecoder
from lopd.engine.kv_cache import RaggedKVCache, full_sequence_plan
from lopd.compat.transformers import cache_kwarg
from lopd.model.chat import ChatFormat
from lopd.engine.sampling import choose_tokens, seed_states, seeds_from_generator

ENGINES = ("auto", "hf")
SCORING_WORKERS = 4  # episodes scored concurrently (each sandboxed program is its own process)


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


@dataclass(frozen=True)
class RowMembers:
    """A population's rollout batch: each member's adapter (for the role being rolled out) and
    each task row's member (:mod:`lopd.model.members`)."""

    adapters: list[str]
    of_row: list[int]


@dataclass
class _Row:
    """One episode in flight: its tokens so far, how many of them the cache holds (``fed``),
    the forced tokens still to append (``queue``) and the current action's tokens (``cur``)."""

    task: Task
    episode: Episode
    seed: int
    seq: list[int] = field(default_factory=list)
    gmask: list[int] = field(default_factory=list)
    msgs: list[tuple[str, str]] = field(default_factory=list)
    queue: list[int] = field(default_factory=list)
    cur: list[int] = field(default_factory=list)
    fed: int = 0
    n_gen: int = 0
    done: bool = False


def _emit(row: _Row, tok: int, sampled: bool, fmt: ChatFormat, obs_ids) -> None:
    """Append a token the policy decided (``sampled``) or a forced turn end; when it closes the
    turn, send the action to the environment and queue its observation (``obs_ids(text)``)."""
    row.seq.append(tok)
    row.gmask.append(1 if sampled else 0)
    row.n_gen += 1
    if tok != fmt.end_id:
        row.cur.append(tok)
        return
    action = fmt.decode(row.cur)
    row.cur = []
    row.msgs.append(("assistant", action))
    res = row.episode.step(action)
    if res.done:
        row.done = True
        return
    obs = res.observation if res.observation is not None else ""
    row.msgs.append(("obs", obs))
    row.queue += obs_ids(obs)


@contextmanager
def _intra_op_threads(model, n: int | None):
    if n is None or next(model.parameters()).device.type != "cpu" or n == torch.get_num_threads():
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _append_forced(row: _Row, fmt: ChatFormat, obs_ids, max_len: int, max_new_tokens: int) -> bool:
    """Append every token that needs no model decision; True if the row now waits for one,
    False if it is finished (episode over, or ``max_len`` tokens)."""
    while len(row.seq) < max_len and not row.done:
        if row.queue:
            k = min(len(row.queue), max_len - len(row.seq))
            row.seq += row.queue[:k]
            row.gmask += [0] * k
            del row.queue[:k]
        elif len(row.cur) >= max_new_tokens:
            _emit(row, fmt.end_id, False, fmt, obs_ids)  # the turn ran out of tokens: closed, not the policy's choice
        else:
            return True
    return False


def _forward(model, chunks: list[list[int]], cache: RaggedKVCache | None, pad_id: int, device, cache_kw: str,
             fast: FastDecoder | None, member_of_chunk: list[int] | None = None) -> torch.Tensor:
    """Logits (B, V) at the last token of each row's chunk: packed without padding for the lean
    forward (each token routed through its row's member, ``member_of_chunk``, where the decoder
    routes members), else left-padded into one batch for the Hugging Face forward."""
    if fast is not None:
        plan = cache.packed([len(c) for c in chunks], fast.kv_heads)
        ids = torch.tensor([t for c in chunks for t in c], dtype=torch.long, device=device)
        tok_member = None
        if member_of_chunk is not None:
            tok_member = torch.tensor([mb for mb, c in zip(member_of_chunk, chunks) for _ in c], dtype=torch.long,
                                      device=device)
        logits = fast.packed(ids, plan, cache, tok_member)
        cache.commit()
        return logits.float()
    width = max(len(c) for c in chunks)
    ids = torch.tensor([[pad_id] * (width - len(c)) + c for c in chunks], dtype=torch.long, device=device)
    n_new = torch.tensor([len(c) for c in chunks], dtype=torch.long, device=device)
    pos, mask = cache.plan(n_new, width) if cache is not None else full_sequence_plan(n_new, width)
    kw = {cache_kw: cache} if cache is not None else {}
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=cache is not None,
                   logits_to_keep=1, **kw).logits[:, -1, :]
    if cache is not None:
        cache.commit()
    return logits.float()


@torch.inference_mode()
def rollout_batch(model, fmt: ChatFormat, envs: dict, tasks: list[Task], *, max_new_tokens: int, max_len: int,
                  greedy: bool = False, temperature: float = 1.0, generator: torch.Generator | None = None,
                  use_cache: bool = True, seeds: list[int] | None = None, engine: str = "auto",
                  cpu_threads: int | None = 1, on_rows=None, members: RowMembers | None = None) -> list[Rollout]:
    """Roll the policy ``model`` out on ``tasks`` (one episode each, at most ``max_len`` tokens,
    at most ``max_new_tokens`` policy tokens per turn).

    ``model`` is any Hugging Face causal LM (for a :class:`Backbone` pass ``bb.model`` after
    ``bb.mode('student')``). ``envs`` maps a domain name to its environment. Sampling
    (``greedy=False``) draws row ``i``'s token at position ``p`` from ``softmax(logits / T)``
    with random numbers keyed by ``(seeds[i], p)`` only; without ``seeds`` the row seeds are
    drawn from ``generator``. ``use_cache=False`` recomputes whole sequences every step.
    ``engine``: ``"auto"`` runs the lean :class:`~lopd.engine.fast_decoder.FastDecoder` forward where
    it supports the model, else the Hugging Face forward; ``"hf"`` always the latter.
    ``cpu_threads``: torch's intra-op threads while decoding on a CPU (restored afterwards;
    ``None`` keeps the caller's). One by default: a decoding step is many tiny operations
    that splitting across threads only slows down (every split waits for the slowest
    thread, and on a busy machine that is a whole scheduler time slice), and the other core
    is left to the sandboxed programs being scored meanwhile.
    ``on_rows(rows)``, if given, is called before every forward pass with the indices (into
    ``tasks``) of the rows it runs, in batch order: a population of members
    (:mod:`lopd.model.members`) routes each row through its own member's adapter with it, in the
    Hugging Face forward. ``members`` (with ``on_rows``): the same routing for the lean decoder,
    which reads every member's adapter itself and routes each token (``engine="auto"``; the
    Hugging Face forward with ``on_rows`` where the lean decoder does not support the model).
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown rollout engine {engine!r}; known: {ENGINES}")
    if on_rows is not None and engine != "hf" and members is None:
        raise ValueError("on_rows routes rows through the model's own modules: it needs engine='hf' (the lean "
                         "decoder reads the weights directly) or the rows' members")
    if members is not None and (on_rows is None or len(members.of_row) != len(tasks)):
        raise ValueError("members need on_rows (the fallback's routing) and one member per task")
    if not tasks:
        return []
    if seeds is not None and len(seeds) != len(tasks):
        raise ValueError(f"{len(seeds)} seeds for {len(tasks)} tasks")
    if not greedy and seeds is None:
        seeds = seeds_from_generator(len(tasks), generator)
    prompts = fmt.prompt_ids_many([t.prompt for t in tasks])
    rows = [_Row(task=t, episode=envs[t.domain].episode(t), seed=seeds[i] if seeds else 0,
                 msgs=[("user", t.prompt)], queue=prompts[i]) for i, t in enumerate(tasks)]
    with ThreadPoolExecutor(max_workers=SCORING_WORKERS) as pool, _intra_op_threads(model, cpu_threads):
        scores: dict[int, float | Future] = {}
        _decode(model, fmt, rows, scores, pool, max_new_tokens=max_new_tokens, max_len=max_len, greedy=greedy,
                temperature=temperature, use_cache=use_cache, engine=engine, on_rows=on_rows, members=members)
        rewards = [float(scores[i].result() if isinstance(scores[i], Future) else scores[i]) for i in range(len(rows))]
    return [Rollout(task=r.task, messages=r.msgs, ids=r.seq, gen_mask=r.gmask, reward=rewards[i],
                    n_generated=r.n_gen, finished=r.done) for i, r in enumerate(rows)]


def _decode(model, fmt: ChatFormat, rows: list[_Row], scores: dict, pool: ThreadPoolExecutor, *, max_new_tokens: int,
            max_len: int, greedy: bool, temperature: float, use_cache: bool, engine: str, on_rows=None,
            members: RowMembers | None = None) -> None:
    """Run every row to its end. A finished row is scored at once into ``scores[i]``: in a
    ``pool`` thread when its reward runs a sandboxed program (concurrently with decoding),
    inline otherwise (cheaper than a thread hand-off)."""
    device = next(model.parameters()).device
    obs_ids = lru_cache(maxsize=None)(fmt.obs_ids)  # observations repeat across rows and turns

    def still_running(i: int) -> bool:
        if _append_forced(rows[i], fmt, obs_ids, max_len, max_new_tokens):
            return True
        ep = rows[i].episode
        scores[i] = pool.submit(ep.reward) if isinstance(ep, SandboxedEpisode) else ep.reward()
        return False

    live = [i for i in range(len(rows)) if still_running(i)]
    cache = RaggedKVCache(len(live), max_len, device) if use_cache and live else None
    # each live row's seed hashed once (its draws then absorb only the position): lives with ``live``
    states = seed_states(torch.tensor([rows[i].seed for i in live], dtype=torch.long, device=device))
    cache_kw = cache_kwarg(model)
    fast = FastDecoder.build(model, members and members.adapters) if cache is not None and engine == "auto" else None
    while live:
        chunks = [rows[i].seq[rows[i].fed:] if use_cache else rows[i].seq for i in live]
        if on_rows is not None and fast is None:
            on_rows(live)
        logits = _forward(model, chunks, cache, fmt.pad_id, device, cache_kw, fast,
                          [members.of_row[i] for i in live] if members is not None and fast is not None else None)
        positions = torch.tensor([len(rows[i].seq) for i in live], dtype=torch.long, device=device)
        tokens = choose_tokens(logits, greedy=greedy, temperature=temperature, positions=positions,
                               states=states).tolist()
        keep = []
        for j, (i, tok) in enumerate(zip(live, tokens)):
            rows[i].fed = len(rows[i].seq)
            _emit(rows[i], tok, True, fmt, obs_ids)
            if still_running(i):
                keep.append(j)
        if len(keep) < len(live):
            states = states[torch.tensor(keep, dtype=torch.long, device=device)]
            if cache is not None:
                cache.keep(keep)
        live = [live[j] for j in keep]


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
