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
    against it. ``world`` names the world the task lives in (see :class:`World`). ``spec`` is
    hidden from the policy; it holds the conventions the verifier applies.
    """

    task_id: str
    domain: str
    family: str
    prompt: str
    spec: dict[str, Any] = field(default_factory=dict)
    world: str = ""  # the world's name (it appears in the prompt); its conventions live in ``spec``

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

    def generate(self, seed: int, n: int) -> list[Task]:
        """``n`` tasks from generator ``seed``; the world-based domains (tool, code) also take
        ``pool='target'|'pretrain'`` and offer ``worlds``, ``convention_words()`` and
        ``worlds_summary()``."""
        ...

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


# --------------------------------------------------------------------------- worlds
POOLS = ("target", "pretrain")


@dataclass(frozen=True)
class WorldConfig:
    """How a domain's worlds are drawn (the ``envs`` params that concern worlds).

    ``n_target`` worlds are shared by train/val/test; ``n_pretrain`` disjoint worlds are used
    only to pretrain the base policy; each convention slot draws from its first ``n_options``
    options. With ``null_world`` every *target* task draws its conventions afresh (so
    same-world experience says nothing about it); pretraining worlds are unaffected, so the
    base policy is the same reader of context either way. The defaults (an env built without
    params, as in unit tests) are params.yaml's.
    """

    n_target: int = 16
    n_pretrain: int = 1440
    n_options: int = 2
    null_world: bool = False
    seed: int = 1234

    @classmethod
    def from_params(cls, envs_params: Any) -> "WorldConfig":
        if envs_params is None:
            return cls()
        return cls(n_target=envs_params.n_target_worlds, n_pretrain=envs_params.n_pretrain_worlds,
                   n_options=envs_params.n_options, null_world=envs_params.null_world, seed=envs_params.seed)


@dataclass(frozen=True)
class World:
    """A seeded instance of a family: its name (shown in prompts) and its hidden conventions
    (slot -> chosen option; shown only by what a successful trajectory does)."""

    name: str
    domain: str
    family: str
    pool: str
    conventions: tuple[tuple[str, str], ...]

    @property
    def conv(self) -> dict[str, str]:
        return dict(self.conventions)


def draw_conventions(rng: random.Random, slots: dict[str, list[str]], n_options: int) -> dict[str, str]:
    """One option per slot, uniformly from the slot's first ``n_options`` options."""
    return {slot: rng.choice(opts[:n_options]) for slot, opts in slots.items()}


# A world's name is two syllables ("ke ro"): every syllable is seen in pretraining, so a
# target world's name is made of trained tokens, while the pair itself is new. Target worlds
# take distinct names; pretraining worlds cycle through the remaining names, so one name
# stands for several pretraining worlds with independent conventions: a name is then a
# useless key to memorise conventions by, and pretraining pays only for reading them from
# experience (with one world per name, a 300k-parameter model memorised names instead).
SYLLABLES = ["ba", "ke", "di", "fo", "gu", "ha", "ji", "lo", "mu", "ne", "pi", "ro", "sa", "tu", "vo", "ze"]
MAX_WORLDS = len(SYLLABLES) ** 2  # distinct names; target worlds must leave some for pretraining


def world_names(domain: str, n_target: int, n_pretrain: int, seed: int) -> tuple[list[str], list[str]]:
    """(target names, pretraining names): ``n_target`` distinct two-syllable names, a seeded draw
    per domain, and ``n_pretrain`` names cycling through the other ``MAX_WORLDS - n_target``."""
    if n_target >= MAX_WORLDS:
        raise ValueError(f"at most {MAX_WORLDS - 1} target worlds per domain, asked for {n_target}")
    names = [f"{a} {b}" for a in SYLLABLES for b in SYLLABLES]
    random.Random(json.dumps([seed, domain, "world-names"])).shuffle(names)
    rest = names[n_target:]
    return names[:n_target], [rest[j % len(rest)] for j in range(n_pretrain)]


