"""Program synthesis: write a one-line Python function ``f`` from a parametrised task.

Each task lives in a *world* (a seeded instance of a task family, see
:func:`lopd.envs.base.make_worlds`) whose hidden conventions are two constants: a *scale* and
an *offset* applied to the family's expression (``( expr ) * scale + offset``). The prompt
names the world and the family's parameters, never the constants; a successful solution in
the same world shows them. Every word of a prompt or a solution comes from a small fixed
vocabulary, separated by single spaces (the tokenizer is word-level); the solution text is
run exactly as written::

    task ke ro scale_shift a 2 b 3   ->  def f ( x ) : return ( x * 2 + 3 ) * 13 + 17
    task ba lo wrap a 4 m 7          ->  def f ( x ) : return ( ( x + 4 ) % 7 ) * 11 + 12
    task ze mu clamp lo 2 hi 9       ->  def f ( x ) : return ( max ( 2 , min ( 9 , x ) ) ) * 11 + 17
    task di fo parity a 3 b 5        ->  def f ( x ) : return ( 3 if x % 2 == 0 else 5 ) * 13 + 12

The hidden inputs always give the expression at least two distinct values, so a wrong scale
or offset always fails (two different lines agree on at most one point). One turn: the action is the
program. It is run in :mod:`lopd.sandbox` on hidden inputs and the outputs are compared, in
this process, with a pure-Python reference; the reward is 1.0 when every output matches
exactly (same type and value) and 0.0 otherwise.
"""

from __future__ import annotations

import random
from typing import Any, Callable

from lopd import sandbox
from lopd.envs.base import (SYLLABLES, Task, WorldConfig, known_families, make_worlds, pool_draws, task_conventions,
                            worlds_summary)
from lopd.envs.sandboxed import SandboxedEpisode

DIGITS = [str(i) for i in range(10)]
N_INPUTS = 6
INPUT_RANGE = (-5, 15)

# family -> (parameter names in prompt order, solution template, reference, sampler)
_Params = dict[str, int]


def _sample_scale_shift(rng: random.Random) -> _Params:
    return {"a": rng.randint(1, 9), "b": rng.randint(0, 9)}  # a >= 1: the expression is never constant


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
        "template": "x * {a} + {b}",
        "ref": lambda p, x: x * p["a"] + p["b"],
        "sample": _sample_scale_shift,
    },
    "wrap": {
        "params": ("a", "m"),
        "template": "( x + {a} ) % {m}",
        "ref": lambda p, x: (x + p["a"]) % p["m"],
        "sample": _sample_wrap,
    },
    "clamp": {
        "params": ("lo", "hi"),
        "template": "max ( {lo} , min ( {hi} , x ) )",
        "ref": lambda p, x: max(p["lo"], min(p["hi"], x)),
        "sample": _sample_clamp,
    },
    "parity": {
        "params": ("a", "b"),
        "template": "{a} if x % 2 == 0 else {b}",
        "ref": lambda p, x: p["a"] if x % 2 == 0 else p["b"],
        "sample": _sample_parity,
    },
}

# the world conventions: ``( expr ) * scale + offset`` (options in order; a world draws each
# from the first ``n_options``); two-digit words, so no prompt (single digits) can contain one
SLOTS = {"scale": ["11", "13", "14", "16"], "offset": ["12", "17", "15", "19"]}

# operator swaps used by the noisy solver (every word stays inside the vocabulary)
_SWAPS = {"*": "+", "+": "-", "%": "//", "max": "min", "min": "max", "==": "!=", "x": "0"}

CODE_WORDS = ["def", "f", "(", "x", ")", ":", "return", "*", "+", "%", "max", ",", "min",
              "if", "==", "else", "-", "//", "!="]


def solution_text(family: str, params: _Params, conv: dict[str, str]) -> str:
    expr = FAMILIES[family]["template"].format(**params)
    return f"def f ( x ) : return ( {expr} ) * {conv['scale']} + {conv['offset']}"


def reference(family: str, params: _Params, x: int, conv: dict[str, str]) -> int:
    return FAMILIES[family]["ref"](params, x) * int(conv["scale"]) + int(conv["offset"])


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

    def __init__(self, families: list[str] | None = None, timeout_s: float = 2.0, worlds: WorldConfig | None = None):
        names = known_families("code", families, FAMILIES)
        self.families = names
        self.timeout_s = timeout_s
        self.world_cfg = worlds or WorldConfig()
        if not 1 <= self.world_cfg.n_options <= len(SLOTS["scale"]):
            raise ValueError(f"n_options must be in 1..{len(SLOTS['scale'])}, got {self.world_cfg.n_options}")
        self.worlds = make_worlds(self.domain, names, lambda f: SLOTS, self.world_cfg)

    def generate(self, seed: int, n: int, pool: str = "target") -> list[Task]:
        """``n`` tasks spread round-robin over the ``pool`` worlds (``target`` or ``pretrain``)."""
        tasks = []
        for i, rng, world in pool_draws(self.worlds, "code", seed, n, pool):
            family = world.family
            fam = FAMILIES[family]
            params = fam["sample"](rng)
            inputs = _sample_inputs(rng)
            while len({fam["ref"](params, x) for x in inputs}) < 2:  # keep wrong constants detectable
                inputs = _sample_inputs(rng)
            conv = task_conventions(world, self.world_cfg, SLOTS, seed, i)
            expected = [reference(family, params, x, conv) for x in inputs]
            prompt = " ".join(["task", world.name, family] + [f"{k} {params[k]}" for k in fam["params"]])
            tag = "" if pool == "target" else "p"
            tasks.append(Task(
                task_id=f"code/{family}/{tag}{seed}-{i:05d}", domain=self.domain, family=family, prompt=prompt,
                spec={"family": family, "params": params, "inputs": inputs, "expected": expected, "conventions": conv,
                      "solution": solution_text(family, params, conv)},
                world=world.name))
        return tasks

    def episode(self, task: Task) -> CodeEpisode:
        return CodeEpisode(task, self.timeout_s)

    def solve(self, task: Task, rng: random.Random | None = None, noise: float = 0.0) -> list[str]:
        spec = task.spec
        text = spec["solution"]
        if noise <= 0 or rng is None or rng.random() >= noise:
            return [text]
        bad = text
        for _ in range(20):  # a corruption that happens to be equivalent is retried
            bad = corrupt(text, rng)
            if not _trusted_passes(bad, spec["inputs"], spec["expected"]):
                break
        return [bad]

    def convention_words(self) -> list[str]:
        """Every scale and offset option: the words that only experience can reveal."""
        return sorted({o for opts in SLOTS.values() for o in opts})

    def worlds_summary(self) -> dict:
        return worlds_summary(self.worlds)

    def vocabulary(self) -> list[str]:
        words = {"task", *FAMILIES, *DIGITS, *CODE_WORDS, *_SWAPS, *_SWAPS.values()}
        words.update(self.convention_words())
        words.update(SYLLABLES)  # world names
        for fam in FAMILIES.values():
            words.update(fam["params"])
        return sorted(words)
