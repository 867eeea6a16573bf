"""Stage ``prepare``: the sealed, disjoint train/val/test splits and their manifest of hashes."""

from __future__ import annotations

from lopd import data as data_mod
from lopd.config import Params
from lopd.paths import Paths


def run(params: Params, paths: Paths) -> dict:
    splits = data_mod.generate_splits(params.envs)
    manifest = data_mod.write_splits(paths.splits, splits, data_mod.worlds_record(params.envs))
    counts = {s: manifest["files"][s]["n"] for s in data_mod.SPLITS}
    print(f"wrote splits {counts} to {paths.splits}")
    return manifest