def known_families(kind: str, names: list[str] | None, families) -> list[str]:
    """The families a domain uses: ``names``, each of which must be one of ``families`` (default: all)."""
    names = names or list(families)
    unknown = [n for n in names if n not in families]
    if unknown:
        raise ValueError(f"unknown {kind} families {unknown}; known: {sorted(families)}")
    return names


def pool_draws(worlds: dict[str, list[World]], domain: str, seed: int, n: int, pool: str):
    """``(i, rng, world)`` for each of ``n`` tasks spread round-robin over the ``pool`` worlds
    (``target`` or ``pretrain``); ``rng`` is task i's private RNG (:func:`task_rng`, keyed without the
    pool for ``target``, so target tasks do not depend on the pretraining pool existing)."""
    if pool not in POOLS:
        raise ValueError(f"unknown world pool {pool!r}; known: {POOLS}")
    ws = worlds[pool]
    for i in range(n):
        rng = task_rng(seed, domain, pool, i) if pool != "target" else task_rng(seed, domain, i)
        yield i, rng, ws[i % len(ws)]


def make_worlds(domain: str, families: list[str], slots_of, cfg: WorldConfig) -> dict[str, list[World]]:
    """The target and pretraining worlds of a domain, a pure function of ``cfg`` (not of the
    split seeds). World ``i`` belongs to ``families[i % F]``; target worlds are
    ``0..n_target-1``, pretraining worlds follow. ``slots_of(family)`` gives the family's
    convention slots and their options. Pretraining worlds may share a name (see
    :func:`world_names`); a world is its (name, family, conventions), see :func:`world_key`."""
    out: dict[str, list[World]] = {p: [] for p in POOLS}
    target, pretrain = world_names(domain, cfg.n_target, cfg.n_pretrain, cfg.seed)
    for i, name in enumerate(target + pretrain):
        family = families[i % len(families)]
        conv = draw_conventions(task_rng(cfg.seed, domain, "world", i), slots_of(family), cfg.n_options)
        pool = "target" if i < cfg.n_target else "pretrain"
        out[pool].append(World(name, domain, family, pool, tuple(sorted(conv.items()))))
    return out


def world_key(task: "Task") -> tuple[str, str, str]:
    """What makes two tasks same-world: the name, the family and the conventions they are
    verified against (pretraining names are shared by several worlds)."""
    return task.world, task.family, json.dumps(task.spec.get("conventions", {}), sort_keys=True)


def task_conventions(world: World, cfg: WorldConfig, slots: dict[str, list[str]], seed: int, i: int) -> dict[str, str]:
    """The conventions task ``i`` (of generator ``seed``) is verified against: its world's,
    or — in the null world, for target tasks — a fresh draw from the task's own RNG."""
    if cfg.null_world and world.pool == "target":
        return draw_conventions(task_rng(seed, world.domain, "null-conventions", i), slots, cfg.n_options)
    return world.conv


def worlds_summary(worlds: dict[str, list[World]]) -> dict:
    """A JSON record of a domain's worlds: names and families per pool, and a SHA-256 of the
    conventions (so the manifest pins them without printing them)."""
    import hashlib

    conv = json.dumps({w.name: w.conventions for p in POOLS for w in worlds[p]}, sort_keys=True)
    return {p: {w.name: w.family for w in worlds[p]} for p in POOLS} | {
        "conventions_sha256": hashlib.sha256(conv.encode()).hexdigest()}


def stratified(tasks: list[Task], n: int) -> list[Task]:
    """The first ``n`` tasks taken round-robin across domains (splits are domain-major, so a plain
    prefix would validate on one domain only). Deterministic: same split, same subset."""
    by_dom: dict[str, list[Task]] = {}
    for t in tasks:
        by_dom.setdefault(t.domain, []).append(t)
    out: list[Task] = []
    queues = [list(v) for v in by_dom.values()]
    while len(out) < min(n, len(tasks)):
        for q in queues:
            if q and len(out) < n:
                out.append(q.pop(0))
    return out
