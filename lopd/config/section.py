"""The base of every params section: strict validation, and read recording.

Read recording (``tests/e2e/test_declared_reads.py``): when a set is installed, every read of a
section's key adds "section.key" to it, so a stage's reads can be compared with its dvc.yaml
declaration. ``Params`` itself is not recorded: reaching a section is not reading a key.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict

READS: set[str] | None = None
# section model class name -> its key in params.yaml (filled by lopd.config once Params is defined)
SECTION_NAMES: dict[str, str] = {}


def record_reads(into: set[str] | None) -> None:
    """Start (a set) or stop (``None``) recording params reads."""
    global READS
    READS = into


def recorded_reads() -> set[str] | None:
    """The set params reads are being recorded into, ``None`` when not recording."""
    return READS


class unrecorded:
    """Reads inside this block are not recorded: for checks whose result DVC already guarantees
    (e.g. ``seed in train.seeds`` for a matrix stage — declaring ``train.seeds`` there would rerun
    every seed's stage when one seed is added)."""

    def __enter__(self):
        global READS
        self._saved, READS = READS, None

    def __exit__(self, *exc):
        global READS
        READS = self._saved


class Section(BaseModel):
    """A params section: unknown keys are refused, values are not coerced, instances are frozen.
    Every field carries a ``description`` (``lopd params`` prints it; error messages quote it)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    def __getattribute__(self, name: str):
        if READS is not None and not name.startswith("_") and name in type(self).model_fields:
            sec = SECTION_NAMES.get(type(self).__name__)
            if sec is not None:
                READS.add(f"{sec}.{name}")
        return super().__getattribute__(name)

    def model_dump(self, *args, **kwargs):
        if READS is not None and type(self).__name__ in SECTION_NAMES:
            exclude, include = kwargs.get("exclude") or (), kwargs.get("include")
            sec = SECTION_NAMES[type(self).__name__]
            READS.update(f"{sec}.{k}" for k in type(self).model_fields
                         if k not in exclude and (include is None or k in include))
        return super().model_dump(*args, **kwargs)


class Bound:
    """A bound on every value of a :class:`DistinctList`: ``Bound(ge=0)`` (``>= 0``) or ``Bound(gt=0)``."""

    def __init__(self, *, ge: float | None = None, gt: float | None = None):
        if (ge is None) == (gt is None):
            raise ValueError("a Bound is ge=x or gt=x")
        self.ge, self.gt = ge, gt

    def __call__(self, x) -> bool:
        return x >= self.ge if self.ge is not None else x > self.gt

    def __str__(self) -> str:
        return f">= {self.ge:g}{' (non-negative)' if self.ge == 0 else ''}" if self.ge is not None else f"> {self.gt:g}"


class DistinctList:
    """``DistinctList[T]``: a params list of ``T`` that is non-empty and holds no value twice;
    ``DistinctList[T, Bound(ge=0)]`` also bounds every value. The error says what is wrong (the message
    formatter puts the key in front); for a ``Literal`` item type it also lists the values allowed.
    :class:`DistinctOrEmptyList` allows an empty list."""

    non_empty = True

    def __class_getitem__(cls, args: Any) -> Any:
        item, bound = args if isinstance(args, tuple) else (args, None)
        allowed = get_args(item) if get_origin(item) is Literal else ()
        what = ("a non-empty list" if cls.non_empty else "a list") + " of distinct values (no duplicates)"
        if allowed:
            what += f", each one of: {', '.join(map(str, allowed))}"
        non_empty = cls.non_empty

        def check(v: list) -> list:
            if non_empty and not v:
                raise ValueError(f"the list is empty: it must be {what}")
            repeated = list(dict.fromkeys(x for i, x in enumerate(v) if x in v[:i]))
            if repeated:
                raise ValueError(f"the list repeats {', '.join(map(repr, repeated))}: it must be {what}")
            if bound is not None and not all(map(bound, v)):
                raise ValueError(f"every value must be {bound}, not {', '.join(repr(x) for x in v if not bound(x))}")
            return v

        return Annotated[list[item], AfterValidator(check)]


class DistinctOrEmptyList(DistinctList):
    """``DistinctOrEmptyList[T]``: a params list of ``T`` that holds no value twice (it may be empty)."""

    non_empty = False
