"""Golden digests: the bitwise promise checked against a reference fixed in the repository.

The shared smoke pipeline (``smoke_recorded``: a clean ``dvc repro`` of the smoke profile, every
stage in its own pinned process) runs the pinned kernels through prepare, base pretraining, the
experience bank and its per-seed draws, the composer's cold starts, the search, LOPD and every
baseline's training steps, evaluation and the report. Every file of every output ``dvc.lock``
records (the ``code_*`` fingerprints aside: they hash the code, not what it computes) is hashed
(SHA-256) and compared with ``tests/golden/smoke_outputs.json``. The first differing file is named.

A CPU whose pinned kernels compute other bits fails here, on CI, instead of breaking the README's
promise silently. On a CPU without AVX2 and FMA the pin cannot hold, and the test skips saying so.

A change that moves numbers on purpose rewrites the reference, from the same run:
``LOPD_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/e2e/test_golden.py`` (the test then skips,
naming the file it wrote); commit the new file with the change and say why in its message.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import yaml

from lopd.kernels import can_pin
from tests.conftest import REPO

GOLDEN = REPO / "tests" / "golden" / "smoke_outputs.json"


def output_digests(repo: Path) -> dict[str, str]:
    """``{relative file path: sha256}`` of every file of every output in ``repo/dvc.lock``, in the
    lock's stage order (upstream first), the ``code_*`` fingerprint stages left out."""
    stages = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    out: dict[str, str] = {}
    for name, st in stages.items():
        if name.startswith("code_"):
            continue
        for o in st.get("outs", []):
            path = repo / o["path"]
            files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
            for f in files:
                out[f.relative_to(repo).as_posix()] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def first_difference(expected: dict[str, str], got: dict[str, str]) -> str | None:
    """The first file (in ``expected``'s order) whose digest differs or that is missing, then any file
    the reference does not know; None when they agree."""
    for path, digest in expected.items():
        if path not in got:
            return f"{path}: missing (the reference has it)"
        if got[path] != digest:
            return f"{path}: sha256 {got[path][:16]}…, the reference {digest[:16]}…"
    extra = [p for p in got if p not in expected]
    return f"{extra[0]}: not in the reference ({len(extra)} such files)" if extra else None


def test_first_difference_names_the_first_differing_file():
    ref = {"a/x": "1" * 64, "a/y": "2" * 64, "b": "3" * 64}
    assert first_difference(ref, dict(ref)) is None
    assert first_difference(ref, {**ref, "a/y": "9" * 64, "b": "8" * 64}).startswith("a/y: sha256 9999")
    assert first_difference(ref, {"a/x": "1" * 64, "b": "3" * 64}) == "a/y: missing (the reference has it)"
    assert first_difference(ref, {**ref, "c": "4" * 64}) == "c: not in the reference (1 such files)"


@pytest.mark.skipif(not can_pin(), reason="this CPU has no AVX2 and FMA: the kernel pin cannot hold, so its "
                                          "outputs differ bitwise from the reference by design")
def test_the_smoke_pipeline_reproduces_the_golden_digests(smoke_recorded):
    got = output_digests(smoke_recorded.repo)
    assert len(got) > 20, f"only {len(got)} output files: the smoke pipeline's lock is suspect"
    if os.environ.get("LOPD_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps({"profile": "profiles/smoke.yaml", "files": got}, indent=1) + "\n")
        pytest.skip(f"wrote {len(got)} digests to {GOLDEN.relative_to(REPO)}")
    expected = json.loads(GOLDEN.read_text())["files"]
    diff = first_difference(expected, got)
    assert diff is None, (f"the smoke pipeline's outputs differ from tests/golden/smoke_outputs.json: {diff}. "
                          "If the kernels are pinned, this machine does not reproduce the committed results; "
                          "if a change moved numbers on purpose, rewrite the reference (see this module).")
