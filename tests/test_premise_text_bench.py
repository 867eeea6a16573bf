"""bench/premise_text.py measures the base policy with a text context before each prompt: the
context must reach the rollout engine however the engine tokenises prompts (one by one or
batched), or every condition silently measures no context."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from lopd.engine.rollout import rollout_batch
from tests import tiny_policy as tp

BENCH = Path(__file__).resolve().parents[1] / "bench" / "premise_text.py"


def _bench():
    spec = importlib.util.spec_from_file_location("premise_text_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_context_format_puts_each_context_before_its_prompt():
    bench = _bench()
    model, fmt = tp.random_policy("qwen3")
    model.eval()
    tasks = tp.tasks(2, 1, seed=3)
    ctx = {t.prompt: fmt.words("ok") * (i + 1) for i, t in enumerate(tasks)}
    cfmt = bench.ContextFormat(fmt, ctx)
    assert cfmt.prompt_ids_many([t.prompt for t in tasks]) == [cfmt.prompt_ids(t.prompt) for t in tasks]
    rolls = rollout_batch(model, cfmt, tp.envs(), tasks, max_new_tokens=4, max_len=80, greedy=True)
    for t, r in zip(tasks, rolls):
        want = ctx[t.prompt] + fmt.prompt_ids(t.prompt)
        assert r.ids[: len(want)] == want
    plain = rollout_batch(model, fmt, tp.envs(), tasks, max_new_tokens=4, max_len=80, greedy=True)
    assert [r.ids[: len(fmt.prompt_ids(t.prompt))] for t, r in zip(tasks, plain)] == [
        fmt.prompt_ids(t.prompt) for t in tasks]
