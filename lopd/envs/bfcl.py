"""BFCL (Berkeley Function Calling Leaderboard) as an evaluation-only domain.

Real benchmark data, fetched by :func:`lopd.envs.external.fetch_bfcl` into
``data/external/bfcl/`` (see :func:`lopd.envs.external.bfcl_dir`). Supported categories:
``simple`` (``BFCL_v4_simple_python``: one function documented, one call expected) and
``multiple`` (``BFCL_v4_multiple``: several functions documented, one call to the right one).

One turn. The prompt is the user question and the functions' documentation rendered
compactly as text; the action is one function call in Python syntax with keyword
arguments, e.g. ``get_weather(city="Paris", unit="celsius")`` (a one-element list
``[get_weather(...)]`` — BFCL's own output format — and a Markdown code fence are
accepted too). The call is parsed with :mod:`ast` and its argument values are read with
:func:`ast.literal_eval` (literals only: nothing is ever evaluated or executed).

Reward: :func:`lopd.envs.bfcl_calls.score` (BFCL's AST checker, simplified).
"""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path

from lopd.envs.base import SingleActionEpisode, Task, task_rng
from lopd.envs.bfcl_calls import corrupt_call, score, solution_call
from lopd.errors import BadInput
from lopd.envs.external import BFCL_CATEGORIES, bfcl_dir

ANSWER_FORMAT = ("Answer with exactly one function call in Python syntax, using keyword "
                 "arguments: func_name(param1=value1, param2=value2)")


# --------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------
_CACHE: dict[tuple[str, str], list[dict]] = {}
_CACHE_LOCK = threading.Lock()


def _read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def load_category(category: str, data_dir: str | Path | None = None) -> list[dict]:
    """The items of one category, in file order: ``{"id", "question", "functions", "ground_truth"}``."""
    if category not in BFCL_CATEGORIES:
        raise BadInput(f"unknown BFCL category {category!r}; supported: {sorted(BFCL_CATEGORIES)}")
    root = bfcl_dir(data_dir)
    key = (str(root.resolve()), category)
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
    if hit is not None:
        return hit
    stem = BFCL_CATEGORIES[category]
    questions = _read_jsonl(root / f"{stem}.json")
    answers = {a["id"]: a["ground_truth"] for a in _read_jsonl(root / "possible_answer" / f"{stem}.json")}
    items = []
    for q in questions:
        gt = answers.get(q["id"])
        if gt is None or len(gt) != 1 or len(gt[0]) != 1:
            raise BadInput(f"BFCL item {q['id']} in {root}: expected exactly one possible-answer call")
        items.append({"id": q["id"], "question": q["question"], "functions": q["function"],
                      "ground_truth": gt[0]})
    with _CACHE_LOCK:
        _CACHE[key] = items
    return items


# --------------------------------------------------------------------------------------
# Prompt rendering
# --------------------------------------------------------------------------------------
def _type_str(d: dict) -> str:
    t = str(d.get("type", "any"))
    if t in ("array", "tuple") and isinstance(d.get("items"), dict):
        return f"{t} of {_type_str(d['items'])}"
    if t == "dict" and isinstance(d.get("properties"), dict):
        inner = ", ".join(f"{k}: {_type_str(v)}" for k, v in d["properties"].items())
        return f"dict {{{inner}}}"
    return t


def render_function(f: dict) -> str:
    params = f.get("parameters") or {}
    props = params.get("properties") or {}
    required = set(params.get("required") or [])
    lines = [f"{f['name']}: {str(f.get('description', '')).strip()}"]
    for p, d in props.items():
        bits = [_type_str(d), "required" if p in required else "optional"]
        if "enum" in d:
            bits.append("one of " + ", ".join(repr(v) for v in d["enum"]))
        if "default" in d:
            bits.append(f"default {d['default']!r}")
        desc = str(d.get("description", "")).strip()
        lines.append(f"  {p} ({'; '.join(bits)})" + (f": {desc}" if desc else ""))
    return "\n".join(lines)


def render_question(question: list) -> str:
    msgs = [m for turn in question for m in turn]
    if len(msgs) == 1:
        return str(msgs[0]["content"]).strip()
    return "\n".join(f"{m['role']}: {str(m['content']).strip()}" for m in msgs)


def render_prompt(item: dict) -> str:
    funcs = "\n".join(render_function(f) for f in item["functions"])
    return f"Functions:\n{funcs}\nQuestion: {render_question(item['question'])}\n{ANSWER_FORMAT}"


# --------------------------------------------------------------------------------------
# Env
# --------------------------------------------------------------------------------------
class BFCLEpisode(SingleActionEpisode):
    def __init__(self, task: Task):
        super().__init__(task)
        self._reward: float | None = None
        self.reason = ""

    def reward(self) -> float:
        if self._reward is None:
            if self.action is None:
                self._reward, self.reason = 0.0, "no action"
            else:
                self._reward, self.reason = score(self.action, self.task.spec)
        return self._reward


class BFCLEnv:
    """BFCL ``simple`` / ``multiple`` (python) as one-turn tasks; evaluation only (a fixed
    pool: ``generate`` is a seeded selection, so two seeds may share items)."""

    domain = "bfcl"
    max_turns = 1

    def __init__(self, categories: list[str] | tuple[str, ...] = ("simple",), data_dir: str | Path | None = None):
        cats = list(categories)
        unknown = [c for c in cats if c not in BFCL_CATEGORIES]
        if not cats or unknown:
            raise BadInput(f"unknown BFCL categories {unknown or cats}; supported: {sorted(BFCL_CATEGORIES)}")
        self.categories = cats
        self.data_dir = data_dir

    def items(self) -> list[tuple[str, dict]]:
        return [(c, it) for c in self.categories for it in load_category(c, self.data_dir)]

    def make_task(self, category: str, item: dict) -> Task:
        return Task(
            task_id=f"bfcl/{category}/{item['id']}",
            domain=self.domain,
            family=category,
            prompt=render_prompt(item),
            spec={"category": category, "bfcl_id": item["id"], "functions": item["functions"],
                  "ground_truth": item["ground_truth"]},
        )

    def generate(self, seed: int, n: int) -> list[Task]:
        pool = self.items()
        if n > len(pool):
            raise BadInput(f"asked for {n} BFCL tasks but {'+'.join(self.categories)} has {len(pool)}")
        order = list(range(len(pool)))
        task_rng(seed, "bfcl", *self.categories).shuffle(order)
        return [self.make_task(*pool[i]) for i in order[:n]]

    def episode(self, task: Task) -> BFCLEpisode:
        return BFCLEpisode(task)

    def solve(self, task: Task, rng: random.Random | None = None, noise: float = 0.0) -> list[str]:
        if noise <= 0 or rng is None or rng.random() >= noise:
            return [solution_call(task.spec["ground_truth"])]
        return [corrupt_call(task.spec, rng)]

    def vocabulary(self) -> list[str]:
        return []  # real text: only for real (subword) tokenizers
