"""Stateful, multi-turn tool environments in the spirit of EnvScaler.

Each *family* has a procedure (a prerequisite call, an operation, a closing call) and each
*world* — a seeded instance of a family (:func:`lopd.envs.base.make_worlds`) — has its own
**hidden conventions**: which tool name performs the prerequisite, the operation and the
closing step, the order of the operation's two arguments, and the unit word the operation's
value must carry. A prompt names its world and states the goal, never the conventions; a
successful trajectory in the same world shows all of them. Wrong conventions fail: an
unknown tool name is ``error unknown``, a wrong unit ``error unit``, swapped arguments do
not parse or address the wrong thing, an operation before its prerequisite is refused.

Protocol: the policy emits one action per turn (``"<tool> <args...>"``), the environment
answers with an observation; the episode ends when the world's closing tool is called or
after ``max_turns`` actions. Reward = fraction of the family's three goal checks met by the
final state (prerequisite done, goal state reached, closed).
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from lopd.envs.base import (POOLS, SYLLABLES, StepResult, Task, WorldConfig, make_worlds, task_conventions,
                            task_rng, worlds_summary)

ITEMS = ["apple", "bolt", "cable", "drill", "glue"]
USERS = ["ana", "bob", "cy", "dee", "eve"]
AGENTS = ["kim", "lee", "max", "ned"]
DIGITS = [str(i) for i in range(10)]
ORDERS = ["fwd", "rev"]  # the operation's two arguments as the prompt states them, or swapped
MAX_OPTIONS = 4  # every name/unit slot has this many options


@dataclass
class _State:
    spec: dict[str, Any]
    conv: dict[str, str]
    vars: dict[str, Any] = field(default_factory=dict)
    done: bool = False


def _words(action: str) -> list[str]:
    return action.strip().split()


# --------------------------------------------------------------------------- families
class _Family(ABC):
    """One family: its option pools, goal, rules and scripted solver. Subclasses say what
    the prerequisite, the operation and the closing call do; the conventions (names, order,
    unit) are applied here, so every family obeys them the same way."""

    name: str
    pools: dict[str, list[str]]  # slot -> options: prereq, op, close (tool names), unit (value unit)
    extra_tools: tuple[str, ...] = ()

    def slots(self) -> dict[str, list[str]]:
        return {**self.pools, "order": ORDERS}

    @abstractmethod
    def make(self, rng: random.Random) -> tuple[str, dict[str, Any]]:
        """(goal text of the prompt, hidden task spec)."""

    @abstractmethod
    def init(self, st: _State) -> None: ...

    @abstractmethod
    def prereq_args(self, spec: dict) -> list[str]:
        """Arguments of the correct prerequisite call."""

    @abstractmethod
    def on_prereq(self, st: _State, args: list[str]) -> str:
        """Apply the prerequisite call; return the observation."""

    @abstractmethod
    def op_args(self, spec: dict) -> tuple[str, str]:
        """The operation's two arguments in prompt ("fwd") order."""

    @abstractmethod
    def on_op(self, st: _State, a: str, b: str) -> str:
        """Apply the operation on its (re-ordered to fwd) arguments; return the observation."""

    def close_args(self, spec: dict) -> list[str]:
        return []

    def on_close(self, st: _State, args: list[str]) -> str:
        if args:
            return "error unknown"
        st.vars["closed"] = True
        st.done = True
        return "ok"

    def on_extra(self, st: _State, w: list[str]) -> str:
        return "error unknown"

    def extra_steps(self, spec: dict) -> list[str]:
        """Scripted actions between the prerequisite and the operation (none by default)."""
        return []

    @abstractmethod
    def checks(self, st: _State) -> list[bool]:
        """The three goal checks of the final state: prerequisite done, goal reached, closed."""

    @abstractmethod
    def args_vocab(self) -> list[str]: ...

    # ------------------------------------------------------------ conventions applied
    def step(self, st: _State, w: list[str]) -> str:
        c = st.conv
        if not w:
            return "error unknown"
        if w[0] == c["prereq"]:
            return self.on_prereq(st, w[1:])
        if w[0] == c["op"]:
            if len(w) != 4:
                return "error args"
            if w[3] != c["unit"]:
                return "error unit"
            a, b = (w[1], w[2]) if c["order"] == "fwd" else (w[2], w[1])
            return self.on_op(st, a, b)
        if w[0] == c["close"]:
            return self.on_close(st, w[1:])
        if w[0] in self.extra_tools:
            return self.on_extra(st, w)
        return "error unknown"

    def solve(self, spec: dict) -> list[str]:
        c = spec["conventions"]
        a, b = self.op_args(spec)
        if c["order"] == "rev":
            a, b = b, a
        return [" ".join([c["prereq"], *self.prereq_args(spec)]), *self.extra_steps(spec),
                f"{c['op']} {a} {b} {c['unit']}", " ".join([c["close"], *self.close_args(spec)])]


