"""One-turn episodes whose single action is a program scored in the sandbox.

The program runs when the reward is first asked for (not in ``step``), so a rollout engine
can score a whole batch concurrently; scores are memoised per (task, program) — a
program's test outcome is a pure function of its text and the hidden tests, and sampled
policies repeat programs often. Outcomes that depend on machine load (timeouts, kills) are
never memoised.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod

from lopd import sandbox
from lopd.envs.base import SingleActionEpisode, Task

_SCORE_CACHE: dict[tuple[str, str, str], tuple[float, sandbox.SandboxResult]] = {}
_SCORE_LOCK = threading.Lock()
_CACHEABLE = ("ok", "error", "refused", "no_output")


class SandboxedEpisode(SingleActionEpisode, ABC):
    """Subclasses implement :meth:`score` (run ``action`` in the sandbox → reward, result)."""

    def __init__(self, task: Task):
        super().__init__(task)
        self._reward: float | None = None
        self.result: sandbox.SandboxResult | None = None

    @abstractmethod
    def score(self, action: str) -> tuple[float, sandbox.SandboxResult]:
        """Run ``action`` in the sandbox; return (reward, sandbox result)."""

    def reward(self) -> float:
        if self._reward is not None:
            return self._reward
        if self.action is None:
            self._reward = 0.0
            return 0.0
        key = (type(self).__name__, self.task.task_id, self.action)
        with _SCORE_LOCK:
            hit = _SCORE_CACHE.get(key)
        if hit is None:
            hit = self.score(self.action)
            if hit[1].status in _CACHEABLE:
                with _SCORE_LOCK:
                    _SCORE_CACHE[key] = hit
        self._reward, self.result = hit
        return self._reward
