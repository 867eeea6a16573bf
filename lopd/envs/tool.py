"""Stateful, multi-turn tool environments in the spirit of EnvScaler.

Each *family* has its own tools and **hidden procedure rules** that the prompt does not
state (a lookup must precede an update, a mode must match the direction of change, ...).
A policy that has never seen a successful trajectory of the family must discover them; a
retrieved success of a similar task shows them — which is what makes experience
retrieval informative here.

Protocol: the policy emits one action per turn (``"<tool> <args...>"``), the environment
answers with an observation; the episode ends when the family's closing tool is called or
after ``max_turns`` actions. Reward = fraction of the family's goal checks met by the final
state.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from lopd.envs.base import StepResult, Task, task_rng

ITEMS = ["apple", "bolt", "cable", "drill", "glue"]
USERS = ["ana", "bob", "cy", "dee", "eve"]
AGENTS = ["kim", "lee", "max", "ned"]
DIGITS = [str(i) for i in range(10)]

@dataclass
class _State:
    spec: dict[str, Any]
    vars: dict[str, Any] = field(default_factory=dict)
    done: bool = False

def _words(action: str) -> list[str]:
    return action.strip().split()

# --------------------------------------------------------------------------- families
class _Family(ABC):
    """One environment family: its tools, hidden rules, goal checks and scripted solver."""

    name: str
    closing: str
    tools: tuple[str, ...]

    @abstractmethod
    def make(self, rng: random.Random) -> tuple[str, dict[str, Any]]:
        """(prompt tail, hidden spec) of a new task."""

    @abstractmethod
    def init(self, st: _State) -> None:
        """Set the episode's initial state from ``st.spec``."""

    @abstractmethod
    def step(self, st: _State, w: list[str]) -> str:
        """Apply one action (split into words); return the observation."""

    @abstractmethod
    def checks(self, st: _State) -> list[bool]:
        """The goal checks of the final state (reward = fraction met)."""

    @abstractmethod
    def solve(self, spec: dict[str, Any]) -> list[str]:
        """The scripted correct actions."""

    @abstractmethod
    def args_vocab(self) -> list[str]:
        """Argument and observation words of this family."""


class Inventory(_Family):
    """``lookup X`` must precede ``set X N`` (else ``error locked``); ``commit`` closes."""

    name, closing, tools = "inventory", "commit", ("lookup", "set", "commit")

    def make(self, rng):
        item, q = rng.choice(ITEMS), rng.randrange(10)
        cur = rng.choice([c for c in range(10) if c != q])  # never already at the goal
        return f"set {item} to {q}", {"item": item, "qty": q, "current": cur}

    def init(self, st):
        st.vars = {"stock": {st.spec["item"]: st.spec["current"]}, "looked": set(), "committed": False}

    def step(self, st, w):
        v = st.vars
        if w[:1] == ["lookup"] and len(w) == 2 and w[1] in ITEMS:
            v["looked"].add(w[1])
            return f"{w[1]} has {v['stock'].get(w[1], 0)}"
        if w[:1] == ["set"] and len(w) == 3 and w[1] in ITEMS and w[2] in DIGITS:
            if w[1] not in v["looked"]:
                return "error locked"
            v["stock"][w[1]] = int(w[2])
            return "ok"
        if w == ["commit"]:
            v["committed"] = True
            st.done = True
            return "ok"
        return "error unknown"

    def checks(self, st):
        s = st.spec
        return [st.vars["stock"].get(s["item"]) == s["qty"], st.vars["committed"]]

    def solve(self, spec):
        return [f"lookup {spec['item']}", f"set {spec['item']} {spec['qty']}", "commit"]

    def args_vocab(self):
        return ITEMS + DIGITS + ["has", "to"]

class Bank(_Family):
    """``auth`` must precede ``pay U A`` (else ``error denied``); ``logout`` closes."""

    name, closing, tools = "bank", "logout", ("auth", "pay", "logout")

    def make(self, rng):
        user, amt = rng.choice(USERS), rng.randrange(1, 10)
        return f"send {amt} to {user}", {"user": user, "amount": amt}

    def init(self, st):
        st.vars = {"authed": False, "paid": {}, "out": False}

    def step(self, st, w):
        v = st.vars
        if w == ["auth"]:
            v["authed"] = True
            return "ok"
        if w[:1] == ["pay"] and len(w) == 3 and w[1] in USERS and w[2] in DIGITS:
            if not v["authed"]:
                return "error denied"
            v["paid"][w[1]] = v["paid"].get(w[1], 0) + int(w[2])
            return "ok"
        if w == ["logout"]:
            v["out"] = True
            st.done = True
            return "ok"
        return "error unknown"

    def checks(self, st):
        s = st.spec
        return [st.vars["paid"] == {s["user"]: s["amount"]}, st.vars["out"]]

    def solve(self, spec):
        return ["auth", f"pay {spec['user']} {spec['amount']}", "logout"]

    def args_vocab(self):
        return USERS + DIGITS + ["to"]

