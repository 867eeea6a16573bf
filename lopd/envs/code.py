"""Program synthesis: write a one-line Python function ``f`` from a parametrised task.

Task families share their solution structure (only the digits change), so a retrieved
success of the same family shows the shape of the answer. Every word of a prompt or a
solution comes from a small fixed vocabulary: family names, parameter names, the digits
0-9 and a handful of Python tokens, all separated by single spaces (the tokenizer is
word-level); the solution text is run exactly as written (Python accepts the spaces)::

    task scale_shift a 2 b 3   ->  def f ( x ) : return x * 2 + 3
    task wrap a 4 m 7          ->  def f ( x ) : return ( x + 4 ) % 7
    task clamp lo 2 hi 9       ->  def f ( x ) : return max ( 2 , min ( 9 , x ) )
    task parity a 3 b 5        ->  def f ( x ) : return 3 if x % 2 == 0 else 5

One turn: the action is the program. It is run in :mod:`lopd.sandbox` on hidden inputs and
the outputs are compared, in this process, with a pure-Python reference; the reward is 1.0
when every output matches exactly (same type and value) and 0.0 otherwise.
"""

from __future__ import annotations

import random
from typing import Any, Callable

from lopd import sandbox
from lopd.envs.base import Task, task_rng
from lopd.envs.sandboxed import SandboxedEpisode

DIGITS = [str(i) for i in range(10)]
N_INPUTS = 6
INPUT_RANGE = (-5, 15)

# family -> (parameter names in prompt order, solution template, reference, sampler)
_Params = dict[str, int]


def _sample_scale_shift(rng: random.Random) -> _Params:
    return {"a": rng.randint(0, 9), "b": rng.randint(0, 9)}


def _sample_wrap(rng: random.Random) -> _Params:
    return {"a": rng.randint(0, 9), "m": rng.randint(2, 9)}


def _sample_clamp(rng: random.Random) -> _Params:
    lo, hi = sorted(rng.sample(range(10), 2))
    return {"lo": lo, "hi": hi}


def _sample_parity(rng: random.Random) -> _Params:
    a, b = rng.sample(range(10), 2)
    return {"a": a, "b": b}


FAMILIES: dict[str, dict[str, Any]] = {
    "scale_shift": {
        "params": ("a", "b"),
        "template": "def f ( x ) : return x * {a} + {b}",
        "ref": lambda p, x: x * p["a"] + p["b"],
        "sample": _sample_scale_shift,
    },
    "wrap": {
        "params": ("a", "m"),
        "template": "def f ( x ) : return ( x + {a} ) % {m}",
        "ref": lambda p, x: (x + p["a"]) % p["m"],
        "sample": _sample_wrap,
    },
    "clamp": {
        "params": ("lo", "hi"),
        "template": "def f ( x ) : return max ( {lo} , min ( {hi} , x ) )",
        "ref": lambda p, x: max(p["lo"], min(p["hi"], x)),
        "sample": _sample_clamp,
    },
    "parity": {
        "params": ("a", "b"),
        "template": "def f ( x ) : return {a} if x % 2 == 0 else {b}",
        "ref": lambda p, x: p["a"] if x % 2 == 0 else p["b"],
        "sample": _sample_parity,
    },
}

# operator swaps used by the noisy solver (every word stays inside the vocabulary)
_SWAPS = {"*": "+", "+": "-", "%": "//", "max": "min", "min": "max", "==": "!=", "x": "0"}

CODE_WORDS = ["def", "f", "(", "x", ")", ":", "return", "*", "+", "%", "max", ",", "min",
              "if", "==", "else", "-", "//", "!="]


def solution_text(family: str, params: _Params) -> str:
    return FAMILIES[family]["template"].format(**params)


def reference(family: str, params: _Params, x: int) -> int:
    return FAMILIES[family]["ref"](params, x)


def _sample_inputs(rng: random.Random) -> list[int]:
    """6 distinct inputs in -5..15 with at least one negative, one > 9, one even, one odd
    (so every family's branches and clamps are exercised)."""
    lo, hi = INPUT_RANGE
    while True:
        xs = [rng.randint(lo, -1), rng.randint(10, hi)]
        rest = [v for v in range(lo, hi + 1) if v not in xs]
        xs += rng.sample(rest, N_INPUTS - 2)
        if any(v % 2 == 0 for v in xs) and any(v % 2 for v in xs):
            rng.shuffle(xs)
            return xs


