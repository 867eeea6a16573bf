"""The registered boundary rule (``hpo.boundary``, applied by :mod:`lopd.hpo.search`): when the selected value
of a numeric axis is the smallest or largest of its choices, the axis grows one step past that edge and the
search continues; after ``max_extensions`` extensions a selected value still on an edge is flagged.

One step past an edge continues the grid's own spacing there: ``ratio`` axes (m above 0, K, the learning
rate, GRPO's group size) multiply by the ratio of the edge's two outermost choices, ``difference`` axes (n_ret)
add their difference. A natural bound is not an edge to extend: m = 0 is the unconstrained objective, n_ret and
K cannot go below 1 (``floor``), nor past what the cold start trained (``ceil``), a GRPO group must divide the
step's rollouts (``divides``); a value at its natural bound is reported as such, not flagged."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AxisRule:
    step: str  # "ratio" | "difference"
    floor: float | None = None  # the natural lower bound (not extended below); None: none
    integer: bool = False
    ceil: float | None = None  # the natural upper bound (not extended above); None: none
    divides: int | None = None  # a value must divide this (a GRPO group the step's rollouts); None: any


def next_choice(choices: list[float], side: str, rule: AxisRule) -> float | None:
    """The value one step past ``side`` ("low" | "high") of the sorted ``choices``, or None at a natural
    bound (the floor reached, or a ratio step from 0)."""
    xs = sorted(choices)
    if len(xs) < 2:
        raise ValueError("an axis needs two choices to know its step")
    a, b = (xs[0], xs[1]) if side == "low" else (xs[-1], xs[-2])
    if rule.step == "ratio":
        if a <= 0 or b <= 0:
            return None  # a ratio grid has no step from 0: the edge is 0 itself, a natural bound
        v = a * (a / b)
    elif rule.step == "difference":
        v = a + (a - b)
    else:
        raise ValueError(f"unknown step {rule.step!r}")
    if rule.integer:
        v = round(v)
        if v == a:
            return None
    if rule.floor is not None and v < rule.floor:
        return None
    if rule.ceil is not None and v > rule.ceil:
        return None
    if rule.divides is not None and (v <= 0 or rule.divides % int(v)):
        return None
    return float(v)


def extend(space: dict[str, list], point: dict, rules: dict[str, AxisRule]) -> tuple[dict[str, list], list[str]]:
    """One extension: every axis whose selected value is an edge of its choices gains the value one step
    past it (:func:`next_choice`). Returns the new space and what was done, one line per axis on an edge
    ("K: 4 is the lowest choice; added 2", "margin: 0.0 is a natural bound")."""
    new, notes = {k: list(v) for k, v in space.items()}, []
    for name, choices in space.items():
        if name not in rules or len(choices) < 2:
            continue
        v = point[name]
        side = "low" if v == min(choices) else "high" if v == max(choices) else None
        if side is None:
            continue
        nxt = next_choice(choices, side, rules[name])
        word = "lowest" if side == "low" else "highest"
        if nxt is None:
            notes.append(f"{name}: {v:g} is a natural bound")
            continue
        new[name] = sorted(set(choices) | {int(nxt) if rules[name].integer else nxt})
        notes.append(f"{name}: {v:g} is the {word} choice; added {nxt:g}")
    return new, notes


def flag(space: dict[str, list], point: dict, rules: dict[str, AxisRule]) -> list[str]:
    """The axes whose selected value is still on an extendable edge (after the last extension)."""
    _, notes = extend(space, point, rules)
    return [n.split(":")[0] for n in notes if "added" in n]


def record(space: dict[str, list], point: dict, rules: dict[str, AxisRule], extensions: list[dict],
           max_extensions: int) -> dict:
    """What the rule did, as ``selection.json`` and ``baselines.yaml`` keep it: the ``extensions`` made, the axes
    whose selected value is still on an extendable edge of the final ``space`` (``flag``), and those at a natural
    bound."""
    _, notes = extend(space, point, rules)
    return {"max_extensions": max_extensions, "extensions": extensions,
            "flag": [n.split(":")[0] for n in notes if "added" in n],
            "natural_bounds": [n.split(":")[0] for n in notes if n.endswith("natural bound")]}
