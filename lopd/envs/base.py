"""The environment protocol shared by every domain.

A *task* is a frozen, JSON-serialisable record: what the policy is shown (``prompt``) and
what only the verifier knows (``spec``). An *episode* is one interaction with a task: the
policy emits an action (plain text), the environment answers with an observation (plain
text, or ``None`` when it has nothing to say) and says whether the episode is over. The
reward is read once the episode ends and lies in ``[0, 1]``.

Observations are returned separately from actions so the rollout code can mark them (and
the prompt) as not-generated; losses only ever see the policy's own tokens.
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Task:
    """One task instance.

    ``task_id`` is unique across all domains (``"<domain>/<family>/<index>"``); ``family`` is
    the environment family (tool) or task family (code) — retrieval precision is measured
    against it. ``spec`` is hidden from the policy.
    """

    task_id: str
    domain: str
    family: str
    prompt: str
    spec: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Task":
        return cls(**d)


@dataclass
class StepResult:
    """What the environment answers to one action."""

    observation: str | None
    done: bool


@runtime_checkable
class Episode(Protocol):
    def step(self, action: str) -> StepResult: ...

    def reward(self) -> float: ...


class Env(Protocol):
    """A domain: generates tasks from a seed, runs episodes, and has a scripted solver."""

    domain: str
    max_turns: int

    def generate(self, seed: int, n: int) -> list[Task]: ...

    def episode(self, task: Task) -> Episode: ...

    def solve(self, task: Task, rng: random.Random | None = None, noise: float = 0.0) -> list[str]:
        """Scripted actions for ``task``; with ``noise > 0`` each action may be corrupted."""
        ...

    def vocabulary(self) -> list[str]:
        """Every whitespace-separated word the domain's prompts, actions and observations use."""
        ...


class SingleActionEpisode:
    """An episode of one action: ``step`` records it and ends the episode; subclasses score
    the recorded ``action`` in ``reward``."""

    def __init__(self, task: Task):
        self.task = task
        self.done = False
        self.action: str | None = None

    def step(self, action: str) -> StepResult:
        if self.done:
            raise RuntimeError(f"episode of {self.task.task_id} is already over")
        self.done = True
        self.action = action
        return StepResult(observation=None, done=True)


def task_rng(seed: int, *parts: object) -> random.Random:
    """A private RNG for one (seed, parts...) key, independent of global state."""
    key = json.dumps([seed, *[str(p) for p in parts]])
    return random.Random(key)
