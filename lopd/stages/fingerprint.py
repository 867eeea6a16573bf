"""``lopd fingerprint <stage>``: the code stage of a matrix stage kind (``code_train``, ``code_evaluate``).

It hashes the code deps and the values of the params its ``dvc.yaml`` stanza declares: what the kind's
items read, which DVC then checks once here, not once per item. It reads the params raw, not through
the validated config, so none is recorded as read; the modules it imports are among the deps it
hashes (the registry computes them from its import graph too), so a change to them reruns it.
"""

from __future__ import annotations

import os

from lopd.paths import Paths
from lopd.utils import write_code_fingerprint


def run(paths: Paths, stage: str) -> dict:
    out, fp = write_code_fingerprint(paths.root, stage)
    print(f"{stage}: {len(fp['files'])} files, sha256 {fp['sha256'][:16]}… -> {os.path.relpath(out, paths.root)}")
    return fp
