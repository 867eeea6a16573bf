"""The ledger of confirmatory reads (``registration/ledger.yaml``): which registration read which split with
which seeds, committed in git so that "registered before read" holds across runs, not only within one.

Pure functions over the file's entries; the ``register`` stage refuses a registration that
:func:`earlier_reads` finds earlier reads for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from lopd.errors import BadInput

LEDGER = Path("registration") / "ledger.yaml"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_MD5 = re.compile(r"^[0-9a-f]{32}$")


@dataclass(frozen=True)
class Read:
    """One confirmatory read: a registration's verdict on one split with its seeds."""

    registration: str  # the registration's sha256
    commit: str  # the commit that committed the verdict
    date: str
    points: tuple  # S: ({point, trial, role}, ...)
    seeds: tuple[int, ...]
    split_manifest_md5: str  # md5 of data/confirm/manifest.json as the register stage read it
    verdict: str
    label: str


def load(path: Path) -> list[Read]:
    """The ledger's reads, oldest first; :class:`BadInput` naming the entry and key that is wrong."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise BadInput(f"{path}: not a readable ledger ({e})") from None
    reads = raw.get("reads") if isinstance(raw, dict) else None
    if not isinstance(reads, list):
        raise BadInput(f"{path}: expected a mapping with a list under 'reads'")
    out: list[Read] = []
    for i, r in enumerate(reads):
        where = f"{path}: reads[{i}]"
        if not isinstance(r, dict):
            raise BadInput(f"{where} is not a mapping")
        missing = [k for k in Read.__dataclass_fields__ if k not in r]
        if missing:
            raise BadInput(f"{where} lacks {', '.join(missing)}")
        if not _SHA256.match(str(r["registration"])):
            raise BadInput(f"{where}: registration is not a sha256 hex digest: {r['registration']!r}")
        if not _MD5.match(str(r["split_manifest_md5"])):
            raise BadInput(f"{where}: split_manifest_md5 is not an md5 hex digest: {r['split_manifest_md5']!r}")
        if not r["seeds"] or not all(isinstance(s, int) and not isinstance(s, bool) for s in r["seeds"]):
            raise BadInput(f"{where}: seeds must be a non-empty list of integers")
        if any(x.registration == r["registration"] for x in out):
            raise BadInput(f"{where}: registration {r['registration'][:12]}… is already recorded above")
        out.append(Read(registration=r["registration"], commit=str(r["commit"]), date=str(r["date"]),
                        points=tuple(r["points"] or ()), seeds=tuple(r["seeds"]),
                        split_manifest_md5=r["split_manifest_md5"], verdict=str(r["verdict"]),
                        label=str(r["label"])))
    return out


def earlier_reads(reads: list[Read], registration: str, split_manifest_md5: str, seeds) -> list[str]:
    """Why a confirmation under ``registration`` on this split with these seeds would not be fresh: one line
    per earlier read, under *another* registration, of the same split or of any of the same seeds (a seed read
    once carries its luck into every later read, whatever the split). Empty: fresh. A registration already in
    the ledger is its own read, not an earlier one. The ``register`` stage refuses a registration with any."""
    seeds = set(seeds)
    lines = []
    for r in reads:
        if r.registration == registration:
            continue
        same_split = r.split_manifest_md5 == split_manifest_md5
        shared = sorted(seeds & set(r.seeds))
        if same_split or shared:
            what = [*(["the same split"] if same_split else []),
                    *([f"seed(s) {_ranges(shared)}"] if shared else [])]
            lines.append(f"registration {r.registration[:12]}… (commit {r.commit[:7]}, {r.date[:10]}) read "
                         f"{' and '.join(what)}: verdict '{r.verdict}' ({r.label})")
    return lines


def entry_line(root: Path, registration: str) -> str | None:
    """Registration ``registration``'s read in ``root``'s ledger, in words: its position, commit and date, and
    whether it was fresh (no split or seed of an earlier read, :func:`earlier_reads`); None when the ledger does
    not record it (yet)."""
    path = Path(root) / LEDGER
    reads = load(path) if path.exists() else []
    i = next((i for i, r in enumerate(reads) if r.registration == registration), None)
    if i is None:
        return None
    r = reads[i]
    earlier = earlier_reads(reads[:i], registration, r.split_manifest_md5, r.seeds)
    fresh = (f"fresh: it shares no split or seed with the {i} read(s) before it" if not earlier else
             f"**not fresh**: it shares a split or seeds with {len(earlier)} of the {i} read(s) before it")
    return f"read {i + 1} of {len(reads)} in `{LEDGER}` (commit `{r.commit[:7]}`, {r.date[:10]}); {fresh}"


def _ranges(xs: list[int]) -> str:
    """``[100, 101, 102, 105]`` -> ``100-102, 105``."""
    out, start = [], None
    for i, x in enumerate(xs):
        if start is None:
            start = x
        if i + 1 == len(xs) or xs[i + 1] != x + 1:
            out.append(f"{start}" if start == x else f"{start}-{x}")
            start = None
    return ", ".join(out)
