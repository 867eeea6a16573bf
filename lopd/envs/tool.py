"""Stateful, multi-turn tool environments in the spirit of EnvScaler.

Each *family* (:mod:`lopd.envs.tool_families`) has a procedure — a prerequisite call, an
operation on two arguments, the family's closing call — and each *world* — a seeded instance
of a family (:func:`lopd.envs.base.make_worlds`) — has its own **hidden conventions**: the key
the prerequisite call carries (``<prereq> as <key> ARGS``) and the unit word the operation carries
(``<op> in <unit> A B``); tool names are fixed per family, and every family draws its key and unit
from the same two pools. A prompt names its world and states the
goal, never the conventions; a successful trajectory in the same world shows both. Wrong
conventions fail: a wrong key is ``error key`` (the prerequisite is not done), a wrong unit
``error unit``, and an operation before its prerequisite is refused. (Hidden tool names and an
argument-order convention were tried and dropped: a two-layer model read neither well from
experience. A key or unit follows a marker that occurs once per trajectory, which it copies; see
:data:`lopd.envs.tool_families.KEYS` for why the pools and markers are shared by all families.)

Protocol: the policy emits one action per turn (``"<tool> <args...>"``), the environment
answers with an observation; the episode ends when the family's closing tool is called or
after ``max_turns`` actions. Reward = fraction of the two goal checks met by the final state
(goal state reached, closed once the goal held): reward > 0 needs the conventions used right.
"""

from __future__ import annotations

import random
from typing import Any

from lopd.envs.base import (SYLLABLES, StepResult, Task, WorldConfig, known_families, make_worlds, pool_draws,
                            task_conventions, worlds_summary)
from lopd.envs.tool_families import (ACTION_WORDS, AGENTS, DIGITS, FAMILIES, ITEMS, MAX_OPTIONS,  # noqa: F401
                                     OBS_WORDS, PROMPT_WORDS, USERS, Family, State, split_action)


class ToolEpisode:
    def __init__(self, fam: Family, task: Task, max_turns: int):
        self.fam, self.task, self.max_turns = fam, task, max_turns
        self.state = State(spec=task.spec, conv=task.spec["conventions"])
        fam.init(self.state)
        self.turns = 0

    def step(self, action: str) -> StepResult:
        if self.state.done:
            raise RuntimeError(f"episode of {self.task.task_id} is already over")
        self.turns += 1
        obs = self.fam.step(self.state, split_action(action))
        done = self.state.done or self.turns >= self.max_turns
        self.state.done = done
        return StepResult(observation=None if done else obs, done=done)

    def reward(self) -> float:
        checks = self.fam.checks(self.state)
        return sum(checks) / len(checks)


class ToolEnv:
    """All tool families behind one ``Env``; tasks live in the worlds ``worlds`` describes."""

    domain = "tool"

    def __init__(self, families: list[str] | None = None, max_turns: int = 5, worlds: WorldConfig | None = None):
        names = known_families("tool", families, FAMILIES)
        self.families = names
        self.max_turns = max_turns
        self.world_cfg = worlds or WorldConfig()
        if not 1 <= self.world_cfg.n_options <= MAX_OPTIONS:
            raise ValueError(f"n_options must be in 1..{MAX_OPTIONS}, got {self.world_cfg.n_options}")
        self.worlds = make_worlds(self.domain, names, lambda f: FAMILIES[f].slots(), self.world_cfg)

    def generate(self, seed: int, n: int, pool: str = "target") -> list[Task]:
        """``n`` tasks spread round-robin over the ``pool`` worlds (``target`` or ``pretrain``)."""
        tasks = []
        for i, rng, world in pool_draws(self.worlds, "tool", seed, n, pool):
            fam = FAMILIES[world.family]
            tail, spec = fam.make(rng)
            spec["conventions"] = task_conventions(world, self.world_cfg, fam.slots(), seed, i)
            tag = "" if pool == "target" else "p"
            tasks.append(Task(task_id=f"tool/{fam.name}/{tag}{seed}-{i:05d}", domain="tool", family=fam.name,
                              prompt=f"{world.name} {fam.name} : {tail}", spec=spec, world=world.name))
        return tasks

    def episode(self, task: Task) -> ToolEpisode:
        return ToolEpisode(FAMILIES[task.family], task, self.max_turns)

    def solve(self, task: Task, rng: random.Random | None = None, noise: float = 0.0) -> list[str]:
        """The scripted solution in the task's conventions; with ``noise`` each action is, with
        that probability, skipped, given a wrong argument, or given a wrong tool name."""
        fam = FAMILIES[task.family]
        actions = fam.solve(task.spec)
        if noise <= 0 or rng is None:
            return actions
        names = [n for slot in ("prereq", "op") for n in fam.pools[slot][:self.world_cfg.n_options]] + [fam.closing]
        out: list[str] = []
        for a in actions:
            if rng.random() >= noise:
                out.append(a)
                continue
            kind = rng.randrange(3)
            if kind == 0:  # skip the step (e.g. forget the prerequisite)
                continue
            w = a.split()
            slots = [j for j in range(1, len(w)) if w[j] not in ACTION_WORDS]  # the markers are grammar, never noise
            if kind == 1 and slots:  # a wrong argument (or key, or unit)
                j = rng.choice(slots)
                pool = DIGITS if w[j] in DIGITS else (fam.args_vocab() + fam.pools["unit"][:self.world_cfg.n_options]
                                                      + fam.pools["key"][:self.world_cfg.n_options])
                w[j] = rng.choice(pool)
                out.append(" ".join(w))
            else:  # a plausible but wrong tool name of the family
                out.append(" ".join([rng.choice(names)] + w[1:]))
        return out

    def convention_words(self) -> list[str]:
        """Every option of every name/unit slot: the words that only experience can reveal."""
        return sorted({o for f in self.families for opts in FAMILIES[f].pools.values() for o in opts})

    def worlds_summary(self) -> dict:
        return worlds_summary(self.worlds)

    def vocabulary(self) -> list[str]:
        words = {*OBS_WORDS, *PROMPT_WORDS, *ACTION_WORDS}
        for fam in FAMILIES.values():
            words.update([fam.name, fam.closing, *fam.extra_tools, *fam.args_vocab()])
            words.update(o for opts in fam.pools.values() for o in opts)
        words.update(SYLLABLES)  # world names
        return sorted(words)


def run_actions(env: Any, task: Task, actions: list[str]) -> tuple[list[tuple[str, str]], float]:
    """Play scripted ``actions``; returns the message list and the reward."""
    ep = env.episode(task)
    msgs: list[tuple[str, str]] = [("user", task.prompt)]
    for a in actions:
        msgs.append(("assistant", a))
        res = ep.step(a)
        if res.done:
            break
        if res.observation is not None:
            msgs.append(("obs", res.observation))
    return msgs, ep.reward()
