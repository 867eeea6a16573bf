"""The tool families: their option pools, goals, rules and scripted solvers.

A family fixes a procedure — a prerequisite call, an operation on two arguments, a closing
call, each with a fixed tool name — and the option pools a world's conventions are drawn from:
the key the prerequisite carries after ``as`` and the unit word the operation carries after
``in`` (``prereq`` and ``op`` are pools of one; the key and unit pools are shared by every
family). With two hidden slots of two options, a guess without experience succeeds in about a quarter of the worlds, which keeps the base policy's no-context reward between 0.10 and
0.45 under the goal-gated reward below. :class:`Family` applies the conventions; subclasses say what each step does.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

ITEMS = ["apple", "bolt", "cable", "drill", "glue"]
USERS = ["ana", "bob", "cy", "dee", "eve"]
AGENTS = ["kim", "lee", "max", "ned"]
DIGITS = [str(i) for i in range(10)]
MAX_OPTIONS = 4  # the key and unit slots have this many options (the tool-name pools have one)
# Every family draws its key (an access role) and its unit (an API version) from the same two pools, and
# the convention word follows a marker shared by every family: `<prereq> as <key> ARGS`, `<op> in <unit> A
# B`. Copying a convention from experience is then one skill per slot, "the word after the last `as`", as in
# the code domain, whose scale and offset follow `*` and `+` with the same options in every family. With a
# key and unit pool of its own per family, following the family's own tool name, the 64 x 2 base policy
# learnt the copy separately for each of the 8 (family, slot) pairs, each abruptly and at its own step,
# and after 5000 steps it copied about half of them (the other half at chance; `bench/copy_curve.py`).
KEYS = ["admin", "staff", "guest", "owner"]
UNITS = ["v1", "v2", "v3", "v4"]
KEY_MARK, UNIT_MARK = "as", "in"


@dataclass
class State:
    spec: dict[str, Any]
    conv: dict[str, str]
    vars: dict[str, Any] = field(default_factory=dict)
    done: bool = False


def split_action(action: str) -> list[str]:
    return action.strip().split()


# --------------------------------------------------------------------------- families
class Family(ABC):
    """One family: its option pools, goal, rules and scripted solver. Subclasses say what
    the prerequisite and the operation do and when the goal is reached; the conventions
    (key, unit) are applied here, so every family obeys them the same way.

    Goal checks of the final state (reward = fraction met): the goal state was reached, and
    the family's closing call was made once the goal held (a commit of the wrong change, or
    of no change, does not count). Both need the goal, and the goal needs every convention,
    so a trajectory with reward > 0 has used the world's conventions. (A separate
    "prerequisite done" check gave 1/3 to trajectories whose operation failed; LOPD weighs δ
    by r(τ), so a teacher that knew the right convention was scored *down* on them.)"""

    name: str
    closing: str  # the closing tool (not a convention): ends the episode
    pools: dict[str, list[str]]  # slot -> options: prereq, op (tool names: one each), key (prereq), unit (op)
    extra_tools: tuple[str, ...] = ()

    def slots(self) -> dict[str, list[str]]:
        return dict(self.pools)

    @abstractmethod
    def make(self, rng: random.Random) -> tuple[str, dict[str, Any]]:
        """(goal text of the prompt, hidden task spec)."""

    @abstractmethod
    def init(self, st: State) -> None: ...

    @abstractmethod
    def prereq_args(self, spec: dict) -> list[str]:
        """Arguments of the correct prerequisite call."""

    @abstractmethod
    def on_prereq(self, st: State, args: list[str]) -> str:
        """Apply the prerequisite call; return the observation."""

    @abstractmethod
    def prereq_done(self, st: State) -> bool: ...

    @abstractmethod
    def op_args(self, spec: dict) -> tuple[str, str]:
        """The operation's two arguments, in prompt order."""

    @abstractmethod
    def on_op(self, st: State, a: str, b: str) -> str:
        """Apply the operation on its two arguments; return the observation."""

    @abstractmethod
    def goal_reached(self, st: State) -> bool: ...

    def close_args(self, spec: dict) -> list[str]:
        return []

    def on_close(self, st: State, args: list[str]) -> str:
        if args != self.close_args(st.spec):
            return "error args"
        st.vars["closed_ok"] = self.goal_reached(st)
        st.done = True
        return "ok"

    def on_extra(self, st: State, w: list[str]) -> str:
        return "error unknown"

    def extra_steps(self, spec: dict) -> list[str]:
        """Scripted actions between the prerequisite and the operation (none by default)."""
        return []

    def checks(self, st: State) -> list[bool]:
        # Every check needs the goal state, which needs every convention (the operation is
        # refused before its prerequisite): a trajectory with reward > 0 ends with the right
        # conventions (a retry after an `error` reply may still hold a wrong one before it).
        return [self.goal_reached(st), bool(st.vars.get("closed_ok"))]

    @abstractmethod
    def args_vocab(self) -> list[str]: ...

    # ------------------------------------------------------------ conventions applied
    def step(self, st: State, w: list[str]) -> str:
        c = st.conv
        if not w:
            return "error unknown"
        if w[0] == c["prereq"]:
            if len(w) < 3 or w[1] != KEY_MARK or w[2] != c["key"]:
                return "error key"
            return self.on_prereq(st, w[3:])
        if w[0] == c["op"]:
            if len(w) != 5 or w[1] != UNIT_MARK:
                return "error args"
            if w[2] != c["unit"]:
                return "error unit"
            a, b = w[3], w[4]
            return self.on_op(st, a, b)
        if w[0] == self.closing:
            return self.on_close(st, w[1:])
        if w[0] in self.extra_tools:
            return self.on_extra(st, w)
        return "error unknown"

    @staticmethod
    def prereq_call(conv: dict[str, str], args: list[str]) -> str:
        """``<prereq> as <key> ARGS`` in conventions ``conv``."""
        return " ".join([conv["prereq"], KEY_MARK, conv["key"], *args])

    @staticmethod
    def op_call(conv: dict[str, str], a: str, b: str) -> str:
        """``<op> in <unit> A B`` in conventions ``conv``."""
        return " ".join([conv["op"], UNIT_MARK, conv["unit"], a, b])

    def solve(self, spec: dict) -> list[str]:
        c = spec["conventions"]
        return [self.prereq_call(c, self.prereq_args(spec)), *self.extra_steps(spec), self.op_call(c, *self.op_args(spec)),
                " ".join([self.closing, *self.close_args(spec)])]


