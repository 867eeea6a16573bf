"""Which stages' outputs two ``dvc.lock`` files agree on: a check that a refactor changed no number.

    python bench/compare_locks.py OLD/dvc.lock NEW/dvc.lock

Compares, stage by stage, the hashes DVC recorded for each output (deps are expected to differ:
the code changed). Prints the count of stages whose outputs are identical and names the others.
"""

from __future__ import annotations

import sys

import yaml


def outputs(lock_path: str) -> dict[str, dict[str, str | None]]:
    stages = yaml.safe_load(open(lock_path))["stages"]
    return {name: {o["path"]: o.get("md5") for o in st.get("outs", [])} for name, st in stages.items()}


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    a, b = outputs(sys.argv[1]), outputs(sys.argv[2])
    common = sorted(set(a) & set(b))
    differ = [s for s in common if a[s] != b[s]]
    print(f"stages in both locks: {len(common)}; outputs identical: {len(common) - len(differ)}; "
          f"differ: {len(differ)} {differ}")
    only = sorted(set(a) ^ set(b))
    if only:
        print(f"stages in one lock only: {only}")


if __name__ == "__main__":
    main()
