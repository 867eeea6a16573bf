"""Tokens per second of our rollout engine against ``transformers`` ``generate()`` with its KV cache,
on the same policy (the LoRA backbone in student mode, as the trainer rolls out), the same prompts
and the same sampling settings (T = 1, no top-k/top-p), on a CPU.

    python bench/engine_vs_hf.py --model tiny    [--batches 16 64] [--new-tokens 16] [--repeats 3]
    python bench/engine_vs_hf.py --model standin [--batches 16 64] [--new-tokens 8]  [--repeats 1]

Models: ``tiny`` = the default pipeline's base model shape (params.yaml ``model``; random weights:
speed does not depend on them), ``standin`` = models/external/qwen3-0.6b-standin (``lopd
make-standin``) with profiles/qwen3-0.6b-standin.yaml's LoRA, fp32. Prompts: the first ``batch``
code tasks of the environment (one turn each) in the chat format. Every row generates until its
turn-end token or ``--new-tokens`` tokens; the environment is a no-op (a turn ends the episode, no
program is run), so only decoding is timed. Timed: ``rollout_batch`` with ``engine="auto"`` (the
lean decoder where it supports the model: fused below ``FUSE_MAX_PARAMS``, map by map above) and
with ``engine="hf"`` (the Hugging Face forward over our ragged cache), and ``model.generate``
(left-padded batch, ``do_sample=True``, ``top_k=0``, ``top_p=1``, the same turn-end token as EOS,
``max_new_tokens``). tokens/s = tokens generated (all rows, up to and including the turn end) /
wall seconds, prefill included; after a warm-up call of each on two rows, the three run interleaved
``--repeats`` times, median reported.
Both use ``--threads`` torch threads (default: ``model.torch_threads`` of params.yaml).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

STANDIN = REPO / "models/external/qwen3-0.6b-standin"


class _OneTurn:
    """An episode that ends at the first action, reward 0: decoding is all that is timed."""

    def step(self, action):
        from lopd.envs.base import StepResult

        return StepResult(observation=None, done=True)

    def reward(self) -> float:
        return 0.0


class _NoOpEnv:
    def episode(self, task):
        return _OneTurn()


def _params(model: str):
    from lopd.config import deep_merge, load_params, parse_params, read_yaml_mapping

    if model == "tiny":
        return load_params(REPO / "params.yaml")
    raw = deep_merge(read_yaml_mapping(REPO / "params.yaml", "params"),
                     read_yaml_mapping(REPO / "profiles/qwen3-0.6b-standin.yaml", "profile"))
    return parse_params(raw, "params.yaml + qwen3-0.6b-standin")


def build_policy(model: str):
    """(backbone in student mode, eval; params) of the requested model, on the CPU in fp32."""
    import torch

    from lopd.model.backbone import Backbone, build_tiny_model, load_causal_lm
    from lopd.model.tokenizer import build_tokenizer, env_vocabulary, load_tokenizer

    p = _params(model)
    if model == "tiny":
        tok = build_tokenizer(env_vocabulary(p.envs.domains, p.envs))
        base = build_tiny_model(p.model, tok, seed=0)
    else:
        if not (STANDIN / "config.json").exists():
            raise SystemExit(f"no stand-in at {STANDIN}: run `lopd make-standin` first")
        tok = load_tokenizer(STANDIN)
        base = load_causal_lm(STANDIN, torch.device("cpu"), torch.float32)
    torch.manual_seed(0)
    bb = Backbone(base, tok, p.model)
    bb.mode("student")
    bb.model.eval()
    return bb, p


def _engine_run(bb, tasks, new_tokens: int, engine: str, seeds: list[int]) -> int:
    from lopd.engine.rollout import rollout_batch

    longest = max(len(bb.fmt.prompt_ids(t.prompt)) for t in tasks)
    rolls = rollout_batch(bb.model, bb.fmt, {"code": _NoOpEnv()}, tasks, max_new_tokens=new_tokens,
                          max_len=longest + new_tokens + 1, temperature=1.0, seeds=seeds, engine=engine,
                          cpu_threads=None)
    return sum(r.n_generated for r in rolls)


def _generate_run(bb, tasks, new_tokens: int, seed: int) -> int:
    import torch

    from lopd.model.chat import pad_sequences

    fmt = bb.fmt
    ids, mask = pad_sequences(fmt.prompt_ids_many([t.prompt for t in tasks]), fmt.pad_id, "cpu", left=True)
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = bb.model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                                top_p=1.0, max_new_tokens=new_tokens, eos_token_id=fmt.end_id,
                                pad_token_id=fmt.pad_id, use_cache=True)
    new = out[:, ids.shape[1]:].tolist()
    # tokens up to and including the row's first turn end (generate pads finished rows after it)
    return sum(row.index(fmt.end_id) + 1 if fmt.end_id in row else len(row) for row in new)


def measure(bb, p, batch: int, new_tokens: int, repeats: int) -> dict:
    from lopd.envs import make_env

    tasks = make_env("code", p.envs).generate(7, batch)
    seeds = list(range(batch))
    def runs_on(ts: list) -> dict:
        return {"engine auto": lambda: _engine_run(bb, ts, new_tokens, "auto", seeds[:len(ts)]),
                "engine hf": lambda: _engine_run(bb, ts, new_tokens, "hf", seeds[:len(ts)]),
                "generate()": lambda: _generate_run(bb, ts, new_tokens, 0)}

    for fn in runs_on(tasks[:2]).values():  # warm-up on two rows: first-call set-up is not decoding
        fn()
    runs = runs_on(tasks)
    rates: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(repeats):
        for k, fn in runs.items():
            t0 = time.perf_counter()
            n = fn()
            rates[k].append(n / (time.perf_counter() - t0))
    return {k: statistics.median(v) for k, v in rates.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("tiny", "standin"), required=True)
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    import torch

    from lopd.engine.fast_decoder import FUSE_MAX_PARAMS, FastDecoder

    bb, p = build_policy(a.model)
    torch.set_num_threads(a.threads or p.model.torch_threads)
    n_params = sum(x.numel() for x in bb.model.parameters())
    dec = FastDecoder.build(bb.model)
    path = "HF forward" if dec is None else ("lean decoder, fused" if dec.fused else "lean decoder, map by map")
    print(f"{a.model}: {n_params / 1e6:.1f}M parameters (LoRA included), fp32, {torch.get_num_threads()} threads; "
          f"engine auto = {path} (FUSE_MAX_PARAMS {FUSE_MAX_PARAMS / 1e6:.0f}M); {a.new_tokens} new tokens, "
          f"median of {a.repeats}")
    for batch in a.batches:
        r = measure(bb, p, batch, a.new_tokens, a.repeats)
        best = max(r["engine auto"], r["engine hf"])
        print(f"  batch {batch:3d}: " + ", ".join(f"{k} {v:8.1f} tok/s" for k, v in r.items())
              + f"; auto/generate {r['engine auto'] / r['generate()']:.2f}, best engine/generate "
                f"{best / r['generate()']:.2f}")


if __name__ == "__main__":
    main()