class Inventory(Family):
    """Prerequisite ``<prereq> as <key> ITEM`` (reveals the stock) before ``<op> in <unit> ITEM QTY``."""

    name, closing = "inventory", "commit"
    pools = {"prereq": ["lookup"], "key": KEYS, "op": ["put"], "unit": UNITS}

    def make(self, rng):
        item, q = rng.choice(ITEMS), rng.randrange(10)
        cur = rng.choice([c for c in range(10) if c != q])  # never already at the goal
        return f"set {item} to {q}", {"item": item, "qty": q, "current": cur}

    def init(self, st):
        st.vars = {"stock": {st.spec["item"]: st.spec["current"]}, "looked": set()}

    def prereq_args(self, spec):
        return [spec["item"]]

    def on_prereq(self, st, args):
        if len(args) != 1 or args[0] not in ITEMS:
            return "error args"
        st.vars["looked"].add(args[0])
        return f"{args[0]} has {st.vars['stock'].get(args[0], 0)}"

    def prereq_done(self, st):
        return st.spec["item"] in st.vars["looked"]

    def op_args(self, spec):
        return spec["item"], str(spec["qty"])

    def on_op(self, st, a, b):
        if a not in ITEMS or b not in DIGITS:
            return "error args"
        if a not in st.vars["looked"]:
            return "error locked"
        st.vars["stock"][a] = int(b)
        return "ok"

    def goal_reached(self, st):
        return st.vars["stock"] == {st.spec["item"]: st.spec["qty"]}

    def args_vocab(self):
        return ITEMS + DIGITS + ["has"]


