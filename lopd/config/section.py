"""The base of every params section: strict validation, and read recording.

Read recording (``tests/test_declared_reads.py``): when a set is installed, every read of a
section's key adds "section.key" to it, so a stage's reads can be compared with its dvc.yaml
declaration. ``Params`` itself is not recorded: reaching a section is not reading a key.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

READS: set[str] | None = None
# section model class name -> its key in params.yaml (filled by lopd.config once Params is defined)
SECTION_NAMES: dict[str, str] = {}


def record_reads(into: set[str] | None) -> None:
    """Start (a set) or stop (``None``) recording params reads."""
    global READS
    READS = into


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
            exclude = kwargs.get("exclude") or ()
            sec = SECTION_NAMES[type(self).__name__]
            READS.update(f"{sec}.{k}" for k in type(self).model_fields if k not in exclude)
        return super().model_dump(*args, **kwargs)