class Inventory(_Family):
    """Prerequisite ``<prereq> ITEM`` (reveals the stock) before ``<op> ITEM QTY <unit>``."""

    name = "inventory"
    pools = {"prereq": ["lookup", "count", "scan", "audit"], "op": ["put", "store", "write", "update"],
             "close": ["commit", "sync", "flush", "finish"], "unit": ["pcs", "kg", "box", "lot"]}

    def make(self, rng):
        item, q = rng.choice(ITEMS), rng.randrange(10)
        cur = rng.choice([c for c in range(10) if c != q])  # never already at the goal
        return f"set {item} to {q}", {"item": item, "qty": q, "current": cur}

    def init(self, st):
        st.vars = {"stock": {st.spec["item"]: st.spec["current"]}, "looked": set(), "closed": False}

    def prereq_args(self, spec):
        return [spec["item"]]

    def on_prereq(self, st, args):
        if len(args) != 1 or args[0] not in ITEMS:
            return "error args"
        st.vars["looked"].add(args[0])
        return f"{args[0]} has {st.vars['stock'].get(args[0], 0)}"

    def op_args(self, spec):
        return spec["item"], str(spec["qty"])

    def on_op(self, st, a, b):
        if a not in ITEMS or b not in DIGITS:
            return "error args"
        if a not in st.vars["looked"]:
            return "error locked"
        st.vars["stock"][a] = int(b)
        return "ok"

    def checks(self, st):
        s, v = st.spec, st.vars
        return [s["item"] in v["looked"], v["stock"].get(s["item"]) == s["qty"], v["closed"]]

    def args_vocab(self):
        return ITEMS + DIGITS + ["has"]


class Bank(_Family):
    """Prerequisite ``<prereq>`` (authenticates) before ``<op> USER AMOUNT <unit>``."""

    name = "bank"
    pools = {"prereq": ["auth", "login", "verify", "unlock"], "op": ["pay", "transfer", "wire", "remit"],
             "close": ["logout", "exit", "quit", "leave"], "unit": ["usd", "eur", "gbp", "yen"]}

    def make(self, rng):
        user, amt = rng.choice(USERS), rng.randrange(1, 10)
        return f"send {amt} to {user}", {"user": user, "amount": amt}

    def init(self, st):
        st.vars = {"authed": False, "paid": {}, "closed": False}

    def prereq_args(self, spec):
        return []

    def on_prereq(self, st, args):
        if args:
            return "error args"
        st.vars["authed"] = True
        return "ok"

    def op_args(self, spec):
        return spec["user"], str(spec["amount"])

    def on_op(self, st, a, b):
        if a not in USERS or b not in DIGITS:
            return "error args"
        if not st.vars["authed"]:
            return "error denied"
        st.vars["paid"][a] = st.vars["paid"].get(a, 0) + int(b)
        return "ok"

    def checks(self, st):
        s, v = st.spec, st.vars
        return [v["authed"], v["paid"] == {s["user"]: s["amount"]}, v["closed"]]

    def args_vocab(self):
        return USERS + DIGITS


class Thermo(_Family):
    """Prerequisite ``<prereq> ROOM`` (reads the current temperature) before
    ``<op> ROOM TARGET <unit>``, which also needs ``mode heat`` when raising and ``mode cool``
    when lowering the reading (``mode`` is not a convention: the reading decides it)."""

    name = "thermo"
    pools = {"prereq": ["read", "poll", "sense", "probe"], "op": ["temp", "adjust", "tune", "dial"],
             "close": ["save", "apply", "confirm", "keep"], "unit": ["deg", "cel", "fah", "kel"]}
    extra_tools = ("mode",)

    def make(self, rng):
        room, target = rng.randrange(1, 6), rng.randrange(10)
        cur = rng.choice([c for c in range(10) if c != target])
        return f"set room {room} to {target}", {"room": room, "target": target, "current": cur}

    def init(self, st):
        st.vars = {"temp": st.spec["current"], "mode": None, "read": set(), "closed": False}

    def prereq_args(self, spec):
        return [str(spec["room"])]

    def on_prereq(self, st, args):
        if len(args) != 1 or args[0] not in DIGITS:
            return "error args"
        st.vars["read"].add(int(args[0]))
        return f"room {args[0]} is {st.vars['temp'] if int(args[0]) == st.spec['room'] else 5}"

    def on_extra(self, st, w):
        if len(w) == 2 and w[1] in ("heat", "cool"):
            st.vars["mode"] = w[1]
            return "ok"
        return "error args"

    def extra_steps(self, spec):
        return ["mode " + ("heat" if spec["target"] > spec["current"] else "cool")]

    def op_args(self, spec):
        return str(spec["room"]), str(spec["target"])

    def on_op(self, st, a, b):
        v = st.vars
        if a not in DIGITS or b not in DIGITS:
            return "error args"
        if int(a) != st.spec["room"]:
            return "error room"
        if int(a) not in v["read"]:
            return "error stale"
        if v["mode"] != ("heat" if int(b) > v["temp"] else "cool"):
            return "error mode"
        v["temp"] = int(b)
        return "ok"

    def checks(self, st):
        v = st.vars
        return [st.spec["room"] in v["read"], v["temp"] == st.spec["target"], v["closed"]]

    def args_vocab(self):
        return DIGITS + ["heat", "cool", "room", "is"]


