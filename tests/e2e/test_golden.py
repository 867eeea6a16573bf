"""Golden digests: the bitwise promise checked against a reference fixed in the repository.

The shared smoke pipeline (``smoke_recorded``: a clean ``dvc repro`` of the smoke profile, every
stage in its own pinned process) runs the pinned kernels through prepare, base pretraining, the
experience bank and its per-seed draws, the composer's cold starts, the search, LOPD and every
baseline's training steps, evaluation and the report. Every file of every output ``dvc.lock``
records (the ``code_*`` fingerprints aside: they hash the code, not what it computes) is hashed
(SHA-256) and compared with the reference of this CPU's vendor, ``tests/golden/smoke_outputs.<vendor_id>.json``.
The first differing file is named.

One reference per CPU vendor, because the pin holds per vendor, not across vendors: MKL's conditional
numerical reproducibility on the AVX2 branch (``MKL_CBWR=AVX2``) promises the same results on every
*Intel* CPU with AVX2 (cross-vendor needs ``MKL_CBWR=COMPATIBLE``); an Intel Xeon (AVX-512, KVM) computes a
different pinned base model from the AMD EPYC reference, with the code of ``6195ad4`` and of the stage
registry alike (``docs/benchmarks.md``). AMD EPYC machines have matched each other in every run so far.
A CPU whose pinned kernels compute other bits than its vendor's reference fails here, on CI, instead of
breaking the README's promise silently. A vendor with no reference, or a CPU without AVX2 and FMA (the pin
cannot hold), skips saying so.

A change that moves numbers on purpose rewrites the reference, from the same run:
``LOPD_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/e2e/test_golden.py`` (the test then skips,
naming the file it wrote: this vendor's); commit the new file with the change and say why in its message.
A number-moving change must rewrite every vendor's reference, each on a machine of that vendor; one it cannot
rewrite (no machine of that vendor at hand) is deleted with it, so that vendor skips, saying so, until a session
on one records it again (``docs/benchmarks.md``, "Golden digests per CPU vendor").
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import yaml

from lopd.compat.kernels import can_pin
from tests.conftest import REPO

GOLDEN_DIR = REPO / "tests" / "golden"


def cpu_vendor(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's ``vendor_id`` (``GenuineIntel``, ``AuthenticAMD``), ``unknown`` where /proc has none."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def reference_path(vendor: str) -> Path:
    """The golden digests of CPUs of ``vendor``."""
    return GOLDEN_DIR / f"smoke_outputs.{vendor}.json"


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


def test_the_reference_is_chosen_by_cpu_vendor(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: avx2 fma\n")
    assert cpu_vendor(str(info)) == "GenuineIntel"
    assert cpu_vendor(str(tmp_path / "absent")) == "unknown"
    assert reference_path("AuthenticAMD").name == "smoke_outputs.AuthenticAMD.json"
    assert reference_path("AuthenticAMD").exists()  # the committed dvc.lock's vendor


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
    vendor = cpu_vendor()
    golden = reference_path(vendor)
    if os.environ.get("LOPD_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(json.dumps({"profile": "profiles/smoke.yaml", "vendor": vendor, "files": got}, indent=1)
                          + "\n")
        pytest.skip(f"wrote {len(got)} digests to {golden.relative_to(REPO)}")
    if not golden.exists():
        pytest.skip(f"no golden digests for {vendor} CPUs ({golden.relative_to(REPO)}): the pin holds per vendor; "
                    "record them on such a machine at a commit whose numbers are trusted (see this module)")
    expected = json.loads(golden.read_text())["files"]
    diff = first_difference(expected, got)
    assert diff is None, (f"the smoke pipeline's outputs differ from {golden.relative_to(REPO)}: {diff}. "
                          "If the kernels are pinned, this machine does not reproduce the committed results; "
                          "if a change moved numbers on purpose, rewrite the reference (see this module).")
