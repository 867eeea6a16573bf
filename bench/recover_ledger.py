"""Every confirmatory read in the repository's history, recovered from git: the first entries of
``registration/ledger.yaml``.

    python bench/recover_ledger.py [--rev HEAD]

A commit whose ``reports/falsification.md`` names a registration (``Registration: sha256 `…` ``) committed the
verdict of a ``confirm_evaluate`` that read the confirmatory split under it. For the first commit naming each
registration it prints, as YAML: the registration's sha256, the commit and its date, S (each point's name, search
trial and role, from the specification curve), the seeds (``confirm.seeds`` of that commit's ``params.yaml``), the
confirmatory split (the md5 of ``data/confirm/manifest.json`` that the ``register`` stage read, from that commit's
``dvc.lock``) and the verdict with its label. Reads git only; writes nothing.

    python bench/recover_ledger.py --workspace DIR --commit C

prints the entry of the read in a finished workspace ``DIR`` (its ``reports/falsification.md``, ``params.yaml`` and
``dvc.lock``) that is not committed yet: a commit cannot name itself, so ``commit`` is ``C``, the commit whose tree
the run was copied from (the verdict lands in its child), and ``date`` the time the report was written.

At ``c088830`` it finds six registrations. Five are on split manifest ``1fedb8ac…``: ``6c3c30e3…`` (``a5ec95e``),
``afb5a58b…`` (``952c1fe``), ``d67b8342…`` (``bb6da92``), ``0082876d…`` (``c7eb2d2``) and ``e076c854…`` (``f700b03``).
The sixth, ``8edb57ef…`` on manifest ``c11a10d4…`` with seeds 200–231, is the registration ``reports/falsification.md``
names. ``registration/ledger.yaml`` records all six. The first five are recorded as this mode prints them. The sixth
was appended by ``--workspace`` when ``bench/land_repro.sh`` landed it, so the ledger names ``a182d37``, the tree
that ran, with the date of the run's report. This mode instead names ``06b0aef``, the commit that landed the
verdict, with that commit's date; its S, seeds, split and verdict are the same.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import yaml

REG = re.compile(r"Registration: sha256 `([0-9a-f]{64})`")
POINT = re.compile(r"^\| (p\d+) \| (\d+) \| ([a-z, ]+) \|")


def git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def show(commit: str, path: str) -> str | None:
    r = subprocess.run(["git", "show", f"{commit}:{path}"], capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def entry(commit: str, md: str) -> dict:
    """The entry of the read whose verdict ``commit`` committed (its report ``md``)."""
    return entry_of(md, yaml.safe_load(show(commit, "params.yaml")), yaml.safe_load(show(commit, "dvc.lock")),
                    git("rev-parse", commit).strip(), git("log", "-1", "--format=%cI", commit).strip())


def entry_of(md: str, params: dict, lock: dict, commit: str, date: str) -> dict:
    """A ledger entry from a report ``md``, the ``params`` and ``lock`` it was written under, ``commit`` and ``date``."""
    reg = REG.search(md).group(1)
    verdict_line = next(line for line in md.splitlines() if "Label: **" in line)
    verdict = verdict_line.split("**")[1]
    label = verdict_line.split("Label: **", 1)[1].split("**", 1)[0]
    points, seen = [], set()
    for line in md.split("## Specification curve", 1)[-1].splitlines():
        m = POINT.match(line)
        if m and m.group(1) not in seen:
            seen.add(m.group(1))
            points.append({"point": m.group(1), "trial": int(m.group(2)), "role": m.group(3)})
    manifest = next(d for d in lock["stages"]["register"]["deps"] if d["path"] == "data/confirm/manifest.json")
    return {"registration": reg, "commit": commit, "date": date, "points": points,
            "seeds": list(params["confirm"]["seeds"]), "split_manifest_md5": manifest["md5"],
            "verdict": verdict, "label": label}


def reads(rev: str = "HEAD") -> list[dict]:
    """One entry per registration a committed ``reports/falsification.md`` named, from the first commit naming it."""
    entries, seen = [], set()
    for commit in reversed(git("log", "--format=%H", rev, "--", "reports/falsification.md").split()):
        md = show(commit, "reports/falsification.md")
        m = REG.search(md or "")
        if m is None or m.group(1) in seen:
            continue
        seen.add(m.group(1))
        entries.append(entry(commit, md))
    return entries


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", default="HEAD")
    ap.add_argument("--workspace", help="a finished workspace whose read is not committed yet")
    ap.add_argument("--commit", help="with --workspace (required there): the commit its tree was copied from")
    a = ap.parse_args()
    if a.workspace and not a.commit:
        ap.error("--workspace needs --commit: the commit whose tree the run ran (HEAD may have moved since)")
    if a.workspace:
        import datetime
        from pathlib import Path

        ws = Path(a.workspace)
        report = ws / "reports" / "falsification.md"
        date = datetime.datetime.fromtimestamp(report.stat().st_mtime, datetime.timezone.utc).isoformat(timespec="seconds")
        e = entry_of(report.read_text(), yaml.safe_load((ws / "params.yaml").read_text()),
                     yaml.safe_load((ws / "dvc.lock").read_text()), git("rev-parse", a.commit).strip(), date)
        yaml.safe_dump([e], sys.stdout, sort_keys=False, width=120, default_flow_style=None)
        return 0
    yaml.safe_dump({"reads": reads(a.rev)}, sys.stdout, sort_keys=False, width=120, default_flow_style=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
