"""Stage ``confirm_split``: the sealed confirmatory test split (:mod:`lopd.confirmation.split`), no task of
which shares a prompt or a solution with train, val or the pilot's test split."""

from __future__ import annotations

import json

from lopd.config import Params
from lopd.errors import BadInput
from lopd.paths import Paths


def run(params: Params, paths: Paths) -> dict:
    from lopd.confirmation import split as cs
    from lopd.utils import sha256_file

    mpath = paths.splits / "manifest.json"
    if not mpath.exists():
        raise BadInput(f"split manifest not found: {mpath} (run the prepare stage first)")
    tasks, audit = cs.generate_confirm(params.envs, params.envs.n_confirm, json.loads(mpath.read_text()),
                                       params.confirm.split_round)
    manifest = cs.write_confirm(paths.confirm_split, tasks, audit, params.envs, sha256_file(mpath))
    print(f"wrote the confirmatory split: {manifest['file']['n']} tasks to {paths.confirm_split}; the pilot's test "
          f"split has {audit['pilot_test_solution_twins']} of {audit['pilot_test_n']} tasks whose solution equals "
          "a train task's")
    return manifest