def outputs_match(outputs: list | None, expected: list) -> bool:
    """Exact match: same length, and per item the same type and value (``True != 1``)."""
    if not isinstance(outputs, list) or len(outputs) != len(expected):
        return False
    return all(type(o) is type(e) and o == e for o, e in zip(outputs, expected))


def _trusted_passes(text: str, inputs: list[int], expected: list) -> bool:
    """Whether *our own* (noisy-solver) text would pass; it is built from templates and the
    fixed vocabulary, never from a policy, so it may be evaluated in-process."""
    ns: dict[str, Any] = {}
    try:
        exec(compile(text, "<corrupted>", "exec"), {"__builtins__": {"max": max, "min": min}}, ns)
        fn: Callable = ns["f"]
        return outputs_match([fn(x) for x in inputs], expected)
    except Exception:
        return False


def corrupt(text: str, rng: random.Random) -> str:
    """One random corruption: a digit replaced, an operator swapped, or the tail cut off."""
    w = text.split()
    kind = rng.randrange(3)
    if kind == 0:
        idx = [i for i, t in enumerate(w) if t in DIGITS]
        if idx:
            i = rng.choice(idx)
            w[i] = rng.choice([d for d in DIGITS if d != w[i]])
            return " ".join(w)
    if kind <= 1:
        idx = [i for i, t in enumerate(w) if t in _SWAPS and i > 4]  # keep "def f ( x ) :"
        if idx:
            i = rng.choice(idx)
            w[i] = _SWAPS[w[i]]
            return " ".join(w)
    cut = rng.randint(1, max(1, len(w) - 7))
    return " ".join(w[:-cut])


class CodeEpisode(SandboxedEpisode):
    """One program for one task: reward 1 iff every hidden test's output matches (compared
    here, in the parent: expected outputs never enter the sandbox)."""

    def __init__(self, task: Task, timeout_s: float):
        super().__init__(task)
        self.timeout_s = timeout_s

    def score(self, action: str):
        spec = self.task.spec
        res = sandbox.run_calls(action, "f", [[x] for x in spec["inputs"]], timeout_s=self.timeout_s)
        ok = res.status == "ok" and outputs_match(res.outputs, spec["expected"])
        return (1.0 if ok else 0.0), res


class CodeEnv:
    """The code domain: one action (the program), reward 1 iff all hidden tests pass."""

    domain = "code"
    max_turns = 1

    def __init__(self, families: list[str] | None = None, timeout_s: float = 2.0):
        names = families or list(FAMILIES)
        unknown = [n for n in names if n not in FAMILIES]
        if unknown:
            raise ValueError(f"unknown code families {unknown}; known: {sorted(FAMILIES)}")
        self.families = names
        self.timeout_s = timeout_s

    def generate(self, seed: int, n: int) -> list[Task]:
        tasks = []
        for i in range(n):
            rng = task_rng(seed, "code", i)
            family = self.families[i % len(self.families)]
            fam = FAMILIES[family]
            params = fam["sample"](rng)
            inputs = _sample_inputs(rng)
            expected = [reference(family, params, x) for x in inputs]
            prompt = " ".join(["task", family] + [f"{k} {params[k]}" for k in fam["params"]])
            tasks.append(
                Task(
                    task_id=f"code/{family}/{seed}-{i:05d}",
                    domain=self.domain,
                    family=family,
                    prompt=prompt,
                    spec={"family": family, "params": params, "inputs": inputs,
                          "expected": expected, "solution": solution_text(family, params)},
                )
            )
        return tasks

    def episode(self, task: Task) -> CodeEpisode:
        return CodeEpisode(task, self.timeout_s)

    def solve(self, task: Task, rng: random.Random | None = None, noise: float = 0.0) -> list[str]:
        spec = task.spec
        text = solution_text(spec["family"], spec["params"])
        if noise <= 0 or rng is None or rng.random() >= noise:
            return [text]
        bad = text
        for _ in range(20):  # a corruption that happens to be equivalent is retried
            bad = corrupt(text, rng)
            if not _trusted_passes(bad, spec["inputs"], spec["expected"]):
                break
        return [bad]

    def vocabulary(self) -> list[str]:
        words = {"task", *FAMILIES, *DIGITS, *CODE_WORDS, *_SWAPS, *_SWAPS.values()}
        for fam in FAMILIES.values():
            words.update(fam["params"])
        return sorted(words)