class Ticket(_Family):
    """Prerequisite ``<prereq> ID`` (finds the ticket) before ``<op> ID AGENT <unit>``;
    ``<close> ID`` needs an assignee (else ``error unassigned``) and ends the episode."""

    name = "ticket"
    pools = {"prereq": ["find", "pull", "claim", "fetch"], "op": ["assign", "route", "give", "hand"],
             "close": ["close", "shut", "settle", "archive"], "unit": ["p1", "p2", "p3", "p4"]}

    def make(self, rng):
        tid, agent = rng.randrange(10), rng.choice(AGENTS)
        return f"resolve {tid} for {agent}", {"ticket": tid, "agent": agent}

    def init(self, st):
        st.vars = {"found": set(), "assignee": None, "closed": False}

    def prereq_args(self, spec):
        return [str(spec["ticket"])]

    def on_prereq(self, st, args):
        if len(args) != 1 or args[0] not in DIGITS:
            return "error args"
        st.vars["found"].add(int(args[0]))
        return f"ticket {args[0]} open"

    def op_args(self, spec):
        return str(spec["ticket"]), spec["agent"]

    def on_op(self, st, a, b):
        if a not in DIGITS or b not in AGENTS:
            return "error args"
        if int(a) not in st.vars["found"] or int(a) != st.spec["ticket"]:
            return "error unknown"
        st.vars["assignee"] = b
        return "ok"

    def close_args(self, spec):
        return [str(spec["ticket"])]

    def on_close(self, st, args):
        if len(args) != 1 or args[0] not in DIGITS:
            return "error args"
        st.done = True
        if st.vars["assignee"] is None or int(args[0]) != st.spec["ticket"]:
            return "error unassigned"
        st.vars["closed"] = True
        return "ok"

    def checks(self, st):
        v = st.vars
        return [st.spec["ticket"] in v["found"], v["assignee"] == st.spec["agent"], v["closed"]]

    def args_vocab(self):
        return DIGITS + AGENTS + ["ticket", "open"]


FAMILIES: dict[str, _Family] = {f.name: f for f in (Inventory(), Bank(), Thermo(), Ticket())}
_OBS_WORDS = ["ok", "error", "locked", "denied", "mode", "unknown", "room", "unassigned", "args", "unit", "stale"]
_PROMPT_WORDS = [":", "set", "send", "resolve", "to", "for", "room"]


class ToolEpisode:
    def __init__(self, fam: _Family, task: Task, max_turns: int):
        self.fam, self.task, self.max_turns = fam, task, max_turns
        self.state = _State(spec=task.spec, conv=task.spec["conventions"])
        fam.init(self.state)
        self.turns = 0

    def step(self, action: str) -> StepResult:
        if self.state.done:
            raise RuntimeError(f"episode of {self.task.task_id} is already over")
        self.turns += 1
        obs = self.fam.step(self.state, _words(action))
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
        names = families or list(FAMILIES)
        unknown = [n for n in names if n not in FAMILIES]
        if unknown:
            raise ValueError(f"unknown tool families {unknown}; known: {sorted(FAMILIES)}")
        self.families = names
        self.max_turns = max_turns
        self.world_cfg = worlds or WorldConfig()
        if not 1 <= self.world_cfg.n_options <= MAX_OPTIONS:
            raise ValueError(f"n_options must be in 1..{MAX_OPTIONS}, got {self.world_cfg.n_options}")
        self.worlds = make_worlds(self.domain, names, lambda f: FAMILIES[f].slots(), self.world_cfg)

    def generate(self, seed: int, n: int, pool: str = "target") -> list[Task]:
        """``n`` tasks spread round-robin over the ``pool`` worlds (``target`` or ``pretrain``)."""
        if pool not in POOLS:
            raise ValueError(f"unknown world pool {pool!r}; known: {POOLS}")
        worlds = self.worlds[pool]
        tasks = []
        for i in range(n):
            rng = task_rng(seed, "tool", pool, i) if pool != "target" else task_rng(seed, "tool", i)
            world = worlds[i % len(worlds)]
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
        names = [n for slot in ("prereq", "op", "close") for n in fam.pools[slot][:self.world_cfg.n_options]]
        out: list[str] = []
        for a in actions:
            if rng.random() >= noise:
                out.append(a)
                continue
            kind = rng.randrange(3)
            if kind == 0:  # skip the step (e.g. forget the prerequisite)
                continue
            w = a.split()
            if kind == 1 and len(w) > 1:  # a wrong argument (or unit)
                j = rng.randrange(1, len(w))
                pool = DIGITS if w[j] in DIGITS else fam.args_vocab() + fam.pools["unit"][:self.world_cfg.n_options]
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
        words = {*_OBS_WORDS, *_PROMPT_WORDS}
        for fam in FAMILIES.values():
            words.update([fam.name, *fam.extra_tools, *fam.args_vocab()])
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
