"""The search's selection as a typed record: what ``hpo/selection.json`` holds, for the code that writes it
(:mod:`lopd.hpo.selection`, :mod:`lopd.hpo.study`) and the code that reads it (the register stage, the search
report). Plain data, no computation; the JSON reads as it always did (fields a selection lacks are left out).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields, replace


@dataclass(frozen=True)
class Binding:
    """Where ``lopd_binding`` trains: the best COMPLETE trial whose margin binds (:func:`select_binding`), or,
    with ``trial`` None, why no trial does (``reason``)."""

    trial: int | None
    point: dict | None = None
    value: float | None = None
    statuses: tuple[str, ...] = ()  # the trial's constraint status per seed
    reason: str | None = None

    def to_json(self) -> dict:
        if self.trial is None:
            return {"trial": None, "reason": self.reason}
        return {"trial": self.trial, "point": dict(self.point or {}), "value": self.value,
                "statuses": list(self.statuses)}

    @classmethod
    def from_json(cls, d: dict | None) -> "Binding | None":
        """None for ``None`` (an arm without a binding point, or a search written before it was recorded)."""
        if d is None:
            return None
        return cls(trial=d.get("trial"), point=d.get("point"), value=d.get("value"),
                   statuses=tuple(d.get("statuses") or ()), reason=d.get("reason"))


_ABSENT = "absent"  # Selection.binding before write_outputs decides it: no ``binding`` key in the JSON


@dataclass(frozen=True)
class Selection:
    """One arm's search result, ``hpo/selection.json`` (``hpo/arms/<arm>/selection.json``): the selected trial
    under the registered tie rule and what the search can tell apart (:func:`select`, :func:`select_by_seed`).

    Fields a task-paired selection lacks (``seeds``, ``rerun``, ``per_seed``) are None, and so are those
    :func:`lopd.hpo.study.write_outputs` adds later (``search``, ``space``, ``arm``, ``boundary_rule``); absent
    fields are left out of the JSON, so the file reads as it always did."""

    rule: str  # the registered tie rule
    alpha: float  # the tie test's level
    unit: str  # "task" (paired over val tasks) or "seed" (paired over seeds)
    best: int  # the trial with the highest value
    selected: int  # the trial the tie rule chose among those tied with the best
    point: dict  # the selected trial's coordinates
    value: float  # its mean val reward (over every seed, by seed)
    tied: list  # the trials tied with the best, the best included
    tie_count: int
    runner_up: dict | None  # the second-ranked trial against the best: number, diff, low, high, p, tied
    distinguishable: bool  # the runner-up is not tied with the best
    by_rule: bool  # the tie rule chose another trial than the best
    boundary: dict  # coordinate -> "low" / "high" / None: the selected point on the edge of its choices, or not
    vs_best: dict  # str(trial) -> its paired comparison with the best
    intervals: dict | None = None  # str(trial) -> mean, low, high
    seeds: list | None = None  # by seed: the seeds compared
    rerun: list | None = None  # by seed: the trials rerun, best first
    per_seed: dict | None = None  # by seed: str(trial) -> mean val reward per seed
    search: "Selection | None" = None  # by seed: the search's own task-paired selection over every trial
    space: dict | None = None  # the searched coordinates and their choices (extended by the boundary rule)
    arm: str | None = None
    boundary_rule: dict | None = None  # what the registered boundary rule did
    binding: "Binding | None | str" = _ABSENT  # LOPD's binding point (None: another arm's search)

    def to_json(self) -> dict:
        out: dict = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None and f.name in _OPTIONAL or (f.name == "binding" and v == _ABSENT):
                continue
            out[f.name] = v.to_json() if isinstance(v, (Selection, Binding)) else v
        return out

    @classmethod
    def from_json(cls, d: dict) -> "Selection":
        """The record of a ``selection.json``; ValueError naming the keys it lacks. A file from before the
        selection by seed has no ``unit``: it was paired by task."""
        known = {f.name for f in fields(cls)}
        kw = {"unit": "task", **{k: v for k, v in d.items() if k in known}}
        lacking = [f.name for f in fields(cls) if f.name not in kw and f.default is MISSING]
        if lacking:
            raise ValueError(f"the selection lacks {', '.join(lacking)}")
        if "search" in kw and kw["search"] is not None:
            kw["search"] = cls.from_json(kw["search"])
        kw["binding"] = Binding.from_json(d["binding"]) if "binding" in d else _ABSENT
        return cls(**kw)

    def with_outputs(self, space: dict, arm: str, boundary_rule: dict | None, binding: "Binding | None") -> "Selection":
        """What :func:`lopd.hpo.study.write_outputs` adds before writing the file."""
        return replace(self, space={k: list(v) for k, v in space.items()}, arm=arm,
                       boundary_rule=boundary_rule, binding=binding)

    @property
    def binding_point(self) -> "Binding | None":
        """The binding point as recorded (None: not recorded, or an arm without one)."""
        return None if self.binding == _ABSENT else self.binding


_OPTIONAL = ("intervals", "seeds", "rerun", "per_seed", "search", "space", "arm", "boundary_rule")
