"""Before a long clean run: can it land? The CPU vendor against the golden references, and the confirmatory split
the params would read against the ledger, in about 5 s.

    python bench/preflight.py [--params params.yaml] [--profile P] [--new-registration]

- **Vendor.** A clean repro's bits depend on the CPU vendor (``docs/benchmarks.md``, "Golden digests per CPU
  vendor"): the lock a run lands is this vendor's, and the smoke golden test compares against
  ``tests/golden/smoke_outputs.<vendor>.json`` only where that file exists.
- **The confirmatory split.** In a temporary directory, ``lopd prepare`` and ``lopd confirm-split`` on these params
  (the stages themselves, outside DVC), then the md5 of the split's manifest as ``register`` reads it, and the
  ``confirm.seeds``, against ``registration/ledger.yaml``. A split or seed an entry holds means the run passes
  ``register`` only by registering that entry's hash again: a change that moves no pilot number. A change that
  moves one needs a fresh round (``--new-registration`` makes a held split or seed an error). If
  ``confirm_split`` cannot draw the round (too few fresh tasks: ``bench/confirm_room.py``), the run would fail
  minutes in; this says so first.

Writes only in the temporary directory, which it removes; reads no split file (only the manifest's md5).
Exit status 1 when the run cannot pass ``confirm_split``, or with ``--new-registration`` when the split or a seed is
held; else 0.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def vendor() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("vendor_id"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def split_md5(params: Path, profile: Path | None) -> tuple[str | None, str]:
    """(md5 of data/confirm/manifest.json, '') as ``confirm_split`` writes it for these params; (None, why) if
    it cannot. Runs the two stages in a temporary copy of the params."""
    lopd = str(Path(sys.executable).parent / "lopd")
    work = Path(tempfile.mkdtemp(prefix="lopd-preflight-"))
    try:
        shutil.copy(params, work / "params.yaml")
        env = {k: v for k, v in os.environ.items() if k not in ("DVC_ROOT", "LOPD_RECORD_DIR")}
        env.update(LOPD_WARM="0", PYTHONPATH=str(REPO))
        cmds = ([[lopd, "apply-profile", str(profile)]] if profile else []) + [[lopd, "prepare"], [lopd, "confirm-split"]]
        for cmd in cmds:
            r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
            if r.returncode != 0:
                return None, f"`lopd {cmd[1]}` failed: {(r.stderr or r.stdout).strip().splitlines()[-1]}"
        return hashlib.md5((work / "data" / "confirm" / "manifest.json").read_bytes()).hexdigest(), ""
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", type=Path, default=REPO / "params.yaml")
    ap.add_argument("--profile", type=Path, default=None)
    ap.add_argument("--new-registration", action="store_true",
                    help="the run moves pilot numbers: a split or seed an entry holds is an error")
    args = ap.parse_args()

    from lopd.config import load_params
    from lopd.confirmation import ledger

    v = vendor()
    golden = sorted(p.name for p in (REPO / "tests" / "golden").glob("smoke_outputs.*.json"))
    has = f"smoke_outputs.{v}.json" in golden
    print(f"CPU vendor: {v}; golden references: {', '.join(golden) or 'none'}"
          + ("" if has else f" (none for {v}: the smoke golden test skips here; the lock this run lands is a {v} lock)"))

    params = load_params(args.params, args.profile)
    seeds, rnd = list(params.confirm.seeds), params.confirm.split_round
    md5, why = split_md5(args.params.resolve(), args.profile.resolve() if args.profile else None)
    if md5 is None:
        print(f"confirmatory split round {rnd}: cannot be drawn. {why}")
        print("  the run would fail at confirm_split; how much room is left: python bench/confirm_room.py")
        return 1
    reads = ledger.load(REPO / ledger.LEDGER)
    holders = [r for r in reads if r.split_manifest_md5 == md5 or set(r.seeds) & set(seeds)]
    print(f"confirmatory split round {rnd}: manifest md5 {md5}; confirm.seeds {seeds[0]}-{seeds[-1]} ({len(seeds)})")
    if not holders:
        print(f"  fresh: no entry of {ledger.LEDGER} ({len(reads)} reads) holds this split or any of these seeds; "
              "a new registration can read it")
        return 0
    for r in holders:
        what = [*(["this split"] if r.split_manifest_md5 == md5 else []),
                *([f"{len(set(r.seeds) & set(seeds))} of these seeds"] if set(r.seeds) & set(seeds) else [])]
        print(f"  held: registration {r.registration[:12]}… (commit {r.commit[:7]}) read {' and '.join(what)}")
    print("  the run passes register only if it registers that hash again: it must move no pilot number"
          + ("" if len(holders) == 1 else " (and with several holders it cannot)"))
    return 1 if args.new_registration or len(holders) > 1 else 0


if __name__ == "__main__":
    sys.exit(main())