class Thermo(_Family):
    """``temp R T`` needs ``mode heat`` when raising and ``mode cool`` when lowering the
    current reading, which only ``read R`` reveals (else ``error mode``); ``save`` closes."""

    name, closing, tools = "thermo", "save", ("read", "mode", "temp", "save")

    def make(self, rng):
        room, target = rng.randrange(1, 6), rng.randrange(10)
        cur = rng.choice([c for c in range(10) if c != target])
        return f"set room {room} to {target}", {"room": room, "target": target, "current": cur}

    def init(self, st):
        st.vars = {"temp": st.spec["current"], "mode": None, "saved": False}

    def step(self, st, w):
        v, s = st.vars, st.spec
        if w[:1] == ["read"] and len(w) == 2 and w[1] in DIGITS:
            return f"room {w[1]} is {v['temp'] if int(w[1]) == s['room'] else 5}"
        if w[:1] == ["mode"] and len(w) == 2 and w[1] in ("heat", "cool"):
            v["mode"] = w[1]
            return "ok"
        if w[:1] == ["temp"] and len(w) == 3 and w[1] in DIGITS and w[2] in DIGITS:
            if int(w[1]) != s["room"]:
                return "error room"
            want = "heat" if int(w[2]) > v["temp"] else "cool"
            if v["mode"] != want:
                return "error mode"
            v["temp"] = int(w[2])
            return "ok"
        if w == ["save"]:
            v["saved"] = True
            st.done = True
            return "ok"
        return "error unknown"

    def checks(self, st):
        return [st.vars["temp"] == st.spec["target"], st.vars["saved"]]

    def solve(self, spec):
        mode = "heat" if spec["target"] > spec["current"] else "cool"
        r = spec["room"]
        return [f"read {r}", f"mode {mode}", f"temp {r} {spec['target']}", "save"]

    def args_vocab(self):
        return DIGITS + ["heat", "cool", "room", "is", "to"]

class Ticket(_Family):
    """``find I`` must precede ``assign I A`` (else ``error unknown``); ``close I`` needs an
    assignee (else ``error unassigned``) and closes."""

    name, closing, tools = "ticket", "close", ("find", "assign", "close")

    def make(self, rng):
        tid, agent = rng.randrange(10), rng.choice(AGENTS)
        return f"resolve {tid} for {agent}", {"ticket": tid, "agent": agent}

    def init(self, st):
        st.vars = {"found": set(), "assignee": None, "closed": False}

    def step(self, st, w):
        v, s = st.vars, st.spec
        if w[:1] == ["find"] and len(w) == 2 and w[1] in DIGITS:
            v["found"].add(int(w[1]))
            return f"ticket {w[1]} open"
        if w[:1] == ["assign"] and len(w) == 3 and w[1] in DIGITS and w[2] in AGENTS:
            if int(w[1]) not in v["found"] or int(w[1]) != s["ticket"]:
                return "error unknown"
            v["assignee"] = w[2]
            return "ok"
        if w[:1] == ["close"] and len(w) == 2 and w[1] in DIGITS:
            st.done = True
            if v["assignee"] is None or int(w[1]) != s["ticket"]:
                return "error unassigned"
            v["closed"] = True
            return "ok"
        return "error unknown"

    def checks(self, st):
        return [st.vars["assignee"] == st.spec["agent"], st.vars["closed"]]

    def solve(self, spec):
        t = spec["ticket"]
        return [f"find {t}", f"assign {t} {spec['agent']}", f"close {t}"]

    def args_vocab(self):
        return DIGITS + AGENTS + ["ticket", "open", "for"]

FAMILIES: dict[str, _Family] = {f.name: f for f in (Inventory(), Bank(), Thermo(), Ticket())}
_OBS_WORDS = ["ok", "error", "locked", "denied", "mode", "unknown", "room", "unassigned"]

class ToolEpisode:
    def __init__(self, fam: _Family, task: Task, max_turns: int):
        self.fam, self.task, self.max_turns = fam, task, max_turns
        self.state = _State(spec=task.spec)
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
    """All tool families behind one ``Env``."""

    domain = "tool"

    def __init__(self, families: list[str] | None = None, max_turns: int = 5):
        names = families or list(FAMILIES)
        unknown = [n for n in names if n not in FAMILIES]
        if unknown:
            raise ValueError(f"unknown tool families {unknown}; known: {sorted(FAMILIES)}")
        self.families = names
        self.max_turns = max_turns

    def generate(self, seed: int, n: int) -> list[Task]:
        tasks = []
        for i in range(n):
            rng = task_rng(seed, "tool", i)
            fam = FAMILIES[self.families[i % len(self.families)]]
            tail, spec = fam.make(rng)
            tasks.append(
                Task(
                    task_id=f"tool/{fam.name}/{seed}-{i:05d}",
                    domain="tool",
                    family=fam.name,
                    prompt=f"{fam.name} : {tail}",
                    spec=spec,
                )
            )
        return tasks

    def episode(self, task: Task) -> ToolEpisode:
        return ToolEpisode(FAMILIES[task.family], task, self.max_turns)

    def solve(self, task: Task, rng: random.Random | None = None, noise: float = 0.0) -> list[str]:
        fam = FAMILIES[task.family]
        actions = fam.solve(task.spec)
        if noise <= 0 or rng is None:
            return actions
        out: list[str] = []
        for a in actions:
            if rng.random() >= noise:
                out.append(a)
                continue
            kind = rng.randrange(3)
            if kind == 0:  # skip the step (e.g. forget the hidden prerequisite)
                continue
            w = a.split()
            if kind == 1 and len(w) > 1:  # wrong argument
                j = rng.randrange(1, len(w))
                pool = DIGITS if w[j] in DIGITS else fam.args_vocab()
                w[j] = rng.choice(pool)
                out.append(" ".join(w))
            else:  # a plausible but wrong tool of the family
                out.append(" ".join([rng.choice(fam.tools)] + w[1:]))
        return out

    def vocabulary(self) -> list[str]:
        words = {":", *(_OBS_WORDS), "set", "send", "resolve", "to", "for"}
        for fam in FAMILIES.values():
            words.update([fam.name, *fam.tools, *fam.args_vocab()])
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