class Bank(Family):
    """Prerequisite ``<prereq> as <key>`` (authenticates) before ``<op> in <unit> USER AMOUNT``."""

    name, closing = "bank", "logout"
    pools = {"prereq": ["login"], "key": KEYS, "op": ["pay"], "unit": UNITS}

    def make(self, rng):
        user, amt = rng.choice(USERS), rng.randrange(1, 10)
        return f"send {amt} to {user}", {"user": user, "amount": amt}

    def init(self, st):
        st.vars = {"authed": False, "paid": {}}

    def prereq_args(self, spec):
        return []

    def on_prereq(self, st, args):
        if args:
            return "error args"
        st.vars["authed"] = True
        return "authed"

    def prereq_done(self, st):
        return st.vars["authed"]

    def op_args(self, spec):
        return spec["user"], str(spec["amount"])

    def on_op(self, st, a, b):
        if a not in USERS or b not in DIGITS:
            return "error args"
        if not st.vars["authed"]:
            return "error denied"
        st.vars["paid"][a] = st.vars["paid"].get(a, 0) + int(b)
        return "ok"

    def goal_reached(self, st):
        return st.vars["paid"] == {st.spec["user"]: st.spec["amount"]}

    def args_vocab(self):
        return USERS + DIGITS


class Thermo(Family):
    """Prerequisite ``<prereq> as <key> ROOM`` (reads the current temperature) before
    ``<op> in <unit> ROOM TARGET``, which also needs ``mode heat`` when raising and ``mode cool``
    when lowering the reading (``mode`` is not a convention: the reading decides it)."""

    name, closing = "thermo", "save"
    pools = {"prereq": ["read"], "key": KEYS, "op": ["adjust"], "unit": UNITS}
    extra_tools = ("mode",)

    def make(self, rng):
        room, target = rng.randrange(1, 6), rng.randrange(10)
        cur = rng.choice([c for c in range(10) if c != target])
        return f"set room {room} to {target}", {"room": room, "target": target, "current": cur}

    def init(self, st):
        st.vars = {"temp": st.spec["current"], "mode": None, "read": set()}

    def prereq_args(self, spec):
        return [str(spec["room"])]

    def on_prereq(self, st, args):
        if len(args) != 1 or args[0] not in DIGITS:
            return "error args"
        st.vars["read"].add(int(args[0]))
        return f"room {args[0]} is {st.vars['temp'] if int(args[0]) == st.spec['room'] else 5}"

    def prereq_done(self, st):
        return st.spec["room"] in st.vars["read"]

    def on_extra(self, st, w):
        if len(w) == 2 and w[1] in ("heat", "cool"):
            st.vars["mode"] = w[1]
            return f"{w[1]} on"
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

    def goal_reached(self, st):
        return st.vars["temp"] == st.spec["target"]

    def args_vocab(self):
        return DIGITS + ["heat", "cool", "room", "is"]


class Ticket(Family):
    """Prerequisite ``<prereq> as <key> ID`` (finds the ticket) before ``<op> in <unit> ID AGENT``;
    ``close ID`` ends the episode."""

    name, closing = "ticket", "close"
    pools = {"prereq": ["find"], "key": KEYS, "op": ["assign"], "unit": UNITS}

    def make(self, rng):
        tid, agent = rng.randrange(10), rng.choice(AGENTS)
        return f"resolve {tid} for {agent}", {"ticket": tid, "agent": agent}

    def init(self, st):
        st.vars = {"found": set(), "assignee": None}

    def prereq_args(self, spec):
        return [str(spec["ticket"])]

    def on_prereq(self, st, args):
        if len(args) != 1 or args[0] not in DIGITS:
            return "error args"
        st.vars["found"].add(int(args[0]))
        return f"ticket {args[0]} open"

    def prereq_done(self, st):
        return st.spec["ticket"] in st.vars["found"]

    def op_args(self, spec):
        return str(spec["ticket"]), spec["agent"]

    def on_op(self, st, a, b):
        if a not in DIGITS or b not in AGENTS:
            return "error args"
        if int(a) not in st.vars["found"] or int(a) != st.spec["ticket"]:
            return "error unknown"
        st.vars["assignee"] = b
        return "ok"

    def goal_reached(self, st):
        return st.vars["assignee"] == st.spec["agent"]

    def close_args(self, spec):
        return [str(spec["ticket"])]

    def args_vocab(self):
        return DIGITS + AGENTS + ["ticket", "open"]


FAMILIES: dict[str, Family] = {f.name: f for f in (Inventory(), Bank(), Thermo(), Ticket())}
OBS_WORDS = ["ok", "authed", "on", "key", "error", "locked", "denied", "mode", "unknown", "room", "args", "unit", "stale"]
PROMPT_WORDS = [":", "set", "send", "resolve", "to", "for", "room"]
ACTION_WORDS = [KEY_MARK, UNIT_MARK]
